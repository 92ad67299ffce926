//! The memcpy engine executes a compact plan ([`RunSet`]) directly, and so does `execute`
//! (`Plan::Compact`): every element lands
//! where the local layout puts it, compared through both layouts' address maps; a set whose
//! last repetition leaves a buffer is refused before anything moves, naming the run.

use std::time::Duration;

use kvlayout::{Coord, KvCacheLayout};
use kvlayout_connector::engine::{wait, EngineError, MemcpyEngine, TransferEngine};
use kvlayout_connector::handshake::CacheGroup;
use kvlayout_connector::plan::SeqBlocks;
use kvlayout_connector::{execute, plan_pull_compact, CopyRun, Plan, RunSet};

fn group(layout: &KvCacheLayout) -> CacheGroup {
    CacheGroup {
        name: "attn".into(),
        layout: layout.clone(),
        total_kv_heads: 4,
        tp_size: 1,
        tp_rank: 0,
        regions: Vec::new(),
    }
}

fn fill(l: &KvCacheLayout, seed: u8) -> Vec<Vec<u8>> {
    l.extents()
        .iter()
        .map(|x| {
            (0..x.end)
                .map(|i| (i as u8).wrapping_mul(31) ^ seed)
                .collect()
        })
        .collect()
}

fn elem(bufs: &[Vec<u8>], l: &KvCacheLayout, c: &Coord) -> Vec<u8> {
    let at = l.offset(c).unwrap();
    let size = l.field_map(c.field).unwrap().elem_bytes() as usize;
    bufs[at.buffer as usize][at.offset as usize..][..size].to_vec()
}

#[test]
fn the_memcpy_engine_copies_a_run_set_to_every_element_s_place() {
    // Per-layer pages on both sides, padded locally; blocks scattered: one run per block,
    // repeated per layer.
    let remote: KvCacheLayout = "kv L=3 B=5 N=16 H=4 D=8 dtype=f16 order=NHD"
        .parse()
        .unwrap();
    let local: KvCacheLayout = "kv L=3 B=6 N=16 H=4 D=8 dtype=f16 order=NHD page=4096"
        .parse()
        .unwrap();
    let seqs = [SeqBlocks {
        remote: vec![4, 0, 2],
        local: vec![1, 5, 2],
        tokens: 40,
    }];
    let plan = plan_pull_compact(&group(&local), &[group(&remote)], &seqs).unwrap();
    let set = &plan.transfers[0].runs;
    assert_eq!((set.runs.len(), set.repeat), (3, 3));
    let (rb, lb) = (fill(&remote, 1), fill(&local, 2));
    let src = MemcpyEngine::new("run-set-src", rb.clone()).unwrap();
    let mut dst = MemcpyEngine::new("run-set-dst", lb).unwrap();
    dst.add_peer(src.name(), src.name().as_bytes(), &src.regions())
        .unwrap();
    let mut p = dst.post_read_set(src.name(), set, b"done").unwrap();
    wait(&mut dst, &mut p, Duration::from_secs(5)).unwrap();
    assert_eq!(p.bytes, set.bytes());
    let got = dst.buffers().unwrap();
    for (i, (&r, &l)) in seqs[0].remote.iter().zip(&seqs[0].local).enumerate() {
        let slots = (40 - 16 * i as u64).min(16);
        for (layer, head, slot) in
            (0..3).flat_map(|a| (0..4).flat_map(move |b| (0..slots).map(move |c| (a, b, c))))
        {
            for f in local.stored_fields() {
                for dim in 0..f.width {
                    let c = |block| Coord {
                        layer,
                        block,
                        head,
                        slot,
                        field: f.field,
                        dim,
                    };
                    assert_eq!(elem(&got, &local, &c(l)), elem(&rb, &remote, &c(r)));
                }
            }
        }
    }
    // `execute` runs the compact plan the same way.
    let mut via_execute = MemcpyEngine::new("run-set-execute", fill(&local, 2)).unwrap();
    via_execute
        .add_peer(src.name(), src.name().as_bytes(), &src.regions())
        .unwrap();
    let timeout = Duration::from_secs(5);
    execute(
        &mut via_execute,
        Plan::Compact(&plan),
        &[src.name()],
        b"",
        timeout,
    )
    .unwrap();
    assert_eq!(via_execute.buffers().unwrap(), got);
    // A set one repetition too long leaves the remote buffer: refused, nothing moves.
    let before = dst.buffers().unwrap();
    let mut long = set.clone();
    long.repeat += 3;
    let e = dst.post_read_set(src.name(), &long, b"").unwrap_err();
    assert!(matches!(e, EngineError::OutOfRegion { .. }), "{e}");
    assert_eq!(dst.buffers().unwrap(), before);
    // A step that wraps the address space is refused too, not a panic.
    let wrap = RunSet {
        runs: vec![CopyRun {
            src_offset: 0,
            dst_offset: 0,
            len: 8,
            src_buffer: 0,
            dst_buffer: 0,
        }],
        repeat: 3,
        src_step: u64::MAX / 2,
        dst_step: 0,
    };
    let e = dst.post_read_set(src.name(), &wrap, b"").unwrap_err();
    assert!(matches!(e, EngineError::OutOfRegion { .. }), "{e}");
}
