// ---------------------------------------------------------------------------------------------
// Case 12: non-zero base offset; a view sliced from a larger buffer.
// ---------------------------------------------------------------------------------------------

use kvlayout::{Convention, DType, Field, KvCacheLayout, LayoutError, TensorClaim};

use crate::{at, claim, layout, range, span, sweep, view, K, KV, V};

/// L=4 B=3 N=16 H=4 D=8 f16 at byte 4096: row 32, token 128, block 2048, layer 6144.
const BASED: &str = "kv L=4 B=3 N=16 H=4 D=8 dtype=f16 order=NHD base=4096";

/// The byte offset of an element of [`BASED`], `off` the field's offset in the row.
fn based_at(off: u64, l: u64, b: u64, h: u64, n: u64, d: u64) -> u64 {
    4096 + l * 6144 + b * 2048 + n * 128 + h * 32 + off + 2 * d
}

#[test]
fn case12_base_offset_and_slices_of_a_larger_buffer() {
    base_offset();
    layer_slices();
    legacy_base_offset();
}

fn base_offset() {
    let based = layout(BASED);
    for (f, off) in [(Field::K, 0), (Field::V, 16)] {
        sweep(&based, f, [4, 3, 4, 16, 8], |a, b, h, n, d| {
            based_at(off, a, b, h, n, d)
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
    let (shape, strides) = ([3, 4, 16, 8], [1024, 16, 64, 1]);
    let claim = claim(
        Convention::Standard,
        K,
        0,
        DType::F16,
        &shape,
        &strides,
        2048,
    );
    based.check_tensor(&claim).unwrap();
    assert!(matches!(
        based.check_tensor(&TensorClaim {
            storage_offset: Some(kvlayout::StorageOffset::Elements(0)),
            ..claim
        }),
        Err(LayoutError::TensorMismatch(m)) if m.contains("storage offset 0 elements (0 bytes), expected 2048 elements (4096 bytes)")
    ));
}

fn layer_slices() {
    let based = layout(BASED);
    // Layers 1..3 of the larger cache: layer l is the parent's layer 1 + l; same span.
    let sub = based.layer_range(1..3).unwrap();
    assert_eq!(sub.geometry().num_layers, 2);
    assert_eq!(sub.registered_spans(), span(4096, 4 * 6144));
    for (f, off) in [(Field::K, 0), (Field::V, 16)] {
        sweep(&sub, f, [2, 3, 4, 16, 8], |a, b, h, n, d| {
            based_at(off, 1 + a, b, h, n, d)
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
        based_at(16, 2, b, h, n, d)
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
}

fn legacy_base_offset() {
    // Legacy layouts take a base too: FlashAttention at byte 512.
    let fa = layout("kv B=3 N=16 H=4 D=8 dtype=f16 tensor=flash-attn-nhd base=512");
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
    arithmetic_in_64_bits();
    extents_past_63_bits_refused();
}

fn arithmetic_in_64_bits() {
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
    let v1 = layout("kv B=40000 N=16 H=8 D=128 dtype=bf16 tensor=vllm-paged-v1");
    let bnhd: u128 = 40000 * 16 * 8 * 128;
    let want_v1 = 2 * (bnhd + ((39999 * 8 + 7) * 128 + 127) * 16 + 15);
    assert_eq!(u128::from(at(&v1, Field::V, 0, 39999, 7, 15, 127)), want_v1);
}

fn extents_past_63_bits_refused() {
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
        format!("kv L=1 B={p62} N=16 H=8 D=128 dtype=bf16 tensor=vllm-paged-v1"),
        format!("kv L=1 B={p62} N=16 H=8 D=128 dtype=bf16 tensor=flashinfer-nhd"),
        format!("kv L=1 B=4 N=16 H=8 D=128 dtype=bf16 tensor=flash-attn-nhd base={m}"),
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
