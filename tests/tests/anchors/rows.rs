// ---------------------------------------------------------------------------------------------
// Case 7: packed K/V with head_size != head_size_v.
// ---------------------------------------------------------------------------------------------

use kvlayout::{Convention, DType, Field, KvCacheLayout, LayoutError, ViewTarget};

use crate::{at, layout, span, sweep, view, view_refused, K, KV, V};

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
            format!("kv B=3 N=16 H=4 D=192 Dv=128 dtype=bf16 tensor={legacy}")
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
    int8_token_major();
    scales_of_other_rows();
}

fn int8_token_major() {
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
    for (f, offset) in [(Field::KScale, 2), (Field::VScale, 5)] {
        assert_eq!(
            view(&l, Convention::Standard, ViewTarget::Field(f), 0),
            (vec![3, 4, 16, 1], vec![384, 6, 24, 1], offset)
        );
    }
}

fn scales_of_other_rows() {
    let bs = 1536u64;
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
