//! The NIXL engine's constants for the cost model ([`crate::cost::CostModel`]), measured here
//! and now between two NIXL engines of this process: the wire from one 32 MiB run, and the
//! cost per descriptor on each path ([`NixlPath`]) from 8192 runs of 64 bytes beyond their
//! bytes' wire time, posted from fresh lists and from prepared ones. [`choose_by_nixl_cost`]
//! prices each plan with the constant of the path the engine would take for it. This module
//! does not measure the post-receive pass (the caller's backend does; the figure is passed in).

use std::fmt;
use std::time::{Duration, Instant};

use kvlayout::ops::CopyRun;
use kvlayout::KvCacheLayout;

use crate::cost::CostModel;
use crate::engine::{wait, TransferEngine};
use crate::plan::{PlanError, TransferPlan};
use crate::pull::{choose_with, Pull};
use crate::staged::StagedPlan;

use super::{NixlEngine, NixlPath, PrepareSide, XferKind};

/// Bytes of the wire measurement.
const WIRE_BYTES: u64 = 32 << 20;
/// The small runs' layout: one 64-byte (block, layer) per block, K and V rows fused.
const SMALL: &str = "kv L=1 B=16384 N=1 H=1 D=16 dtype=f16 order=NHD";
/// Runs of the per-descriptor measurement: every other block, so that no two merge.
const SMALL_RUNS: u64 = 8192;
/// Repetitions; each figure is the best.
const REPEATS: usize = 3;
/// Bound on each measured transfer.
const TIMEOUT: Duration = Duration::from_secs(30);

/// The NIXL engine's measured constants.
#[derive(Debug, Clone, PartialEq)]
pub struct NixlCalibration {
    /// Seconds per descriptor beyond its bytes, from fresh descriptor lists.
    pub listed_per_descriptor_s: f64,
    /// Seconds per index beyond its bytes, from prepared lists.
    pub prepared_per_descriptor_s: f64,
    /// Bytes per second of one large run.
    pub wire_bytes_per_s: f64,
}

impl NixlCalibration {
    /// The cost model of a plan posted on `path`'s kind (prepared or listed), with the
    /// post-receive pass at `scatter_bytes_per_s` (stated by `scatter_source`).
    pub fn model(
        &self,
        prepared: bool,
        scatter_bytes_per_s: f64,
        scatter_source: &str,
    ) -> CostModel {
        CostModel {
            per_descriptor_s: if prepared {
                self.prepared_per_descriptor_s
            } else {
                self.listed_per_descriptor_s
            },
            wire_bytes_per_s: self.wire_bytes_per_s,
            scatter_bytes_per_s,
            source: format!(
                "nixl {}, scatter {scatter_source}",
                if prepared { "prepared" } else { "listed" }
            ),
        }
    }
}

impl fmt::Display for NixlCalibration {
    /// `listed 2.10 us, prepared 1.20 us per descriptor, wire 5.00 GB/s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "listed {:.3} us, prepared {:.3} us per descriptor, wire {:.2} GB/s",
            self.listed_per_descriptor_s * 1e6,
            self.prepared_per_descriptor_s * 1e6,
            self.wire_bytes_per_s / 1e9
        )
    }
}

/// Measures [`NixlCalibration`] between two NIXL engines of this process (UCX's transport
/// between two workers of one process, which may differ from the one between processes).
/// About a second; each figure the best of 4 runs (the first one warms the paths up).
pub fn calibrate_nixl() -> Result<NixlCalibration, String> {
    let err = |e: &dyn fmt::Display| format!("nixl calibration: {e}");
    let tag = format!("nixl-calibrate-{}", std::process::id());
    let (src_name, dst_name) = (format!("{tag}-src"), format!("{tag}-dst"));
    let src =
        NixlEngine::new(&src_name, vec![vec![1u8; WIRE_BYTES as usize]]).map_err(|e| err(&e))?;
    let mut dst =
        NixlEngine::new(&dst_name, vec![vec![0u8; WIRE_BYTES as usize]]).map_err(|e| err(&e))?;
    let md = src.local_metadata().map_err(|e| err(&e))?;
    dst.add_peer(&src_name, &md, &src.regions())
        .map_err(|e| err(&e))?;
    let small: KvCacheLayout = SMALL.parse().map_err(|e| err(&e))?;
    let side = PrepareSide {
        layout: &small,
        first_buffer: 0,
        heads: 0..1,
    };
    dst.prepare_peer(&src_name, &side, &side)
        .map_err(|e| err(&e))?;
    let run = |offset: u64, len: u64| CopyRun {
        src_buffer: 0,
        src_offset: offset,
        dst_buffer: 0,
        dst_offset: offset,
        len,
    };
    let region = small.block_regions(0, 0..1, 0..1).map_err(|e| err(&e))?;
    let unit = region.first().map_or(0, |r| r.len);
    let runs: Vec<CopyRun> = (0..SMALL_RUNS)
        .map(|i| {
            let r = small.block_regions(2 * i, 0..1, 0..1);
            let offset = r.ok().and_then(|r| r.first().map(|r| r.offset));
            run(offset.unwrap_or(0), unit)
        })
        .collect();
    let mut time = |runs: &[CopyRun], prepared: bool| -> Result<(f64, NixlPath), String> {
        let mut best = f64::INFINITY;
        let mut path = None;
        for _ in 0..=REPEATS {
            let t = Instant::now();
            let mut p = dst
                .post(XferKind::Read, &src_name, runs, b"", prepared)
                .map_err(|e| err(&e))?;
            wait(&mut dst, &mut p, TIMEOUT).map_err(|e| err(&e))?;
            best = best.min(t.elapsed().as_secs_f64());
            path = Some(p.path().clone());
        }
        Ok((
            best,
            path.unwrap_or(NixlPath::Listed {
                descriptors: 0,
                why: String::new(),
            }),
        ))
    };
    let (wire_s, _) = time(&[run(0, WIRE_BYTES)], false)?;
    let wire = WIRE_BYTES as f64 / wire_s;
    let small_bytes = (SMALL_RUNS * unit) as f64;
    let (listed_s, _) = time(&runs, false)?;
    let (prepared_s, path) = time(&runs, true)?;
    if !matches!(path, NixlPath::Prepared { .. }) {
        return Err(format!(
            "nixl calibration: the small runs were not prepared: {}",
            path.describe()
        ));
    }
    let per = |t: f64| ((t - small_bytes / wire) / SMALL_RUNS as f64).max(0.0);
    Ok(NixlCalibration {
        listed_per_descriptor_s: per(listed_s),
        prepared_per_descriptor_s: per(prepared_s),
        wire_bytes_per_s: wire,
    })
}

/// The cheaper of the direct and the staged plan for the NIXL engine: each priced with the
/// constant of the path it will take (`direct_path`, `staged_path`: what
/// [`NixlEngine::path_for`] says for its runs), the staged plan with its post-receive pass at
/// `scatter_bytes_per_s`; the direct one on a tie; both costs and the constants in the reason.
pub fn choose_by_nixl_cost(
    direct: Result<TransferPlan, PlanError>,
    staged: Result<StagedPlan, PlanError>,
    calibration: &NixlCalibration,
    (direct_path, staged_path): (&NixlPath, &NixlPath),
    scatter_bytes_per_s: f64,
    scatter_source: &str,
) -> Result<Pull, PlanError> {
    let prepared = |p: &NixlPath| matches!(p, NixlPath::Prepared { .. });
    let dm = calibration.model(prepared(direct_path), scatter_bytes_per_s, scatter_source);
    let sm = calibration.model(prepared(staged_path), scatter_bytes_per_s, scatter_source);
    choose_with(direct, staged, |d, s| {
        let (cd, cs) = (dm.cost(d), sm.cost(s));
        let figures = format!(
            "direct {cd} ({}), staged {cs} ({}); {calibration}, scatter {:.2} GB/s \
             ({scatter_source})",
            if prepared(direct_path) {
                "prepared"
            } else {
                "listed"
            },
            if prepared(staged_path) {
                "prepared"
            } else {
                "listed"
            },
            scatter_bytes_per_s / 1e9
        );
        if cs.total_s() < cd.total_s() {
            (true, format!("cheaper: {figures}"))
        } else {
            (false, format!("no dearer: {figures}"))
        }
    })
}
