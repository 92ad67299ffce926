//! Two processes on loopback: the prefill peer as a child run of this binary, the end-to-end
//! pull (direct and staged) matched against the reference, and the peer killed mid-transfer.

use std::time::{Duration, Instant};

use kvlayout::KvCacheLayout;
use kvlayout_connector::engine::{wait, EngineError, TransferEngine};
use kvlayout_connector::handshake::{Limits, PeerMetadata};
use kvlayout_connector::nixl::{blocks_written, Hello, NixlEngine};
use kvlayout_connector::plan::SeqBlocks;
use kvlayout_connector::{execute, Plan};

use crate::common::{
    assert_rank_matches, group, nixl_ready, notifications, p_layout, p_tables, pattern, plan_for,
    prefill, pull_and_decode, report, role, zeros, XFER_TIMEOUT,
};
use crate::process::{child_watchdog, connect_parent, listen, recv_frame, send_frame, Peer};

pub(crate) const E2E: &str = "nixl_two_processes_prefill_tp1_to_decode_tp2_match_the_reference";

/// The prefill process: writes its cache, registers it, sends its `Hello` and reference
/// output, and stays until the parent is done, then reports the notifications it got.
pub(crate) fn e2e_prefill_child() {
    child_watchdog();
    let layout = p_layout();
    let (bytes, out) = prefill(&layout, &p_tables());
    let mut engine = NixlEngine::new("nixl-e2e-prefill", bytes).unwrap();
    let hello = Hello {
        peer: PeerMetadata {
            engine_id: engine.name().into(),
            groups: vec![group(&layout, 1, 0, engine.regions())],
        },
        agent_metadata: engine.local_metadata().unwrap(),
    };
    let mut s = connect_parent();
    send_frame(&mut s, &hello.encode());
    let out: Vec<u8> = out.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect();
    send_frame(&mut s, &out);
    let bye = recv_frame(&mut s, 16).unwrap();
    assert_eq!(bye, b"bye");
    let notes = notifications(&mut engine, 2, XFER_TIMEOUT);
    let mut names: Vec<String> = notes
        .iter()
        .map(|(from, m)| format!("{from}:{}", String::from_utf8_lossy(m)))
        .collect();
    names.sort();
    send_frame(&mut s, names.join(",").as_bytes());
}

pub(crate) fn nixl_two_processes_prefill_tp1_to_decode_tp2_match_the_reference() {
    if role().as_deref() == Some("e2e-prefill") {
        return e2e_prefill_child();
    }
    if !nixl_ready() {
        return;
    }
    let start = Instant::now();
    let (listener, port) = listen();
    let mut child = Peer::spawn(E2E, "e2e-prefill", port, &[]);
    let mut s = child.accept(&listener);
    let hello = recv_frame(&mut s, 1 << 20).unwrap();
    let hello = Hello::decode(&hello, &Limits::default()).unwrap();
    let p_out: Vec<f32> = recv_frame(&mut s, 1 << 20)
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_bits(u32::from_le_bytes(b.try_into().unwrap())))
        .collect();
    let remote = &hello.peer.groups[0];
    let peer = hello.peer.engine_id.as_str();
    for rank in 0..2u64 {
        // Rank 0 pulls directly; rank 1 staged, with `scatter_blocks` on the reference backend.
        let (staged, how) = if rank == 1 {
            (true, "staged")
        } else {
            (false, "direct")
        };
        let engine = |buffers| {
            let mut e = NixlEngine::new(&format!("nixl-e2e-decode-{rank}"), buffers).unwrap();
            e.add_peer(peer, &hello.agent_metadata, &remote.regions)
                .unwrap();
            e
        };
        let note = format!("done-{rank}");
        let out = pull_and_decode(engine, (remote, peer), rank, staged, note.as_bytes())
            .unwrap_or_else(|e| panic!("rank {rank}: {e}\n{}", child.output()));
        assert_rank_matches(&p_out, &out, rank, how);
    }
    send_frame(&mut s, b"bye");
    let notes = recv_frame(&mut s, 4096).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&notes),
        "nixl-e2e-decode-0:done-0,nixl-e2e-decode-1:done-1",
        "{}",
        child.output()
    );
    let status = child.wait(XFER_TIMEOUT);
    assert!(
        status.is_some_and(|s| s.success()),
        "prefill child: {status:?}\n{}",
        child.output()
    );
    report(&format!(
        "nixl two processes: TP1 NHD/16 -> TP2 HND/32 padded, rank 0 direct and rank 1 \
         staged, both bit-equal, {:?} in all",
        start.elapsed()
    ));
}

pub(crate) const FAULT: &str = "nixl_peer_killed_mid_transfer_is_an_error_within_the_timeout";

/// The fault test's layouts: large enough that a transfer over UCX's tcp transport takes
/// tens of milliseconds. HND on both sides, TP 1 to TP 2: 8 KiB runs.
pub(crate) fn big_layouts() -> (KvCacheLayout, KvCacheLayout) {
    let p = "kv L=2 B=4096 N=16 H=4 D=128 dtype=bf16 order=HND"
        .parse()
        .unwrap();
    let d = "kv L=2 B=4096 N=16 H=2 D=128 dtype=bf16 order=HND"
        .parse()
        .unwrap();
    (p, d)
}

/// Four sequences of 768 blocks each, mapped to local blocks in reverse order; the local
/// blocks `i % 4 == 1` (a quarter) receive nothing.
pub(crate) fn big_seqs() -> Vec<SeqBlocks> {
    let local: Vec<u64> = (0..4096u64).rev().filter(|b| b % 4 != 1).collect();
    (0..4u64)
        .map(|s| SeqBlocks {
            remote: (s * 1024..s * 1024 + 768).collect(),
            local: local[s as usize * 768..(s as usize + 1) * 768].to_vec(),
            tokens: 768 * 16,
        })
        .collect()
}

/// The prefill peer of the fault test: registers its large cache, sends its `Hello`, and
/// waits (bounded) to be killed.
pub(crate) fn fault_prefill_child() {
    child_watchdog();
    let (p, _) = big_layouts();
    let engine = NixlEngine::new("nixl-fault-prefill", pattern(&p, 9)).unwrap();
    let hello = Hello {
        peer: PeerMetadata {
            engine_id: engine.name().into(),
            groups: vec![group(&p, 1, 0, engine.regions())],
        },
        agent_metadata: engine.local_metadata().unwrap(),
    };
    let mut s = connect_parent();
    send_frame(&mut s, &hello.encode());
    // Until the parent closes the socket or kills this process.
    let _ = recv_frame(&mut s, 16);
}

pub(crate) fn nixl_peer_killed_mid_transfer_is_an_error_within_the_timeout() {
    if role().as_deref() == Some("fault-prefill") {
        return fault_prefill_child();
    }
    if !nixl_ready() {
        return;
    }
    let (listener, port) = listen();
    // UCX's tcp transport on the peer: posts to it are asynchronous (with cma, the default
    // between processes of one host, a post copies before returning).
    let mut child = Peer::spawn(FAULT, "fault-prefill", port, &[("UCX_TLS", "tcp")]);
    let mut s = child.accept(&listener);
    let hello = Hello::decode(&recv_frame(&mut s, 1 << 20).unwrap(), &Limits::default()).unwrap();
    let remote = &hello.peer.groups[0];
    let peer = hello.peer.engine_id.clone();
    let (_, d) = big_layouts();
    let mut engine = NixlEngine::new("nixl-fault-decode-0", zeros(&d)).unwrap();
    let mine = group(&d, 2, 0, engine.regions());
    let plan = plan_for(&mine, remote, &big_seqs());
    let runs = &plan.transfers[0].runs;
    engine
        .add_peer(&peer, &hello.agent_metadata, &remote.regions)
        .unwrap();
    let mapped: Vec<u64> = {
        let mut v: Vec<u64> = big_seqs().iter().flat_map(|s| s.local.clone()).collect();
        v.sort_unstable();
        v
    };

    assert_eq!(plan.local_blocks, mapped);

    // A warm-up transfer completes (the connection is up).
    let start = Instant::now();
    execute(
        &mut engine,
        Plan::Direct(&plan),
        &[&peer],
        b"warm-up",
        XFER_TIMEOUT,
    )
    .unwrap_or_else(|e| panic!("warm-up: {e}\n{}", child.output()));
    report(&format!(
        "nixl fault test: {} runs, {} MiB over tcp in {:?}",
        runs.len(),
        plan.bytes() >> 20,
        start.elapsed()
    ));

    // Timeout: a zero timeout on a transfer in flight; the buffers are locked meanwhile;
    // cancelling it leaves every destination undefined.
    let mut pending = engine.post_read(&peer, runs, b"cancelled").unwrap();
    assert_eq!(
        wait(&mut engine, &mut pending, Duration::ZERO),
        Err(EngineError::Timeout(Duration::ZERO))
    );
    assert_eq!(engine.in_flight(), 1);
    assert!(engine.buffers().is_err());
    assert!(engine.set_buffers(&zeros(&d)).is_err());
    let undefined = engine.cancel(pending);
    assert_eq!(undefined, *runs);
    assert_eq!(engine.in_flight(), 0);

    // The peer killed mid-transfer.
    let mut pending = engine.post_read(&peer, runs, b"killed").unwrap();
    assert!(!engine.poll(&mut pending).unwrap(), "still in flight");
    child.child.kill().unwrap();
    let killed = Instant::now();
    let err = wait(&mut engine, &mut pending, XFER_TIMEOUT).unwrap_err();
    let after = killed.elapsed();
    assert!(matches!(err, EngineError::Transport(_)), "{err}");
    assert!(after < XFER_TIMEOUT);
    // The blocks not received: every local block the transfer was to write.
    let lost = blocks_written(&d, pending.runs()).unwrap();
    assert_eq!(lost, mapped);
    assert_eq!(
        lost.len(),
        3072,
        "a quarter of the local blocks is not mapped"
    );
    assert_eq!(engine.in_flight(), 0);
    // Blocks outside the transfer are intact (never written: zero).
    let received = engine.buffers().unwrap();
    for b in (0..d.geometry().num_blocks).filter(|b| lost.binary_search(b).is_err()) {
        for r in d.block_regions(b, 0..2, 0..2).unwrap() {
            let (o, n) = (r.offset as usize, r.len as usize);
            assert!(
                received[r.buffer as usize][o..o + n]
                    .iter()
                    .all(|&x| x == 0),
                "block {b}"
            );
        }
    }
    // Later plans from the dead peer fail too, without hanging, naming the blocks not
    // received; the peer can be removed.
    let again = Instant::now();
    let second = execute(
        &mut engine,
        Plan::Direct(&plan),
        &[&peer],
        b"",
        XFER_TIMEOUT,
    )
    .expect_err("a transfer from a dead peer succeeded");
    let again = again.elapsed();
    assert_eq!(second.blocks, mapped, "{second}");
    assert_eq!(second.heads.len(), 1, "{second}");
    assert_eq!(second.heads[0], 0..2, "{second}");
    engine.remove_peer(&peer).unwrap();
    assert!(matches!(
        engine.post_read(&peer, runs, b""),
        Err(EngineError::UnknownPeer(_))
    ));
    let status = child.wait(XFER_TIMEOUT);
    assert!(status.is_some(), "killed child not reaped");
    report(&format!(
        "nixl fault test: peer killed mid-transfer -> error after {after:?}: {err}; \
         {} of {} local blocks not received; a new plan failed after {again:?}: {second}",
        lost.len(),
        d.geometry().num_blocks
    ));
}
