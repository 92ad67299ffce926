//! Direct or staged by cost: [`CostModel`] prices a plan as its descriptors times the engine's
//! cost per descriptor, its bytes over the wire's speed and, for a staged plan, the bytes its
//! post-receive pass moves over the local backend's speed. [`choose_by_cost`] takes the cheaper
//! plan and says why with the figures; [`calibrate_memcpy`] measures the three constants for
//! the memcpy engine and a backend, here and now.
//!
//! The model steers a choice between two plans of the same bytes; it is not a prediction of
//! wall time (it leaves out waits, notifications and the staging buffer's first touch).

use std::fmt;
use std::time::{Duration, Instant};

use kvlayout::ops::{Backend, BufferShape, CopyRun};
use kvlayout::KvCacheLayout;

use crate::engine::{MemcpyEngine, TransferEngine};
use crate::executor::{execute, Plan};
use crate::handshake::CacheGroup;
use crate::plan::{plan_pull, PlanError, RankTransfer, SeqBlocks, TransferPlan};
use crate::pull::{choose_with, Pull, PullPlan};
use crate::staged::{plan_pull_staged, PostReceive, Scatter, StagedPlan};

/// The constants of the cost of a pull on one engine and one local backend.
#[derive(Debug, Clone, PartialEq)]
pub struct CostModel {
    /// Seconds per descriptor (run) the engine posts, beyond its bytes.
    pub per_descriptor_s: f64,
    /// Bytes per second the engine moves in one large run.
    pub wire_bytes_per_s: f64,
    /// Bytes per second the post-receive pass (upload and `scatter_blocks`) moves.
    pub scatter_bytes_per_s: f64,
    /// Where the constants come from (a calibration's engine, backend and sizes, or "stated").
    pub source: String,
}

/// A plan's cost under a [`CostModel`], in seconds, by part.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cost {
    /// Descriptors times the cost per descriptor.
    pub descriptors_s: f64,
    /// Bytes over the wire's speed.
    pub wire_s: f64,
    /// The post-receive pass's bytes over its speed (0 for a direct plan).
    pub scatter_s: f64,
}

impl Cost {
    /// The sum of the parts.
    pub fn total_s(&self) -> f64 {
        self.descriptors_s + self.wire_s + self.scatter_s
    }
}

impl fmt::Display for Cost {
    /// `1.234 ms (descriptors 0.100, wire 0.900, scatter 0.234)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |s: f64| s * 1e3;
        write!(
            f,
            "{:.3} ms (descriptors {:.3}, wire {:.3}, scatter {:.3})",
            ms(self.total_s()),
            ms(self.descriptors_s),
            ms(self.wire_s),
            ms(self.scatter_s)
        )
    }
}

impl CostModel {
    /// The cost of `plan`: every staged byte crosses the wire once and the post-receive pass
    /// once.
    pub fn cost(&self, plan: &PullPlan) -> Cost {
        let bytes = plan.bytes() as f64;
        Cost {
            descriptors_s: plan.descriptors() as f64 * self.per_descriptor_s,
            wire_s: bytes / self.wire_bytes_per_s,
            scatter_s: match plan {
                PullPlan::Direct(_) => 0.0,
                PullPlan::Staged(_) => bytes / self.scatter_bytes_per_s,
            },
        }
    }

    /// Refuses constants that are not positive and finite (a cost per descriptor may be 0).
    pub fn check(&self) -> Result<(), String> {
        let bad = |name: &str, v: f64| format!("cost model: {name} = {v} is not a positive number");
        if !(self.per_descriptor_s.is_finite() && self.per_descriptor_s >= 0.0) {
            return Err(bad("per_descriptor_s", self.per_descriptor_s));
        }
        for (name, v) in [
            ("wire_bytes_per_s", self.wire_bytes_per_s),
            ("scatter_bytes_per_s", self.scatter_bytes_per_s),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(bad(name, v));
            }
        }
        Ok(())
    }
}

impl fmt::Display for CostModel {
    /// `0.20 us per descriptor, wire 10.0 GB/s, scatter 2.0 GB/s (source)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:.3} us per descriptor, wire {:.2} GB/s, scatter {:.2} GB/s ({})",
            self.per_descriptor_s * 1e6,
            self.wire_bytes_per_s / 1e9,
            self.scatter_bytes_per_s / 1e9,
            self.source
        )
    }
}

/// Plans `local` pulling `seqs` from `remotes` both ways ([`plan_pull`], [`plan_pull_staged`])
/// and takes the cheaper under `model` ([`choose_by_cost`]).
pub fn plan_by_cost(
    local: &CacheGroup,
    remotes: &[CacheGroup],
    seqs: &[SeqBlocks],
    model: &CostModel,
) -> Result<Pull, PlanError> {
    choose_by_cost(
        plan_pull(local, remotes, seqs),
        plan_pull_staged(local, remotes, seqs),
        model,
    )
}

/// The cheaper of the direct and the staged plan under `model` (the direct one on a tie: no
/// post-receive pass), with both costs in the reason; one refused, the other; both refused,
/// the direct plan's refusal.
pub fn choose_by_cost(
    direct: Result<TransferPlan, PlanError>,
    staged: Result<StagedPlan, PlanError>,
    model: &CostModel,
) -> Result<Pull, PlanError> {
    choose_with(direct, staged, |d, s| {
        let (cd, cs) = (model.cost(d), model.cost(s));
        let figures = format!("direct {cd}, staged {cs}; model: {model}");
        if cs.total_s() < cd.total_s() {
            (true, format!("cheaper: {figures}"))
        } else {
            (false, format!("no dearer: {figures}"))
        }
    })
}

/// Sizes of [`calibrate_memcpy`]'s measurements.
const WIRE_BYTES: u64 = 32 << 20;
const SMALL_RUNS: u64 = 1 << 15;
const SMALL_RUN_BYTES: u64 = 64;
/// The staging cache of the scatter measurement, and the cache it scatters into.
const STAGING: &str = "kv L=2 B=64 N=16 H=8 D=64 dtype=bf16 order=LBNHC";
const TARGET: &str = "kv L=2 B=64 N=16 H=8 D=64 dtype=bf16 order=LBHNC";
/// Repetitions; each figure is the best.
const REPEATS: usize = 3;

/// Measures the cost model of the memcpy engine, in this process, and of `backend`'s
/// post-receive pass: the wire from one 32 MiB run, the cost per descriptor from 32768 runs of
/// 64 bytes beyond their bytes' wire time, the scatter from `scatter_blocks` of a staging
/// cache of 8 MiB between two orders. Best of 3 each; about a tenth of a second on a laptop.
pub fn calibrate_memcpy<B: Backend>(backend: &B) -> Result<CostModel, String> {
    let err = |e: &dyn fmt::Display| e.to_string();
    let tag = format!("calibrate-{}-{:?}", std::process::id(), Instant::now());
    let (src_name, dst_name) = (format!("{tag}-src"), format!("{tag}-dst"));
    let src =
        MemcpyEngine::new(&src_name, vec![vec![1u8; WIRE_BYTES as usize]]).map_err(|e| err(&e))?;
    let mut dst =
        MemcpyEngine::new(&dst_name, vec![vec![0u8; WIRE_BYTES as usize]]).map_err(|e| err(&e))?;
    dst.add_peer(&src_name, src_name.as_bytes(), &src.regions())
        .map_err(|e| err(&e))?;
    let plan = |runs: Vec<CopyRun>| TransferPlan {
        transfers: vec![RankTransfer {
            remote_rank: 0,
            remote_heads: 0..1,
            local_head0: 0,
            runs,
        }],
        local_blocks: Vec::new(),
    };
    let run = |i: u64, len: u64| CopyRun {
        src_buffer: 0,
        src_offset: i * len,
        dst_buffer: 0,
        dst_offset: i * len,
        len,
    };
    let one = plan(vec![run(0, WIRE_BYTES)]);
    // Every other 64-byte slot, so that no two runs merge into one.
    let small = plan(
        (0..SMALL_RUNS)
            .map(|i| run(2 * i, SMALL_RUN_BYTES))
            .collect(),
    );
    let mut time = |p: &TransferPlan| -> Result<f64, String> {
        best(|| {
            execute(
                &mut dst,
                Plan::Direct(p),
                &[&src_name],
                b"",
                Duration::from_secs(60),
            )
            .map_err(|e| err(&e))
        })
    };
    let wire_bytes_per_s = WIRE_BYTES as f64 / time(&one)?;
    let small_s = time(&small)?;
    let small_bytes = (SMALL_RUNS * SMALL_RUN_BYTES) as f64;
    let per_descriptor_s =
        ((small_s - small_bytes / wire_bytes_per_s) / SMALL_RUNS as f64).max(0.0);
    let scatter_bytes_per_s = scatter_speed(backend)?;
    let model = CostModel {
        per_descriptor_s,
        wire_bytes_per_s,
        scatter_bytes_per_s,
        source: format!(
            "calibrated: memcpy engine, {} backend, {} MiB run, {SMALL_RUNS} runs of {SMALL_RUN_BYTES} B",
            backend.name(),
            WIRE_BYTES >> 20
        ),
    };
    model.check()?;
    Ok(model)
}

/// Bytes per second of [`Scatter`] on `backend`: a staging cache in token-major pages into a
/// head-major cache, every block.
fn scatter_speed<B: Backend>(backend: &B) -> Result<f64, String> {
    let parse = |s: &str| s.parse::<KvCacheLayout>().map_err(|e| e.to_string());
    let (staging, target) = (parse(STAGING)?, parse(TARGET)?);
    let g = staging.geometry();
    let transfer = crate::staged::StagedTransfer {
        remote_rank: 0,
        remote_heads: 0..g.num_kv_heads,
        staging: staging.clone(),
        runs: Vec::new(),
        local_blocks: (0..g.num_blocks).collect(),
        local_heads: 0..g.num_kv_heads,
    };
    let bytes: Vec<Vec<u8>> = staging
        .extents()
        .iter()
        .map(|x| vec![0x3c; x.end as usize])
        .collect();
    let mut cache = backend.alloc_cache(&target, &BufferShape::exact(&target))?;
    let mut scatter = Scatter::new(backend, &mut cache);
    let s = best(|| {
        scatter
            .receive(&transfer, &bytes)
            .map_err(|e| e.to_string())
    })?;
    let moved: u64 = bytes.iter().map(|b| b.len() as u64).sum();
    Ok(moved as f64 / s)
}

/// The shortest of [`REPEATS`] runs of `f`, in seconds (at least a nanosecond).
fn best(mut f: impl FnMut() -> Result<(), String>) -> Result<f64, String> {
    let mut t = f64::MAX;
    for _ in 0..REPEATS {
        let start = Instant::now();
        f()?;
        t = t.min(start.elapsed().as_secs_f64());
    }
    Ok(t.max(1e-9))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(spec: &str, tp_size: u64, tp_rank: u64) -> CacheGroup {
        CacheGroup {
            name: "attn".into(),
            layout: spec.parse().unwrap(),
            total_kv_heads: 4,
            tp_size,
            tp_rank,
            regions: Vec::new(),
        }
    }

    /// NHD 16-token pages into HND 32-token pages at TP 2: rows direct, page slices staged.
    fn sides() -> (CacheGroup, Vec<CacheGroup>, Vec<SeqBlocks>) {
        let remote = group("kv L=2 B=10 N=16 H=4 D=16 dtype=bf16 order=LBNHC", 1, 0);
        let local = group("kv L=2 B=8 N=32 H=2 D=16 dtype=bf16 order=LBHNC", 2, 1);
        let seqs = vec![SeqBlocks {
            remote: vec![3, 7, 1],
            local: vec![5, 2],
            tokens: 40,
        }];
        (local, vec![remote], seqs)
    }

    fn model(per_descriptor_s: f64, scatter_bytes_per_s: f64) -> CostModel {
        CostModel {
            per_descriptor_s,
            wire_bytes_per_s: 1e9,
            scatter_bytes_per_s,
            source: "stated".into(),
        }
    }

    #[test]
    fn the_cost_is_descriptors_wire_and_scatter() {
        let (local, remotes, seqs) = sides();
        let direct = PullPlan::Direct(plan_pull(&local, &remotes, &seqs).unwrap());
        let staged = PullPlan::Staged(plan_pull_staged(&local, &remotes, &seqs).unwrap());
        let m = model(1e-6, 2e9);
        let (n, b) = (direct.descriptors() as f64, direct.bytes() as f64);
        let c = m.cost(&direct);
        assert_eq!(
            (c.descriptors_s, c.wire_s, c.scatter_s),
            (n * 1e-6, b / 1e9, 0.0)
        );
        let c = m.cost(&staged);
        let (n, b) = (staged.descriptors() as f64, staged.bytes() as f64);
        assert_eq!(
            (c.descriptors_s, c.wire_s, c.scatter_s),
            (n * 1e-6, b / 1e9, b / 2e9)
        );
        assert_eq!(c.total_s(), n * 1e-6 + b / 1e9 + b / 2e9);
    }

    #[test]
    fn dear_descriptors_choose_staged_and_a_slow_scatter_direct() {
        let (local, remotes, seqs) = sides();
        let d = plan_pull(&local, &remotes, &seqs).unwrap();
        let s = plan_pull_staged(&local, &remotes, &seqs).unwrap();
        assert!(s.descriptors() < d.descriptors() && s.bytes() == d.bytes());
        // 10 us per descriptor: the staged plan's fewer descriptors win.
        let pull = plan_by_cost(&local, &remotes, &seqs, &model(1e-5, 1e9)).unwrap();
        assert_eq!(pull.plan, PullPlan::Staged(s.clone()));
        assert!(pull.why.starts_with("cheaper: direct "), "{}", pull.why);
        assert!(
            pull.why.contains("model: 10.000 us per descriptor"),
            "{}",
            pull.why
        );
        // Free descriptors and a slow scatter: direct.
        let pull = plan_by_cost(&local, &remotes, &seqs, &model(0.0, 1e6)).unwrap();
        assert_eq!(pull.plan, PullPlan::Direct(d.clone()));
        assert!(pull.why.starts_with("no dearer: "), "{}", pull.why);
        // The crossing: staged costs its scatter, direct its extra descriptors.
        let extra = (d.descriptors() - s.descriptors()) as f64;
        let scatter_s = s.bytes() as f64 / 1e9;
        let even = model(scatter_s / extra, 1e9);
        let pull = plan_by_cost(&local, &remotes, &seqs, &even).unwrap();
        let (cd, cs) = (
            even.cost(&PullPlan::Direct(d)),
            even.cost(&PullPlan::Staged(s)),
        );
        let want = if cs.total_s() < cd.total_s() {
            "staged"
        } else {
            "direct"
        };
        assert_eq!(pull.plan.kind(), want, "{cd} vs {cs}");
    }

    #[test]
    fn refusals_pass_through_and_bad_constants_are_named() {
        let (local, remotes, _) = sides();
        let bad = [SeqBlocks {
            remote: vec![10],
            local: vec![0],
            tokens: 16,
        }];
        let want = plan_pull(&local, &remotes, &bad).unwrap_err();
        assert_eq!(
            plan_by_cost(&local, &remotes, &bad, &model(1e-6, 1e9)),
            Err(want)
        );
        let e = model(f64::NAN, 1e9).check().unwrap_err();
        assert_eq!(
            e,
            "cost model: per_descriptor_s = NaN is not a positive number"
        );
        assert!(model(0.0, 0.0)
            .check()
            .unwrap_err()
            .contains("scatter_bytes_per_s = 0"));
        assert_eq!(model(0.0, 1.0).check(), Ok(()));
    }
}
