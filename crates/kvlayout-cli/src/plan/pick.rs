//! Direct or staged: both plans come from the connector's planner ([`plan_pull`],
//! [`plan_pull_staged`]); this module only chooses between them and keeps the other's size
//! or refusal for the report.
//!
//! `auto` takes the plan with fewer descriptors (runs on the wire), the direct one on a tie
//! because it needs no post-receive pass. Orders that differ (NHD against HND) are what make
//! the staged plan the smaller: the direct one moves one row per run there.

use clap::ValueEnum;
use kvlayout_connector::plan::{plan_pull, PlanError, SeqBlocks, TransferPlan};
use kvlayout_connector::staged::{plan_pull_staged, StagedPlan};

use super::groups::Sides;
use crate::CliError;

/// Which plan `kvlayout plan` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Mode {
    /// The plan with fewer descriptors; the direct one on a tie.
    Auto,
    /// Every byte straight into its place in the DST cache.
    Direct,
    /// Into a staging cache in the SRC order, then `scatter_blocks` on the DST backend.
    Staged,
}

/// The plan chosen.
#[derive(Debug, Clone)]
pub(crate) enum Chosen {
    /// A direct plan.
    Direct(TransferPlan),
    /// A staged plan.
    Staged(StagedPlan),
}

impl Chosen {
    /// `direct` or `staged`.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Chosen::Direct(_) => "direct",
            Chosen::Staged(_) => "staged",
        }
    }

    /// Descriptors (runs) on the wire.
    pub(crate) fn descriptors(&self) -> usize {
        match self {
            Chosen::Direct(p) => p.descriptors(),
            Chosen::Staged(p) => p.descriptors(),
        }
    }

    /// Bytes on the wire.
    pub(crate) fn bytes(&self) -> u64 {
        match self {
            Chosen::Direct(p) => p.bytes(),
            Chosen::Staged(p) => p.bytes(),
        }
    }
}

/// A plan's size, or the planner's refusal.
pub(crate) type Outcome = Result<Chosen, PlanError>;

/// The chosen plan, why, and the other plan's size or refusal (`None` when it was not asked
/// for).
#[derive(Debug, Clone)]
pub(crate) struct Picked {
    /// The plan printed.
    pub chosen: Chosen,
    /// Why this one.
    pub why: String,
    /// The other plan: its kind, and its plan or refusal.
    pub other: Option<(&'static str, Outcome)>,
}

/// The direct plan, from the connector.
pub(crate) fn direct(sides: &Sides, seqs: &[SeqBlocks]) -> Outcome {
    plan_pull(&sides.dst, &sides.src, seqs).map(Chosen::Direct)
}

/// The staged plan, from the connector.
pub(crate) fn staged(sides: &Sides, seqs: &[SeqBlocks]) -> Outcome {
    plan_pull_staged(&sides.dst, &sides.src, seqs).map(Chosen::Staged)
}

/// A refusal as the one error line: the plan's kind and the planner's reason.
fn refused(kind: &str, e: &PlanError) -> CliError {
    CliError::Usage(format!("{kind} plan refused: {e}"))
}

/// The plan `mode` asks for, or the planner's refusal.
pub(crate) fn pick(sides: &Sides, seqs: &[SeqBlocks], mode: Mode) -> Result<Picked, CliError> {
    match mode {
        Mode::Direct => Ok(Picked {
            chosen: direct(sides, seqs).map_err(|e| refused("direct", &e))?,
            why: "asked for (--mode direct)".into(),
            other: None,
        }),
        Mode::Staged => Ok(Picked {
            chosen: staged(sides, seqs).map_err(|e| refused("staged", &e))?,
            why: "asked for (--mode staged)".into(),
            other: None,
        }),
        Mode::Auto => auto(direct(sides, seqs), staged(sides, seqs)),
    }
}

/// `auto`'s choice between the two plans.
pub(crate) fn auto(direct: Outcome, staged: Outcome) -> Result<Picked, CliError> {
    match (direct, staged) {
        (Ok(d), Ok(s)) if s.descriptors() < d.descriptors() => Ok(Picked {
            why: format!(
                "fewer descriptors than the direct plan's {} (the staged plan moves whole \
                 page slices; scatter_blocks then converts on the DST backend)",
                d.descriptors()
            ),
            chosen: s,
            other: Some(("direct", Ok(d))),
        }),
        (Ok(d), s) => Ok(Picked {
            why: match &s {
                Ok(s) => format!(
                    "no more descriptors than the staged plan's {}, and no post-receive pass",
                    s.descriptors()
                ),
                Err(_) => "the staged plan is refused".into(),
            },
            chosen: d,
            other: Some(("staged", s)),
        }),
        (Err(e), Ok(s)) => Ok(Picked {
            why: format!("the direct plan is refused: {e}"),
            chosen: s,
            other: Some(("direct", Err(e))),
        }),
        (Err(d), Err(s)) if d == s => Err(CliError::Usage(format!("plan refused: {d}"))),
        (Err(d), Err(s)) => Err(CliError::Usage(format!(
            "plan refused: direct: {d}; staged: {s}"
        ))),
    }
}
