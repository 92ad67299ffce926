//! Fast paths of the block movers: `copy_blocks`, `swap_blocks`, `gather_blocks`,
//! `scatter_blocks` and `convert` all reduce to one list of [`Piece`]s between two layouts of
//! the same content, executed as memcpy of the largest units contiguous on both sides.

use std::ops::Range;

use kvlayout::ops::OpError;
use kvlayout::{FieldMap, KvCacheLayout};
use rayon::prelude::*;

use crate::args::{convert_moves, copy_moves, gather_moves, scatter_moves, swap_moves, Moves};
use crate::backend::CpuBackend;
use crate::cache::{CacheMut, CacheRef};
use crate::simd::{self, Isa, PrefetchLevel};

/// One field group to move: `unit` contiguous bytes at every point of `dims` on both sides.
#[derive(Debug, Clone)]
struct Piece {
    src_buf: usize,
    dst_buf: usize,
    src_base: u64,
    dst_base: u64,
    src_block: u64,
    dst_block: u64,
    unit: u64,
    /// `(extent, src_stride, dst_stride)`, innermost first.
    dims: Vec<(u64, u64, u64)>,
}

/// Whether a field's row (all of its content) is one contiguous run.
fn row_contiguous(m: &FieldMap) -> bool {
    let s = m.strides;
    s.dim == m.elem_bytes() && (s.dim_split == m.width || s.dim_chunk == s.dim_split * s.dim)
}

/// If every stored field shares the outer strides and the rows abut into one run, the run's
/// start and the fields' offsets in it.
/// `(start, length, per-field (offset in row, bytes))` of a fused row.
type FusedRow = (u64, u64, Vec<(u64, u64)>);

fn fused_row(layout: &KvCacheLayout) -> Option<FusedRow> {
    let f = layout.stored_fields();
    let same = f.windows(2).all(|w| {
        let (a, b) = (w[0].strides, w[1].strides);
        (a.buffer, a.layer, a.block, a.head, a.slot) == (b.buffer, b.layer, b.block, b.head, b.slot)
    });
    if !same || !f.iter().all(row_contiguous) {
        return None;
    }
    let mut runs: Vec<(u64, u64)> = f
        .iter()
        .map(|m| (m.strides.base_offset, m.width * m.elem_bytes()))
        .collect();
    let start = runs.iter().map(|r| r.0).min()?;
    let mut sorted = runs.clone();
    sorted.sort_unstable();
    let abut = sorted.windows(2).all(|w| w[0].0 + w[0].1 == w[1].0);
    let len = sorted.iter().map(|r| r.1).sum();
    for r in &mut runs {
        r.0 -= start;
    }
    abut.then_some((start, len, runs))
}

/// Builds the pieces that move heads `heads` of `src` to heads starting at `dst_head0` of
/// `dst` (all layers, all slots, all content) for one block pair.
fn plan(
    src: &KvCacheLayout,
    dst: &KvCacheLayout,
    heads: &Range<u64>,
    dst_head0: u64,
) -> Option<Vec<Piece>> {
    let outer = |a: &FieldMap, b: &FieldMap| {
        vec![
            (a.num_slots, a.strides.slot, b.strides.slot),
            (heads.end - heads.start, a.strides.head, b.strides.head),
            (a.num_layers, a.strides.layer, b.strides.layer),
        ]
    };
    let head_shift = |m: &FieldMap, h: u64| m.strides.base_offset + h * m.strides.head;
    let mut pieces = Vec::new();
    match (fused_row(src), fused_row(dst)) {
        (Some((s0, len_s, rs)), Some((d0, len_d, rd))) if len_s == len_d && rs == rd => {
            let (a, b) = (&src.stored_fields()[0], &dst.stored_fields()[0]);
            let shift_a = head_shift(a, heads.start) - a.strides.base_offset;
            let shift_b = head_shift(b, dst_head0) - b.strides.base_offset;
            pieces.push(Piece {
                src_buf: a.strides.buffer as usize,
                dst_buf: b.strides.buffer as usize,
                src_base: s0 + shift_a,
                dst_base: d0 + shift_b,
                src_block: a.strides.block,
                dst_block: b.strides.block,
                unit: len_s,
                dims: outer(a, b),
            });
        }
        _ => {
            for (a, b) in src.stored_fields().iter().zip(dst.stored_fields()) {
                let e = a.elem_bytes();
                let mut dims = Vec::new();
                let unit = if row_contiguous(a) && row_contiguous(b) {
                    a.width * e
                } else {
                    // Element by element: d = c * x + i with x the finer split; each side's
                    // content map must be affine in (c, i).
                    let x = a.strides.dim_split.min(b.strides.dim_split);
                    let (Some((ca, ea)), Some((cb, eb))) =
                        (split_strides(a, x), split_strides(b, x))
                    else {
                        return None;
                    };
                    dims.push((x, ea, eb));
                    dims.push((a.width / x, ca, cb));
                    e
                };
                dims.extend(outer(a, b));
                assert!(dims.len() <= MAX_DIMS);
                pieces.push(Piece {
                    src_buf: a.strides.buffer as usize,
                    dst_buf: b.strides.buffer as usize,
                    src_base: head_shift(a, heads.start),
                    dst_base: head_shift(b, dst_head0),
                    src_block: a.strides.block,
                    dst_block: b.strides.block,
                    unit,
                    dims,
                });
            }
        }
    }
    for p in &mut pieces {
        p.dims.retain(|d| d.0 > 1);
        // Fold dims contiguous on both sides into the unit, innermost first.
        p.dims.sort_by_key(|d| (d.2, d.1));
        while let Some(&(ext, ss, ds)) = p.dims.first() {
            if ss == p.unit && ds == p.unit {
                p.unit *= ext;
                p.dims.remove(0);
            } else {
                break;
            }
        }
    }
    Some(pieces)
}

/// `(chunk stride, element stride)` of a field's content for `d = c * x + i`, if affine.
fn split_strides(m: &FieldMap, x: u64) -> Option<(u64, u64)> {
    let s = m.strides;
    if s.dim_split == x {
        Some((s.dim_chunk, s.dim))
    } else if s.dim_split == m.width && m.width.is_multiple_of(x) {
        Some((x * s.dim, s.dim))
    } else {
        None
    }
}

/// A destination pointer shared by the workers; each writes a disjoint set of bytes.
#[derive(Clone, Copy)]
struct DstPtr(*mut u8);
// SAFETY: workers write disjoint byte ranges of the pointee (see `execute`).
unsafe impl Send for DstPtr {}
unsafe impl Sync for DstPtr {}

impl DstPtr {
    /// The pointer (a method, so closures capture the `Sync` wrapper, not the raw field).
    fn get(self) -> *mut u8 {
        self.0
    }
}

/// Runs a plan over block pairs. `src` and `dst` are the caches' buffers as raw pointers with
/// their lengths; for a copy inside one cache they point to the same buffers.
///
/// Soundness: every offset comes from validated layouts and validated block ids, so each
/// `unit` range lies inside its buffer (buffers were checked to cover the layouts' extents);
/// destination ranges of different `(pair, dims)` points are disjoint because the destination
/// layout is injective and destination blocks are distinct; sources never overlap
/// destinations (distinct caches, or distinct blocks of one cache, checked by the callers).
fn execute(
    be: &CpuBackend,
    pieces: &[Piece],
    pairs: &[(u64, u64)],
    src: &[(*const u8, usize)],
    dst: &[(DstPtr, usize)],
) {
    let src: Vec<(usize, usize)> = src.iter().map(|(p, n)| (*p as usize, *n)).collect();
    for p in pieces {
        // Stream (non-temporal stores) when the destination is far larger than the caches.
        let moved = pairs.len() as u64 * p.dims.iter().map(|d| d.0).product::<u64>() * p.unit;
        let unit = p.unit as usize;
        let stream = moved >= STREAM_THRESHOLD && unit.is_multiple_of(64);
        // Iterate in source order (sequential reads; the streamed writes need no locality),
        // except a streamed permutation on a machine that prefetches into L2 (Intel): there
        // it goes in destination order — one write-combining stream instead of one per
        // destination row the source order touches — while each item's source range is
        // prefetched during the item before it. Measured on a Xeon, convert NHD <-> HND f16:
        // 0.73-0.77 of memcpy in source order, 0.94-1.08 in destination order with the
        // prefetch (0.69-0.79 without it); on Zen the source order gave 1.11-1.24.
        let dst_order = stream && !p.dims.is_empty() && be.prefetch == PrefetchLevel::L2;
        let mut dims = p.dims.clone();
        if dst_order {
            dims.sort_by_key(|d| (d.2, d.1));
        } else {
            dims.sort_by_key(|d| (d.1, d.2));
        }
        // Parallel over (pair, outermost dim). Split the work by block pair when there are
        // enough pairs, else also by the outermost dim.
        let by_pair = pairs.len() >= 8 * be.threads();
        let (outer_ext, outer_s, outer_d, inner) = match dims.split_last() {
            Some((&(e, s, d), rest)) if !by_pair => (e, s, d, rest.to_vec()),
            _ => (1, 0, 0, dims),
        };
        let total: u64 = inner.iter().map(|d| d.0).product();
        let (sp, sl) = src[p.src_buf];
        let (DstPtr(dp), dl) = dst[p.dst_buf];
        let dp = DstPtr(dp);
        let items = pairs.len() as u64 * outer_ext;
        let item_src = |item: u64| {
            let (sb, _) = pairs[(item / outer_ext) as usize];
            p.src_base + sb * p.src_block + (item % outer_ext) * outer_s
        };
        // Lines of an item's source range, prefetched `per_unit` at a time: only when the range
        // is at least half data (a head-range gather reads less of each row) and fits L2.
        let span = inner.iter().map(|d| (d.0 - 1) * d.1).sum::<u64>() + p.unit;
        let span_lines = if dst_order && span <= 2 * total * p.unit {
            span.div_ceil(64).min(PREFETCH_SPAN_LINES)
        } else {
            0
        };
        let per_unit = span_lines.div_ceil(total);
        let nt = if stream {
            stream_kind(be.isa)
        } else {
            Stream::No
        };
        be.pool.install(|| {
            (0..pairs.len() as u64 * outer_ext)
                .into_par_iter()
                .for_each(|item| {
                    let (_, db) = pairs[(item / outer_ext) as usize];
                    let o = item % outer_ext;
                    let s0 = item_src(item);
                    let d0 = p.dst_base + db * p.dst_block + o * outer_d;
                    // The next item's source lines (none past the buffer), a few per unit.
                    let (next_line, pf_lines) = if item + 1 < items {
                        let first = item_src(item + 1) / 64;
                        (
                            first,
                            span_lines.min((sl as u64 / 64).saturating_sub(first)),
                        )
                    } else {
                        (0, 0)
                    };
                    let pf_base = (sp as *const u8).wrapping_add((next_line * 64) as usize);
                    let mut line = 0;
                    // At most `MAX_DIMS` dimensions (`plan`): no allocation per item.
                    let mut idx = [0u64; MAX_DIMS];
                    let idx = &mut idx[..inner.len()];
                    for _ in 0..total {
                        for _ in 0..per_unit {
                            if line < pf_lines {
                                simd::prefetch(pf_base.wrapping_add((line * 64) as usize));
                            }
                            line += 1;
                        }
                        let (mut so, mut dof) = (s0, d0);
                        for (i, d) in idx.iter().zip(&inner) {
                            so += i * d.1;
                            dof += i * d.2;
                        }
                        let (so, dof) = (so as usize, dof as usize);
                        assert!(
                            so + unit <= sl && dof + unit <= dl,
                            "plan stays inside the buffers"
                        );
                        // SAFETY: in bounds (asserted), disjoint from other workers' writes and
                        // from the source (see the function's doc).
                        unsafe {
                            copy_unit((sp as *const u8).add(so), dp.get().add(dof), unit, nt)
                        };
                        for (i, d) in idx.iter_mut().zip(&inner) {
                            *i += 1;
                            if *i < d.0 {
                                break;
                            }
                            *i = 0;
                        }
                    }
                    if stream {
                        store_fence();
                    }
                });
        });
    }
}

/// Most dimensions of a piece: the element split and its chunks, then slot, head, layer.
const MAX_DIMS: usize = 5;

/// Bytes moved by one op above which destination writes bypass the caches.
const STREAM_THRESHOLD: u64 = 8 << 20;

/// Most lines of the next item's source prefetched during an item (256 KiB, within L2).
const PREFETCH_SPAN_LINES: u64 = 4096;

/// How a unit's destination is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stream {
    /// Through the caches (`memcpy`).
    No,
    /// Non-temporal 64-byte stores (AVX-512).
    Avx512,
    /// Non-temporal 32-byte stores (AVX).
    Avx,
}

/// The non-temporal stores of the backend's kernel build (which this machine runs): 64-byte
/// stores on the AVX-512 builds, 32-byte on AVX2, none on scalar; so the tests of each build
/// exercise its stores on any machine.
fn stream_kind(isa: Isa) -> Stream {
    #[cfg(target_arch = "x86_64")]
    {
        if isa.avx512() {
            return Stream::Avx512;
        }
        if isa == Isa::Avx2 {
            return Stream::Avx;
        }
    }
    let _ = isa;
    Stream::No
}

/// Copies `len` bytes; with a `Stream` other than `No` (detected by [`stream_kind`]),
/// 64-byte-aligned destinations of whole 64-byte lines are written with non-temporal stores,
/// saving the read-for-ownership traffic.
///
/// # Safety
/// `src` and `dst` are valid for `len` bytes and do not overlap; `stream` comes from
/// [`stream_kind`] of a build this machine runs (its instructions are present).
#[inline]
unsafe fn copy_unit(src: *const u8, dst: *mut u8, len: usize, stream: Stream) {
    #[cfg(target_arch = "x86_64")]
    if stream != Stream::No && (dst as usize).is_multiple_of(64) && len.is_multiple_of(64) {
        // SAFETY: the build's features were detected (`stream_kind`); same contract as this
        // function.
        return unsafe {
            match stream {
                Stream::Avx512 => stream_avx512(src, dst, len),
                _ => stream_avx(src, dst, len),
            }
        };
    }
    let _ = stream;
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn stream_avx512(src: *const u8, dst: *mut u8, len: usize) {
    use std::arch::x86_64::*;
    let mut i = 0;
    while i < len {
        // SAFETY: i + 64 <= len (len is a multiple of 64); dst + i is 64-byte aligned.
        unsafe {
            let v = _mm512_loadu_si512(src.add(i) as *const _);
            _mm512_stream_si512(dst.add(i) as *mut _, v);
        }
        i += 64;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn stream_avx(src: *const u8, dst: *mut u8, len: usize) {
    use std::arch::x86_64::*;
    let mut i = 0;
    while i < len {
        // SAFETY: i + 32 <= len; dst + i is 32-byte aligned.
        unsafe {
            let v = _mm256_loadu_si256(src.add(i) as *const __m256i);
            _mm256_stream_si256(dst.add(i) as *mut __m256i, v);
        }
        i += 32;
    }
}

/// Orders this thread's non-temporal stores before anything that follows.
fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: sfence has no preconditions (SSE is baseline on x86_64).
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

fn src_ptrs(c: &CacheRef<'_>) -> Vec<(*const u8, usize)> {
    c.buffers.iter().map(|b| (b.as_ptr(), b.len())).collect()
}

fn dst_ptrs(c: &mut CacheMut<'_>) -> Vec<(DstPtr, usize)> {
    c.buffers
        .iter_mut()
        .map(|b| (DstPtr(b.as_mut_ptr()), b.len()))
        .collect()
}

/// Runs validated moves from `src` to `dst`; falls back to the reference when a content map
/// is not affine in the plan's terms.
fn move_blocks(be: &CpuBackend, src: &CacheRef<'_>, dst: &mut CacheMut<'_>, m: &Moves) {
    match plan(src.layout, dst.layout, &m.heads, m.dst_head0) {
        Some(pieces) => {
            let s = src_ptrs(src);
            let d = dst_ptrs(dst);
            execute(be, &pieces, &m.pairs, &s, &d);
        }
        None => crate::reference::copy_elements(src, dst, m),
    }
}

pub(crate) fn copy_blocks(
    be: &CpuBackend,
    cache: &mut CacheMut<'_>,
    pairs: &[(u64, u64)],
) -> Result<(), OpError> {
    let m = copy_moves(cache.layout, pairs)?;
    match plan(cache.layout, cache.layout, &m.heads, 0) {
        Some(pieces) => {
            // Sources and destinations are distinct blocks of the same buffers.
            let d = dst_ptrs(cache);
            let s: Vec<(*const u8, usize)> =
                d.iter().map(|(p, n)| (p.get() as *const u8, *n)).collect();
            execute(be, &pieces, &m.pairs, &s, &d);
        }
        None => crate::reference::copy_blocks(cache, pairs)?,
    }
    Ok(())
}

pub(crate) fn swap_blocks(
    be: &CpuBackend,
    src: &CacheRef<'_>,
    dst: &mut CacheMut<'_>,
    pairs: &[(u64, u64)],
) -> Result<(), OpError> {
    let m = swap_moves(src.layout, dst.layout, pairs)?;
    move_blocks(be, src, dst, &m);
    Ok(())
}

pub(crate) fn gather_blocks(
    be: &CpuBackend,
    cache: &CacheRef<'_>,
    blocks: &[u64],
    heads: Range<u64>,
    staging: &mut CacheMut<'_>,
) -> Result<(), OpError> {
    let m = gather_moves(cache.layout, staging.layout, blocks, heads)?;
    move_blocks(be, cache, staging, &m);
    Ok(())
}

pub(crate) fn scatter_blocks(
    be: &CpuBackend,
    staging: &CacheRef<'_>,
    blocks: &[u64],
    heads: Range<u64>,
    cache: &mut CacheMut<'_>,
) -> Result<(), OpError> {
    let m = scatter_moves(staging.layout, cache.layout, blocks, heads)?;
    move_blocks(be, staging, cache, &m);
    Ok(())
}

pub(crate) fn convert(
    be: &CpuBackend,
    src: &CacheRef<'_>,
    dst: &mut CacheMut<'_>,
) -> Result<(), OpError> {
    let m = convert_moves(src.layout, dst.layout)?;
    move_blocks(be, src, dst, &m);
    Ok(())
}
