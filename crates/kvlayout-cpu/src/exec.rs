//! [`HostExec`]: the ops of an executor on host memory, in the CPU crate's argument types.
//! The CPU backend ([`CpuBackend`]) and the scalar reference
//! ([`ScalarReference`](crate::ScalarReference)) implement it; [`Host`](crate::Host) runs
//! either behind the contract's `Backend` trait. An executor implements `write_kv`,
//! `paged_decode` and `move_blocks`; the five block movers are provided on top of
//! `move_blocks`, as the contract's `Backend` provides them.

use std::ops::Range;

use kvlayout::ops::{BlockMove, Kernels, OpError};
use kvlayout::DType;

use crate::args::{Decode, WriteKv};
use crate::backend::CpuBackend;
use crate::cache::{CacheMut, CacheRef};
use crate::{decode, movers, write};

/// The ops of an executor on host memory. Each validates its arguments before it writes
/// anything, and returns when done.
pub trait HostExec {
    /// Writes new tokens' K and V (or MLA latents) at their slots.
    fn write_kv(&self, cache: &mut CacheMut<'_>, w: &WriteKv<'_>) -> Result<(), OpError>;
    /// One decode step; `out` is `[seqs, num_q_heads, v_width]` f32.
    fn paged_decode(
        &self,
        cache: &CacheRef<'_>,
        d: &Decode<'_>,
        out: &mut [f32],
    ) -> Result<(), OpError>;
    /// The block move `op` from `src` to `dst` (`src` is `None` for `copy_blocks`, within
    /// `dst`), validated by [`BlockMove::plan`].
    fn move_blocks(
        &self,
        src: Option<&CacheRef<'_>>,
        dst: &mut CacheMut<'_>,
        op: &BlockMove<'_>,
    ) -> Result<(), OpError>;

    /// What runs the ops (`Backend::kernels`); by default the scalar reference.
    fn kernels(&self) -> Kernels {
        Kernels {
            build: "reference".into(),
            why: "scalar, f64 accumulation".into(),
            threads: 1,
        }
    }
    /// Whether `paged_decode` on a cache of `dtype` multiplies bf16 operands; by default not.
    fn bf16_products(&self, dtype: DType) -> bool {
        let _ = dtype;
        false
    }

    /// Copies blocks within one cache, all layers (`src -> dst` pairs).
    fn copy_blocks(&self, cache: &mut CacheMut<'_>, pairs: &[(u64, u64)]) -> Result<(), OpError> {
        self.move_blocks(None, cache, &BlockMove::Copy(pairs))
    }
    /// Copies blocks between two pools of the same content (layouts may differ).
    fn swap_blocks(
        &self,
        src: &CacheRef<'_>,
        dst: &mut CacheMut<'_>,
        pairs: &[(u64, u64)],
    ) -> Result<(), OpError> {
        self.move_blocks(Some(src), dst, &BlockMove::Swap(pairs))
    }
    /// Copies blocks and a head range into a staging cache (block `i` = `blocks[i]`).
    fn gather_blocks(
        &self,
        cache: &CacheRef<'_>,
        blocks: &[u64],
        heads: Range<u64>,
        staging: &mut CacheMut<'_>,
    ) -> Result<(), OpError> {
        self.move_blocks(Some(cache), staging, &BlockMove::Gather { blocks, heads })
    }
    /// The inverse of [`HostExec::gather_blocks`].
    fn scatter_blocks(
        &self,
        staging: &CacheRef<'_>,
        blocks: &[u64],
        heads: Range<u64>,
        cache: &mut CacheMut<'_>,
    ) -> Result<(), OpError> {
        self.move_blocks(Some(staging), cache, &BlockMove::Scatter { blocks, heads })
    }
    /// Converts a whole cache to another layout of the same content and block count.
    fn convert(&self, src: &CacheRef<'_>, dst: &mut CacheMut<'_>) -> Result<(), OpError> {
        self.move_blocks(Some(src), dst, &BlockMove::Convert)
    }
}

/// A boxed executor is an executor (a host backend chosen at run time).
impl<E: HostExec + ?Sized> HostExec for Box<E> {
    fn write_kv(&self, cache: &mut CacheMut<'_>, w: &WriteKv<'_>) -> Result<(), OpError> {
        (**self).write_kv(cache, w)
    }

    fn paged_decode(
        &self,
        cache: &CacheRef<'_>,
        d: &Decode<'_>,
        out: &mut [f32],
    ) -> Result<(), OpError> {
        (**self).paged_decode(cache, d, out)
    }

    fn move_blocks(
        &self,
        src: Option<&CacheRef<'_>>,
        dst: &mut CacheMut<'_>,
        op: &BlockMove<'_>,
    ) -> Result<(), OpError> {
        (**self).move_blocks(src, dst, op)
    }

    fn kernels(&self) -> Kernels {
        (**self).kernels()
    }

    fn bf16_products(&self, dtype: DType) -> bool {
        (**self).bf16_products(dtype)
    }
}

/// The fast path: each op is its module's (`write`, `decode`, `movers`).
impl HostExec for CpuBackend {
    fn write_kv(&self, cache: &mut CacheMut<'_>, w: &WriteKv<'_>) -> Result<(), OpError> {
        write::write_tokens(self, cache, w)
    }

    fn paged_decode(
        &self,
        cache: &CacheRef<'_>,
        d: &Decode<'_>,
        out: &mut [f32],
    ) -> Result<(), OpError> {
        decode::decode_with(self, cache, d, out, decode::Options::default())
    }

    fn move_blocks(
        &self,
        src: Option<&CacheRef<'_>>,
        dst: &mut CacheMut<'_>,
        op: &BlockMove<'_>,
    ) -> Result<(), OpError> {
        movers::run_block_move(self, src, dst, op)
    }

    fn kernels(&self) -> Kernels {
        Kernels {
            build: self.kernel_build().into(),
            why: self.kernel_choice().into(),
            threads: self.threads(),
        }
    }

    fn bf16_products(&self, dtype: DType) -> bool {
        self.decode_tolerance(dtype) == crate::Tolerance::BF16_PRODUCTS
    }
}
