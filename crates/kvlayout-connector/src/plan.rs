//! The transfer planner: which bytes of which remote rank go where in the local cache, for
//! two caches that may differ in physical order, padding, TP size and block size.
//!
//! A local rank pulls the heads it holds (`tp_heads` of the model's KV heads) from the remote
//! ranks that hold them: a head slice of each remote page when the local TP is larger, heads
//! gathered from several remote ranks when it is smaller, each replicated head from its
//! lowest remote holder (replicas hold the same values). Blocks are paired at the smaller of
//! the two block sizes `g`: token slots `j*g..(j+1)*g` of a larger block are a layout of their
//! own ([`KvCacheLayout::slot_range`]), in any order and padding. Every unit then comes from
//! the two layouts' move plan ([`kvlayout::ops::MovePlan`]) and is merged into maximal runs
//! contiguous on both sides ([`kvlayout::ops::copy_runs`]): bytes land directly in their
//! final place, so no post-receive operation is needed. Per-block states (Mamba) move as
//! whole blocks, paired in order, with equal block sizes.
//!
//! Each side is a handshake [`CacheGroup`]: its layout, the model's KV heads, its TP rank and
//! size. The planner does not read regions. [`crate::execute`] runs a [`TransferPlan`].

use std::ops::Range;

use kvlayout::ops::{check_same_model, run_bytes, CopyRun, OpError};
use kvlayout::{tp_head_range, KvCacheLayout};

use crate::handshake::CacheGroup;

mod pull_runs;
mod sub_blocks;

use sub_blocks::{sub_block_pairs, sub_view, SubBlockGroups};

/// Units (before merging) a plan may enumerate per remote rank: 64 Mi, a few GB of plan.
pub const MAX_PLAN_UNITS: usize = 64 << 20;

/// A planner's refusal: what does not fit, with the values.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    /// A TP placement that names no heads.
    #[error("{side} TP: {reason}")]
    Tp {
        /// `local` or `remote`.
        side: &'static str,
        /// Why.
        reason: String,
    },
    /// The two caches do not hold the same model's KV ([`check_same_model`]).
    #[error("caches differ: {0}")]
    Model(OpError),
    /// A property the planner cannot reconcile.
    #[error("caches differ in {what}: local {local} vs remote {remote}")]
    Incompatible {
        /// The differing property.
        what: &'static str,
        /// Local value.
        local: String,
        /// Remote value.
        remote: String,
    },
    /// Block sizes that cannot be paired.
    #[error("block sizes: {0}")]
    BlockSize(String),
    /// A block mapping entry out of range or writing a block twice.
    #[error("sequence {seq}: {reason}")]
    Mapping {
        /// Sequence index.
        seq: usize,
        /// Why.
        reason: String,
    },
    /// A head no offered remote rank holds.
    #[error("local head {head} is held by no remote rank offered (remote TP {tp_size})")]
    NoHolder {
        /// Model head index.
        head: u64,
        /// Remote TP size.
        tp_size: u64,
    },
    /// A staged pull that cannot stage (see [`crate::staged`]).
    #[error("staging: {0}")]
    Staging(String),
    /// A plan past [`MAX_PLAN_UNITS`], or one with no byte-run form.
    #[error("remote rank {rank}: {reason}")]
    TooLarge {
        /// Remote rank.
        rank: u64,
        /// Why.
        reason: String,
    },
}

/// The model heads group `g` holds, checked against its layout (`side`: `local` or `remote`).
fn held_heads(g: &CacheGroup, side: &'static str) -> Result<Range<u64>, PlanError> {
    let fail = |reason| PlanError::Tp { side, reason };
    if g.layout.content().tp_shards_channels() && g.tp_size > 1 {
        return Err(fail(
            "a Mamba conv state is sharded along its channels, not heads".into(),
        ));
    }
    let heads =
        tp_head_range(g.total_kv_heads, g.tp_size, g.tp_rank).map_err(|e| fail(e.to_string()))?;
    let held = g.layout.geometry().num_kv_heads;
    if heads.end - heads.start != held {
        return Err(fail(format!(
            "rank {} of {} holds {} of {} KV heads, its layout has {held}",
            g.tp_rank,
            g.tp_size,
            heads.end - heads.start,
            g.total_kv_heads
        )));
    }
    Ok(heads)
}

/// A sequence's blocks on both sides: its first `tokens` tokens are in `remote` blocks of the
/// remote block size and go to `local` blocks of the local block size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeqBlocks {
    /// Remote block ids, in token order.
    pub remote: Vec<u64>,
    /// Local block ids, in token order.
    pub local: Vec<u64>,
    /// Tokens to move.
    pub tokens: u64,
}

/// What moves from one remote rank: runs of remote buffer bytes to local buffer bytes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RankTransfer {
    /// The remote rank read.
    pub remote_rank: u64,
    /// Its heads read (indices in its layout).
    pub remote_heads: Range<u64>,
    /// The local head of `remote_heads.start`.
    pub local_head0: u64,
    /// `src_*`: remote buffer and offset; `dst_*`: local buffer and offset. Sorted by remote
    /// position; no two overlap at the destination.
    pub runs: Vec<CopyRun>,
}

impl RankTransfer {
    /// The local heads this transfer fills.
    pub fn local_heads(&self) -> Range<u64> {
        self.local_head0..self.local_head0 + (self.remote_heads.end - self.remote_heads.start)
    }
}

/// A plan: the transfers from each remote rank involved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferPlan {
    /// One per remote rank read, by rank.
    pub transfers: Vec<RankTransfer>,
    /// The local blocks the plan writes, ascending. Each transfer writes all of them (its own
    /// heads), so a transfer that does not complete leaves them not received.
    pub local_blocks: Vec<u64>,
}

impl TransferPlan {
    /// Bytes moved.
    pub fn bytes(&self) -> u64 {
        run_bytes(self.transfers.iter().flat_map(|t| &t.runs))
    }

    /// Descriptors (runs) on each side.
    pub fn descriptors(&self) -> usize {
        self.transfers.iter().map(|t| t.runs.len()).sum()
    }
}

/// The properties two caches must share (TP, block size and placement may differ): the same
/// model ([`check_same_model`]), per-token or per-block states (not compressed ones).
fn check_compatible(local: &KvCacheLayout, remote: &KvCacheLayout) -> Result<(), PlanError> {
    check_same_model(local, remote).map_err(PlanError::Model)?;
    let tps = local.geometry().tokens_per_state;
    if tps != 1 && !local.content().is_per_block_state() {
        return Err(PlanError::Incompatible {
            what: "tokens_per_state (compressed states are not paired by token)",
            local: tps.to_string(),
            remote: remote.geometry().tokens_per_state.to_string(),
        });
    }
    Ok(())
}

/// The local blocks `seqs` write (those holding their tokens), ascending, each once.
pub(crate) fn local_blocks(seqs: &[SeqBlocks], block_size: u64) -> Vec<u64> {
    let mut blocks: Vec<u64> = seqs
        .iter()
        .flat_map(|s| {
            let used = s.tokens.div_ceil(block_size.max(1)) as usize;
            s.local.iter().take(used).copied()
        })
        .collect();
    blocks.sort_unstable();
    blocks.dedup();
    blocks
}

/// Heads of one remote rank to pull, and the block sizes paired: its heads `heads` (indices
/// in its layout) go to local heads from `dst_head0`.
#[derive(Debug, Clone)]
pub(crate) struct Pull<'r> {
    remote: &'r CacheGroup,
    heads: Range<u64>,
    dst_head0: u64,
    sizes: BlockSizes,
}

/// Block sizes of a pull: `(remote, local, paired)`, the paired size dividing both.
type BlockSizes = (u64, u64, u64);

/// Which remote rank serves which of the local heads (each from its lowest holder), after
/// checking the two sides agree on the model and their block sizes nest.
pub(crate) fn pulls<'r>(
    local: &CacheGroup,
    remotes: &'r [CacheGroup],
) -> Result<Vec<Pull<'r>>, PlanError> {
    let want = held_heads(local, "local")?;
    let Some(first) = remotes.first() else {
        return Err(PlanError::NoHolder {
            head: want.start,
            tp_size: 0,
        });
    };
    if first.total_kv_heads != local.total_kv_heads {
        return Err(PlanError::Incompatible {
            what: "model KV heads",
            local: local.total_kv_heads.to_string(),
            remote: first.total_kv_heads.to_string(),
        });
    }
    let (bl, br) = (
        local.layout.geometry().block_size,
        first.layout.geometry().block_size,
    );
    let g = bl.min(br);
    if local.layout.content().is_per_block_state() && bl != br {
        return Err(PlanError::BlockSize(format!(
            "local {bl} and remote {br} tokens per block: a per-block state moves whole blocks"
        )));
    }
    if g == 0 || !bl.is_multiple_of(g) || !br.is_multiple_of(g) {
        return Err(PlanError::BlockSize(format!(
            "local {bl} and remote {br} tokens per block do not nest"
        )));
    }
    let holders = remotes
        .iter()
        .filter(|r| r.tp_size == first.tp_size && r.total_kv_heads == first.total_kv_heads)
        .map(|r| held_heads(r, "remote").map(|h| (r, h)))
        .collect::<Result<Vec<_>, _>>()?;
    let mut out = Vec::new();
    let mut head = want.start;
    while head < want.end {
        let Some((remote, held)) = holders
            .iter()
            .filter(|(_, h)| h.contains(&head))
            .min_by_key(|(r, _)| r.tp_rank)
        else {
            return Err(PlanError::NoHolder {
                head,
                tp_size: first.tp_size,
            });
        };
        check_compatible(&local.layout, &remote.layout)?;
        if remote.layout.geometry().block_size != br {
            return Err(PlanError::BlockSize(format!(
                "remote ranks differ: {br} and {} tokens per block",
                remote.layout.geometry().block_size
            )));
        }
        let end = held.end.min(want.end);
        out.push(Pull {
            remote,
            heads: head - held.start..end - held.start,
            dst_head0: head - want.start,
            sizes: (br, bl, g),
        });
        head = end;
    }
    Ok(out)
}

impl Pull<'_> {
    /// The remote rank read.
    pub(crate) fn remote_rank(&self) -> u64 {
        self.remote.tp_rank
    }

    /// The remote rank's layout.
    pub(crate) fn remote_layout(&self) -> &KvCacheLayout {
        &self.remote.layout
    }

    /// The remote heads read (indices in its layout).
    pub(crate) fn heads(&self) -> Range<u64> {
        self.heads.clone()
    }

    /// The local head of `heads().start`.
    pub(crate) fn local_head0(&self) -> u64 {
        self.dst_head0
    }
}

/// The plan for `local` to pull `seqs` from the remote ranks `remotes` (each rank of the
/// remote TP group that may be read; all share one TP size and the model's heads), every
/// byte directly into its place in the local cache. Planning reads each group's layout,
/// model heads and TP rank and size; it does not read their regions, which may be empty.
pub fn plan_pull(
    local: &CacheGroup,
    remotes: &[CacheGroup],
    seqs: &[SeqBlocks],
) -> Result<TransferPlan, PlanError> {
    let mut plan = TransferPlan {
        transfers: Vec::new(),
        local_blocks: Vec::new(),
    };
    plan_pull_into(local, remotes, seqs, &mut plan)?;
    Ok(plan)
}

/// [`plan_pull`] written into `plan`, reusing the memory of its runs: a decode rank that
/// plans request after request into one plan writes its runs into memory already mapped,
/// which on a machine of this kind is most of the time of a large plan. On `Err`, `plan`
/// holds no transfer.
pub fn plan_pull_into(
    local: &CacheGroup,
    remotes: &[CacheGroup],
    seqs: &[SeqBlocks],
    plan: &mut TransferPlan,
) -> Result<(), PlanError> {
    fill_transfers(
        local,
        remotes,
        seqs,
        (&mut plan.transfers, &mut plan.local_blocks),
        |t: &mut RankTransfer| (&mut t.remote_rank, &mut t.remote_heads, &mut t.local_head0),
        |p, t| p.runs_into(&local.layout, p.local_head0(), seqs, &mut t.runs),
    )
}

/// The planning loop of [`plan_pull_into`] and [`crate::plan_pull_compact_into`]: one
/// transfer per remote rank read, reusing `transfers`' entries (`Default` ones added as
/// needed), `ids` naming a transfer's rank, heads and first local head, `runs` writing its
/// runs; then the local blocks written. On `Err`, both lists are left empty.
pub(crate) fn fill_transfers<T: Default>(
    local: &CacheGroup,
    remotes: &[CacheGroup],
    seqs: &[SeqBlocks],
    (transfers, blocks): (&mut Vec<T>, &mut Vec<u64>),
    ids: impl Fn(&mut T) -> (&mut u64, &mut Range<u64>, &mut u64),
    mut runs: impl FnMut(&Pull<'_>, &mut T) -> Result<(), PlanError>,
) -> Result<(), PlanError> {
    let mut fill = || -> Result<(), PlanError> {
        let pulls = pulls(local, remotes)?;
        transfers.truncate(pulls.len());
        for (i, p) in pulls.iter().enumerate() {
            if i == transfers.len() {
                transfers.push(T::default());
            }
            let t = &mut transfers[i];
            let (rank, heads, head0) = ids(t);
            (*rank, *heads, *head0) = (p.remote_rank(), p.heads(), p.local_head0());
            runs(p, t)?;
        }
        *blocks = local_blocks(seqs, local.layout.geometry().block_size);
        Ok(())
    };
    let result = fill();
    if result.is_err() {
        transfers.clear();
        blocks.clear();
    }
    result
}
