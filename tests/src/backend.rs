//! The backends the conformance suite drives, through the contract's trait
//! (`kvlayout::ops::Backend`, re-exported here with its argument and memory types).
//!
//! Implementations: the CPU backend and the scalar reference on host memory
//! (`kvlayout_cpu::Host`), the CPU backend once more per other kernel build this machine runs
//! and with the other prefetch arrangement ([`cpu_builds`]), the GPU kernel sources under the
//! host emulator (`cuda-emu`, warps of 32, behind the device backend; `hip-emu`, wavefronts
//! of 64; `kvlayout_emu`), and the CUDA and HIP backends on device 0 ([`Gpu`]). A GPU backend
//! that cannot open here is [`Unavailable`]: its [`Backend::available`] says why, and the
//! suite prints `skipped: <name>: <reason>` (a failure where `KVLAYOUT_REQUIRE_GPU` asks for
//! it).

use std::ops::Range;

pub use kvlayout::ops::{Backend, BufferShape, DecodeArgs, HostTensor, OpError, WriteArgs};
pub use kvlayout::ops::{Device, DeviceBackend};
use kvlayout::{DType, KvCacheLayout};
use kvlayout_cpu::{CpuBackend, PrefetchLevel};
pub use kvlayout_cpu::{Host, HostBuffers, HostOps, Ready, ScalarReference};
pub use kvlayout_cuda::CudaDevice;
pub use kvlayout_emu::{EmuDevice, EmuOps};
pub use kvlayout_hip::HipDevice;

/// The CPU backend forced to every other kernel build this machine runs than the one it
/// picks (`cpu/avx2`, `cpu/scalar`, ...), so that each build meets every case; and the build
/// it picks with its tiles and moves arranged for the other prefetch level than this
/// machine's (`cpu/avx512/prefetch-L2`, ...), so both arrangements run on any machine.
pub fn cpu_builds(threads: Option<usize>) -> Vec<Host<CpuBackend>> {
    // A handful of names, built once per suite.
    let name = |n: String| -> &'static str { Box::leak(n.into_boxed_str()) };
    let builds = CpuBackend::kernel_builds();
    let mut hosts: Vec<Host<CpuBackend>> = builds
        .iter()
        .skip(1)
        .map(|build| {
            let be = CpuBackend::with_kernels(threads, build).expect("a build this machine runs");
            Host::new(name(format!("cpu/{build}")), be)
        })
        .collect();
    let first = CpuBackend::with_kernels(threads, builds[0]).expect("a build this machine runs");
    let other = match first.prefetch_level() {
        PrefetchLevel::L1 => PrefetchLevel::L2,
        PrefetchLevel::L2 => PrefetchLevel::L1,
    };
    hosts.push(Host::new(
        name(format!("cpu/{}/prefetch-{other:?}", builds[0])),
        first.with_prefetch_level(other),
    ));
    hosts
}

/// No value: the memory and completions of a backend that is not built.
/// No value: the memory types of a backend that cannot run here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Never {}

/// A backend that cannot run on this machine, and why (its ops are never reached: allocation
/// fails with the reason).
#[derive(Debug, Clone)]
pub struct Unavailable {
    name: &'static str,
    reason: String,
}

impl Unavailable {
    /// Backend `name`, unavailable for `reason`.
    pub fn new(name: &'static str, reason: impl Into<String>) -> Self {
        Unavailable {
            name,
            reason: reason.into(),
        }
    }
}

/// A device backend opened on this machine, or why it could not be.
#[derive(Debug)]
pub enum Gpu<D> {
    /// Device 0, open.
    Open(DeviceBackend<D>),
    /// No device, no driver or no kernels for it.
    Absent(Unavailable),
}

impl<D: Device> Gpu<D> {
    fn visit(&self, v: &mut impl BackendVisitor) {
        match self {
            Gpu::Open(b) => v.visit(b),
            Gpu::Absent(u) => v.visit(u),
        }
    }

    fn is_open(&self) -> bool {
        matches!(self, Gpu::Open(_))
    }
}

impl Backend for Unavailable {
    type Cache = Never;
    type Tensor = Never;
    type Completion = Never;

    fn name(&self) -> &str {
        self.name
    }
    fn available(&self) -> Result<(), String> {
        Err(self.reason.clone())
    }
    fn alloc_cache(&self, _: &KvCacheLayout, _: &[BufferShape]) -> Result<Never, String> {
        Err(self.reason.clone())
    }
    fn upload_cache(&self, cache: &mut Never, _: &[Vec<u8>]) -> Result<(), String> {
        match *cache {}
    }
    fn download_cache(&self, cache: &Never) -> Result<Vec<Vec<u8>>, String> {
        match *cache {}
    }
    fn upload_tensor(&self, _: &HostTensor) -> Result<Never, String> {
        Err(self.reason.clone())
    }
    fn alloc_tensor(&self, _: DType, _: usize) -> Result<Never, String> {
        Err(self.reason.clone())
    }
    fn download_tensor(&self, t: &Never) -> Result<HostTensor, String> {
        match *t {}
    }
    fn write_kv(&self, cache: &mut Never, _: &WriteArgs<'_, &Never>) -> Result<Never, OpError> {
        match *cache {}
    }
    fn paged_decode(
        &self,
        cache: &Never,
        _: &DecodeArgs<'_, &Never>,
        _: &mut Never,
    ) -> Result<Never, OpError> {
        match *cache {}
    }
    fn copy_blocks(&self, cache: &mut Never, _: &[(u64, u64)]) -> Result<Never, OpError> {
        match *cache {}
    }
    fn swap_blocks(&self, src: &Never, _: &mut Never, _: &[(u64, u64)]) -> Result<Never, OpError> {
        match *src {}
    }
    fn gather_blocks(
        &self,
        cache: &Never,
        _: &[u64],
        _: Range<u64>,
        _: &mut Never,
    ) -> Result<Never, OpError> {
        match *cache {}
    }
    fn scatter_blocks(
        &self,
        staging: &Never,
        _: &[u64],
        _: Range<u64>,
        _: &mut Never,
    ) -> Result<Never, OpError> {
        match *staging {}
    }
    fn convert(&self, src: &Never, _: &mut Never) -> Result<Never, OpError> {
        match *src {}
    }
    fn wait(&self, c: Never) -> Result<(), String> {
        match c {}
    }
    fn synchronize(&self) -> Result<(), String> {
        Err(self.reason.clone())
    }
}

/// Something to run on each backend (the trait has associated types, so backends are
/// visited rather than collected).
pub trait BackendVisitor {
    /// Called once per backend, available or not.
    fn visit<B: Backend>(&mut self, backend: &B);
}

/// Every backend the suite knows of, built once.
#[derive(Debug)]
pub struct Backends {
    /// The CPU backend (its rayon pool has 3 threads, so partitioned work is uneven).
    pub cpu: Host<CpuBackend>,
    /// The CPU backend with each other kernel build this machine runs.
    pub cpu_builds: Vec<Host<CpuBackend>>,
    /// The scalar reference as a backend.
    pub reference: Host<ScalarReference>,
    /// The CUDA kernels under the host emulator behind the device backend of the CUDA and
    /// HIP crates (`DeviceBackend`: argument blocks, device temporaries), fibers resumed in
    /// thread order.
    pub cuda_emu: DeviceBackend<EmuDevice>,
    /// The HIP kernels (wavefronts of 64) under the host emulator on host memory, fibers
    /// resumed in a seeded pseudo-random order, so both orders meet every case.
    pub hip_emu: Host<EmuOps>,
    /// The CUDA backend on device 0, or why not.
    pub cuda: Gpu<CudaDevice>,
    /// The HIP backend on device 0, or why not.
    pub hip: Gpu<HipDevice>,
}

impl Default for Backends {
    fn default() -> Self {
        Backends {
            cpu: Host::cpu("cpu", Some(3)),
            cpu_builds: cpu_builds(Some(3)),
            reference: Host::reference(),
            cuda_emu: kvlayout_emu::cuda_emu(),
            hip_emu: Host::new("hip-emu", EmuOps::hip().with_seed(0x5eed)),
            cuda: match kvlayout_cuda::cuda(0) {
                Ok(b) => Gpu::Open(b),
                Err(e) => Gpu::Absent(Unavailable::new("cuda", e.to_string())),
            },
            hip: match kvlayout_hip::hip(0) {
                Ok(b) => Gpu::Open(b),
                Err(e) => Gpu::Absent(Unavailable::new("hip", e.to_string())),
            },
        }
    }
}

/// The environment variable that narrows the suite to some backends: comma-separated names,
/// where `cpu` also takes every `cpu/<build>` variant (`cpu,reference` is the CPU-dependent part
/// the test command runs again per host class it imitates). Unset or empty, every backend runs.
pub const BACKENDS_VAR: &str = "KVLAYOUT_SUITE_BACKENDS";

/// The names `KVLAYOUT_SUITE_BACKENDS` selects (`None`: every backend).
fn selection() -> Option<Vec<String>> {
    let v = std::env::var(BACKENDS_VAR).unwrap_or_default();
    let names: Vec<String> = v
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(String::from)
        .collect();
    (!names.is_empty()).then_some(names)
}

/// Whether the selection takes the backend `name` (`None`: every backend does).
fn selects(selection: &Option<Vec<String>>, name: &str) -> bool {
    selection
        .as_ref()
        .is_none_or(|names| names.iter().any(|n| takes(n, name)))
}

/// Whether the selected name `n` takes the backend `name`: itself, or one of its `n/...`
/// variants.
fn takes(n: &str, name: &str) -> bool {
    name == n || name.strip_prefix(n).is_some_and(|r| r.starts_with('/'))
}

/// A visitor passed on only the backends the selection takes.
struct Selected<'a, V> {
    inner: &'a mut V,
    selection: Option<Vec<String>>,
}

impl<V: BackendVisitor> BackendVisitor for Selected<'_, V> {
    fn visit<B: Backend>(&mut self, backend: &B) {
        if selects(&self.selection, backend.name()) {
            self.inner.visit(backend);
        }
    }
}

/// Collects the backends' names.
struct Names(Vec<String>);

impl BackendVisitor for Names {
    fn visit<B: Backend>(&mut self, b: &B) {
        self.0.push(b.name().to_string());
    }
}

impl Backends {
    /// Visits every backend `KVLAYOUT_SUITE_BACKENDS` selects (every one where it is unset),
    /// in report order: cpu, its other kernel builds, reference, cuda-emu, hip-emu, cuda, hip.
    pub fn for_each(&self, v: &mut impl BackendVisitor) {
        self.visit_all(&mut Selected {
            inner: v,
            selection: selection(),
        });
    }

    /// The names of the backends [`Backends::for_each`] visits, in its order.
    pub fn names(&self) -> Vec<String> {
        let mut names = Names(Vec::new());
        self.for_each(&mut names);
        names.0
    }

    /// Visits every backend, selected or not.
    fn visit_all(&self, v: &mut impl BackendVisitor) {
        v.visit(&self.cpu);
        for b in &self.cpu_builds {
            v.visit(b);
        }
        v.visit(&self.reference);
        v.visit(&self.cuda_emu);
        v.visit(&self.hip_emu);
        self.cuda.visit(v);
        self.hip.visit(v);
    }

    /// What `KVLAYOUT_SUITE_BACKENDS` leaves out, as a report line (`None` where it is unset);
    /// `Err` where it names a backend the suite does not have.
    pub fn left_out(&self) -> Result<Option<String>, String> {
        let Some(names) = selection() else {
            return Ok(None);
        };
        let mut all = Names(Vec::new());
        self.visit_all(&mut all);
        for n in &names {
            if !all.0.iter().any(|b| takes(n, b)) {
                return Err(format!(
                    "{BACKENDS_VAR} names {n:?}, which is no backend here (backends: {})",
                    all.0.join(", ")
                ));
            }
        }
        let out: Vec<&str> = all
            .0
            .iter()
            .filter(|b| !names.iter().any(|n| takes(n, b)))
            .map(String::as_str)
            .collect();
        Ok(Some(format!(
            "{BACKENDS_VAR}={} leaves out {}",
            names.join(","),
            if out.is_empty() {
                "nothing".to_string()
            } else {
                out.join(", ")
            }
        )))
    }
}

impl Backends {
    /// The failure `KVLAYOUT_REQUIRE_GPU` asks for when its GPU backend cannot run here:
    /// `cuda` or `hip` requires that one, any other non-empty value either of them.
    pub fn missing_required_gpu(&self) -> Option<String> {
        let want = std::env::var("KVLAYOUT_REQUIRE_GPU").unwrap_or_default();
        let ok = match want.as_str() {
            "" | "0" => return None,
            "cuda" => self.cuda.is_open(),
            "hip" => self.hip.is_open(),
            _ => self.cuda.is_open() || self.hip.is_open(),
        };
        (!ok).then(|| format!("KVLAYOUT_REQUIRE_GPU={want}, but no such GPU backend runs here"))
    }
}

#[cfg(test)]
mod tests {
    use super::selects;

    #[test]
    fn a_selection_takes_a_backend_and_its_variants_only() {
        let sel = Some(vec!["cpu".to_string(), "reference".to_string()]);
        for name in ["cpu", "cpu/avx2", "cpu/avx512/prefetch-L2", "reference"] {
            assert!(selects(&sel, name), "{name}");
        }
        for name in ["cpux", "cuda-emu", "hip-emu", "cuda", "referenced"] {
            assert!(!selects(&sel, name), "{name}");
        }
        assert!(selects(&None, "hip"), "no selection takes every backend");
    }
}
