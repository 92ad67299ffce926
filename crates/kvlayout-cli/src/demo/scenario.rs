//! The demo's scenario: the model, each side's rank layout and TP size, the prompts, their
//! block tables on both sides, the keys and values written and the decode queries.
//!
//! It owns reading `kvlayout demo`'s flags into a [`Scenario`] (one-line refusals of bad
//! values, exit 2) and the seeded data. It does not own any layout arithmetic: each rank's
//! layout is a spec string parsed by `kvlayout`, and every offset comes from it.

use kvlayout::ops::decode_widths;
use kvlayout::{KvCacheLayout, Placement};
use kvlayout_connector::plan::SeqBlocks;
use serde::Serialize;

use super::model_check::{check_against_model, merge};
use super::seeded::{self, tables, Rng};
use super::DemoArgs;
use crate::CliError;

/// Query heads per KV head (grouped-query attention; MLA: 16 query heads on its one latent).
pub(crate) const Q_PER_KV: u64 = 4;

/// MLA's query heads.
const MLA_Q_HEADS: u64 = 16;

/// Largest cache the demo allocates per rank, in bytes (the demo's total is bounded apart,
/// see [`super::budget`]).
const MAX_RANK_BYTES: u64 = 1 << 30;

/// Most tokens of the prompts together (the work of the whole run is bounded apart, see
/// [`super::budget`]).
const MAX_PROMPT_TOKENS: u32 = 1 << 16;

/// Most prompts.
const MAX_PROMPTS: usize = 64;

/// Largest TP size of either side.
const MAX_TP: u64 = 64;

/// One side (prefill or decode) of the scenario.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Side {
    /// `prefill` or `decode`.
    pub name: &'static str,
    /// TP size.
    pub tp: u64,
    /// The layout of one rank's cache (its heads), canonical spec string.
    pub spec: String,
    /// The model's KV heads this side states in its handshake.
    pub total_kv_heads: u64,
    /// Tokens per block.
    pub block_size: u64,
    /// Blocks in each rank's pool.
    pub blocks: u64,
    /// Bytes of one rank's cache (every buffer's registered span).
    pub rank_bytes: u64,
    /// Each prompt's blocks, in token order (the same on every rank of the side).
    pub tables: Vec<Vec<u64>>,
    #[serde(skip)]
    pub layout: KvCacheLayout,
}

impl Side {
    /// The block table of `paged_decode`: one row per prompt, padded with block 0.
    pub(crate) fn decode_table(&self) -> (Vec<i32>, usize) {
        let width = self.tables.iter().map(Vec::len).max().unwrap_or(0);
        let table = self
            .tables
            .iter()
            .flat_map(|t| (0..width).map(|i| t.get(i).map_or(0, |&b| b as i32)))
            .collect();
        (table, width)
    }
}

/// Everything the demo runs on.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Scenario {
    /// The model preset.
    pub preset: String,
    /// Layer slots of both caches.
    pub layers: u64,
    /// The model's KV heads (the prefill side's statement).
    pub kv_heads: u64,
    /// The model's query heads.
    pub q_heads: u64,
    /// Key width (the query's) and value width (the output's), in elements.
    pub key_width: u64,
    pub value_width: u64,
    /// Tokens of each prompt.
    pub prompts: Vec<u32>,
    /// Seed of the keys, values, queries and block tables.
    pub seed: u64,
    pub prefill: Side,
    pub decode: Side,
    /// `direct` or `staged`.
    pub plan: &'static str,
}

/// A value that is no number, with the flag and the value.
fn number<T: std::str::FromStr>(flag: &str, value: &str) -> Result<T, CliError> {
    value.trim().parse().map_err(|_| {
        CliError::Usage(format!(
            "{flag} {value:?}: not a non-negative integer in range"
        ))
    })
}

/// `value` of `flag` within `1..=max`.
fn count(flag: &str, value: &str, max: u64) -> Result<u64, CliError> {
    let n: u64 = number(flag, value)?;
    if n == 0 || n > max {
        return Err(CliError::Usage(format!(
            "{flag} {n}: must be between 1 and {max}"
        )));
    }
    Ok(n)
}

/// The prompts' token counts: `509,77,130`.
fn prompts(value: &str) -> Result<Vec<u32>, CliError> {
    let list: Vec<u32> = value
        .split(',')
        .map(|p| {
            let n = count("--prompts", p, u64::from(MAX_PROMPT_TOKENS))?;
            Ok(n as u32)
        })
        .collect::<Result<_, CliError>>()?;
    if list.len() > MAX_PROMPTS {
        return Err(CliError::Usage(format!(
            "--prompts: {} prompts, at most {MAX_PROMPTS}",
            list.len()
        )));
    }
    let total: u64 = list.iter().map(|&t| u64::from(t)).sum();
    if total > u64::from(MAX_PROMPT_TOKENS) {
        return Err(CliError::Usage(format!(
            "--prompts: {total} tokens in all, at most {MAX_PROMPT_TOKENS}"
        )));
    }
    Ok(list)
}

/// Whether `value` is modifiers of the preset (its first token is `key=value`) rather than a
/// whole SPEC.
fn is_modifiers(value: &str) -> bool {
    value
        .split_whitespace()
        .next()
        .is_none_or(|t| t.contains('='))
}

/// Parses one side's rank layout and checks its size.
#[allow(clippy::too_many_arguments)]
fn side(
    name: &'static str,
    flag: &str,
    value: &str,
    a: &DemoArgs,
    tp: u64,
    model: &KvCacheLayout,
    prompts: &[u32],
    rng: &mut Rng,
) -> Result<Side, CliError> {
    let model_heads = model.geometry().num_kv_heads;
    let heads = kvlayout::tp_head_range(model_heads, tp, 0)
        .map_err(|e| CliError::Usage(format!("{name} side (--{}tp {tp}): {e}", tp_flag(name))))?;
    let rank_heads = heads.end - heads.start;
    let modifiers = is_modifiers(value);
    let spec = if modifiers {
        let layers = count("--layers", &a.layers, 1 << 10)?;
        let blocks = count("--blocks", &a.blocks, 1 << 24)?;
        // The preset and its overrides, then L, B and the rank's H, then the side's
        // modifiers: a later key=value replaces an earlier one.
        let derived = [
            format!("L={layers}"),
            format!("B={blocks}"),
            format!("H={rank_heads}"),
        ];
        merge(
            (a.preset.split_whitespace())
                .chain(derived.iter().map(String::as_str))
                .chain(value.split_whitespace()),
        )
    } else {
        value.to_string()
    };
    let layout = spec.parse::<KvCacheLayout>().map_err(|e| {
        CliError::Usage(format!(
            "{flag} {value:?} (one {name} rank's layout {spec:?}): {e}"
        ))
    })?;
    if name == "prefill" {
        check_against_model(&layout, model, a, tp, rank_heads)?;
    }
    // Modifiers state the model's heads; a whole SPEC states one rank's, and the side's
    // model heads follow from its TP.
    let total_kv_heads = if modifiers || name == "prefill" {
        model_heads
    } else {
        layout.geometry().num_kv_heads.saturating_mul(tp)
    };
    let rank_bytes: u64 = layout.extents().iter().map(|x| x.end).sum();
    if rank_bytes > MAX_RANK_BYTES {
        return Err(CliError::Usage(format!(
            "{flag}: one {name} rank's cache takes {rank_bytes} bytes, more than the demo's \
             {MAX_RANK_BYTES} (lower --blocks or --layers)"
        )));
    }
    let g = *layout.geometry();
    let tables = tables(name, prompts, g.block_size, g.num_blocks, rng)?;
    Ok(Side {
        name,
        tp,
        spec: layout.to_string(),
        total_kv_heads,
        block_size: g.block_size,
        blocks: g.num_blocks,
        rank_bytes,
        tables,
        layout,
    })
}

fn tp_flag(side: &str) -> &'static str {
    if side == "prefill" {
        "prefill-"
    } else {
        ""
    }
}

/// The physical order of a paged layout (`None` for legacy and explicit strides).
fn paged_order(layout: &KvCacheLayout) -> Option<kvlayout::AxisOrder> {
    match layout.placement() {
        Placement::Paged(p) => Some(p.order),
        _ => None,
    }
}

impl Scenario {
    /// The scenario `a` describes, or a one-line refusal.
    pub(crate) fn from_args(a: &DemoArgs) -> Result<Scenario, CliError> {
        let model = a
            .preset
            .parse::<KvCacheLayout>()
            .map_err(|e| CliError::Usage(format!("--preset {:?}: {e}", a.preset)))?;
        let Some((key_width, value_width)) = decode_widths(&model).ok() else {
            return Err(CliError::Usage(format!(
                "--preset {}: content {} holds no keys and values to decode (the demo needs \
                 an attention preset)",
                a.preset,
                model.content().spec_name()
            )));
        };
        let prefill_tp = count("--prefill-tp", &a.prefill_tp, MAX_TP)?;
        let tp = count("--tp", &a.tp, MAX_TP)?;
        let prompts = prompts(&a.prompts)?;
        let seed: u64 = number("--seed", &a.seed)?;
        let mut rng = seeded::stream(seed, 1);
        let prefill = side(
            "prefill",
            "--prefill",
            &a.prefill,
            a,
            prefill_tp,
            &model,
            &prompts,
            &mut rng,
        )?;
        let decode = side(
            "decode", "--decode", &a.decode, a, tp, &model, &prompts, &mut rng,
        )?;
        let kv_heads = prefill.total_kv_heads;
        let q_heads = if model.content().shares_latent() {
            MLA_Q_HEADS
        } else {
            Q_PER_KV * kv_heads
        };
        for s in [&prefill, &decode] {
            if !q_heads.is_multiple_of(s.tp) {
                return Err(CliError::Usage(format!(
                    "--{}tp {}: the model's {q_heads} query heads do not split over {} ranks",
                    tp_flag(s.name),
                    s.tp,
                    s.tp
                )));
            }
        }
        let same_order = paged_order(&prefill.layout).is_some()
            && paged_order(&prefill.layout) == paged_order(&decode.layout);
        let plan = match a.plan.as_str() {
            "auto" if same_order => "direct",
            "auto" => "staged",
            "direct" => "direct",
            "staged" => "staged",
            other => {
                return Err(CliError::Usage(format!(
                    "--plan {other:?}: auto, direct or staged"
                )))
            }
        };
        Ok(Scenario {
            preset: a.preset.clone(),
            layers: prefill.layout.geometry().num_layers,
            kv_heads,
            q_heads,
            key_width,
            value_width,
            prompts,
            seed,
            prefill,
            decode,
            plan,
        })
    }

    /// The block mapping of the pull: each prompt's prefill blocks to its decode blocks.
    pub(crate) fn seqs(&self) -> Vec<SeqBlocks> {
        self.prompts
            .iter()
            .enumerate()
            .map(|(s, &t)| SeqBlocks {
                remote: self.prefill.tables[s].clone(),
                local: self.decode.tables[s].clone(),
                tokens: u64::from(t),
            })
            .collect()
    }

    /// The query heads of rank `rank` of `tp` (a contiguous share of the model's).
    pub(crate) fn q_range(&self, tp: u64, rank: u64) -> std::ops::Range<u64> {
        let per = self.q_heads / tp;
        rank * per..(rank + 1) * per
    }

    /// The decode query of layer `layer`: `[prompt, q_head, key_width]` f32, all heads.
    pub(crate) fn query(&self, layer: u64) -> Vec<f32> {
        let n = self.prompts.len() * (self.q_heads * self.key_width) as usize;
        seeded::stream(self.seed, 1000 + layer).signed_units(n)
    }

    /// The query of `layer` for query heads `q`.
    pub(crate) fn query_heads(&self, layer: u64, q: &std::ops::Range<u64>) -> Vec<f32> {
        let all = self.query(layer);
        let per_seq = (self.q_heads * self.key_width) as usize;
        let (from, to) = (
            (q.start * self.key_width) as usize,
            (q.end * self.key_width) as usize,
        );
        (0..self.prompts.len())
            .flat_map(|s| all[s * per_seq + from..s * per_seq + to].to_vec())
            .collect()
    }
}
