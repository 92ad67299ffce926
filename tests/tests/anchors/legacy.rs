// ---------------------------------------------------------------------------------------------
// Case 14: legacy x-split key layout with x = 4 / 8 / 16.
// ---------------------------------------------------------------------------------------------

use kvlayout::{Convention, Field, KvCacheLayout, LayoutError};

use crate::{layout, span, sweep, sweep_in, view, view_refused, K, KV, V};

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
            x_split_key(dtype, x, e, nn);
        }
    }
    x_from_the_element_size_only();
}

/// vLLM paged v1 of `dtype` (`x`, element bytes `e`), block size `nn`: both fields, kernel
/// arguments and views.
fn x_split_key(dtype: &str, x: u64, e: u64, nn: u64) {
    let (nl, nb, nh, nd) = (2u64, 3u64, 4u64, 32u64);
    let spec = format!("kv L={nl} B={nb} N={nn} H={nh} D={nd} dtype={dtype} tensor=vllm-paged-v1");
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

fn x_from_the_element_size_only() {
    // A block size smaller than x changes nothing about x.
    let small = layout("kv B=2 N=4 H=2 D=16 dtype=f16 tensor=vllm-paged-v1");
    assert_eq!(small.kernel_args(Field::K).unwrap().dim_split, 8);
    sweep(&small, Field::K, [1, 2, 2, 4, 16], |_, b, h, n, d| {
        2 * (((b * 2 + h) * 2 + d / 8) * 4 * 8 + n * 8 + d % 8)
    });
    // head_size not divisible by x.
    for (spec, hd, x, e) in [
        (
            "kv B=3 N=16 H=4 D=120 dtype=fp8_e4m3 tensor=vllm-paged-v1",
            120,
            16,
            1,
        ),
        (
            "kv B=3 N=16 H=4 D=4 dtype=f16 tensor=vllm-paged-v1",
            4,
            8,
            2,
        ),
        (
            "kv B=3 N=16 H=4 D=6 dtype=f32 tensor=vllm-paged-v1",
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

/// Every legacy layout, both fields, element by element against the engines' own shapes
/// written out by hand (L = 2, B = 3, N = 16, H = 4, D = 32: no
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
            format!("kv L={nl} B={nb} N={nn} H={nh} D={nd} dtype={dtype} tensor={kind}")
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
