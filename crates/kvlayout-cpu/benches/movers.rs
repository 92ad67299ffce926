//! Throughput of `convert`, `write_kv`, `copy_blocks` and `gather_blocks`, each as a ratio to
//! memcpy of the same number of bytes measured in the same run (2 threads): each of the `REPS`
//! runs of an op is paired with a memcpy pass timed right before it (`bench::paired`); the
//! ratio is the median of the paired ratios.
//!
//! `cargo bench -p kvlayout-cpu --bench movers` prints a markdown table.

#![forbid(unsafe_code)]

use half::bf16;
use kvlayout::KvCacheLayout;
use kvlayout_cpu::bench::{paired, MemcpyBound};
use kvlayout_cpu::{Activations, CpuBackend, HostCache, HostExec, WriteKv};

const REPS: usize = 7;

fn cache(spec: &str) -> HostCache {
    let l: KvCacheLayout = spec.parse().expect("bench spec");
    let mut c = HostCache::new(l).expect("allocation");
    c.fill(1); // touch every page before timing
    c
}

/// A deterministic permutation of 0..n.
fn permutation(n: u64, seed: u64) -> Vec<u64> {
    let mut v: Vec<u64> = (0..n).collect();
    let mut s = seed | 1;
    for i in (1..v.len()).rev() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        v.swap(i, (s % (i as u64 + 1)) as usize);
    }
    v
}

/// Times `op` (moving `bytes`) against memcpy passes of the same bytes and prints its row.
fn row(
    be: &CpuBackend,
    mc: &mut MemcpyBound,
    name: &str,
    bytes: f64,
    target: f64,
    op: impl FnMut(),
) {
    let pool = be.pool();
    let p = paired(REPS, mc.bytes() as f64, || mc.pass(pool), bytes, op);
    println!(
        "| {name} | {:.0} MiB | {:.2} GB/s | {:.2} GB/s | {:.2} | {target:.2} |",
        bytes / (1 << 20) as f64,
        bytes / p.op_median / 1e9,
        p.bound_median / 1e9,
        p.ratio_median
    );
}

/// `convert` NHD <-> HND, f16, 512 MiB.
fn converts(be: &CpuBackend) {
    let blocks = 8192;
    let nhd = cache(&format!("kv B={blocks} N=16 H=8 D=128 dtype=f16 order=NHD"));
    let mut hnd = cache(&format!("kv B={blocks} N=16 H=8 D=128 dtype=f16 order=HND"));
    let bytes = nhd.bytes(0).len() as f64;
    let mut mc = MemcpyBound::new(be.pool(), bytes as usize / be.threads()).expect("memcpy bound");
    row(be, &mut mc, "convert NHD -> HND f16", bytes, 0.9, || {
        be.convert(&nhd.as_ref(), &mut hnd.as_mut())
            .expect("convert")
    });
    let mut nhd2 = cache(&format!("kv B={blocks} N=16 H=8 D=128 dtype=f16 order=NHD"));
    row(be, &mut mc, "convert HND -> NHD f16", bytes, 0.9, || {
        be.convert(&hnd.as_ref(), &mut nhd2.as_mut())
            .expect("convert")
    });
}

/// `write_kv`: 32 sequences x 1024 prefill tokens, bf16 into a bf16 NHD cache (at blocks
/// `perm` gives); returns the cache.
fn write(be: &CpuBackend, perm: &[u64]) -> HostCache {
    let tokens = 32 * 1024;
    let mut c = cache("kv B=4096 N=16 H=8 D=128 dtype=bf16 order=NHD");
    let kv: Vec<bf16> = (0..tokens * 8 * 128)
        .map(|i| bf16::from_f32((i % 97) as f32 * 0.01))
        .collect();
    let slots: Vec<i64> = (0..tokens as u64)
        .map(|t| (perm[(t / 16) as usize] * 16 + t % 16) as i64)
        .collect();
    let w = WriteKv {
        layer: 0,
        key: Activations::Bf16(&kv),
        value: Some(Activations::Bf16(&kv)),
        slot_mapping: &slots,
    };
    let bytes = (tokens * 8 * 256 * 2) as f64;
    let mut mc = MemcpyBound::new(be.pool(), bytes as usize / be.threads()).expect("memcpy bound");
    let name = "write_kv 32x1024 tokens bf16";
    row(be, &mut mc, name, bytes, 0.7, || {
        be.write_kv(&mut c.as_mut(), &w).expect("write_kv")
    });
    c
}

/// `copy_blocks`: 1024 random pairs of 64 KiB blocks within `c`; then `gather_blocks` of them
/// to staging, all heads and half of them.
fn block_moves(be: &CpuBackend, c: &mut HostCache, perm: &[u64]) {
    let pairs: Vec<(u64, u64)> = perm[..1024]
        .iter()
        .zip(&perm[1024..2048])
        .map(|(a, b)| (*a, *b))
        .collect();
    let bytes = (1024 * 65536) as f64;
    let mut mc = MemcpyBound::new(be.pool(), bytes as usize / be.threads()).expect("memcpy bound");
    row(be, &mut mc, "copy_blocks 1024 x 64 KiB", bytes, 0.8, || {
        be.copy_blocks(&mut c.as_mut(), &pairs)
            .expect("copy_blocks")
    });
    let mut staging = cache("kv B=1024 N=16 H=8 D=128 dtype=bf16 order=NHD");
    let chosen: Vec<u64> = perm[..1024].to_vec();
    row(
        be,
        &mut mc,
        "gather_blocks 1024 x 64 KiB",
        bytes,
        0.8,
        || {
            be.gather_blocks(&c.as_ref(), &chosen, 0..8, &mut staging.as_mut())
                .expect("gather")
        },
    );
    let mut staging_hnd = cache("kv B=1024 N=16 H=4 D=128 dtype=bf16 order=HND");
    let name = "gather_blocks heads 4..8 NHD -> HND";
    row(be, &mut mc, name, bytes / 2.0, 0.8, || {
        be.gather_blocks(&c.as_ref(), &chosen, 4..8, &mut staging_hnd.as_mut())
            .expect("gather")
    });
}

fn main() {
    let be = CpuBackend::new(Some(2));
    println!("threads: {}", be.threads());
    println!("| op | bytes | op GB/s | memcpy GB/s (same run) | ratio | target |");
    println!("|---|---|---|---|---|---|");
    converts(&be);
    let perm = permutation(4096, 7);
    let mut c = write(&be, &perm);
    block_moves(&be, &mut c, &perm);
}
