//! In one process: READs and WRITEs of a plan's runs against the memcpy engine, runs outside
//! registered memory, hostile agent metadata.

use std::time::Instant;

use kvlayout::ops::CopyRun;
use kvlayout_connector::engine::{wait, EngineError, TransferEngine};
use kvlayout_connector::executor::Cause;
use kvlayout_connector::handshake::{CacheGroup, HandshakeError, Limits, MemRegion, PeerMetadata};
use kvlayout_connector::nixl::{blocks_written, NixlEngine, XferKind};
use kvlayout_connector::{execute, Plan};

use crate::common::{
    d_layout, group, memcpy_read, nixl_ready, notifications, p_layout, pattern, plan_for, report,
    seqs, zeros, XFER_TIMEOUT,
};

/// A prefill engine (TP 1, NHD) holding `pattern` bytes, its handshake group, and the two
/// decode ranks' groups with zeroed engines.
struct Pair {
    prefill: NixlEngine,
    p_group: CacheGroup,
    decode: Vec<(NixlEngine, CacheGroup)>,
}

fn pair(tag: &str) -> Pair {
    let (p, d) = (p_layout(), d_layout());
    let prefill = NixlEngine::new(&format!("{tag}-prefill"), pattern(&p, 5)).unwrap();
    let p_group = group(&p, 1, 0, prefill.regions());
    let decode = (0..2)
        .map(|rank| {
            let e = NixlEngine::new(&format!("{tag}-decode-{rank}"), zeros(&d)).unwrap();
            let g = group(&d, 2, rank, e.regions());
            (e, g)
        })
        .collect();
    Pair {
        prefill,
        p_group,
        decode,
    }
}

pub(crate) fn nixl_read_of_a_plan_lands_where_memcpy_puts_it_with_notifications() {
    if !nixl_ready() {
        return;
    }
    let Pair {
        mut prefill,
        p_group,
        decode,
    } = pair("nixl-read");
    let p_md = prefill.local_metadata().unwrap();
    for (rank, (mut engine, mine)) in decode.into_iter().enumerate() {
        let plan = plan_for(&mine, &p_group, &seqs());
        assert_eq!(plan.transfers.len(), 1);
        let runs = &plan.transfers[0].runs;
        assert!(runs.len() > 1, "a plan of several runs");
        let name = prefill.name().to_string();
        engine.add_peer(&name, &p_md, &p_group.regions).unwrap();
        let start = Instant::now();
        let note = format!("read-{rank}");
        let plan_run = Plan::Direct(&plan);
        execute(
            &mut engine,
            plan_run,
            &[&name],
            note.as_bytes(),
            XFER_TIMEOUT,
        )
        .unwrap();
        let took = start.elapsed();
        let want = memcpy_read(
            &format!("nixl-read-{rank}"),
            prefill.buffers().unwrap(),
            zeros(&d_layout()),
            &plan,
        );
        let got = engine.buffers().unwrap();
        assert!(got == want, "rank {rank}: NIXL and memcpy differ");
        assert!(got.iter().flatten().any(|&b| b != 0));
        // The blocks a failure would leave undefined: the sequences' local blocks, as the
        // plan states them.
        assert_eq!(blocks_written(&d_layout(), runs).unwrap(), vec![2, 5, 6]);
        assert_eq!(plan.local_blocks, vec![2, 5, 6]);
        let notes = notifications(&mut prefill, 1, XFER_TIMEOUT);
        assert_eq!(
            notes,
            vec![(
                engine.name().to_string(),
                format!("read-{rank}").into_bytes()
            )]
        );
        report(&format!(
            "nixl read rank {rank}: {} runs, {} bytes in {took:?}",
            runs.len(),
            plan.bytes()
        ));
    }
}

pub(crate) fn nixl_write_of_a_plan_lands_where_memcpy_puts_it_with_a_notification() {
    if !nixl_ready() {
        return;
    }
    let Pair {
        mut prefill,
        p_group,
        decode,
    } = pair("nixl-write");
    for (rank, (mut engine, mine)) in decode.into_iter().enumerate() {
        // The decode rank's pull plan, pushed by the prefill side: `src_*` are the prefill's
        // (local to the writer), `dst_*` the decode rank's.
        let plan = plan_for(&mine, &p_group, &seqs());
        let runs = &plan.transfers[0].runs;
        let name = engine.name().to_string();
        prefill
            .add_peer(&name, &engine.local_metadata().unwrap(), &mine.regions)
            .unwrap();
        let mut pending = prefill.post_write(&name, runs, b"kv-ready").unwrap();
        assert_eq!(pending.kind(), XferKind::Write);
        wait(&mut prefill, &mut pending, XFER_TIMEOUT).unwrap();
        // The notification says the data is in place.
        let notes = notifications(&mut engine, 1, XFER_TIMEOUT);
        assert_eq!(
            notes,
            vec![(prefill.name().to_string(), b"kv-ready".to_vec())]
        );
        let want = memcpy_read(
            &format!("nixl-write-{rank}"),
            prefill.buffers().unwrap(),
            zeros(&d_layout()),
            &plan,
        );
        assert!(engine.buffers().unwrap() == want, "rank {rank}");
        // Nothing to move: the notification alone.
        let mut empty = prefill.post_write(&name, &[], b"nothing").unwrap();
        assert!(prefill.poll(&mut empty).unwrap());
        let notes = notifications(&mut engine, 1, XFER_TIMEOUT);
        assert_eq!(
            notes,
            vec![(prefill.name().to_string(), b"nothing".to_vec())]
        );
    }
}

pub(crate) fn nixl_runs_outside_registered_memory_are_refused_before_posting() {
    if !nixl_ready() {
        return;
    }
    let Pair {
        prefill,
        p_group,
        mut decode,
    } = pair("nixl-bounds");
    let (mut engine, mine) = decode.remove(0);
    let peer = prefill.name().to_string();
    let run = CopyRun {
        src_buffer: 0,
        src_offset: 0,
        dst_buffer: 0,
        dst_offset: 0,
        len: 64,
    };
    // Not yet a peer.
    assert_eq!(
        engine.post_read(&peer, &[run], b"").unwrap_err(),
        EngineError::UnknownPeer(peer.clone())
    );
    engine
        .add_peer(&peer, &prefill.local_metadata().unwrap(), &p_group.regions)
        .unwrap();
    let (p_len, d_len) = (p_group.regions[0].len, mine.regions[0].len);
    // Past the source's region, past the destination's, no such buffer on either side, an
    // overflowing end; `src_len`/`dst_len` are the registered lengths of each side.
    let bad = |src_len: u64, dst_len: u64| {
        [
            CopyRun {
                src_offset: src_len - 8,
                ..run
            },
            CopyRun {
                dst_offset: dst_len - 8,
                ..run
            },
            CopyRun {
                src_buffer: 9,
                ..run
            },
            CopyRun {
                dst_buffer: 9,
                ..run
            },
            CopyRun {
                src_offset: u64::MAX - 8,
                ..run
            },
        ]
    };
    // A read's source is the peer; a write's source is local.
    for (r, side) in bad(p_len, d_len)
        .into_iter()
        .zip([&*peer, "local", &*peer, "local", &*peer])
    {
        match engine.post_read(&peer, &[run, r], b"") {
            Err(EngineError::OutOfRegion { side: s, .. }) => assert_eq!(s, side, "{r:?}"),
            other => panic!("read {r:?}: {other:?}"),
        }
    }
    for (r, side) in bad(d_len, p_len)
        .into_iter()
        .zip(["local", &*peer, "local", &*peer, "local"])
    {
        match engine.post_write(&peer, &[run, r], b"") {
            Err(EngineError::OutOfRegion { side: s, .. }) => assert_eq!(s, side, "{r:?}"),
            other => panic!("write {r:?}: {other:?}"),
        }
    }
    assert_eq!(engine.in_flight(), 0);

    // A decode rank that registered buffers too small for its layout: the plan's runs are
    // refused on the local side before posting.
    let d = d_layout();
    let small: Vec<Vec<u8>> = d
        .extents()
        .iter()
        .map(|x| vec![0; x.end as usize / 2])
        .collect();
    let mut short = NixlEngine::new("nixl-bounds-short", small).unwrap();
    let plan = plan_for(&mine, &p_group, &seqs());
    short
        .add_peer(&peer, &prefill.local_metadata().unwrap(), &p_group.regions)
        .unwrap();
    let err = execute(&mut short, Plan::Direct(&plan), &[&peer], b"", XFER_TIMEOUT).unwrap_err();
    match &*err.cause {
        Cause::Engine {
            rank: 0,
            error: EngineError::OutOfRegion { side, .. },
        } => assert_eq!(side, "local"),
        other => panic!("{other:?}"),
    }
    assert_eq!(err.blocks, vec![2, 5, 6], "{err}");
    assert_eq!(short.in_flight(), 0);
    // And its handshake, published with those regions, does not decode.
    let published = PeerMetadata {
        engine_id: "nixl-bounds-short".into(),
        groups: vec![group(&d, 2, 0, short.regions())],
    }
    .encode();
    assert!(matches!(
        PeerMetadata::decode(&published, &Limits::default()),
        Err(HandshakeError::RegionTooSmall { .. })
    ));
}

pub(crate) fn nixl_hostile_agent_metadata_is_refused() {
    if !nixl_ready() {
        return;
    }
    let mut a = NixlEngine::new("nixl-md-a", vec![vec![1; 4096]]).unwrap();
    let b = NixlEngine::new("nixl-md-b", vec![vec![2; 4096]]).unwrap();
    let md = b.local_metadata().unwrap();
    let regions = b.regions();
    let refused = |a: &mut NixlEngine, name: &str, md: &[u8], what: &str| match a
        .add_peer(name, md, &regions)
    {
        Err(EngineError::Transport(why)) => report(&format!("nixl md {what}: {why}")),
        other => panic!("{what}: {other:?}"),
    };
    refused(&mut a, "nixl-md-b", &[], "empty");
    refused(&mut a, "nixl-md-b", &md[..md.len() / 2], "truncated");
    refused(
        &mut a,
        "nixl-md-b",
        &md[..16.min(md.len())],
        "truncated to 16 bytes",
    );
    refused(&mut a, "nixl-md-b", &[0xA5; 300], "garbage");
    // Metadata of another agent than the name given, and an engine's own.
    refused(&mut a, "nixl-md-c", &md, "another agent's");
    let own = a.local_metadata().unwrap();
    refused(&mut a, "nixl-md-a", &own, "its own");
    // A region that wraps the address space.
    let wrap = [MemRegion::host(u64::MAX - 10, 100)];
    assert!(matches!(
        a.add_peer("nixl-md-b", &md, &wrap),
        Err(EngineError::Transport(_))
    ));
    // The real metadata still loads, and a transfer works after all that.
    a.add_peer("nixl-md-b", &md, &regions).unwrap();
    let run = CopyRun {
        src_buffer: 0,
        src_offset: 100,
        dst_buffer: 0,
        dst_offset: 200,
        len: 1000,
    };
    let mut p = a.post_read("nixl-md-b", &[run], b"").unwrap();
    assert_eq!(p.kind(), XferKind::Read);
    assert_eq!(p.bytes(), 1000);
    wait(&mut a, &mut p, XFER_TIMEOUT).unwrap();
    let got = a.buffers().unwrap();
    assert!(got[0][200..1200].iter().all(|&x| x == 2));
    assert!(got[0][..200].iter().chain(&got[0][1200..]).all(|&x| x == 1));
    // A peer claiming more than it registered: a run inside the claim but past the
    // registration passes the handshake's bounds, and NIXL refuses it against what the
    // peer's agent metadata registered. So does a claim at another address.
    let past = CopyRun {
        src_offset: 4096,
        len: 64,
        ..run
    };
    for (what, claim) in [
        ("longer", regions[0].len * 2, regions[0].base),
        ("elsewhere", regions[0].len, regions[0].base + (1 << 30)),
    ]
    .map(|(w, len, base)| (w, [MemRegion::host(base, len)]))
    {
        a.add_peer("nixl-md-b", &md, &claim).unwrap();
        let r = if what == "longer" { past } else { run };
        match a.post_read("nixl-md-b", &[r], b"") {
            Err(EngineError::Transport(why)) => {
                assert!(why.contains("create_xfer_req"), "{why}");
                report(&format!(
                    "nixl region claimed {what} than registered: {why}"
                ));
            }
            other => panic!("{what}: {other:?}"),
        }
    }
    assert_eq!(a.in_flight(), 0);
}
