//! The machine the kernels run on: which kernel builds (instruction sets) it runs ([`Isa`],
//! detected once) and the cache level rows are prefetched to ([`PrefetchLevel`]), with the
//! prefetch hints themselves.

mod isa;
mod prefetch;

pub(crate) use isa::{available, Isa};
#[cfg(target_arch = "x86_64")]
pub(crate) use isa::{has_avx2, has_avx512, has_avx512_bf16};
pub use prefetch::PrefetchLevel;
pub(crate) use prefetch::{prefetch_bytes, prefetch_level, prefetch_to};
