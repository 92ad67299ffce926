//! The demo's report: the record of a run (`--json`) and its text, one line per step, built
//! from what the steps measured. It owns the wording of each line; it measures nothing but
//! the memcpy bound of each step that moves data ([`Step::moved`]).

use kvlayout::ops::{AnyBackend, Backend};
use serde::Serialize;
use serde_json::json;

use super::prefill::Prefilled;
use super::rank::{Published, RankRun};
use super::scenario::{Scenario, Side};
use super::step::{size, Bound, Step};
use super::verify::Verification;
use crate::CliError;

/// The whole record of a run (`--json`).
#[derive(Debug, Serialize)]
pub(crate) struct Record {
    pub scenario: Scenario,
    pub backend: String,
    pub kernels: String,
    pub engine: String,
    pub cpu: String,
    /// Threads of the memcpy bound (one per core, as `kvlayout bench`).
    pub memcpy_threads: usize,
    pub steps: Vec<Step>,
    pub verification: Verification,
    /// Wall time of the whole demo, in milliseconds (the memcpy bounds included).
    pub wall_ms: f64,
}

impl Record {
    pub(crate) fn to_text(&self) -> String {
        let sc = &self.scenario;
        let side = |s: &Side| {
            format!(
                "{:<9} TP {}, per rank {} ({}, {} blocks of {} tokens)\n",
                format!("{}:", s.name),
                s.tp,
                s.spec,
                size(s.rank_bytes),
                s.blocks,
                s.block_size
            )
        };
        let mut out = format!(
            "model:    {} shrunk to {} layers: {} KV heads, {} query heads, key width {}, \
             value width {}; prompts {:?} tokens (seed {})\n",
            sc.preset,
            sc.layers,
            sc.kv_heads,
            sc.q_heads,
            sc.key_width,
            sc.value_width,
            sc.prompts,
            sc.seed
        );
        out.push_str(&side(&sc.prefill));
        out.push_str(&side(&sc.decode));
        out.push_str(&format!(
            "engine:   {}, backend {} ({} kernels), {} plan; cpu {}\n",
            self.engine, self.backend, self.kernels, sc.plan, self.cpu
        ));
        for s in &self.steps {
            out.push_str(&s.to_text(self.memcpy_threads));
        }
        out.push_str(&format!(
            "result:   {} in {:.0} ms\n",
            if self.verification.passed {
                "verified bit for bit"
            } else {
                "FAILED"
            },
            self.wall_ms
        ));
        out
    }
}

pub(super) fn write_step(
    sc: &Scenario,
    be: &AnyBackend,
    f: &Prefilled,
    bound: &Bound,
) -> Result<Step, CliError> {
    let tokens: u64 = sc.prompts.iter().map(|&t| u64::from(t)).sum();
    Step::moved(
        "write_kv",
        format!(
            "{} prompts, {tokens} tokens x {} layers into {} prefill rank(s) on {}: {} calls",
            sc.prompts.len(),
            sc.layers,
            sc.prefill.tp,
            be.name(),
            f.calls
        ),
        f.written,
        f.seconds,
        json!({ "tokens": tokens, "calls": f.calls }),
        bound,
    )
}

/// The lines of the handshake, check, plan, transfer, receive and decode steps, summed over
/// the decode ranks.
pub(super) fn pull_steps(
    sc: &Scenario,
    be: &AnyBackend,
    engine: &str,
    published: &[Published],
    encode_s: f64,
    ranks: &[RankRun],
    bound: &Bound,
) -> Result<Vec<Step>, CliError> {
    let sum = |f: fn(&RankRun) -> f64| ranks.iter().map(f).sum::<f64>();
    let total = |f: fn(&RankRun) -> u64| ranks.iter().map(f).sum::<u64>();
    let per_rank = |f: fn(&RankRun) -> u64| ranks.iter().map(f).collect::<Vec<_>>();
    let (p, d) = (&sc.prefill, &sc.decode);
    let each = published.first().map_or(0, |x| x.handshake.len());
    let descriptors = total(|r| r.descriptors);
    let hash = ranks
        .first()
        .and_then(|r| r.compat_hash.get(..16))
        .unwrap_or("");
    let receive = if sc.plan == "staged" {
        format!(
            "scatter_blocks on {} from each leg's staging cache ({} order) into the {} order, \
             padding and heads of each decode rank",
            be.name(),
            order_name(&p.spec),
            order_name(&d.spec)
        )
    } else {
        "direct plan: bytes already in place; the engine's buffers handed to the backend"
            .to_string()
    };
    let q = sc.q_heads / d.tp;
    Ok(vec![
        Step::still(
            "handshake",
            format!(
                "{} prefill rank(s) publish {each} B each (engine id, layout JSON, TP place, \
                 regions, compat hash); {} decode rank(s) decode them under the default Limits",
                p.tp, d.tp
            ),
            total(|r| r.handshake_bytes),
            encode_s + sum(|r| r.handshake_s),
            json!({ "bytes_per_prefill_rank": each }),
        ),
        Step::still(
            "check",
            format!(
                "compat hash {hash}..: content, head sizes, dtype, scales, {} layers and {} \
                 model KV heads agree on all {} rank pairs; TP {} vs {}, blocks of {} vs {}, \
                 order and padding are the planner's",
                sc.layers,
                sc.kv_heads,
                p.tp * d.tp,
                p.tp,
                d.tp,
                p.block_size,
                d.block_size
            ),
            total(|r| r.check_bytes),
            sum(|r| r.check_s),
            json!({ "compat_hash": ranks.first().map(|r| r.compat_hash.clone()) }),
        ),
        Step::still(
            "plan",
            format!(
                "{} plan: {} leg(s) over {} decode rank(s), {descriptors} descriptors \
                 (per rank {:?})",
                sc.plan,
                total(|r| r.legs),
                d.tp,
                per_rank(|r| r.descriptors)
            ),
            total(|r| r.wire_bytes),
            sum(|r| r.plan_s),
            json!({ "plan": sc.plan, "legs": total(|r| r.legs),
                    "descriptors_per_rank": per_rank(|r| r.descriptors),
                    "bytes_per_rank": per_rank(|r| r.wire_bytes) }),
        )
        .with_descriptors(descriptors),
        Step::moved(
            "transfer",
            format!(
                "execute on the {engine} engine: {} reads of {descriptors} descriptors, \
                 notifications to the prefill side{}",
                total(|r| r.legs),
                if engine == "nixl" {
                    " (each rank's first read over NIXL includes UCX's connection setup)"
                } else {
                    ""
                }
            ),
            total(|r| r.wire_bytes),
            sum(|r| r.transfer_s),
            json!({ "engine": engine }),
            bound,
        )?
        .with_descriptors(descriptors),
        Step::moved(
            "receive",
            receive,
            total(|r| r.receive_bytes),
            sum(|r| r.receive_s),
            json!({ "post_receive": if sc.plan == "staged" { "scatter_blocks" } else { "none" } }),
            bound,
        )?,
        Step::moved(
            "decode",
            format!(
                "paged_decode on {} on each of {} decode rank(s) x {} layers: {q} query heads \
                 over {} KV head(s) each, {} prompts",
                be.name(),
                d.tp,
                sc.layers,
                sc.kv_heads.div_ceil(d.tp),
                sc.prompts.len()
            ),
            total(|r| r.decode_bytes),
            sum(|r| r.decode_s),
            json!({ "outputs": ranks.iter().map(|r| r.outputs.iter().map(Vec::len).sum::<usize>()).sum::<usize>() }),
            bound,
        )?,
    ])
}

/// `NHD` of a spec's `order=...`, for the receive line.
fn order_name(spec: &str) -> &str {
    spec.split_whitespace()
        .find_map(|t| t.strip_prefix("order="))
        .unwrap_or("strided")
}

pub(super) fn verify_step(v: &Verification, seconds: f64) -> Step {
    let line = format!(
        "{} K/V elements equal byte for byte to the prefill cache's ({} differ); {} reference \
         outputs equal bit for bit ({} differ); backend within {:.3} of its bound ({} products, \
         max error {:.1e}): {}",
        v.elements,
        v.elements_differing,
        v.reference_outputs,
        v.reference_differing,
        v.backend_error_to_bound,
        v.products,
        v.backend_max_error,
        if v.passed { "ok" } else { "FAILED" }
    );
    Step::still("verify", line, v.element_bytes, seconds, json!({}))
}
