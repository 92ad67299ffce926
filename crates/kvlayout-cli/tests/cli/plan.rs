//! `kvlayout plan`: the JSON plan is the connector's plan run for run, and its runs, applied
//! as memcpys on random bytes (a staged plan's scatter applied through the offsets), put
//! every element of every sequence where the descriptor's offset function says; TP 1 to TP 2
//! covers every head exactly once; the default sequence fits both pools; the text form's
//! header and its cut.

use kvlayout::{Coord, KvCacheLayout};
use kvlayout_connector::handshake::CacheGroup;
use kvlayout_connector::plan::{plan_pull, SeqBlocks};
use kvlayout_connector::staged::plan_pull_staged;
use serde_json::Value;

use super::{ok, parse_json, u64s};

const NHD: &str = "kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=NHD";
const HND: &str = "kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=HND";
const NHD_32: &str = "kv L=1 B=3 N=32 H=4 D=8 dtype=f16 order=NHD";
const HND_H2_PADDED: &str = "kv L=2 B=3 N=16 H=2 D=8 dtype=f16 order=HND page=2048";
const NHD_H2: &str = "kv L=2 B=3 N=16 H=2 D=8 dtype=f16 order=NHD";
const NHD_L2: &str = "kv L=2 B=3 N=16 H=4 D=8 dtype=f16 order=NHD";
const H1_NHD: &str = "kv L=2 B=2 N=16 H=1 D=8 dtype=bf16 order=NHD";
const H1_HND: &str = "kv L=2 B=2 N=16 H=1 D=8 dtype=bf16 order=HND";
/// K and V in two buffers.
const SEPARATE: &str = "kv L=1 B=3 N=16 H=4 D=8 dtype=f16 tensor=separate-hnd";
/// vLLM's key split into 16-byte pieces.
const VLLM: &str = "kv L=1 B=3 N=16 H=4 D=8 dtype=f16 tensor=vllm-paged-v1";

/// One `kvlayout plan` case: the layouts, the TP placement and the sequences.
struct Case {
    src: &'static str,
    dst: &'static str,
    src_tp: u64,
    dst_tp: u64,
    dst_rank: u64,
    /// `(src blocks, dst blocks, tokens)`.
    seqs: Vec<(Vec<u64>, Vec<u64>, u64)>,
    mode: &'static str,
}

impl Case {
    fn args(&self) -> Vec<String> {
        let mut a: Vec<String> = vec!["plan".into(), self.src.into(), self.dst.into()];
        for (flag, v) in [
            ("--src-tp", self.src_tp),
            ("--dst-tp", self.dst_tp),
            ("--dst-rank", self.dst_rank),
        ] {
            a.extend([flag.to_string(), v.to_string()]);
        }
        for (s, d, t) in &self.seqs {
            let list = |b: &[u64]| b.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
            a.extend(["--seq".into(), format!("{}:{}:{t}", list(s), list(d))]);
        }
        a.extend(["--mode".into(), self.mode.into(), "--json".into()]);
        a
    }

    fn json(&self) -> Value {
        let args = self.args();
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let v = parse_json(&ok(&refs));
        assert_eq!(v["version"], 2);
        v
    }

    fn layouts(&self) -> (KvCacheLayout, KvCacheLayout) {
        (self.src.parse().unwrap(), self.dst.parse().unwrap())
    }

    fn model_heads(&self) -> u64 {
        self.layouts().0.geometry().num_kv_heads * self.src_tp
    }
}

fn cases() -> Vec<Case> {
    let case = |src, dst, src_tp, dst_tp, dst_rank, seqs, mode| Case {
        src,
        dst,
        src_tp,
        dst_tp,
        dst_rank,
        seqs,
        mode,
    };
    let two_seqs = || vec![(vec![2, 0], vec![1], 32), (vec![1], vec![2], 11)];
    vec![
        // Same order, different block size: direct.
        case(NHD, NHD_32, 1, 1, 0, two_seqs(), "auto"),
        // NHD vs HND: staged, and the direct plan of the same pull.
        case(
            NHD,
            HND,
            1,
            1,
            0,
            vec![(vec![2, 0], vec![1, 2], 25)],
            "auto",
        ),
        case(
            NHD,
            HND,
            1,
            1,
            0,
            vec![(vec![2, 0], vec![1, 2], 25)],
            "direct",
        ),
        // TP 1 -> TP 2 into padded HND pages, each rank, both plans.
        case(
            NHD_L2,
            HND_H2_PADDED,
            1,
            2,
            0,
            vec![(vec![2], vec![0], 16)],
            "auto",
        ),
        case(
            NHD_L2,
            HND_H2_PADDED,
            1,
            2,
            1,
            vec![(vec![2], vec![0], 16)],
            "direct",
        ),
        // TP 2 -> TP 1: heads gathered from two SRC ranks.
        case(
            NHD_H2,
            NHD_L2,
            2,
            1,
            0,
            vec![(vec![1, 2], vec![2, 0], 20)],
            "auto",
        ),
        case(
            NHD_H2,
            NHD_L2,
            2,
            1,
            0,
            vec![(vec![1, 2], vec![2, 0], 20)],
            "staged",
        ),
        // One head, two blocks: the order makes no difference, auto stays direct.
        case(
            H1_NHD,
            H1_HND,
            1,
            1,
            0,
            vec![(vec![1, 0], vec![0, 1], 30)],
            "auto",
        ),
        // Two SRC buffers; a split key (no staging: the SRC is not paged).
        case(
            SEPARATE,
            NHD,
            1,
            1,
            0,
            vec![(vec![1, 2], vec![2, 0], 30)],
            "auto",
        ),
        case(VLLM, HND, 1, 1, 0, vec![(vec![2], vec![1], 16)], "auto"),
        case(
            NHD,
            VLLM,
            1,
            1,
            0,
            vec![(vec![0, 2], vec![2, 1], 20)],
            "staged",
        ),
    ]
}

fn seq_blocks(c: &Case) -> Vec<SeqBlocks> {
    c.seqs
        .iter()
        .map(|(s, d, t)| SeqBlocks {
            remote: s.clone(),
            local: d.clone(),
            tokens: *t,
        })
        .collect()
}

fn group(layout: &KvCacheLayout, total: u64, tp_size: u64, tp_rank: u64) -> CacheGroup {
    CacheGroup {
        name: "attn".into(),
        layout: layout.clone(),
        total_kv_heads: total,
        tp_size,
        tp_rank,
        regions: Vec::new(),
    }
}

/// `(src_buffer, src_offset, dst_buffer, dst_offset, len)` of every run of a JSON transfer.
fn json_runs(t: &Value) -> Vec<[u64; 5]> {
    let runs = t["runs"].as_array().expect("runs");
    runs.iter()
        .map(|r| {
            let n = |k: &str| r[k].as_u64().unwrap_or_else(|| panic!("{k} in {r}"));
            [
                n("src_buffer"),
                n("src_offset"),
                n("dst_buffer"),
                n("dst_offset"),
                n("len"),
            ]
        })
        .collect()
}

#[test]
fn plan_json_is_the_connectors_plan_run_for_run() {
    for c in cases() {
        let v = c.json();
        let (src, dst) = c.layouts();
        let total = c.model_heads();
        let local = group(&dst, total, c.dst_tp, c.dst_rank);
        let remotes: Vec<CacheGroup> = (0..c.src_tp)
            .map(|r| group(&src, total, c.src_tp, r))
            .collect();
        let seqs = seq_blocks(&c);
        let plan = v["plan"].as_str().unwrap();
        let expected: Vec<(u64, Vec<[u64; 5]>)> = if plan == "direct" {
            let p = plan_pull(&local, &remotes, &seqs).unwrap();
            assert_eq!(u64s(&v["totals"]["dst_blocks"]), p.local_blocks);
            assert_eq!(v["totals"]["bytes"].as_u64(), Some(p.bytes()));
            let runs = |t: &kvlayout_connector::plan::RankTransfer| {
                let r = t.runs.iter();
                r.map(|r| {
                    let (sb, db) = (u64::from(r.src_buffer), u64::from(r.dst_buffer));
                    [sb, r.src_offset, db, r.dst_offset, r.len]
                })
                .collect()
            };
            p.transfers
                .iter()
                .map(|t| (t.remote_rank, runs(t)))
                .collect()
        } else {
            let p = plan_pull_staged(&local, &remotes, &seqs).unwrap();
            assert_eq!(u64s(&v["totals"]["dst_blocks"]), p.local_blocks());
            assert_eq!(v["totals"]["bytes"].as_u64(), Some(p.bytes()));
            for (t, j) in p.transfers.iter().zip(v["transfers"].as_array().unwrap()) {
                assert_eq!(j["staging"]["layout"], t.staging.to_string());
                assert_eq!(u64s(&j["staging"]["dst_blocks"]), t.local_blocks);
            }
            let runs = |t: &kvlayout_connector::staged::StagedTransfer| {
                let r = t.runs.iter();
                r.map(|r| {
                    let (sb, db) = (u64::from(r.src_buffer), u64::from(r.dst_buffer));
                    [sb, r.src_offset, db, r.dst_offset, r.len]
                })
                .collect()
            };
            p.transfers
                .iter()
                .map(|t| (t.remote_rank, runs(t)))
                .collect()
        };
        let got: Vec<(u64, Vec<[u64; 5]>)> = v["transfers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| (t["src_rank"].as_u64().unwrap(), json_runs(t)))
            .collect();
        assert_eq!(got, expected, "{}", c.args().join(" "));
        let n: usize = got.iter().map(|(_, r)| r.len()).sum();
        assert_eq!(v["totals"]["runs"].as_u64(), Some(n as u64));
        if c.mode != "auto" {
            assert_eq!(plan, c.mode);
        }
    }
}

#[test]
fn auto_picks_staged_only_where_the_orders_move_elements() {
    let plans: Vec<(String, String)> = cases()
        .iter()
        .filter(|c| c.mode == "auto")
        .map(|c| (c.dst.to_string(), c.json()["plan"].as_str().unwrap().into()))
        .collect();
    let kind = |dst: &str| plans.iter().find(|p| p.0 == dst).unwrap().1.clone();
    assert_eq!(kind(NHD_32), "direct");
    assert_eq!(kind(HND), "staged");
    assert_eq!(kind(H1_HND), "direct", "H=1: NHD and HND address alike");
}

#[test]
fn cost_mode_calibrates_here_and_states_both_costs() {
    let v = parse_json(&ok(&["plan", NHD, HND, "--mode", "cost", "--json"]));
    let why = v["why"].as_str().unwrap();
    assert!(
        why.starts_with("cheaper: direct ") || why.starts_with("no dearer: direct "),
        "{why}"
    );
    assert!(
        why.contains(", staged ") && why.contains(" ms (descriptors "),
        "{why}"
    );
    assert!(
        why.contains("(calibrated: memcpy engine, cpu backend"),
        "{why}"
    );
    // The plan taken is the connector's plan of its kind; the other is reported beside it.
    let kind = v["plan"].as_str().unwrap();
    let other = v["other"]["plan"].as_str().unwrap();
    assert!(matches!(
        (kind, other),
        ("direct", "staged") | ("staged", "direct")
    ));
    let cheaper = why.starts_with("cheaper");
    assert_eq!(kind, if cheaper { "staged" } else { "direct" }, "{why}");
    let asked = parse_json(&ok(&["plan", NHD, HND, "--mode", kind, "--json"]));
    assert_eq!(v["transfers"], asked["transfers"]);
    // The backend is opened by name: an unknown one is refused in one line.
    let e = super::user_error(&["plan", NHD, HND, "--mode", "cost", "--backend", "nope"]);
    assert!(
        e.contains("--backend \"nope\" is not a backend name"),
        "{e}"
    );
}

#[path = "plan_apply.rs"]
mod apply;
#[path = "plan_execute.rs"]
mod execute;

#[test]
fn plan_runs_applied_as_memcpys_put_every_element_in_place() {
    for c in cases() {
        let v = c.json();
        apply::check(&c, &v);
    }
}

#[test]
fn tp1_to_tp2_both_ranks_cover_every_head_exactly_once() {
    let mut covered = vec![0u32; 4];
    for rank in 0..2 {
        let c = Case {
            src: NHD_L2,
            dst: HND_H2_PADDED,
            src_tp: 1,
            dst_tp: 2,
            dst_rank: rank,
            seqs: vec![(vec![0, 1], vec![2, 1], 32)],
            mode: "auto",
        };
        let v = c.json();
        for t in v["transfers"].as_array().unwrap() {
            let [s0, s1] = [0, 1].map(|i| t["src_heads"][i].as_u64().unwrap());
            let [d0, d1] = [0, 1].map(|i| t["dst_heads"][i].as_u64().unwrap());
            assert_eq!(s1 - s0, d1 - d0);
            // SRC rank 0 of TP 1 holds model heads 0..4: its head index is the model's.
            for (h, d) in (s0..s1).zip(d0..d1) {
                assert_eq!(h, rank * 2 + d, "rank {rank}");
                covered[h as usize] += 1;
            }
        }
        apply::check(&c, &v);
    }
    assert_eq!(covered, vec![1, 1, 1, 1]);
}

#[test]
fn plan_text_has_the_header_and_cuts_the_runs_with_a_count() {
    let out = ok(&["plan", NHD, HND, "--mode", "direct", "--show", "5"]);
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("SRC  kv L=1 B=3 N=16 H=4"), "{out}");
    assert!(lines[0].contains("remote (prefill side)"), "{out}");
    assert!(lines[2].starts_with("DST  kv L=1 B=3 N=16 H=4"), "{out}");
    assert!(out.contains("seq 0: 16 tokens, SRC blocks [0] -> DST blocks [0]"));
    let v = parse_json(&ok(&["plan", NHD, HND, "--mode", "direct", "--json"]));
    let runs = v["totals"]["runs"].as_u64().unwrap();
    assert!(runs > 5);
    assert!(
        out.contains(&format!("direct plan: {runs} runs (descriptors)")),
        "{out}"
    );
    assert!(
        out.contains(&format!("... {} more runs (--show N", runs - 5)),
        "{out}"
    );
    let first_is_number = |l: &&&str| {
        let first = l.split_whitespace().next();
        first.is_some_and(|w| w.parse::<usize>().is_ok())
    };
    let table = lines.iter().filter(first_is_number).count();
    assert_eq!(table, 5, "{out}");
}

#[test]
fn the_default_sequence_fits_both_block_pools() {
    let one = |n: u64, order: &str| format!("kv L=1 B=1 N={n} H=4 D=8 dtype=f16 order={order}");
    // One block of 16 tokens, one of 32: the 16 tokens A's pool holds, into half a DST block.
    let (src, dst) = (one(16, "NHD"), one(32, "HND"));
    let v = parse_json(&ok(&["plan", &src, &dst, "--json"]));
    let seq = &v["sequences"][0];
    assert_eq!(
        (u64s(&seq["src_blocks"]), u64s(&seq["dst_blocks"])),
        (vec![0], vec![0])
    );
    assert_eq!(seq["tokens"], 16);
    // 16 tokens x 4 heads x a K|V row of 2 x 8 f16.
    assert_eq!(v["totals"]["bytes"].as_u64(), Some(16 * 4 * 32));
    // Pools of three: one 32-token SRC block into two 16-token DST blocks.
    let v = parse_json(&ok(&["plan", NHD_32, NHD, "--json"]));
    let seq = &v["sequences"][0];
    assert_eq!(
        (u64s(&seq["src_blocks"]), u64s(&seq["dst_blocks"])),
        (vec![0], vec![0, 1])
    );
    assert_eq!(seq["tokens"], 32);
    assert_eq!(v["totals"]["bytes"].as_u64(), Some(32 * 4 * 32));
}

/// An element's buffer and byte offset: the descriptor's offset function.
pub(crate) fn place(l: &KvCacheLayout, c: &Coord) -> (usize, usize) {
    let at = l.offset(c).unwrap();
    (at.buffer as usize, at.offset as usize)
}
