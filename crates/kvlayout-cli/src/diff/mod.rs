//! `kvlayout diff A B`: whether two layouts address every element alike
//! ([`KvCacheLayout::same_addressing`]), each difference ([`fields`]), and what a transfer
//! from A to B needs: the connector's handshake check, then its direct and staged plans for
//! `kvlayout plan`'s default sequence ([`default_seq()`]: whole blocks on both sides, or
//! fewer tokens where a pool holds fewer), and which of them `kvlayout plan` would pick.
//!
//! Exit status as diff(1): 0 when the layouts address every element alike (differences that
//! move no element, such as the order of an axis of extent 1, are listed all the same), 1
//! when they do not, 2 on an error. It computes no offset or stride.

use std::fmt::Write as _;

use clap::Args;
use kvlayout::KvCacheLayout;
use serde::Serialize;

use crate::plan::budget;
use crate::plan::default_seq::default_seq;
use crate::plan::groups::{self, SideTp};
use kvlayout_connector::plan::PlanError;

use crate::plan::pick;
use crate::plan::report::ids;
use crate::CliError;

mod fields;

use fields::{ExtentDifference, SpecDifference, StrideDifference};

/// The arguments of `kvlayout diff`.
#[derive(Debug, Args)]
pub(crate) struct DiffArgs {
    /// Layout A (the SRC of the transfer considered).
    #[arg(value_name = "A", help = crate::SPEC_HELP)]
    a: String,
    /// Layout B (the DST of the transfer considered).
    #[arg(value_name = "B", help = crate::SPEC_HELP)]
    b: String,
    /// Print the comparison as JSON.
    #[arg(long)]
    json: bool,
}

/// A plan's size, or the planner's refusal.
#[derive(Debug, Serialize)]
struct PlanSize {
    #[serde(skip_serializing_if = "Option::is_none")]
    runs: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    refused: Option<String>,
}

impl PlanSize {
    /// A plan's descriptors and bytes, or the planner's refusal.
    fn new(o: Result<(usize, u64), &PlanError>) -> Self {
        match o {
            Ok((runs, bytes)) => PlanSize {
                runs: Some(runs),
                bytes: Some(bytes),
                refused: None,
            },
            Err(e) => PlanSize {
                runs: None,
                bytes: None,
                refused: Some(e.to_string()),
            },
        }
    }
}

/// What a transfer from A to B needs.
#[derive(Debug, Serialize)]
struct TransferNeed {
    /// The sequence planned: its tokens, from `src_blocks` into `dst_blocks`.
    tokens: u64,
    /// Why that many tokens: whole blocks on both sides, or what a pool holds.
    tokens_why: String,
    src_blocks: Vec<u64>,
    dst_blocks: Vec<u64>,
    /// `direct`, `staged`, `refused`, or `not planned` (over the CLI's size budget).
    needs: &'static str,
    /// Why, or the refusal.
    reason: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    direct: Option<PlanSize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    staged: Option<PlanSize>,
}

/// The comparison.
#[derive(Debug, Serialize)]
struct DiffReport {
    a: String,
    b: String,
    /// Whether every element has the same buffer and offset (and dtype, scales) in both.
    byte_compatible: bool,
    /// `same`, or the first difference in addressing.
    addressing: String,
    spec_differences: Vec<SpecDifference>,
    stride_differences: Vec<StrideDifference>,
    extent_differences: Vec<ExtentDifference>,
    /// Data bytes of one (layer, block): `[A, B]`.
    dense_page_bytes: [u64; 2],
    /// Page stride with padding where pages are contiguous: `[A, B]`, `null` where not.
    padded_page_bytes: [Option<u64>; 2],
    transfer: TransferNeed,
}

/// What a transfer from A to B at TP 1 each needs.
fn transfer(a: &KvCacheLayout, b: &KvCacheLayout) -> TransferNeed {
    let planned = default_seq(a, b);
    let tokens_why = planned.why("A", "B");
    let seq = planned.seq;
    let tp = |l: &KvCacheLayout| SideTp {
        tp_size: 1,
        ranks: vec![0],
        model_heads: Some(l.geometry().num_kv_heads),
    };
    let mut need = TransferNeed {
        tokens: seq.tokens,
        tokens_why,
        src_blocks: seq.remote.clone(),
        dst_blocks: seq.local.clone(),
        needs: "refused",
        reason: String::new(),
        direct: None,
        staged: None,
    };
    let sides = match groups::sides((a, &tp(a)), (b, &tp(b))) {
        Ok(s) => s,
        Err(e) => {
            need.reason = format!("{e} (A and B at TP 1 each; kvlayout plan takes TP sizes)");
            return need;
        }
    };
    let seqs = [seq];
    if let Err(e) = budget::check(a, b, &seqs) {
        need.needs = "not planned";
        need.reason = e.to_string();
        return need;
    }
    let (direct, staged) = (pick::direct(&sides, &seqs), pick::staged(&sides, &seqs));
    need.direct = Some(PlanSize::new(
        direct.as_ref().map(|p| (p.descriptors(), p.bytes())),
    ));
    need.staged = Some(PlanSize::new(
        staged.as_ref().map(|p| (p.descriptors(), p.bytes())),
    ));
    match pick::auto(direct, staged) {
        Ok(p) => {
            need.needs = p.plan.kind();
            need.reason = p.why;
        }
        Err(e) => need.reason = e.to_string(),
    }
    need
}

/// Runs `kvlayout diff`.
pub(crate) fn run(args: &DiffArgs) -> Result<String, CliError> {
    let (a, b) = (crate::load(&args.a)?, crate::load(&args.b)?);
    let addressing = a.same_addressing(&b);
    let report = DiffReport {
        a: a.to_string(),
        b: b.to_string(),
        byte_compatible: addressing.is_ok(),
        addressing: match &addressing {
            Ok(()) => "same".into(),
            Err(e) => e.to_string(),
        },
        spec_differences: fields::spec_differences(&a, &b),
        stride_differences: fields::stride_differences(&a, &b),
        extent_differences: fields::extent_differences(&a, &b),
        dense_page_bytes: [a.dense_page_bytes(), b.dense_page_bytes()],
        padded_page_bytes: [a.explain().padded_page_bytes, b.explain().padded_page_bytes],
        transfer: transfer(&a, &b),
    };
    let text = if args.json {
        crate::json(&report)?
    } else {
        report.to_text()
    };
    if report.byte_compatible {
        return Ok(text);
    }
    // The comparison goes to stdout all the same: it is what shows the differences.
    let _ = crate::emit(&text);
    Err(CliError::Check(report.addressing))
}

impl DiffReport {
    fn to_text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "A  {}\nB  {}", self.a, self.b);
        let _ = if self.byte_compatible {
            writeln!(out, "byte-compatible: every element at the same place")
        } else {
            writeln!(out, "not byte-compatible: {}", self.addressing)
        };
        if !self.spec_differences.is_empty() {
            let _ = writeln!(out, "spec, field by field (A vs B):");
            for d in &self.spec_differences {
                let _ = writeln!(out, "  {:<28} {} vs {}", d.path, d.a, d.b);
            }
        }
        if !self.stride_differences.is_empty() {
            let _ = writeln!(out, "strides in bytes, stride by stride (A vs B):");
            let show = |v: Option<u64>| v.map_or("absent".into(), |v| v.to_string());
            for d in &self.stride_differences {
                let note = if d.matters {
                    ""
                } else {
                    "  (axis of extent 1: moves no element)"
                };
                let _ = writeln!(
                    out,
                    "  {:<8} {:<12} {} vs {}{note}",
                    d.field,
                    d.stride,
                    show(d.a),
                    show(d.b)
                );
            }
        }
        let span = |x: Option<[u64; 2]>| x.map_or("absent".into(), |[s, e]| format!("{s}..{e}"));
        for d in &self.extent_differences {
            let _ = writeln!(
                out,
                "registered span of buffer {}: {} vs {} bytes",
                d.buffer,
                span(d.a),
                span(d.b)
            );
        }
        let [pa, pb] = self.padded_page_bytes;
        let page = |p: Option<u64>| p.map_or("-".into(), |p| p.to_string());
        let _ = writeln!(
            out,
            "page: {} vs {} data bytes, padded page {} vs {} bytes",
            self.dense_page_bytes[0],
            self.dense_page_bytes[1],
            page(pa),
            page(pb)
        );
        self.transfer_text(&mut out);
        out
    }

    fn transfer_text(&self, out: &mut String) {
        let t = &self.transfer;
        let _ = writeln!(
            out,
            "transfer A -> B (TP 1 each): A blocks {} -> B blocks {}, {} tokens ({})",
            ids(&t.src_blocks),
            ids(&t.dst_blocks),
            t.tokens,
            t.tokens_why
        );
        for (name, size) in [("direct", &t.direct), ("staged", &t.staged)] {
            let Some(size) = size else { continue };
            let _ = match (&size.refused, size.runs, size.bytes) {
                (Some(r), _, _) => writeln!(out, "  {name}: refused: {r}"),
                (None, Some(n), Some(b)) => {
                    let then = if name == "staged" {
                        ", then scatter_blocks on B's backend"
                    } else {
                        ""
                    };
                    writeln!(
                        out,
                        "  {name}: {}, {b} bytes{then}",
                        crate::plan::report::runs(n)
                    )
                }
                _ => Ok(()),
            };
        }
        let _ = writeln!(out, "  needs: {}: {}", t.needs, t.reason);
    }
}
