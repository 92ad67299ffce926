//! One regression test per descriptor case of `shared/anchors.md` section 5 (1-9, 12-14).
//!
//! Every expected offset, stride and shape here is written out by hand from the layout
//! definitions of `anchors.md` sections 1-2 (`base + l*Ls + b*Bs + h*Hs + n*Ns + c`, the legacy
//! shapes of each engine). The code under test is only ever on the left of an assertion.

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
        ("token", Coord::new(field, 0, 0, 0, nn, 0)),
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
// Case 1: every physical order x dtype; sentinel-filled neighbour blocks stay untouched.
// ---------------------------------------------------------------------------------------------

#[test]
fn case01_every_order_and_dtype_matches_the_dense_formula() {
    let (nl, nb, nh, nn, nd) = (2u64, 3u64, 2u64, 4u64, 8u64);
    // (content kind, dtype, element bytes, f32 scales inline)
    let dtypes = [
        ("kv", "f32", DType::F32, 4u64),
        ("kv", "f16", DType::F16, 2),
        ("kv", "bf16", DType::Bf16, 2),
        ("kv", "fp8_e4m3", DType::Fp8E4m3, 1),
        ("kv", "fp8_e5m2", DType::Fp8E5m2, 1),
        ("kv-scaled", "int8", DType::Int8, 1),
        ("kv-scaled", "fp8_e4m3", DType::Fp8E4m3, 1),
    ];
    let orders = orders();
    assert_eq!(orders.len(), 24);
    for base in [0u64, 96] {
        for order in &orders {
            for (kind, name, dtype, e) in dtypes {
                let spec = format!(
                    "{kind} L={nl} B={nb} N={nn} H={nh} D={nd} dtype={name} order={order}C base={base}"
                );
                let l = layout(&spec);
                // (field, byte offset in the row, width, element bytes, element type)
                let (row, fields) = if kind == "kv" {
                    (
                        2 * nd * e,
                        vec![
                            (Field::K, 0, nd, e, dtype),
                            (Field::V, nd * e, nd, e, dtype),
                        ],
                    )
                } else {
                    // [K 8 B][k_scale 4 B][V 8 B][v_scale 4 B]
                    (
                        24,
                        vec![
                            (Field::K, 0, nd, 1, dtype),
                            (Field::KScale, 8, 1, 4, DType::F32),
                            (Field::V, 12, nd, 1, dtype),
                            (Field::VScale, 20, 1, 4, DType::F32),
                        ],
                    )
                };
                let [ls, bs, hs, ns] = dense_strides(order, [nl, nb, nh, nn], row);
                let total = nl * nb * nh * nn * row;
                assert_eq!(l.registered_spans(), span(base, total), "{spec}");
                assert_eq!(l.dense_page_bytes(), nh * nn * row, "{spec}");
                assert_eq!(l.stored_fields().len(), fields.len(), "{spec}");
                for &(field, f_off, width, fe, fdt) in &fields {
                    // What a backend receives: kernel arguments and strided views.
                    let a = l.kernel_args(field).unwrap();
                    assert_eq!(
                        (
                            a.base_offset_bytes,
                            a.layer_stride_bytes,
                            a.block_stride_bytes,
                            a.head_stride_bytes,
                            a.slot_stride_bytes,
                            a.dim_stride_bytes,
                            a.width,
                            a.elem_bytes,
                            a.dtype,
                        ),
                        (
                            (base + f_off) as i64,
                            ls as i64,
                            bs as i64,
                            hs as i64,
                            ns as i64,
                            fe as i64,
                            width as i64,
                            fe as i32,
                            fdt.abi_code(),
                        ),
                        "{spec}: {field}"
                    );
                    for layer in 0..nl {
                        let v = l
                            .view(Convention::Standard, ViewTarget::Field(field), layer)
                            .unwrap();
                        assert_eq!(v.dtype, fdt);
                        assert_eq!(v.offset_bytes, base + layer * ls + f_off, "{spec}");
                        assert_eq!(v.shape, vec![nb, nh, nn, width], "{spec}");
                        assert_eq!(v.strides_bytes, vec![bs, hs, ns, fe], "{spec}");
                        assert_eq!(v.strides, vec![bs / fe, hs / fe, ns / fe, 1], "{spec}");
                        assert_eq!(v.offset, (base + layer * ls + f_off) / fe, "{spec}");
                        let fa = l
                            .view(Convention::FlashAttn, ViewTarget::Field(field), layer)
                            .unwrap();
                        assert_eq!(fa.shape, vec![nb, nn, nh, width], "{spec}");
                        assert_eq!(fa.strides_bytes, vec![bs, ns, hs, fe], "{spec}");
                        let fih = l
                            .view(Convention::FlashinferHnd, ViewTarget::Field(field), layer)
                            .unwrap();
                        assert_eq!(fih.shape, vec![nb, nh, nn, width], "{spec}");
                        assert_eq!(fih.strides_bytes, vec![bs, hs, ns, fe], "{spec}");
                    }
                    // vLLM paged v1 K view of an unsplit row: [B, H, D/x, N, x], x = 16 / e.
                    if field == Field::K {
                        let x = 16 / fe;
                        if nd % x == 0 {
                            let v = l.view(Convention::VllmPagedV1, K, 0).unwrap();
                            assert_eq!(v.shape, vec![nb, nh, nd / x, nn, x], "{spec}");
                            assert_eq!(v.strides_bytes, vec![bs, hs, x * fe, ns, fe], "{spec}");
                        } else {
                            assert!(view_refused(&l, Convention::VllmPagedV1, K), "{spec}");
                        }
                    }
                    sweep(&l, field, [nl, nb, nh, nn, width], |a, b, h, n, d| {
                        base + a * ls + b * bs + h * hs + n * ns + f_off + d * fe
                    });
                }

                // Write every element of block 1 (all layers, all heads) through the kernel
                // arguments into a sentinel-filled copy of the registered span.
                const SENTINEL: u8 = 0xA5;
                let mut mem = vec![SENTINEL; total as usize];
                let mut owner: Vec<Option<u64>> = vec![None; total as usize];
                let mut write_block = |blk: u64, mem: &mut Vec<u8>| {
                    for &(field, _, width, fe, _) in &fields {
                        let a = l.kernel_args(field).unwrap();
                        for layer in 0..nl {
                            for h in 0..nh {
                                for n in 0..nn {
                                    for d in 0..width {
                                        let o = a
                                            .offset(
                                                layer as i64,
                                                blk as i64,
                                                h as i64,
                                                n as i64,
                                                d as i64,
                                            )
                                            .unwrap()
                                            as u64;
                                        assert!(o >= base && o + fe <= base + total, "{spec}");
                                        for i in (o - base)..(o - base + fe) {
                                            let i = i as usize;
                                            assert_eq!(owner[i], None, "{spec}: byte {i} twice");
                                            owner[i] = Some(blk);
                                            mem[i] = 0x11 + blk as u8;
                                        }
                                    }
                                }
                            }
                        }
                    }
                };
                write_block(1, &mut mem);
                let regions = l.block_regions(1, 0..nl, 0..nh).unwrap();
                assert_eq!(
                    regions.iter().map(|r| r.len).sum::<u64>(),
                    nl * nh * nn * row,
                    "{spec}: block 1 holds L*H*N rows"
                );
                let inside = |o: u64| {
                    regions
                        .iter()
                        .any(|r| r.buffer == 0 && o >= r.offset && o < r.offset + r.len)
                };
                let mut written = 0u64;
                for (i, byte) in mem.iter().enumerate() {
                    let o = base + i as u64;
                    if inside(o) {
                        assert_eq!(*byte, 0x12, "{spec}: byte {o} of block 1 not written");
                        written += 1;
                    } else {
                        assert_eq!(*byte, SENTINEL, "{spec}: byte {o} outside block 1 touched");
                    }
                }
                assert_eq!(written, nl * nh * nn * row, "{spec}");
                // The neighbours fill the rest exactly once: a dense layout is a bijection.
                write_block(0, &mut mem);
                write_block(2, &mut mem);
                assert!(owner.iter().all(Option::is_some), "{spec}: span has holes");
                for (i, byte) in mem.iter().enumerate() {
                    let o = base + i as u64;
                    assert_eq!(inside(o), *byte == 0x12, "{spec}: byte {o}");
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Case 2: sizes that expose swaps, and the ambiguous ones.
// ---------------------------------------------------------------------------------------------

#[test]
fn case02_sizes_that_expose_swaps() {
    // B=3, H=4, N=16, D=8, f16: row [K 8][V 8] = 16 elements (32 B); page = 16*4*16 = 1024 el.
    let nhd = layout("kv B=3 N=16 H=4 D=8 dtype=f16 order=NHD");
    let hnd = layout("kv B=3 N=16 H=4 D=8 dtype=f16 order=HND");
    let g = Dense {
        nb: 3,
        nh: 4,
        nn: 16,
        row: 32,
    };
    for (f, off) in [(Field::K, 0), (Field::V, 16)] {
        sweep(&nhd, f, [1, 3, 4, 16, 8], |a, b, h, n, d| {
            g.nhd(a, b, h, n) + off + 2 * d
        });
        sweep(&hnd, f, [1, 3, 4, 16, 8], |a, b, h, n, d| {
            g.hnd(a, b, h, n) + off + 2 * d
        });
    }
    // Spot values with every index distinct: V[b=2, h=3, n=5, d=7].
    assert_eq!(
        at(&nhd, Field::V, 0, 2, 3, 5, 7),
        2 * 2048 + 5 * 128 + 3 * 32 + 16 + 14
    );
    assert_eq!(
        at(&hnd, Field::V, 0, 2, 3, 5, 7),
        2 * 2048 + 3 * 512 + 5 * 32 + 16 + 14
    );
    // Standard [B, H, N, D].
    assert_eq!(
        view(&nhd, Convention::Standard, K, 0),
        (vec![3, 4, 16, 8], vec![1024, 16, 64, 1], 0)
    );
    assert_eq!(
        view(&hnd, Convention::Standard, K, 0),
        (vec![3, 4, 16, 8], vec![1024, 256, 16, 1], 0)
    );
    assert_eq!(
        view(&nhd, Convention::Standard, V, 0),
        (vec![3, 4, 16, 8], vec![1024, 16, 64, 1], 8)
    );
    assert_eq!(
        view(&hnd, Convention::Standard, V, 0),
        (vec![3, 4, 16, 8], vec![1024, 256, 16, 1], 8)
    );
    // FlashAttention [B, N, H, D] per field, (2, B, N, H, D) together.
    assert_eq!(
        view(&nhd, Convention::FlashAttn, V, 0),
        (vec![3, 16, 4, 8], vec![1024, 64, 16, 1], 8)
    );
    assert_eq!(
        view(&hnd, Convention::FlashAttn, V, 0),
        (vec![3, 16, 4, 8], vec![1024, 16, 256, 1], 8)
    );
    assert_eq!(
        view(&nhd, Convention::FlashAttn, KV, 0),
        (vec![2, 3, 16, 4, 8], vec![8, 1024, 64, 16, 1], 0)
    );
    assert_eq!(
        view(&hnd, Convention::FlashAttn, KV, 0),
        (vec![2, 3, 16, 4, 8], vec![8, 1024, 16, 256, 1], 0)
    );
    // FlashInfer (B, 2, N, H, D) and (B, 2, H, N, D).
    assert_eq!(
        view(&nhd, Convention::Flashinfer, KV, 0),
        (vec![3, 2, 16, 4, 8], vec![1024, 8, 64, 16, 1], 0)
    );
    assert_eq!(
        view(&hnd, Convention::FlashinferHnd, KV, 0),
        (vec![3, 2, 4, 16, 8], vec![1024, 8, 256, 16, 1], 0)
    );
    // Kernel arguments: head and token strides never swapped.
    let (kn, kh) = (
        nhd.kernel_args(Field::V).unwrap(),
        hnd.kernel_args(Field::V).unwrap(),
    );
    assert_eq!((kn.head_stride_bytes, kn.slot_stride_bytes), (32, 128));
    assert_eq!((kh.head_stride_bytes, kh.slot_stride_bytes), (512, 32));
    assert_eq!((kn.num_heads, kn.num_slots, kn.num_blocks), (4, 16, 3));

    // B = 2: FlashAttention (2, B, N, H, D) and FlashInfer (B, 2, N, H, D) have the same shape
    // (2, 2, 16, 4, 8) and even the same strides, yet index 0 means K/V in one and the block in
    // the other. page = N*H*D*2 B = 1024 B of one of K or V of one block.
    let fa = layout("kv B=2 N=16 H=4 D=8 dtype=f16 legacy=flash-attn-nhd");
    let fi = layout("kv B=2 N=16 H=4 D=8 dtype=f16 legacy=flashinfer-nhd");
    let in_page = |h: u64, n: u64, d: u64| n * 4 * 16 + h * 16 + 2 * d;
    for (f, kv) in [(Field::K, 0u64), (Field::V, 1)] {
        sweep(&fa, f, [1, 2, 4, 16, 8], |_, b, h, n, d| {
            (kv * 2 + b) * 1024 + in_page(h, n, d)
        });
        sweep(&fi, f, [1, 2, 4, 16, 8], |_, b, h, n, d| {
            (b * 2 + kv) * 1024 + in_page(h, n, d)
        });
    }
    assert_eq!(at(&fa, Field::K, 0, 1, 0, 0, 0), 1024);
    assert_eq!(at(&fi, Field::V, 0, 0, 0, 0, 0), 1024);
    assert_eq!(at(&fa, Field::V, 0, 0, 0, 0, 0), 2048);
    assert_eq!(at(&fi, Field::K, 0, 1, 0, 0, 0), 2048);
    let both = (vec![2, 2, 16, 4, 8], vec![1024, 512, 32, 8, 1], 0);
    assert_eq!(view(&fa, Convention::FlashAttn, KV, 0), both);
    assert_eq!(view(&fi, Convention::Flashinfer, KV, 0), both);
    assert!(matches!(
        fa.same_addressing(&fi),
        Err(LayoutError::Mismatch(_))
    ));
    assert!(matches!(
        fi.same_addressing(&fa),
        Err(LayoutError::Mismatch(_))
    ));
    // The same tensor is right for one layout and wrong for the other under a stated
    // convention: only the descriptor disambiguates, never the shape.
    let claim = TensorClaim {
        convention: Convention::FlashAttn,
        target: KV,
        layer: 0,
        shape: &[2, 2, 16, 4, 8],
        strides: &[1024, 512, 32, 8, 1],
        dtype: DType::F16,
        storage_offset: Some(0),
    };
    fa.check_tensor(&claim).unwrap();
    match fi.check_tensor(&claim) {
        Err(LayoutError::TensorMismatch(m)) => {
            assert!(m.contains("stride[0] = 1024, expected 512"), "{m}")
        }
        other => panic!("flashinfer layout accepted a flash-attn tensor: {other:?}"),
    }
    let claim_fi = TensorClaim {
        convention: Convention::Flashinfer,
        ..claim
    };
    fi.check_tensor(&claim_fi).unwrap();
    assert!(matches!(
        fa.check_tensor(&claim_fi),
        Err(LayoutError::TensorMismatch(_))
    ));

    // H = 2: a token-major [B, N, 2, 256] bf16 page with D = 128 reads as (heads, K|V row);
    // K of head 1 is 256 elements (512 B) into the token, V of head 0 128 elements in.
    let h2 = layout("kv B=3 N=16 H=2 D=128 dtype=bf16 order=NHD");
    let g2 = Dense {
        nb: 3,
        nh: 2,
        nn: 16,
        row: 512,
    };
    for (f, off) in [(Field::K, 0), (Field::V, 256)] {
        sweep(&h2, f, [1, 3, 2, 16, 128], |a, b, h, n, d| {
            g2.nhd(a, b, h, n) + off + 2 * d
        });
    }
    assert_eq!(at(&h2, Field::K, 0, 0, 1, 0, 0), 512);
    assert_eq!(at(&h2, Field::V, 0, 0, 0, 0, 0), 256);
    assert_eq!(at(&h2, Field::K, 0, 0, 0, 1, 0), 1024);
    assert_eq!(
        view(&h2, Convention::Standard, K, 0),
        (vec![3, 2, 16, 128], vec![8192, 256, 512, 1], 0)
    );

    // N = 2, H = 2, B = 2 all at once, and H = N = 4: NHD and HND differ in every stride.
    for (nb, nh, nn) in [(2u64, 2u64, 2u64), (3, 4, 4)] {
        let s = |o: &str| format!("kv B={nb} N={nn} H={nh} D=8 dtype=f32 order={o}");
        let (a, b) = (layout(&s("NHD")), layout(&s("HND")));
        let g = Dense {
            nb,
            nh,
            nn,
            row: 64,
        };
        for (f, off) in [(Field::K, 0), (Field::V, 32)] {
            sweep(&a, f, [1, nb, nh, nn, 8], |l_, b_, h, n, d| {
                g.nhd(l_, b_, h, n) + off + 4 * d
            });
            sweep(&b, f, [1, nb, nh, nn, 8], |l_, b_, h, n, d| {
                g.hnd(l_, b_, h, n) + off + 4 * d
            });
        }
        assert_eq!(at(&a, Field::K, 0, 0, 1, 0, 0), 64);
        assert_eq!(at(&a, Field::K, 0, 0, 0, 1, 0), nh * 64);
        assert_eq!(at(&b, Field::K, 0, 0, 1, 0, 0), nn * 64);
        assert_eq!(at(&b, Field::K, 0, 0, 0, 1, 0), 64);
        let page = nn * nh * 16;
        assert_eq!(
            view(&a, Convention::Standard, K, 0),
            (vec![nb, nh, nn, 8], vec![page, 16, nh * 16, 1], 0)
        );
        assert_eq!(
            view(&b, Convention::Standard, K, 0),
            (vec![nb, nh, nn, 8], vec![page, nn * 16, 16, 1], 0)
        );
        assert!(matches!(
            a.same_addressing(&b),
            Err(LayoutError::Mismatch(_))
        ));
    }

    // H = 1: token-major and head-major pages are the same memory.
    let one_n = layout("kv B=3 N=16 H=1 D=8 dtype=f16 order=NHD");
    let one_h = layout("kv B=3 N=16 H=1 D=8 dtype=f16 order=HND");
    for l in [&one_n, &one_h] {
        for (f, off) in [(Field::K, 0), (Field::V, 16)] {
            sweep(l, f, [1, 3, 1, 16, 8], |_, b, _, n, d| {
                b * 512 + n * 32 + off + 2 * d
            });
        }
    }
    one_n.same_addressing(&one_h).unwrap();
    one_h.same_addressing(&one_n).unwrap();
}

// ---------------------------------------------------------------------------------------------
// Case 3: H = 1 with a non-canonical stride; MLA with H = 1.
// ---------------------------------------------------------------------------------------------

#[test]
fn case03_single_head_with_any_stride_and_mla() {
    // f16, row 16 el; H = 1: token stride 16, block stride 16*16 = 256 el.
    for order in ["NHD", "HND"] {
        let l = layout(&format!("kv B=3 N=16 H=1 D=8 dtype=f16 order={order}"));
        let fa = TensorClaim {
            convention: Convention::FlashAttn,
            target: K,
            layer: 0,
            shape: &[3, 16, 1, 8],
            strides: &[256, 16, 12345, 1],
            dtype: DType::F16,
            storage_offset: Some(0),
        };
        l.check_tensor(&fa).unwrap();
        let std = TensorClaim {
            convention: Convention::Standard,
            target: V,
            shape: &[3, 1, 16, 8],
            strides: &[256, 12345, 16, 1],
            storage_offset: Some(8),
            ..fa
        };
        l.check_tensor(&std).unwrap();
        for (strides, idx, got, want) in [
            (&[256u64, 8, 12345, 1][..], 1, 8, 16),
            (&[255, 16, 12345, 1][..], 0, 255, 256),
            (&[256, 16, 12345, 2][..], 3, 2, 1),
        ] {
            match l.check_tensor(&TensorClaim { strides, ..fa }) {
                Err(LayoutError::TensorMismatch(m)) => assert!(
                    m.contains(&format!("stride[{idx}] = {got}, expected {want}")),
                    "{order}: {m}"
                ),
                other => panic!("{order}: wrong stride[{idx}] accepted: {other:?}"),
            }
        }
    }
    // H = 1 per rank at TP 8: a head slice of Llama-3-70B (H=8, D=128 bf16, token-major).
    // Row 256 el; token stride 8*256 = 2048 el; block 16*2048 = 32768 el; layer 4*32768.
    let full = layout("llama-3-70b B=4");
    let rank3 = full.tp_slice(8, 3).unwrap();
    assert_eq!(rank3.geometry().num_kv_heads, 1);
    let layer = 5u64;
    let claim = TensorClaim {
        convention: Convention::FlashAttn,
        target: V,
        layer,
        shape: &[4, 16, 1, 128],
        strides: &[32768, 2048, 12345, 1],
        dtype: DType::Bf16,
        storage_offset: Some(layer * 131072 + 3 * 256 + 128),
    };
    rank3.check_tensor(&claim).unwrap();
    sweep(&rank3, Field::V, [80, 4, 1, 16, 128], |l_, b, _, n, d| {
        2 * (l_ * 131072 + b * 32768 + n * 2048 + 3 * 256 + 128 + d)
    });
    let wrong_token = TensorClaim {
        strides: &[32768, 256, 12345, 1], // a dense single-head token stride: wrong here
        ..claim
    };
    assert!(matches!(
        rank3.check_tensor(&wrong_token),
        Err(LayoutError::TensorMismatch(m)) if m.contains("stride[1] = 256, expected 2048")
    ));

    // MLA: one head, 576-wide latent (512 + 64), bf16, token-major, 61 layers x 1024 blocks x 64.
    let mla = layout("deepseek-v3");
    assert_eq!(mla.geometry().num_kv_heads, 1);
    let (kv_shape, ks, koff) = view(&mla, Convention::Standard, K, 1);
    let (v_shape, vs, voff) = view(&mla, Convention::Standard, V, 1);
    assert_eq!(kv_shape, vec![1024, 1, 64, 576]);
    assert_eq!(v_shape, vec![1024, 1, 64, 512]);
    assert_eq!((ks[0], ks[2], ks[3]), (64 * 576, 576, 1));
    assert_eq!(ks, vs, "V is a prefix of the latent: same strides as K");
    assert_eq!((koff, voff), (1024 * 64 * 576, 1024 * 64 * 576));
    let mla_claim = TensorClaim {
        convention: Convention::Standard,
        target: V,
        layer: 1,
        shape: &[1024, 1, 64, 512],
        strides: &[36864, 12345, 576, 1],
        dtype: DType::Bf16,
        storage_offset: Some(1024 * 64 * 576),
    };
    mla.check_tensor(&mla_claim).unwrap();
    let (ka, va) = (
        mla.kernel_args(Field::K).unwrap(),
        mla.kernel_args(Field::V).unwrap(),
    );
    assert_eq!((ka.width, va.width, va.dim_split), (576, 512, 512));
    assert_eq!(
        (
            ka.layer_stride_bytes,
            ka.block_stride_bytes,
            ka.slot_stride_bytes
        ),
        (1024 * 64 * 1152, 64 * 1152, 1152)
    );
    assert_eq!(
        (
            va.layer_stride_bytes,
            va.block_stride_bytes,
            va.slot_stride_bytes
        ),
        (
            ka.layer_stride_bytes,
            ka.block_stride_bytes,
            ka.slot_stride_bytes
        )
    );
    assert_eq!(
        at(&mla, Field::V, 1, 2, 0, 3, 10),
        (1024 + 2) * 64 * 1152 + 3 * 1152 + 20
    );
    assert_eq!(
        at(&mla, Field::K, 60, 1023, 0, 63, 575),
        (60 * 1024 + 1023) * 64 * 1152 + 63 * 1152 + 1150
    );
    assert!(matches!(
        mla.offset(&Coord::new(Field::V, 0, 0, 0, 0, 512)),
        Err(LayoutError::OutOfRange { axis: "dim", .. })
    ));
    assert!(matches!(
        "mla B=4 N=64 H=2 rank=512 rope=64 dtype=bf16 order=NHD".parse::<KvCacheLayout>(),
        Err(LayoutError::Invalid(_))
    ));
}

// ---------------------------------------------------------------------------------------------
// Case 4: padded pages; the registered span is the whole padded extent.
// ---------------------------------------------------------------------------------------------

#[test]
fn case04_padded_pages() {
    // H=8, N=16, D=8 f16: row 32 B, dense page 16*8*32 = 4096 B, padded to 4160.
    for base in [0u64, 1024] {
        let l = layout(&format!(
            "kv L=2 B=3 N=16 H=8 D=8 dtype=f16 order=NHD page=4160 base={base}"
        ));
        assert_eq!(l.dense_page_bytes(), 4096);
        for (f, off) in [(Field::K, 0), (Field::V, 16)] {
            sweep(&l, f, [2, 3, 8, 16, 8], |a, b, h, n, d| {
                base + a * 3 * 4160 + b * 4160 + n * 256 + h * 32 + off + 2 * d
            });
            let args = l.kernel_args(f).unwrap();
            assert_eq!(
                (args.block_stride_bytes, args.layer_stride_bytes),
                (4160, 12480)
            );
        }
        assert_eq!(l.registered_spans(), span(base, 2 * 3 * 4160));
        assert_eq!(
            view(&l, Convention::Standard, K, 1),
            (
                vec![3, 8, 16, 8],
                vec![2080, 16, 128, 1],
                (base + 12480) / 2
            )
        );
        // A block's data is the dense 4096 B of each layer; the 64 B pad is not data.
        assert_eq!(
            l.block_regions(1, 0..2, 0..8).unwrap(),
            vec![range(base + 4160, 4096), range(base + 12480 + 4160, 4096)]
        );
        for r in [2, 4] {
            assert!(split_refused(&l, r), "padded pages split by {r}");
        }
    }
    // Head-major padded page: only the page stride changes.
    let h = layout("kv L=1 B=3 N=16 H=8 D=8 dtype=f16 order=HND page=4160");
    sweep(&h, Field::V, [1, 3, 8, 16, 8], |_, b, h_, n, d| {
        b * 4160 + h_ * 512 + n * 32 + 16 + 2 * d
    });
    assert!(split_refused(&h, 2));
    // Alignment rounds the padded page up: 4160 -> 4352 at 256.
    let a = layout("kv L=2 B=3 N=16 H=8 D=8 dtype=f16 order=NHD page=4160 align=256");
    sweep(&a, Field::K, [2, 3, 8, 16, 8], |l_, b, h_, n, d| {
        l_ * 3 * 4352 + b * 4352 + n * 256 + h_ * 32 + 2 * d
    });
    assert_eq!(a.registered_spans(), span(0, 2 * 3 * 4352));
    assert!(split_refused(&a, 2));
    // A page smaller than the data, or padding where pages are not contiguous, is refused.
    assert!(matches!(
        "kv L=2 B=3 N=16 H=8 D=8 dtype=f16 order=NHD page=4000".parse::<KvCacheLayout>(),
        Err(LayoutError::StrideTooSmall {
            value: 4000,
            needed: 4096,
            ..
        })
    ));
    assert!(matches!(
        "kv L=2 B=3 N=16 H=8 D=8 dtype=f16 order=LHBNC page=4160".parse::<KvCacheLayout>(),
        Err(LayoutError::Invalid(_))
    ));
}

// ---------------------------------------------------------------------------------------------
// Case 5: block-outermost layouts.
// ---------------------------------------------------------------------------------------------

#[test]
fn case05_block_outermost_layouts() {
    // L=3, B=5, N=16, H=4, D=8 f16: row 32 B, page 16*4*32 = 2048 B; block stride 3*2048.
    let page = 2048u64;
    for order in ["BLNHC", "BLHNC"] {
        let l = layout(&format!("kv L=3 B=5 N=16 H=4 D=8 dtype=f16 order={order}"));
        let in_page = |h: u64, n: u64| {
            if order == "BLNHC" {
                n * 128 + h * 32
            } else {
                h * 512 + n * 32
            }
        };
        for (f, off) in [(Field::K, 0), (Field::V, 16)] {
            sweep(&l, f, [3, 5, 4, 16, 8], |a, b, h, n, d| {
                b * 3 * page + a * page + in_page(h, n) + off + 2 * d
            });
            let args = l.kernel_args(f).unwrap();
            assert_eq!(
                (args.block_stride_bytes, args.layer_stride_bytes),
                (3 * 2048, 2048),
                "{order}"
            );
        }
        assert_eq!(l.registered_spans(), span(0, 5 * 3 * page), "{order}");
        // One RDMA read per block: all layers of block 4 are one range.
        assert_eq!(
            l.block_regions(4, 0..3, 0..4).unwrap(),
            vec![range(4 * 3 * page, 3 * page)],
            "{order}"
        );
        // One layer is B separate pages.
        assert_eq!(
            l.layer_regions(1..2).unwrap(),
            (0..5)
                .map(|b| range(b * 3 * page + page, page))
                .collect::<Vec<_>>(),
            "{order}"
        );
        let (shape, strides, offset) = view(&l, Convention::Standard, V, 2);
        assert_eq!(shape, vec![5, 4, 16, 8]);
        assert_eq!(
            strides[0],
            3 * 1024,
            "{order}: per-layer block stride = L * page"
        );
        assert_eq!(offset, 2 * 1024 + 8);
    }
}

// ---------------------------------------------------------------------------------------------
// Case 6: kernel-block split ratios 2 and 4; refused combinations fail at configuration time.
// ---------------------------------------------------------------------------------------------

#[test]
fn case06_kernel_block_split() {
    // Token-major paged, L=2 B=3 N=16 H=4 D=8 f16: row 32 B, token 128 B, page 2048 B,
    // layer 3*2048 B.
    let paged = layout("kv L=2 B=3 N=16 H=4 D=8 dtype=f16 order=NHD");
    let paged_at = |f_off: u64, l: u64, b: u64, h: u64, n: u64, d: u64| {
        l * 6144 + b * 2048 + n * 128 + h * 32 + f_off + 2 * d
    };
    // FlashAttention (2, B, N, H, D), same sizes: page of K (or V) 16*4*8*2 = 1024 B; layer
    // holds K of all blocks then V of all blocks: 2*3*1024 B.
    let fa = layout("kv L=2 B=3 N=16 H=4 D=8 dtype=f16 legacy=flash-attn-nhd");
    let fa_at = |f_off: u64, l: u64, b: u64, h: u64, n: u64, d: u64| {
        l * 6144 + f_off + b * 1024 + n * 64 + h * 16 + 2 * d
    };
    type At = dyn Fn(u64, u64, u64, u64, u64, u64) -> u64;
    let cases: [(&KvCacheLayout, &At, [u64; 2], u64); 2] = [
        (&paged, &paged_at, [0, 16], 2048),
        (&fa, &fa_at, [0, 3 * 1024], 1024),
    ];
    for (l, old, offs, page) in cases {
        for (f, off) in [Field::K, Field::V].into_iter().zip(offs) {
            sweep(l, f, [2, 3, 4, 16, 8], |a, b, h, n, d| {
                old(off, a, b, h, n, d)
            });
        }
        for r in [2u64, 4] {
            let s = l.split_blocks(r).unwrap();
            assert_eq!(s.geometry().num_blocks, 3 * r);
            assert_eq!(s.geometry().block_size, 16 / r);
            assert_eq!(s.registered_spans(), l.registered_spans());
            for (f, off) in [Field::K, Field::V].into_iter().zip(offs) {
                assert_eq!(
                    s.kernel_args(f).unwrap().block_stride_bytes,
                    (page / r) as i64
                );
                // Kernel block b*r + j, token n is allocator block b, token j*N/r + n.
                sweep(&s, f, [2, 3 * r, 4, 16 / r, 8], |a, nb, h, n, d| {
                    let (b, j) = (nb / r, nb % r);
                    old(off, a, b, h, j * 16 / r + n, d)
                });
            }
        }
    }
    // Accepted where the page is still token-outermost and dense.
    for ok in [
        "kv L=1 B=3 N=16 H=1 D=8 dtype=f16 order=HND",
        "kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=BLNHC",
        "kv L=2 B=3 N=16 H=4 D=8 dtype=f16 order=NHD page=2048 align=256",
    ] {
        let s = layout(ok)
            .split_blocks(2)
            .unwrap_or_else(|e| panic!("{ok}: {e}"));
        assert_eq!(s.geometry().num_blocks, 6, "{ok}");
    }
    for refused in [
        "kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=NHD page=2112",
        "kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=HND",
        "kv L=2 B=3 N=16 H=4 D=8 dtype=f16 order=BLNHC",
        "kv L=1 B=3 N=16 H=4 D=8 dtype=f16 legacy=flashinfer-nhd",
        "kv L=1 B=3 N=16 H=4 D=8 dtype=f16 legacy=flashinfer-hnd",
        "kv L=1 B=3 N=16 H=4 D=8 dtype=f16 legacy=flash-attn-hnd",
        "kv L=1 B=3 N=16 H=4 D=8 dtype=f16 legacy=vllm-paged-v1",
    ] {
        let l = layout(refused);
        for r in [2, 4] {
            assert!(split_refused(&l, r), "{refused} split by {r}");
        }
    }
    // A ratio that does not divide the block size.
    assert!(split_refused(&paged, 3));
}

// ---------------------------------------------------------------------------------------------
// Case 7: packed K/V with head_size != head_size_v.
// ---------------------------------------------------------------------------------------------

#[test]
fn case07_packed_kv_with_different_head_sizes() {
    // L=2 B=3 N=16 H=4, K 192 + V 128 bf16: row 320 el = 640 B; token-major.
    let l = layout("kv L=2 B=3 N=16 H=4 D=192 Dv=128 dtype=bf16 order=NHD");
    let (hs, ns, bs, ls) = (640u64, 4 * 640u64, 16 * 4 * 640u64, 3 * 16 * 4 * 640u64);
    sweep(&l, Field::K, [2, 3, 4, 16, 192], |a, b, h, n, d| {
        a * ls + b * bs + n * ns + h * hs + 2 * d
    });
    sweep(&l, Field::V, [2, 3, 4, 16, 128], |a, b, h, n, d| {
        a * ls + b * bs + n * ns + h * hs + 384 + 2 * d
    });
    let (k, v) = (
        l.kernel_args(Field::K).unwrap(),
        l.kernel_args(Field::V).unwrap(),
    );
    let outer = |a: &kvlayout::KvFieldArgs| {
        (
            a.layer_stride_bytes,
            a.block_stride_bytes,
            a.head_stride_bytes,
            a.slot_stride_bytes,
        )
    };
    assert_eq!(outer(&k), (ls as i64, bs as i64, hs as i64, ns as i64));
    assert_eq!(outer(&v), outer(&k));
    assert_eq!((k.base_offset_bytes, v.base_offset_bytes), (0, 384));
    assert_eq!((k.width, v.width), (192, 128));
    for c in [
        Convention::FlashAttn,
        Convention::Flashinfer,
        Convention::FlashinferHnd,
    ] {
        assert!(view_refused(&l, c, KV), "{c}: K and V widths differ");
    }
    assert_eq!(
        view(&l, Convention::FlashAttn, K, 0),
        (vec![3, 16, 4, 192], vec![20480, 1280, 320, 1], 0)
    );
    assert_eq!(
        view(&l, Convention::FlashAttn, V, 0),
        (vec![3, 16, 4, 128], vec![20480, 1280, 320, 1], 192)
    );
    assert_eq!(
        view(&l, Convention::Standard, V, 1),
        (vec![3, 4, 16, 128], vec![20480, 320, 1280, 1], 61440 + 192)
    );
    // Head-major: same row, heads outside tokens.
    let h = layout("kv L=1 B=3 N=16 H=4 D=192 Dv=128 dtype=bf16 order=HND");
    sweep(&h, Field::V, [1, 3, 4, 16, 128], |_, b, h_, n, d| {
        b * bs + h_ * 16 * 640 + n * 640 + 384 + 2 * d
    });
    // One-tensor legacy layouts hold a single head size.
    for legacy in ["flash-attn-nhd", "flashinfer-nhd", "vllm-paged-v1"] {
        assert!(matches!(
            format!("kv B=3 N=16 H=4 D=192 Dv=128 dtype=bf16 legacy={legacy}")
                .parse::<KvCacheLayout>(),
            Err(LayoutError::Invalid(_))
        ));
    }
}

// ---------------------------------------------------------------------------------------------
// Case 8: inline scales at their byte offsets, 4-byte aligned.
// ---------------------------------------------------------------------------------------------

#[test]
fn case08_inline_scales_at_their_offsets() {
    // int8 D=8: [K 8 B][k_scale 4 B][V 8 B][v_scale 4 B] = 24 B rows.
    let l = layout("kv-scaled B=3 N=16 H=4 D=8 dtype=int8 order=NHD");
    let (hs, ns, bs) = (24u64, 96u64, 1536u64);
    for (f, off, w, e) in [
        (Field::K, 0u64, 8u64, 1u64),
        (Field::KScale, 8, 1, 4),
        (Field::V, 12, 8, 1),
        (Field::VScale, 20, 1, 4),
    ] {
        sweep(&l, f, [1, 3, 4, 16, w], |_, b, h, n, d| {
            b * bs + n * ns + h * hs + off + e * d
        });
    }
    assert_eq!(at(&l, Field::KScale, 0, 0, 0, 0, 0), 8);
    assert_eq!(at(&l, Field::VScale, 0, 0, 0, 0, 0), 20);
    assert_eq!(
        at(&l, Field::VScale, 0, 1, 2, 3, 0),
        1536 + 3 * 96 + 2 * 24 + 20
    );
    for f in [Field::KScale, Field::VScale] {
        let a = l.kernel_args(f).unwrap();
        assert_eq!(
            (a.dtype, a.elem_bytes, a.width),
            (DType::F32.abi_code(), 4, 1)
        );
        for s in [
            a.base_offset_bytes,
            a.block_stride_bytes,
            a.head_stride_bytes,
            a.slot_stride_bytes,
        ] {
            assert_eq!(s % 4, 0, "{f}: {s}");
        }
    }
    // Scale views in f32 elements: offsets 8/4 and 20/4, strides 1536/4, 24/4, 96/4.
    assert_eq!(
        view(
            &l,
            Convention::Standard,
            ViewTarget::Field(Field::KScale),
            0
        ),
        (vec![3, 4, 16, 1], vec![384, 6, 24, 1], 2)
    );
    assert_eq!(
        view(
            &l,
            Convention::Standard,
            ViewTarget::Field(Field::VScale),
            0
        ),
        (vec![3, 4, 16, 1], vec![384, 6, 24, 1], 5)
    );
    // Head-major: the scales move with the row.
    let h = layout("kv-scaled B=3 N=16 H=4 D=8 dtype=int8 order=HND");
    sweep(&h, Field::VScale, [1, 3, 4, 16, 1], |_, b, h_, n, _| {
        b * bs + h_ * 16 * 24 + n * 24 + 20
    });
    // fp8 with D=16, Dv=8: [K 16][ks 4][V 8][vs 4] = 32 B; v_scale at 28.
    let f8 = layout("kv-scaled B=2 N=4 H=2 D=16 Dv=8 dtype=fp8_e4m3 order=NHD");
    sweep(&f8, Field::VScale, [1, 2, 2, 4, 1], |_, b, h_, n, _| {
        b * 4 * 2 * 32 + n * 64 + h_ * 32 + 28
    });
    // Misaligned: int8 D=6 (row 6+4+6+4 = 20 B, aligned) puts k_scale at byte 6. D=8 Dv=6
    // puts v_scale at byte 18 and makes the row 22 B, so both scales also move by a
    // misaligned token/head stride: either value names the fault.
    match "kv-scaled B=3 N=16 H=4 D=6 dtype=int8 order=NHD".parse::<KvCacheLayout>() {
        Err(LayoutError::MisalignedScale { offset, align, .. }) => {
            assert_eq!((offset, align), (6, 4))
        }
        other => panic!("k_scale at byte 6 accepted: {other:?}"),
    }
    match "kv-scaled B=3 N=16 H=4 D=8 Dv=6 dtype=int8 order=NHD".parse::<KvCacheLayout>() {
        Err(LayoutError::MisalignedScale { offset, align, .. }) => {
            assert!(matches!((offset, align), (18 | 22, 4)), "{offset} {align}")
        }
        other => panic!("v_scale at byte 18 accepted: {other:?}"),
    }
    // Inline scales belong to quantized rows only.
    assert!(matches!(
        "kv-scaled B=3 N=16 H=4 D=8 dtype=f16 order=NHD".parse::<KvCacheLayout>(),
        Err(LayoutError::Invalid(_))
    ));
}

// ---------------------------------------------------------------------------------------------
// Case 9: MLA 576-wide rows; opaque 656-byte rows; tokens_per_state = 4.
// ---------------------------------------------------------------------------------------------

#[test]
fn case09_mla_rows_opaque_rows_and_compressed_tokens() {
    // 512 + 64 bf16 = 1152 B per token; block 64*1152 B; layer 4 blocks.
    let mla = layout("mla L=2 B=4 N=64 rank=512 rope=64 dtype=bf16 order=NHD");
    let (ns, bs, ls) = (1152u64, 64 * 1152u64, 4 * 64 * 1152u64);
    for (f, w) in [(Field::Latent, 576), (Field::K, 576), (Field::V, 512)] {
        sweep(&mla, f, [2, 4, 1, 64, w], |a, b, _, n, d| {
            a * ls + b * bs + n * ns + 2 * d
        });
    }
    assert_eq!(mla.dense_page_bytes(), 64 * 1152);
    assert_eq!(mla.registered_spans(), span(0, 2 * 4 * 64 * 1152));

    // fp8_ds_mla: an opaque 656-byte row.
    let opaque = layout("bytes L=2 B=4 N=64 row=656 order=NHD");
    sweep(
        &opaque,
        Field::Bytes,
        [2, 4, 1, 64, 656],
        |a, b, _, n, d| a * 4 * 64 * 656 + b * 64 * 656 + n * 656 + d,
    );
    assert_eq!(opaque.dense_page_bytes(), 64 * 656);
    assert_eq!(opaque.registered_spans(), span(0, 2 * 4 * 64 * 656));
    let oa = opaque.kernel_args(Field::Bytes).unwrap();
    assert_eq!(
        (oa.elem_bytes, oa.width, oa.dtype),
        (1, 656, DType::U8.abi_code())
    );
    assert!(opaque.field_map(Field::K).is_err(), "opaque rows have no K");

    // Compressed token axis: 64 tokens per block, 4 per state -> 16 slots.
    let c4 = layout("mla B=4 N=64 tps=4 rank=512 rope=64 dtype=bf16 order=NHD");
    assert_eq!(c4.num_slots(), 16);
    for t in 0..64 {
        assert_eq!(c4.slot_of_token(t).unwrap(), t / 4, "token {t}");
    }
    assert_eq!(c4.slot_of_token(13).unwrap(), 3);
    assert!(matches!(
        c4.slot_of_token(64),
        Err(LayoutError::OutOfRange { axis: "token", .. })
    ));
    sweep(&c4, Field::Latent, [1, 4, 1, 16, 576], |_, b, _, n, d| {
        b * 16 * 1152 + n * 1152 + 2 * d
    });
    let ca = c4.kernel_args(Field::Latent).unwrap();
    assert_eq!(
        (
            ca.num_slots,
            ca.block_size,
            ca.tokens_per_state,
            ca.block_stride_bytes
        ),
        (16, 64, 4, 16 * 1152)
    );
    assert_eq!(c4.registered_spans(), span(0, 4 * 16 * 1152));
    assert!(matches!(
        "mla B=4 N=64 tps=3 rank=512 rope=64 dtype=bf16 order=NHD".parse::<KvCacheLayout>(),
        Err(LayoutError::Invalid(_))
    ));
}

// ---------------------------------------------------------------------------------------------
// Case 12: non-zero base offset; a view sliced from a larger buffer.
// ---------------------------------------------------------------------------------------------

#[test]
fn case12_base_offset_and_slices_of_a_larger_buffer() {
    // L=4 B=3 N=16 H=4 D=8 f16 at byte 4096: row 32, token 128, block 2048, layer 6144.
    let based = layout("kv L=4 B=3 N=16 H=4 D=8 dtype=f16 order=NHD base=4096");
    let want = |off: u64, l: u64, b: u64, h: u64, n: u64, d: u64| {
        4096 + l * 6144 + b * 2048 + n * 128 + h * 32 + off + 2 * d
    };
    for (f, off) in [(Field::K, 0), (Field::V, 16)] {
        sweep(&based, f, [4, 3, 4, 16, 8], |a, b, h, n, d| {
            want(off, a, b, h, n, d)
        });
        assert_eq!(
            based.kernel_args(f).unwrap().base_offset_bytes,
            (4096 + off) as i64
        );
    }
    assert_eq!(based.registered_spans(), span(4096, 4 * 6144));
    assert_eq!(
        view(&based, Convention::Standard, K, 0),
        (vec![3, 4, 16, 8], vec![1024, 16, 64, 1], 2048)
    );
    // A tensor that forgets the base offset is refused.
    let claim = TensorClaim {
        convention: Convention::Standard,
        target: K,
        layer: 0,
        shape: &[3, 4, 16, 8],
        strides: &[1024, 16, 64, 1],
        dtype: DType::F16,
        storage_offset: Some(2048),
    };
    based.check_tensor(&claim).unwrap();
    assert!(matches!(
        based.check_tensor(&TensorClaim {
            storage_offset: Some(0),
            ..claim
        }),
        Err(LayoutError::TensorMismatch(m)) if m.contains("storage offset 0, expected 2048")
    ));

    // Layers 1..3 of the larger cache: layer l is the parent's layer 1 + l; same span.
    let sub = based.layer_range(1..3).unwrap();
    assert_eq!(sub.geometry().num_layers, 2);
    assert_eq!(sub.registered_spans(), span(4096, 4 * 6144));
    for (f, off) in [(Field::K, 0), (Field::V, 16)] {
        sweep(&sub, f, [2, 3, 4, 16, 8], |a, b, h, n, d| {
            want(off, 1 + a, b, h, n, d)
        });
    }
    assert_eq!(at(&sub, Field::K, 0, 0, 0, 0, 0), 4096 + 6144);
    assert_eq!(
        view(&sub, Convention::Standard, V, 1),
        (
            vec![3, 4, 16, 8],
            vec![1024, 16, 64, 1],
            (4096 + 2 * 6144 + 16) / 2
        )
    );
    assert_eq!(
        sub.layer_regions(0..2).unwrap(),
        vec![range(4096 + 6144, 2 * 6144)]
    );
    // A slice of the slice still maps to the parent.
    let sub2 = sub.layer_range(1..2).unwrap();
    sweep(&sub2, Field::V, [1, 3, 4, 16, 8], |_, b, h, n, d| {
        want(16, 2, b, h, n, d)
    });
    assert_eq!(sub2.registered_spans(), span(4096, 4 * 6144));
    for bad in [2..2, 1..1, 1..3, 3..5] {
        assert!(
            matches!(
                sub.layer_range(bad.clone()),
                Err(LayoutError::TransformRefused {
                    transform: "layer_range",
                    ..
                })
            ),
            "layers {bad:?} of a 2-layer slice"
        );
    }

    // Legacy layouts take a base too: FlashAttention at byte 512.
    let fa = layout("kv B=3 N=16 H=4 D=8 dtype=f16 legacy=flash-attn-nhd base=512");
    sweep(&fa, Field::V, [1, 3, 4, 16, 8], |_, b, h, n, d| {
        512 + 3 * 1024 + b * 1024 + n * 64 + h * 16 + 2 * d
    });
    assert_eq!(fa.registered_spans(), span(512, 2 * 3 * 1024));
}

// ---------------------------------------------------------------------------------------------
// Case 13: num_blocks * block_stride > 2^31 bytes, pure arithmetic in 64 bits.
// ---------------------------------------------------------------------------------------------

#[test]
fn case13_offsets_beyond_2_pow_31_in_64_bits() {
    // Row 2*128 bf16 = 512 B; token 8*512 = 4096 B; block 16*4096 = 65536 B;
    // 40000 blocks = 2_621_440_000 B > 2^31.
    let l = layout("kv L=1 B=40000 N=16 H=8 D=128 dtype=bf16 order=NHD");
    let last = at(&l, Field::V, 0, 39999, 7, 15, 127);
    let want: u128 = 39999 * 65536 + 15 * 4096 + 7 * 512 + 256 + 127 * 2;
    assert_eq!(u128::from(last), want);
    assert!(want > 1 << 31 && want > i32::MAX as u128);
    // Block 32768 starts exactly at 2^31, where an int32 offset wraps negative.
    assert_eq!(at(&l, Field::K, 0, 32768, 0, 0, 0), 1 << 31);
    assert_eq!(
        at(&l, Field::K, 0, 32767, 7, 15, 127),
        (1 << 31) - 512 + 254
    );
    let args = l.kernel_args(Field::V).unwrap();
    assert_eq!(args.block_stride_bytes, 65536i64);
    assert_eq!(args.offset(0, 39999, 7, 15, 127).unwrap(), want as i64);
    assert_eq!(l.registered_spans(), span(0, 40000 * 65536));
    assert_eq!(
        l.block_regions(39999, 0..1, 0..8).unwrap(),
        vec![range(39999 * 65536, 65536)]
    );
    assert_eq!(
        view(&l, Convention::FlashAttn, KV, 0),
        (
            vec![2, 40000, 16, 8, 128],
            vec![128, 32768, 2048, 256, 1],
            0
        )
    );
    // Much larger, still arithmetic only: 80 layers x 10^6 blocks = 5.2e12 B.
    let big = layout("kv L=80 B=1000000 N=16 H=8 D=128 dtype=bf16 order=NHD");
    let want_big: u128 =
        79 * 1_000_000 * 65536 + 999_999 * 65536 + 15 * 4096 + 7 * 512 + 256 + 127 * 2;
    assert_eq!(
        u128::from(at(&big, Field::V, 79, 999_999, 7, 15, 127)),
        want_big
    );
    assert_eq!(
        big.kernel_args(Field::V)
            .unwrap()
            .offset(79, 999_999, 7, 15, 127)
            .unwrap(),
        want_big as i64
    );
    assert_eq!(big.registered_spans(), span(0, 80 * 1_000_000 * 65536));
    // The legacy layouts too: vLLM paged v1 with 40000 blocks, V of the last block.
    let v1 = layout("kv B=40000 N=16 H=8 D=128 dtype=bf16 legacy=vllm-paged-v1");
    let bnhd: u128 = 40000 * 16 * 8 * 128;
    let want_v1 = 2 * (bnhd + ((39999 * 8 + 7) * 128 + 127) * 16 + 15);
    assert_eq!(u128::from(at(&v1, Field::V, 0, 39999, 7, 15, 127)), want_v1);

    // Specs whose extent does not fit 63 bits are refused with a typed error, no panic.
    let m = u64::MAX;
    let p62 = 1u64 << 62;
    for spec in [
        format!("kv L=1 B={p62} N=16 H=8 D=128 dtype=bf16 order=NHD"),
        format!("kv L={p62} B=4 N=16 H=8 D=128 dtype=bf16 order=BLNHC"),
        format!("kv L=1 B={m} N=16 H=8 D=128 dtype=bf16 order=NHD"),
        format!("kv L=1 B=1 N=16 H=8 D={m} dtype=bf16 order=NHD"),
        format!("kv L=1 B=1 N={m} H={m} D=1 dtype=bf16 order=NHD"),
        format!("kv L=1 B=4 N=16 H=8 D=128 dtype=bf16 order=NHD base={m}"),
        format!("kv L=1 B=4 N=16 H=8 D=128 dtype=bf16 order=NHD page={m}"),
        format!("kv L=1 B=4 N=16 H=8 D=128 dtype=bf16 order=NHD block_stride={p62}"),
        format!("kv L=2 B=4 N=16 H=8 D=128 dtype=bf16 order=NHD layer_stride={m}"),
        format!("kv L=1 B={p62} N=16 H=8 D=128 dtype=bf16 legacy=vllm-paged-v1"),
        format!("kv L=1 B={p62} N=16 H=8 D=128 dtype=bf16 legacy=flashinfer-nhd"),
        format!("kv L=1 B=4 N=16 H=8 D=128 dtype=bf16 legacy=flash-attn-nhd base={m}"),
        format!("mla L=1 B=4 N=64 rank={p62} rope={p62} dtype=bf16 order=NHD"),
        format!("bytes L=1 B=2 N=16 row={m} order=NHD"),
    ] {
        let got = std::panic::catch_unwind(|| spec.parse::<KvCacheLayout>());
        match got {
            Ok(Err(LayoutError::Overflow { limit, .. })) => {
                assert_eq!(limit, i64::MAX as u64, "{spec}")
            }
            Ok(other) => panic!("{spec}: expected Overflow, got {other:?}"),
            Err(_) => panic!("{spec}: panicked instead of returning LayoutError::Overflow"),
        }
    }
}

/// Core bug (reported): a padded page size that is rounded up to the alignment overflows u64
/// inside `lower_paged` (`page.div_ceil(alignment) * alignment`) and panics instead of
/// returning `LayoutError::Overflow`.
#[test]
fn case13_padded_page_rounded_to_alignment_overflows_without_panic() {
    for spec in [
        format!(
            "kv L=1 B=1 N=1 H=1 D=1 dtype=f32 order=NHD page={} align=2",
            u64::MAX
        ),
        format!(
            "kv L=1 B=1 N=1 H=1 D=1 dtype=f32 order=NHD page={} align={}",
            (1u64 << 63) + 1,
            1u64 << 63
        ),
    ] {
        let got = std::panic::catch_unwind(|| spec.parse::<KvCacheLayout>());
        match got {
            Ok(Err(LayoutError::Overflow { .. })) => {}
            Ok(other) => panic!("{spec}: expected Overflow, got {other:?}"),
            Err(_) => panic!("{spec}: panicked instead of returning LayoutError::Overflow"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Case 14: legacy x-split key layout with x = 4 / 8 / 16.
// ---------------------------------------------------------------------------------------------

#[test]
fn case14_legacy_x_split_key() {
    for (dtype, x, e) in [
        ("f32", 4u64, 4u64),
        ("f16", 8, 2),
        ("bf16", 8, 2),
        ("fp8_e4m3", 16, 1),
        ("fp8_e5m2", 16, 1),
    ] {
        for nn in [16u64, 8] {
            let (nl, nb, nh, nd) = (2u64, 3u64, 4u64, 32u64);
            let spec =
                format!("kv L={nl} B={nb} N={nn} H={nh} D={nd} dtype={dtype} legacy=vllm-paged-v1");
            let l = layout(&spec);
            // One (2, B, N*H*D) allocation per layer: K then V.
            let bnhd = nb * nn * nh * nd;
            sweep(&l, Field::K, [nl, nb, nh, nn, nd], |a, b, h, n, d| {
                e * (a * 2 * bnhd + ((b * nh + h) * (nd / x) + d / x) * nn * x + n * x + d % x)
            });
            sweep(&l, Field::V, [nl, nb, nh, nn, nd], |a, b, h, n, d| {
                e * (a * 2 * bnhd + bnhd + ((b * nh + h) * nd + d) * nn + n)
            });
            assert_eq!(l.registered_spans(), span(0, nl * 2 * bnhd * e), "{spec}");
            // x comes from the element size, never from the block size.
            let ka = l.kernel_args(Field::K).unwrap();
            assert_eq!(
                (
                    ka.dim_split,
                    ka.dim_stride_bytes,
                    ka.slot_stride_bytes,
                    ka.dim_chunk_stride_bytes,
                    ka.head_stride_bytes,
                    ka.block_stride_bytes,
                    ka.layer_stride_bytes,
                ),
                (
                    x as i64,
                    e as i64,
                    (x * e) as i64,
                    (nn * x * e) as i64,
                    (nd * nn * e) as i64,
                    (nh * nd * nn * e) as i64,
                    (2 * bnhd * e) as i64,
                ),
                "{spec}"
            );
            // key_cache [B, H, D/x, N, x] and value_cache [B, H, D, N] of layer 1.
            assert_eq!(
                view(&l, Convention::VllmPagedV1, K, 1),
                (
                    vec![nb, nh, nd / x, nn, x],
                    vec![nh * nd * nn, nd * nn, nn * x, x, 1],
                    2 * bnhd
                ),
                "{spec}"
            );
            assert_eq!(
                view(&l, Convention::VllmPagedV1, V, 1),
                (
                    vec![nb, nh, nd, nn],
                    vec![nh * nd * nn, nd * nn, nn, 1],
                    3 * bnhd
                ),
                "{spec}"
            );
            // The split key has no [B, H, N, D] view; V has one.
            assert!(view_refused(&l, Convention::Standard, K), "{spec}");
            assert!(view_refused(&l, Convention::FlashAttn, K), "{spec}");
            assert!(view_refused(&l, Convention::FlashAttn, KV), "{spec}");
            assert_eq!(
                view(&l, Convention::Standard, V, 0),
                (
                    vec![nb, nh, nn, nd],
                    vec![nh * nd * nn, nd * nn, 1, nn],
                    bnhd
                ),
                "{spec}"
            );
        }
    }
    // A block size smaller than x changes nothing about x.
    let small = layout("kv B=2 N=4 H=2 D=16 dtype=f16 legacy=vllm-paged-v1");
    assert_eq!(small.kernel_args(Field::K).unwrap().dim_split, 8);
    sweep(&small, Field::K, [1, 2, 2, 4, 16], |_, b, h, n, d| {
        2 * (((b * 2 + h) * 2 + d / 8) * 4 * 8 + n * 8 + d % 8)
    });
    // head_size not divisible by x.
    for (spec, hd, x, e) in [
        (
            "kv B=3 N=16 H=4 D=120 dtype=fp8_e4m3 legacy=vllm-paged-v1",
            120,
            16,
            1,
        ),
        (
            "kv B=3 N=16 H=4 D=4 dtype=f16 legacy=vllm-paged-v1",
            4,
            8,
            2,
        ),
        (
            "kv B=3 N=16 H=4 D=6 dtype=f32 legacy=vllm-paged-v1",
            6,
            4,
            4,
        ),
    ] {
        match spec.parse::<KvCacheLayout>() {
            Err(LayoutError::XNotDividing {
                head_size,
                x: got_x,
                elem_bytes,
            }) => assert_eq!((head_size, got_x, elem_bytes), (hd, x, e), "{spec}"),
            other => panic!("{spec}: expected XNotDividing, got {other:?}"),
        }
    }
}

/// MLA's V of a latent split into chunks is the latent's first `kv_lora_rank` elements, each
/// where the latent's element of the same index lies (`d / 8` chunks of 32 bytes, `d % 8`
/// elements of 2 bytes, token 16 bytes further), inside the registered span; a split that
/// would cut V mid-chunk is refused.
#[test]
fn case03b_mla_v_of_a_split_latent() {
    let l =
        layout("mla B=1 N=2 rank=16 rope=16 dtype=f16 @latent=0:0:0:0:0:16:8:32:2 @buf0=0..128");
    sweep(&l, Field::V, [1, 1, 1, 2, 16], |_, _, _, n, d| {
        16 * n + 32 * (d / 8) + 2 * (d % 8)
    });
    sweep(&l, Field::K, [1, 1, 1, 2, 32], |_, _, _, n, d| {
        16 * n + 32 * (d / 8) + 2 * (d % 8)
    });
    assert_eq!(
        at(&l, Field::V, 0, 0, 0, 0, 8),
        32,
        "V[8] is the latent's element 8"
    );
    // Chunks of 2 elements 2 bytes apart, elements 32 bytes apart: V[15] at 14 + 32.
    let l = layout("mla B=1 N=1 rank=16 rope=16 dtype=f16 @latent=0:0:0:0:0:0:2:2:32 @buf0=0..64");
    sweep(&l, Field::V, [1, 1, 1, 1, 16], |_, _, _, _, d| {
        2 * (d / 2) + 32 * (d % 2)
    });
    assert_eq!(at(&l, Field::V, 0, 0, 0, 0, 15), 46);
    let e = "mla B=1 N=1 rank=12 rope=12 dtype=f16 @latent=0:0:0:0:0:0:8:32:2 @buf0=0..128"
        .parse::<KvCacheLayout>()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("chunks of 8") && e.contains("kv_lora_rank = 12"),
        "{e}"
    );
    // One latent, one scale: K's and V's per-tensor scales must agree (write_kv divides the
    // latent by k_scale; V read back times a different v_scale would be off by their ratio).
    let e = "mla B=1 N=16 rank=16 rope=16 dtype=fp8_e4m3 k_scale=0.5 v_scale=2.0 order=NHD"
        .parse::<KvCacheLayout>()
        .unwrap_err()
        .to_string();
    assert!(e.contains("k_scale 0.5 and v_scale 2 differ"), "{e}");
}

/// Every legacy layout, both fields, element by element against the shapes of
/// `shared/anchors.md` section 2 written out by hand (L = 2, B = 3, N = 16, H = 4, D = 32: no
/// two extents alike, so a swapped axis moves some element), for x = 4, 8 and 16.
#[test]
fn case15_every_legacy_layout_field_by_field() {
    let (nl, nb, nn, nh, nd) = (2u64, 3u64, 16u64, 4u64, 32u64);
    for (dtype, e) in [("f32", 4u64), ("bf16", 2), ("fp8_e4m3", 1)] {
        let x = 16 / e;
        let page = nn * nh * nd * e; // one block of K (or V)
        let half = nb * page; // one layer of K (or V)
        let dom = [nl, nb, nh, nn, nd];
        let spec = |kind: &str| {
            format!("kv L={nl} B={nb} N={nn} H={nh} D={nd} dtype={dtype} legacy={kind}")
        };

        // vLLM: per layer one (2, B, N*H*D) tensor; K [B, H, D/x, N, x], V [B, H, D, N].
        let l = layout(&spec("vllm-paged-v1"));
        sweep(&l, Field::K, dom, |a, b, h, n, d| {
            a * 2 * half
                + b * page
                + h * nd * nn * e
                + (d / x) * nn * x * e
                + n * x * e
                + (d % x) * e
        });
        sweep(&l, Field::V, dom, |a, b, h, n, d| {
            a * 2 * half + half + b * page + h * nd * nn * e + d * nn * e + n * e
        });

        // FlashAttention (2, B, N, H, D), and its HND stride order: stored (2, B, H, N, D).
        let l = layout(&spec("flash-attn-nhd"));
        for (field, kv) in [(Field::K, 0), (Field::V, 1)] {
            sweep(&l, field, dom, |a, b, h, n, d| {
                a * 2 * half + kv * half + b * page + n * nh * nd * e + h * nd * e + d * e
            });
        }
        let l = layout(&spec("flash-attn-hnd"));
        for (field, kv) in [(Field::K, 0), (Field::V, 1)] {
            sweep(&l, field, dom, |a, b, h, n, d| {
                a * 2 * half + kv * half + b * page + h * nn * nd * e + n * nd * e + d * e
            });
        }

        // FlashInfer (B, 2, N, H, D) and (B, 2, H, N, D).
        let l = layout(&spec("flashinfer-nhd"));
        for (field, kv) in [(Field::K, 0), (Field::V, 1)] {
            sweep(&l, field, dom, |a, b, h, n, d| {
                a * 2 * half + b * 2 * page + kv * page + n * nh * nd * e + h * nd * e + d * e
            });
        }
        let l = layout(&spec("flashinfer-hnd"));
        for (field, kv) in [(Field::K, 0), (Field::V, 1)] {
            sweep(&l, field, dom, |a, b, h, n, d| {
                a * 2 * half + b * 2 * page + kv * page + h * nn * nd * e + n * nd * e + d * e
            });
        }

        // Separate K and V buffers (SGLang-style), V of its own width: [B, N, H, D] / [B, H, N, D].
        let dv = 8u64;
        let vpage = nn * nh * dv * e;
        let vdom = [nl, nb, nh, nn, dv];
        let sep = |kind: &str| layout(&format!("{} Dv={dv}", spec(kind)));
        let l = sep("separate-nhd");
        sweep_in(&l, Field::K, 0, dom, |a, b, h, n, d| {
            a * half + b * page + n * nh * nd * e + h * nd * e + d * e
        });
        sweep_in(&l, Field::V, 1, vdom, |a, b, h, n, d| {
            a * nb * vpage + b * vpage + n * nh * dv * e + h * dv * e + d * e
        });
        let l = sep("separate-hnd");
        sweep_in(&l, Field::K, 0, dom, |a, b, h, n, d| {
            a * half + b * page + h * nn * nd * e + n * nd * e + d * e
        });
        sweep_in(&l, Field::V, 1, vdom, |a, b, h, n, d| {
            a * nb * vpage + b * vpage + h * nn * dv * e + n * dv * e + d * e
        });
    }
}
