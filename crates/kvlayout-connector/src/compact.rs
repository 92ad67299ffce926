//! A direct plan held compactly: per remote rank a [`RunSet`], the runs of one layer's
//! pages repeated at the layer stride, instead of every run. A cache with one page per layer
//! has a run per block and layer; 100k blocks of 80 layers are 8 M runs (256 MB) as a flat
//! list and 100k runs as a set. The memcpy engine copies a set directly
//! ([`crate::TransferEngine::post_read_set`]); an engine that needs a flat list expands it
//! ([`CompactPlan::expand`]). Owns the compact plan only; pairing heads and blocks is
//! [`mod@crate::plan`]'s.

use std::ops::Range;

use kvlayout::ops::RunSet;

use crate::handshake::CacheGroup;
use crate::plan::{fill_transfers, PlanError, RankTransfer, SeqBlocks, TransferPlan};

/// What moves from one remote rank, as a [`RunSet`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CompactTransfer {
    /// The remote rank read.
    pub remote_rank: u64,
    /// Its heads read (indices in its layout).
    pub remote_heads: Range<u64>,
    /// The local head of `remote_heads.start`.
    pub local_head0: u64,
    /// The runs: expanded, those of [`crate::plan_pull`]'s transfer for this rank.
    pub runs: RunSet,
}

/// [`TransferPlan`] held compactly: the same transfers and local blocks.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CompactPlan {
    /// One per remote rank read, by rank.
    pub transfers: Vec<CompactTransfer>,
    /// The local blocks the plan writes, ascending.
    pub local_blocks: Vec<u64>,
}

impl CompactPlan {
    /// Bytes moved.
    pub fn bytes(&self) -> u64 {
        self.transfers.iter().map(|t| t.runs.bytes()).sum()
    }

    /// Descriptors once expanded (what [`TransferPlan::descriptors`] says of the same plan).
    pub fn descriptors(&self) -> u64 {
        self.transfers.iter().map(|t| t.runs.descriptors()).sum()
    }

    /// Runs held: the plan's memory, in runs.
    pub fn runs_held(&self) -> usize {
        self.transfers.iter().map(|t| t.runs.runs.len()).sum()
    }

    /// The flat plan, equal to [`crate::plan_pull`]'s.
    pub fn expand(&self) -> TransferPlan {
        TransferPlan {
            transfers: self
                .transfers
                .iter()
                .map(|t| RankTransfer {
                    remote_rank: t.remote_rank,
                    remote_heads: t.remote_heads.clone(),
                    local_head0: t.local_head0,
                    runs: t.runs.expand(),
                })
                .collect(),
            local_blocks: self.local_blocks.clone(),
        }
    }
}

/// [`crate::plan_pull`] as a [`CompactPlan`]: the same checks and refusals, the same runs
/// once expanded.
pub fn plan_pull_compact(
    local: &CacheGroup,
    remotes: &[CacheGroup],
    seqs: &[SeqBlocks],
) -> Result<CompactPlan, PlanError> {
    let mut plan = CompactPlan::default();
    plan_pull_compact_into(local, remotes, seqs, &mut plan)?;
    Ok(plan)
}

/// [`plan_pull_compact`] written into `plan`, reusing its memory. On `Err`, `plan` holds no
/// transfer.
pub fn plan_pull_compact_into(
    local: &CacheGroup,
    remotes: &[CacheGroup],
    seqs: &[SeqBlocks],
    plan: &mut CompactPlan,
) -> Result<(), PlanError> {
    fill_transfers(
        local,
        remotes,
        seqs,
        (&mut plan.transfers, &mut plan.local_blocks),
        |t: &mut CompactTransfer| (&mut t.remote_rank, &mut t.remote_heads, &mut t.local_head0),
        |p, t| p.run_set_into(&local.layout, p.local_head0(), seqs, &mut t.runs),
    )
}
