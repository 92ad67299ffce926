//! The compatibility hash: SHA-256 over a canonical text of the fields two peers must share
//! to exchange KV blocks at all.
//!
//! The text is one `key=value` line per covered field, each ending in `\n`, after a first line
//! `kvlayout-compat v1`:
//!
//! ```text
//! kvlayout-compat v1
//! content=kv
//! head_size=128
//! head_size_v=128
//! dtype=bf16
//! k_scale=3f800000
//! v_scale=3f800000
//! num_layers=32
//! total_kv_heads=8
//! tokens_per_state=1
//! ```
//!
//! `content` is the kind's spec name (`kv`, `kv-scaled`, `mla`, `bytes`, `mamba-conv`,
//! `mamba-ssm`), followed by its sizes ([`kvlayout::Content::sizes`]): `head_size` and
//! `head_size_v`; `kv_lora_rank` and `rope_dim`; `row_bytes`; `conv_dim` and `conv_width`; or
//! `head_dim` and `state_size`.
//! `dtype` is the dtype's name (`bf16`, `fp8_e4m3`, ...). The scales are the IEEE bit
//! patterns of the f32 values, 8 lowercase hex digits. Numbers are decimal.
//!
//! Not covered, because the planner reconciles them: TP size and rank, block size, number of
//! blocks, physical order, placement, padding and base offsets, group and engine names.

use sha2::{Digest, Sha256};

use super::error::HandshakeError;
use super::CacheGroup;

/// First line of the canonical text; changes whenever the covered fields change.
pub const COMPAT_TEXT_VERSION: &str = "kvlayout-compat v1";

/// The covered fields of a group, in canonical order: `(name, value)`.
pub(crate) fn compat_fields(group: &CacheGroup) -> Vec<(&'static str, String)> {
    let layout = &group.layout;
    let content = layout.content();
    let mut out = vec![("content", content.spec_name().to_string())];
    out.extend(
        content
            .sizes()
            .into_iter()
            .map(|(name, v)| (name, v.to_string())),
    );
    let scales = layout.scales();
    let g = layout.geometry();
    out.extend([
        ("dtype", layout.dtype().to_string()),
        ("k_scale", format!("{:08x}", scales.k_scale.to_bits())),
        ("v_scale", format!("{:08x}", scales.v_scale.to_bits())),
        ("num_layers", g.num_layers.to_string()),
        ("total_kv_heads", group.total_kv_heads.to_string()),
        ("tokens_per_state", g.tokens_per_state.to_string()),
    ]);
    out
}

/// The canonical text the hash covers (see the module docs).
pub(crate) fn compat_text(group: &CacheGroup) -> String {
    let mut text = format!("{COMPAT_TEXT_VERSION}\n");
    for (name, value) in compat_fields(group) {
        text.push_str(name);
        text.push('=');
        text.push_str(&value);
        text.push('\n');
    }
    text
}

/// SHA-256 of the canonical text, 64 lowercase hex digits.
pub(crate) fn compat_hash(group: &CacheGroup) -> String {
    let digest = Sha256::digest(compat_text(group).as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether two groups agree on every covered field; names the first that differs. The content
/// kind comes first, so groups of different kinds stop there, before their sizes.
pub fn check_compatible(local: &CacheGroup, remote: &CacheGroup) -> Result<(), HandshakeError> {
    let remote_fields = compat_fields(remote);
    for (i, (name, value)) in compat_fields(local).into_iter().enumerate() {
        match remote_fields.get(i) {
            Some((other_name, other)) if *other_name == name && *other == value => {}
            other => {
                let remote_value = match other {
                    Some((other_name, v)) if *other_name == name => readable(name, v),
                    _ => "(absent)".to_string(),
                };
                return Err(HandshakeError::Incompatible {
                    field: name,
                    local: readable(name, &value),
                    remote: remote_value,
                });
            }
        }
    }
    Ok(())
}

/// A covered value as a user reads it: scales as numbers with their bit patterns.
fn readable(name: &str, value: &str) -> String {
    match (name, u32::from_str_radix(value, 16)) {
        ("k_scale" | "v_scale", Ok(bits)) => format!("{} (bits {value})", f32::from_bits(bits)),
        _ => value.to_string(),
    }
}
