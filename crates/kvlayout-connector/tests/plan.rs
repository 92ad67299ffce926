//! The planner over random pairs of TP groups: orders, padded pages, block-size ratios 1, 2
//! and 4 both ways, TP 1 to 8 on each side (replication past the KV heads), K/V, inline
//! scales and MLA. Executing a plan on random remote bytes reproduces, for every element of
//! every moved token, layer and local head, the remote element's bytes, compared through the
//! two layouts' address maps; runs stay inside the buffers, destinations never overlap, the
//! bytes moved are the logical payload, runs are maximal (scattered and consecutive block
//! ids), and the compact plan expands to the flat one.

use kvlayout::ops::{Backend, BufferShape};
use kvlayout::tp_head_range;
use kvlayout::{Coord, KvCacheLayout};
use kvlayout_connector::handshake::CacheGroup;
use kvlayout_connector::plan::{plan_pull, PlanError, SeqBlocks, TransferPlan};
use kvlayout_connector::staged::{plan_pull_staged, receive};
use kvlayout_connector::{plan_pull_compact, CompactPlan};
use kvlayout_cpu::Host;
use proptest::prelude::*;

#[path = "../src/bin/shared/scattered.rs"]
mod scattered;

use scattered::scattered;

const ORDERS: [&str; 6] = ["NHD", "HND", "LBHNC", "BLHNC", "BLNHC", "BHLNC"];

/// A rank's layout: `content` with `heads` heads, `blocks` blocks of `n` tokens, pages padded
/// to 4 KiB where the order allows padding (H and N inside L and B).
fn rank_layout(
    content: &str,
    heads: u64,
    blocks: u64,
    n: u64,
    order: &str,
    pad: bool,
) -> KvCacheLayout {
    let paddable = !matches!(order, "BHLNC");
    let page = if pad && paddable { " page=4096" } else { "" };
    let spec = if content.starts_with("mla") {
        format!("{content} L=2 B={blocks} N={n} order={order}{page}")
    } else {
        format!("{content} L=2 B={blocks} N={n} H={heads} order={order}{page}")
    };
    spec.parse().unwrap_or_else(|e| panic!("{spec}: {e}"))
}

/// Rank `tp_rank` of `tp_size` holding `layout`, its memory not described (planning only).
fn side(layout: &KvCacheLayout, total_kv_heads: u64, tp_size: u64, tp_rank: u64) -> CacheGroup {
    CacheGroup {
        name: "attn".into(),
        layout: layout.clone(),
        total_kv_heads,
        tp_size,
        tp_rank,
        regions: Vec::new(),
    }
}

fn fill(l: &KvCacheLayout, seed: u64) -> Vec<Vec<u8>> {
    l.extents()
        .iter()
        .enumerate()
        .map(|(b, x)| {
            (0..x.end)
                .map(|i| (i.wrapping_mul(2654435761) ^ seed ^ (b as u64 * 77)) as u8)
                .collect()
        })
        .collect()
}

#[derive(Debug, Clone)]
struct Case {
    content: &'static str,
    total_heads: u64,
    tp_remote: u64,
    tp_local: u64,
    local_rank: u64,
    n_remote: u64,
    n_local: u64,
    order_remote: &'static str,
    order_local: &'static str,
    pad_remote: bool,
    pad_local: bool,
    tokens: (u64, u64),
    shuffle: u64,
    /// Block ids in order on both sides (the local ones shifted by `shuffle & 1`), so that
    /// runs of consecutive blocks merge; scattered otherwise.
    consecutive: bool,
}

fn case() -> impl Strategy<Value = Case> {
    let contents = prop::sample::select(vec![
        "kv D=8 dtype=f16",
        "kv D=8 Dv=4 dtype=bf16",
        "kv-scaled D=8 dtype=int8",
        "mla rank=16 rope=8 dtype=bf16",
    ]);
    (
        contents,
        prop::sample::select(vec![1u64, 2, 4]),
        prop::sample::select(vec![1u64, 2, 4, 8]),
        prop::sample::select(vec![1u64, 2, 4, 8]),
        0u64..8,
        prop::sample::select(vec![4u64, 8, 16]),
        prop::sample::select(vec![4u64, 8, 16]),
        prop::sample::select(ORDERS.to_vec()),
        prop::sample::select(ORDERS.to_vec()),
        any::<(bool, bool, bool)>(),
        (1u64..40, 1u64..40),
        any::<u64>(),
    )
        .prop_map(
            |(content, h, tr, tl, rank, nr, nl, or, ol, (pr, pl, consecutive), tokens, shuffle)| {
                let total_heads = if content.starts_with("mla") { 1 } else { h };
                Case {
                    content,
                    total_heads,
                    tp_remote: tr,
                    tp_local: tl,
                    local_rank: rank % tl,
                    n_remote: nr,
                    n_local: nl,
                    order_remote: or,
                    order_local: ol,
                    pad_remote: pr,
                    pad_local: pl,
                    tokens,
                    shuffle,
                    consecutive,
                }
            },
        )
}

/// Applies `plan` to local buffers from the remote ranks' bytes, run by run (the reference
/// the engines are not part of).
fn apply(
    plan: &TransferPlan,
    remote: &[Vec<Vec<u8>>],
    local: &mut [Vec<u8>],
) -> Result<(), TestCaseError> {
    for t in &plan.transfers {
        let src = &remote[t.remote_rank as usize];
        for r in &t.runs {
            let (s, d) = (r.src_offset as usize, r.dst_offset as usize);
            let len = r.len as usize;
            prop_assert!(
                s + len <= src[r.src_buffer as usize].len(),
                "run past a remote buffer"
            );
            prop_assert!(
                d + len <= local[r.dst_buffer as usize].len(),
                "run past a local buffer"
            );
            local[r.dst_buffer as usize][d..d + len]
                .copy_from_slice(&src[r.src_buffer as usize][s..s + len]);
        }
    }
    Ok(())
}

/// Each transfer's runs are sorted by source and no run continues the next on both sides
/// (sources never overlap, so two runs that could merge are neighbours in source order).
fn check_maximal(plan: &TransferPlan) -> Result<(), TestCaseError> {
    for t in &plan.transfers {
        for w in t.runs.windows(2) {
            let (a, b) = (&w[0], &w[1]);
            prop_assert!(
                (a.src_buffer, a.src_offset + a.len) <= (b.src_buffer, b.src_offset),
                "runs not in source order: {:?} {:?}",
                a,
                b
            );
            let mergeable = a.src_buffer == b.src_buffer
                && a.dst_buffer == b.dst_buffer
                && a.src_offset + a.len == b.src_offset
                && a.dst_offset + a.len == b.dst_offset;
            prop_assert!(!mergeable, "runs not merged: {:?} {:?}", a, b);
        }
    }
    Ok(())
}

fn elem(bufs: &[Vec<u8>], l: &KvCacheLayout, c: &Coord) -> Vec<u8> {
    let at = l.offset(c).unwrap();
    let size = l.field_map(c.field).unwrap().elem_bytes() as usize;
    bufs[at.buffer as usize][at.offset as usize..at.offset as usize + size].to_vec()
}

fn check(c: &Case) -> Result<(), TestCaseError> {
    let heads_of = |tp: u64, rank: u64| tp_head_range(c.total_heads, tp, rank);
    let (Ok(_), Ok(local_heads)) = (heads_of(c.tp_remote, 0), heads_of(c.tp_local, c.local_rank))
    else {
        return Ok(()); // TP sizes the heads do not split over
    };
    let blocks_needed = |n: u64| (c.tokens.0.div_ceil(n) + c.tokens.1.div_ceil(n)) + 1;
    let (nbr, nbl) = (blocks_needed(c.n_remote), blocks_needed(c.n_local));
    let remote_layouts: Vec<KvCacheLayout> = (0..c.tp_remote)
        .map(|r| {
            let h = heads_of(c.tp_remote, r).unwrap();
            rank_layout(
                c.content,
                h.end - h.start,
                nbr,
                c.n_remote,
                c.order_remote,
                c.pad_remote,
            )
        })
        .collect();
    let local_layout = rank_layout(
        c.content,
        local_heads.end - local_heads.start,
        nbl,
        c.n_local,
        c.order_local,
        c.pad_local,
    );
    let remotes: Vec<CacheGroup> = remote_layouts
        .iter()
        .enumerate()
        .map(|(r, l)| side(l, c.total_heads, c.tp_remote, r as u64))
        .collect();
    let local = side(&local_layout, c.total_heads, c.tp_local, c.local_rank);
    let (t0, t1) = c.tokens;
    let (nr, nl) = (
        t0.div_ceil(c.n_remote) + t1.div_ceil(c.n_remote),
        t0.div_ceil(c.n_local) + t1.div_ceil(c.n_local),
    );
    let (rb, lb) = if c.consecutive {
        let shift = c.shuffle & 1;
        ((0..nr).collect(), (shift..nl + shift).collect())
    } else {
        (
            scattered(nr, nbr, c.shuffle),
            scattered(nl, nbl, c.shuffle >> 3),
        )
    };
    let (r0, r1) = rb.split_at(t0.div_ceil(c.n_remote) as usize);
    let (l0, l1) = lb.split_at(t0.div_ceil(c.n_local) as usize);
    let seqs = vec![
        SeqBlocks {
            remote: r0.to_vec(),
            local: l0.to_vec(),
            tokens: t0,
        },
        SeqBlocks {
            remote: r1.to_vec(),
            local: l1.to_vec(),
            tokens: t1,
        },
    ];
    let plan = plan_pull(&local, &remotes, &seqs)
        .map_err(|e| TestCaseError::fail(format!("{c:?}: {e}")))?;
    let remote_bytes: Vec<Vec<Vec<u8>>> = remote_layouts
        .iter()
        .enumerate()
        .map(|(r, l)| fill(l, r as u64 + 1))
        .collect();
    let mut local_bytes = fill(&local_layout, 99);
    apply(&plan, &remote_bytes, &mut local_bytes)?;
    check_maximal(&plan)?;
    // The compact plan holds the same runs.
    let compact = plan_pull_compact(&local, &remotes, &seqs)
        .map_err(|e| TestCaseError::fail(format!("compact {c:?}: {e}")))?;
    prop_assert_eq!(compact.descriptors(), plan.descriptors() as u64);
    prop_assert_eq!(compact.bytes(), plan.bytes());
    prop_assert_eq!(&compact.expand(), &plan);
    // No destination byte written twice.
    let mut dst: Vec<_> = plan
        .transfers
        .iter()
        .flat_map(|t| t.runs.iter().map(|r| (r.dst_buffer, r.dst_offset, r.len)))
        .collect();
    dst.sort_unstable();
    for w in dst.windows(2) {
        prop_assert!(
            w[0].0 != w[1].0 || w[0].1 + w[0].2 <= w[1].1,
            "overlapping destinations"
        );
    }
    // The payload: whole sub-blocks of the smaller block size, every layer, local head, field.
    let g = c.n_remote.min(c.n_local);
    let row: u64 = local_layout
        .stored_fields()
        .iter()
        .map(|f| f.width * f.elem_bytes())
        .sum();
    let sub_blocks = t0.div_ceil(g) + t1.div_ceil(g);
    let heads = local_heads.end - local_heads.start;
    prop_assert_eq!(plan.bytes(), sub_blocks * g * 2 * heads * row);
    let moved = Moved {
        case: c,
        seqs: &seqs,
        local_heads: &local_heads,
        remote_layouts: &remote_layouts,
        remote_bytes: &remote_bytes,
        local_layout: &local_layout,
    };
    moved.check(&local_bytes)?;
    // The staged pull: remote -> staging, then scatter_blocks on the reference backend.
    let staged = plan_pull_staged(&local, &remotes, &seqs)
        .map_err(|e| TestCaseError::fail(format!("staged {c:?}: {e}")))?;
    let be = Host::reference();
    let mut local_cache = be
        .alloc_cache(&local_layout, &BufferShape::exact(&local_layout))
        .unwrap();
    be.upload_cache(&mut local_cache, &fill(&local_layout, 99))
        .unwrap();
    for t in &staged.transfers {
        let mut staging_bytes = fill(&t.staging, 7);
        apply(&t.wire(), &remote_bytes, &mut staging_bytes)?;
        let mut staging = be
            .alloc_cache(&t.staging, &BufferShape::exact(&t.staging))
            .unwrap();
        be.upload_cache(&mut staging, &staging_bytes).unwrap();
        be.wait(receive(&be, t, &staging, &mut local_cache).unwrap())
            .unwrap();
    }
    let staged_bytes = be.download_cache(&local_cache).unwrap();
    moved.check(&staged_bytes)?;
    Ok(())
}

/// What a plan moved: the case, its sequences and heads, and the remote caches.
struct Moved<'a> {
    case: &'a Case,
    seqs: &'a [SeqBlocks],
    local_heads: &'a std::ops::Range<u64>,
    remote_layouts: &'a [KvCacheLayout],
    remote_bytes: &'a [Vec<Vec<u8>>],
    local_layout: &'a KvCacheLayout,
}

impl Moved<'_> {
    /// Every element of every moved token of `local_bytes` equals its remote element, through
    /// both address maps.
    fn check(&self, local_bytes: &[Vec<u8>]) -> Result<(), TestCaseError> {
        let Moved {
            case: c,
            seqs,
            local_heads,
            remote_layouts,
            remote_bytes,
            local_layout,
        } = *self;
        let heads_of = |tp: u64, rank: u64| tp_head_range(c.total_heads, tp, rank);
        for (s, seq) in seqs.iter().enumerate() {
            for t in 0..seq.tokens {
                for h in local_heads.clone() {
                    let holder = (0..c.tp_remote)
                        .find(|&r| heads_of(c.tp_remote, r).unwrap().contains(&h))
                        .unwrap();
                    let held = heads_of(c.tp_remote, holder).unwrap();
                    let rl = &remote_layouts[holder as usize];
                    for layer in 0..2 {
                        for f in local_layout.stored_fields() {
                            for d in 0..f.width {
                                let at = |block: u64, n: u64, head: u64| Coord {
                                    layer,
                                    block,
                                    head,
                                    slot: n,
                                    field: f.field,
                                    dim: d,
                                };
                                let want = elem(
                                    &remote_bytes[holder as usize],
                                    rl,
                                    &at(
                                        seq.remote[(t / c.n_remote) as usize],
                                        t % c.n_remote,
                                        h - held.start,
                                    ),
                                );
                                let got = elem(
                                    local_bytes,
                                    local_layout,
                                    &at(
                                        seq.local[(t / c.n_local) as usize],
                                        t % c.n_local,
                                        h - local_heads.start,
                                    ),
                                );
                                prop_assert_eq!(
                                    got,
                                    want,
                                    "seq {} token {} head {} {:?}",
                                    s,
                                    t,
                                    h,
                                    f.field
                                );
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn plans_move_every_element_to_its_place(c in case()) {
        check(&c)?;
    }
}

#[test]
fn decode_tp_above_prefill_tp_reads_a_head_slice() {
    // Prefill TP 1 holds heads 0..4; decode rank 1 of TP 2 wants heads 2..4.
    let remote: KvCacheLayout = "kv L=2 B=4 N=16 H=4 D=8 dtype=f16 order=HND"
        .parse()
        .unwrap();
    let local: KvCacheLayout = "kv L=2 B=4 N=16 H=2 D=8 dtype=f16 order=HND"
        .parse()
        .unwrap();
    let side = |l, tp, rank| side(l, 4, tp, rank);
    let seqs = [SeqBlocks {
        remote: vec![2, 3],
        local: vec![0, 1],
        tokens: 32,
    }];
    let plan = plan_pull(&side(&local, 2, 1), &[side(&remote, 1, 0)], &seqs).unwrap();
    assert_eq!(plan.transfers.len(), 1);
    assert_eq!(plan.transfers[0].remote_heads, 2..4);
    // HND: heads 2..4 of a block are one run of 2 x 16 x 16 x 2 bytes per layer (heads 0..2
    // of the next block lie between two of them): one run per block and layer.
    assert_eq!(plan.descriptors(), 2 * 2);
    assert_eq!(plan.bytes(), 2 * 2 * 2 * 16 * 16 * 2);
}

#[test]
fn prefill_tp_above_decode_tp_gathers_from_several_ranks() {
    let remote: KvCacheLayout = "kv L=1 B=2 N=16 H=1 D=8 dtype=f16 order=NHD"
        .parse()
        .unwrap();
    let local: KvCacheLayout = "kv L=1 B=2 N=16 H=4 D=8 dtype=f16 order=NHD"
        .parse()
        .unwrap();
    let side = |l, tp, rank| side(l, 4, tp, rank);
    let remotes: Vec<CacheGroup> = (0..4).map(|r| side(&remote, 4, r)).collect();
    let seqs = [SeqBlocks {
        remote: vec![1],
        local: vec![0],
        tokens: 16,
    }];
    let plan = plan_pull(&side(&local, 1, 0), &remotes, &seqs).unwrap();
    let ranks: Vec<u64> = plan.transfers.iter().map(|t| t.remote_rank).collect();
    assert_eq!(ranks, vec![0, 1, 2, 3]);
    // NHD: each token's row of one head is its own run on the local side.
    assert!(plan.transfers.iter().all(|t| t.runs.len() == 16));
}

#[test]
fn refusals_say_why() {
    let hnd24: KvCacheLayout = "kv B=4 N=24 H=2 D=8 dtype=f16 order=HND".parse().unwrap();
    let nhd16: KvCacheLayout = "kv B=8 N=16 H=2 D=8 dtype=f16 order=NHD".parse().unwrap();
    let fp8: KvCacheLayout = "kv B=8 N=16 H=2 D=8 dtype=fp8_e4m3 order=NHD"
        .parse()
        .unwrap();
    let side = |l, tp, rank| side(l, 2, tp, rank);
    let seqs = [SeqBlocks {
        remote: vec![0],
        local: vec![0, 1],
        tokens: 32,
    }];
    // Blocks of 24 and 16 tokens do not nest.
    let e = plan_pull(&side(&nhd16, 1, 0), &[side(&hnd24, 1, 0)], &seqs).unwrap_err();
    assert!(matches!(e, PlanError::BlockSize(_)), "{e}");
    assert!(
        e.to_string()
            .contains("local 16 and remote 24 tokens per block do not nest"),
        "{e}"
    );
    // Different dtypes.
    let e = plan_pull(&side(&nhd16, 1, 0), &[side(&fp8, 1, 0)], &[]).unwrap_err();
    assert!(e.to_string().contains("dtype"), "{e}");
    // A layout holding the wrong number of heads for its rank.
    let e = plan_pull(&side(&nhd16, 2, 0), &[side(&fp8, 1, 0)], &[]).unwrap_err();
    assert!(
        e.to_string()
            .contains("holds 1 of 2 KV heads, its layout has 2"),
        "{e}"
    );
    // A local block written twice.
    let twice = [SeqBlocks {
        remote: vec![0, 1],
        local: vec![3, 3],
        tokens: 32,
    }];
    let e = plan_pull(&side(&nhd16, 1, 0), &[side(&nhd16, 1, 0)], &twice).unwrap_err();
    assert!(e.to_string().contains("local block 3 twice"), "{e}");
    // A block past the pool.
    let past = [SeqBlocks {
        remote: vec![8],
        local: vec![0],
        tokens: 16,
    }];
    let e = plan_pull(&side(&nhd16, 1, 0), &[side(&nhd16, 1, 0)], &past).unwrap_err();
    assert!(e.to_string().contains("remote block 8 not below 8"), "{e}");
}

#[test]
fn mamba_states_move_whole_blocks_and_gather_heads() {
    // Prefill TP 2 (2 heads each) -> decode TP 1 (4 heads), one state per block.
    let spec = |h: u64, order: &str| -> KvCacheLayout {
        format!("mamba-ssm L=2 B=4 N=16 H={h} head_dim=4 state=8 dtype=f32 order={order}")
            .parse()
            .unwrap()
    };
    let remote: Vec<KvCacheLayout> = (0..2).map(|_| spec(2, "LBHNC")).collect();
    let local = spec(4, "BLHNC");
    let remotes: Vec<CacheGroup> = remote
        .iter()
        .enumerate()
        .map(|(r, l)| side(l, 4, 2, r as u64))
        .collect();
    let seqs = [SeqBlocks {
        remote: vec![3, 1],
        local: vec![0, 2],
        tokens: 20,
    }];
    let plan = plan_pull(&side(&local, 4, 1, 0), &remotes, &seqs).unwrap();
    assert_eq!(plan.transfers.len(), 2);
    let remote_bytes: Vec<Vec<Vec<u8>>> = remote
        .iter()
        .enumerate()
        .map(|(r, l)| fill(l, r as u64 + 5))
        .collect();
    let mut local_bytes = fill(&local, 1);
    apply(&plan, &remote_bytes, &mut local_bytes).unwrap();
    for (rb, lb) in [(3u64, 0u64), (1, 2)] {
        for h in 0..4u64 {
            for layer in 0..2 {
                for f in local.stored_fields() {
                    for d in 0..f.width {
                        let c = |block, head| Coord {
                            layer,
                            block,
                            head,
                            slot: 0,
                            field: f.field,
                            dim: d,
                        };
                        let r = (h / 2) as usize;
                        assert_eq!(
                            elem(&local_bytes, &local, &c(lb, h)),
                            elem(&remote_bytes[r], &remote[r], &c(rb, h % 2))
                        );
                    }
                }
            }
        }
    }
    // A conv state is sharded by channels: TP 2 is refused, with the reason.
    let conv: KvCacheLayout =
        "mamba-conv L=1 B=4 N=16 conv_dim=8 conv_width=3 dtype=bf16 order=LBHNC"
            .parse()
            .unwrap();
    let e = plan_pull(&side(&conv, 1, 2, 0), &[side(&conv, 1, 1, 0)], &seqs).unwrap_err();
    assert!(e.to_string().contains("channels"), "{e}");
}

/// Two blocks, one head, block ids consecutive on both sides (remote 0, 1 to local 1, 2):
/// the plan's runs for `order`, checked element by element and for maximality, and its
/// compact form.
fn two_consecutive_blocks(order: &str) -> (TransferPlan, CompactPlan) {
    let spec = |b| -> KvCacheLayout {
        format!("kv L=3 B={b} N=16 H=1 D=8 dtype=f16 order={order}")
            .parse()
            .unwrap()
    };
    let (remote, local) = (spec(2), spec(3));
    let seqs = [SeqBlocks {
        remote: vec![0, 1],
        local: vec![1, 2],
        tokens: 32,
    }];
    let (l, r) = (side(&local, 1, 1, 0), [side(&remote, 1, 1, 0)]);
    let plan = plan_pull(&l, &r, &seqs).unwrap();
    let remote_bytes = vec![fill(&remote, 3)];
    let mut local_bytes = fill(&local, 4);
    apply(&plan, &remote_bytes, &mut local_bytes).unwrap();
    check_maximal(&plan).unwrap();
    for (rb, lb) in [(0u64, 1u64), (1, 2)] {
        for layer in 0..3 {
            for slot in 0..16 {
                for f in local.stored_fields() {
                    for dim in 0..f.width {
                        let c = |block| Coord {
                            layer,
                            block,
                            head: 0,
                            slot,
                            field: f.field,
                            dim,
                        };
                        assert_eq!(
                            elem(&local_bytes, &local, &c(lb)),
                            elem(&remote_bytes[0], &remote, &c(rb))
                        );
                    }
                }
            }
        }
    }
    let compact = plan_pull_compact(&l, &r, &seqs).unwrap();
    assert_eq!(compact.expand(), plan);
    (plan, compact)
}

#[test]
fn consecutive_blocks_merge_across_blocks_and_layers() {
    // K|V rows of one head, 16 slots, 8 + 8 f16: 512 bytes per block and layer.
    let page = 16 * 16 * 2;
    // All layers per block: blocks 0, 1 are one run of both blocks' layers on each side.
    let (plan, compact) = two_consecutive_blocks("BLHNC");
    assert_eq!(plan.descriptors(), 1);
    assert_eq!(plan.transfers[0].runs[0].len, 2 * 3 * page);
    assert_eq!(compact.runs_held(), 1);
    // One page per layer: the two blocks merge within each layer; the layers do not touch
    // (block 0 of the next layer lies between them on the local side, which has 3 blocks),
    // so the compact plan holds one run repeated per layer.
    let (plan, compact) = two_consecutive_blocks("NHD");
    assert_eq!(plan.descriptors(), 3);
    assert!(plan.transfers[0].runs.iter().all(|r| r.len == 2 * page));
    assert_eq!(
        (compact.runs_held(), compact.transfers[0].runs.repeat),
        (1, 3)
    );
    // Head-major pages with one head are the same bytes as NHD: the same runs.
    let (hnd, _) = two_consecutive_blocks("HND");
    assert_eq!(hnd.descriptors(), 3);
}
