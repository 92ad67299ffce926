//! Arguments whose counts overflow when multiplied: refused with a typed error by the checks,
//! the fast path and the reference alike, before anything is read or written.

mod common;

use common::decode_step;
use kvlayout::ops::{check_block_table, OpError};
use kvlayout::KvCacheLayout;
use kvlayout_cpu::{CpuBackend, Decode, DecodeParams, HostCache, HostExec, ScalarReference};

fn layout() -> KvCacheLayout {
    "kv L=1 B=4 N=16 H=2 D=8 dtype=f16 order=NHD"
        .parse()
        .unwrap()
}

/// A decode step of layer 0 with a scale of 1 and no window.
fn step<'a>(
    query: &'a [f32],
    block_table: &'a [i32],
    blocks_per_seq: usize,
    seq_lens: &'a [u32],
    num_q_heads: u64,
    soft_cap: Option<f32>,
) -> Decode<'a> {
    let params = DecodeParams {
        num_q_heads,
        scale: 1.0,
        sliding_window: None,
        soft_cap,
    };
    decode_step(query, block_table, blocks_per_seq, seq_lens, params)
}

/// Three sequences x 6148914691236517206 blocks wraps to 2 in 64 bits: a 2-entry table
/// passed the length check, and the decode then indexed past it.
#[test]
fn a_block_table_whose_size_wraps_is_refused() {
    let l = layout();
    let bps = 6_148_914_691_236_517_206usize;
    assert_eq!(3usize.wrapping_mul(bps), 2, "the product wraps");
    let e = check_block_table(&l, &[0, 1], bps, &[1, 1, 1]).unwrap_err();
    assert!(matches!(e, OpError::Shape { .. }), "{e}");
    let cache = HostCache::new(l.clone()).unwrap();
    let q = vec![0f32; 3 * 2 * 8];
    let d = step(&q, &[0, 1], bps, &[1, 1, 1], 2, None);
    let mut out = vec![0f32; 3 * 2 * 8];
    let be = CpuBackend::new(Some(1));
    assert!(be.paged_decode(&cache.as_ref(), &d, &mut out).is_err());
    assert!(ScalarReference
        .paged_decode(&cache.as_ref(), &d, &mut out)
        .is_err());
}

/// `num_q_heads = 2^61`: the query's and the output's element counts wrap to 0, so an empty
/// query and output looked right.
#[test]
fn query_heads_whose_counts_wrap_are_refused() {
    let l = layout();
    let cache = HostCache::new(l).unwrap();
    let d = step(&[], &[0], 1, &[1], 1 << 61, None);
    let be = CpuBackend::new(Some(1));
    for r in [
        be.paged_decode(&cache.as_ref(), &d, &mut []),
        ScalarReference.paged_decode(&cache.as_ref(), &d, &mut []),
    ] {
        let e = r.unwrap_err();
        assert!(matches!(e, OpError::Shape { .. }), "{e}");
        assert!(e.to_string().contains("overflows"), "{e}");
    }
}

/// A step of no sequences does nothing, however many query heads it names (the softmax state
/// of a group of 2^60 heads was sized before, and overflowed).
#[test]
fn a_step_of_no_sequences_does_nothing() {
    let cache = HostCache::new(layout()).unwrap();
    let d = step(&[], &[], 1, &[], 1 << 61, None);
    let be = CpuBackend::new(Some(1));
    assert_eq!(be.paged_decode(&cache.as_ref(), &d, &mut []), Ok(()));
    assert_eq!(
        ScalarReference.paged_decode(&cache.as_ref(), &d, &mut []),
        Ok(())
    );
}

/// A soft-cap must be positive: `c * tanh(x / c)` of a cap of 0 (or below, or NaN) is no cap.
#[test]
fn a_soft_cap_of_zero_is_refused() {
    let cache = HostCache::new(layout()).unwrap();
    let q = vec![0.5f32; 2 * 8];
    let be = CpuBackend::new(Some(1));
    for cap in [0.0f32, -0.0, -1.0, f32::NAN, f32::INFINITY] {
        let d = step(&q, &[0], 1, &[1], 2, Some(cap));
        let mut out = vec![0f32; 2 * 8];
        for r in [
            be.paged_decode(&cache.as_ref(), &d, &mut out),
            ScalarReference.paged_decode(&cache.as_ref(), &d, &mut out),
        ] {
            assert!(
                matches!(&r, Err(OpError::Shape { what, .. }) if what == "soft_cap"),
                "cap {cap}: {r:?}"
            );
        }
    }
}

/// A staging cache that differs from the cache in one thing only (dtype, or one per-tensor
/// scale, or content) is refused by gather and scatter, fast path and reference alike.
#[test]
fn staging_differing_in_one_property_is_refused() {
    let base = "L=1 B=4 N=16 H=2 D=8 order=NHD";
    let cache = HostCache::new(format!("kv {base} dtype=fp8_e4m3").parse().unwrap()).unwrap();
    let be = CpuBackend::new(Some(1));
    for other in [
        format!("kv {base} dtype=fp8_e5m2"),
        format!("kv {base} dtype=fp8_e4m3 v_scale=2.0"),
        format!("kv {base} dtype=fp8_e4m3 k_scale=0.5"),
        format!("kv {base} Dv=16 dtype=fp8_e4m3"),
    ] {
        let l: KvCacheLayout = other.parse().unwrap();
        let mut staging = HostCache::new(l).unwrap();
        let mut back = HostCache::new(cache.layout().clone()).unwrap();
        let refused = |r: Result<(), OpError>| matches!(r, Err(OpError::Incompatible(_)));
        for (name, exec) in [
            ("fast", &be as &dyn HostExec),
            ("reference", &ScalarReference),
        ] {
            let gather = exec.gather_blocks(&cache.as_ref(), &[1], 0..2, &mut staging.as_mut());
            assert!(refused(gather), "{name} gather: {other}");
            let scatter = exec.scatter_blocks(&staging.as_ref(), &[1], 0..2, &mut back.as_mut());
            assert!(refused(scatter), "{name} scatter: {other}");
        }
    }
}
