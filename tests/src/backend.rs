//! The backends the conformance suite drives, through the contract's trait
//! (`kvlayout::ops::Backend`, re-exported here with its argument and memory types).
//!
//! Implementations: the CPU backend and the scalar reference on host memory
//! (`kvlayout_cpu::Host`), the CPU backend once more per other kernel build this machine runs
//! and with the other prefetch arrangement ([`cpu_builds`]), the GPU kernel sources under the
//! host emulator (`cuda-emu`, warps of 32; `hip-emu`, wavefronts of 64; `kvlayout_emu`);
//! `cuda` and `hip` are listed as [`NotBuilt`]: their [`Backend::available`] says why, and
//! the suite prints `skipped: <name>: <reason>`.

use std::ops::Range;

pub use kvlayout::ops::{Backend, BufferShape, DecodeArgs, HostTensor, OpError, WriteArgs};
use kvlayout::{DType, KvCacheLayout};
use kvlayout_cpu::{CpuBackend, PrefetchLevel};
pub use kvlayout_cpu::{Host, HostBuffers, HostOps, Ready, ScalarReference};
pub use kvlayout::ops::DeviceBackend;
pub use kvlayout_emu::{EmuDevice, EmuOps};

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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Never {}

/// A backend the suite knows of that this workspace does not build yet: reported as
/// skipped, by name, with the reason.
#[derive(Debug, Clone, Copy)]
pub struct NotBuilt {
    name: &'static str,
    reason: &'static str,
}

impl NotBuilt {
    /// The CUDA backend (cudarc, `kernels-cuda/`).
    pub fn cuda() -> Self {
        NotBuilt {
            name: "cuda",
            reason: "not built: no CUDA backend in this workspace yet",
        }
    }

    /// The HIP backend (hip-sys, `kernels-hip/`).
    pub fn hip() -> Self {
        NotBuilt {
            name: "hip",
            reason: "not built: no HIP backend in this workspace yet",
        }
    }
}

impl Backend for NotBuilt {
    type Cache = Never;
    type Tensor = Never;
    type Completion = Never;

    fn name(&self) -> &str {
        self.name
    }
    fn available(&self) -> Result<(), String> {
        Err(self.reason.to_string())
    }
    fn alloc_cache(&self, _: &KvCacheLayout, _: &[BufferShape]) -> Result<Never, String> {
        Err(self.reason.to_string())
    }
    fn upload_cache(&self, cache: &mut Never, _: &[Vec<u8>]) -> Result<(), String> {
        match *cache {}
    }
    fn download_cache(&self, cache: &Never) -> Result<Vec<Vec<u8>>, String> {
        match *cache {}
    }
    fn upload_tensor(&self, _: &HostTensor) -> Result<Never, String> {
        Err(self.reason.to_string())
    }
    fn alloc_tensor(&self, _: DType, _: usize) -> Result<Never, String> {
        Err(self.reason.to_string())
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
        Err(self.reason.to_string())
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
    /// Listed, not built.
    pub absent: Vec<NotBuilt>,
}

impl Default for Backends {
    fn default() -> Self {
        Backends {
            cpu: Host::cpu("cpu", Some(3)),
            cpu_builds: cpu_builds(Some(3)),
            reference: Host::reference(),
            cuda_emu: kvlayout_emu::cuda_emu(),
            hip_emu: Host::new("hip-emu", EmuOps::hip().with_seed(0x5eed)),
            absent: vec![NotBuilt::cuda(), NotBuilt::hip()],
        }
    }
}

impl Backends {
    /// Visits every backend, in report order: cpu, its other kernel builds, reference,
    /// cuda-emu, hip-emu, cuda, hip.
    pub fn for_each(&self, v: &mut impl BackendVisitor) {
        v.visit(&self.cpu);
        for b in &self.cpu_builds {
            v.visit(b);
        }
        v.visit(&self.reference);
        v.visit(&self.cuda_emu);
        v.visit(&self.hip_emu);
        for b in &self.absent {
            v.visit(b);
        }
    }
}
