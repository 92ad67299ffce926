use kvlayout::KvCacheLayout;
use kvlayout_cpu::{Activations, CpuBackend, Decode, DecodeParams, HostCache};
use std::time::Instant;
fn env<T: std::str::FromStr>(k: &str, d: T) -> T {
    std::env::var(k)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(d)
}
fn main() {
    let dtype: String = env("DT", "bf16".to_string());
    let order: String = env("ORD", "HND".to_string());
    let ctx: u32 = env("CTX", 128);
    let seqs: usize = env("SEQS", 1);
    let threads: usize = env("TH", 1);
    let secs: f64 = env("SECS", 3.0);
    let per_seq = ctx as usize / 16;
    let blocks = per_seq * seqs;
    let place: String = env("PLACE", format!("order={order}"));
    let spec = format!("kv B={blocks} N=16 H=8 D=128 dtype={dtype} {place}");
    let layout: KvCacheLayout = spec.parse().unwrap();
    let mut cache = HostCache::new(layout).unwrap();
    let mut s = 0x9E3779B97F4A7C15u64;
    for i in 0..cache.layout().num_buffers() {
        for b in cache.bytes_mut(i).iter_mut() {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            *b = 0x30 + (s % 12) as u8;
        }
    }
    let mut table: Vec<i32> = (0..blocks as i32).collect();
    for i in (1..blocks).rev() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        table.swap(i, (s % (i as u64 + 1)) as usize);
    }
    let lens = vec![ctx; seqs];
    let q: Vec<f32> = (0..seqs * 32 * 128)
        .map(|i| ((i % 113) as f32 - 56.0) / 64.0)
        .collect();
    let mut out = vec![0f32; q.len()];
    let d = Decode {
        layer: 0,
        query: Activations::F32(&q),
        block_table: &table,
        blocks_per_seq: per_seq,
        seq_lens: &lens,
        params: DecodeParams {
            num_q_heads: 32,
            scale: 0.088,
            sliding_window: None,
            soft_cap: None,
        },
    };
    let be = CpuBackend::new(Some(threads));
    let cache = cache.as_ref();
    if std::env::var("PAIR").is_ok() {
        let bound = kvlayout_cpu::bench::ReadBound::new(be.pool(), 512 << 20);
        bound.pass(be.pool());
        let elem = cache.layout.dtype().size_bytes() as f64;
        let kv = ctx as f64 * seqs as f64 * 8.0 * 256.0 * elem;
        let p = kvlayout_cpu::bench::paired(
            env("REPS", 15),
            bound.bytes() as f64,
            || bound.pass(be.pool()),
            kv,
            || be.paged_decode(&cache, &d, &mut out).unwrap(),
        );
        println!("{dtype} {order} ctx {ctx}: ratio median {:.3} best {:.3} read {:.1} GB/s op {:.1} GB/s", p.ratio_median, p.ratio_best, p.bound_median/1e9, kv/p.op_median/1e9);
        return;
    }
    be.pool().install(|| {
        let t = Instant::now();
        let mut n = 0u64;
        let mut best = f64::INFINITY;
        while t.elapsed().as_secs_f64() < secs {
            let t1 = Instant::now();
            be.paged_decode(&cache, &d, &mut out).unwrap();
            best = best.min(t1.elapsed().as_secs_f64());
            n += 1;
        }
        let tk = (ctx as f64) * seqs as f64 * 8.0;
        println!(
            "{dtype} {order} ctx {ctx} seqs {seqs}: best {:.1} ns/tokhead avg {:.1}",
            best * 1e9 / tk,
            t.elapsed().as_secs_f64() / n as f64 * 1e9 / tk
        );
    });
}
