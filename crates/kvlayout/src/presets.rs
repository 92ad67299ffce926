//! Layouts of common models, by name. Each is a spec string; overrides may follow the name
//! (`llama-3-8b B=4096 order=LBHNC dtype=fp8_e4m3`).

use crate::error::{LayoutError, Result};
use crate::layout::KvCacheLayout;

/// `(name, spec string, what it is)`.
pub const PRESETS: &[(&str, &str, &str)] = &[
    (
        "llama-3-8b",
        "kv L=32 B=1024 N=16 H=8 D=128 dtype=bf16 order=LBNHC",
        "Llama-3-8B: 32 layers, 8 KV heads of 128, bf16, block 16, token-major pages",
    ),
    (
        "llama-3-70b",
        "kv L=80 B=1024 N=16 H=8 D=128 dtype=bf16 order=LBNHC",
        "Llama-3-70B: 80 layers, 8 KV heads of 128 (one TP rank holds a head slice)",
    ),
    (
        "qwen2.5-7b",
        "kv L=28 B=1024 N=16 H=4 D=128 dtype=bf16 order=LBNHC",
        "Qwen2.5-7B: 28 layers, 4 KV heads of 128",
    ),
    (
        "mistral-7b",
        "kv L=32 B=1024 N=16 H=8 D=128 dtype=bf16 order=LBNHC",
        "Mistral-7B: 32 layers, 8 KV heads of 128",
    ),
    (
        "deepseek-v3",
        "mla L=61 B=1024 N=64 rank=512 rope=64 dtype=bf16 order=LBNHC",
        "DeepSeek-V3 MLA: 61 layers, one 576-wide latent (512 + 64 rope) per token, block 64",
    ),
    (
        "mamba2-2.7b",
        "mamba-ssm L=64 B=1024 N=16 H=80 head_dim=64 state=128 dtype=f32 order=LBHNC",
        "Mamba2-2.7B SSM state: 64 layers, 80 heads x [64 x 128] f32, one state per block",
    ),
    (
        "mamba2-2.7b-conv",
        "mamba-conv L=64 B=1024 N=16 conv_dim=5376 conv_width=3 dtype=bf16 order=LBHNC",
        "Mamba2-2.7B conv state: [5376 x 3] bf16 (d_conv 4), one state per block",
    ),
];

/// Names of all presets.
pub const PRESET_NAMES: &[&str] = &[
    "llama-3-8b",
    "llama-3-70b",
    "qwen2.5-7b",
    "mistral-7b",
    "deepseek-v3",
    "mamba2-2.7b",
    "mamba2-2.7b-conv",
];

pub(crate) fn preset_spec_string(name: &str) -> Option<&'static str> {
    PRESETS
        .iter()
        .find(|(n, _, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, s, _)| *s)
}

/// A preset layout by model name.
///
/// ```
/// let l = kvlayout::preset("deepseek-v3")?;
/// assert_eq!(l.geometry().num_kv_heads, 1);
/// assert!(kvlayout::preset("gpt-5").is_err());
/// # Ok::<(), kvlayout::LayoutError>(())
/// ```
pub fn preset(name: &str) -> Result<KvCacheLayout> {
    match preset_spec_string(name) {
        Some(s) => s.parse(),
        None => Err(LayoutError::UnknownPreset {
            name: name.to_string(),
            known: PRESET_NAMES.join(", "),
        }),
    }
}
