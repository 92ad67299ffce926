//! `paged_decode` throughput as a ratio to the memory read bandwidth measured in the same run.
//! 32 sequences, 32 query heads, 8 KV heads, head 128,
//! block 16, context 1024 and 4096, a random block table (a permutation of the blocks), caches
//! `order=NHD`, `order=HND` and (informative) vLLM's legacy layout in f32, bf16 and fp8 e4m3,
//! 2 threads.
//!
//! KV bytes are counted once: tokens x KV heads x (K + V) x element size. The machine is
//! shared and its bandwidth moves by tens of percent within seconds, so each of the `REPS`
//! runs of a configuration is paired with a pass of the read-bandwidth bound
//! (`bench::ReadBound`: a sum over 512 MiB per thread, with AVX-512 loads where the process
//! uses AVX-512; 1 GiB in all, which also evicts the cache from L3) timed right before it. The
//! median ratio is the median of those paired ratios; the best ratio is the fastest decode
//! over the fastest pass (the least disturbed of each).
//!
//! Three informative tables follow. One reads the bound's buffers in chunks taken in a random
//! order (4 KiB to 1 MiB): what the memory gives to pages scattered by a block table, before
//! any compute. One adds compute that does not depend on the data between the bound's loads:
//! how much of the read bandwidth a core keeps while it computes, reading sequentially, and
//! reading in the decode's own order of head-major pages with and without its prefetches
//! (what the memory gives the decode's pattern at a compute density). The last times the decode
//! with its rows in L2 on one thread: what the kernels cost, before any memory, for every
//! kernel build the machine runs (the scalar build aside).
//!
//! The main table also times the same run's peer, a plain C loop built `-O3 -march=native
//! -ffast-math` (`benches/peer/decode_f32.c`) on the f32 caches, and states each ratio against
//! the paged bound too: the decode's own read pattern (head-major pages of random blocks, with
//! its prefetches or without, the faster) with no compute, measured right before each
//! configuration. It heads the tables with the CPU and the features it uses (those
//! `KVLAYOUT_CPU_HIDE` hides named), the kernel build and why that build runs.
//!
//! `cargo bench -p kvlayout-cpu --bench decode` prints all tables (a few minutes);
//! `KVLAYOUT_KERNELS=<build>` runs them on another kernel build; `KVLAYOUT_CPU_HIDE=avx512f`
//! runs them as on a CPU without AVX-512 (the bound's loads, the build picked and the kernel
//! table follow; the C peer, compiled for this CPU, does not).
//! `KVLAYOUT_BENCH_CONTEXTS=64,256` replaces the contexts, `KVLAYOUT_BENCH_ONLY="bf16 HND"`
//! keeps the matching configurations.

#![deny(unsafe_code)]

use kvlayout::KvCacheLayout;
use std::time::Instant;

use kvlayout_cpu::bench::{paired, Paired, ReadBound};
use kvlayout_cpu::{Activations, CpuBackend, Decode, DecodeParams, HostCache, HostExec};

const SEQS: usize = 32;
const Q_HEADS: u64 = 32;
const KV_HEADS: u64 = 8;
const HEAD: usize = 128;
const BLOCK: u64 = 16;
const REPS: usize = 25;
/// Paired passes per chunk size of the informative read-pattern table.
const PATTERN_REPS: usize = 7;

/// xorshift64.
fn next(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// A deterministic permutation of 0..n.
fn permutation(n: usize, seed: u64) -> Vec<i32> {
    let mut v: Vec<i32> = (0..n as i32).collect();
    let mut s = seed | 1;
    for i in (1..n).rev() {
        v.swap(i, (next(&mut s) % (i as u64 + 1)) as usize);
    }
    v
}

/// Fills every buffer with bytes in 0x30..0x3c: each dtype reads finite values of varied
/// magnitude (so the running softmax maximum moves as in real data).
fn fill(cache: &mut HostCache) {
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    let pattern: Vec<u8> = (0..1 << 20)
        .map(|_| 0x30 + (next(&mut s) % 12) as u8)
        .collect();
    for i in 0..cache.layout().num_buffers() {
        for chunk in cache.bytes_mut(i).chunks_mut(pattern.len()) {
            chunk.copy_from_slice(&pattern[..chunk.len()]);
        }
    }
}

/// A cache of `blocks` blocks of the bench's geometry, filled (see [`fill`]).
fn filled_cache(blocks: usize, dtype: &str, order: &str) -> HostCache {
    let place = match order {
        "legacy" => "tensor=vllm-paged-v1".to_string(),
        _ => format!("order={order}"),
    };
    let spec = format!("kv B={blocks} N={BLOCK} H={KV_HEADS} D={HEAD} dtype={dtype} {place}");
    let layout: KvCacheLayout = spec.parse().expect("bench layout");
    let mut cache = HostCache::new(layout).expect("allocation");
    fill(&mut cache);
    cache
}

/// The bench's decode step of layer 0: f32 queries, no window, no soft-cap.
fn decode<'a>(q: &'a [f32], table: &'a [i32], per_seq: usize, lens: &'a [u32]) -> Decode<'a> {
    Decode {
        layer: 0,
        query: Activations::F32(q),
        block_table: table,
        blocks_per_seq: per_seq,
        seq_lens: lens,
        params: DecodeParams {
            num_q_heads: Q_HEADS,
            scale: 1.0 / (HEAD as f32).sqrt(),
            sliding_window: None,
            soft_cap: None,
        },
    }
}

/// The C peer (`benches/peer/decode_f32.c`, built by the crate's build script).
mod peer {
    use kvlayout::KvFieldArgs;

    /// `kvl_peer_step`: one (sequence, KV head) of an f32 cache with its `group` query heads.
    #[repr(C)]
    pub struct Step {
        pub k: KvFieldArgs,
        pub v: KvFieldArgs,
        pub cache: *const u8,
        pub block_table: *const i32,
        pub len: i64,
        pub group: i64,
        pub kv_head: i64,
        pub query: *const f32,
        pub scale: f32,
        pub out: *mut f32,
        pub logits: *mut f32,
    }

    extern "C" {
        pub fn kvl_peer_decode_f32(step: *const Step);
    }
}

/// The C peer's decode step of the bench's f32 cache (one buffer, contiguous rows), one
/// (sequence, KV head) per rayon task. The bench's only `unsafe`: the call into C.
#[allow(unsafe_code)]
fn peer_decode(be: &CpuBackend, cache: &HostCache, d: &Decode<'_>, out: &mut [f32]) {
    use kvlayout::Field;
    use rayon::prelude::*;
    let l = cache.layout();
    let (k, v) = (
        l.kernel_args(Field::K).expect("K"),
        l.kernel_args(Field::V).expect("V"),
    );
    assert!(l.num_buffers() == 1 && k.dim_stride_bytes == 4 && v.dim_stride_bytes == 4);
    let group = (Q_HEADS / KV_HEADS) as usize;
    let bytes = cache.bytes(0);
    let Activations::F32(q) = d.query else {
        panic!("f32 queries")
    };
    be.pool().install(|| {
        out.par_chunks_mut(group * HEAD)
            .enumerate()
            .for_each(|(item, o)| {
                let (seq, head) = (item / KV_HEADS as usize, item % KV_HEADS as usize);
                let len = d.seq_lens[seq] as usize;
                let table =
                    &d.block_table[seq * d.blocks_per_seq..][..len.div_ceil(BLOCK as usize)];
                let mut logits = vec![0f32; group * len];
                let q = &q[item * group * HEAD..][..group * HEAD];
                let step = peer::Step {
                    k,
                    v,
                    cache: bytes.as_ptr(),
                    block_table: table.as_ptr(),
                    len: len as i64,
                    group: group as i64,
                    kv_head: head as i64,
                    query: q.as_ptr(),
                    scale: d.params.scale,
                    out: o.as_mut_ptr(),
                    logits: logits.as_mut_ptr(),
                };
                // SAFETY: the rows the peer reads are K and V rows of blocks of `table` (in
                // the cache, whose layout gave the argument structs) and heads below KV_HEADS;
                // `q`, `o` and `logits` hold `group * HEAD`, `group * HEAD` and `group * len` floats.
                unsafe { peer::kvl_peer_decode_f32(&step) }
            })
    });
}

/// One configuration's measurements.
struct Row {
    name: String,
    context: u32,
    kv_bytes: f64,
    tokens: f64,
    /// The decode's runs against their read passes.
    p: Paired,
    /// The target ratio of the build that ran (none for the informative legacy layout).
    target: Option<f64>,
    /// The paged bound as a fraction of the sequential read, measured right before.
    paged: f64,
}

/// The contexts to run: `KVLAYOUT_BENCH_CONTEXTS=64,256` overrides 1024 and 4096.
fn contexts() -> Vec<u32> {
    std::env::var("KVLAYOUT_BENCH_CONTEXTS")
        .ok()
        .map(|v| v.split(',').filter_map(|c| c.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1024, 4096])
}

/// Whether `KVLAYOUT_BENCH_ONLY="bf16 HND"` (if set) selects this configuration.
fn selected(dtype: &str, order: &str) -> bool {
    std::env::var("KVLAYOUT_BENCH_ONLY").map_or(true, |only| {
        format!("{dtype} {order}").contains(only.as_str())
    })
}

/// The target ratio of a cache of `dtype` on the backend's build: f32 0.80; bf16 0.80 where
/// the build multiplies bf16 operands, 0.65 where it widens to f32; fp8 0.50 and 0.40 alike.
fn target_ratio(be: &CpuBackend, dtype: &str) -> f64 {
    let bf16_products = dtype
        .parse::<kvlayout::DType>()
        .is_ok_and(|d| be.decode_tolerance(d) == kvlayout_cpu::Tolerance::BF16_PRODUCTS);
    match (dtype, bf16_products) {
        ("bf16", true) => 0.80,
        ("bf16", false) => 0.65,
        ("fp8_e4m3", true) => 0.50,
        ("fp8_e4m3", false) => 0.40,
        _ => 0.80,
    }
}

/// One context's decode runs: every dtype and order (`legacy`: vLLM's paged-attention layout,
/// x-split keys and transposed values, informative), and the plain C peer on the f32 caches.
fn run_context(be: &CpuBackend, bound: &ReadBound, q: &[f32], context: u32, rows: &mut Vec<Row>) {
    let mut out = vec![0f32; SEQS * Q_HEADS as usize * HEAD];
    let per_seq = (context as u64).div_ceil(BLOCK) as usize;
    let blocks = SEQS * per_seq;
    let table = permutation(blocks, u64::from(context));
    let lens = vec![context; SEQS];
    for dtype in ["f32", "bf16", "fp8_e4m3"] {
        let target = target_ratio(be, dtype);
        for order in ["NHD", "HND", "legacy"] {
            if !selected(dtype, order) {
                continue;
            }
            let host = filled_cache(blocks, dtype, order);
            let elem = host.layout().dtype().size_bytes() as f64;
            let d = decode(q, &table, per_seq, &lens);
            let cache = host.as_ref();
            let tokens = (SEQS as f64) * f64::from(context);
            let kv_bytes = tokens * KV_HEADS as f64 * 2.0 * HEAD as f64 * elem;
            let paged = bound.paged_fraction(be.pool(), 5);
            let mut row = |name: String, target, op: &mut dyn FnMut()| {
                let p = paired(
                    REPS,
                    bound.bytes() as f64,
                    || bound.pass(be.pool()),
                    kv_bytes,
                    op,
                );
                rows.push(Row {
                    name,
                    context,
                    kv_bytes,
                    tokens,
                    p,
                    target,
                    paged,
                });
            };
            let target = (order != "legacy").then_some(target);
            row(format!("{dtype} {order}"), target, &mut || {
                be.paged_decode(&cache, &d, &mut out).expect("decode")
            });
            // The peer of the same run: the plain C loop on the same f32 cache.
            if dtype == "f32" && order != "legacy" {
                let name = format!("peer: C -O3 -march=native -ffast-math, f32 {order}");
                row(name, None, &mut || peer_decode(be, &host, &d, &mut out));
            }
        }
    }
}

/// Prints the decode rows as a table.
fn print_rows(be: &CpuBackend, rows: &[Row]) {
    println!("cpu: {}", kvlayout_cpu::CpuFeatures::get().describe());
    println!("peer: compiled -march=native for this CPU, whatever KVLAYOUT_CPU_HIDE hides");
    println!("threads: {}", be.threads());
    println!("kernels: {} ({})", be.kernel_build(), be.kernel_choice());
    println!(
        "| cache | context | KV GB/s best | KV GB/s median | M ctx-tok/s best | read GB/s \
         | ratio best | ratio median | paged bound | ratio to the paged bound | target |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        println!(
            "| {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {} |",
            r.name,
            r.context,
            r.kv_bytes / r.p.op_best / 1e9,
            r.kv_bytes / r.p.op_median / 1e9,
            r.tokens / r.p.op_best / 1e6,
            r.p.bound_median / 1e9,
            r.p.ratio_best,
            r.p.ratio_median,
            r.paged,
            r.p.ratio_median / r.paged,
            r.target.map_or("-".to_string(), |t| format!("{t:.2}")),
        );
    }
}

/// Informative: the same read, chunk by chunk in a random order, as a block table scatters
/// pages (bf16, 8 heads x 128, block 16: 4 KiB per head-major (block, head) page of K and V,
/// 64 KiB per block of all heads). Each chunked pass is paired with a sequential one right
/// before it; medians of the paired ratios. Returns the sequential read's median, bytes/s.
fn read_patterns(be: &CpuBackend, bound: &ReadBound) -> f64 {
    println!();
    println!("| read pattern | GB/s median | ratio to the sequential read (median) |");
    println!("|---|---|---|");
    let mut sequential = vec![];
    for chunk in [4 << 10, 16 << 10, 64 << 10, 1 << 20] {
        let (mut secs, mut ratios) = (vec![], vec![]);
        for _ in 0..PATTERN_REPS {
            let seq = bound.pass(be.pool());
            sequential.push(seq);
            let t = bound.chunked_pass(be.pool(), chunk);
            ratios.push(seq / t);
            secs.push(t);
        }
        secs.sort_by(f64::total_cmp);
        ratios.sort_by(f64::total_cmp);
        println!(
            "| random {} KiB chunks | {:.2} | {:.2} |",
            chunk >> 10,
            bound.bytes() as f64 / secs[PATTERN_REPS / 2] / 1e9,
            ratios[PATTERN_REPS / 2],
        );
    }
    sequential.sort_by(f64::total_cmp);
    bound.bytes() as f64 / sequential[sequential.len() / 2]
}

fn main() {
    let be = CpuBackend::new(Some(2));
    let q: Vec<f32> = (0..SEQS * Q_HEADS as usize * HEAD)
        .map(|i| ((i % 113) as f32 - 56.0) / 64.0)
        .collect();
    let bound = ReadBound::new(be.pool(), 512 << 20).expect("read bound");
    bound.pass(be.pool()); // first touch
    let mut rows = Vec::new();
    for context in contexts() {
        run_context(&be, &bound, &q, context, &mut rows);
    }
    print_rows(&be, &rows);
    let read_bw = read_patterns(&be, &bound);
    overlap(&be, &bound);
    kernel_costs(read_bw);
}

/// Informative: the bound's read with compute between the loads that does not depend on them
/// (`ReadBound::compute_pass`), against the same compute alone (its data in L2). Were compute
/// and memory overlapped, the read with compute would run at the slower of the read alone
/// (1.0) and the compute alone; were they serialized, at the inverse of the sum of inverses.
/// The last two columns read the same bytes with the same compute in the decode's order of a
/// head-major bf16 cache, without and with its prefetches (`ReadBound::paged_pass`): what
/// the memory gives the decode's read pattern at that compute density, before its kernels.
fn overlap(be: &CpuBackend, bound: &ReadBound) {
    println!();
    println!(
        "| FMAs per 256 bytes read | compute alone | read + compute | if overlapped \
         | if serialized | pages + compute | pages + compute, prefetched |"
    );
    println!("|---|---|---|---|---|---|---|");
    // Rounds of 16 FMAs (16 lanes each) per 256 bytes: 0 to 4 FMAs per 16 bytes. The bf16
    // kernels' 64 FMAs per token x KV head (512 bytes) are 32 per 256 bytes; their compute
    // alone (the last table) is what to compare.
    for rounds in [0usize, 1, 2, 3, 4] {
        // Each pass timed right after a sequential pass; the median of the paired ratios.
        let mut runs: [Vec<f64>; 4] = Default::default();
        for _ in 0..PATTERN_REPS {
            let passes: [&dyn Fn() -> f64; 4] = [
                &|| bound.compute_pass(be.pool(), rounds, true),
                &|| bound.compute_pass(be.pool(), rounds, false),
                &|| bound.paged_pass(be.pool(), rounds, false),
                &|| bound.paged_pass(be.pool(), rounds, true),
            ];
            for (ratios, pass) in runs.iter_mut().zip(passes) {
                let seq = bound.pass(be.pool());
                ratios.push(seq / pass());
            }
        }
        let [a, b, c, d] = runs.map(|mut v| {
            v.sort_by(f64::total_cmp);
            v[PATTERN_REPS / 2]
        });
        println!(
            "| {} | {a:.2} | {b:.2} | {:.2} | {:.2} | {c:.2} | {d:.2} |",
            16 * rounds,
            a.min(1.0),
            1.0 / (1.0 + 1.0 / a)
        );
    }
}

/// Informative: the decode with its rows in L2 (one sequence of 128 tokens: 128 to 512 KiB of
/// KV), one thread, run on the pool's own thread (no hand-off per call), the fastest of a few
/// runs: what the kernels cost per token x KV head, and the most two such cores could read, as
/// a fraction of the read bandwidth `read_bw` (bytes/s) measured above, were memory free.
fn kernel_costs(read_bw: f64) {
    const CONTEXT: u32 = 128;
    const ITERS: usize = 400;
    const RUNS: usize = 7;
    let blocks = CONTEXT as usize / BLOCK as usize;
    let table: Vec<i32> = (0..blocks as i32).collect();
    let lens = [CONTEXT];
    let q: Vec<f32> = (0..Q_HEADS as usize * HEAD)
        .map(|i| ((i % 113) as f32 - 56.0) / 64.0)
        .collect();
    let mut out = vec![0f32; q.len()];
    println!();
    println!(
        "| kernels, rows in L2 | ns per token x KV head | 2 cores, as a fraction of the read bandwidth |"
    );
    println!("|---|---|---|");
    // Every kernel build this machine runs, the one the backend picks first.
    for build in CpuBackend::kernel_builds() {
        if build == "scalar" {
            continue;
        }
        let one = CpuBackend::with_kernels(Some(1), build).expect("a build this machine runs");
        for dtype in ["f32", "bf16", "fp8_e4m3"] {
            // `legacy`: vLLM's paged-attention layout (x-split keys, transposed values),
            // informative (the targets are for the standardized orders).
            for order in ["NHD", "HND", "legacy"] {
                let cache = filled_cache(blocks, dtype, order);
                let row_bytes = 2.0 * HEAD as f64 * cache.layout().dtype().size_bytes() as f64;
                let d = decode(&q, &table, blocks, &lens);
                let cache = cache.as_ref();
                // The least disturbed of `RUNS` runs: the kernels' own cost.
                let secs = one.pool().install(|| {
                    one.paged_decode(&cache, &d, &mut out).expect("decode");
                    (0..RUNS)
                        .map(|_| {
                            let t = Instant::now();
                            for _ in 0..ITERS {
                                one.paged_decode(&cache, &d, &mut out).expect("decode");
                            }
                            t.elapsed().as_secs_f64()
                        })
                        .fold(f64::INFINITY, f64::min)
                });
                let ns = secs * 1e9 / ITERS as f64 / (f64::from(CONTEXT) * KV_HEADS as f64);
                println!(
                    "| {build}: {dtype} {order} | {ns:.1} | {:.2} |",
                    2.0 * row_bytes / ns / (read_bw / 1e9)
                );
            }
        }
    }
}
