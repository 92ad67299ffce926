//! Which kernel build [`CpuBackend::new`](crate::CpuBackend::new) runs, and why: chosen once
//! per process.
//!
//! CPUID orders every pair of builds but one: AVX-512 over AVX2 over scalar. Whether the
//! bf16-operand build (`avx512-bf16`) outruns the plain AVX-512 one on bf16 and fp8 rows
//! depends on the core, not on its features (faster on Zen 4, where it was written; slower on
//! Zen 5 and on Intel's Emerald Rapids, whose `vdpbf16ps` costs more than widening to f32).
//! Where a machine runs both, the two are timed on the same small decode (rows in L1/L2, one
//! thread, alternating runs, the fastest of each), about 10 ms once per process, and the
//! faster is kept. `KVLAYOUT_KERNELS=<build>` overrides the choice (to run a whole test or
//! bench command on one build). The builds a machine runs are those of the features this
//! process uses, so `KVLAYOUT_CPU_HIDE` narrows the choice as a CPU without them would.

use std::sync::OnceLock;

use crate::arch::{available, Isa};
use crate::backend::{pool, CpuBackend};

/// The constructor that chooses, and what it chooses from.
impl CpuBackend {
    /// A backend on `threads` threads (all cores, or `RAYON_NUM_THREADS`, when `None`),
    /// running the fastest kernel build of this machine ([`CpuBackend::kernel_choice`] says
    /// how it was chosen).
    pub fn new(threads: Option<usize>) -> Self {
        let choice = auto();
        CpuBackend {
            pool: pool(threads),
            decode_partials: std::sync::Mutex::new(Vec::new()),
            isa: choice.isa,
            why: choice.why.clone(),
            prefetch: crate::arch::prefetch_level(),
        }
    }

    /// The kernel builds this machine runs, the one [`CpuBackend::new`] runs first, the
    /// others in the order of their instruction sets (`avx512-bf16`, `avx512`, `avx2`,
    /// `scalar`).
    pub fn kernel_builds() -> Vec<&'static str> {
        let first = auto().isa;
        std::iter::once(first)
            .chain(crate::arch::available().into_iter().filter(|&i| i != first))
            .map(|i| i.name())
            .collect()
    }

    /// The build of the SIMD kernels [`CpuBackend::new`] runs here (the first of
    /// [`CpuBackend::kernel_builds`]): `avx512-bf16`, `avx512`, `avx2` or `scalar`.
    pub fn kernels() -> &'static str {
        auto().isa.name()
    }
}

/// The build a backend runs unless one is named, and why.
#[derive(Debug, Clone)]
pub(crate) struct Choice {
    pub isa: Isa,
    pub why: String,
}

/// The choice of this process (made on first use).
pub(crate) fn auto() -> &'static Choice {
    static CHOICE: OnceLock<Choice> = OnceLock::new();
    CHOICE.get_or_init(choose)
}

/// The environment variable that names the build to run instead of choosing.
pub(crate) const OVERRIDE: &str = "KVLAYOUT_KERNELS";

fn choose() -> Choice {
    let mut note = String::new();
    if let Some(why) = &crate::CpuFeatures::get().refused {
        note = format!(" ({why}; nothing hidden)");
        eprintln!("kvlayout-cpu: {why}; nothing hidden");
    }
    if let Ok(name) = std::env::var(OVERRIDE) {
        match Isa::named(&name).and_then(|i| i.runs_here().map(|()| i)) {
            Ok(isa) => {
                return Choice {
                    isa,
                    why: format!("{OVERRIDE}={name}"),
                }
            }
            Err(e) => {
                note += &format!(" ({OVERRIDE}={name} ignored: {e})");
                eprintln!("kvlayout-cpu: {OVERRIDE}={name} ignored: {e}");
            }
        }
    }
    let builds = available();
    let first = builds.first().copied().unwrap_or(Isa::Scalar);
    #[cfg(target_arch = "x86_64")]
    if builds.contains(&Isa::Avx512Bf16) && builds.contains(&Isa::Avx512) {
        return measured([Isa::Avx512Bf16, Isa::Avx512], note);
    }
    let not_run: Vec<String> = Isa::ALL
        .iter()
        .filter_map(|i| {
            i.runs_here()
                .err()
                .map(|why| format!("{}: {why}", i.name()))
        })
        .collect();
    Choice {
        isa: first,
        why: if not_run.is_empty() {
            format!("the first build this CPU runs{note}")
        } else {
            format!(
                "the first build this CPU runs ({}){note}",
                not_run.join("; ")
            )
        },
    }
}

/// Times two builds on bf16 and fp8 e4m3 rows and keeps the faster (the two AVX-512 builds
/// at start-up; any two in the tests, so the timing runs on every host).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn measured(candidates: [Isa; 2], note: String) -> Choice {
    let mut total = [0f64; 2];
    let mut detail = Vec::new();
    for dtype in ["bf16", "fp8_e4m3"] {
        // A decode that cannot be set up or fails leaves its dtype out; with none left, the
        // second candidate (the plainer build) is kept.
        let Some(ns) = timing::Bench::new(dtype).and_then(|b| b.fastest(&candidates)) else {
            continue;
        };
        for (t, n) in total.iter_mut().zip(ns) {
            *t += n;
        }
        detail.push(format!("{dtype} {:.1} against {:.1}", ns[0], ns[1]));
    }
    if detail.is_empty() {
        return Choice {
            isa: candidates[1],
            why: format!("the calibration decode could not run{note}"),
        };
    }
    let k = usize::from(total[1] < total[0]);
    Choice {
        isa: candidates[k],
        why: format!(
            "timed at start-up, ns per token x KV head, {} against {}: {}{note}",
            candidates[0].name(),
            candidates[1].name(),
            detail.join(", ")
        ),
    }
}

/// The calibration decode.
mod timing {
    use std::time::Instant;

    use kvlayout::ops::DecodeParams;
    use kvlayout::KvCacheLayout;

    use super::super::{decode_with, Options};
    use crate::arch::Isa;
    use crate::args::Decode;
    use crate::backend::CpuBackend;
    use crate::cache::HostCache;
    use crate::tensor::Activations;

    /// Tokens of the calibration decode (8 blocks of 16): 256 KiB of bf16 K and V.
    const TOKENS: u32 = 128;
    /// KV heads, query heads per KV head and head size: Llama-3-8B's.
    const KV_HEADS: u64 = 8;
    const GROUP: u64 = 4;
    const HEAD: u64 = 128;

    /// One sequence's decode on one thread, rows in cache.
    pub(super) struct Bench {
        cache: HostCache,
        query: Vec<f32>,
        table: Vec<i32>,
        be: CpuBackend,
    }

    impl Bench {
        pub(super) fn new(dtype: &str) -> Option<Self> {
            let blocks = TOKENS / 16;
            let spec = format!("kv B={blocks} N=16 H={KV_HEADS} D={HEAD} dtype={dtype} order=HND");
            let layout: KvCacheLayout = spec.parse().ok()?;
            let mut cache = HostCache::new(layout).ok()?;
            // Bytes 0x30..0x3b: finite values of every dtype, of varied magnitude.
            for i in 0..cache.layout().num_buffers() {
                for (j, b) in cache.bytes_mut(i).iter_mut().enumerate() {
                    *b = 0x30 + (j.wrapping_mul(2_654_435_761) >> 7) as u8 % 12;
                }
            }
            let query = (0..KV_HEADS * GROUP * HEAD)
                .map(|i| ((i % 113) as f32 - 56.0) / 64.0)
                .collect();
            Some(Bench {
                cache,
                query,
                table: (0..blocks as i32).collect(),
                be: CpuBackend::single_thread(Isa::Scalar).ok()?,
            })
        }

        /// The fastest of several alternating runs of each build, ns per token x KV head;
        /// `None` where a run fails.
        pub(super) fn fastest(&self, builds: &[Isa; 2]) -> Option<[f64; 2]> {
            const ROUNDS: usize = 9;
            const ITERS: usize = 4;
            let lens = [TOKENS];
            let d = Decode {
                layer: 0,
                query: Activations::F32(&self.query),
                block_table: &self.table,
                blocks_per_seq: self.table.len(),
                seq_lens: &lens,
                params: DecodeParams {
                    num_q_heads: KV_HEADS * GROUP,
                    scale: 1.0 / (HEAD as f32).sqrt(),
                    sliding_window: None,
                    soft_cap: None,
                },
            };
            let mut out = vec![0f32; (KV_HEADS * GROUP * HEAD) as usize];
            let cache = self.cache.as_ref();
            let run = |isa: Isa, out: &mut [f32]| {
                let opts = Options {
                    partitions: Some(1),
                    isa: Some(isa),
                    inline: Some(true),
                };
                decode_with(&self.be, &cache, &d, out, opts).is_ok()
            };
            let mut best = [f64::INFINITY; 2];
            for round in 0..=ROUNDS {
                for (k, &isa) in builds.iter().enumerate() {
                    let t = Instant::now();
                    for _ in 0..ITERS {
                        if !run(isa, &mut out) {
                            return None;
                        }
                    }
                    // Round 0 warms the rows and the code up.
                    if round > 0 {
                        best[k] = best[k].min(t.elapsed().as_secs_f64());
                    }
                }
            }
            Some(best.map(|s| s * 1e9 / ITERS as f64 / (f64::from(TOKENS) * KV_HEADS as f64)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The timing that picks between the AVX-512 builds, run on the two best builds this
    /// process runs (one build against itself where only `scalar` runs), so it runs on every
    /// host class: the faster is kept, with the figures of both dtypes.
    #[test]
    fn the_calibration_times_two_builds_and_keeps_one() {
        let builds = available();
        let pair = [builds[0], *builds.get(1).unwrap_or(&builds[0])];
        let choice = measured(pair, String::new());
        assert!(pair.contains(&choice.isa), "{choice:?}");
        let head = format!(
            "timed at start-up, ns per token x KV head, {} against {}: bf16 ",
            pair[0].name(),
            pair[1].name()
        );
        assert!(choice.why.starts_with(&head), "{}", choice.why);
        assert!(choice.why.contains(", fp8_e4m3 "), "{}", choice.why);
        println!("{}: {}", choice.isa.name(), choice.why);
    }
}
