//! What `kvlayout plan` prints: the report of a plan the connector made, as JSON (every run)
//! and as text ([`text`]: a header, then the runs, cut after `--show` of them with a count).
//!
//! It copies the connector's runs as they are; it computes no offset.

use std::ops::Range;

use kvlayout::ops::CopyRun;
use kvlayout::KvCacheLayout;
use kvlayout_connector::handshake::{CacheGroup, MemRegion};
use kvlayout_connector::plan::SeqBlocks;
use serde::Serialize;

use super::pick::{Chosen, Outcome, Picked};

mod text;

pub(crate) use text::{ids, runs};

/// Says what the region addresses are.
pub(crate) const ADDRESSES: &str = "synthetic: regions are placed one after another from a \
made-up base, each as long as its buffer's registered span, only to run the handshake's checks; \
runs are buffer offsets, which is what an engine reads and writes";

/// One side of the transfer.
#[derive(Debug, Serialize)]
pub(crate) struct SideReport {
    /// `remote (prefill side): read from` or `local (decode side): written to`.
    pub role: &'static str,
    /// The layout of one rank, as a canonical spec string.
    pub layout: String,
    /// TP size.
    pub tp_size: u64,
    /// DST: the rank planned. SRC: the ranks offered.
    pub ranks: Vec<u64>,
    /// KV heads of one rank's layout.
    pub heads_per_rank: u64,
    /// The model's KV heads.
    pub model_kv_heads: u64,
    /// Where `model_kv_heads` comes from.
    pub model_kv_heads_from: &'static str,
    /// Each buffer's synthetic region (the same for every rank of the side).
    pub regions: Vec<RegionReport>,
}

/// A synthetic registered region.
#[derive(Debug, Serialize)]
pub(crate) struct RegionReport {
    /// Buffer index.
    pub buffer: usize,
    /// Synthetic address of byte 0.
    pub base: u64,
    /// Bytes registered: the buffer's registered span.
    pub len: u64,
}

impl SideReport {
    /// The report of `groups` (one or more ranks of one side).
    pub(crate) fn new(role: &'static str, groups: &[CacheGroup], stated: bool) -> Self {
        let first = &groups[0];
        SideReport {
            role,
            layout: first.layout.to_string(),
            tp_size: first.tp_size,
            ranks: groups.iter().map(|g| g.tp_rank).collect(),
            heads_per_rank: first.layout.geometry().num_kv_heads,
            model_kv_heads: first.total_kv_heads,
            model_kv_heads_from: if stated {
                "stated (--model-heads)"
            } else {
                "heads per rank x TP size"
            },
            regions: regions(&first.regions),
        }
    }
}

fn regions(r: &[MemRegion]) -> Vec<RegionReport> {
    r.iter()
        .enumerate()
        .map(|(buffer, m)| RegionReport {
            buffer,
            base: m.base,
            len: m.len,
        })
        .collect()
}

/// One sequence's blocks.
#[derive(Debug, Serialize)]
pub(crate) struct SeqReport {
    /// SRC block ids, in token order.
    pub src_blocks: Vec<u64>,
    /// DST block ids, in token order.
    pub dst_blocks: Vec<u64>,
    /// Tokens moved.
    pub tokens: u64,
}

/// One run: `len` bytes from a SRC buffer offset to a DST (or staging) buffer offset.
#[derive(Debug, Serialize)]
pub(crate) struct RunReport {
    src_buffer: u32,
    src_offset: u64,
    dst_buffer: u32,
    dst_offset: u64,
    len: u64,
}

impl From<&CopyRun> for RunReport {
    fn from(r: &CopyRun) -> Self {
        RunReport {
            src_buffer: r.src_buffer,
            src_offset: r.src_offset,
            dst_buffer: r.dst_buffer,
            dst_offset: r.dst_offset,
            len: r.len,
        }
    }
}

/// The staging cache of a staged transfer.
#[derive(Debug, Serialize)]
pub(crate) struct StagingReport {
    /// Its layout (SRC order, dense, the heads read, the DST block size).
    layout: String,
    /// Bytes of each staging buffer the engine must hold.
    buffer_bytes: Vec<u64>,
    /// The DST block each staging block is scattered to, by staging block.
    dst_blocks: Vec<u64>,
}

/// What moves from one SRC rank.
#[derive(Debug, Serialize)]
pub(crate) struct TransferReport {
    src_rank: u64,
    /// Heads read, in the SRC rank's layout: `[start, end)`.
    src_heads: [u64; 2],
    /// Heads filled, in the DST layout: `[start, end)`.
    dst_heads: [u64; 2],
    /// `dst`: runs write the DST cache. `staging`: they write the staging cache.
    into: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    staging: Option<StagingReport>,
    bytes: u64,
    runs: Vec<RunReport>,
}

fn pair(r: &Range<u64>) -> [u64; 2] {
    [r.start, r.end]
}

/// The other plan's size or refusal.
#[derive(Debug, Serialize)]
pub(crate) struct OtherReport {
    plan: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    runs: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    refused: Option<String>,
}

impl OtherReport {
    fn new(plan: &'static str, outcome: &Outcome) -> Self {
        match outcome {
            Ok(c) => OtherReport {
                plan,
                runs: Some(c.descriptors()),
                bytes: Some(c.bytes()),
                refused: None,
            },
            Err(e) => OtherReport {
                plan,
                runs: None,
                bytes: None,
                refused: Some(e.to_string()),
            },
        }
    }
}

/// The plan's totals.
#[derive(Debug, Serialize)]
pub(crate) struct Totals {
    transfers: usize,
    runs: usize,
    bytes: u64,
    /// The DST blocks written, ascending.
    dst_blocks: Vec<u64>,
}

/// The whole report.
#[derive(Debug, Serialize)]
pub(crate) struct PlanReport {
    pub src: SideReport,
    pub dst: SideReport,
    pub addresses: &'static str,
    pub sequences: Vec<SeqReport>,
    /// `direct` or `staged`.
    pub plan: &'static str,
    pub why: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub other: Option<OtherReport>,
    pub totals: Totals,
    pub transfers: Vec<TransferReport>,
}

/// The sequences as reported.
pub(crate) fn seq_reports(seqs: &[SeqBlocks]) -> Vec<SeqReport> {
    seqs.iter()
        .map(|s| SeqReport {
            src_blocks: s.remote.clone(),
            dst_blocks: s.local.clone(),
            tokens: s.tokens,
        })
        .collect()
}

/// The transfers and totals of a plan.
pub(crate) fn plan_parts(picked: &Picked) -> (Totals, Vec<TransferReport>) {
    let runs = |r: &[CopyRun]| r.iter().map(RunReport::from).collect();
    let bytes = |r: &[CopyRun]| kvlayout::ops::run_bytes(r);
    let (transfers, dst_blocks): (Vec<TransferReport>, Vec<u64>) = match &picked.plan {
        Chosen::Direct(p) => (
            p.transfers
                .iter()
                .map(|t| TransferReport {
                    src_rank: t.remote_rank,
                    src_heads: pair(&t.remote_heads),
                    dst_heads: pair(&t.local_heads()),
                    into: "dst",
                    staging: None,
                    bytes: bytes(&t.runs),
                    runs: runs(&t.runs),
                })
                .collect(),
            p.local_blocks.clone(),
        ),
        Chosen::Staged(p) => (
            p.transfers
                .iter()
                .map(|t| TransferReport {
                    src_rank: t.remote_rank,
                    src_heads: pair(&t.remote_heads),
                    dst_heads: pair(&t.local_heads),
                    into: "staging",
                    staging: Some(StagingReport {
                        layout: t.staging.to_string(),
                        buffer_bytes: staging_bytes(&t.staging),
                        dst_blocks: t.local_blocks.clone(),
                    }),
                    bytes: bytes(&t.runs),
                    runs: runs(&t.runs),
                })
                .collect(),
            p.local_blocks(),
        ),
    };
    let totals = Totals {
        transfers: transfers.len(),
        runs: picked.plan.descriptors(),
        bytes: picked.plan.bytes(),
        dst_blocks,
    };
    (totals, transfers)
}

fn staging_bytes(l: &KvCacheLayout) -> Vec<u64> {
    l.extents().iter().map(|x| x.end).collect()
}

/// The other plan of `picked`, as reported.
pub(crate) fn other_report(picked: &Picked) -> Option<OtherReport> {
    picked
        .other
        .as_ref()
        .map(|a| OtherReport::new(a.kind, &a.plan))
}
