//! Under load: four prefill peer processes (NHD/16 TP 1, HND/16 TP 1, a TP 2 pair of padded
//! NHD/32 pages; `soak_cache::PEERS`) and two decode ranks (TP 2, NHD/16, one NIXL engine each
//! in this process) on loopback. Rounds of random requests (seeded), [`IN_FLIGHT`] per rank
//! posted before any is waited for, for `KVLAYOUT_SOAK_SECS` seconds (3 by default; 60 for the
//! bench figure) and at least `MIN_ROUNDS` rounds: every pull is checked element by element
//! through the decode layout against the value the prefill peer wrote, and the blocks no pull
//! wrote keep their poison. Registered regions and transfers in flight do not grow across
//! rounds; the resident memory is reported and bounded.
//!
//! Midway the HND/16 peer (on UCX's tcp transport, so its reads need its process) is stopped,
//! a round posted, then it is killed: each of its pulls reports the local blocks it leaves
//! undefined (`blocks_written`, equal to the plan's), every other pull of the round completes
//! and checks, a new `execute` from it fails naming the same blocks. It restarts with NHD
//! pages under the same engine id: `KnownPeers` refuses that fifth connect, naming the order.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use kvlayout_connector::engine::{wait, TransferEngine};
use kvlayout_connector::handshake::{check_compatible, Admission, CacheGroup, KnownPeers};
use kvlayout_connector::nixl::{
    blocks_written, Hello, NixlEngine, NixlPath, NixlPending, PreparedCount,
};
use kvlayout_connector::plan::{plan_pull, SeqBlocks, TransferPlan};
use kvlayout_connector::{execute, Plan};

use crate::common::{group, nixl_ready, report, role, CHILD_LIFETIME, XFER_TIMEOUT};
use crate::process::{listen, resident_kib, Peer};
use crate::soak_cache::{
    check_received, decode_layout, random_request, untouched, PeerSpec, Rng, DECODE_TP, INSTANCES,
    IN_FLIGHT, MODEL_HEADS, PEERS, POISON,
};
use crate::soak_peers::{hello_of, options, restarted_is_refused, soak_peer_child, VICTIM, WHICH};

pub(crate) const SOAK: &str = "nixl_soak_four_prefill_peers_two_decode_ranks_under_load";
/// Seconds the soak runs (default 3).
const SECS: &str = "KVLAYOUT_SOAK_SECS";
/// Rounds the soak runs at least (320 pulls), the kill after half of them.
const MIN_ROUNDS: u64 = 20;

/// One request's pull on one decode rank: its plan and its transfers posted.
struct Posted {
    rank: usize,
    instance: usize,
    seqs: Vec<SeqBlocks>,
    plan: TransferPlan,
    pending: Vec<NixlPending>,
}

/// Counts over the soak.
#[derive(Default)]
struct Tally {
    rounds: u64,
    pulls: u64,
    bytes: u64,
    elements: u64,
    affected: u64,
    max_in_flight: usize,
    /// Transfers made from prepared lists, and built from fresh descriptor lists.
    prepared_posts: u64,
    listed_posts: u64,
    /// Time from a round's first plan to its last completion, the kill round aside.
    pulling: Duration,
}

pub(crate) fn nixl_soak_four_prefill_peers_two_decode_ranks_under_load() {
    if role().as_deref() == Some("soak-peer") {
        return soak_peer_child();
    }
    if !nixl_ready() {
        return;
    }
    let secs: f64 = std::env::var(SECS).map_or(3.0, |s| s.parse().unwrap());
    // The peers' watchdog ends them after CHILD_LIFETIME, whatever happens.
    let most = CHILD_LIFETIME.as_secs_f64() - 20.0;
    assert!(
        (0.0..=most).contains(&secs),
        "{SECS}={secs}: 0 to {most} seconds"
    );
    let started = Instant::now();
    let (listener, port) = listen();
    let mut children: Vec<Peer> = (0..PEERS.len())
        .map(|i| {
            let index = i.to_string();
            let mut env = vec![(WHICH, index.as_str())];
            if i == VICTIM {
                env.push(("UCX_TLS", "tcp"));
            }
            Peer::spawn(SOAK, "soak-peer", port, &env)
        })
        .collect();
    let mut known = KnownPeers::new();
    let mut hellos: HashMap<String, Hello> = HashMap::new();
    let mut sockets = Vec::new();
    for child in children.iter_mut() {
        let (hello, s) = hello_of(child, &listener);
        assert_eq!(known.admit(&hello.peer), Ok(Admission::First));
        hellos.insert(hello.peer.engine_id.clone(), hello);
        sockets.push(s);
    }
    // Each instance's remote groups and engine ids, by TP rank.
    let remotes: Vec<(Vec<CacheGroup>, Vec<&str>)> = (0..INSTANCES as usize)
        .map(|inst| {
            let mut peers: Vec<&PeerSpec> = PEERS
                .iter()
                .filter(|p| p.instance as usize == inst)
                .collect();
            peers.sort_by_key(|p| p.tp_rank);
            let groups = peers
                .iter()
                .map(|p| hellos[p.engine_id].peer.groups[0].clone())
                .collect();
            (groups, peers.iter().map(|p| p.engine_id).collect())
        })
        .collect();
    let d = decode_layout();
    let poison: Vec<Vec<u8>> = d
        .extents()
        .iter()
        .map(|x| vec![POISON; x.end as usize])
        .collect();
    let mut engines: Vec<NixlEngine> = Vec::new();
    let mut locals: Vec<CacheGroup> = Vec::new();
    for rank in 0..DECODE_TP {
        let name = format!("soak-decode-{rank}");
        let mut e = NixlEngine::with_options(&name, poison.clone(), &options()).unwrap();
        for h in hellos.values() {
            e.add_peer(
                &h.peer.engine_id,
                &h.agent_metadata,
                &h.peer.groups[0].regions,
            )
            .unwrap();
        }
        let local = group(&d, DECODE_TP, rank, e.regions());
        assert_eq!(local.total_kv_heads, MODEL_HEADS);
        for (groups, _) in &remotes {
            groups
                .iter()
                .for_each(|g| check_compatible(&local, g).unwrap());
        }
        // Descriptor lists prepared once per remote rank sharing heads with this rank; a
        // pairing NIXL gains nothing from (a head slice of token-major pages) stays listed.
        for (groups, names) in &remotes {
            for (g, name) in groups.iter().zip(names) {
                let (lh, rh) = (local.head_range().unwrap(), g.head_range().unwrap());
                if lh.start.max(rh.start) < lh.end.min(rh.end) {
                    if let Err(why) = e.prepare_groups(name, &local, g, 0) {
                        report(&format!("nixl soak: rank {rank} from {name} listed: {why}"));
                    }
                }
            }
        }
        engines.push(e);
        locals.push(local);
    }
    let setup = started.elapsed();
    let mut prepared: Vec<PreparedCount> = engines.iter().map(|e| e.prepared()).collect();
    assert!(prepared.iter().all(|c| c.handles > 0), "{prepared:?}");

    let mut rng = Rng(0x5eed_0031);
    let mut alive: Vec<usize> = (0..INSTANCES as usize).collect();
    let mut tally = Tally::default();
    let (mut rss_early, mut killed_after) = (0, None);
    let soak = Instant::now();
    // At least MIN_ROUNDS rounds, however slow the host: the time bounds the soak, never its
    // checks.
    let done = |t: &Tally| soak.elapsed().as_secs_f64() >= secs && t.rounds >= MIN_ROUNDS;
    while !done(&tally) || killed_after.is_none() {
        let kill_round = killed_after.is_none()
            && soak.elapsed().as_secs_f64() >= secs / 2.0
            && tally.rounds >= MIN_ROUNDS / 2;
        for e in engines.iter_mut() {
            e.set_buffers(&poison).unwrap();
        }
        if kill_round {
            // Stopped, its reads cannot be served: they are in flight when it dies.
            children[VICTIM].signal(libc::SIGSTOP);
        }
        let round_start = Instant::now();
        let mut posted: Vec<Posted> = Vec::new();
        for slot in 0..IN_FLIGHT {
            let instance = match (kill_round, slot) {
                (true, 0) => VICTIM,
                _ => alive[rng.below(alive.len() as u64) as usize],
            };
            let g = remotes[instance].0[0].layout.geometry();
            let seqs = random_request(&mut rng, slot, g.num_blocks, g.block_size);
            for (rank, engine) in engines.iter_mut().enumerate() {
                let plan = plan_pull(&locals[rank], &remotes[instance].0, &seqs).unwrap();
                let mut pending = Vec::new();
                for t in &plan.transfers {
                    let peer = remotes[instance].1[t.remote_rank as usize];
                    let note = format!("r{}-s{slot}", tally.rounds);
                    let p = engine.post_read(peer, &t.runs, note.as_bytes()).unwrap();
                    match p.path() {
                        NixlPath::Prepared { .. } => tally.prepared_posts += 1,
                        NixlPath::Listed { .. } => tally.listed_posts += 1,
                    }
                    pending.push(p);
                }
                posted.push(Posted {
                    rank,
                    instance,
                    seqs: seqs.clone(),
                    plan,
                    pending,
                });
            }
        }
        let in_flight: usize = engines.iter().map(|e| e.in_flight()).sum();
        tally.max_in_flight = tally.max_in_flight.max(in_flight);
        let kill_at = kill_round.then(|| {
            children[VICTIM].signal(libc::SIGKILL);
            Instant::now()
        });
        let mut failed = vec![false; posted.len()];
        for (i, p) in posted.iter_mut().enumerate() {
            for pending in p.pending.iter_mut() {
                let Err(e) = wait(&mut engines[p.rank], pending, XFER_TIMEOUT) else {
                    continue;
                };
                assert!(
                    kill_round && p.instance == VICTIM,
                    "round {} rank {} instance {}: {e}",
                    tally.rounds,
                    p.rank,
                    p.instance
                );
                let lost = blocks_written(&d, pending.runs()).unwrap();
                assert_eq!(lost, p.plan.local_blocks, "{e}");
                failed[i] = true;
            }
        }
        if !kill_round {
            tally.pulling += round_start.elapsed();
        }
        for (rank, e) in engines.iter().enumerate() {
            assert_eq!(e.in_flight(), 0, "round {}", tally.rounds);
            assert_eq!(e.regions().len(), d.num_buffers(), "round {}", tally.rounds);
            assert_eq!(e.prepared(), prepared[rank], "round {}", tally.rounds);
            let received = e.buffers().unwrap();
            for (p, _) in posted
                .iter()
                .zip(&failed)
                .filter(|(p, f)| p.rank == rank && !**f)
            {
                let block_size = remotes[p.instance].0[0].layout.geometry().block_size;
                let n = check_received(
                    &received,
                    rank as u64,
                    p.instance as u64,
                    block_size,
                    &p.seqs,
                )
                .unwrap_or_else(|m| panic!("round {} rank {rank}: {m}", tally.rounds));
                tally.elements += n;
                tally.pulls += 1;
                tally.bytes += p.plan.bytes();
            }
            // The blocks no pull of the round was to write keep their poison.
            let planned: Vec<u64> = posted
                .iter()
                .filter(|p| p.rank == rank)
                .flat_map(|p| p.plan.local_blocks.iter().copied())
                .collect();
            for b in (0..d.geometry().num_blocks).filter(|b| !planned.contains(b)) {
                assert!(
                    untouched(&received, b),
                    "round {} rank {rank} block {b}",
                    tally.rounds
                );
            }
        }
        tally.rounds += 1;
        if tally.rounds == 2 {
            rss_early = resident_kib();
        }
        if let Some(at) = kill_at {
            let affected = failed.iter().filter(|f| **f).count() as u64;
            assert!(
                affected >= DECODE_TP,
                "every rank's pull from the stopped peer fails"
            );
            tally.affected = affected;
            after_kill(
                &mut engines,
                &locals,
                &remotes,
                &mut children,
                &listener,
                &mut known,
            );
            alive.retain(|&i| i != VICTIM);
            // Removing the peer released its lists.
            for (rank, e) in engines.iter().enumerate() {
                let now = e.prepared();
                assert!(
                    now.handles < prepared[rank].handles,
                    "{now:?}, {:?}",
                    prepared[rank]
                );
                prepared[rank] = now;
            }
            killed_after = Some(at.elapsed());
        }
    }
    let wall = soak.elapsed().as_secs_f64();
    let rss_end = resident_kib();
    drop(sockets);
    // The peers alive take the pulls' notifications until the socket closes, then exit.
    let mut notes = 0;
    for (i, child) in children
        .iter_mut()
        .enumerate()
        .filter(|(i, _)| *i != VICTIM)
    {
        let status = child.wait(XFER_TIMEOUT);
        let out = child.output();
        assert!(
            status.is_some_and(|s| s.success()),
            "peer {i}: {status:?}\n{out}"
        );
        let tail = format!("{}: ", PEERS[i].engine_id);
        let got: usize = out
            .split(&tail)
            .nth(1)
            .and_then(|t| t.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("peer {i} reported no notifications:\n{out}"));
        assert!(got > 0, "peer {i}: no notification arrived");
        notes += got;
    }
    report(&format!(
        "nixl soak: 4 prefill peers (NHD/16, HND/16, TP 2 NHD/32 padded), 2 decode ranks \
         (NHD/16): {} pulls verified ({} elements, {:.1} MiB) in {} rounds of {} requests x 2 \
         ranks over {wall:.1} s: {:.0} pulls/s, {:.1} MiB/s; planning, posting and waiting took \
         {:.1} s of it: {:.0} pulls/s, {:.1} MiB/s there; {} transfers from prepared lists, {} listed; \
         prepared lists steady ({:?} at the end); up to {} transfers in flight; \
         {notes} notifications taken by the peers; peer killed midway: {} pulls reported their \
         blocks, the round done {:?} after the kill; resident memory {} MiB after round 2, {} \
         MiB at the end; setup {setup:?}",
        tally.pulls,
        tally.elements,
        tally.bytes as f64 / (1 << 20) as f64,
        tally.rounds,
        IN_FLIGHT,
        tally.pulls as f64 / wall,
        tally.bytes as f64 / (1 << 20) as f64 / wall,
        tally.pulling.as_secs_f64(),
        tally.pulls as f64 / tally.pulling.as_secs_f64(),
        tally.bytes as f64 / (1 << 20) as f64 / tally.pulling.as_secs_f64(),
        tally.prepared_posts,
        tally.listed_posts,
        prepared,
        tally.max_in_flight,
        tally.affected,
        killed_after.unwrap(),
        rss_early >> 10,
        rss_end >> 10,
    ));
    // Every pull verified or reported.
    assert_eq!(
        tally.pulls + tally.affected,
        tally.rounds * IN_FLIGHT * DECODE_TP
    );
    assert!(tally.rounds >= MIN_ROUNDS);
    // Steady: no more than 64 MiB of growth from round 2 on (caches and plans are reused).
    assert!(
        rss_end < rss_early + (64 << 10),
        "{rss_early} KiB -> {rss_end} KiB"
    );
}

/// After the kill: a new `execute` from the dead peer fails naming its blocks; the peer is
/// removed; it restarts with another order and is refused by name and field.
fn after_kill(
    engines: &mut [NixlEngine],
    locals: &[CacheGroup],
    remotes: &[(Vec<CacheGroup>, Vec<&str>)],
    children: &mut [Peer],
    listener: &std::net::TcpListener,
    known: &mut KnownPeers,
) {
    let (groups, names) = &remotes[VICTIM];
    let seqs = random_request(&mut Rng(7), 0, 64, 16);
    let plan = plan_pull(&locals[0], groups, &seqs).unwrap();
    let err = execute(
        &mut engines[0],
        Plan::Direct(&plan),
        names,
        b"",
        XFER_TIMEOUT,
    )
    .expect_err("a pull from a dead peer succeeded");
    assert_eq!(err.blocks, plan.local_blocks, "{err}");
    for e in engines.iter_mut() {
        e.remove_peer(names[0]).unwrap();
    }
    assert!(
        children[VICTIM].wait(XFER_TIMEOUT).is_some(),
        "killed peer not reaped"
    );
    // The fifth connect: the same engine id, NHD pages now.
    restarted_is_refused(listener, known);
}
