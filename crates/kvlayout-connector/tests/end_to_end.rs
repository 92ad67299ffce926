//! Prefill at TP 1 in one layout, decode at TP 2 in another layout and block size, in one
//! process with the memcpy engine: the prefill side writes KV for two sequences and publishes
//! its handshake; each decode rank decodes it, checks compatibility, plans its pull (direct,
//! or staged with `scatter_blocks` on the reference backend), runs it with `execute` and runs
//! `paged_decode` on its heads. Every output equals, bit for bit, the scalar reference's
//! output computed on the prefill side (the reference accumulates in f64 in token order,
//! whatever the layout).

use kvlayout_connector::engine::{MemcpyEngine, TransferEngine};
use kvlayout_connector::handshake::{Limits, PeerMetadata};

#[path = "shared/scenario.rs"]
mod scenario;

use scenario::{assert_rank_matches, group, p_layout, p_tables, prefill, pull_and_decode};

#[test]
fn prefill_tp1_to_decode_tp2_in_another_layout_and_block_size() {
    prefill_to_both_decode_ranks(false);
}

#[test]
fn prefill_tp1_to_decode_tp2_staged_through_scatter_blocks() {
    prefill_to_both_decode_ranks(true);
}

/// The prefill side publishes; both decode ranks pull (directly or `staged`) and match its
/// reference; the prefill side was told of both reads.
fn prefill_to_both_decode_ranks(staged: bool) {
    let how = if staged { "staged" } else { "direct" };
    let p_layout = p_layout();
    let (p_bytes, p_out) = prefill(&p_layout, &p_tables());
    let p_name = format!("e2e-{how}-prefill");
    let mut p_engine = MemcpyEngine::new(&p_name, p_bytes).unwrap();
    let published = PeerMetadata {
        engine_id: p_name,
        groups: vec![group(&p_layout, 1, 0, p_engine.regions())],
    }
    .encode();
    for rank in 0..2u64 {
        let peer = PeerMetadata::decode(&published, &Limits::default()).unwrap();
        let (remote, id) = (&peer.groups[0], peer.engine_id.as_str());
        let engine = |buffers| {
            let mut e = MemcpyEngine::new(&format!("e2e-{how}-decode-{rank}"), buffers).unwrap();
            e.add_peer(id, id.as_bytes(), &remote.regions).unwrap();
            e
        };
        let out = pull_and_decode(engine, (remote, id), rank, staged, b"done").unwrap();
        assert_rank_matches(&p_out, &out, rank, how);
    }
    let notes = p_engine.notifications().unwrap();
    assert_eq!(notes.len(), 2, "{how}");
    assert!(notes.iter().all(|(_, m)| m == b"done"));
}
