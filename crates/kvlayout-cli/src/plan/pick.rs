//! Direct or staged: both plans come from the connector's planner ([`plan_pull`],
//! [`plan_pull_staged`]), and `auto`'s choice between them is the connector's
//! ([`kvlayout_connector::pull::choose`]: fewer descriptors, the direct plan on a tie). This
//! module maps `--mode` onto it and keeps the other plan, or its refusal, for the report.

use clap::ValueEnum;
use kvlayout_connector::cost::{calibrate_memcpy, choose_by_cost};
use kvlayout_connector::plan::{plan_pull, PlanError, SeqBlocks, TransferPlan};
use kvlayout_connector::pull::{choose, Pull, PullPlan};
use kvlayout_connector::staged::{plan_pull_staged, StagedPlan};

use super::groups::Sides;
use crate::CliError;

/// Which plan `kvlayout plan` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Mode {
    /// The plan with fewer descriptors; the direct one on a tie.
    Auto,
    /// The cheaper plan under a cost model calibrated here (the memcpy engine, the backend's
    /// post-receive pass); the direct one on a tie.
    Cost,
    /// Every byte straight into its place in the DST cache.
    Direct,
    /// Into a staging cache in the SRC order, then `scatter_blocks` on the DST backend.
    Staged,
}

/// The plan chosen: the connector's direct or staged plan.
pub(crate) type Chosen = PullPlan;

/// A plan, or the planner's refusal.
pub(crate) type Outcome = Result<PullPlan, PlanError>;

/// The chosen plan, why, and the other plan or its refusal (`None` when it was not asked
/// for): the connector's [`Pull`].
pub(crate) type Picked = Pull;

/// The direct plan, from the connector.
pub(crate) fn direct(sides: &Sides, seqs: &[SeqBlocks]) -> Result<TransferPlan, PlanError> {
    plan_pull(&sides.dst, &sides.src, seqs)
}

/// The staged plan, from the connector.
pub(crate) fn staged(sides: &Sides, seqs: &[SeqBlocks]) -> Result<StagedPlan, PlanError> {
    plan_pull_staged(&sides.dst, &sides.src, seqs)
}

/// A refusal as the one error line: the plan's kind and the planner's reason.
fn refused(kind: &str, e: &PlanError) -> CliError {
    CliError::Usage(format!("{kind} plan refused: {e}"))
}

/// The plan `mode` asks for (`cost` calibrated on the DST backend named `backend`), or the
/// planner's refusal.
pub(crate) fn pick(
    sides: &Sides,
    seqs: &[SeqBlocks],
    mode: Mode,
    backend: &str,
) -> Result<Picked, CliError> {
    match mode {
        Mode::Direct => Ok(Pull {
            plan: PullPlan::Direct(direct(sides, seqs).map_err(|e| refused("direct", &e))?),
            why: "asked for (--mode direct)".into(),
            other: None,
        }),
        Mode::Staged => Ok(Pull {
            plan: PullPlan::Staged(staged(sides, seqs).map_err(|e| refused("staged", &e))?),
            why: "asked for (--mode staged)".into(),
            other: None,
        }),
        Mode::Auto => auto(direct(sides, seqs), staged(sides, seqs)),
        Mode::Cost => by_cost(sides, seqs, backend),
    }
}

/// The cheaper plan under the cost model of the memcpy engine and `backend`'s post-receive
/// pass, calibrated now ([`calibrate_memcpy`]); both refusals named when they differ.
fn by_cost(sides: &Sides, seqs: &[SeqBlocks], backend: &str) -> Result<Picked, CliError> {
    let (d, s) = (direct(sides, seqs), staged(sides, seqs));
    if let (Err(d), Err(s)) = (&d, &s) {
        return Err(refused_both(d, s));
    }
    let be = crate::common::backend::open(backend, None)?;
    let model = calibrate_memcpy(&be)
        .map_err(|e| CliError::Failed(format!("calibrating the cost model: {e}")))?;
    choose_by_cost(d, s, &model).map_err(|e| CliError::Usage(format!("plan refused: {e}")))
}

/// Both plans refused: one reason, or both where they differ.
fn refused_both(d: &PlanError, s: &PlanError) -> CliError {
    if d == s {
        CliError::Usage(format!("plan refused: {d}"))
    } else {
        CliError::Usage(format!("plan refused: direct: {d}; staged: {s}"))
    }
}

/// `auto`'s choice between the two plans: the connector's, with both refusals named when
/// they differ.
pub(crate) fn auto(
    direct: Result<TransferPlan, PlanError>,
    staged: Result<StagedPlan, PlanError>,
) -> Result<Picked, CliError> {
    match (direct, staged) {
        (Err(d), Err(s)) => Err(refused_both(&d, &s)),
        (d, s) => choose(d, s).map_err(|e| CliError::Usage(format!("plan refused: {e}"))),
    }
}
