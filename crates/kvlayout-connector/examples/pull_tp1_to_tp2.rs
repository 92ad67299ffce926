//! A TP 1 prefill instance with token-major (NHD) pages hands a sequence's KV blocks to the two
//! ranks of a TP 2 decode instance with head-major (HND) pages of twice the block size, in one
//! process, with the memcpy engine. Each decode rank plans the pull (direct, staged, and the
//! one `Auto` picks) and executes it into its own cache, a vector it owns; every element
//! received is checked against the prefill cache through both layouts' offsets.
//!
//! Run: `cargo run -p kvlayout-connector --example pull_tp1_to_tp2`.

use std::error::Error;
use std::time::Duration;

use kvlayout::ops::{Backend, BufferShape};
use kvlayout::{Coord, Field, KvCacheLayout};
use kvlayout_connector::{
    check_compatible, plan, CacheGroup, Limits, MemRegion, MemcpyEngine, NoPostReceive,
    PeerMetadata, PullMode, PullPlan, Region, Scatter, SeqBlocks, TransferEngine,
};
use kvlayout_cpu::Host;

/// The model's KV heads, before TP.
const MODEL_HEADS: u64 = 8;

/// A rank's cache group: its layout, its place in its TP group, its registered regions.
fn group(
    layout: &KvCacheLayout,
    tp_size: u64,
    tp_rank: u64,
    regions: Vec<MemRegion>,
) -> CacheGroup {
    CacheGroup {
        name: "attn".into(),
        layout: layout.clone(),
        total_kv_heads: MODEL_HEADS,
        tp_size,
        tp_rank,
        regions,
    }
}

fn main() -> Result<(), Box<dyn Error>> {
    // The prefill rank holds all 8 heads; each decode rank allocates its own 4 heads densely.
    let prefill: KvCacheLayout = "kv L=2 B=16 N=16 H=8 D=64 dtype=bf16 order=LBNHC".parse()?;
    let decode: KvCacheLayout = "kv L=2 B=8 N=32 H=4 D=64 dtype=bf16 order=LBHNC".parse()?;
    let span = |l: &KvCacheLayout| l.extents()[0].end as usize;
    let prefill_bytes: Vec<u8> = (0..span(&prefill)).map(|i| (i * 7 % 251) as u8).collect();
    let prefill_engine = MemcpyEngine::new("example-prefill", vec![prefill_bytes.clone()])?;

    // The prefill side publishes its handshake; the decode side decodes it under limits.
    let published = PeerMetadata {
        engine_id: "example-prefill".into(),
        groups: vec![group(&prefill, 1, 0, prefill_engine.regions())],
    };
    let peer = PeerMetadata::decode(&published.encode(), &Limits::default())?;
    let (remote, peers) = (&peer.groups[0], [peer.engine_id.as_str()]);
    let engine_md = prefill_engine.local_metadata()?;

    // A 45-token sequence: prefill blocks 5, 9, 2 (16 tokens each) fill decode blocks 3, 6.
    let seq = SeqBlocks {
        remote: vec![5, 9, 2],
        local: vec![3, 6],
        tokens: 45,
    };
    let cpu = Host::cpu("cpu", None);
    let timeout = Duration::from_secs(10);
    for mode in [PullMode::Direct, PullMode::Staged, PullMode::Auto] {
        for rank in 0..2 {
            let mine = group(&decode, 2, rank, Vec::new());
            check_compatible(&mine, remote)?;
            let pull = plan(
                &mine,
                std::slice::from_ref(remote),
                std::slice::from_ref(&seq),
                mode,
            )?;
            let name = format!("example-decode-{rank}-{mode:?}");
            let mut cache = vec![0u8; span(&decode)];
            let regions = match &pull.plan {
                // Every byte straight into the rank's cache, lent to the engine for the pull.
                PullPlan::Direct(_) => vec![Region::host(&mut cache)],
                // Into a staging area in the prefill order first.
                PullPlan::Staged(p) => {
                    vec![Region::owned(vec![0; p.staging_extents()[0] as usize])]
                }
            };
            // The staged pull's post-receive pass: scatter_blocks on the CPU backend.
            let mut target = cpu.alloc_cache(&decode, &BufferShape::exact(&decode))?;
            cpu.upload_cache(&mut target, &[vec![0u8; span(&decode)]])?;
            let mut scatter = Scatter::new(&cpu, &mut target);
            MemcpyEngine::scope(&name, regions, |e| -> Result<(), Box<dyn Error>> {
                e.add_peer(peers[0], &engine_md, &remote.regions)?;
                match pull.plan {
                    PullPlan::Direct(_) => {
                        pull.execute(e, &peers, &mut NoPostReceive, b"", timeout)?
                    }
                    PullPlan::Staged(_) => pull.execute(e, &peers, &mut scatter, b"", timeout)?,
                }
                Ok(())
            })??;
            if let PullPlan::Staged(_) = pull.plan {
                cache = cpu.download_cache(&target)?.remove(0);
            }
            let n = check(&prefill, &prefill_bytes, &decode, &cache, &seq, rank)?;
            println!("rank {rank}, {mode:?}: {pull}; {n} elements equal the prefill's");
        }
    }
    Ok(())
}

/// Checks every element of `seq` in decode rank `rank`'s cache against the prefill cache, each
/// located by its own layout's offsets; returns how many were compared.
fn check(
    prefill: &KvCacheLayout,
    prefill_bytes: &[u8],
    decode: &KvCacheLayout,
    cache: &[u8],
    seq: &SeqBlocks,
    rank: u64,
) -> Result<u64, Box<dyn Error>> {
    let (pn, dn) = (prefill.geometry().block_size, decode.geometry().block_size);
    let heads = decode.geometry().num_kv_heads;
    let elem = decode.dtype().size_bytes() as usize;
    let mut compared = 0;
    for (layer, head, token) in elements(prefill.geometry().num_layers, heads, seq.tokens) {
        for field in [Field::K, Field::V] {
            for dim in 0..decode.field_map(field)?.width {
                let at = |b: u64, n: u64, h: u64| Coord::new(field, layer, b, h, n, dim);
                let src = at(
                    seq.remote[(token / pn) as usize],
                    token % pn,
                    head + rank * heads,
                );
                let dst = at(seq.local[(token / dn) as usize], token % dn, head);
                let (s, d) = (
                    prefill.offset(&src)?.offset as usize,
                    decode.offset(&dst)?.offset as usize,
                );
                if prefill_bytes[s..s + elem] != cache[d..d + elem] {
                    return Err(format!("rank {rank}: {dst:?} differs from {src:?}").into());
                }
                compared += 1;
            }
        }
    }
    Ok(compared)
}

/// Every (layer, head, token) of `layers x heads x tokens`.
fn elements(layers: u64, heads: u64, tokens: u64) -> impl Iterator<Item = (u64, u64, u64)> {
    (0..layers).flat_map(move |l| (0..heads).flat_map(move |h| (0..tokens).map(move |t| (l, h, t))))
}
