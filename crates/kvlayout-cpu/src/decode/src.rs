//! One field the decode reads (keys, values, their inline scales): how its rows are located
//! through the field map, and whether the kernels read them in place or from contiguous
//! copies.

use std::ops::Range;

use kvlayout::ops::OpError;
use kvlayout::{DType, FieldMap};

use super::kernels::{self, Order, Role, RowKind, RowSet, SPLIT_PIECE};
use crate::arch::Isa;
use crate::cache::CacheRef;
use crate::elem::decode;

/// How a field's rows are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Rows {
    /// Contiguous rows: read in place, widened by the kernels.
    Direct,
    /// Anything else: copied element by element through the strides into contiguous rows
    /// of the same dtype, then read as direct rows are.
    Gathered,
    /// Keys in pieces of 16 bytes (the legacy vLLM key: `x` elements), read in place where
    /// [`kernels::reads_split`] ([`Src::x_split`]).
    Split,
}

/// Rows whose elements are consecutive are read in place, split into abutting chunks or not.
fn rows_of(m: &FieldMap) -> Rows {
    if m.row_contiguous() {
        Rows::Direct
    } else {
        Rows::Gathered
    }
}

/// One field the decode reads: its map, buffer, how its rows are read and the kernels' view
/// of them.
#[derive(Clone, Copy)]
pub(super) struct Src<'a> {
    pub(super) map: FieldMap,
    pub(super) buf: &'a [u8],
    pub(super) rows: Rows,
    /// The kind the kernels see (gathered rows too: they keep their dtype).
    pub(super) kind: RowKind,
    /// The kernels' element order for this field.
    pub(super) order: Order,
    /// `width` padded to the order's blocks.
    pub(super) padded: usize,
    /// fp8 rows read without their power of two, whose square root is this (see
    /// [`kernels::fp8_fold`]).
    pub(super) fold: Option<f32>,
}

impl<'a> Src<'a> {
    pub(super) fn new(
        cache: &CacheRef<'a>,
        map: FieldMap,
        isa: Isa,
        role: Role,
    ) -> Result<Self, OpError> {
        let rows = rows_of(&map);
        let kind = RowKind::of(map.dtype)?;
        let order = Order::of(isa, kind, role);
        Ok(Src {
            map,
            buf: cache.buffers[map.strides.buffer as usize],
            rows,
            kind,
            order,
            padded: order.padded(map.width as usize),
            fold: kernels::fp8_fold(isa, kind),
        })
    }

    /// Whether the rows are split into pieces of [`SPLIT_PIECE`] bytes of consecutive
    /// elements, each row a whole number of them (the legacy vLLM key); the piece stride is
    /// `dim_chunk`.
    pub(super) fn x_split(&self) -> bool {
        self.map.x_split(SPLIT_PIECE as u64)
    }

    /// Holds query or accumulator rows in `order` instead of the kind's kernel order.
    pub(super) fn set_order(&mut self, order: Order) {
        self.order = order;
        self.padded = order.padded(self.map.width as usize);
    }

    /// Byte offset of `(layer, block, head 0, slot, d 0)`.
    pub(super) fn slot_offset(&self, layer: u64, block: u64, slot: u64) -> u64 {
        self.map.slot_offset(layer, block, slot)
    }

    /// The f32 stored at `off` (inline scales).
    pub(super) fn f32_at(&self, off: u64) -> f32 {
        let off = off as usize;
        decode(DType::F32, &self.buf[off..off + 4])
    }

    /// Copies the rows of head `head` of a tile (`offs`: head 0 of each token) through the
    /// strides into `buf`, one contiguous row of the field's dtype after the other, and
    /// returns them.
    pub(super) fn gather_tile<'r>(
        &self,
        offs: &[u64],
        head: u64,
        buf: &'r mut [f32],
    ) -> RowSet<'r> {
        let e = self.map.elem_bytes() as usize;
        let row = self.map.width as usize * e;
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(buf);
        let rows = &mut bytes[..offs.len() * row];
        match e {
            1 => self.gather_with::<1>(offs, head, rows),
            2 => self.gather_with::<2>(offs, head, rows),
            _ => self.gather_with::<4>(offs, head, rows),
        }
        let rows: &'r [u8] = rows;
        let mut set = RowSet::new(row);
        for i in 0..offs.len() {
            set.push(rows, i * row);
        }
        set
    }

    /// [`Src::gather_tile`] for elements of `E` bytes. Element `d` of a row lies at
    /// `(d / split) * chunk + (d % split) * dim` from its start; the loops walk the chunks
    /// and their elements (no division per element). A chunk whose elements are contiguous
    /// (the x-split legacy key: 16 bytes) is copied whole. When consecutive tokens of the
    /// tile are consecutive in memory (`slot == E`: the transposed legacy value), each
    /// element index is copied across a run of tokens at once, in address order.
    pub(super) fn gather_with<const E: usize>(&self, offs: &[u64], head: u64, rows: &mut [u8]) {
        let (split, _, dim) = self.split();
        let w = self.map.width as usize;
        let hs = self.map.head_offset(head) as usize;
        let slot = self.map.slot_stride() as usize;
        if slot == E && dim != E {
            self.gather_transposed::<E>(offs, hs, rows);
        } else if dim == E && slot == split * E && w.is_multiple_of(split) {
            self.gather_pieces::<E>(offs, hs, rows);
        } else {
            self.gather_rows::<E>(offs, hs, rows);
        }
    }

    /// `(split, chunk, dim)`: elements per chunk, and the bytes between chunks and between
    /// the elements of a chunk.
    fn split(&self) -> (usize, usize, usize) {
        let m = &self.map;
        let (split, chunk) = (m.strides.dim_split, m.strides.dim_chunk);
        (split as usize, chunk as usize, m.strides.dim as usize)
    }

    /// [`Src::gather_with`] of transposed rows (tokens of a run side by side per element
    /// index): column `d` of the run's rows copied from one contiguous run of values.
    fn gather_transposed<const E: usize>(&self, offs: &[u64], hs: usize, rows: &mut [u8]) {
        let (split, chunk, dim) = self.split();
        let w = self.map.width as usize;
        token_runs(offs, E as u64, hs, &mut |i0, i1, base| {
            let dst = &mut rows[i0 * w * E..i1 * w * E];
            for c in 0..w.div_ceil(split) {
                for j in 0..split.min(w - c * split) {
                    let (d, p) = (c * split + j, base + c * chunk + j * dim);
                    let src = &self.buf[p..p + (i1 - i0) * E];
                    // Token t's element d: column d of the run's rows.
                    for (row, x) in dst.chunks_exact_mut(w * E).zip(src.chunks_exact(E)) {
                        row[d * E..(d + 1) * E].copy_from_slice(x);
                    }
                }
            }
        });
    }

    /// [`Src::gather_with`] of contiguous pieces of `split` elements whose tokens lie side
    /// by side (the x-split legacy key: 16 bytes): copied piece by piece across a run of
    /// tokens.
    fn gather_pieces<const E: usize>(&self, offs: &[u64], hs: usize, rows: &mut [u8]) {
        let (split, chunk, _) = self.split();
        let w = self.map.width as usize;
        let piece = split * E;
        token_runs(offs, piece as u64, hs, &mut |i0, i1, base| {
            let dst = &mut rows[i0 * w * E..i1 * w * E];
            let (n, pieces) = (i1 - i0, w / split);
            if piece == 16 {
                // Every piece of the run inside the buffer: the last one's end checked.
                let src = &self.buf[base..base + (pieces - 1) * chunk + n * 16];
                let (s0, d0) = (src.as_ptr(), dst.as_mut_ptr());
                for c in 0..pieces {
                    for t in 0..n {
                        // SAFETY: piece `c` of token `t` is the 16 bytes at `c * chunk +
                        // t * 16` of `src` (checked above) and goes to bytes `t * w * E +
                        // c * 16 ..` of `dst` (`n` rows of `w * E = pieces * 16` bytes).
                        unsafe {
                            let x = s0.add(c * chunk + t * 16).cast::<u128>().read_unaligned();
                            d0.add(t * w * E + c * 16).cast::<u128>().write_unaligned(x);
                        }
                    }
                }
                return;
            }
            for c in 0..pieces {
                let p = base + c * chunk;
                let src = &self.buf[p..p + n * piece];
                for (row, x) in dst.chunks_exact_mut(w * E).zip(src.chunks_exact(piece)) {
                    copy_piece(&mut row[c * piece..(c + 1) * piece], x);
                }
            }
        });
    }

    /// [`Src::gather_with`] of any other rows: token by token, chunk by chunk.
    fn gather_rows<const E: usize>(&self, offs: &[u64], hs: usize, rows: &mut [u8]) {
        let (split, chunk, dim) = self.split();
        let w = self.map.width as usize;
        let piece = split * E;
        let elem =
            |buf: &[u8], at: usize| -> [u8; E] { buf[at..at + E].try_into().expect("E bytes") };
        for (&off, out) in offs.iter().zip(rows.chunks_exact_mut(w * E)) {
            let base = off as usize + hs;
            for (c, out) in out.chunks_mut(piece).enumerate() {
                let p = base + c * chunk;
                if dim == E {
                    copy_piece(out, &self.buf[p..p + out.len()]);
                } else {
                    for (j, o) in out.chunks_exact_mut(E).enumerate() {
                        o.copy_from_slice(&elem(self.buf, p + j * dim));
                    }
                }
            }
        }
    }

    /// Whether the rows are transposed (the legacy vLLM value): each element index holds a
    /// block's tokens side by side (`slot` = one element), so a run of the tile's tokens
    /// consecutive in memory is, per element index, one contiguous run of values.
    pub(super) fn transposed(&self) -> bool {
        let e = self.map.elem_bytes();
        self.rows == Rows::Gathered
            && self.map.slot_stride() == e
            && !self.map.is_dim_split()
            && self.map.strides.dim != e
    }

    /// The rows read in place (contiguous or split) of a tile (`offs`: head 0 of each token)
    /// for the heads `heads`: each row checked to span all of them.
    pub(super) fn direct_rows(&self, offs: &[u64], heads: &Range<usize>, rows: &mut RowSet<'a>) {
        let first = self.map.head_offset(heads.start as u64);
        for &off in offs {
            rows.push(self.buf, (off + first) as usize);
        }
    }

    /// Bytes from the first head's row of an item to the end of its last head's row.
    pub(super) fn span(&self, heads: &Range<usize>) -> usize {
        (self.map.head_offset(heads.len() as u64 - 1) + self.map.row_span()) as usize
    }
}

/// Calls `f(i0, i1, byte offset of head `hs` of token `i0`)` for each run `i0 .. i1` of the
/// tile's tokens (`offs`: head 0 of each) whose rows follow each other `step` bytes apart.
fn token_runs(offs: &[u64], step: u64, hs: usize, f: &mut dyn FnMut(usize, usize, usize)) {
    let mut i0 = 0;
    while i0 < offs.len() {
        let mut i1 = i0 + 1;
        while i1 < offs.len() && offs[i1] == offs[i1 - 1] + step {
            i1 += 1;
        }
        f(i0, i1, offs[i0] as usize + hs);
        i0 = i1;
    }
}

/// `dst = src` (equal lengths); the 16-byte pieces of x-split keys without a `memcpy` call.
#[inline]
fn copy_piece(dst: &mut [u8], src: &[u8]) {
    match (
        <&mut [u8; 16]>::try_from(&mut *dst),
        <&[u8; 16]>::try_from(src),
    ) {
        (Ok(d), Ok(s)) => *d = *s,
        _ => dst.copy_from_slice(src),
    }
}
