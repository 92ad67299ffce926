//! `connector_bench`'s memcpy engine figures: a planned transfer beside one region of the
//! same bytes through the same engine, in the same run.

use std::time::{Duration, Instant};

use kvlayout::ops::CopyRun;
use kvlayout::KvCacheLayout;
use kvlayout_connector::engine::{wait, MemcpyEngine, TransferEngine};
use kvlayout_connector::plan::SeqBlocks;
use kvlayout_connector::staged::plan_pull_staged;
use kvlayout_connector::{plan_pull_compact, RunSet};

use crate::{group, layout, scattered};

/// One case's figures, GB/s: streamed stores (the engine's default for large transfers) and
/// cached ones (`memmove`, which streams a single large copy itself).
pub struct Ratio {
    /// The planned transfer, streamed.
    pub planned: f64,
    /// The planned transfer, cached stores.
    pub planned_cached: f64,
    /// One region of the same bytes, streamed.
    pub one: f64,
    /// One region of the same bytes, `memmove`.
    pub one_cached: f64,
    /// Bytes moved.
    pub bytes: u64,
    /// Descriptors of the plan (expanded).
    pub descriptors: u64,
}

/// Pulling 256 scattered blocks from `remote` (TP 1) into `local` (TP `tp_l`, rank 0) over the
/// memcpy engine: the direct plan as a run set, or the wire part of the staged plan alone
/// (into its staging cache) when `staged`; and one run of the same bytes; each with streamed
/// and with cached stores. The four alternate, 7 rounds, best of each, so that all see the
/// same load.
pub fn engine_ratio(remote: &str, local: &str, tp_l: u64, staged: bool) -> Result<Ratio, String> {
    let (r, l) = (layout(remote), layout(local));
    let blocks = 256u64;
    let seqs = [SeqBlocks {
        remote: scattered(blocks, r.geometry().num_blocks, 11),
        local: scattered(blocks, l.geometry().num_blocks, 13),
        tokens: blocks * 16,
    }];
    let (remotes, mine) = ([group(&r, 8, 1, 0)], group(&l, 8, tp_l, 0));
    let (set, into) = if staged {
        let p = plan_pull_staged(&mine, &remotes, &seqs).map_err(|e| e.to_string())?;
        let t = p.transfers.first().ok_or("no transfer")?;
        let runs = t
            .wire()
            .transfers
            .first()
            .ok_or("no wire transfer")?
            .runs
            .clone();
        (RunSet::flat(runs), t.staging.clone())
    } else {
        let p = plan_pull_compact(&mine, &remotes, &seqs).map_err(|e| e.to_string())?;
        let t = p.transfers.first().ok_or("no transfer")?;
        (t.runs.clone(), l)
    };
    let ones = |x: &KvCacheLayout| {
        x.extents()
            .iter()
            .map(|e| vec![1u8; e.end as usize])
            .collect()
    };
    let tag = format!("{local} {tp_l} {staged}");
    let src =
        MemcpyEngine::new(&format!("bench-src-{tag}"), ones(&r)).map_err(|e| e.to_string())?;
    let mut dst =
        MemcpyEngine::new(&format!("bench-dst-{tag}"), ones(&into)).map_err(|e| e.to_string())?;
    dst.add_peer(src.name(), src.name().as_bytes(), &src.regions())
        .map_err(|e| e.to_string())?;
    let bytes = set.bytes();
    let one = RunSet::flat(vec![CopyRun {
        src_offset: 0,
        dst_offset: 0,
        len: bytes,
        src_buffer: 0,
        dst_buffer: 0,
    }]);
    let mut time = |s: &RunSet, stream: bool| -> Result<f64, String> {
        dst.set_stream_min_bytes(if stream { 0 } else { u64::MAX });
        let start = Instant::now();
        let mut p = dst
            .post_read_set(src.name(), s, b"")
            .map_err(|e| e.to_string())?;
        wait(&mut dst, &mut p, Duration::from_secs(60)).map_err(|e| e.to_string())?;
        Ok(start.elapsed().as_secs_f64())
    };
    let mut best = [f64::MAX; 4];
    for _ in 0..7 {
        for (i, (s, stream)) in [(&set, true), (&set, false), (&one, true), (&one, false)]
            .into_iter()
            .enumerate()
        {
            best[i] = best[i].min(time(s, stream)?);
        }
    }
    let gbs = |t: f64| bytes as f64 / t / 1e9;
    Ok(Ratio {
        planned: gbs(best[0]),
        planned_cached: gbs(best[1]),
        one: gbs(best[2]),
        one_cached: gbs(best[3]),
        bytes,
        descriptors: set.descriptors(),
    })
}
