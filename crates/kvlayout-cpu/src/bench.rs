//! Bounds measured in the same run as a benchmark: memory read bandwidth and memcpy.
//!
//! Speed is reported as a ratio to one of these, never as an absolute threshold in a test.

use std::hint::black_box;
use std::time::Instant;

use rayon::prelude::*;

use crate::hostbuf::HostBuffer;

/// Median wall time in seconds of `reps` runs of `f` (after one warm-up run).
pub fn median_secs(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut t: Vec<f64> = (0..reps.max(1))
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

/// Sums a slice with 64 independent accumulators: four full-width vector adds per 256 bytes
/// (AVX-512 where the machine has it, as `shared/baselines.md` measures the bound), so neither
/// the add latency nor one dependency chain limits the loads.
fn sum(x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512 F detected just above.
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

/// `n` buffers of `bytes` each, allocated as caches are (huge pages where offered), every
/// byte `fill(i)` for buffer `i`.
fn buffers(n: usize, bytes: usize, fill: impl Fn(usize) -> u8) -> Vec<HostBuffer> {
    (0..n)
        .map(|i| {
            let mut b = HostBuffer::zeroed(bytes);
            b.as_mut_slice().fill(fill(i));
            b
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
    /// One buffer of `bytes_per_thread` (rounded down to 64 bytes) per thread of `pool`.
    pub fn new(pool: &rayon::ThreadPool, bytes_per_thread: usize) -> Self {
        let bytes = bytes_per_thread / 64 * 64;
        ReadBound {
            bufs: buffers(pool.current_num_threads(), bytes, |i| 0x3c + i as u8),
        }
    }

    /// Bytes one pass reads.
    pub fn bytes(&self) -> usize {
        self.bufs.iter().map(|b| b.as_slice().len()).sum()
    }

    /// Seconds of one pass over every buffer, one thread each.
    pub fn pass(&self, pool: &rayon::ThreadPool) -> f64 {
        let t = Instant::now();
        pool.install(|| {
            let s: f32 = self
                .bufs
                .par_iter()
                .map(|b| sum(black_box(bytemuck::cast_slice(b.as_slice()))))
                .sum();
            black_box(s);
        });
        t.elapsed().as_secs_f64()
    }

    /// Read bandwidth in bytes/s: the median of `reps` passes after one warm-up pass.
    pub fn bandwidth(&self, pool: &rayon::ThreadPool, reps: usize) -> f64 {
        self.pass(pool);
        let mut t: Vec<f64> = (0..reps.max(1)).map(|_| self.pass(pool)).collect();
        t.sort_by(f64::total_cmp);
        self.bytes() as f64 / t[t.len() / 2]
    }
}

/// Read bandwidth in bytes/s: every thread of `pool` sums its own `bytes_per_thread` buffer
/// (median of `reps` passes; see [`ReadBound`]).
pub fn read_bandwidth(pool: &rayon::ThreadPool, bytes_per_thread: usize, reps: usize) -> f64 {
    ReadBound::new(pool, bytes_per_thread).bandwidth(pool, reps)
}

/// memcpy payload bandwidth in bytes/s: every thread copies its own `bytes_per_thread`
/// (buffers allocated as caches are).
pub fn memcpy_bandwidth(pool: &rayon::ThreadPool, bytes_per_thread: usize, reps: usize) -> f64 {
    let n = pool.current_num_threads();
    let src = buffers(n, bytes_per_thread, |i| i as u8 + 1);
    let mut dst = buffers(n, bytes_per_thread, |_| 0);
    let secs = median_secs(reps, || {
        pool.install(|| {
            dst.par_iter_mut()
                .zip(&src)
                .for_each(|(d, s)| d.as_mut_slice().copy_from_slice(black_box(s.as_slice())));
        })
    });
    (n * bytes_per_thread) as f64 / secs
}
