//! `paged_decode` throughput as a ratio to the memory read bandwidth measured in the same run.
//! Configuration of `shared/baselines.md`: 32 sequences, 32 query heads, 8 KV heads, head 128,
//! block 16, context 1024 and 4096, random block table, 2 threads.
//!
//! `cargo bench -p kvlayout-cpu --bench decode` prints a markdown table.

use kvlayout::KvCacheLayout;
use kvlayout_cpu::bench::{median_secs, read_bandwidth};
use kvlayout_cpu::{Activations, CpuBackend, Decode, DecodeParams, HostCache};

const SEQS: usize = 32;
const Q_HEADS: u64 = 32;
const KV_HEADS: u64 = 8;
const HEAD: usize = 128;
const BLOCK: u64 = 16;

/// A deterministic permutation of 0..n.
fn permutation(n: usize, seed: u64) -> Vec<i32> {
    let mut v: Vec<i32> = (0..n as i32).collect();
    let mut s = seed | 1;
    for i in (1..n).rev() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        v.swap(i, (s % (i as u64 + 1)) as usize);
    }
    v
}

fn main() {
    let be = CpuBackend::new(Some(2));
    let read_bw = read_bandwidth(be.pool(), 256 << 20, 5);
    println!(
        "threads: {}, read bandwidth (same run): {:.2} GB/s",
        be.threads(),
        read_bw / 1e9
    );
    println!("| cache | context | KV GB/s | M ctx-tok/s | ratio to read bw | target |");
    println!("|---|---|---|---|---|---|");
    let q: Vec<f32> = (0..SEQS * Q_HEADS as usize * HEAD)
        .map(|i| ((i % 113) as f32 - 56.0) / 64.0)
        .collect();
    let mut out = vec![0f32; SEQS * Q_HEADS as usize * HEAD];
    for context in [1024u32, 4096] {
        let per_seq = (context as u64).div_ceil(BLOCK) as usize;
        let blocks = SEQS * per_seq;
        let table = permutation(blocks, u64::from(context));
        let lens = vec![context; SEQS];
        for (dtype, order, target) in [
            ("f32", "NHD", 0.8),
            ("f32", "HND", 0.8),
            ("bf16", "NHD", 0.8),
            ("bf16", "HND", 0.8),
            ("fp8_e4m3", "NHD", 0.5),
        ] {
            let spec = format!(
                "kv B={blocks} N={BLOCK} H={KV_HEADS} D={HEAD} dtype={dtype} order={order}"
            );
            let layout: KvCacheLayout = spec.parse().expect("bench layout");
            let elem = layout.dtype().size_bytes() as f64;
            let mut cache = HostCache::new(layout).expect("allocation");
            cache.fill(0x3c); // finite values in every dtype
            let d = Decode {
                layer: 0,
                query: Activations::F32(&q),
                block_table: &table,
                blocks_per_seq: per_seq,
                seq_lens: &lens,
                params: DecodeParams {
                    num_q_heads: Q_HEADS,
                    scale: 1.0 / (HEAD as f32).sqrt(),
                    sliding_window: None,
                    soft_cap: None,
                },
            };
            let secs = median_secs(7, || {
                be.paged_decode(&cache.as_ref(), &d, &mut out)
                    .expect("decode")
            });
            let tokens = (SEQS as f64) * f64::from(context);
            let kv_bytes = tokens * KV_HEADS as f64 * 2.0 * HEAD as f64 * elem;
            let bw = kv_bytes / secs;
            println!(
                "| {dtype} {order} | {context} | {:.2} | {:.2} | {:.2} | {target:.2} |",
                bw / 1e9,
                tokens / secs / 1e6,
                bw / read_bw
            );
        }
    }
}
