//! The one entry point that plans a pull ([`plan()`]: direct or staged, chosen by
//! [`PullMode`], with the descriptor counts and the reason) and the one that runs it
//! ([`Pull::execute`]).
//!
//! `Auto` takes the plan with fewer descriptors (runs on the wire), the direct one on a tie,
//! because it needs no post-receive pass. Layouts whose orders differ (token-major against
//! head-major pages) are what make the staged plan the smaller: the direct one moves one row
//! per run there.

use std::fmt;
use std::time::Duration;

use crate::engine::TransferEngine;
use crate::executor::{execute, ExecuteError, Plan};
use crate::handshake::CacheGroup;
use crate::plan::{plan_pull, PlanError, SeqBlocks, TransferPlan};
use crate::staged::{plan_pull_staged, PostReceive, StagedPlan};

/// Which plan [`plan()`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum PullMode {
    /// The plan with fewer descriptors; the direct one on a tie or where the staged one is
    /// refused.
    #[default]
    Auto,
    /// Every byte straight into its place in the local cache.
    Direct,
    /// Into a staging cache in the remote's order, then the post-receive operation.
    Staged,
}

/// A planned pull: direct or staged.
#[derive(Debug, Clone, PartialEq)]
pub enum PullPlan {
    /// Every byte into its place in the local cache.
    Direct(TransferPlan),
    /// Through a staging cache.
    Staged(StagedPlan),
}

impl PullPlan {
    /// `direct` or `staged`.
    pub fn kind(&self) -> &'static str {
        match self {
            PullPlan::Direct(_) => "direct",
            PullPlan::Staged(_) => "staged",
        }
    }

    /// Descriptors (runs) on the wire.
    pub fn descriptors(&self) -> usize {
        match self {
            PullPlan::Direct(p) => p.descriptors(),
            PullPlan::Staged(p) => p.descriptors(),
        }
    }

    /// Bytes on the wire.
    pub fn bytes(&self) -> u64 {
        match self {
            PullPlan::Direct(p) => p.bytes(),
            PullPlan::Staged(p) => p.bytes(),
        }
    }

    /// The local blocks the plan writes, ascending.
    pub fn local_blocks(&self) -> Vec<u64> {
        match self {
            PullPlan::Direct(p) => p.local_blocks.clone(),
            PullPlan::Staged(p) => p.local_blocks(),
        }
    }
}

/// The other plan [`plan()`] considered: the plan, or why the planner refused it.
#[derive(Debug, Clone, PartialEq)]
pub struct Alternative {
    /// `direct` or `staged`.
    pub kind: &'static str,
    /// The plan, or the planner's refusal.
    pub plan: Result<PullPlan, PlanError>,
}

/// A planned pull, the reason for its kind, and the plan not taken.
#[derive(Debug, Clone, PartialEq)]
pub struct Pull {
    /// The plan to execute.
    pub plan: PullPlan,
    /// Why this kind, in a sentence.
    pub why: String,
    /// The other kind `Auto` weighed (`None` when the mode named one).
    pub other: Option<Alternative>,
}

impl fmt::Display for Pull {
    /// `staged: 96 descriptors, 98304 bytes; fewer descriptors than the direct plan's 384 ..`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} descriptors, {} bytes; {}",
            self.plan.kind(),
            self.plan.descriptors(),
            self.plan.bytes(),
            self.why
        )
    }
}

/// Plans `local` pulling `seqs` from `remotes` (the remote TP group's ranks to read; see
/// [`plan_pull`]): the direct plan, the staged one, or (`Auto`) the one with fewer
/// descriptors. Refused with the planner's reason when the plan asked for is, or, for
/// `Auto`, when both are (the direct plan's reason).
pub fn plan(
    local: &CacheGroup,
    remotes: &[CacheGroup],
    seqs: &[SeqBlocks],
    mode: PullMode,
) -> Result<Pull, PlanError> {
    let direct = || plan_pull(local, remotes, seqs);
    let staged = || plan_pull_staged(local, remotes, seqs);
    match mode {
        PullMode::Direct => Ok(Pull {
            plan: PullPlan::Direct(direct()?),
            why: "asked for".into(),
            other: None,
        }),
        PullMode::Staged => Ok(Pull {
            plan: PullPlan::Staged(staged()?),
            why: "asked for".into(),
            other: None,
        }),
        PullMode::Auto => choose(direct(), staged()),
    }
}

/// `Auto`'s choice between the direct and the staged plan (or their refusals); both refused
/// gives the direct plan's refusal.
pub fn choose(
    direct: Result<TransferPlan, PlanError>,
    staged: Result<StagedPlan, PlanError>,
) -> Result<Pull, PlanError> {
    choose_with(direct, staged, |d, s| {
        if s.descriptors() < d.descriptors() {
            let why = format!(
                "fewer descriptors than the direct plan's {} (the staged plan moves whole page \
                 slices; the post-receive pass converts)",
                d.descriptors()
            );
            (true, why)
        } else {
            let why = format!(
                "no more descriptors than the staged plan's {}, and no post-receive pass",
                s.descriptors()
            );
            (false, why)
        }
    })
}

/// The choice between the direct and the staged plan that every rule shares: where both
/// exist, `prefer` says whether to take the staged one and why (from the direct and the
/// staged plan); where one is refused, the other, its reason naming the refusal; where both
/// are, the direct plan's refusal.
pub(crate) fn choose_with(
    direct: Result<TransferPlan, PlanError>,
    staged: Result<StagedPlan, PlanError>,
    prefer: impl FnOnce(&PullPlan, &PullPlan) -> (bool, String),
) -> Result<Pull, PlanError> {
    let alt = |kind, plan| Some(Alternative { kind, plan });
    match (direct.map(PullPlan::Direct), staged.map(PullPlan::Staged)) {
        (Ok(d), Ok(s)) => match prefer(&d, &s) {
            (true, why) => Ok(Pull {
                why,
                plan: s,
                other: alt("direct", Ok(d)),
            }),
            (false, why) => Ok(Pull {
                why,
                plan: d,
                other: alt("staged", Ok(s)),
            }),
        },
        (Ok(d), Err(e)) => Ok(Pull {
            why: format!("the staged plan is refused: {e}"),
            plan: d,
            other: alt("staged", Err(e)),
        }),
        (Err(e), Ok(s)) => Ok(Pull {
            why: format!("the direct plan is refused: {e}"),
            plan: s,
            other: alt("direct", Err(e)),
        }),
        (Err(e), Err(_)) => Err(e),
    }
}

/// A post-receive operation for direct plans, which have none: refuses if called.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoPostReceive;

impl PostReceive for NoPostReceive {
    fn receives(&self) -> bool {
        false
    }

    fn receive(
        &mut self,
        t: &crate::staged::StagedTransfer,
        _: &[Vec<u8>],
    ) -> Result<(), crate::staged::ReceiveError> {
        Err(crate::staged::ReceiveError::Backend {
            backend: "none".into(),
            step: "post-receive",
            reason: format!(
                "a staged transfer from remote rank {} needs a post-receive operation",
                t.remote_rank
            ),
        })
    }
}

impl Pull {
    /// The pull with a staged plan's staging cache in the engine's local buffers from `first`
    /// on ([`StagedPlan::stage_at`]), for an engine that registers the local cache in buffers
    /// `0..first`; a direct plan unchanged. `None` where a buffer index would pass `u32::MAX`.
    pub fn stage_at(mut self, first: u32) -> Option<Self> {
        if let PullPlan::Staged(p) = self.plan {
            self.plan = PullPlan::Staged(p.stage_at(first)?);
        }
        Some(self)
    }

    /// Runs the plan on `engine` ([`execute`]): reads from `peers[r]`, the engine id of remote
    /// TP rank `r`, notifying each with `notify`, within `timeout` in all. A staged plan
    /// receives into the engine's local buffers from [`StagedPlan::staging_buffer`] on (0
    /// unless [`Pull::stage_at`] moved it: an engine that registers the local cache in buffer
    /// 0 needs it moved past the cache) and runs `post` after each transfer. A direct plan
    /// does not call `post`: pass [`NoPostReceive`], which a staged plan refuses before
    /// anything is posted.
    pub fn execute<E: TransferEngine>(
        &self,
        engine: &mut E,
        peers: &[&str],
        post: &mut dyn PostReceive,
        notify: &[u8],
        timeout: Duration,
    ) -> Result<(), ExecuteError> {
        let plan = match &self.plan {
            PullPlan::Direct(p) => Plan::Direct(p),
            PullPlan::Staged(p) => Plan::Staged(p, post),
        };
        execute(engine, plan, peers, notify, timeout)
    }
}
