//! The fast block movers against the reference, byte for byte, over pairs of layouts.

use kvlayout::KvCacheLayout;
use kvlayout_cpu::{
    CacheMut, CpuBackend, HostCache, HostExec, OpError, PrefetchLevel, ScalarReference,
};

/// The geometry every layout of [`SPECS`] shares (the explicit strides below are its).
const GEOMETRY: &str = "kv L=2 B=3 N=4 H=4 D=8 dtype=f16";

/// The placements of the layouts moved between, each after [`GEOMETRY`].
const SPECS: &[&str] = &[
    "order=NHD",
    "order=HND",
    "order=BLNHC",
    "order=BHLNC",
    "order=NHD page=1088 base=64",
    "tensor=vllm-paged-v1",
    "tensor=flash-attn-hnd",
    "tensor=flashinfer-nhd",
    "tensor=separate-hnd",
    // Token-major rows of V then K ([V 16 B][K 16 B]): rows as long as NHD's K|V, the fields
    // in the other order, so moving rows whole between the two would swap K and V.
    "@k=0:16:1536:512:32:128:8:16:2 @v=0:0:1536:512:32:128:8:16:2 @buf0=0..3072",
    // K split into chunks of 4 and of 2 elements (the legacy key with x = 4 and x = 2), V
    // unsplit: between these two no affine plan exists, so the movers copy element by element.
    "@k=0:0:1536:512:64:8:4:32:2 @v=0:256:1536:512:64:16:8:16:2 @buf0=0..3072",
    "@k=0:0:1536:512:64:4:2:16:2 @v=0:256:1536:512:64:16:8:16:2 @buf0=0..3072",
];

/// The layout of [`GEOMETRY`] placed by `placement`.
fn spec(placement: &str) -> String {
    format!("{GEOMETRY} {placement}")
}

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

/// `op` run by `be` and by the reference, each on its own cache of `spec` filled with `seed`:
/// checks that every buffer of the two ends the same (`what` names the move), and returns the
/// reference's cache.
fn as_reference(
    be: &CpuBackend,
    what: &str,
    spec: &str,
    seed: u8,
    op: impl Fn(&dyn HostExec, &mut CacheMut<'_>) -> Result<(), OpError>,
) -> HostCache {
    let (mut fast, mut slow) = (filled(spec, seed), filled(spec, seed));
    op(be, &mut fast.as_mut()).unwrap();
    op(&ScalarReference, &mut slow.as_mut()).unwrap();
    for i in 0..fast.layout().num_buffers() {
        // `assert!`, not `assert_eq!`: the streamed caches are megabytes.
        assert!(
            fast.bytes(i) == slow.bytes(i),
            "{what} ({} {:?}): buffer {i}",
            be.kernel_build(),
            be.prefetch_level()
        );
    }
    slow
}

#[test]
fn convert_matches_reference_for_every_pair() {
    let be = CpuBackend::new(Some(2));
    for a in SPECS.iter().map(|p| spec(p)) {
        let src = filled(&a, 1);
        for b in SPECS.iter().map(|p| spec(p)) {
            let convert = |x: &dyn HostExec, c: &mut CacheMut<'_>| x.convert(&src.as_ref(), c);
            as_reference(&be, &format!("{a} -> {b}"), &b, 2, convert);
        }
    }
}

#[test]
fn block_movers_match_reference() {
    let be = CpuBackend::new(Some(2));
    for a in SPECS.iter().map(|p| spec(p)) {
        let copy = |x: &dyn HostExec, c: &mut CacheMut<'_>| x.copy_blocks(c, &[(0, 2), (1, 1)]);
        as_reference(&be, &format!("copy {a}"), &a, 3, copy);
        for b in SPECS.iter().map(|p| spec(p)) {
            // swap between pools
            let src = filled(&a, 4);
            let swap = |x: &dyn HostExec, c: &mut CacheMut<'_>| {
                x.swap_blocks(&src.as_ref(), c, &[(2, 0), (0, 1)])
            };
            as_reference(&be, &format!("swap {a} -> {b}"), &b, 5, swap);
            // gather heads 1..3 of blocks [2, 0] into a 2-head staging of layout b, and
            // scatter them back
            let staging_spec = b.replace("H=4", "H=2").replace("page=1088", "page=576");
            let cache = filled(&a, 6);
            let gather = |x: &dyn HostExec, c: &mut CacheMut<'_>| {
                x.gather_blocks(&cache.as_ref(), &[2, 0], 1..3, c)
            };
            let what = format!("gather {a} -> {staging_spec}");
            let staging = as_reference(&be, &what, &staging_spec, 7, gather);
            let scatter = |x: &dyn HostExec, c: &mut CacheMut<'_>| {
                x.scatter_blocks(&staging.as_ref(), &[2, 0], 1..3, c)
            };
            as_reference(
                &be,
                &format!("scatter {staging_spec} -> {a}"),
                &a,
                8,
                scatter,
            );
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
        let convert = |x: &dyn HostExec, c: &mut CacheMut<'_>| x.convert(&src.as_ref(), c);
        as_reference(be, &format!("convert {a} -> {b}"), b, 9, convert);
    }
    let cache = filled(nhd, 10);
    // Heads 2..8 of every block: 9 MiB.
    let staging = "kv B=192 N=16 H=6 D=128 dtype=f16 order=HND";
    assert!(
        filled(staging, 11).bytes(0).len() >= 8 << 20,
        "large enough to stream"
    );
    let blocks: Vec<u64> = (0..192).rev().collect();
    let gather =
        |x: &dyn HostExec, c: &mut CacheMut<'_>| x.gather_blocks(&cache.as_ref(), &blocks, 2..8, c);
    as_reference(be, "gather heads 2..8", staging, 11, gather);
}

/// Caches whose layouts differ only in one per-tensor scale hold different values for the same
/// bytes: every mover refuses them (fast path and reference alike), for K's and for V's scale.
#[test]
fn caches_differing_in_one_scale_are_not_moved() {
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
