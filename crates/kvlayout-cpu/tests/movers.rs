//! The fast block movers against the reference, byte for byte, over pairs of layouts.

use kvlayout::KvCacheLayout;
use kvlayout_cpu::{CpuBackend, HostCache, HostExec, PrefetchLevel, ScalarReference};

const SPECS: &[&str] = &[
    "kv L=2 B=3 N=4 H=4 D=8 dtype=f16 order=NHD",
    "kv L=2 B=3 N=4 H=4 D=8 dtype=f16 order=HND",
    "kv L=2 B=3 N=4 H=4 D=8 dtype=f16 order=BLNHC",
    "kv L=2 B=3 N=4 H=4 D=8 dtype=f16 order=BHLNC",
    "kv L=2 B=3 N=4 H=4 D=8 dtype=f16 order=NHD page=1088 base=64",
    "kv L=2 B=3 N=4 H=4 D=8 dtype=f16 legacy=vllm-paged-v1",
    "kv L=2 B=3 N=4 H=4 D=8 dtype=f16 legacy=flash-attn-hnd",
    "kv L=2 B=3 N=4 H=4 D=8 dtype=f16 legacy=flashinfer-nhd",
    "kv L=2 B=3 N=4 H=4 D=8 dtype=f16 legacy=separate-hnd",
    // Token-major rows of V then K ([V 16 B][K 16 B]): rows as long as NHD's K|V, the fields
    // in the other order, so moving rows whole between the two would swap K and V.
    "kv L=2 B=3 N=4 H=4 D=8 dtype=f16 @k=0:16:1536:512:32:128:8:16:2 \
     @v=0:0:1536:512:32:128:8:16:2 @buf0=0..3072",
    // K split into chunks of 4 and of 2 elements (the legacy key with x = 4 and x = 2), V
    // unsplit: between these two no affine plan exists, so the movers copy element by element.
    "kv L=2 B=3 N=4 H=4 D=8 dtype=f16 @k=0:0:1536:512:64:8:4:32:2 \
     @v=0:256:1536:512:64:16:8:16:2 @buf0=0..3072",
    "kv L=2 B=3 N=4 H=4 D=8 dtype=f16 @k=0:0:1536:512:64:4:2:16:2 \
     @v=0:256:1536:512:64:16:8:16:2 @buf0=0..3072",
];

fn filled(spec: &str, seed: u8) -> HostCache {
    let l: KvCacheLayout = spec.parse().unwrap();
    let mut c = HostCache::new(l).unwrap();
    let n = c.layout().num_buffers();
    for i in 0..n {
        for (j, b) in c.bytes_mut(i).iter_mut().enumerate() {
            *b = (j as u8)
                .wrapping_mul(31)
                .wrapping_add(seed)
                .wrapping_add(i as u8 * 7);
        }
    }
    c
}

#[test]
fn convert_matches_reference_for_every_pair() {
    let be = CpuBackend::new(Some(2));
    for a in SPECS {
        for b in SPECS {
            let src = filled(a, 1);
            let mut fast = filled(b, 2);
            let mut slow = filled(b, 2);
            be.convert(&src.as_ref(), &mut fast.as_mut()).unwrap();
            ScalarReference
                .convert(&src.as_ref(), &mut slow.as_mut())
                .unwrap();
            for i in 0..fast.layout().num_buffers() {
                assert_eq!(fast.bytes(i), slow.bytes(i), "{a} -> {b}");
            }
        }
    }
}

#[test]
fn block_movers_match_reference() {
    let be = CpuBackend::new(Some(2));
    for a in SPECS {
        // copy_blocks
        let mut fast = filled(a, 3);
        let mut slow = filled(a, 3);
        be.copy_blocks(&mut fast.as_mut(), &[(0, 2), (1, 1)])
            .unwrap();
        ScalarReference
            .copy_blocks(&mut slow.as_mut(), &[(0, 2), (1, 1)])
            .unwrap();
        assert_eq!(fast.bytes(0), slow.bytes(0), "copy {a}");
        for b in SPECS {
            // swap between pools
            let src = filled(a, 4);
            let mut fast = filled(b, 5);
            let mut slow = filled(b, 5);
            be.swap_blocks(&src.as_ref(), &mut fast.as_mut(), &[(2, 0), (0, 1)])
                .unwrap();
            ScalarReference
                .swap_blocks(&src.as_ref(), &mut slow.as_mut(), &[(2, 0), (0, 1)])
                .unwrap();
            for i in 0..fast.layout().num_buffers() {
                assert_eq!(fast.bytes(i), slow.bytes(i), "swap {a} -> {b}");
            }
            // gather heads 1..3 of blocks [2, 0] into a 2-head staging of layout b
            let staging_spec = b.replace("H=4", "H=2").replace("page=1088", "page=576");
            let cache = filled(a, 6);
            let mut fast = filled(&staging_spec, 7);
            let mut slow = filled(&staging_spec, 7);
            be.gather_blocks(&cache.as_ref(), &[2, 0], 1..3, &mut fast.as_mut())
                .unwrap();
            ScalarReference
                .gather_blocks(&cache.as_ref(), &[2, 0], 1..3, &mut slow.as_mut())
                .unwrap();
            for i in 0..fast.layout().num_buffers() {
                assert_eq!(fast.bytes(i), slow.bytes(i), "gather {a} -> {staging_spec}");
            }
            let mut fast_c = filled(a, 8);
            let mut slow_c = filled(a, 8);
            be.scatter_blocks(&fast.as_ref(), &[2, 0], 1..3, &mut fast_c.as_mut())
                .unwrap();
            ScalarReference
                .scatter_blocks(&slow.as_ref(), &[2, 0], 1..3, &mut slow_c.as_mut())
                .unwrap();
            for i in 0..fast_c.layout().num_buffers() {
                assert_eq!(
                    fast_c.bytes(i),
                    slow_c.bytes(i),
                    "scatter {staging_spec} -> {a}"
                );
            }
        }
    }
}

/// Moves of 8 MiB or more stream their writes (with each kernel build's stores) and, arranged
/// for rows prefetched into L2, walk a permutation in destination order while prefetching the
/// source: the same bytes as the reference, both ways and for a head-range gather, on every
/// build this machine runs and both arrangements.
#[test]
fn streamed_moves_match_reference() {
    for build in CpuBackend::kernel_builds() {
        for level in [PrefetchLevel::L1, PrefetchLevel::L2] {
            let be = CpuBackend::with_kernels(Some(2), build)
                .unwrap()
                .with_prefetch_level(level);
            streamed_moves_on(&be);
        }
    }
}

fn streamed_moves_on(be: &CpuBackend) {
    let nhd = "kv B=192 N=16 H=8 D=128 dtype=f16 order=NHD";
    let hnd = "kv B=192 N=16 H=8 D=128 dtype=f16 order=HND";
    for (a, b) in [(nhd, hnd), (hnd, nhd)] {
        let src = filled(a, 8);
        assert!(src.bytes(0).len() >= 8 << 20, "large enough to stream");
        let mut fast = filled(b, 9);
        let mut slow = filled(b, 9);
        be.convert(&src.as_ref(), &mut fast.as_mut()).unwrap();
        ScalarReference
            .convert(&src.as_ref(), &mut slow.as_mut())
            .unwrap();
        assert!(
            fast.bytes(0) == slow.bytes(0),
            "convert {a} -> {b} ({} {:?})",
            be.kernel_build(),
            be.prefetch_level()
        );
    }
    let cache = filled(nhd, 10);
    // Heads 2..8 of every block: 9 MiB.
    let staging = "kv B=192 N=16 H=6 D=128 dtype=f16 order=HND";
    let blocks: Vec<u64> = (0..192).rev().collect();
    let mut fast = filled(staging, 11);
    let mut slow = filled(staging, 11);
    assert!(fast.bytes(0).len() >= 8 << 20, "large enough to stream");
    be.gather_blocks(&cache.as_ref(), &blocks, 2..8, &mut fast.as_mut())
        .unwrap();
    ScalarReference
        .gather_blocks(&cache.as_ref(), &blocks, 2..8, &mut slow.as_mut())
        .unwrap();
    assert!(
        fast.bytes(0) == slow.bytes(0),
        "gather heads 2..8 ({} {:?})",
        be.kernel_build(),
        be.prefetch_level()
    );
}

/// Caches whose layouts differ only in one per-tensor scale hold different values for the same
/// bytes: every mover refuses them (fast path and reference alike), for K's and for V's scale.
#[test]
fn caches_differing_in_one_scale_are_not_moved() {
    use kvlayout::ops::OpError;
    let be = CpuBackend::new(Some(2));
    let base = "kv L=1 B=3 N=4 H=2 D=8 dtype=fp8_e4m3 order=NHD";
    let src = filled(&format!("{base} k_scale=0.5 v_scale=2.0"), 1);
    for other in ["k_scale=0.5 v_scale=4.0", "k_scale=0.25 v_scale=2.0"] {
        let mut dst = filled(&format!("{base} {other}"), 2);
        let before = dst.bytes(0).to_vec();
        let refused = |r: Result<(), OpError>, op: &str| {
            assert!(
                matches!(r, Err(OpError::Incompatible(ref m)) if m.contains("scales")),
                "{op} {other}: {r:?}"
            );
        };
        refused(
            be.swap_blocks(&src.as_ref(), &mut dst.as_mut(), &[(0, 1)]),
            "swap",
        );
        refused(
            ScalarReference.swap_blocks(&src.as_ref(), &mut dst.as_mut(), &[(0, 1)]),
            "reference swap",
        );
        refused(be.convert(&src.as_ref(), &mut dst.as_mut()), "convert");
        refused(
            ScalarReference.convert(&src.as_ref(), &mut dst.as_mut()),
            "reference convert",
        );
        assert!(
            dst.bytes(0) == before.as_slice(),
            "{other}: refused moves wrote"
        );
    }
}
