//! Prefill at TP 1 in one layout, decode at TP 2 in another layout and block size, in one
//! process with the memcpy engine: the prefill side writes KV for two sequences and publishes
//! its handshake; each decode rank decodes it, checks compatibility, plans its pull, reads
//! over the engine and runs `paged_decode` on its heads. Every output equals, bit for bit, the
//! scalar reference's output computed on the prefill side (the reference accumulates in f64
//! in token order, whatever the layout).

use std::time::Duration;

use kvlayout::ops::{Backend, BufferShape};
use kvlayout_connector::engine::{wait, MemcpyEngine, TransferEngine};
use kvlayout_connector::handshake::{check_compatible, CacheGroup, Limits, PeerMetadata};
use kvlayout_connector::plan::{plan_pull, Side};
use kvlayout_cpu::Host;

#[path = "shared/scenario.rs"]
mod scenario;

use scenario::{d_layout, d_tables, decode, p_layout, p_tables, prefill, seqs, zeros};
use scenario::{D, HEADS, LENS, Q_PER_KV};

#[test]
fn prefill_tp1_to_decode_tp2_in_another_layout_and_block_size() {
    let (p_layout, d_layout) = (p_layout(), d_layout());
    let (p_tables, d_tables) = (p_tables(), d_tables());
    let (p_bytes, p_out) = prefill(&p_layout, &p_tables);

    let p_engine = MemcpyEngine::new("e2e-prefill", p_bytes).unwrap();
    let published = PeerMetadata {
        engine_id: "e2e-prefill".into(),
        groups: vec![CacheGroup {
            name: "attn".into(),
            layout: p_layout.clone(),
            total_kv_heads: HEADS,
            tp_size: 1,
            tp_rank: 0,
            regions: p_engine.regions(),
        }],
    }
    .encode();

    let seqs = seqs();
    let q_per_rank = HEADS as usize * Q_PER_KV / 2;
    for rank in 0..2u64 {
        let peer = PeerMetadata::decode(&published, &Limits::default()).unwrap();
        let remote = &peer.groups[0];
        let name = format!("e2e-decode-{rank}");
        let mut engine = MemcpyEngine::new(&name, zeros(&d_layout)).unwrap();
        let mine = CacheGroup {
            name: "attn".into(),
            layout: d_layout.clone(),
            total_kv_heads: HEADS,
            tp_size: 2,
            tp_rank: rank,
            regions: engine.regions(),
        };
        check_compatible(&mine, remote).unwrap();
        let plan = plan_pull(&Side::from(&mine), &[Side::from(remote)], &seqs).unwrap();
        engine
            .add_peer(&peer.engine_id, peer.engine_id.as_bytes(), &remote.regions)
            .unwrap();
        for t in &plan.transfers {
            let mut pending = engine.post_read(&peer.engine_id, &t.runs, b"done").unwrap();
            wait(&mut engine, &mut pending, Duration::from_secs(5)).unwrap();
        }
        // Decode this rank's query heads on the received cache.
        let be = Host::reference();
        let mut cache = be
            .alloc_cache(&d_layout, &BufferShape::exact(&d_layout))
            .unwrap();
        be.upload_cache(&mut cache, &engine.buffers()).unwrap();
        let q = rank as usize * q_per_rank..(rank as usize + 1) * q_per_rank;
        let out = decode(&be, &cache, &d_tables, q.clone());
        for s in 0..LENS.len() {
            let per = HEADS as usize * Q_PER_KV * D;
            let want = &p_out[s * per + q.start * D..s * per + q.end * D];
            let got = &out[s * q_per_rank * D..(s + 1) * q_per_rank * D];
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(got), bits(want), "rank {rank} sequence {s}");
        }
    }
    // The prefill side was told of both reads.
    let mut p_engine = p_engine;
    let notes = p_engine.notifications().unwrap();
    assert_eq!(notes.len(), 2);
    assert!(notes.iter().all(|(_, m)| m == b"done"));
}
