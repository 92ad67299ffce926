//! `cargo run --release -p kvlayout-connector --bin connector_bench`: the planner's figures.
//!
//! - Descriptors per transferred block for every preset and a few layout and TP pairs, beside
//!   what vLLM's NIXL connector registers (one descriptor per block, layer and K/V tensor).
//! - Planning time for 100k blocks x 80 layers (Llama-3-70B), target under 100 ms: afresh,
//!   and into a plan reused from the request before, beside the time to write the same number
//!   of runs into fresh and into mapped memory.
//! - The memcpy engine: a planned transfer beside one contiguous region of the same bytes
//!   through the same engine, in the same run (target: at least 0.8 of it).
//!
//! Not a test: figures depend on the machine, which it names.

#![forbid(unsafe_code)]

#[path = "shared/mod.rs"]
#[allow(dead_code)] // `with_runs` is nixl_bench's
mod shared;
use shared::scattered;
#[path = "shared/engine_ratio.rs"]
mod engine_ratio;

use std::time::Instant;

use kvlayout::ops::CopyRun;
use kvlayout::{KvCacheLayout, PRESETS};
use kvlayout_connector::handshake::CacheGroup;
use kvlayout_connector::plan::{plan_pull, plan_pull_into, SeqBlocks, TransferPlan};
use kvlayout_connector::staged::plan_pull_staged;
use kvlayout_connector::{plan_pull_compact, plan_pull_compact_into, CompactPlan};

fn layout(spec: &str) -> KvCacheLayout {
    spec.parse().unwrap_or_else(|e| panic!("{spec}: {e}"))
}

/// Rank `rank` of `tp` holding `layout`, its memory not described (planning only).
fn group(layout: &KvCacheLayout, heads: u64, tp: u64, rank: u64) -> CacheGroup {
    CacheGroup {
        name: "attn".into(),
        layout: layout.clone(),
        total_kv_heads: heads,
        tp_size: tp,
        tp_rank: rank,
        regions: Vec::new(),
    }
}

/// Descriptors per block of pulling 64 scattered blocks from `remote` (TP `tp_r`) into
/// `local` (TP `tp_l`, rank 0): directly, and through a staging cache.
fn per_block(remote: &str, local: &str, heads: u64, tp_r: u64, tp_l: u64) -> Result<f64, String> {
    per_block_both(remote, local, heads, tp_r, tp_l).map(|(d, _)| d)
}

fn per_block_both(
    remote: &str,
    local: &str,
    heads: u64,
    tp_r: u64,
    tp_l: u64,
) -> Result<(f64, f64), String> {
    let (r, l) = (layout(remote), layout(local));
    let blocks = 64u64;
    let tokens = blocks * r.geometry().block_size;
    let seqs = [SeqBlocks {
        remote: scattered(blocks, r.geometry().num_blocks, 3),
        local: scattered(
            tokens.div_ceil(l.geometry().block_size),
            l.geometry().num_blocks,
            5,
        ),
        tokens,
    }];
    let remotes: Vec<CacheGroup> = (0..tp_r).map(|k| group(&r, heads, tp_r, k)).collect();
    let local = group(&l, heads, tp_l, 0);
    let plan = plan_pull(&local, &remotes, &seqs).map_err(|e| e.to_string())?;
    let staged = plan_pull_staged(&local, &remotes, &seqs).map_err(|e| e.to_string())?;
    Ok((
        plan.descriptors() as f64 / blocks as f64,
        staged.descriptors() as f64 / blocks as f64,
    ))
}

fn main() {
    let cpu = shared::cpu_name();
    println!("connector_bench on {cpu}");
    println!("descriptors per transferred block (64 scattered blocks), ours vs vLLM's per block x layer x K/V:");
    for (name, spec, _) in PRESETS {
        let l = layout(spec);
        let g = l.geometry();
        let heads = g.num_kv_heads;
        let c = l.content();
        let tensors = if c.holds_keys_and_values() && !c.shares_latent() {
            2
        } else {
            1
        };
        let vllm = (g.num_layers * tensors) as f64;
        match per_block(spec, spec, heads, 1, 1) {
            Ok(d) => println!("  {name:18} TP1->TP1 same layout: {d:8.2} vs {vllm:5.0}"),
            Err(e) => println!("  {name:18} refused: {e}"),
        }
    }
    let nhd = "kv L=32 B=1024 N=16 H=8 D=128 dtype=bf16 order=NHD";
    let hnd = "kv L=32 B=1024 N=16 H=8 D=128 dtype=bf16 order=HND";
    let blhnc = "kv L=32 B=1024 N=16 H=8 D=128 dtype=bf16 order=BLHNC";
    let hnd4 = "kv L=32 B=1024 N=16 H=4 D=128 dtype=bf16 order=HND";
    let nhd4 = "kv L=32 B=1024 N=16 H=4 D=128 dtype=bf16 order=NHD";
    let hnd32 = "kv L=32 B=512 N=32 H=8 D=128 dtype=bf16 order=HND";
    for (what, r, l, tp_l) in [
        ("llama-3-8b NHD -> HND", nhd, hnd, 1),
        (
            "llama-3-8b BLHNC -> BLHNC (all layers per block)",
            blhnc,
            blhnc,
            1,
        ),
        ("llama-3-8b HND TP1 -> TP2 (head slice)", hnd, hnd4, 2),
        ("llama-3-8b NHD TP1 -> TP2 (head slice)", nhd, nhd4, 2),
        ("llama-3-8b HND block 16 -> block 32", hnd, hnd32, 1),
    ] {
        match per_block_both(r, l, 8, 1, tp_l) {
            Ok((d, st)) => println!("  {what}: {d:.2} direct, {st:.2} staged, vs 64"),
            Err(e) => println!("  {what}: refused: {e}"),
        }
    }
    println!(
        "planning 100k blocks x 80 layers (Llama-3-70B, scattered blocks), target < 100 ms \
         (best of 5; 'into' a plan reused from the request before, whose memory is mapped):"
    );
    for order in ["NHD", "HND", "BLHNC"] {
        let spec = format!("kv L=80 B=131072 N=16 H=8 D=128 dtype=bf16 order={order}");
        let l = layout(&spec);
        let blocks = 100_000u64;
        let seqs = [SeqBlocks {
            remote: scattered(blocks, 131_072, 1),
            local: scattered(blocks, 131_072, 7),
            tokens: blocks * 16,
        }];
        let g = group(&l, 8, 1, 0);
        let remotes = std::slice::from_ref(&g);
        let fresh = best_ms(|| plan_pull(&g, remotes, &seqs).map(drop));
        let mut reused = TransferPlan {
            transfers: Vec::new(),
            local_blocks: Vec::new(),
        };
        let into = best_ms(|| plan_pull_into(&g, remotes, &seqs, &mut reused));
        let set = best_ms(|| plan_pull_compact(&g, remotes, &seqs).map(drop));
        let mut compact = CompactPlan::default();
        let set_into = best_ms(|| plan_pull_compact_into(&g, remotes, &seqs, &mut compact));
        match (fresh, into, set, set_into) {
            (Ok(fresh), Ok(into), Ok(set), Ok(set_into)) => {
                let n = reused.descriptors();
                let (write_fresh, write_warm) = write_floor(n);
                println!(
                    "  {order:6}: flat {fresh:7.1} ms fresh, {into:7.1} ms into; {n} descriptors \
                     ({:.1} per block); writing {n} runs takes {write_fresh:.1} ms into fresh \
                     memory, {write_warm:.1} ms into mapped memory",
                    n as f64 / blocks as f64
                );
                println!(
                    "  {order:6}: run set {set:7.1} ms fresh, {set_into:7.1} ms into; {} \
                     descriptors as {} runs held x {} repetitions; expanded equal to the flat \
                     plan: {}",
                    compact.descriptors(),
                    compact.runs_held(),
                    compact.transfers.first().map_or(0, |t| t.runs.repeat),
                    compact.expand() == reused
                );
            }
            (Err(e), ..) | (_, Err(e), ..) | (.., Err(e), _) | (.., Err(e)) => {
                println!("  {order:6}: refused: {e}")
            }
        }
    }
    println!(
        "memcpy engine: planned transfer vs one region of the same bytes through the same \
         engine, rounds alternating, best of 7 each (targets: NHD->NHD, HND TP1->2 >= 0.8; \
         NHD->HND the better path >= 0.6; NHD TP1->2 >= 0.5):"
    );
    for (what, r, l, tp_l, staged) in [
        ("NHD -> NHD", nhd, nhd, 1, false),
        ("NHD -> HND direct", nhd, hnd, 1, false),
        ("NHD -> HND staged (the wire only)", nhd, hnd, 1, true),
        ("HND TP1 -> TP2", hnd, hnd4, 2, false),
        ("NHD TP1 -> TP2", nhd, nhd4, 2, false),
    ] {
        match engine_ratio::engine_ratio(r, l, tp_l, staged) {
            Ok(f) => println!(
                "  {what}: {:.1} MB, {} descriptors; planned {:.2} GB/s streamed, {:.2} cached; \
                 one region {:.2} streamed, {:.2} memmove; ratio {:.2} (streamed vs streamed), \
                 {:.2} (best vs best)",
                f.bytes as f64 / 1e6,
                f.descriptors,
                f.planned,
                f.planned_cached,
                f.one,
                f.one_cached,
                f.planned / f.one,
                f.planned.max(f.planned_cached) / f.one.max(f.one_cached)
            ),
            Err(e) => println!("  {what}: {e}"),
        }
    }
}

/// The best of 5 runs of `f`, in milliseconds.
fn best_ms<E>(mut f: impl FnMut() -> Result<(), E>) -> Result<f64, E> {
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        f()?;
        best = best.min(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok(best)
}

/// Milliseconds to write `n` runs into a new vector, and into one whose memory is mapped
/// already (best of 5 each): the floor of a plan of `n` runs.
fn write_floor(n: usize) -> (f64, f64) {
    let fill = |v: &mut Vec<CopyRun>| {
        for i in 0..n as u64 {
            v.push(CopyRun {
                src_offset: i << 12,
                dst_offset: i << 13,
                len: 4096,
                src_buffer: 0,
                dst_buffer: 0,
            });
        }
        std::hint::black_box(&v);
    };
    let fresh = best_ms(|| {
        let mut v = Vec::with_capacity(n);
        fill(&mut v);
        Ok::<(), ()>(())
    })
    .unwrap_or(f64::NAN);
    let mut v = Vec::with_capacity(n);
    let warm = best_ms(|| {
        v.clear();
        fill(&mut v);
        Ok::<(), ()>(())
    })
    .unwrap_or(f64::NAN);
    (fresh, warm)
}
