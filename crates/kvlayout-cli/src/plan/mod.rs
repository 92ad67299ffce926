//! `kvlayout plan SRC DST`: the transfer plan the connector makes for a DST (local, decode
//! side) rank to pull sequences from SRC (remote, prefill side) ranks, or its refusal.
//!
//! The command builds the handshake groups of both sides ([`groups`]: synthetic regions,
//! the handshake's checks), reads the sequences ([`seqs`]; without `--seq`, the
//! [`default_seq`]), asks the connector's planner for the direct and the staged plan (within
//! a size [`budget`]) and picks one ([`pick`]), and prints it ([`report`]). Every run and every refusal but the budget's is the connector's
//! own; this module computes no offset.

use clap::Args;
use kvlayout_connector::handshake::Limits;

use crate::CliError;

pub(crate) mod budget;
pub(crate) mod default_seq;
pub(crate) mod groups;
pub(crate) mod pick;
pub(crate) mod report;
pub(crate) mod seqs;

use groups::SideTp;
use pick::Mode;
use report::{PlanReport, SideReport};

/// The arguments of `kvlayout plan`.
#[derive(Debug, Args)]
pub(crate) struct PlanArgs {
    /// The SRC (remote, prefill) side: the layout of one of its ranks, the data pulled from.
    /// A preset, a spec string or a layout JSON file.
    #[arg(value_name = "SRC")]
    src: String,
    /// The DST (local, decode) side: the layout of one of its ranks, the data written to.
    #[arg(value_name = "DST")]
    dst: String,
    /// TP size of the SRC side.
    #[arg(long, value_name = "N", default_value_t = 1)]
    src_tp: u64,
    /// The SRC ranks the DST rank may read, comma-separated (all of them by default): a head
    /// that none of them holds is refused.
    #[arg(long, value_name = "R,..", value_delimiter = ',')]
    src_rank: Vec<u64>,
    /// TP size of the DST side.
    #[arg(long, value_name = "N", default_value_t = 1)]
    dst_tp: u64,
    /// The DST rank planned: it pulls the model heads it holds.
    #[arg(long, value_name = "R", default_value_t = 0)]
    dst_rank: u64,
    /// The model's KV heads (both sides). By default each side's is its layout's heads per
    /// rank times its TP size; state it when TP replicates heads (TP size above the heads).
    #[arg(long, value_name = "H")]
    model_heads: Option<u64>,
    /// One sequence (repeat per sequence): its SRC block ids, its DST block ids (each in
    /// token order, comma-separated) and its token count, `3,7,1:5,2:40`. Without TOKENS, what
    /// the shorter side's blocks hold. Without --seq: one sequence from SRC blocks 0.. to DST
    /// blocks 0.., of whole blocks on both sides (the block sizes' least common multiple of
    /// tokens), or of fewer tokens where a pool holds fewer. At most 1024 block ids per side.
    #[arg(
        long = "seq",
        value_name = "SRC_BLOCKS:DST_BLOCKS[:TOKENS]",
        allow_hyphen_values = true
    )]
    seqs: Vec<String>,
    /// Which plan: auto (the one with fewer descriptors, direct on a tie), cost (the cheaper
    /// under a cost model calibrated here: the memcpy engine and the --backend's post-receive
    /// pass), direct, staged.
    #[arg(long, value_enum, default_value_t = Mode::Auto)]
    mode: Mode,
    /// The DST backend whose post-receive pass (scatter_blocks) --mode cost measures.
    #[arg(long, value_name = "NAME", default_value = "cpu")]
    backend: String,
    /// Runs printed in text mode.
    #[arg(long, value_name = "N", default_value_t = 16)]
    show: usize,
    /// Print the plan as JSON: every run.
    #[arg(long)]
    json: bool,
}

/// The SRC ranks offered: those given, sorted and each once, or every rank (up to one past
/// the handshake's TP limit, which the handshake then refuses).
fn src_ranks(args: &PlanArgs) -> Vec<u64> {
    if args.src_rank.is_empty() {
        let shown = args.src_tp.min(Limits::default().max_tp.saturating_add(1));
        return (0..shown.max(1)).collect();
    }
    let mut ranks = args.src_rank.clone();
    ranks.sort_unstable();
    ranks.dedup();
    ranks
}

/// Runs `kvlayout plan`.
pub(crate) fn run(args: &PlanArgs) -> Result<String, CliError> {
    let (src, dst) = (crate::load(&args.src)?, crate::load(&args.dst)?);
    let seqs = seqs::sequences(&args.seqs, &src, &dst)?;
    let src_tp = SideTp {
        tp_size: args.src_tp,
        ranks: src_ranks(args),
        model_heads: args.model_heads,
    };
    let dst_tp = SideTp {
        tp_size: args.dst_tp,
        ranks: vec![args.dst_rank],
        model_heads: args.model_heads,
    };
    let sides = groups::sides((&src, &src_tp), (&dst, &dst_tp))?;
    budget::check(&src, &dst, &seqs)?;
    let picked = pick::pick(&sides, &seqs, args.mode, &args.backend)?;
    let (totals, transfers) = report::plan_parts(&picked);
    let stated = args.model_heads.is_some();
    let report = PlanReport {
        src: SideReport::new("remote (prefill side): read from", &sides.src, stated),
        dst: SideReport::new(
            "local (decode side): written to",
            std::slice::from_ref(&sides.dst),
            stated,
        ),
        addresses: report::ADDRESSES,
        sequences: report::seq_reports(&seqs),
        plan: picked.plan.kind(),
        why: picked.why.clone(),
        other: report::other_report(&picked),
        totals,
        transfers,
    };
    if args.json {
        crate::json(&report)
    } else {
        Ok(report.to_text(args.show))
    }
}
