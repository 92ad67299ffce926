//! The text form of a plan report: the sides, the sequences, the plan and why, then each
//! transfer and its runs, cut after `--show` runs with a count; block lists cut to ranges.

use std::fmt::Write as _;

use super::{PlanReport, SideReport, TransferReport};

/// `1 run`, `2 runs`.
pub(crate) fn runs(n: usize) -> String {
    format!("{n} run{}", if n == 1 { "" } else { "s" })
}

/// Block ids in their order for the text form: as a list up to [`IDS_SHOWN`] ids, else
/// runs of consecutive ids as half-open ranges (`0..1024`), the first [`IDS_SHOWN`] of them
/// and a count.
pub(crate) fn ids(blocks: &[u64]) -> String {
    if blocks.len() <= IDS_SHOWN {
        let list: Vec<String> = blocks.iter().map(u64::to_string).collect();
        return format!("[{}]", list.join(", "));
    }
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    for &b in blocks {
        match ranges.last_mut() {
            Some((_, end)) if *end == b => *end = b.saturating_add(1),
            _ => ranges.push((b, b.saturating_add(1))),
        }
    }
    let text: Vec<String> = ranges
        .iter()
        .take(IDS_SHOWN)
        .map(|&(s, e)| {
            if e - s == 1 {
                s.to_string()
            } else {
                format!("{s}..{e}")
            }
        })
        .collect();
    let more = if ranges.len() > IDS_SHOWN {
        ", ..."
    } else {
        ""
    };
    format!("[{}{more}] ({} ids)", text.join(", "), blocks.len())
}

/// Ids or ranges the text form lists.
const IDS_SHOWN: usize = 8;

impl PlanReport {
    /// The text form: header, then at most `show` runs.
    pub(crate) fn to_text(&self, show: usize) -> String {
        let mut out = String::new();
        let side = |out: &mut String, name: &str, s: &SideReport| {
            let ranks = if name == "SRC" {
                "ranks offered"
            } else {
                "rank"
            };
            let list: Vec<String> = s.ranks.iter().map(u64::to_string).collect();
            let _ = writeln!(out, "{name}  {}  [{}]", s.layout, s.role);
            let _ = writeln!(
                out,
                "     TP {}, {ranks} {}; {} KV heads per rank, model {} ({})",
                s.tp_size,
                list.join(","),
                s.heads_per_rank,
                s.model_kv_heads,
                s.model_kv_heads_from
            );
        };
        side(&mut out, "SRC", &self.src);
        side(&mut out, "DST", &self.dst);
        for (i, s) in self.sequences.iter().enumerate() {
            let _ = writeln!(
                out,
                "seq {i}: {} tokens, SRC blocks {} -> DST blocks {}",
                s.tokens,
                ids(&s.src_blocks),
                ids(&s.dst_blocks)
            );
        }
        let t = &self.totals;
        let _ = writeln!(
            out,
            "{} plan: {} (descriptors), {} bytes, from {} SRC rank(s), DST blocks {}",
            self.plan,
            runs(t.runs),
            t.bytes,
            t.transfers,
            ids(&t.dst_blocks)
        );
        let _ = writeln!(out, "  why: {}", self.why);
        if let Some(o) = &self.other {
            let _ = match (&o.refused, o.runs, o.bytes) {
                (Some(r), _, _) => writeln!(out, "  {} plan: refused: {r}", o.plan),
                (None, Some(n), Some(b)) => {
                    writeln!(out, "  {} plan: {}, {b} bytes", o.plan, runs(n))
                }
                _ => Ok(()),
            };
        }
        let mut shown = 0usize;
        for tr in &self.transfers {
            transfer_text(&mut out, tr, show, &mut shown);
        }
        if shown < t.runs {
            let _ = writeln!(
                out,
                "... {} more runs (--show N to print more, --json for all)",
                t.runs - shown
            );
        }
        out
    }
}

/// One transfer's header and as many of its runs as `show` leaves.
fn transfer_text(out: &mut String, tr: &TransferReport, show: usize, shown: &mut usize) {
    let [sh0, sh1] = tr.src_heads;
    let [dh0, dh1] = tr.dst_heads;
    let _ = writeln!(
        out,
        "SRC rank {}: heads {sh0}..{sh1} -> DST heads {dh0}..{dh1}, {}, {} bytes",
        tr.src_rank,
        runs(tr.runs.len()),
        tr.bytes
    );
    let dst = if let Some(s) = &tr.staging {
        let _ = writeln!(
            out,
            "  into staging {} ({:?} bytes); then scatter_blocks: staging block i -> DST \
             block {}[i], heads -> DST heads {dh0}..{dh1}",
            s.layout,
            s.buffer_bytes,
            ids(&s.dst_blocks)
        );
        "staging"
    } else {
        "DST"
    };
    let take = show.saturating_sub(*shown).min(tr.runs.len());
    if take == 0 {
        return;
    }
    let _ = writeln!(
        out,
        "  {:>6}  {:<18}  {:<22}  {:>10}",
        "run",
        "SRC buffer+offset",
        format!("{dst} buffer+offset"),
        "bytes"
    );
    for (i, r) in tr.runs.iter().take(take).enumerate() {
        let _ = writeln!(
            out,
            "  {i:>6}  {:<18}  {:<22}  {:>10}",
            format!("{}+{}", r.src_buffer, r.src_offset),
            format!("{}+{}", r.dst_buffer, r.dst_offset),
            r.len
        );
    }
    *shown += take;
}
