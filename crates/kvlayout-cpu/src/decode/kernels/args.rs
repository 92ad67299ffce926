//! The named arguments of the kernels: one struct per kernel family, shared by the dispatch
//! and every build, so each field is named once.

use super::rows::{RowKind, RowSet};
use crate::arch::PrefetchLevel;

/// f32 rows `stride` apart in `data` (query rows, weights).
#[derive(Clone, Copy)]
pub(crate) struct Strided<'a> {
    pub(crate) data: &'a [f32],
    pub(crate) stride: usize,
}

/// f32 rows `stride` apart in `data`, written (logits, accumulators, outputs).
pub(crate) struct StridedMut<'a> {
    pub(crate) data: &'a mut [f32],
    pub(crate) stride: usize,
}

impl StridedMut<'_> {
    /// The same rows, borrowed for a shorter while.
    #[inline]
    pub(crate) fn reborrow(&mut self) -> StridedMut<'_> {
        StridedMut {
            data: &mut *self.data,
            stride: self.stride,
        }
    }
}

/// The rows a key or value tile kernel reads: `rows` of `kind` at `hoff` bytes from each row's
/// start (`width` elements), and `next` at `next_hoff`, the rows read later, prefetched to
/// `level` meanwhile. `raw`: fp8 rows without their power of two
/// ([`fp8_fold`](super::fp8_fold)).
pub(crate) struct TileRows<'r, 'a> {
    pub(crate) kind: RowKind,
    pub(crate) raw: bool,
    pub(crate) rows: &'r RowSet<'a>,
    pub(crate) hoff: usize,
    pub(crate) next: &'r RowSet<'a>,
    pub(crate) next_hoff: usize,
    pub(crate) width: usize,
    pub(crate) level: PrefetchLevel,
}

/// The arguments of a SIMD key-tile kernel: `logits[j * ld + i] = sum_d q[j * qs + d] *
/// row_i[d]` for the rows (at `hoff`, `width` elements) and the `g` query rows (`q`, stride
/// `qs`; `logits`, stride `ld`). The rows of `pf` at `pf_hoff` are prefetched to `level`.
/// `chunk`: the piece stride of x-split rows (unused for rows read whole).
// Only the SIMD builds read all of it.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) struct KeyArgs<'a> {
    pub(crate) rows: &'a [*const u8],
    pub(crate) pf: &'a [*const u8],
    pub(crate) hoff: usize,
    pub(crate) pf_hoff: usize,
    pub(crate) width: usize,
    pub(crate) chunk: usize,
    pub(crate) q: Strided<'a>,
    pub(crate) g: usize,
    pub(crate) logits: StridedMut<'a>,
    pub(crate) level: PrefetchLevel,
}

/// The arguments of a SIMD value-tile kernel: `acc[j * s + d] += sum_i w[j * ld + i] *
/// row_i[d]` for the rows (at `hoff`, `width` elements) and the `g` accumulator rows (`acc`,
/// stride `s`; `w`, stride `ld`). The rows of `pf` at `pf_hoff` are prefetched to `level`.
// Only the SIMD builds read all of it.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) struct ValueArgs<'a> {
    pub(crate) rows: &'a [*const u8],
    pub(crate) pf: &'a [*const u8],
    pub(crate) hoff: usize,
    pub(crate) pf_hoff: usize,
    pub(crate) width: usize,
    pub(crate) w: Strided<'a>,
    pub(crate) g: usize,
    pub(crate) acc: StridedMut<'a>,
    pub(crate) level: PrefetchLevel,
}

impl ValueArgs<'_> {
    /// These arguments for one pass over a block of heads: the accumulators reborrowed, and
    /// the rows of `pf` only when `prefetch` (the first head block prefetches the later
    /// step's rows; the others would prefetch them again).
    #[inline(always)]
    pub(crate) fn pass(&mut self, prefetch: bool) -> ValueArgs<'_> {
        ValueArgs {
            rows: self.rows,
            pf: if prefetch { self.pf } else { &[] },
            hoff: self.hoff,
            pf_hoff: self.pf_hoff,
            width: self.width,
            w: self.w,
            g: self.g,
            acc: self.acc.reborrow(),
            level: self.level,
        }
    }
}

/// A run of a tile's transposed value rows: for each element index `d`, tokens `i0 .. i0 + n`
/// of the tile side by side at byte `off + d * dim` of the buffer (`n <= 16`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Run {
    pub(crate) off: usize,
    pub(crate) i0: usize,
    pub(crate) n: usize,
}

/// The arguments of the transposed-value kernels: `out[j * ow + d] +=` the sum over the runs'
/// tokens of `w[j * ld + i0 + t]` times element `d` of token `i0 + t`, for the `g` heads and
/// `width` elements, in natural order (`out`, stride `ow`; `w`, stride `ld`). The runs of `pf`
/// (the step read later) are prefetched to `level`, each along the run of `runs` at its index.
// Only the SIMD builds read all of it.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) struct TransposedArgs<'a> {
    pub(crate) buf: &'a [u8],
    pub(crate) runs: &'a [Run],
    pub(crate) pf: &'a [Run],
    pub(crate) dim: usize,
    pub(crate) width: usize,
    pub(crate) w: Strided<'a>,
    pub(crate) g: usize,
    pub(crate) out: StridedMut<'a>,
    pub(crate) level: PrefetchLevel,
}

/// One online-softmax step over a tile of `nt` tokens for `g` heads: the logits (rows of
/// `logits`) become weights, scaled by `wscale` and per token by `vscale` after they are
/// summed, rounded to bf16 first with `round`; the running state is each head's maximum
/// (`maxes`), its [`SUM_LANES`](super::SUM_LANES) partial sums (`sums`) and its accumulator
/// row (`acc`).
pub(crate) struct SoftmaxStep<'a> {
    pub(crate) round: bool,
    pub(crate) nt: usize,
    pub(crate) g: usize,
    pub(crate) logits: StridedMut<'a>,
    pub(crate) wscale: f32,
    pub(crate) vscale: Option<&'a [f32]>,
    pub(crate) maxes: &'a mut [f32],
    pub(crate) sums: &'a mut [f32],
    pub(crate) acc: StridedMut<'a>,
}
