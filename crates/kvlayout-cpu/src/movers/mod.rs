//! The block movers: `copy_blocks`, `swap_blocks`, `gather_blocks`, `scatter_blocks` and
//! `convert`. Their arguments are validated and planned by the descriptor
//! (`kvlayout::ops::moves`); this module executes the plan ([`execute`]: memcpy or streamed
//! stores of the largest units contiguous on both sides, threads over block pairs), or, for
//! layouts the plan cannot express, copies element by element ([`elementwise`]).

mod elementwise;
mod execute;
mod stream;

use std::ops::Range;

use kvlayout::ops::{
    convert_moves, copy_moves, gather_moves, scatter_moves, swap_moves, Moves, OpError,
};

use crate::backend::CpuBackend;
use crate::cache::{CacheMut, CacheRef};

/// A destination pointer shared by the workers; each writes a disjoint set of bytes.
#[derive(Clone, Copy)]
struct DstPtr(*mut u8);
// SAFETY: workers write disjoint byte ranges of the pointee (see `execute::execute`).
unsafe impl Send for DstPtr {}
unsafe impl Sync for DstPtr {}

impl DstPtr {
    /// The pointer (a method, so closures capture the `Sync` wrapper, not the raw field).
    fn get(self) -> *mut u8 {
        self.0
    }
}

/// A cache's buffers as seen by the workers: `(start, length)` of each source buffer (as an
/// address, so it is `Sync`) and of each destination buffer.
struct Buffers {
    src: Vec<(usize, usize)>,
    dst: Vec<(DstPtr, usize)>,
}

impl Buffers {
    /// Source and destination buffers of two caches.
    fn of(src: &CacheRef<'_>, dst: &mut CacheMut<'_>) -> Self {
        Buffers {
            src: src
                .buffers
                .iter()
                .map(|b| (b.as_ptr() as usize, b.len()))
                .collect(),
            dst: dst_ptrs(dst),
        }
    }

    /// One cache as both source and destination (moves between distinct blocks).
    fn within(cache: &mut CacheMut<'_>) -> Self {
        let dst = dst_ptrs(cache);
        Buffers {
            src: dst.iter().map(|(p, n)| (p.get() as usize, *n)).collect(),
            dst,
        }
    }
}

fn dst_ptrs(c: &mut CacheMut<'_>) -> Vec<(DstPtr, usize)> {
    c.buffers
        .iter_mut()
        .map(|b| (DstPtr(b.as_mut_ptr()), b.len()))
        .collect()
}

/// Runs validated moves: the plan when the layouts have one, else element by element.
///
/// Soundness (for both paths): every offset comes from validated layouts and validated block
/// ids, so it lies inside its buffer (buffers were checked to cover the layouts' extents, and
/// each access is asserted in bounds); the destination bytes of different elements are
/// disjoint because the destination layout is injective and destination blocks are distinct;
/// sources never overlap destinations (distinct caches, or distinct blocks of one cache,
/// checked by `copy_moves`).
fn run(
    be: &CpuBackend,
    src: &kvlayout::KvCacheLayout,
    dst: &kvlayout::KvCacheLayout,
    m: &Moves,
    bufs: &Buffers,
) {
    match m.plan(src, dst) {
        Some(plan) => execute::execute(be, &plan, &m.pairs, bufs),
        None => elementwise::copy_elements(be, src, dst, m, bufs),
    }
}

fn move_blocks(be: &CpuBackend, src: &CacheRef<'_>, dst: &mut CacheMut<'_>, m: &Moves) {
    let bufs = Buffers::of(src, dst);
    run(be, src.layout, dst.layout, m, &bufs);
}

/// The block movers, each validated by the contract (`kvlayout::ops::moves`) before anything
/// is written, then run by the plan (or element by element where none exists).
impl CpuBackend {
    /// Copies blocks within one cache, all layers.
    pub fn copy_blocks(
        &self,
        cache: &mut CacheMut<'_>,
        pairs: &[(u64, u64)],
    ) -> Result<(), OpError> {
        let m = copy_moves(cache.layout, pairs)?;
        let layout = cache.layout;
        // Sources and destinations are distinct blocks of the same buffers.
        let bufs = Buffers::within(cache);
        run(self, layout, layout, &m, &bufs);
        Ok(())
    }

    /// Copies blocks between two pools of the same content (layouts may differ).
    pub fn swap_blocks(
        &self,
        src: &CacheRef<'_>,
        dst: &mut CacheMut<'_>,
        pairs: &[(u64, u64)],
    ) -> Result<(), OpError> {
        let m = swap_moves(src.layout, dst.layout, pairs)?;
        move_blocks(self, src, dst, &m);
        Ok(())
    }

    /// Copies blocks and a head range into a staging cache (block `i` = `blocks[i]`).
    pub fn gather_blocks(
        &self,
        cache: &CacheRef<'_>,
        blocks: &[u64],
        heads: Range<u64>,
        staging: &mut CacheMut<'_>,
    ) -> Result<(), OpError> {
        let m = gather_moves(cache.layout, staging.layout, blocks, heads)?;
        move_blocks(self, cache, staging, &m);
        Ok(())
    }

    /// The inverse of [`CpuBackend::gather_blocks`].
    pub fn scatter_blocks(
        &self,
        staging: &CacheRef<'_>,
        blocks: &[u64],
        heads: Range<u64>,
        cache: &mut CacheMut<'_>,
    ) -> Result<(), OpError> {
        let m = scatter_moves(staging.layout, cache.layout, blocks, heads)?;
        move_blocks(self, staging, cache, &m);
        Ok(())
    }

    /// Converts a whole cache to another layout of the same content.
    pub fn convert(&self, src: &CacheRef<'_>, dst: &mut CacheMut<'_>) -> Result<(), OpError> {
        let m = convert_moves(src.layout, dst.layout)?;
        move_blocks(self, src, dst, &m);
        Ok(())
    }
}
