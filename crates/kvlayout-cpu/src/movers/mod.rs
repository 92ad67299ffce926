//! The block movers: `copy_blocks`, `swap_blocks`, `gather_blocks`, `scatter_blocks` and
//! `convert`, one [`BlockMove`] validated and planned by the descriptor
//! (`kvlayout::ops::moves`); this module executes the plan ([`execute`]: memcpy or streamed
//! stores of the largest units contiguous on both sides, threads over block pairs), or, for
//! layouts the plan cannot express, copies element by element ([`elementwise`]).

mod elementwise;
mod execute;
mod stream;

use kvlayout::ops::{BlockMove, Moves, OpError};

use crate::backend::CpuBackend;
use crate::cache::{CacheMut, CacheRef};

/// A destination pointer shared by the workers; each writes a disjoint set of bytes.
#[derive(Clone, Copy)]
struct DstPtr(*mut u8);
// SAFETY: workers write disjoint byte ranges of the pointee (see `execute::execute`).
unsafe impl Send for DstPtr {}
// SAFETY: shared use only copies the pointer out (`get`); writes through it go to disjoint
// byte ranges, one worker each, never overlapping a source (see `run`'s soundness note).
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

/// Validates the block move `op` and runs it from `src` (`None`: within `dst`) into `dst`:
/// the CPU backend's `move_blocks`.
pub(crate) fn run_block_move(
    be: &CpuBackend,
    src: Option<&CacheRef<'_>>,
    dst: &mut CacheMut<'_>,
    op: &BlockMove<'_>,
) -> Result<(), OpError> {
    let m = op.plan(src.map(|s| s.layout), dst.layout)?;
    let dst_layout = dst.layout;
    let (src_layout, bufs) = match src {
        Some(s) => (s.layout, Buffers::of(s, dst)),
        // Sources and destinations are distinct blocks of the same buffers (the plan checks).
        None => (dst_layout, Buffers::within(dst)),
    };
    run(be, src_layout, dst_layout, &m, &bufs);
    Ok(())
}
