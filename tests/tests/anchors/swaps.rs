// ---------------------------------------------------------------------------------------------
// Case 2: sizes that expose swaps, and the ambiguous ones.
// ---------------------------------------------------------------------------------------------

use kvlayout::{Convention, DType, Field, KvCacheLayout, LayoutError, TensorClaim, ViewTarget};

use crate::{at, claim, layout, sweep, sweep_dense_kv, view, K, KV, V};

#[test]
fn case02_sizes_that_expose_swaps() {
    b3_h4_n16();
    b2_flash_attn_or_flashinfer();
    h2_token_major_rows();
    small_extents();
    h1_token_and_head_major_alike();
}

/// B=3, H=4, N=16: NHD and HND element by element, and spot values.
fn b3_h4_n16() {
    // B=3, H=4, N=16, D=8, f16: row [K 8][V 8] = 16 elements (32 B); page = 16*4*16 = 1024 el.
    let nhd = layout("kv B=3 N=16 H=4 D=8 dtype=f16 order=NHD");
    let hnd = layout("kv B=3 N=16 H=4 D=8 dtype=f16 order=HND");
    sweep_dense_kv(&nhd, true, [3, 4, 16], 8, 2);
    sweep_dense_kv(&hnd, false, [3, 4, 16], 8, 2);
    // Spot values with every index distinct: V[b=2, h=3, n=5, d=7].
    assert_eq!(
        at(&nhd, Field::V, 0, 2, 3, 5, 7),
        2 * 2048 + 5 * 128 + 3 * 32 + 16 + 14
    );
    assert_eq!(
        at(&hnd, Field::V, 0, 2, 3, 5, 7),
        2 * 2048 + 3 * 512 + 5 * 32 + 16 + 14
    );
    b3_h4_n16_views_and_args(&nhd, &hnd);
}

/// A view of layer 0 as a test states it: `(layout, convention, target, shape, strides,
/// offset)`, in elements.
type ViewRow<'a> = (
    &'a KvCacheLayout,
    Convention,
    ViewTarget,
    &'a [u64],
    &'a [u64],
    u64,
);

/// Checks each view of `want`.
fn views(want: &[ViewRow<'_>]) {
    for &(l, c, t, shape, strides, offset) in want {
        let want = (shape.to_vec(), strides.to_vec(), offset);
        assert_eq!(view(l, c, t, 0), want, "{l}: {c} {t}");
    }
}

/// The views and kernel arguments of the B=3, H=4, N=16 layouts.
fn b3_h4_n16_views_and_args(nhd: &KvCacheLayout, hnd: &KvCacheLayout) {
    use Convention::{FlashAttn, Flashinfer, FlashinferHnd, Standard};
    // Standard [B, H, N, D]; FlashAttention [B, N, H, D] per field, (2, B, N, H, D) together;
    // FlashInfer (B, 2, N, H, D) and (B, 2, H, N, D).
    #[rustfmt::skip] // a table: one view a row
    let want: [ViewRow; 10] = [
        (nhd, Standard, K, &[3, 4, 16, 8], &[1024, 16, 64, 1], 0),
        (hnd, Standard, K, &[3, 4, 16, 8], &[1024, 256, 16, 1], 0),
        (nhd, Standard, V, &[3, 4, 16, 8], &[1024, 16, 64, 1], 8),
        (hnd, Standard, V, &[3, 4, 16, 8], &[1024, 256, 16, 1], 8),
        (nhd, FlashAttn, V, &[3, 16, 4, 8], &[1024, 64, 16, 1], 8),
        (hnd, FlashAttn, V, &[3, 16, 4, 8], &[1024, 16, 256, 1], 8),
        (nhd, FlashAttn, KV, &[2, 3, 16, 4, 8], &[8, 1024, 64, 16, 1], 0),
        (hnd, FlashAttn, KV, &[2, 3, 16, 4, 8], &[8, 1024, 16, 256, 1], 0),
        (nhd, Flashinfer, KV, &[3, 2, 16, 4, 8], &[1024, 8, 64, 16, 1], 0),
        (hnd, FlashinferHnd, KV, &[3, 2, 4, 16, 8], &[1024, 8, 256, 16, 1], 0),
    ];
    views(&want);
    // Kernel arguments: head and token strides never swapped.
    let (kn, kh) = (
        nhd.kernel_args(Field::V).unwrap(),
        hnd.kernel_args(Field::V).unwrap(),
    );
    assert_eq!((kn.head_stride_bytes, kn.slot_stride_bytes), (32, 128));
    assert_eq!((kh.head_stride_bytes, kh.slot_stride_bytes), (512, 32));
    assert_eq!((kn.num_heads, kn.num_slots, kn.num_blocks), (4, 16, 3));
}

fn b2_flash_attn_or_flashinfer() {
    // B = 2: FlashAttention (2, B, N, H, D) and FlashInfer (B, 2, N, H, D) have the same shape
    // (2, 2, 16, 4, 8) and even the same strides, yet index 0 means K/V in one and the block in
    // the other. page = N*H*D*2 B = 1024 B of one of K or V of one block.
    let fa = layout("kv B=2 N=16 H=4 D=8 dtype=f16 tensor=flash-attn-nhd");
    let fi = layout("kv B=2 N=16 H=4 D=8 dtype=f16 tensor=flashinfer-nhd");
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
    let (shape, strides) = ([2, 2, 16, 4, 8], [1024, 512, 32, 8, 1]);
    let claim = claim(
        Convention::FlashAttn,
        KV,
        0,
        DType::F16,
        &shape,
        &strides,
        0,
    );
    fa.check_tensor(&claim).unwrap();
    match fi.check_tensor(&claim) {
        Err(LayoutError::TensorMismatch(m)) => {
            assert!(m.contains("axis 0 (kv): stride 1024, expected 512"), "{m}");
            assert!(m.contains("axes 0 (kv) and 1 (block) look swapped"), "{m}")
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
}

fn h2_token_major_rows() {
    // H = 2: a token-major [B, N, 2, 256] bf16 page with D = 128 reads as (heads, K|V row);
    // K of head 1 is 256 elements (512 B) into the token, V of head 0 128 elements in.
    let h2 = layout("kv B=3 N=16 H=2 D=128 dtype=bf16 order=NHD");
    sweep_dense_kv(&h2, true, [3, 2, 16], 128, 2);
    assert_eq!(at(&h2, Field::K, 0, 0, 1, 0, 0), 512);
    assert_eq!(at(&h2, Field::V, 0, 0, 0, 0, 0), 256);
    assert_eq!(at(&h2, Field::K, 0, 0, 0, 1, 0), 1024);
    assert_eq!(
        view(&h2, Convention::Standard, K, 0),
        (vec![3, 2, 16, 128], vec![8192, 256, 512, 1], 0)
    );
}

fn small_extents() {
    // N = 2, H = 2, B = 2 all at once, and H = N = 4: NHD and HND differ in every stride.
    for (nb, nh, nn) in [(2u64, 2u64, 2u64), (3, 4, 4)] {
        let s = |o: &str| format!("kv B={nb} N={nn} H={nh} D=8 dtype=f32 order={o}");
        let (a, b) = (layout(&s("NHD")), layout(&s("HND")));
        sweep_dense_kv(&a, true, [nb, nh, nn], 8, 4);
        sweep_dense_kv(&b, false, [nb, nh, nn], 8, 4);
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
}

fn h1_token_and_head_major_alike() {
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
