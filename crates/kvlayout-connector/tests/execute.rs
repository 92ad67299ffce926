//! `execute` on the memcpy engine and on a failing test double. Sizes that expose swapped
//! dimensions (3 blocks, 4 heads, 16 slots, 8 dims, 2 layers), two blocks mapped of three, and
//! one head. Direct and staged plans reach completion: every element of every moved token and
//! local head equals the remote rank's element, compared through both layouts' address maps,
//! and the block not mapped keeps its bytes. A read that fails, a read that never completes, a
//! missing peer and a failed post-receive give a typed error naming the blocks and heads not
//! received, and the heads that completed before the failure are received.

use std::ops::Range;
use std::time::Duration;

use kvlayout::ops::{Backend, BufferShape, CopyRun};
use kvlayout::{tp_head_range, Coord, KvCacheLayout};
use kvlayout_connector::engine::{Copied, EngineError, MemcpyEngine, TransferEngine};
use kvlayout_connector::executor::Cause;
use kvlayout_connector::handshake::{CacheGroup, MemRegion};
use kvlayout_connector::plan::{plan_pull, SeqBlocks};
use kvlayout_connector::staged::{plan_pull_staged, PostReceive, ReceiveError, Scatter};
use kvlayout_connector::staged::{StagedPlan, StagedTransfer};
use kvlayout_connector::{execute, ExecuteError, Plan};
use kvlayout_cpu::Host;

#[path = "shared/scenario.rs"]
mod scenario;

use scenario::{group, pattern};

const TIMEOUT: Duration = Duration::from_secs(5);

/// The model's KV heads; a rank of TP `tp` holds `HEADS / tp`.
const HEADS: u64 = 4;

/// One sequence of 21 tokens: remote blocks 2 and 0 into local blocks 1 and 2 (block 0 is not
/// mapped).
fn seqs() -> Vec<SeqBlocks> {
    vec![SeqBlocks {
        remote: vec![2, 0],
        local: vec![1, 2],
        tokens: 21,
    }]
}

/// A rank's layout: 2 layers, 3 blocks of 16 slots, `heads` heads of 8 f16 dims, in `order`.
fn layout(order: &str, heads: u64) -> KvCacheLayout {
    format!("kv L=2 B=3 N=16 H={heads} D=8 dtype=f16 order={order}")
        .parse()
        .unwrap()
}

/// Zeroed local memory for `plan`'s staging cache.
fn staging(plan: &StagedPlan) -> Vec<Vec<u8>> {
    let extents = plan.staging_extents().into_iter();
    extents.map(|n| vec![0; n as usize]).collect()
}

/// A prefill group of `tp` ranks in `order`: each rank's group, bytes and engine (`tag-p{r}`).
struct Prefill {
    groups: Vec<CacheGroup>,
    bytes: Vec<Vec<Vec<u8>>>,
    names: Vec<String>,
    /// Kept alive: peers reach them by name.
    _engines: Vec<MemcpyEngine>,
}

fn prefill(tag: &str, order: &str, tp: u64) -> Prefill {
    let l = layout(order, HEADS / tp);
    let mut p = Prefill {
        groups: Vec::new(),
        bytes: Vec::new(),
        names: Vec::new(),
        _engines: Vec::new(),
    };
    for r in 0..tp {
        let name = format!("{tag}-p{r}");
        let e = MemcpyEngine::new(&name, pattern(&l, r as u8 + 1)).unwrap();
        p.groups.push(group(&l, tp, r, e.regions()));
        p.bytes.push(pattern(&l, r as u8 + 1));
        p.names.push(name);
        p._engines.push(e);
    }
    p
}

impl Prefill {
    fn peers(&self) -> Vec<&str> {
        self.names.iter().map(String::as_str).collect()
    }

    /// Adds every rank as a peer of `e`.
    fn connect(&self, e: &mut impl TransferEngine) {
        for (name, g) in self.names.iter().zip(&self.groups) {
            e.add_peer(name, name.as_bytes(), &g.regions).unwrap();
        }
    }
}

fn elem(bytes: &[Vec<u8>], l: &KvCacheLayout, c: &Coord) -> Vec<u8> {
    let at = l.offset(c).unwrap();
    let size = l.field_map(c.field).unwrap().elem_bytes() as usize;
    bytes[at.buffer as usize][at.offset as usize..at.offset as usize + size].to_vec()
}

/// Every element of every token of `seqs()` in local heads `heads` of `got` equals the remote
/// element of the rank holding it; local block 0 equals `before`.
fn check(p: &Prefill, local: &CacheGroup, got: &[Vec<u8>], before: &[Vec<u8>], heads: Range<u64>) {
    let l = &local.layout;
    let (total, tp) = (local.total_kv_heads, p.groups[0].tp_size);
    let mine = tp_head_range(total, local.tp_size, local.tp_rank).unwrap();
    for seq in seqs() {
        for t in 0..seq.tokens {
            for h in heads.clone() {
                let model = mine.start + h;
                let r = (0..tp)
                    .find(|&r| tp_head_range(total, tp, r).unwrap().contains(&model))
                    .unwrap();
                let held = tp_head_range(total, tp, r).unwrap();
                let rl = &p.groups[r as usize].layout;
                for layer in 0..2 {
                    for f in l.stored_fields() {
                        for dim in 0..f.width {
                            let at = |block: u64, head| Coord {
                                layer,
                                block,
                                head,
                                slot: t % 16,
                                field: f.field,
                                dim,
                            };
                            let want = at(seq.remote[(t / 16) as usize], model - held.start);
                            let want = elem(&p.bytes[r as usize], rl, &want);
                            let got = elem(got, l, &at(seq.local[(t / 16) as usize], h));
                            assert_eq!(got, want, "token {t} head {h} layer {layer} {f:?}");
                        }
                    }
                }
            }
        }
    }
    let heads = l.geometry().num_kv_heads;
    for r in l.block_regions(0, 0..2, 0..heads).unwrap() {
        let (b, o, n) = (r.buffer as usize, r.offset as usize, r.len as usize);
        assert_eq!(got[b][o..o + n], before[b][o..o + n], "block 0 written");
    }
}

/// A memcpy engine whose read number `fail` (from 0) copies half its runs and then fails when
/// polled, or, when `hang`, never completes.
struct Flaky {
    inner: MemcpyEngine,
    reads: usize,
    fail: usize,
    hang: bool,
}

enum Pending {
    Done(Copied),
    Failed,
    Hanging,
}

impl TransferEngine for Flaky {
    type Pending = Pending;

    fn name(&self) -> &str {
        self.inner.name()
    }
    fn local_metadata(&self) -> Result<Vec<u8>, EngineError> {
        self.inner.local_metadata()
    }
    fn regions(&self) -> Vec<MemRegion> {
        self.inner.regions()
    }
    fn add_peer(
        &mut self,
        name: &str,
        md: &[u8],
        regions: &[MemRegion],
    ) -> Result<(), EngineError> {
        self.inner.add_peer(name, md, regions)
    }
    fn post_read(
        &mut self,
        peer: &str,
        runs: &[CopyRun],
        notify: &[u8],
    ) -> Result<Pending, EngineError> {
        self.reads += 1;
        if self.reads - 1 != self.fail {
            return self.inner.post_read(peer, runs, notify).map(Pending::Done);
        }
        if self.hang {
            return Ok(Pending::Hanging);
        }
        self.inner.post_read(peer, &runs[..runs.len() / 2], b"")?;
        Ok(Pending::Failed)
    }
    fn poll(&mut self, pending: &mut Pending) -> Result<bool, EngineError> {
        match pending {
            Pending::Done(c) => self.inner.poll(c),
            Pending::Failed => Err(EngineError::Transport("the peer died mid-read".into())),
            Pending::Hanging => Ok(false),
        }
    }
    fn buffers(&self) -> Result<Vec<Vec<u8>>, EngineError> {
        self.inner.buffers()
    }
    fn notifications(&mut self) -> Result<Vec<(String, Vec<u8>)>, EngineError> {
        self.inner.notifications()
    }
}

/// An engine `name` over `buffers` whose read `fail` fails (`usize::MAX`: none does).
fn flaky(name: &str, buffers: Vec<Vec<u8>>, fail: usize, hang: bool) -> Flaky {
    let inner = MemcpyEngine::new(name, buffers).unwrap();
    Flaky {
        inner,
        reads: 0,
        fail,
        hang,
    }
}

/// Runs the plan (`staged` or direct) of local rank `rank` of `tp_l` (`order_l`) from prefill
/// `p`, on an engine whose read `fail` fails: the result, the local group, and the local cache
/// before and after (the engine's buffers when direct; a cache on the reference backend, which
/// `scatter_blocks` fills, when staged).
fn run(
    tag: &str,
    p: &Prefill,
    (order_l, tp_l, rank): (&str, u64, u64),
    fail: usize,
    staged: bool,
) -> Outcome {
    let l = layout(order_l, HEADS / tp_l);
    let before = pattern(&l, 99);
    let peers = p.peers();
    let (result, local, after);
    if staged {
        local = group(&l, tp_l, rank, Vec::new());
        let plan = plan_pull_staged(&local, &p.groups, &seqs()).unwrap();
        let mut engine = flaky(&format!("{tag}-s"), staging(&plan), fail, false);
        p.connect(&mut engine);
        let be = Host::reference();
        let mut cache = be.alloc_cache(&l, &BufferShape::exact(&l)).unwrap();
        be.upload_cache(&mut cache, &before).unwrap();
        let mut scatter = Scatter::new(&be, &mut cache);
        let plan = Plan::Staged(&plan, &mut scatter);
        result = execute(&mut engine, plan, &peers, b"", TIMEOUT);
        after = be.download_cache(&cache).unwrap();
    } else {
        let mut engine = flaky(&format!("{tag}-d"), before.clone(), fail, false);
        p.connect(&mut engine);
        local = group(&l, tp_l, rank, engine.regions());
        let plan = plan_pull(&local, &p.groups, &seqs()).unwrap();
        assert_eq!(plan.local_blocks, vec![1, 2]);
        result = execute(&mut engine, Plan::Direct(&plan), &peers, b"", TIMEOUT);
        after = engine.buffers().unwrap();
    }
    Outcome {
        result,
        local,
        before,
        after,
    }
}

/// `e` names local blocks `blocks` in the one range of heads `heads` (start, end).
fn assert_not_received(e: &ExecuteError, blocks: &[u64], heads: (u64, u64)) {
    assert_eq!(e.blocks, blocks, "{e}");
    let got: Vec<(u64, u64)> = e.heads.iter().map(|h| (h.start, h.end)).collect();
    assert_eq!(got, [heads], "{e}");
}

struct Outcome {
    result: Result<(), ExecuteError>,
    local: CacheGroup,
    before: Vec<Vec<u8>>,
    after: Vec<Vec<u8>>,
}

#[test]
fn direct_and_staged_plans_complete_with_every_element_in_place() {
    // (local order, local TP, rank, remote order, remote TP)
    for (i, &(order_l, tp_l, rank, order_r, tp_r)) in [
        ("HND", 1, 0, "NHD", 1),
        ("NHD", 2, 1, "HND", 1),
        ("HND", 1, 0, "NHD", 2),
        ("NHD", 4, 2, "HND", 4),
        ("HND", 4, 3, "NHD", 1),
    ]
    .iter()
    .enumerate()
    {
        let tag = format!("x-ok-{i}");
        let p = prefill(&tag, order_r, tp_r);
        for staged in [false, true] {
            let o = run(&tag, &p, (order_l, tp_l, rank), usize::MAX, staged);
            o.result
                .unwrap_or_else(|e| panic!("case {i} staged {staged}: {e}"));
            check(&p, &o.local, &o.after, &o.before, 0..HEADS / tp_l);
        }
    }
}

#[test]
fn a_read_failing_midway_names_the_blocks_and_heads_not_received() {
    // Two remote ranks (heads 0..2 and 2..4) into one local rank; the second read fails.
    let p = prefill("x-fail", "NHD", 2);
    for staged in [false, true] {
        let o = run("x-fail", &p, ("HND", 1, 0), 1, staged);
        let how = if staged { "staged" } else { "direct" };
        let e = o.result.expect_err(how);
        assert_not_received(&e, &[1, 2], (2, 4));
        assert!(
            matches!(
                &*e.cause,
                Cause::Engine {
                    rank: 1,
                    error: EngineError::Transport(_)
                }
            ),
            "{how}: {e}"
        );
        assert!(
            e.to_string()
                .contains("2 local blocks not received in heads 2..4: 1..3"),
            "{e}"
        );
        // The first rank's heads were received.
        check(&p, &o.local, &o.after, &o.before, 0..2);
    }
}

#[test]
fn a_read_that_never_completes_times_out_naming_every_head() {
    let p = prefill("x-hang", "NHD", 2);
    let l = layout("HND", HEADS);
    let mut engine = flaky("x-hang-d", pattern(&l, 99), 0, true);
    p.connect(&mut engine);
    let plan = plan_pull(&group(&l, 1, 0, engine.regions()), &p.groups, &seqs()).unwrap();
    let timeout = Duration::from_millis(20);
    let e = execute(&mut engine, Plan::Direct(&plan), &p.peers(), b"", timeout).unwrap_err();
    assert_eq!(
        *e.cause,
        Cause::Engine {
            rank: 0,
            error: EngineError::Timeout(timeout)
        }
    );
    assert_not_received(&e, &[1, 2], (0, 4));
}

#[test]
fn a_rank_without_a_peer_is_refused_before_anything_moves() {
    let p = prefill("x-nopeer", "NHD", 2);
    for (how, staged_plan) in [("direct", false), ("staged", true)] {
        let l = layout("HND", HEADS);
        let local = group(&l, 1, 0, Vec::new());
        let bytes = pattern(&l, 99);
        let mut engine = MemcpyEngine::new(&format!("x-nopeer-{how}"), bytes.clone()).unwrap();
        p.connect(&mut engine);
        let peers = &p.peers()[..1];
        let e = if staged_plan {
            let plan = plan_pull_staged(&local, &p.groups, &seqs()).unwrap();
            execute(
                &mut engine,
                Plan::Staged(&plan, &mut Refuse),
                peers,
                b"",
                TIMEOUT,
            )
        } else {
            let plan = plan_pull(&local, &p.groups, &seqs()).unwrap();
            execute(&mut engine, Plan::Direct(&plan), peers, b"", TIMEOUT)
        }
        .unwrap_err();
        assert_eq!(*e.cause, Cause::NoPeer { rank: 1, peers: 1 }, "{how}");
        assert_not_received(&e, &[1, 2], (0, 4));
        assert!(
            e.to_string()
                .contains("remote rank 1 has no peer: 1 engine ids given"),
            "{e}"
        );
        assert_eq!(engine.buffers().unwrap(), bytes, "{how}: bytes moved");
    }
}

/// A post-receive operation that always fails.
struct Refuse;

impl PostReceive for Refuse {
    fn receive(&mut self, _: &StagedTransfer, _: &[Vec<u8>]) -> Result<(), ReceiveError> {
        Err(ReceiveError::Backend {
            backend: "test".into(),
            step: "scatter",
            reason: "refused".into(),
        })
    }
}

#[test]
fn a_failed_post_receive_names_its_heads_and_those_after() {
    let p = prefill("x-post", "HND", 2);
    let l = layout("NHD", HEADS);
    let plan = plan_pull_staged(&group(&l, 1, 0, Vec::new()), &p.groups, &seqs()).unwrap();
    // An engine holding the staging cache reaches the post-receive, which fails; an engine too
    // small for the staging cache refuses the read.
    for (name, buffers) in [
        ("x-post-s", staging(&plan)),
        ("x-post-small", vec![vec![0; 64]; 2]),
    ] {
        let mut engine = MemcpyEngine::new(name, buffers).unwrap();
        p.connect(&mut engine);
        let plan = Plan::Staged(&plan, &mut Refuse);
        let e = execute(&mut engine, plan, &p.peers(), b"", TIMEOUT).unwrap_err();
        let expected = match &*e.cause {
            Cause::PostReceive { rank: 0, .. } => "x-post-s",
            Cause::Engine {
                rank: 0,
                error: EngineError::OutOfRegion { .. },
            } => "x-post-small",
            _ => "neither",
        };
        assert_eq!(name, expected, "{e}");
        assert_not_received(&e, &[1, 2], (0, 4));
    }
}
