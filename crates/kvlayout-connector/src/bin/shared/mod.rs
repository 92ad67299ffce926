//! What the connector's bench binaries share: the CPU they run on, scattered block ids, and
//! a plan's reference of the same bytes in other runs.

use kvlayout::ops::CopyRun;
use kvlayout_connector::plan::{RankTransfer, TransferPlan};

mod scattered;

pub use scattered::scattered;

/// The CPU's model name (`/proc/cpuinfo`), for the figures' heading.
pub fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// `plan`'s first transfer with `runs` in its place: the same peer, heads and blocks, the
/// bytes laid out otherwise (the contiguous reference a planned transfer is timed against).
pub fn with_runs(plan: &TransferPlan, runs: Vec<CopyRun>) -> Result<TransferPlan, String> {
    let first = plan.transfers.first().ok_or("a plan without transfers")?;
    Ok(TransferPlan {
        transfers: vec![RankTransfer {
            remote_rank: first.remote_rank,
            remote_heads: first.remote_heads.clone(),
            local_head0: first.local_head0,
            runs,
        }],
        local_blocks: plan.local_blocks.clone(),
    })
}
