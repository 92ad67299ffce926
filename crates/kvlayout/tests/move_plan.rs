//! Post-conditions of the two-sided move plan (`kvlayout::ops::MovePlan`): for random pairs of
//! layouts of the same content, random head ranges and block pairs, every moved element's
//! source bytes go to its destination bytes, each byte of either side is covered once, and the
//! plan moves exactly the bytes of the moved elements.

use std::collections::{HashMap, HashSet};
use std::ops::Range;

use kvlayout::ops::{BlockMove, MovePlan, Moves, MAX_MOVE_DIMS};
use kvlayout::KvCacheLayout;
use proptest::prelude::*;

/// Groups of specs of one content each (L=2, B=3 everywhere): orders, padded pages, legacy
/// layouts with their x-split, presets with overrides, explicit strides.
const GROUPS: &[&[&str]] = &[
    &[
        "kv L=2 B=3 N=4 H=4 D=16 dtype=f16 order=NHD",
        "kv L=2 B=3 N=4 H=4 D=16 dtype=f16 order=HND",
        "kv L=2 B=3 N=4 H=4 D=16 dtype=f16 order=BLNHC",
        "kv L=2 B=3 N=4 H=4 D=16 dtype=f16 order=BHLNC",
        "kv L=2 B=3 N=4 H=4 D=16 dtype=f16 order=LHBNC",
        "kv L=2 B=3 N=4 H=4 D=16 dtype=f16 order=NHD page=2112 base=64",
        "kv L=2 B=3 N=4 H=4 D=16 dtype=f16 tensor=vllm-paged-v1",
        "kv L=2 B=3 N=4 H=4 D=16 dtype=f16 tensor=flash-attn-hnd",
        "kv L=2 B=3 N=4 H=4 D=16 dtype=f16 tensor=flashinfer-nhd",
        "kv L=2 B=3 N=4 H=4 D=16 dtype=f16 tensor=separate-hnd",
        "llama-3-8b L=2 B=3 N=4 H=4 D=16 dtype=f16",
        "llama-3-8b L=2 B=3 N=4 H=4 D=16 dtype=f16 order=HND",
        // K split into chunks of 4 elements (the legacy key with x = 4), V unsplit: not affine
        // in one split together with vllm-paged-v1 (x = 8).
        "kv L=2 B=3 N=4 H=4 D=16 dtype=f16 @k=0:0:3072:1024:128:8:4:32:2 \
         @v=0:512:3072:1024:128:32:16:32:2 @buf0=0..6144",
        // Token-major rows of V then K: they fuse like NHD's K|V, in the other order.
        "kv L=2 B=3 N=4 H=4 D=16 dtype=f16 @k=0:32:3072:1024:64:256:16:32:2 \
         @v=0:0:3072:1024:64:256:16:32:2 @buf0=0..6144",
    ],
    &[
        "kv L=2 B=3 N=4 H=2 D=32 dtype=fp8_e4m3 order=NHD",
        "kv L=2 B=3 N=4 H=2 D=32 dtype=fp8_e4m3 order=HND",
        "kv L=2 B=3 N=4 H=2 D=32 dtype=fp8_e4m3 tensor=vllm-paged-v1",
        "kv L=2 B=3 N=4 H=2 D=32 dtype=fp8_e4m3 order=HND page=2304",
    ],
    &[
        "kv-scaled L=2 B=3 N=4 H=2 D=16 dtype=int8 order=NHD",
        "kv-scaled L=2 B=3 N=4 H=2 D=16 dtype=int8 order=HND",
        "kv-scaled L=2 B=3 N=4 H=2 D=16 dtype=int8 order=BHLNC",
    ],
    &[
        "mla L=2 B=3 N=4 rank=16 rope=8 dtype=bf16 order=NHD",
        "mla L=2 B=3 N=4 rank=16 rope=8 dtype=bf16 order=LBNHC",
        "deepseek-v3 L=2 B=3 N=4 rank=16 rope=8 order=BLNHC",
    ],
];

fn layout(spec: &str) -> KvCacheLayout {
    spec.parse().unwrap_or_else(|e| panic!("{spec}: {e}"))
}

/// `(buffer, offset)` of a byte.
type Byte = (u32, u64);

/// Every byte the plan moves, source to destination, for `pairs`; panics on a byte moved
/// twice on either side.
fn moved_bytes(plan: &MovePlan, pairs: &[(u64, u64)]) -> HashMap<Byte, Byte> {
    let mut map = HashMap::new();
    let mut dsts = HashSet::new();
    for p in &plan.pieces {
        assert!(p.dims.len() <= MAX_MOVE_DIMS, "{p:?}");
        assert!(p.dims.iter().all(|d| d.extent > 1), "{p:?}");
        for &pair in pairs {
            let mut idx = vec![0u64; p.dims.len()];
            for _ in 0..p.units() {
                let (s, d) = p.offsets(pair, &idx);
                for k in 0..p.unit {
                    let (s, d) = ((p.src_buffer, s + k), (p.dst_buffer, d + k));
                    assert!(map.insert(s, d).is_none(), "source byte {s:?} moved twice");
                    assert!(dsts.insert(d), "destination byte {d:?} written twice");
                }
                for (i, dim) in idx.iter_mut().zip(&p.dims) {
                    *i += 1;
                    if *i < dim.extent {
                        break;
                    }
                    *i = 0;
                }
            }
        }
    }
    map
}

/// Checks the plan of `m` from `src` to `dst` against both layouts' address maps.
fn check_plan(src: &KvCacheLayout, dst: &KvCacheLayout, m: &Moves) -> Result<(), TestCaseError> {
    let Some(plan) = m.plan(src, dst) else {
        // Only two different splits of a field's index into chunks defeat the plan.
        let split = |l: &KvCacheLayout, f| {
            let m = l.field_map(f).unwrap();
            m.is_dim_split().then_some(m.axes()[5].0)
        };
        let differ = src.stored_fields().iter().any(
            |f| matches!((split(src, f.field), split(dst, f.field)), (Some(a), Some(b)) if a != b),
        );
        prop_assert!(differ, "no plan for {src} -> {dst}");
        return Ok(());
    };
    let map = moved_bytes(&plan, &m.pairs);
    let mut bytes = 0;
    for a in src.stored_fields() {
        let b = dst.field_map(a.field).unwrap();
        let e = a.elem_bytes();
        for &(sb, db) in &m.pairs {
            for l in 0..a.num_layers {
                for h in m.heads.clone() {
                    let dh = h - m.heads.start + m.dst_head0;
                    for n in 0..a.num_slots {
                        for d in 0..a.width {
                            let s = a.offset_unchecked(l, sb, h, n, d);
                            let t = b.offset_unchecked(l, db, dh, n, d);
                            for k in 0..e {
                                prop_assert_eq!(
                                    map.get(&(a.strides.buffer, s + k)),
                                    Some(&(b.strides.buffer, t + k)),
                                    "{:?} l{} ({}->{}) h{}->{} n{} d{} byte {}",
                                    a.field,
                                    l,
                                    sb,
                                    db,
                                    h,
                                    dh,
                                    n,
                                    d,
                                    k
                                );
                            }
                            bytes += e;
                        }
                    }
                }
            }
        }
    }
    prop_assert_eq!(map.len() as u64, bytes);
    prop_assert_eq!(plan.bytes_per_pair() * m.pairs.len() as u64, bytes);
    Ok(())
}

/// Two specs of one group and the moves between them.
#[derive(Debug, Clone)]
struct Case {
    src: &'static str,
    dst: &'static str,
    moves: Moves,
}

/// A group, two of its specs, a head range, a destination head start and block pairs
/// (distinct sources, distinct destinations).
fn case() -> impl Strategy<Value = Case> {
    (0..GROUPS.len())
        .prop_flat_map(|g| {
            let n = GROUPS[g].len();
            (Just(g), 0..n, 0..n, 0u64..4, 1u64..5, 0u64..4)
        })
        .prop_flat_map(|(g, i, j, h0, len, d0)| {
            let heads = layout(GROUPS[g][i]).geometry().num_kv_heads;
            let h0 = h0 % heads;
            let len = 1 + (len - 1) % (heads - h0);
            let d0 = d0 % (heads - len + 1);
            let srcs = Just(vec![0u64, 1, 2]).prop_shuffle();
            let dsts = Just(vec![0u64, 1, 2]).prop_shuffle();
            let specs = Just((GROUPS[g][i], GROUPS[g][j], h0..h0 + len, d0));
            (specs, srcs, dsts, 1usize..=3)
        })
        .prop_map(|((src, dst, heads, dst_head0), srcs, dsts, n)| Case {
            src,
            dst,
            moves: Moves {
                pairs: srcs.into_iter().zip(dsts).take(n).collect(),
                heads,
                dst_head0,
            },
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn plan_covers_every_moved_element_once(c in case()) {
        check_plan(&layout(c.src), &layout(c.dst), &c.moves)?;
    }
}

/// Every pair of every group, converted whole.
#[test]
fn convert_plans_cover_every_pair() {
    for g in GROUPS {
        for a in *g {
            for b in *g {
                let (src, dst) = (layout(a), layout(b));
                let m = BlockMove::Convert.plan(Some(&src), &dst).unwrap();
                check_plan(&src, &dst, &m).unwrap();
            }
        }
    }
}

/// A head-range gather into a staging cache of the range's heads, in another layout.
#[test]
fn gather_plan_shifts_heads() {
    let cache = layout("kv L=2 B=3 N=4 H=4 D=16 dtype=f16 order=NHD");
    let staging = layout("kv L=2 B=2 N=4 H=2 D=16 dtype=f16 tensor=vllm-paged-v1");
    let m = BlockMove::Gather {
        blocks: &[2, 0],
        heads: 1..3,
    }
    .plan(Some(&cache), &staging)
    .unwrap();
    check_plan(&cache, &staging, &m).unwrap();
}

/// Same layout on both sides: one piece, the whole block per layer when heads are all moved.
#[test]
fn identical_layouts_move_whole_pages() {
    let l = layout("kv L=2 B=3 N=4 H=4 D=16 dtype=f16 order=NHD");
    let plan = MovePlan::new(&l, &l, &(0..4), 0).unwrap();
    assert_eq!(plan.pieces.len(), 1);
    let p = &plan.pieces[0];
    assert_eq!(p.unit, 4 * 4 * 2 * 32, "a page: slots x heads x (K|V)");
    assert_eq!(p.dims.len(), 1, "layers");
}

/// Two different splits of the key into chunks have no common affine plan.
#[test]
fn different_splits_have_no_plan() {
    let g = GROUPS[0];
    let (vllm, x4) = (layout(g[6]), layout(g[12]));
    assert!(MovePlan::new(&vllm, &x4, &(0..4), 0).is_none());
    assert!(MovePlan::new(&x4, &vllm, &(0..4), 0).is_none());
    assert!(MovePlan::new(&x4, &layout(g[1]), &(0..4), 0).is_some());
}

/// Heads outside either layout give no plan, never a panic (the plan is public; validated
/// moves never name such heads).
#[test]
fn heads_outside_the_layouts_give_no_plan() {
    let a: KvCacheLayout = "kv B=2 N=16 H=4 D=8 dtype=f16 order=NHD".parse().unwrap();
    let b: KvCacheLayout = "kv B=2 N=16 H=2 D=8 dtype=f16 order=HND".parse().unwrap();
    assert!(MovePlan::new(&a, &b, &(0..2), 0).is_some());
    assert!(
        MovePlan::new(&a, &b, &(0..4), 0).is_none(),
        "4 heads into 2"
    );
    assert!(
        MovePlan::new(&a, &b, &(2..6), 0).is_none(),
        "past the source"
    );
    assert!(
        MovePlan::new(&a, &b, &Range { start: 3, end: 1 }, 0).is_none(),
        "a reversed range"
    );
    assert!(
        MovePlan::new(&a, &b, &(0..1), u64::MAX).is_none(),
        "past u64"
    );
}
