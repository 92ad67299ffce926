//! One regression test per descriptor case the engines' layouts and the known bug classes
//! call for.
//!
//! Every expected offset, stride and shape here is written out by hand from each engine's
//! layout definition (`base + l*Ls + b*Bs + h*Hs + n*Ns + c`, the legacy shapes of each
//! engine). The code under test is only ever on the left of an assertion.
//!
//! This file holds the helpers every case uses; the cases are grouped by what they pin down,
//! one module each under `anchors/`.

#[path = "anchors/dense.rs"]
mod dense;
#[path = "anchors/legacy.rs"]
mod legacy;
#[path = "anchors/offsets.rs"]
mod offsets;
#[path = "anchors/pages.rs"]
mod pages;
#[path = "anchors/rows.rs"]
mod rows;
#[path = "anchors/single_head.rs"]
mod single_head;
#[path = "anchors/swaps.rs"]
mod swaps;

use kvlayout::{
    ByteRange, Convention, Coord, DType, Field, KvCacheLayout, LayoutError, TensorClaim, ViewTarget,
};

fn layout(spec: &str) -> KvCacheLayout {
    spec.parse().unwrap_or_else(|e| panic!("{spec}: {e}"))
}

/// The checked byte offset of an element of buffer 0.
fn at(
    l: &KvCacheLayout,
    field: Field,
    layer: u64,
    block: u64,
    head: u64,
    slot: u64,
    d: u64,
) -> u64 {
    at_in(l, 0, Coord::new(field, layer, block, head, slot, d))
}

/// The checked byte offset of an element that must lie in `buffer`.
fn at_in(l: &KvCacheLayout, buffer: u32, c: Coord) -> u64 {
    let loc = l.offset(&c).unwrap_or_else(|e| panic!("{l}: {c:?}: {e}"));
    assert_eq!(loc.buffer, buffer, "{l}: {c:?}");
    loc.offset
}

/// Extents `[L, B, H, N, width]` of one field, as the test states them (not as the layout says).
type Dom = [u64; 5];

/// Checks every element of `field` against the hand formula `want(l, b, h, n, d)`, through both
/// the checked address function and the kernel arguments, and that one past the end of every
/// axis has no address.
fn sweep(l: &KvCacheLayout, field: Field, dom: Dom, want: impl Fn(u64, u64, u64, u64, u64) -> u64) {
    sweep_in(l, field, 0, dom, want)
}

/// [`sweep`] of a field that lies in `buffer`.
fn sweep_in(
    l: &KvCacheLayout,
    field: Field,
    buffer: u32,
    dom: Dom,
    want: impl Fn(u64, u64, u64, u64, u64) -> u64,
) {
    let args = l.kernel_args(field).unwrap();
    assert_eq!(args.buffer as u32, buffer, "{l}: {field}");
    let [nl, nb, nh, nn, nw] = dom;
    for a in 0..nl {
        for b in 0..nb {
            for h in 0..nh {
                for n in 0..nn {
                    for d in 0..nw {
                        let w = want(a, b, h, n, d);
                        assert_eq!(
                            at_in(l, buffer, Coord::new(field, a, b, h, n, d)),
                            w,
                            "{l}: {field}[{a},{b},{h},{n},{d}]"
                        );
                        let (ia, ib, ih, ind, id) =
                            (a as i64, b as i64, h as i64, n as i64, d as i64);
                        assert_eq!(
                            args.offset(ia, ib, ih, ind, id).unwrap(),
                            w as i64,
                            "{l}: kernel args of {field}[{a},{b},{h},{n},{d}]"
                        );
                    }
                }
            }
        }
    }
    for (axis, c) in [
        ("layer", Coord::new(field, nl, 0, 0, 0, 0)),
        ("block", Coord::new(field, 0, nb, 0, 0, 0)),
        ("head", Coord::new(field, 0, 0, nh, 0, 0)),
        ("slot", Coord::new(field, 0, 0, 0, nn, 0)),
        ("dim", Coord::new(field, 0, 0, 0, 0, nw)),
    ] {
        match l.offset(&c) {
            Err(LayoutError::OutOfRange { axis: a, .. }) => assert_eq!(a, axis, "{l}"),
            other => panic!("{l}: {field} one past the {axis} axis gave {other:?}"),
        }
    }
}

fn span(offset: u64, len: u64) -> Vec<ByteRange> {
    vec![ByteRange {
        buffer: 0,
        offset,
        len,
    }]
}

fn range(offset: u64, len: u64) -> ByteRange {
    ByteRange {
        buffer: 0,
        offset,
        len,
    }
}

/// `(shape, strides in elements, offset in elements)` of a view.
fn view(l: &KvCacheLayout, c: Convention, t: ViewTarget, layer: u64) -> (Vec<u64>, Vec<u64>, u64) {
    let v = l
        .view(c, t, layer)
        .unwrap_or_else(|e| panic!("{l}: {c} {t}: {e}"));
    (v.shape, v.strides, v.offset)
}

/// The claim that a tensor of `dtype` with `shape` and `strides` (in elements), at storage
/// offset `offset` (elements), is `target` of `layer` under convention `c`.
fn claim<'a>(
    c: Convention,
    target: ViewTarget,
    layer: u64,
    dtype: DType,
    shape: &'a [u64],
    strides: &'a [u64],
    offset: u64,
) -> TensorClaim<'a> {
    TensorClaim {
        convention: c,
        target,
        layer,
        shape,
        strides,
        dtype,
        storage_offset: Some(kvlayout::StorageOffset::Elements(offset)),
    }
}

fn view_refused(l: &KvCacheLayout, c: Convention, t: ViewTarget) -> bool {
    matches!(l.view(c, t, 0), Err(LayoutError::ViewRefused { .. }))
}

fn split_refused(l: &KvCacheLayout, r: u64) -> bool {
    matches!(
        l.split_blocks(r),
        Err(LayoutError::TransformRefused {
            transform: "split_blocks",
            ..
        })
    )
}

const K: ViewTarget = ViewTarget::Field(Field::K);
const V: ViewTarget = ViewTarget::Field(Field::V);
const KV: ViewTarget = ViewTarget::Kv;

/// All 24 physical orders of `[L, B, H, N]`, as four-letter strings, outermost first.
fn orders() -> Vec<String> {
    let axes = ['L', 'B', 'H', 'N'];
    let mut out = Vec::new();
    for a in axes {
        for b in axes {
            for c in axes {
                for d in axes {
                    let o = [a, b, c, d];
                    if axes.iter().all(|x| o.contains(x)) {
                        out.push(o.iter().collect::<String>());
                    }
                }
            }
        }
    }
    out
}

/// Dense byte strides of `L, B, H, N` for a four-letter order: the innermost axis moves by one
/// row, each axis further out by the extent of everything inside it.
fn dense_strides(order: &str, [nl, nb, nh, nn]: [u64; 4], row: u64) -> [u64; 4] {
    let mut strides = [0u64; 4];
    let mut running = row;
    for a in order.chars().rev() {
        let (i, ext) = match a {
            'L' => (0, nl),
            'B' => (1, nb),
            'H' => (2, nh),
            'N' => (3, nn),
            _ => unreachable!(),
        };
        strides[i] = running;
        running *= ext;
    }
    strides
}

/// Checks K and V of every element of `l`: one layer of `[nb, nh, nn]` blocks, heads and
/// tokens in dense rows `[K d][V d]` of `e`-byte elements, token-major (`nhd`) or head-major.
fn sweep_dense_kv(l: &KvCacheLayout, nhd: bool, [nb, nh, nn]: [u64; 3], d: u64, e: u64) {
    let g = Dense {
        nb,
        nh,
        nn,
        row: 2 * d * e,
    };
    for (f, off) in [(Field::K, 0), (Field::V, d * e)] {
        sweep(l, f, [1, nb, nh, nn, d], |a, b, h, n, i| {
            let row = if nhd {
                g.nhd(a, b, h, n)
            } else {
                g.hnd(a, b, h, n)
            };
            row + off + e * i
        });
    }
}

/// Byte offset of the start of row `(l, b, h, n)` in a dense token-major (NHD) or head-major
/// (HND) page of `row`-byte rows, `L` layers outside `B` blocks. Callers add the field's byte
/// offset in the row and `d * elem_bytes`.
struct Dense {
    nb: u64,
    nh: u64,
    nn: u64,
    row: u64,
}

impl Dense {
    fn nhd(&self, l: u64, b: u64, h: u64, n: u64) -> u64 {
        let page = self.nn * self.nh * self.row;
        l * self.nb * page + b * page + n * self.nh * self.row + h * self.row
    }
    fn hnd(&self, l: u64, b: u64, h: u64, n: u64) -> u64 {
        let page = self.nn * self.nh * self.row;
        l * self.nb * page + b * page + h * self.nn * self.row + n * self.row
    }
}

// ---------------------------------------------------------------------------------------------
