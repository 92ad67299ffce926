//! Staged pulls: when the two layouts differ in order (NHD against HND, say), the direct plan
//! moves one row at a time. A staged pull instead receives each remote rank's heads into a
//! dense staging cache in the remote's own order and the local block size, so the wire moves
//! whole page slices, and then runs the post-receive operation on the local backend:
//! `scatter_blocks` from the staging cache into the local blocks and heads, which converts
//! order, padding and head placement in one pass ([`receive`]).
//!
//! The staging cache covers whole local blocks: a partly filled last block of a sequence is
//! written whole, its slots past the sequence's tokens included.

use std::collections::HashMap;
use std::ops::Range;

use kvlayout::ops::{Backend, CopyRun, OpError};
use kvlayout::{Geometry, KvCacheLayout, LayoutSpec, Paged, Placement};

use crate::plan::{pull_runs, pulls, PlanError, SeqBlocks, Side};

/// What one remote rank sends to a staging cache, and where the staging blocks go.
#[derive(Debug, Clone, PartialEq)]
pub struct StagedTransfer {
    /// The remote rank read.
    pub remote_rank: u64,
    /// Its heads read (indices in its layout).
    pub remote_heads: Range<u64>,
    /// The staging cache: the remote's content and order, dense, the heads read, the local
    /// block size, one block per local block written.
    pub staging: KvCacheLayout,
    /// Remote buffers to staging buffers.
    pub runs: Vec<CopyRun>,
    /// The local block of each staging block.
    pub local_blocks: Vec<u64>,
    /// The local heads the staging heads land on.
    pub local_heads: Range<u64>,
}

/// A staged plan: one staged transfer per remote rank read.
#[derive(Debug, Clone, PartialEq)]
pub struct StagedPlan {
    /// By remote rank.
    pub transfers: Vec<StagedTransfer>,
}

impl StagedPlan {
    /// Descriptors (runs) on the wire.
    pub fn descriptors(&self) -> usize {
        self.transfers.iter().map(|t| t.runs.len()).sum()
    }

    /// Bytes on the wire.
    pub fn bytes(&self) -> u64 {
        self.transfers
            .iter()
            .flat_map(|t| &t.runs)
            .map(|r| r.len)
            .sum()
    }
}

/// A dense layout in `remote`'s order with `heads` heads and `blocks` blocks of `block_size`.
fn staging_layout(
    remote: &KvCacheLayout,
    heads: u64,
    blocks: u64,
    block_size: u64,
) -> Result<KvCacheLayout, PlanError> {
    let Placement::Paged(paged) = remote.placement() else {
        return Err(PlanError::Staging(
            "the remote layout is not paged (legacy or explicit strides): pull directly".into(),
        ));
    };
    let spec = LayoutSpec {
        geometry: Geometry {
            num_kv_heads: heads,
            num_blocks: blocks.max(1),
            block_size,
            ..*remote.geometry()
        },
        placement: Placement::Paged(Paged::new(paged.order)),
        ..remote.spec().clone()
    };
    KvCacheLayout::new(spec).map_err(|e| PlanError::Staging(e.to_string()))
}

/// The staged plan for `local` to pull `seqs` from `remotes` (see [`crate::plan::plan_pull`]
/// for the pairing of heads and blocks).
pub fn plan_pull_staged(
    local: &Side<'_>,
    remotes: &[Side<'_>],
    seqs: &[SeqBlocks],
) -> Result<StagedPlan, PlanError> {
    let (pulls, sizes) = pulls(local, remotes)?;
    let bl = local.layout.geometry().block_size;
    // Staging block per local block written, in order of first write.
    let mut index: HashMap<u64, u64> = HashMap::new();
    let mut local_blocks = Vec::new();
    let mut staged_seqs = Vec::with_capacity(seqs.len());
    for (seq, s) in seqs.iter().enumerate() {
        let used = s.tokens.div_ceil(bl) as usize;
        let Some(blocks) = s.local.get(..used) else {
            return Err(PlanError::Mapping {
                seq,
                reason: format!("{} local blocks for {} tokens", s.local.len(), s.tokens),
            });
        };
        let staged: Vec<u64> = blocks
            .iter()
            .map(|&b| {
                *index.entry(b).or_insert_with(|| {
                    local_blocks.push(b);
                    local_blocks.len() as u64 - 1
                })
            })
            .collect();
        staged_seqs.push(SeqBlocks {
            remote: s.remote.clone(),
            local: staged,
            tokens: s.tokens,
        });
    }
    if let Some(&b) = local_blocks
        .iter()
        .find(|&&b| b >= local.layout.geometry().num_blocks)
    {
        return Err(PlanError::Mapping {
            seq: 0,
            reason: format!(
                "local block {b} not below {}",
                local.layout.geometry().num_blocks
            ),
        });
    }
    let transfers = pulls
        .iter()
        .map(|p| {
            let n = p.heads.end - p.heads.start;
            let staging = staging_layout(p.remote.layout, n, local_blocks.len() as u64, bl)?;
            let into_staging = crate::plan::Pull {
                dst_head0: 0,
                ..p.clone()
            };
            Ok(StagedTransfer {
                remote_rank: p.remote.tp_rank,
                remote_heads: p.heads.clone(),
                runs: pull_runs(&into_staging, &staging, &staged_seqs, sizes)?,
                staging,
                local_blocks: local_blocks.clone(),
                local_heads: p.dst_head0..p.dst_head0 + n,
            })
        })
        .collect::<Result<_, PlanError>>()?;
    Ok(StagedPlan { transfers })
}

/// The post-receive operation of `t` on backend `be`: its staging cache (received) into the
/// local cache's blocks and heads.
pub fn receive<B: Backend>(
    be: &B,
    t: &StagedTransfer,
    staging: &B::Cache,
    local: &mut B::Cache,
) -> Result<B::Completion, OpError> {
    be.scatter_blocks(staging, &t.local_blocks, t.local_heads.clone(), local)
}
