//! The compact one-line spec: `kv L=32 B=1024 N=16 H=8 D=128 dtype=bf16 order=LBNHC`.
//!
//! Grammar: whitespace-separated tokens. The first names a content kind (`kv`, `kv-scaled`,
//! `mla`, `bytes`, `mamba-conv`, `mamba-ssm`) or a preset (whose keys the rest may override).
//! Then `key=value` pairs:
//!
//! | keys | meaning |
//! |---|---|
//! | `L B N H tps` | layer slots, blocks, slots (tokens) per block, head slots, tokens per state |
//! | `D Dv` / `rank rope` / `row` / `conv_dim conv_width` / `head_dim state` | content sizes |
//! | `dtype k_scale v_scale` | element type, per-tensor scales |
//! | `order base align page layer_stride block_stride` | paged placement (bytes) |
//! | `tensor base` | another engine's K/V tensor (`vllm-paged-v1`, `flashinfer-hnd`, ...) |
//! | `@FIELD=buf:base:layer:block:head:slot:split:chunk:dim` and `@bufI=start..end` | explicit strides |
//!
//! `order=` takes a permutation of `LBHN` followed by `C` (`LBNHC`: token-major pages); `NHD`
//! and `HND` are aliases of `LBNHC` and `LBHNC`, packed K|V rows. `legacy=` is an alias of
//! `tensor=`, and `tensor=flash-attn` / `tensor=flashinfer` name the `-nhd` layouts. A bad
//! `dtype=`, `order=` or `tensor=` value is refused with the accepted values listed.
//!
//! Formatting a layout gives the canonical string (permutation names, `tensor=`), which parses
//! back to an equal layout.

use std::collections::BTreeMap;
use std::str::FromStr;

use strum::IntoEnumIterator;

use crate::dtype::{DType, TensorScales};
use crate::error::{LayoutError, Result};
use crate::layout::KvCacheLayout;
use crate::presets::preset_spec_string;
use crate::spec::{Content, Geometry, LayoutSpec};

mod display;
mod placement;
#[cfg(test)]
mod tests;

use placement::parse_placement;

/// One whitespace-separated token, with the column errors point at.
#[derive(Debug, Clone)]
struct Token {
    column: usize,
    text: String,
    from_user: bool,
}

/// A spec error at `t`.
fn bad(t: &Token, reason: impl Into<String>) -> LayoutError {
    LayoutError::Spec {
        column: t.column,
        token: t.text.clone(),
        reason: reason.into(),
    }
}

/// Splits at whitespace; a token's column is the 1-based character index of its first char.
fn tokens(s: &str, from_user: bool) -> Vec<Token> {
    let mut out = Vec::new();
    let mut start = None; // (byte index, column) of the token being read
    let chars = s.char_indices().chain(std::iter::once((s.len(), ' ')));
    for (column, (i, ch)) in (1..).zip(chars) {
        match (ch.is_whitespace(), start) {
            (false, None) => start = Some((i, column)),
            (true, Some((st, column))) => {
                out.push(Token {
                    column,
                    text: s[st..i].to_string(),
                    from_user,
                });
                start = None;
            }
            _ => {}
        }
    }
    out
}

/// The `key=value` pairs not yet taken, and the kind token that errors of a missing key name.
struct Keys {
    map: BTreeMap<String, (Token, String)>,
    head: Token,
}

impl Keys {
    /// Takes and parses `key`, if given.
    fn take<T: FromStr>(&mut self, key: &str) -> Result<Option<T>> {
        match self.map.remove(key) {
            None => Ok(None),
            Some((tok, value)) => value.parse::<T>().map(Some).map_err(|_| {
                bad(
                    &tok,
                    format!("cannot parse '{value}' as the value of {key}"),
                )
            }),
        }
    }

    /// Takes and parses `key`, if given; a value that does not parse is refused with the
    /// accepted values `known` listed.
    fn take_one_of<T: FromStr>(&mut self, key: &str, known: &[String]) -> Result<Option<T>> {
        match self.map.remove(key) {
            None => Ok(None),
            Some((tok, value)) => value.parse::<T>().map(Some).map_err(|_| {
                let spelled = tok.text.split('=').next().unwrap_or(key);
                bad(
                    &tok,
                    format!(
                        "unknown {spelled}= value '{value}'; accepted: {}",
                        known.join(", ")
                    ),
                )
            }),
        }
    }

    /// Takes and parses `key`, which must be given.
    fn need<T: FromStr>(&mut self, key: &str) -> Result<T> {
        self.take(key)?
            .ok_or_else(|| bad(&self.head, format!("missing {key}=")))
    }
}

/// The content kinds a spec may start with.
const KINDS: [&str; 6] = ["kv", "kv-scaled", "mla", "bytes", "mamba-conv", "mamba-ssm"];

/// Parses a compact spec (or a preset name with overrides) into an unvalidated spec;
/// [`KvCacheLayout`]'s `FromStr` also validates it.
///
/// ```
/// let spec = kvlayout::parse_spec("kv L=1 B=8 N=16 H=4 D=8 dtype=bf16 legacy=flashinfer-hnd")?;
/// assert_eq!(spec.to_string(), "kv L=1 B=8 N=16 H=4 D=8 Dv=8 dtype=bf16 tensor=flashinfer-hnd");
/// let e = kvlayout::parse_spec("kv B=8 N=16 H=4 D=8 dtype=bf16 order=NHD tensor=flashinfer");
/// assert!(e.unwrap_err().to_string().contains("two placements: order=.. and tensor=..; give one"));
/// # Ok::<(), kvlayout::LayoutError>(())
/// ```
pub fn parse_spec(s: &str) -> Result<LayoutSpec> {
    let user = tokens(s, true);
    let Some(first) = user.first().cloned() else {
        return Err(LayoutError::Spec {
            column: 1,
            token: String::new(),
            reason: "empty spec".into(),
        });
    };
    let (kind_token, mut rest) = match preset_spec_string(&first.text) {
        Some(preset) => preset_tokens(preset, &user),
        None => (first.clone(), Vec::new()),
    };
    rest.extend(user.into_iter().skip(1));
    let mut keys = Keys {
        map: key_map(rest)?,
        head: kind_token.clone(),
    };
    check_kind(&kind_token)?;
    let dtypes: Vec<String> = DType::iter().map(|d| d.to_string()).collect();
    let dtype = keys.take_one_of::<DType>("dtype", &dtypes)?;
    let dtype = match (kind_token.text.as_str(), dtype) {
        (_, Some(d)) => d,
        ("bytes", None) => DType::U8,
        (_, None) => return Err(bad(&keys.head, "missing dtype=")),
    };
    let geometry = parse_geometry(&mut keys, &kind_token.text)?;
    let content = parse_content(&mut keys, &kind_token)?;
    let scales = TensorScales {
        k_scale: keys.take("k_scale")?.unwrap_or(1.0),
        v_scale: keys.take("v_scale")?.unwrap_or(1.0),
    };
    let placement = parse_placement(&mut keys)?;
    if let Some((tok, _)) = keys.map.values().next() {
        return Err(bad(tok, "unknown key for this kind and placement"));
    }
    Ok(LayoutSpec {
        geometry,
        content,
        dtype,
        scales,
        placement,
    })
}

/// A preset's kind token and key tokens, all at the column of its name (`user[0]`); a user
/// placement of another kind (`tensor=` or `@` keys) drops the preset's placement keys.
fn preset_tokens(preset: &str, user: &[Token]) -> (Token, Vec<Token>) {
    let first = &user[0];
    let mut pt = tokens(preset, false);
    // Errors in the preset's own keys point at the preset's name.
    for t in &mut pt {
        t.column = first.column;
    }
    // A user placement of another kind replaces the preset's placement entirely.
    const PLACEMENT: [&str; 7] = [
        "order",
        "tensor",
        "base",
        "align",
        "page",
        "layer_stride",
        "block_stride",
    ];
    let key = |t: &Token| t.text.split_once('=').map(|(k, _)| k.to_string());
    let user_kind = user
        .iter()
        .skip(1)
        .filter_map(key)
        .find(|k| k == "tensor" || k == "legacy" || k.starts_with('@'));
    if user_kind.is_some() {
        pt.retain(|t| !key(t).is_some_and(|k| PLACEMENT.contains(&k.as_str())));
    }
    let kind = pt.remove(0);
    (
        Token {
            column: first.column,
            ..kind
        },
        pt,
    )
}

/// The `key=value` tokens by key: a later token overrides a preset's, a user key given twice
/// is refused. `legacy=` is filed as `tensor=`, its alias.
fn key_map(rest: Vec<Token>) -> Result<BTreeMap<String, (Token, String)>> {
    let mut map: BTreeMap<String, (Token, String)> = BTreeMap::new();
    for t in rest {
        let Some((k, v)) = t.text.split_once('=') else {
            return Err(bad(&t, "expected key=value"));
        };
        let k = if k == "legacy" { "tensor" } else { k };
        if let Some((prev, _)) = map.get(k) {
            if prev.from_user {
                let what = match k {
                    "tensor" => "tensor= (or its alias legacy=)".to_string(),
                    _ => k.to_string(),
                };
                return Err(bad(
                    &t,
                    format!("{what} given twice (first at column {})", prev.column),
                ));
            }
        }
        map.insert(k.to_string(), (t.clone(), v.to_string()));
    }
    Ok(map)
}

/// The first token names a content kind; otherwise an unknown preset (when it looks like one).
fn check_kind(kind_token: &Token) -> Result<()> {
    if KINDS.contains(&kind_token.text.as_str()) {
        return Ok(());
    }
    let preset_like = kind_token
        .text
        .contains(|c: char| c.is_ascii_digit() || c == '.');
    Err(if preset_like && !kind_token.text.contains('=') {
        LayoutError::UnknownPreset {
            name: kind_token.text.clone(),
            known: crate::presets::PRESET_NAMES.join(", "),
        }
    } else {
        bad(
            kind_token,
            format!(
                "'{}' is neither a content kind ({}) nor a preset ({})",
                kind_token.text,
                KINDS.join(", "),
                crate::presets::PRESET_NAMES.join(", ")
            ),
        )
    })
}

/// The geometry keys `L B N H tps`; `H` defaults to 1 for the one-head kinds.
fn parse_geometry(keys: &mut Keys, kind: &str) -> Result<Geometry> {
    let one_head = matches!(kind, "mla" | "bytes" | "mamba-conv");
    Ok(Geometry {
        num_layers: keys.take("L")?.unwrap_or(1),
        num_blocks: keys.need("B")?,
        block_size: keys.need("N")?,
        num_kv_heads: if one_head {
            keys.take("H")?.unwrap_or(1)
        } else {
            keys.need("H")?
        },
        tokens_per_state: keys.take("tps")?.unwrap_or(1),
    })
}

/// The content of the kind `kind_token` names, from its size keys.
fn parse_content(keys: &mut Keys, kind_token: &Token) -> Result<Content> {
    Ok(match kind_token.text.as_str() {
        "kv" | "kv-scaled" => {
            let head_size: u64 = keys.need("D")?;
            let head_size_v = keys.take("Dv")?.unwrap_or(head_size);
            if kind_token.text == "kv" {
                Content::Kv {
                    head_size,
                    head_size_v,
                }
            } else {
                Content::KvScaled {
                    head_size,
                    head_size_v,
                }
            }
        }
        "mla" => Content::Mla {
            kv_lora_rank: keys.need("rank")?,
            rope_dim: keys.need("rope")?,
        },
        "bytes" => Content::Opaque {
            row_bytes: keys.need("row")?,
        },
        "mamba-conv" => Content::MambaConv {
            conv_dim: keys.need("conv_dim")?,
            conv_width: keys.need("conv_width")?,
        },
        "mamba-ssm" => Content::MambaSsm {
            head_dim: keys.need("head_dim")?,
            state_size: keys.need("state")?,
        },
        other => {
            return Err(bad(
                kind_token,
                format!(
                    "'{other}' is neither a content kind (kv, kv-scaled, mla, bytes, mamba-conv, \
                     mamba-ssm) nor a preset ({})",
                    crate::presets::PRESET_NAMES.join(", ")
                ),
            ))
        }
    })
}

impl FromStr for KvCacheLayout {
    type Err = LayoutError;
    /// Parses a preset name, a compact spec string, or a preset followed by overrides.
    fn from_str(s: &str) -> Result<Self> {
        KvCacheLayout::new(parse_spec(s)?)
    }
}
