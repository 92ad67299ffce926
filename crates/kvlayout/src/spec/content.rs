//! [`Content`]: what one row of a cache holds, and what callers ask of a content kind (the
//! widths a decode reads, whether K and V share one latent, whether rows carry their scales),
//! answered here so that callers need not match on the kinds.

use serde::{Deserialize, Serialize};

use crate::dtype::DType;
use crate::error::{add, mul, positive, LayoutError, Result};

/// What one row of content (the innermost axis C) holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Content {
    /// `[K: head_size][V: head_size_v]` packed in one row.
    Kv {
        /// K width in elements.
        head_size: u64,
        /// V width in elements (may differ, e.g. 192 / 128).
        head_size_v: u64,
    },
    /// `[K][k_scale: f32][V][v_scale: f32]`: int8/fp8 rows with per-token-head scales.
    KvScaled {
        /// K width in elements.
        head_size: u64,
        /// V width in elements.
        head_size_v: u64,
    },
    /// MLA latent `kv_lora_rank + rope_dim` with one head; K reads all of it, V its first
    /// `kv_lora_rank` elements.
    Mla {
        /// Compressed KV rank (512 in DeepSeek-V3).
        kv_lora_rank: u64,
        /// Rotary part (64 in DeepSeek-V3).
        rope_dim: u64,
    },
    /// A fixed-size byte row the descriptor does not interpret (e.g. 656 B `fp8_ds_mla`).
    Opaque {
        /// Row size in bytes.
        row_bytes: u64,
    },
    /// Mamba convolution state `[conv_dim, conv_width]`, one per block, one head slot.
    MambaConv {
        /// Channels (conv_dim / tp).
        conv_dim: u64,
        /// Kept history, `d_conv - 1`.
        conv_width: u64,
    },
    /// Mamba SSM state `[head_dim, state_size]` per head, one per block.
    MambaSsm {
        /// Head dimension.
        head_dim: u64,
        /// SSM state size.
        state_size: u64,
    },
}

impl Content {
    /// Short name used in spec strings.
    pub fn spec_name(&self) -> &'static str {
        match self {
            Content::Kv { .. } => "kv",
            Content::KvScaled { .. } => "kv-scaled",
            Content::Mla { .. } => "mla",
            Content::Opaque { .. } => "bytes",
            Content::MambaConv { .. } => "mamba-conv",
            Content::MambaSsm { .. } => "mamba-ssm",
        }
    }

    /// The kind's sizes, named as in the JSON form, in declaration order: `head_size` and
    /// `head_size_v`; `kv_lora_rank` and `rope_dim`; `row_bytes`; `conv_dim` and
    /// `conv_width`; or `head_dim` and `state_size`.
    pub fn sizes(&self) -> Vec<(&'static str, u64)> {
        match *self {
            Content::Kv {
                head_size,
                head_size_v,
            }
            | Content::KvScaled {
                head_size,
                head_size_v,
            } => vec![("head_size", head_size), ("head_size_v", head_size_v)],
            Content::Mla {
                kv_lora_rank,
                rope_dim,
            } => vec![("kv_lora_rank", kv_lora_rank), ("rope_dim", rope_dim)],
            Content::Opaque { row_bytes } => vec![("row_bytes", row_bytes)],
            Content::MambaConv {
                conv_dim,
                conv_width,
            } => vec![("conv_dim", conv_dim), ("conv_width", conv_width)],
            Content::MambaSsm {
                head_dim,
                state_size,
            } => vec![("head_dim", head_dim), ("state_size", state_size)],
        }
    }

    /// The widths `(K, V)` in elements that `write_kv` and a decode read: the head sizes of
    /// K/V rows, or for MLA the whole latent `kv_lora_rank + rope_dim` (K, and the query
    /// width) and its first `kv_lora_rank` elements (V). `None` for content without keys and
    /// values. The MLA sum saturates; a validated layout's is in range.
    pub fn kv_widths(&self) -> Option<(u64, u64)> {
        match *self {
            Content::Kv {
                head_size,
                head_size_v,
            }
            | Content::KvScaled {
                head_size,
                head_size_v,
            } => Some((head_size, head_size_v)),
            Content::Mla {
                kv_lora_rank,
                rope_dim,
            } => Some((kv_lora_rank.saturating_add(rope_dim), kv_lora_rank)),
            _ => None,
        }
    }

    /// Whether the content holds keys and values: K/V rows, or an MLA latent.
    pub fn holds_keys_and_values(&self) -> bool {
        self.kv_widths().is_some()
    }

    /// Whether K and V are one stored latent (MLA): K is all of it, V its first
    /// `kv_lora_rank` elements, and a write stores the latent alone.
    pub fn shares_latent(&self) -> bool {
        self.kv_lora_rank().is_some()
    }

    /// The MLA latent's compressed rank, which is V's width; `None` for the other kinds.
    pub fn kv_lora_rank(&self) -> Option<u64> {
        match *self {
            Content::Mla { kv_lora_rank, .. } => Some(kv_lora_rank),
            _ => None,
        }
    }

    /// Whether each K and each V row carries its own f32 scale, in the fields `k_scale` and
    /// `v_scale` (kv-scaled content: int8/fp8 rows).
    pub fn inline_scales(&self) -> bool {
        matches!(self, Content::KvScaled { .. })
    }

    /// Whether this content keeps one state per block regardless of block size.
    pub fn is_per_block_state(&self) -> bool {
        matches!(self, Content::MambaConv { .. } | Content::MambaSsm { .. })
    }

    /// Whether tensor parallelism shards this content along its channels, not its head slots
    /// (Mamba conv state: each rank holds `conv_dim / tp` channels), so a head split of it
    /// above TP 1 is refused.
    pub fn tp_shards_channels(&self) -> bool {
        matches!(self, Content::MambaConv { .. })
    }

    /// The sizes are positive and their sums and products in range, and the kind fits the
    /// dtype and the head slots.
    pub(crate) fn check(&self, dtype: DType, heads: u64) -> Result<()> {
        let one_head = |kind: &str| {
            if heads != 1 {
                Err(LayoutError::Invalid(format!(
                    "{kind} content has one head slot; num_kv_heads is {heads}"
                )))
            } else {
                Ok(())
            }
        };
        let mul_ok = |a, b, what: &'static str| mul(a, b, || what.to_string()).map(|_| ());
        match *self {
            Content::Kv {
                head_size,
                head_size_v,
            }
            | Content::KvScaled {
                head_size,
                head_size_v,
            } => {
                positive("head_size", head_size)?;
                positive("head_size_v", head_size_v)?;
                let both = add(head_size, head_size_v, || "head_size + head_size_v".into())?;
                mul_ok(both, 8, "head sizes")?;
                if self.inline_scales() && !dtype.is_quantized() {
                    return Err(LayoutError::Invalid(format!(
                        "inline scales are for int8/fp8 rows; dtype is {dtype}"
                    )));
                }
            }
            Content::Mla {
                kv_lora_rank,
                rope_dim,
            } => {
                positive("kv_lora_rank", kv_lora_rank)?;
                add(kv_lora_rank, rope_dim, || "kv_lora_rank + rope_dim".into())?;
                one_head("MLA")?;
            }
            Content::Opaque { row_bytes } => {
                positive("row_bytes", row_bytes)?;
                one_head("opaque-row")?;
            }
            Content::MambaConv {
                conv_dim,
                conv_width,
            } => {
                positive("conv_dim", conv_dim)?;
                positive("conv_width", conv_width)?;
                mul_ok(conv_dim, conv_width, "conv state size")?;
                one_head("Mamba conv")?;
            }
            Content::MambaSsm {
                head_dim,
                state_size,
            } => {
                positive("head_dim", head_dim)?;
                positive("state_size", state_size)?;
                mul_ok(head_dim, state_size, "SSM state size")?;
            }
        }
        self.check_byte_rows(dtype)
    }

    /// Opaque rows are `u8`, and `u8` is only for opaque rows.
    fn check_byte_rows(&self, dtype: DType) -> Result<()> {
        let opaque = matches!(self, Content::Opaque { .. });
        if opaque && dtype != DType::U8 {
            return Err(LayoutError::Invalid(format!(
                "opaque rows are bytes: dtype must be u8, got {dtype}"
            )));
        }
        if dtype == DType::U8 && !opaque {
            return Err(LayoutError::Invalid(
                "dtype u8 is only for opaque byte rows".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MLA: Content = Content::Mla {
        kv_lora_rank: 512,
        rope_dim: 64,
    };
    const KV: Content = Content::Kv {
        head_size: 192,
        head_size_v: 128,
    };
    const KV_SCALED: Content = Content::KvScaled {
        head_size: 128,
        head_size_v: 128,
    };
    const OPAQUE: Content = Content::Opaque { row_bytes: 656 };
    const CONV: Content = Content::MambaConv {
        conv_dim: 1024,
        conv_width: 3,
    };
    const SSM: Content = Content::MambaSsm {
        head_dim: 64,
        state_size: 128,
    };

    #[test]
    fn kv_widths_are_head_sizes_or_the_mla_latent_and_its_rank() {
        assert_eq!(MLA.kv_widths(), Some((576, 512)));
        assert_eq!(KV.kv_widths(), Some((192, 128)));
        assert_eq!(KV_SCALED.kv_widths(), Some((128, 128)));
        for c in [OPAQUE, CONV, SSM] {
            assert_eq!(c.kv_widths(), None, "{c:?}");
            assert!(!c.holds_keys_and_values(), "{c:?}");
        }
        for c in [MLA, KV, KV_SCALED] {
            assert!(c.holds_keys_and_values(), "{c:?}");
        }
        let huge = Content::Mla {
            kv_lora_rank: u64::MAX,
            rope_dim: 64,
        };
        assert_eq!(huge.kv_widths(), Some((u64::MAX, u64::MAX)));
    }

    #[test]
    fn only_mla_shares_a_latent() {
        assert!(MLA.shares_latent());
        assert_eq!(MLA.kv_lora_rank(), Some(512));
        for c in [KV, KV_SCALED, OPAQUE, CONV, SSM] {
            assert!(!c.shares_latent(), "{c:?}");
            assert_eq!(c.kv_lora_rank(), None, "{c:?}");
        }
    }

    #[test]
    fn only_kv_scaled_rows_carry_their_scales() {
        assert!(KV_SCALED.inline_scales());
        for c in [KV, MLA, OPAQUE, CONV, SSM] {
            assert!(!c.inline_scales(), "{c:?}");
        }
    }

    #[test]
    fn mamba_states_are_per_block_and_conv_shards_channels() {
        assert!(CONV.is_per_block_state() && SSM.is_per_block_state());
        assert!(CONV.tp_shards_channels());
        for c in [KV, KV_SCALED, MLA, OPAQUE, SSM] {
            assert!(!c.tp_shards_channels(), "{c:?}");
        }
        for c in [KV, KV_SCALED, MLA, OPAQUE] {
            assert!(!c.is_per_block_state(), "{c:?}");
        }
    }

    #[test]
    fn spec_names_are_the_spec_string_kinds() {
        let names = [KV, KV_SCALED, MLA, OPAQUE, CONV, SSM].map(|c| c.spec_name());
        assert_eq!(
            names,
            ["kv", "kv-scaled", "mla", "bytes", "mamba-conv", "mamba-ssm"]
        );
        let l: crate::KvCacheLayout = "mla L=1 B=3 N=16 rank=512 rope=64 dtype=bf16 order=LBNHC"
            .parse()
            .unwrap();
        assert!(l.to_string().starts_with(MLA.spec_name()), "{l}");
    }

    #[test]
    fn sizes_are_named_as_in_json() {
        assert_eq!(KV.sizes(), [("head_size", 192), ("head_size_v", 128)]);
        assert_eq!(MLA.sizes(), [("kv_lora_rank", 512), ("rope_dim", 64)]);
        assert_eq!(OPAQUE.sizes(), [("row_bytes", 656)]);
        assert_eq!(CONV.sizes(), [("conv_dim", 1024), ("conv_width", 3)]);
        assert_eq!(SSM.sizes(), [("head_dim", 64), ("state_size", 128)]);
        for c in [KV, KV_SCALED, MLA, OPAQUE, CONV, SSM] {
            let json = serde_json::to_value(c).unwrap();
            for (name, v) in c.sizes() {
                assert_eq!(json[name], v, "{c:?} {name}");
            }
        }
    }

    #[test]
    fn check_names_the_size_or_kind_that_does_not_fit() {
        let msg = |c: Content, dtype, heads| c.check(dtype, heads).unwrap_err().to_string();
        assert!(MLA.check(DType::Bf16, 1).is_ok());
        assert!(KV_SCALED.check(DType::Fp8E4m3, 8).is_ok());
        assert_eq!(
            msg(MLA, DType::Bf16, 2),
            "invalid layout: MLA content has one head slot; num_kv_heads is 2"
        );
        assert_eq!(
            msg(KV_SCALED, DType::Bf16, 8),
            "invalid layout: inline scales are for int8/fp8 rows; dtype is bf16"
        );
        assert_eq!(
            msg(OPAQUE, DType::Bf16, 1),
            "invalid layout: opaque rows are bytes: dtype must be u8, got bf16"
        );
        assert_eq!(
            msg(KV, DType::U8, 8),
            "invalid layout: dtype u8 is only for opaque byte rows"
        );
        let no_rope = Content::Mla {
            kv_lora_rank: 512,
            rope_dim: 0,
        };
        assert!(no_rope.check(DType::Bf16, 1).is_ok());
    }
}
