//! One regression test per descriptor case of `shared/anchors.md` section 5 (1-9, 12-14).
//! Expected values are computed here by hand from the layouts' definitions, never by the code
//! under test.

use kvlayout::{
    Convention, Coord, DType, Field, KvCacheLayout, LayoutError, TensorClaim, ViewTarget,
};

fn layout(spec: &str) -> KvCacheLayout {
    spec.parse().unwrap_or_else(|e| panic!("{spec}: {e}"))
}

fn at(
    l: &KvCacheLayout,
    field: Field,
    layer: u64,
    block: u64,
    head: u64,
    slot: u64,
    dim: u64,
) -> u64 {
    l.offset(&Coord {
        layer,
        block,
        head,
        slot,
        field,
        dim,
    })
    .unwrap()
    .offset
}

fn strides_of(l: &KvCacheLayout, c: Convention, t: ViewTarget) -> (Vec<u64>, Vec<u64>) {
    let v = l.view(c, t, 0).unwrap();
    (v.shape, v.strides)
}

const K: ViewTarget = ViewTarget::Field(Field::K);
const V: ViewTarget = ViewTarget::Field(Field::V);

/// All 24 physical orders.
fn orders() -> Vec<String> {
    let mut out = Vec::new();
    for a in ['L', 'B', 'H', 'N'] {
        for b in ['L', 'B', 'H', 'N'] {
            for c in ['L', 'B', 'H', 'N'] {
                for d in ['L', 'B', 'H', 'N'] {
                    let mut s = [a, b, c, d];
                    s.sort_unstable();
                    if s == ['B', 'H', 'L', 'N'] {
                        out.push([a, b, c, d].iter().collect::<String>());
                    }
                }
            }
        }
    }
    out
}

#[test]
fn case01_every_order_and_dtype_matches_the_dense_formula() {
    let (nl, nb, nn, nh, nd) = (2u64, 3u64, 4u64, 2u64, 8u64);
    let dtypes = [
        ("kv", "f32", 4u64),
        ("kv", "f16", 2),
        ("kv", "bf16", 2),
        ("kv", "fp8_e4m3", 1),
        ("kv", "fp8_e5m2", 1),
        ("kv-scaled", "int8", 1),
    ];
    let orders = orders();
    assert_eq!(orders.len(), 24);
    for order in &orders {
        for (kind, dtype, e) in dtypes {
            let l = layout(&format!(
                "{kind} L={nl} B={nb} N={nn} H={nh} D={nd} dtype={dtype} order={order}C"
            ));
            // Row: kv = [K 8][V 8]; kv-scaled int8 = [K 8 B][k_scale 4 B][V 8 B][v_scale 4 B].
            let (row, fields): (u64, Vec<(Field, u64, u64, u64)>) = if kind == "kv" {
                (
                    2 * nd * e,
                    vec![(Field::K, 0, nd, e), (Field::V, nd * e, nd, e)],
                )
            } else {
                (
                    24,
                    vec![
                        (Field::K, 0, 8, 1),
                        (Field::KScale, 8, 1, 4),
                        (Field::V, 12, 8, 1),
                        (Field::VScale, 20, 1, 4),
                    ],
                )
            };
            // Dense strides from the innermost axis out.
            let ext = |a: char| match a {
                'L' => nl,
                'B' => nb,
                'H' => nh,
                _ => nn,
            };
            let mut stride = std::collections::HashMap::new();
            let mut running = row;
            for a in order.chars().rev() {
                stride.insert(a, running);
                running *= ext(a);
            }
            for (field, field_off, width, fe) in fields {
                for l_ in 0..nl {
                    for b in 0..nb {
                        for h in 0..nh {
                            for n in 0..nn {
                                for d in 0..width {
                                    let want = l_ * stride[&'L']
                                        + b * stride[&'B']
                                        + h * stride[&'H']
                                        + n * stride[&'N']
                                        + field_off
                                        + d * fe;
                                    assert_eq!(
                                        at(&l, field, l_, b, h, n, d),
                                        want,
                                        "{order} {dtype} {field}"
                                    );
                                }
                            }
                        }
                    }
                }
            }
            // Writing every element of block 1 through the offsets touches exactly the bytes
            // of `block_regions(1, ..)`; sentinel-filled neighbours stay untouched.
            let span = l.registered_spans()[0];
            let mut mem = vec![0xA5u8; (span.offset + span.len) as usize];
            for m in l.stored_fields() {
                for l_ in 0..nl {
                    for h in 0..nh {
                        for n in 0..nn {
                            for d in 0..m.width {
                                let o = at(&l, m.field, l_, 1, h, n, d) as usize;
                                mem[o..o + m.elem_bytes() as usize].fill(0x11);
                            }
                        }
                    }
                }
            }
            let regions = l.block_regions(1, 0..nl, 0..nh).unwrap();
            let inside = |o: u64| {
                regions
                    .iter()
                    .any(|r| o >= r.offset && o < r.offset + r.len)
            };
            for (o, byte) in mem.iter().enumerate() {
                assert_eq!(*byte == 0x11, inside(o as u64), "{order} {dtype}: byte {o}");
            }
        }
    }
}

#[test]
fn case02_sizes_that_expose_swaps() {
    // B=3, H=4, N=16, D=8, f16: row = 32 B.
    let nhd = layout("kv B=3 N=16 H=4 D=8 dtype=f16 order=NHD");
    let hnd = layout("kv B=3 N=16 H=4 D=8 dtype=f16 order=HND");
    // standard [B, H, N, C] strides in elements: block 16*4*16 = 1024.
    assert_eq!(
        strides_of(&nhd, Convention::Standard, K),
        (vec![3, 4, 16, 8], vec![1024, 16, 64, 1])
    );
    assert_eq!(
        strides_of(&hnd, Convention::Standard, K),
        (vec![3, 4, 16, 8], vec![1024, 256, 16, 1])
    );
    // flash-attn [B, N, H, D] of the same memory.
    assert_eq!(
        strides_of(&nhd, Convention::FlashAttn, V),
        (vec![3, 16, 4, 8], vec![1024, 64, 16, 1])
    );
    assert_eq!(
        strides_of(&hnd, Convention::FlashAttn, V),
        (vec![3, 16, 4, 8], vec![1024, 16, 256, 1])
    );
    assert_eq!(
        at(&nhd, Field::V, 0, 2, 3, 5, 7),
        2 * 2048 + 5 * 128 + 3 * 32 + 16 + 14
    );
    assert_eq!(
        at(&hnd, Field::V, 0, 2, 3, 5, 7),
        2 * 2048 + 3 * 512 + 5 * 32 + 16 + 14
    );

    // B = 2: FlashAttention (2, B, N, H, D) and FlashInfer (B, 2, N, H, D) have the same shape
    // (2, 2, 16, 4, 8) and different addresses. Element K[b=1, n=0, h=0, d=0]:
    let fa = layout("kv B=2 N=16 H=4 D=8 dtype=f16 legacy=flash-attn-nhd");
    let fi = layout("kv B=2 N=16 H=4 D=8 dtype=f16 legacy=flashinfer-nhd");
    let page = 16 * 4 * 8 * 2; // one of K or V of one block, bytes
    assert_eq!(at(&fa, Field::K, 0, 1, 0, 0, 0), page);
    assert_eq!(at(&fi, Field::K, 0, 1, 0, 0, 0), 2 * page);
    assert_eq!(at(&fa, Field::V, 0, 0, 0, 0, 0), 2 * page);
    assert_eq!(at(&fi, Field::V, 0, 0, 0, 0, 0), page);
    assert!(fa.same_addressing(&fi).is_err());
    assert_eq!(
        fa.view(Convention::FlashAttn, ViewTarget::Kv, 0)
            .unwrap()
            .shape,
        vec![2, 2, 16, 4, 8]
    );
    assert_eq!(
        fi.view(Convention::Flashinfer, ViewTarget::Kv, 0)
            .unwrap()
            .shape,
        vec![2, 2, 16, 4, 8]
    );

    // H = 2 and N = 2 (and H = N): every element distinct, strides as the formula says.
    let sq = layout("kv B=2 N=2 H=2 D=8 dtype=f32 order=NHD");
    assert_eq!(at(&sq, Field::K, 0, 0, 1, 0, 0), 64); // head stride = row = 64 B
    assert_eq!(at(&sq, Field::K, 0, 0, 0, 1, 0), 128); // token stride = 2 heads x 64 B
    let sq_h = layout("kv B=2 N=2 H=2 D=8 dtype=f32 order=HND");
    assert_eq!(at(&sq_h, Field::K, 0, 0, 1, 0, 0), 128);
    assert_eq!(at(&sq_h, Field::K, 0, 0, 0, 1, 0), 64);
    // H = 1: NHD and HND address identically.
    let one_n = layout("kv B=3 N=16 H=1 D=8 dtype=f16 order=NHD");
    let one_h = layout("kv B=3 N=16 H=1 D=8 dtype=f16 order=HND");
    assert!(one_n.same_addressing(&one_h).is_ok());
}

#[test]
fn case03_single_head_with_any_stride_and_mla() {
    let l = layout("kv B=3 N=16 H=1 D=8 dtype=f16 order=NHD");
    let base = TensorClaim {
        convention: Convention::FlashAttn,
        target: K,
        layer: 0,
        shape: &[3, 16, 1, 8],
        strides: &[256, 16, 12345, 1],
        dtype: DType::F16,
        storage_offset: Some(0),
    };
    l.check_tensor(&base).unwrap();
    let wrong = TensorClaim {
        strides: &[256, 8, 12345, 1],
        ..base
    };
    match l.check_tensor(&wrong) {
        Err(LayoutError::TensorMismatch(m)) => {
            assert!(m.contains("stride[1] = 8, expected 16"), "{m}")
        }
        other => panic!("expected a mismatch, got {other:?}"),
    }
    // MLA: one head, 576-wide latent; V is its first 512 elements with the same strides.
    let mla = layout("deepseek-v3");
    assert_eq!(mla.geometry().num_kv_heads, 1);
    let (k, v) = (
        mla.view(Convention::Standard, K, 0).unwrap(),
        mla.view(Convention::Standard, V, 0).unwrap(),
    );
    assert_eq!(k.shape, vec![1024, 1, 64, 576]);
    assert_eq!(v.shape, vec![1024, 1, 64, 512]);
    assert_eq!(k.strides, v.strides);
    // token-major page with one head: head stride = row = token stride (size-1 axis).
    assert_eq!(k.strides, vec![64 * 576, 576, 576, 1]);
    assert_eq!(
        at(&mla, Field::V, 1, 2, 0, 3, 10),
        (1024 + 2) * 64 * 576 * 2 + 3 * 576 * 2 + 20
    );
}

#[test]
fn case04_padded_pages() {
    // H=8, N=16, D=8 f16: dense page 8*16*32 = 4096 B, padded to 4160.
    let l = layout("kv L=2 B=3 N=16 H=8 D=8 dtype=f16 order=NHD page=4160");
    assert_eq!(l.dense_page_bytes(), 4096);
    assert_eq!(at(&l, Field::K, 0, 1, 0, 0, 0), 4160);
    assert_eq!(at(&l, Field::K, 1, 0, 0, 0, 0), 3 * 4160);
    let span = l.registered_spans();
    assert_eq!((span[0].offset, span[0].len), (0, 2 * 3 * 4160));
    assert!(matches!(
        l.split_blocks(2),
        Err(LayoutError::TransformRefused { .. })
    ));
    // Alignment pads the same way: dense 4096 + nothing at 4096 alignment, 4160 -> 4352 at 256.
    let a = layout("kv B=3 N=16 H=8 D=8 dtype=f16 order=NHD page=4160 align=256");
    assert_eq!(at(&a, Field::K, 0, 1, 0, 0, 0), 4352);
}

#[test]
fn case05_block_outermost_layouts() {
    // L=3 layers inside each block: per-layer block stride = L * page.
    let page = 16 * 4 * 16 * 2; // N * H * (K|V of 8 f16)
    for order in ["BLNHC", "BLHNC"] {
        let l = layout(&format!("kv L=3 B=5 N=16 H=4 D=8 dtype=f16 order={order}"));
        assert_eq!(at(&l, Field::K, 0, 1, 0, 0, 0), 3 * page, "{order}");
        assert_eq!(at(&l, Field::K, 2, 0, 0, 0, 0), 2 * page, "{order}");
        assert_eq!(l.registered_spans()[0].len, 5 * 3 * page);
        // One RDMA read per block: all layers of a block are one range.
        let r = l.block_regions(4, 0..3, 0..4).unwrap();
        assert_eq!(r.len(), 1);
        assert_eq!((r[0].offset, r[0].len), (4 * 3 * page, 3 * page));
    }
}

#[test]
fn case06_kernel_block_split() {
    for spec in [
        "kv L=2 B=3 N=16 H=4 D=8 dtype=f16 order=NHD",
        "kv L=2 B=3 N=16 H=4 D=8 dtype=f16 legacy=flash-attn-nhd",
    ] {
        let l = layout(spec);
        for r in [2u64, 4] {
            let s = l.split_blocks(r).unwrap();
            assert_eq!(s.geometry().num_blocks, 3 * r);
            assert_eq!(s.geometry().block_size, 16 / r);
            for b in 0..3 {
                for j in 0..r {
                    for n in 0..16 / r {
                        for f in [Field::K, Field::V] {
                            assert_eq!(
                                at(&s, f, 1, b * r + j, 3, n, 5),
                                at(&l, f, 1, b, 3, j * 16 / r + n, 5),
                                "{spec} r={r}"
                            );
                        }
                    }
                }
            }
        }
    }
    for refused in [
        "kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=NHD page=4160",
        "kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=HND",
        "kv L=2 B=3 N=16 H=4 D=8 dtype=f16 order=BLNHC",
        "kv L=1 B=3 N=16 H=4 D=8 dtype=f16 legacy=flashinfer-nhd",
        "kv L=1 B=3 N=16 H=4 D=8 dtype=f16 legacy=vllm-paged-v1",
    ] {
        assert!(
            matches!(
                layout(refused).split_blocks(2),
                Err(LayoutError::TransformRefused { .. })
            ),
            "{refused}"
        );
    }
}

#[test]
fn case07_packed_kv_with_different_head_sizes() {
    let l = layout("kv B=3 N=16 H=4 D=192 Dv=128 dtype=bf16 order=NHD");
    let (k, v) = (
        l.field_map(Field::K).unwrap(),
        l.field_map(Field::V).unwrap(),
    );
    let row = (192 + 128) * 2;
    for (a, b) in [
        (k.strides.layer, v.strides.layer),
        (k.strides.block, v.strides.block),
        (k.strides.head, v.strides.head),
        (k.strides.slot, v.strides.slot),
    ] {
        assert_eq!(a, b);
    }
    assert_eq!(k.strides.head, row);
    assert_eq!(v.strides.base_offset - k.strides.base_offset, 192 * 2);
    assert!(matches!(
        l.view(Convention::FlashAttn, ViewTarget::Kv, 0),
        Err(LayoutError::ViewRefused { .. })
    ));
    assert_eq!(
        l.view(Convention::FlashAttn, V, 0).unwrap().strides,
        vec![16 * 4 * 320, 4 * 320, 320, 1]
    );
}

#[test]
fn case08_inline_scales_at_their_offsets() {
    let l = layout("kv-scaled B=3 N=16 H=4 D=8 dtype=int8 order=NHD");
    // [K 8 B][k_scale 4 B][V 8 B][v_scale 4 B] = 24 B rows.
    assert_eq!(at(&l, Field::KScale, 0, 0, 0, 0, 0), 8);
    assert_eq!(at(&l, Field::V, 0, 0, 0, 0, 0), 12);
    assert_eq!(at(&l, Field::VScale, 0, 0, 0, 0, 0), 20);
    assert_eq!(
        at(&l, Field::VScale, 0, 1, 2, 3, 0),
        16 * 4 * 24 + 3 * 4 * 24 + 2 * 24 + 20
    );
    for m in l.stored_fields() {
        if matches!(m.field, Field::KScale | Field::VScale) {
            assert_eq!(m.dtype, DType::F32);
            assert_eq!(m.strides.base_offset % 4, 0);
        }
    }
    assert!(matches!(
        "kv-scaled B=3 N=16 H=4 D=6 dtype=int8 order=NHD".parse::<KvCacheLayout>(),
        Err(LayoutError::MisalignedScale { .. })
    ));
}

#[test]
fn case09_mla_rows_opaque_rows_and_compressed_tokens() {
    let mla = layout("mla B=4 N=64 rank=512 rope=64 dtype=bf16 order=NHD");
    assert_eq!(mla.field_map(Field::Latent).unwrap().width, 576);
    assert_eq!(
        at(&mla, Field::Latent, 0, 1, 0, 2, 3),
        64 * 1152 + 2 * 1152 + 6
    );
    let opaque = layout("bytes B=4 N=64 row=656 order=NHD");
    assert_eq!(opaque.dense_page_bytes(), 64 * 656);
    assert_eq!(
        at(&opaque, Field::Bytes, 0, 3, 0, 5, 655),
        3 * 64 * 656 + 5 * 656 + 655
    );
    let c4 = layout("mla B=4 N=64 tps=4 rank=512 rope=64 dtype=bf16 order=NHD");
    assert_eq!(c4.num_slots(), 16);
    assert_eq!(c4.slot_of_token(13).unwrap(), 3);
    assert_eq!(at(&c4, Field::Latent, 0, 1, 0, 3, 0), 16 * 1152 + 3 * 1152);
    assert!(c4.slot_of_token(64).is_err());
}

#[test]
fn case12_base_offset_and_slices_of_a_larger_buffer() {
    let plain = layout("kv L=4 B=3 N=16 H=4 D=8 dtype=f16 order=NHD");
    let based = layout("kv L=4 B=3 N=16 H=4 D=8 dtype=f16 order=NHD base=4096");
    for (l_, b, h, n, d) in [(0, 0, 0, 0, 0), (3, 2, 3, 15, 7), (1, 1, 2, 3, 4)] {
        assert_eq!(
            at(&based, Field::V, l_, b, h, n, d),
            at(&plain, Field::V, l_, b, h, n, d) + 4096
        );
    }
    assert_eq!(based.registered_spans()[0].offset, 4096);
    let sub = based.layer_range(1..3).unwrap();
    assert_eq!(sub.registered_spans(), based.registered_spans());
    assert_eq!(
        at(&sub, Field::K, 1, 2, 3, 4, 5),
        at(&based, Field::K, 2, 2, 3, 4, 5)
    );
    assert_eq!(at(&sub, Field::K, 0, 0, 0, 0, 0), 4096 + 3 * 2048);
}

#[test]
fn case13_offsets_beyond_2_pow_31_in_64_bits() {
    // Block stride 16 * 8 * 256 * 2 = 65536 B; 40000 blocks = 2.6e9 B > 2^31.
    let l = layout("kv L=1 B=40000 N=16 H=8 D=128 dtype=bf16 order=NHD");
    let last = at(&l, Field::V, 0, 39999, 7, 15, 127);
    let want: u128 = 39999 * 65536 + 15 * 4096 + 7 * 512 + 256 + 127 * 2;
    assert_eq!(u128::from(last), want);
    assert!(last > 1 << 31);
    let args = l.kernel_args(Field::V).unwrap();
    assert_eq!(args.offset(0, 39999, 7, 15, 127), want as i64);
    assert!(matches!(
        format!(
            "kv L=1 B={} N=16 H=8 D=128 dtype=bf16 order=NHD",
            1u64 << 62
        )
        .parse::<KvCacheLayout>(),
        Err(LayoutError::Overflow { .. })
    ));
}

#[test]
fn case14_legacy_x_split_key() {
    for (dtype, x, e) in [
        ("f32", 4u64, 4u64),
        ("f16", 8, 2),
        ("bf16", 8, 2),
        ("fp8_e4m3", 16, 1),
    ] {
        let (b_, h_, n_, d_) = (3u64, 4u64, 16u64, 32u64);
        let l = layout(&format!(
            "kv B={b_} N={n_} H={h_} D={d_} dtype={dtype} legacy=vllm-paged-v1"
        ));
        for b in 0..b_ {
            for h in 0..h_ {
                for n in 0..n_ {
                    for d in 0..d_ {
                        let k = ((b * h_ + h) * (d_ / x) + d / x) * n_ * x + n * x + d % x;
                        let v = b_ * n_ * h_ * d_ + ((b * h_ + h) * d_ + d) * n_ + n;
                        assert_eq!(at(&l, Field::K, 0, b, h, n, d), k * e, "{dtype} K");
                        assert_eq!(at(&l, Field::V, 0, b, h, n, d), v * e, "{dtype} V");
                    }
                }
            }
        }
        let kv = l.view(Convention::VllmPagedV1, K, 0).unwrap();
        assert_eq!(kv.shape, vec![b_, h_, d_ / x, n_, x]);
        assert_eq!(kv.strides, vec![h_ * d_ * n_, d_ * n_, n_ * x, x, 1]);
        let vv = l.view(Convention::VllmPagedV1, V, 0).unwrap();
        assert_eq!(vv.shape, vec![b_, h_, d_, n_]);
        assert_eq!(vv.strides, vec![h_ * d_ * n_, d_ * n_, n_, 1]);
        assert!(matches!(
            l.view(Convention::Standard, K, 0),
            Err(LayoutError::ViewRefused { .. })
        ));
        assert!(l.view(Convention::Standard, V, 0).is_ok());
        // x comes from the dtype, never from the block size.
        let other = layout(&format!(
            "kv B={b_} N=8 H={h_} D={d_} dtype={dtype} legacy=vllm-paged-v1"
        ));
        assert_eq!(other.field_map(Field::K).unwrap().strides.dim_split, x);
    }
    assert!(matches!(
        "kv B=3 N=16 H=4 D=120 dtype=fp8_e4m3 legacy=vllm-paged-v1".parse::<KvCacheLayout>(),
        Err(LayoutError::XNotDividing {
            head_size: 120,
            x: 16,
            ..
        })
    ));
}
