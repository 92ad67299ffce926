//! The machine the kernels run on: the CPU features this process uses ([`CpuFeatures`]:
//! detected once, minus those `KVLAYOUT_CPU_HIDE` hides), which kernel builds (instruction
//! sets) it runs ([`Isa`]) and the cache level rows are prefetched to ([`PrefetchLevel`]), with
//! the prefetch hints themselves.

// Each probes the CPU or issues a hint through `std::arch` intrinsics.
#[allow(unsafe_code)]
mod features;
#[allow(unsafe_code)]
mod isa;
#[allow(unsafe_code)]
mod prefetch;

pub use features::{CpuFeatures, UnknownFeature, HIDE_VAR};
pub(crate) use isa::{available, Isa};
#[cfg(target_arch = "x86_64")]
pub(crate) use isa::{has_avx2, has_avx512, has_avx512_bf16};
pub use prefetch::PrefetchLevel;
pub(crate) use prefetch::{prefetch_bytes, prefetch_level, prefetch_to};
