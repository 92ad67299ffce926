//! The backends the conformance suite drives, through the contract's trait
//! (`kvlayout::ops::Backend`, re-exported here with its argument and memory types): every
//! backend `kvlayout_backends::names` lists, opened by name (`kvlayout_backends::open`), so
//! the suite runs the list a caller chooses from. That is the CPU backend and the scalar
//! reference on host memory, the CPU backend once more per other kernel build this machine
//! runs and with the other prefetch arrangement, the GPU kernel sources under the host
//! emulator behind the device backend (`cuda-emu`, warps of 32; `hip-emu`, wavefronts of 64,
//! threads in a seeded order), and the CUDA and HIP backends on device 0. A backend that
//! cannot open here keeps its reason: the suite prints `skipped: <name>: <reason>` (a failure
//! where `KVLAYOUT_REQUIRE_GPU` asks for it).

pub use kvlayout::ops::{
    AnyBackend, Backend, BlockMove, BufferShape, DecodeArgs, HostTensor, OpError, WriteArgs,
};
use kvlayout_cpu::{CacheMut, CacheRef, Decode, WriteKv};
pub use kvlayout_cpu::{Host, HostBuffers, HostExec, Ready, ScalarReference};
pub use kvlayout_cuda::CudaDevice;
pub use kvlayout_device::{Device, DeviceBackend};
pub use kvlayout_emu::EmuDevice;
pub use kvlayout_hip::HipDevice;

/// A backend run as an executor on host caches, for the tests that compare executors on the
/// same host bytes: each op uploads its caches and tensors, runs, waits, and copies the
/// destination back.
#[derive(Debug)]
pub struct Hosted<B>(pub B);

fn kernel(e: String) -> OpError {
    OpError::Kernel {
        kernel: "hosted",
        detail: e,
    }
}

impl<B: Backend> Hosted<B> {
    /// `c`'s bytes in a cache of the backend, buffer for buffer.
    fn upload(&self, c: &CacheRef<'_>) -> Result<B::Cache, OpError> {
        let shapes: Vec<BufferShape> = c
            .buffers()
            .iter()
            .map(|b| BufferShape {
                len: b.len() as u64,
                misalign: b.as_ptr() as u64 % 64,
            })
            .collect();
        let mut cache = self.0.alloc_cache(c.layout(), &shapes).map_err(kernel)?;
        let bytes: Vec<Vec<u8>> = c.buffers().iter().map(|b| b.to_vec()).collect();
        self.0.upload_cache(&mut cache, &bytes).map_err(kernel)?;
        Ok(cache)
    }

    /// Waits for `done` and copies `cache` back into `dst`.
    fn finish(
        &self,
        done: B::Completion,
        cache: &B::Cache,
        dst: &mut CacheMut<'_>,
    ) -> Result<(), OpError> {
        self.0.wait(done).map_err(kernel)?;
        let bytes = self.0.download_cache(cache).map_err(kernel)?;
        for (d, b) in dst.buffers_mut().iter_mut().zip(bytes) {
            d.copy_from_slice(&b);
        }
        Ok(())
    }
}

impl<B: Backend> HostExec for Hosted<B> {
    fn write_kv(&self, cache: &mut CacheMut<'_>, w: &WriteKv<'_>) -> Result<(), OpError> {
        let mut c = self.upload(&cache.as_ref())?;
        let key = self.0.upload_tensor(&w.key.into()).map_err(kernel)?;
        let value = match w.value {
            Some(v) => Some(self.0.upload_tensor(&v.into()).map_err(kernel)?),
            None => None,
        };
        let args = WriteArgs {
            layer: w.layer,
            key: &key,
            value: value.as_ref(),
            slot_mapping: w.slot_mapping,
        };
        let done = self.0.write_kv(&mut c, &args)?;
        self.finish(done, &c, cache)
    }

    fn paged_decode(
        &self,
        cache: &CacheRef<'_>,
        d: &Decode<'_>,
        out: &mut [f32],
    ) -> Result<(), OpError> {
        let c = self.upload(cache)?;
        let query = self.0.upload_tensor(&d.query.into()).map_err(kernel)?;
        let mut o = self
            .0
            .upload_tensor(&HostTensor::F32(out.to_vec()))
            .map_err(kernel)?;
        let args = DecodeArgs {
            layer: d.layer,
            query: &query,
            block_table: d.block_table,
            blocks_per_seq: d.blocks_per_seq,
            seq_lens: d.seq_lens,
            params: d.params,
        };
        let done = self.0.paged_decode(&c, &args, &mut o)?;
        self.0.wait(done).map_err(kernel)?;
        out.copy_from_slice(&self.0.download_tensor(&o).map_err(kernel)?.to_f32());
        Ok(())
    }

    fn move_blocks(
        &self,
        src: Option<&CacheRef<'_>>,
        dst: &mut CacheMut<'_>,
        op: &BlockMove<'_>,
    ) -> Result<(), OpError> {
        let mut d = self.upload(&dst.as_ref())?;
        let s = src.map(|s| self.upload(s)).transpose()?;
        let done = self.0.move_blocks(s.as_ref(), &mut d, op)?;
        self.finish(done, &d, dst)
    }
}

/// One backend of the suite: its name, and the backend or why it cannot run here.
#[derive(Debug)]
pub struct SuiteBackend {
    /// The name it was opened by.
    pub name: String,
    /// The backend, or why it cannot run here.
    pub backend: Result<AnyBackend, String>,
}

/// Every backend the suite knows of, opened once (the CPU backends on pools of 3 threads, so
/// partitioned work is uneven).
#[derive(Debug)]
pub struct Backends {
    all: Vec<SuiteBackend>,
}

impl Default for Backends {
    fn default() -> Self {
        let options = kvlayout_backends::Options { threads: Some(3) };
        let all = kvlayout_backends::names()
            .into_iter()
            .map(|name| SuiteBackend {
                backend: kvlayout_backends::open_with(&name, &options).map_err(|e| match e {
                    kvlayout_backends::OpenError::Unavailable { reason, .. } => reason,
                    other => other.to_string(),
                }),
                name,
            })
            .collect();
        Backends { all }
    }
}

/// The environment variable that narrows the suite to some backends: comma-separated names,
/// where `cpu` also takes every `cpu:<build>` variant (`cpu,reference` is the CPU-dependent part
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

/// Whether the selected name `n` takes the backend `name`: itself, or one of its `n:...`
/// variants.
fn takes(n: &str, name: &str) -> bool {
    name == n || name.strip_prefix(n).is_some_and(|r| r.starts_with(':'))
}

impl Backends {
    /// The backends `KVLAYOUT_SUITE_BACKENDS` selects (every one where it is unset), in report
    /// order: cpu, its other kernel builds, reference, cuda-emu, hip-emu, cuda, hip.
    pub fn selected(&self) -> Vec<&SuiteBackend> {
        let selection = selection();
        self.all
            .iter()
            .filter(|b| selects(&selection, &b.name))
            .collect()
    }

    /// The names of the backends [`Backends::selected`] gives, in its order.
    pub fn names(&self) -> Vec<String> {
        self.selected().iter().map(|b| b.name.clone()).collect()
    }

    /// What `KVLAYOUT_SUITE_BACKENDS` leaves out, as a report line (`None` where it is unset);
    /// `Err` where it names a backend the suite does not have.
    pub fn left_out(&self) -> Result<Option<String>, String> {
        let Some(names) = selection() else {
            return Ok(None);
        };
        let all: Vec<&str> = self.all.iter().map(|b| b.name.as_str()).collect();
        for n in &names {
            if !all.iter().any(|b| takes(n, b)) {
                return Err(format!(
                    "{BACKENDS_VAR} names {n:?}, which is no backend here (backends: {})",
                    all.join(", ")
                ));
            }
        }
        let out: Vec<&str> = all
            .into_iter()
            .filter(|b| !names.iter().any(|n| takes(n, b)))
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

    /// Whether the backend named `name` opened here.
    fn is_open(&self, name: &str) -> bool {
        self.all.iter().any(|b| b.name == name && b.backend.is_ok())
    }
}

impl Backends {
    /// The failure `KVLAYOUT_REQUIRE_GPU` asks for when its GPU backend cannot run here:
    /// `cuda` or `hip` requires that one, any other non-empty value either of them.
    pub fn missing_required_gpu(&self) -> Option<String> {
        let want = std::env::var("KVLAYOUT_REQUIRE_GPU").unwrap_or_default();
        let ok = match want.as_str() {
            "" | "0" => return None,
            "cuda" => self.is_open("cuda:0"),
            "hip" => self.is_open("hip:0"),
            _ => self.is_open("cuda:0") || self.is_open("hip:0"),
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
        for name in ["cpu", "cpu:avx2", "cpu:avx512:prefetch-L2", "reference"] {
            assert!(selects(&sel, name), "{name}");
        }
        for name in ["cpux", "cuda-emu", "hip-emu", "cuda", "referenced"] {
            assert!(!selects(&sel, name), "{name}");
        }
        assert!(selects(&None, "hip"), "no selection takes every backend");
    }
}
