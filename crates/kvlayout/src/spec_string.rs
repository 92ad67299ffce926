//! The compact one-line spec: `kv L=32 B=1024 N=16 H=8 D=128 dtype=bf16 order=NHD`.
//!
//! Grammar: whitespace-separated tokens. The first names a content kind (`kv`, `kv-scaled`,
//! `mla`, `bytes`, `mamba-conv`, `mamba-ssm`) or a preset (whose keys the rest may override).
//! Then `key=value` pairs:
//!
//! | keys | meaning |
//! |---|---|
//! | `L B N H tps` | layer slots, blocks, block size, head slots, tokens per state |
//! | `D Dv` / `rank rope` / `row` / `conv_dim conv_width` / `head_dim state` | content sizes |
//! | `dtype k_scale v_scale` | element type, per-tensor scales |
//! | `order base align page layer_stride block_stride` | paged placement (bytes) |
//! | `legacy base` | another engine's layout (`vllm-paged-v1`, `flash-attn-nhd`, ...) |
//! | `@FIELD=buf:base:layer:block:head:slot:split:chunk:dim` and `@bufI=start..end` | explicit strides |
//!
//! Formatting a layout gives the canonical string, which parses back to an equal layout.

use std::collections::BTreeMap;
use std::fmt;
use std::num::IntErrorKind;
use std::str::FromStr;

use crate::dtype::{DType, TensorScales};
use crate::error::{LayoutError, Result, MAX_OFFSET};
use crate::layout::KvCacheLayout;
use crate::presets::preset_spec_string;
use crate::spec::{
    AxisOrder, BufferExtent, Content, Field, FieldStrides, Geometry, LayoutSpec, LegacyKind, Paged,
    Placement, StridedField,
};

#[derive(Debug, Clone)]
struct Token {
    column: usize,
    text: String,
    from_user: bool,
}

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

/// A buffer index in canonical decimal: digits only, no leading zero unless it is `0`.
fn buffer_index(text: &str) -> Option<u32> {
    let digits = !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
    if !digits || (text.len() > 1 && text.starts_with('0')) {
        return None;
    }
    text.parse().ok()
}

/// One bound of `@bufI=start..end`: an integer up to [`MAX_OFFSET`].
fn extent_bound(tok: &Token, what: &str, text: &str) -> Result<u64> {
    let out_of_range = || {
        bad(
            tok,
            format!("buffer extent {what} {text} is out of range (limit {MAX_OFFSET})"),
        )
    };
    match text.parse::<u64>() {
        Ok(v) if v <= MAX_OFFSET => Ok(v),
        Ok(_) => Err(out_of_range()),
        Err(e) if *e.kind() == IntErrorKind::PosOverflow => Err(out_of_range()),
        Err(_) => Err(bad(tok, "buffer extent is start..end (integers)")),
    }
}

struct Keys {
    map: BTreeMap<String, (Token, String)>,
    head: Token,
}

impl Keys {
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

    fn need<T: FromStr>(&mut self, key: &str) -> Result<T> {
        self.take(key)?
            .ok_or_else(|| bad(&self.head, format!("missing {key}=")))
    }
}

fn parse_strides(tok: &Token, value: &str) -> Result<FieldStrides> {
    let parts: Vec<&str> = value.split(':').collect();
    let nums: Vec<u64> = parts
        .iter()
        .map(|p| p.parse::<u64>())
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| {
            bad(
                tok,
                "field strides are buf:base:layer:block:head:slot:split:chunk:dim (integers)",
            )
        })?;
    let [_, base, layer, block, head, slot, split, chunk, dim] = nums[..] else {
        return Err(bad(
            tok,
            format!("field strides need 9 numbers, got {}", nums.len()),
        ));
    };
    let buffer = buffer_index(parts[0]).ok_or_else(|| {
        bad(
            tok,
            format!(
                "buffer index '{}' is not a decimal index up to {} without sign or leading zeros",
                parts[0],
                u32::MAX
            ),
        )
    })?;
    Ok(FieldStrides {
        buffer,
        base_offset: base,
        layer,
        block,
        head,
        slot,
        dim_split: split,
        dim_chunk: chunk,
        dim,
    })
}

/// Parses a compact spec (or a preset name with overrides) into an unvalidated spec.
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
        Some(preset) => {
            let mut pt = tokens(preset, false);
            // Errors in the preset's own keys point at the preset's name.
            for t in &mut pt {
                t.column = first.column;
            }
            // A user placement of another kind replaces the preset's placement entirely.
            const PLACEMENT: [&str; 7] = [
                "order",
                "legacy",
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
                .find(|k| k == "legacy" || k.starts_with('@'));
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
        None => (first.clone(), Vec::new()),
    };
    rest.extend(user.into_iter().skip(1));
    let mut map: BTreeMap<String, (Token, String)> = BTreeMap::new();
    for t in rest {
        let Some((k, v)) = t.text.split_once('=') else {
            return Err(bad(&t, "expected key=value"));
        };
        if let Some((prev, _)) = map.get(k) {
            if prev.from_user {
                return Err(bad(
                    &t,
                    format!("{k} given twice (first at column {})", prev.column),
                ));
            }
        }
        map.insert(k.to_string(), (t.clone(), v.to_string()));
    }
    let mut keys = Keys {
        map,
        head: kind_token.clone(),
    };
    const KINDS: [&str; 6] = ["kv", "kv-scaled", "mla", "bytes", "mamba-conv", "mamba-ssm"];
    if !KINDS.contains(&kind_token.text.as_str()) {
        let preset_like = kind_token
            .text
            .contains(|c: char| c.is_ascii_digit() || c == '.');
        return Err(if preset_like && !kind_token.text.contains('=') {
            LayoutError::UnknownPreset {
                name: kind_token.text.clone(),
                known: crate::presets::PRESET_NAMES.join(", "),
            }
        } else {
            bad(
                &kind_token,
                format!(
                    "'{}' is neither a content kind ({}) nor a preset ({})",
                    kind_token.text,
                    KINDS.join(", "),
                    crate::presets::PRESET_NAMES.join(", ")
                ),
            )
        });
    }
    let dtype: DType = match kind_token.text.as_str() {
        "bytes" => keys.take("dtype")?.unwrap_or(DType::U8),
        _ => keys.need("dtype")?,
    };
    let one_head = matches!(kind_token.text.as_str(), "mla" | "bytes" | "mamba-conv");
    let geometry = Geometry {
        num_layers: keys.take("L")?.unwrap_or(1),
        num_blocks: keys.need("B")?,
        block_size: keys.need("N")?,
        num_kv_heads: if one_head {
            keys.take("H")?.unwrap_or(1)
        } else {
            keys.need("H")?
        },
        tokens_per_state: keys.take("tps")?.unwrap_or(1),
    };
    let content = match kind_token.text.as_str() {
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
                &kind_token,
                format!(
                    "'{other}' is neither a content kind (kv, kv-scaled, mla, bytes, mamba-conv, \
                     mamba-ssm) nor a preset ({})",
                    crate::presets::PRESET_NAMES.join(", ")
                ),
            ))
        }
    };
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

fn parse_placement(keys: &mut Keys) -> Result<Placement> {
    let explicit: Vec<String> = keys
        .map
        .keys()
        .filter(|k| k.starts_with('@'))
        .cloned()
        .collect();
    if let Some(legacy) = keys.take::<LegacyKind>("legacy")? {
        return Ok(Placement::Legacy {
            layout: legacy,
            base_offset: keys.take("base")?.unwrap_or(0),
        });
    }
    if let Some(order) = keys.take::<AxisOrder>("order")? {
        return Ok(Placement::Paged(Paged {
            order,
            base_offset: keys.take("base")?.unwrap_or(0),
            alignment: keys.take("align")?.unwrap_or(1),
            page_size_padded: keys.take("page")?,
            layer_stride_bytes: keys.take("layer_stride")?,
            block_stride_bytes: keys.take("block_stride")?,
        }));
    }
    if explicit.is_empty() {
        return Err(bad(
            &keys.head,
            "no placement: give order=.. (e.g. NHD, HND, LBHNC), legacy=.. or @field=.. strides",
        ));
    }
    // In column order, so that a key given twice is reported at its second spelling.
    let mut entries: Vec<(String, Token, String)> = explicit
        .into_iter()
        .map(|key| {
            let (tok, value) = keys.map.remove(&key).expect("key listed above");
            (key, tok, value)
        })
        .collect();
    entries.sort_by_key(|(_, tok, _)| tok.column);
    let mut fields: Vec<(Token, StridedField)> = Vec::new();
    let mut extents: BTreeMap<u32, BufferExtent> = BTreeMap::new();
    for (key, tok, value) in entries {
        let name = &key[1..];
        if let Some(digits) = name.strip_prefix("buf") {
            let idx = buffer_index(digits).ok_or_else(|| {
                bad(
                    &tok,
                    format!(
                        "buffer key is @bufN, N a decimal index up to {} without sign or \
                         leading zeros",
                        u32::MAX
                    ),
                )
            })?;
            let (a, b) = value
                .split_once("..")
                .ok_or_else(|| bad(&tok, "buffer extent is start..end"))?;
            let start = extent_bound(&tok, "start", a)?;
            let end = extent_bound(&tok, "end", b)?;
            extents.insert(idx, BufferExtent { start, end });
        } else {
            let field: Field = name
                .parse()
                .map_err(|_| bad(&tok, format!("unknown field '{name}'")))?;
            if let Some((first, _)) = fields.iter().find(|(_, f)| f.field == field) {
                return Err(bad(
                    &tok,
                    format!(
                        "field {field} given twice (first as {} at column {})",
                        first.text.split('=').next().unwrap_or_default(),
                        first.column
                    ),
                ));
            }
            let strides = parse_strides(&tok, &value)?;
            fields.push((tok, StridedField { field, strides }));
        }
    }
    let n = extents.len();
    if extents.keys().map(|&i| i as usize).ne(0..n) {
        return Err(bad(
            &keys.head,
            "buffer extents must be @buf0, @buf1, .. without gaps",
        ));
    }
    if let Some((tok, f)) = fields.iter().find(|(_, f)| f.strides.buffer as usize >= n) {
        let b = f.strides.buffer;
        return Err(bad(
            tok,
            format!(
                "no @buf{b}= extent was given (field {} is in buffer {b})",
                f.field
            ),
        ));
    }
    let mut fields: Vec<StridedField> = fields.into_iter().map(|(_, f)| f).collect();
    fields.sort_by_key(|f| f.field);
    Ok(Placement::Strided {
        fields,
        extents: extents.into_values().collect(),
    })
}

impl FromStr for KvCacheLayout {
    type Err = LayoutError;
    /// Parses a preset name, a compact spec string, or a preset followed by overrides.
    fn from_str(s: &str) -> Result<Self> {
        KvCacheLayout::new(parse_spec(s)?)
    }
}

impl fmt::Display for LayoutSpec {
    /// The canonical compact spec string.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let g = &self.geometry;
        write!(
            f,
            "{} L={} B={} N={} H={}",
            self.content.spec_name(),
            g.num_layers,
            g.num_blocks,
            g.block_size,
            g.num_kv_heads
        )?;
        if g.tokens_per_state != 1 {
            write!(f, " tps={}", g.tokens_per_state)?;
        }
        match self.content {
            Content::Kv {
                head_size,
                head_size_v,
            }
            | Content::KvScaled {
                head_size,
                head_size_v,
            } => write!(f, " D={head_size} Dv={head_size_v}")?,
            Content::Mla {
                kv_lora_rank,
                rope_dim,
            } => write!(f, " rank={kv_lora_rank} rope={rope_dim}")?,
            Content::Opaque { row_bytes } => write!(f, " row={row_bytes}")?,
            Content::MambaConv {
                conv_dim,
                conv_width,
            } => write!(f, " conv_dim={conv_dim} conv_width={conv_width}")?,
            Content::MambaSsm {
                head_dim,
                state_size,
            } => write!(f, " head_dim={head_dim} state={state_size}")?,
        }
        write!(f, " dtype={}", self.dtype)?;
        if self.scales != TensorScales::default() {
            write!(
                f,
                " k_scale={:?} v_scale={:?}",
                self.scales.k_scale, self.scales.v_scale
            )?;
        }
        match &self.placement {
            Placement::Paged(p) => {
                write!(f, " order={}", p.order)?;
                if p.base_offset != 0 {
                    write!(f, " base={}", p.base_offset)?;
                }
                if p.alignment != 1 {
                    write!(f, " align={}", p.alignment)?;
                }
                for (key, v) in [
                    ("page", p.page_size_padded),
                    ("layer_stride", p.layer_stride_bytes),
                    ("block_stride", p.block_stride_bytes),
                ] {
                    if let Some(v) = v {
                        write!(f, " {key}={v}")?;
                    }
                }
            }
            Placement::Legacy {
                layout,
                base_offset,
            } => {
                write!(f, " legacy={layout}")?;
                if *base_offset != 0 {
                    write!(f, " base={base_offset}")?;
                }
            }
            Placement::Strided { fields, extents } => {
                for sf in fields {
                    let s = sf.strides;
                    write!(
                        f,
                        " @{}={}:{}:{}:{}:{}:{}:{}:{}:{}",
                        sf.field,
                        s.buffer,
                        s.base_offset,
                        s.layer,
                        s.block,
                        s.head,
                        s.slot,
                        s.dim_split,
                        s.dim_chunk,
                        s.dim
                    )?;
                }
                for (i, x) in extents.iter().enumerate() {
                    write!(f, " @buf{i}={}..{}", x.start, x.end)?;
                }
            }
        }
        Ok(())
    }
}

impl fmt::Display for KvCacheLayout {
    /// The canonical compact spec string; it parses back to an equal layout.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.spec().fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preset_placement_can_be_replaced() {
        let l: KvCacheLayout = "llama-3-8b B=4 legacy=vllm-paged-v1".parse().unwrap();
        assert!(matches!(
            l.placement(),
            Placement::Legacy {
                layout: LegacyKind::VllmPagedV1,
                ..
            }
        ));
        assert_eq!(l.geometry().num_layers, 32);
        let l: KvCacheLayout = "llama-3-8b B=4 order=HND page=70000".parse().unwrap();
        assert!(matches!(l.placement(), Placement::Paged(p) if p.page_size_padded == Some(70000)));
        // A bad override names its own column; the preset's keys name the preset.
        match "llama-3-8b B=x".parse::<KvCacheLayout>() {
            Err(LayoutError::Spec { column, .. }) => assert_eq!(column, 12),
            other => panic!("{other:?}"),
        }
    }

    /// Padding or alignment with L or B inside H or N is refused with the order named, the
    /// innermost position included (it once indexed past the axes there).
    #[test]
    fn padding_needs_h_and_n_inside_l_and_b() {
        for (spec, says) in [
            (
                "mla L=1 B=1 N=1 H=1 rank=4 rope=2 dtype=f32 order=BHNLC align=2",
                "L innermost",
            ),
            (
                "kv L=2 B=3 N=16 H=4 D=8 dtype=f16 order=LHNBC page=4096",
                "B innermost",
            ),
            (
                "kv L=2 B=3 N=16 H=4 D=8 dtype=f16 order=LHBNC align=64",
                "N inside B",
            ),
        ] {
            match spec.parse::<KvCacheLayout>() {
                Err(LayoutError::Invalid(m)) => assert!(m.contains(says), "{spec}: {m}"),
                other => panic!("{spec}: {other:?}"),
            }
        }
        // H and N inside both: accepted.
        let spec = "kv L=2 B=3 N=16 H=4 D=8 dtype=f16 order=BLHNC align=64";
        assert!(spec.parse::<KvCacheLayout>().is_ok(), "{spec}");
    }

    /// Two K/V fields in buffer 0 (K at 0, V at 192) of a 384-byte buffer.
    const STRIDED: &str = "kv L=1 B=3 N=4 H=1 D=8 dtype=f16 @k=0:0:0:64:64:16:8:16:2 \
                           @v=0:192:0:64:16:16:8:16:2";

    /// The column and reason of a spec error.
    fn spec_error(spec: &str) -> (usize, String, String) {
        match spec.parse::<KvCacheLayout>() {
            Err(LayoutError::Spec {
                column,
                token,
                reason,
            }) => (column, token, reason),
            other => panic!("{spec}: expected a spec error, got {other:?}"),
        }
    }

    /// Column of the last occurrence of `token`, in a spec that is ASCII before it.
    fn column_of(spec: &str, token: &str) -> usize {
        spec.rfind(token).expect("token in spec") + 1
    }

    /// A buffer index has one spelling: `@buf00`, `@buf+0`, `@buf01` are not buffers 0 and 1,
    /// so `@buf0=0..32 @buf00=0..1000000` cannot silently replace the first extent.
    #[test]
    fn buffer_indices_are_canonical_decimal() {
        let ok: KvCacheLayout = format!("{STRIDED} @buf0=0..384").parse().unwrap();
        assert_eq!(ok.extents(), [BufferExtent { start: 0, end: 384 }]);
        for key in [
            "@buf00", "@buf+0", "@buf-0", "@buf01", "@buf", "@buf0x1", "@buf١",
        ] {
            let spec = format!("{STRIDED} @buf0=0..384 {key}=0..1000000");
            let (column, token, reason) = spec_error(&spec);
            assert_eq!(column, column_of(&spec, key), "{spec}");
            assert_eq!(token, format!("{key}=0..1000000"));
            assert!(reason.contains("without sign or leading zeros"), "{reason}");
        }
        for buf in ["00", "+0", "01"] {
            let spec = format!("{STRIDED} @buf0=0..384").replace("@v=0:", &format!("@v={buf}:"));
            let (column, _, reason) = spec_error(&spec);
            assert_eq!(column, column_of(&spec, "@v="), "{spec}");
            assert_eq!(
                reason,
                format!(
                    "buffer index '{buf}' is not a decimal index up to 4294967295 without sign \
                     or leading zeros"
                )
            );
        }
        // A field named twice in two spellings is refused at the second, naming the first.
        let spec = format!("{STRIDED} @buf0=0..384 @K=0:0:0:64:64:16:8:16:2");
        let (column, _, reason) = spec_error(&spec);
        assert_eq!(column, column_of(&spec, "@K="));
        assert_eq!(
            reason,
            format!(
                "field k given twice (first as @k at column {})",
                column_of(&spec, "@k=")
            )
        );
    }

    /// A field whose buffer has no extent names the missing `@bufN=` key.
    #[test]
    fn missing_buffer_extent_names_the_key() {
        let (column, _, reason) = spec_error(STRIDED);
        assert_eq!(column, column_of(STRIDED, "@k="));
        assert_eq!(
            reason,
            "no @buf0= extent was given (field k is in buffer 0)"
        );
        let spec = format!("{STRIDED} @buf0=0..384").replace("@v=0:192", "@v=1:0");
        let (column, _, reason) = spec_error(&spec);
        assert_eq!(column, column_of(&spec, "@v="));
        assert_eq!(
            reason,
            "no @buf1= extent was given (field v is in buffer 1)"
        );
    }

    /// Every extent is refused past `MAX_OFFSET`, used by a field or not, and a number above
    /// u64 is named as out of range rather than as not an integer.
    #[test]
    fn every_buffer_extent_is_range_checked() {
        let limit = crate::MAX_OFFSET;
        for (extents, says) in [
            (
                "@buf0=0..384 @buf1=0..18446744073709551615",
                "buffer extent end 18446744073709551615 is out of range (limit 9223372036854775807)",
            ),
            (
                "@buf0=0..9223372036854775808",
                "buffer extent end 9223372036854775808 is out of range (limit 9223372036854775807)",
            ),
            (
                "@buf0=0..384 @buf1=0..18446744073709551616",
                "buffer extent end 18446744073709551616 is out of range (limit 9223372036854775807)",
            ),
            (
                "@buf0=99999999999999999999999..384",
                "buffer extent start 99999999999999999999999 is out of range (limit \
                 9223372036854775807)",
            ),
            ("@buf0=0..x", "buffer extent is start..end (integers)"),
        ] {
            let spec = format!("{STRIDED} {extents}");
            assert_eq!(spec_error(&spec).2, says, "{spec}");
        }
        // The same limit for a spec built without the parser, the extent used or not.
        let mut spec = parse_spec(&format!("{STRIDED} @buf0=0..384 @buf1=0..8")).unwrap();
        assert!(KvCacheLayout::new(spec.clone()).is_ok());
        for (i, buffer) in [(1, "buffer 1 extent"), (0, "buffer 0 extent")] {
            let Placement::Strided { extents, .. } = &mut spec.placement else {
                unreachable!("strided spec");
            };
            extents[i].end = limit + 1;
            assert_eq!(
                KvCacheLayout::new(spec.clone()),
                Err(LayoutError::Overflow {
                    what: buffer.into(),
                    limit
                })
            );
        }
    }

    /// A paged alignment is a power of two (one-byte elements once took `align=3`).
    #[test]
    fn alignment_is_a_power_of_two() {
        let base = "kv L=2 B=3 N=16 H=4 D=8 dtype=fp8_e4m3 order=NHD";
        for align in [3u64, 6, 12, 48, (1 << 62) + 1] {
            assert_eq!(
                format!("{base} align={align}").parse::<KvCacheLayout>(),
                Err(LayoutError::NotPowerOfTwo {
                    what: "alignment",
                    value: align
                })
            );
        }
        for align in [1u64, 2, 64, 4096] {
            let l: KvCacheLayout = format!("{base} align={align}").parse().unwrap();
            let Placement::Paged(p) = l.placement() else {
                unreachable!("paged spec");
            };
            assert_eq!(p.alignment, align);
        }
    }

    /// Tokenizing is linear: 200 000 tokens of 98 characters (38 MB) are read once, where
    /// recounting each token's column from the start would count 2 * 10^12 characters. The
    /// duplicate at the end is reported at its character column (not its byte index).
    #[test]
    fn long_specs_are_tokenized_in_linear_time() {
        let n = 200_000;
        let pad = "é".repeat(90);
        let mut spec = String::from("kv");
        for i in 0..n {
            spec.push_str(&format!(" p{i:06}={pad}"));
        }
        spec.push_str(" p000000=1");
        let (column, token, reason) = spec_error(&spec);
        // "kv", then n times a space and 98 characters, then a space.
        assert_eq!(column, 2 + n * (1 + 98) + 2);
        assert_eq!(token, "p000000=1");
        assert_eq!(reason, "p000000 given twice (first at column 4)");
    }
}
