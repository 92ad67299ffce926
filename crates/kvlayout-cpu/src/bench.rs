//! Bounds measured in the same run as a benchmark: memory read bandwidth and memcpy, each
//! timed in passes next to the runs of the op it bounds ([`paired`]).
//!
//! Speed is reported as a ratio to one of these, never as an absolute threshold in a test.

use std::hint::black_box;
use std::time::Instant;

use rayon::prelude::*;

use kvlayout::ops::OpError;

use crate::hostbuf::HostBuffer;

/// Sums a slice with 64 independent accumulators: four full-width vector adds per 256 bytes
/// (AVX-512 where this process uses it, [`crate::CpuFeatures`]), so neither
/// the add latency nor one dependency chain limits the loads.
fn sum(x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::CpuFeatures::get().has("avx512f") {
        // SAFETY: AVX-512 F detected (and not hidden) just above.
        return unsafe { sum_avx512(x) };
    }
    sum_lanes(x)
}

/// [`sum_lanes`] compiled for AVX-512.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn sum_avx512(x: &[f32]) -> f32 {
    sum_lanes(x)
}

#[inline(always)]
fn sum_lanes(x: &[f32]) -> f32 {
    let mut acc = [0f32; 64];
    let chunks = x.chunks_exact(64);
    let rest = chunks.remainder();
    for c in chunks {
        for i in 0..64 {
            acc[i] += c[i];
        }
    }
    acc.iter().sum::<f32>() + rest.iter().sum::<f32>()
}

/// Sums a slice as [`sum`] does while running `rounds` rounds of [`CHAINS`] 16-lane
/// multiply-adds for every 256 bytes read, on chains independent of the data: compute that
/// could overlap the reads entirely, and that keeps the FMA ports busy as the kernels' does
/// (with four chains the compute waited on their latency, with the ports idle, and hid
/// under the decode's read pattern better: 0.83 of the bound against 0.74 at the same cost).
/// With `pf` (as long as `x`), the lines of `pf` at the offsets of each 256 bytes read are
/// prefetched as they are read, to the level the decode kernels prefetch to
/// ([`crate::arch::prefetch_to`], to this machine's level).
fn sum_and_compute(x: &[f32], pf: Option<&[f32]>, rounds: usize) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::CpuFeatures::get().has("avx512f") {
        // SAFETY: AVX-512 F detected (and not hidden) just above.
        return unsafe { sum_and_compute_avx512(x, pf, rounds) };
    }
    let (mut acc, mut chain) = ([0f32; 64], [0.5f32; CHAINS * 16]);
    for (k, c) in x.chunks_exact(64).enumerate() {
        prefetch_chunk(pf, k);
        for i in 0..64 {
            acc[i] += c[i];
        }
        for _ in 0..rounds {
            for v in &mut chain {
                *v = *v * 0.999 + 1e-4;
            }
        }
    }
    acc.iter().sum::<f32>() + chain.iter().sum::<f32>()
}

/// Independent multiply-add chains of [`sum_and_compute`]: enough that two FMA ports with a
/// latency of four cycles are kept busy.
const CHAINS: usize = 16;

/// [`sum_and_compute`] with AVX-512 loads and FMAs (one 16-lane FMA per chain per round).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn sum_and_compute_avx512(x: &[f32], pf: Option<&[f32]>, rounds: usize) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = [_mm512_setzero_ps(); 4];
    let mut chain = [_mm512_set1_ps(0.5); CHAINS];
    let (a, b) = (_mm512_set1_ps(0.999), _mm512_set1_ps(1e-4));
    for (k, c) in x.chunks_exact(64).enumerate() {
        prefetch_chunk(pf, k);
        for (i, v) in acc.iter_mut().enumerate() {
            // SAFETY: `c` holds 64 floats; lane block `i` is its floats 16 i .. 16 i + 16.
            *v = _mm512_add_ps(*v, unsafe { _mm512_loadu_ps(c[16 * i..].as_ptr()) });
        }
        for _ in 0..rounds {
            for v in &mut chain {
                *v = _mm512_fmadd_ps(*v, a, b);
            }
        }
    }
    let all = acc
        .iter()
        .chain(&chain)
        .fold(_mm512_setzero_ps(), |s, v| _mm512_add_ps(s, *v));
    _mm512_reduce_add_ps(all)
}

/// Prefetches the four lines of chunk `k` (64 floats) of `pf`, if any (a hint: a chunk past
/// its end is not prefetched).
#[inline(always)]
fn prefetch_chunk(pf: Option<&[f32]>, k: usize) {
    if let Some(c) = pf.and_then(|p| p.get(k * 64..k * 64 + 64)) {
        for line in 0..4 {
            crate::arch::prefetch_to(
                c[line * 16..].as_ptr().cast(),
                crate::arch::prefetch_level(),
            );
        }
    }
}

/// A fixed permutation of `0..n` (xorshift Fisher-Yates).
fn permutation(n: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for i in (1..n).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    order
}

/// `n` buffers of `bytes` each, allocated as caches are (huge pages where offered), every
/// byte `fill(i)` for buffer `i`; `OutOfMemory` when one cannot be mapped.
fn buffers(n: usize, bytes: usize, fill: impl Fn(usize) -> u8) -> Result<Vec<HostBuffer>, OpError> {
    (0..n)
        .map(|i| {
            let mut b = HostBuffer::try_zeroed(bytes).map_err(|()| OpError::OutOfMemory {
                buffer: i,
                bytes: bytes as u64,
            })?;
            b.as_mut_slice().fill(fill(i));
            Ok(b)
        })
        .collect()
}

/// The read-bandwidth bound: every thread of a pool sums its own buffer, allocated as caches
/// are (huge pages where offered), so the bound is the best the memory gives a cache. The
/// buffers are kept, so a benchmark can time one pass right before or after each run of the
/// op it bounds: on a shared machine whose bandwidth moves within seconds, a ratio of two
/// adjacent timings is steadier than a ratio of two medians taken minutes apart.
pub struct ReadBound {
    bufs: Vec<HostBuffer>,
}

impl ReadBound {
    /// One buffer of `bytes_per_thread` (rounded down to 64 bytes) per thread of `pool`; an
    /// `OutOfMemory` error when the machine cannot map one.
    pub fn new(pool: &rayon::ThreadPool, bytes_per_thread: usize) -> Result<Self, OpError> {
        let bytes = bytes_per_thread / 64 * 64;
        Ok(ReadBound {
            bufs: buffers(pool.current_num_threads(), bytes, |i| 0x3c + i as u8)?,
        })
    }

    /// Bytes one pass reads.
    pub fn bytes(&self) -> usize {
        self.bufs.iter().map(|b| b.as_slice().len()).sum()
    }

    /// Seconds of one pass over every buffer, one thread each.
    pub fn pass(&self, pool: &rayon::ThreadPool) -> f64 {
        self.timed(pool, sum)
    }

    /// Seconds of `read(buffer)` run on every buffer (as floats), one thread each.
    fn timed(&self, pool: &rayon::ThreadPool, read: impl Fn(&[f32]) -> f32 + Sync) -> f64 {
        let t = Instant::now();
        pool.install(|| {
            let s: f32 = self
                .bufs
                .par_iter()
                .map(|b| read(black_box(bytemuck::cast_slice(b.as_slice()))))
                .sum();
            black_box(s);
        });
        t.elapsed().as_secs_f64()
    }

    /// Seconds of one pass that also computes: `rounds` rounds of 16 multiply-adds (16 lanes
    /// each, on 16 chains) per 256 bytes read, on chains independent of the data, so that the
    /// compute could hide under the reads. With `cached`, each thread reads the first 256 KiB
    /// of its buffer (which stay in L2) over and over, as many bytes as a pass: the compute
    /// alone. Informative: how much of the read bandwidth a core keeps once it computes
    /// between its loads.
    pub fn compute_pass(&self, pool: &rayon::ThreadPool, rounds: usize, cached: bool) -> f64 {
        const PIECE: usize = 256 << 10;
        self.timed(pool, |all| {
            if cached {
                let piece = &all[..all.len().min(PIECE / 4)];
                (0..all.len() / piece.len().max(1))
                    .map(|_| sum_and_compute(black_box(piece), None, rounds))
                    .sum::<f32>()
            } else {
                sum_and_compute(all, None, rounds)
            }
        })
    }

    /// Seconds of one pass that reads each buffer in chunks of `chunk` bytes (a power of two
    /// dividing the buffer) taken in a fixed random order: the access pattern of pages
    /// scattered by a block table, whose bandwidth bounds any op that reads such pages whole.
    pub fn chunked_pass(&self, pool: &rayon::ThreadPool, chunk: usize) -> f64 {
        let floats = chunk / 4;
        // A fixed permutation of the chunks, built before timing.
        let order = permutation(self.bufs.first().map_or(0, |b| b.as_slice().len() / chunk));
        self.timed(pool, |all| {
            order
                .iter()
                .map(|&c| sum(black_box(&all[c * floats..(c + 1) * floats])))
                .sum::<f32>()
        })
    }

    /// Seconds of one pass that reads each buffer in the order the decode reads a head-major
    /// bf16 cache of the decode bench (`decode_page_order`), `rounds` as in
    /// [`ReadBound::compute_pass`]. With `prefetch`, as each page is read, the page two
    /// (tile, head) steps later in the same field is prefetched line by line, as the decode
    /// kernels do. Informative: the decode's read pattern and prefetches without its kernels,
    /// at a chosen compute density.
    pub fn paged_pass(&self, pool: &rayon::ThreadPool, rounds: usize, prefetch: bool) -> f64 {
        let floats = self.bufs.first().map_or(0, |b| b.as_slice().len() / 4);
        let order = decode_page_order(floats);
        self.timed(pool, |all| {
            order
                .iter()
                .map(|&(at, pf)| {
                    let pf = pf.filter(|_| prefetch).map(|p| &all[p..p + PAGE_FLOATS]);
                    sum_and_compute(black_box(&all[at..at + PAGE_FLOATS]), pf, rounds)
                })
                .sum::<f32>()
        })
    }
}

impl ReadBound {
    /// The paged bound as a fraction of the sequential read: the decode's own read pattern
    /// ([`ReadBound::paged_pass`]) with no compute, with its prefetches or without (the
    /// faster), each timed right after a sequential pass; the median of `passes` such pairs.
    /// Where two cores read far faster sequentially than in scattered pages, the decode is
    /// bounded by this rather than by the sequential read.
    pub fn paged_fraction(&self, pool: &rayon::ThreadPool, passes: usize) -> f64 {
        let mut ratios: Vec<f64> = (0..passes.max(1))
            .map(|_| {
                let seq = self.pass(pool);
                let fastest = self
                    .paged_pass(pool, 0, true)
                    .min(self.paged_pass(pool, 0, false));
                seq / fastest
            })
            .collect();
        ratios.sort_by(f64::total_cmp);
        ratios[ratios.len() / 2]
    }
}

/// Floats in a page of [`decode_page_order`]: 16 tokens x 128 bf16, 4 KiB.
const PAGE_FLOATS: usize = 1024;

/// The order in which the decode reads a head-major bf16 cache of the decode bench (8 KV
/// heads x 16 tokens x 128 per block, tiles of [`crate::decode::kernels::TILE`] = 64 tokens), laid over
/// `floats` floats: the first half is K and the second V, each in blocks of 8 head pages of
/// 4 KiB, taken in a fixed random order four blocks (a tile) at a time; per tile and head,
/// the four blocks' K pages, then their V pages. Each entry: where a page starts, and where
/// the page [`crate::decode::PREFETCH_AHEAD`] (tile, head) steps later in the same field and
/// block slot starts (none in the last steps), which the decode prefetches meanwhile. Every
/// page of both halves comes once.
fn decode_page_order(floats: usize) -> Vec<(usize, Option<usize>)> {
    const HEADS: usize = 8;
    const TILE_BLOCKS: usize = crate::decode::kernels::TILE / 16;
    const AHEAD: usize = crate::decode::PREFETCH_AHEAD;
    let (block, half) = (PAGE_FLOATS * HEADS, floats / 2);
    let blocks = permutation(half / block / TILE_BLOCKS * TILE_BLOCKS);
    let steps = blocks.len() / TILE_BLOCKS * HEADS;
    // Where page `i` of the tile of step `step` starts in K (V: `half` further).
    let page = |step: usize, i: usize| {
        let (tile, head) = (step / HEADS, step % HEADS);
        blocks[tile * TILE_BLOCKS + i] * block + head * PAGE_FLOATS
    };
    let mut order = Vec::with_capacity(2 * steps * TILE_BLOCKS);
    for step in 0..steps {
        for field in [0, half] {
            for i in 0..TILE_BLOCKS {
                let later = (step + AHEAD < steps).then(|| field + page(step + AHEAD, i));
                order.push((field + page(step, i), later));
            }
        }
    }
    order
}

/// The memcpy bound: every thread of a pool copies its own buffer into another (buffers
/// allocated as caches are), kept so that a pass can be timed next to each run of an op.
pub struct MemcpyBound {
    src: Vec<HostBuffer>,
    dst: Vec<HostBuffer>,
}

impl MemcpyBound {
    /// One source and one destination of `bytes_per_thread` per thread of `pool`; an
    /// `OutOfMemory` error when the machine cannot map one.
    pub fn new(pool: &rayon::ThreadPool, bytes_per_thread: usize) -> Result<Self, OpError> {
        let n = pool.current_num_threads();
        Ok(MemcpyBound {
            src: buffers(n, bytes_per_thread, |i| i as u8 + 1)?,
            dst: buffers(n, bytes_per_thread, |_| 0)?,
        })
    }

    /// Payload bytes one pass copies.
    pub fn bytes(&self) -> usize {
        self.src.iter().map(|b| b.as_slice().len()).sum()
    }

    /// Seconds of one pass, one thread per buffer.
    pub fn pass(&mut self, pool: &rayon::ThreadPool) -> f64 {
        let t = Instant::now();
        let (src, dst) = (&self.src, &mut self.dst);
        pool.install(|| {
            dst.par_iter_mut()
                .zip(src)
                .for_each(|(d, s)| d.as_mut_slice().copy_from_slice(black_box(s.as_slice())));
        });
        t.elapsed().as_secs_f64()
    }
}

/// An op timed `reps` times, each run paired with a pass of its bound timed right before it.
#[derive(Debug, Clone, Copy)]
pub struct Paired {
    /// Fastest run of the op, seconds.
    pub op_best: f64,
    /// Median run of the op, seconds.
    pub op_median: f64,
    /// Median bandwidth of the bound's passes, bytes/s.
    pub bound_median: f64,
    /// Fastest op over fastest pass, as bandwidths.
    pub ratio_best: f64,
    /// Median of the `reps` paired ratios (op bandwidth over its pass's bandwidth).
    pub ratio_median: f64,
}

/// Times `op` (moving `op_bytes`) `reps` times after one warm-up run, each run right after a
/// pass of the bound (`bound()` returns its seconds; it moves `bound_bytes`). On a shared
/// machine whose bandwidth moves within seconds, the ratio of two adjacent timings is
/// steadier than a ratio of two medians taken apart.
pub fn paired(
    reps: usize,
    bound_bytes: f64,
    mut bound: impl FnMut() -> f64,
    op_bytes: f64,
    mut op: impl FnMut(),
) -> Paired {
    op();
    let reps = reps.max(1);
    let (mut ops, mut passes, mut ratios) = (vec![], vec![], vec![]);
    for _ in 0..reps {
        let b = bound();
        let t = Instant::now();
        op();
        let t = t.elapsed().as_secs_f64();
        ratios.push((op_bytes / t) / (bound_bytes / b));
        ops.push(t);
        passes.push(b);
    }
    for v in [&mut ops, &mut passes, &mut ratios] {
        v.sort_by(f64::total_cmp);
    }
    let mid = reps / 2;
    Paired {
        op_best: ops[0],
        op_median: ops[mid],
        bound_median: bound_bytes / passes[mid],
        ratio_best: (op_bytes / ops[0]) / (bound_bytes / passes[0]),
        ratio_median: ratios[mid],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every page of both halves once; K and V in groups of a tile's four blocks, each group
    /// at one head offset; each page prefetched from the entry `PREFETCH_AHEAD` steps (of 8
    /// entries) before.
    #[test]
    fn decode_page_order_reads_every_page_once() {
        let (block, blocks) = (PAGE_FLOATS * 8, 12);
        let floats = 2 * blocks * block;
        let order = decode_page_order(floats);
        assert_eq!(order.len(), floats / PAGE_FLOATS);
        let mut starts: Vec<usize> = order.iter().map(|&(at, _)| at).collect();
        starts.sort_unstable();
        let all: Vec<usize> = (0..floats / PAGE_FLOATS).map(|p| p * PAGE_FLOATS).collect();
        assert_eq!(starts, all);
        for (e, group) in order.chunks_exact(4).enumerate() {
            let v = e % 2 == 1;
            let head = group[0].0 % block / PAGE_FLOATS;
            for &(at, _) in group {
                assert_eq!(at >= floats / 2, v, "entry group {e}");
                assert_eq!(at % block / PAGE_FLOATS, head, "entry group {e}");
            }
        }
        for (e, &(_, pf)) in order.iter().enumerate() {
            let later = e + 8 * crate::decode::PREFETCH_AHEAD;
            assert_eq!(pf, order.get(later).map(|&(at, _)| at), "entry {e}");
        }
        // Heads 0..8 of a tile in turn: the head of group 2 s is s % 8.
        for (s, group) in order.chunks_exact(8).enumerate() {
            assert_eq!(group[0].0 % block / PAGE_FLOATS, s % 8);
        }
    }
}
