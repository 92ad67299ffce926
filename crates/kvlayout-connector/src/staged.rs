//! Staged pulls: when the two layouts differ in order (NHD against HND, say), the direct plan
//! moves one row at a time. A staged pull instead receives each remote rank's heads into a
//! dense staging cache in the remote's own order and the local block size, so the wire moves
//! whole page slices, and then runs the post-receive operation on the local backend:
//! `scatter_blocks` from the staging cache into the local blocks and heads, which converts
//! order, padding and head placement in one pass ([`receive`]). [`crate::execute`] runs a
//! staged plan with a [`PostReceive`]; [`Scatter`] is the one on a backend.
//!
//! The staging cache covers whole local blocks: a partly filled last block of a sequence is
//! written whole, its slots past the sequence's tokens included.

use std::collections::HashMap;
use std::ops::Range;

use kvlayout::ops::{run_bytes, Backend, BufferShape, CopyRun, OpError};
use kvlayout::{Geometry, KvCacheLayout, LayoutSpec, Paged, Placement};

use crate::handshake::CacheGroup;
use crate::plan::{pulls, PlanError, RankTransfer, SeqBlocks, TransferPlan};

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
    /// The engine's local buffer that holds staging buffer 0 (staging buffer `i` is local
    /// buffer `staging_buffer + i`): 0 unless [`StagedPlan::stage_at`] placed the staging
    /// cache after other buffers, such as the local cache registered with the same engine.
    pub staging_buffer: u32,
}

impl StagedPlan {
    /// The plan with its staging cache in the engine's local buffers from `first` on: every
    /// run's destination buffer moves by `first - self.staging_buffer`. One engine can then
    /// register the local cache (buffers `0..first`, for direct plans) and a staging area
    /// (buffers `first..`) together. Refused (`None`) where a buffer index would pass
    /// `u32::MAX`, or a run's lies below [`StagedPlan::staging_buffer`].
    pub fn stage_at(mut self, first: u32) -> Option<Self> {
        for t in &mut self.transfers {
            for r in &mut t.runs {
                r.dst_buffer = r
                    .dst_buffer
                    .checked_sub(self.staging_buffer)?
                    .checked_add(first)?;
            }
        }
        self.staging_buffer = first;
        Some(self)
    }

    /// Descriptors (runs) on the wire.
    pub fn descriptors(&self) -> usize {
        self.transfers.iter().map(|t| t.runs.len()).sum()
    }

    /// Bytes on the wire.
    pub fn bytes(&self) -> u64 {
        run_bytes(self.transfers.iter().flat_map(|t| &t.runs))
    }

    /// The local blocks the plan writes, ascending (every transfer writes all of them).
    pub fn local_blocks(&self) -> Vec<u64> {
        let mut blocks = self
            .transfers
            .first()
            .map(|t| t.local_blocks.clone())
            .unwrap_or_default();
        blocks.sort_unstable();
        blocks
    }

    /// Per staging buffer, the most bytes any transfer's staging cache spans: the local memory
    /// an engine needs, from local buffer [`StagedPlan::staging_buffer`] on, to receive every
    /// transfer of this plan.
    pub fn staging_extents(&self) -> Vec<u64> {
        let mut out: Vec<u64> = Vec::new();
        for t in &self.transfers {
            for (i, x) in t.staging.extents().iter().enumerate() {
                match out.get_mut(i) {
                    Some(len) => *len = (*len).max(x.end),
                    None => out.push(x.end),
                }
            }
        }
        out
    }
}

impl StagedTransfer {
    /// The wire part alone: a plan whose local cache is this transfer's staging cache (its
    /// blocks `0..local_blocks.len()`, heads from 0).
    pub fn wire(&self) -> TransferPlan {
        TransferPlan {
            transfers: vec![RankTransfer {
                remote_rank: self.remote_rank,
                remote_heads: self.remote_heads.clone(),
                local_head0: 0,
                runs: self.runs.clone(),
            }],
            local_blocks: (0..self.local_blocks.len() as u64).collect(),
        }
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
            "the remote layout is not paged (a tensor= layout or explicit strides): pull directly"
                .into(),
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
/// for the pairing of heads and blocks; regions are not read).
pub fn plan_pull_staged(
    local: &CacheGroup,
    remotes: &[CacheGroup],
    seqs: &[SeqBlocks],
) -> Result<StagedPlan, PlanError> {
    let pulls = pulls(local, remotes)?;
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
            let n = p.heads().end - p.heads().start;
            let staging = staging_layout(p.remote_layout(), n, local_blocks.len() as u64, bl)?;
            Ok(StagedTransfer {
                remote_rank: p.remote_rank(),
                remote_heads: p.heads(),
                runs: p.runs(&staging, 0, &staged_seqs)?,
                staging,
                local_blocks: local_blocks.clone(),
                local_heads: p.local_head0()..p.local_head0() + n,
            })
        })
        .collect::<Result<_, PlanError>>()?;
    Ok(StagedPlan {
        transfers,
        staging_buffer: 0,
    })
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

/// Why a post-receive operation failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ReceiveError {
    /// The backend refused `scatter_blocks` (nothing written).
    #[error("scatter_blocks refused: {0}")]
    Refused(OpError),
    /// The backend failed a step (allocation, upload, or the wait for the scatter).
    #[error("backend {backend}: {step}: {reason}")]
    Backend {
        /// The backend's name.
        backend: String,
        /// The step that failed.
        step: &'static str,
        /// The backend's reason.
        reason: String,
    },
}

/// What runs once a staged transfer's bytes are in the engine's memory: the post-receive
/// operation into the local cache. [`crate::execute`] calls it once per transfer.
pub trait PostReceive {
    /// Moves `staging`, the bytes of `t`'s staging cache (one vector per buffer, each as long
    /// as the staging layout's span), into the local cache's blocks and heads.
    fn receive(&mut self, t: &StagedTransfer, staging: &[Vec<u8>]) -> Result<(), ReceiveError>;
    /// Whether this operation receives staged transfers at all; [`crate::execute`] refuses a
    /// staged plan before posting anything where it does not. True by default.
    fn receives(&self) -> bool {
        true
    }
}

/// A closure as the post-receive operation (a CPU scatter over memory the caller owns, say).
impl<F> PostReceive for F
where
    F: FnMut(&StagedTransfer, &[Vec<u8>]) -> Result<(), ReceiveError>,
{
    fn receive(&mut self, t: &StagedTransfer, staging: &[Vec<u8>]) -> Result<(), ReceiveError> {
        self(t, staging)
    }
}

/// The post-receive operation on a backend: `scatter_blocks` from a staging cache uploaded to
/// `backend` into `cache`, waited for.
pub struct Scatter<'a, B: Backend> {
    backend: &'a B,
    cache: &'a mut B::Cache,
}

impl<'a, B: Backend> Scatter<'a, B> {
    /// Scatters into `cache`, a cache of the local layout on `backend`.
    pub fn new(backend: &'a B, cache: &'a mut B::Cache) -> Self {
        Scatter { backend, cache }
    }
}

impl<B: Backend> PostReceive for Scatter<'_, B> {
    fn receive(&mut self, t: &StagedTransfer, staging: &[Vec<u8>]) -> Result<(), ReceiveError> {
        let be = self.backend;
        let failed = |step, reason| ReceiveError::Backend {
            backend: be.name().to_string(),
            step,
            reason,
        };
        let mut cache = be
            .alloc_cache(&t.staging, &BufferShape::exact(&t.staging))
            .map_err(|e| failed("allocating the staging cache", e))?;
        be.upload_cache(&mut cache, staging)
            .map_err(|e| failed("uploading the staging cache", e))?;
        let done = receive(be, t, &cache, self.cache).map_err(ReceiveError::Refused)?;
        be.wait(done)
            .map_err(|e| failed("waiting for scatter_blocks", e))
    }
}
