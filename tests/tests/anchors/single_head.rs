// ---------------------------------------------------------------------------------------------
// Case 3: H = 1 with a non-canonical stride; MLA with H = 1.
// ---------------------------------------------------------------------------------------------

use kvlayout::{Convention, Coord, DType, Field, KvCacheLayout, LayoutError, TensorClaim};

use crate::{at, claim, layout, sweep, view, K, V};

#[test]
fn case03_single_head_with_any_stride_and_mla() {
    single_head_any_head_stride();
    one_head_of_a_tp_slice();
    mla_one_head();
}

fn single_head_any_head_stride() {
    // f16, row 16 el; H = 1: token stride 16, block stride 16*16 = 256 el.
    for order in ["NHD", "HND"] {
        let l = layout(&format!("kv B=3 N=16 H=1 D=8 dtype=f16 order={order}"));
        let (shape, strides) = ([3, 16, 1, 8], [256, 16, 12345, 1]);
        let fa = claim(Convention::FlashAttn, K, 0, DType::F16, &shape, &strides, 0);
        l.check_tensor(&fa).unwrap();
        let std = TensorClaim {
            convention: Convention::Standard,
            target: V,
            shape: &[3, 1, 16, 8],
            strides: &[256, 12345, 16, 1],
            storage_offset: Some(kvlayout::StorageOffset::Elements(8)),
            ..fa
        };
        l.check_tensor(&std).unwrap();
        for (strides, idx, axis, got, want) in [
            (&[256u64, 8, 12345, 1][..], 1, "slot", 8, 16),
            (&[255, 16, 12345, 1][..], 0, "block", 255, 256),
            (&[256, 16, 12345, 2][..], 3, "dim", 2, 1),
        ] {
            match l.check_tensor(&TensorClaim { strides, ..fa }) {
                Err(LayoutError::TensorMismatch(m)) => assert!(
                    m.contains(&format!(
                        "axis {idx} ({axis}): stride {got}, expected {want}"
                    )),
                    "{order}: {m}"
                ),
                other => panic!("{order}: wrong stride[{idx}] accepted: {other:?}"),
            }
        }
    }
}

fn one_head_of_a_tp_slice() {
    // H = 1 per rank at TP 8: a head slice of Llama-3-70B (H=8, D=128 bf16, token-major).
    // Row 256 el; token stride 8*256 = 2048 el; block 16*2048 = 32768 el; layer 4*32768.
    let full = layout("llama-3-70b B=4");
    let rank3 = full.tp_slice(8, 3).unwrap();
    assert_eq!(rank3.geometry().num_kv_heads, 1);
    let layer = 5u64;
    let (shape, strides) = ([4, 16, 1, 128], [32768, 2048, 12345, 1]);
    let offset = layer * 131072 + 3 * 256 + 128;
    let right = claim(
        Convention::FlashAttn,
        V,
        layer,
        DType::Bf16,
        &shape,
        &strides,
        offset,
    );
    rank3.check_tensor(&right).unwrap();
    sweep(&rank3, Field::V, [80, 4, 1, 16, 128], |l_, b, _, n, d| {
        2 * (l_ * 131072 + b * 32768 + n * 2048 + 3 * 256 + 128 + d)
    });
    let wrong_token = TensorClaim {
        strides: &[32768, 256, 12345, 1], // a dense single-head token stride: wrong here
        ..right
    };
    assert!(matches!(
        rank3.check_tensor(&wrong_token),
        Err(LayoutError::TensorMismatch(m)) if m.contains("axis 1 (slot): stride 256, expected 2048")
    ));
}

fn mla_one_head() {
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
    let (shape, strides) = ([1024, 1, 64, 512], [36864, 12345, 576, 1]);
    let offset = 1024 * 64 * 576;
    let mla_claim = claim(
        Convention::Standard,
        V,
        1,
        DType::Bf16,
        &shape,
        &strides,
        offset,
    );
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
