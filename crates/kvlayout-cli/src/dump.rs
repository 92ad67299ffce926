//! Cache dumps: the safetensors files `kvlayout fill`, `convert` and `decode --out` write and
//! `convert` and `decode --from` read, which numpy and PyTorch open with the `safetensors`
//! package.
//!
//! A dump holds one `U8` 1-D tensor per buffer of the layout (`buffer0`, `buffer1`, ...: the
//! buffer's bytes `0..extent.end`, padding included; a buffer may mix dtypes, as inline scales
//! do), and, for a decode step, its `block_table` (`I32 [seqs, blocks_per_seq]`), `seq_lens`
//! (`I32 [seqs]`), `query` (`F32 [seqs, q_heads, qk_width]`) and `output` (`F32 [seqs,
//! q_heads, v_width]`). The file's `__metadata__` (strings only) states:
//!
//! | key | value |
//! |---|---|
//! | `format` | `kvlayout-dump` |
//! | `format_version` | `1` |
//! | `writer` | the program and command that wrote it |
//! | `layout` | the layout's versioned JSON: the statement every tensor is checked against |
//! | `views` | JSON list, per readable field and layer: the `standard` view, else the `vllm-paged-v1` one (`convention`, `buffer`, `dtype`, `offset_bytes`, `shape`, `strides_bytes`, `axes`, ...), or why there is none |
//! | `pattern` | what the cache holds (`coords`, `random seed=S`, `write_kv seed=S`), where known |
//! | `padding` | what bytes outside every field hold (`zero`) |
//! | `decode` | JSON ([`StepMeta`]), only in a dump of a decode step |
//!
//! Other metadata keys are allowed and ignored. This module owns the format's names and the
//! in-memory [`Dump`]; [`mod@read`] owns the strict reading, [`mod@write`] the writing. It does not
//! own what the cache holds (`fill`, `convert`, `decode` do).

use kvlayout::KvCacheLayout;
use serde::{Deserialize, Serialize};

pub(crate) mod read;
pub(crate) mod write;

/// `format` of a dump.
pub(crate) const FORMAT: &str = "kvlayout-dump";
/// `format_version` this build reads and writes.
pub(crate) const FORMAT_VERSION: &str = "1";
/// Names of the step's tensors, in the order they are checked.
pub(crate) const STEP_TENSORS: [&str; 4] = ["block_table", "seq_lens", "query", "output"];

/// The tensor name of buffer `i`.
pub(crate) fn buffer_name(i: usize) -> String {
    format!("buffer{i}")
}

/// A dump in memory: the stated layout and the bytes of each of its buffers.
#[derive(Debug, Clone)]
pub(crate) struct Dump {
    pub layout: KvCacheLayout,
    /// One vector per layout buffer, `extents()[i].end` bytes long.
    pub buffers: Vec<Vec<u8>>,
    /// What the cache holds (the `pattern` key), where known.
    pub pattern: Option<String>,
    /// A decode step over the cache, where the dump holds one.
    pub step: Option<Step>,
}

/// A decode step as a dump records it (the `decode` key and its tensors).
#[derive(Debug, Clone)]
pub(crate) struct Step {
    pub meta: StepMeta,
    /// `seqs x blocks_per_seq` block ids, row-major.
    pub block_table: Vec<i32>,
    /// Tokens of each sequence.
    pub seq_lens: Vec<i32>,
    /// `seqs x q_heads x qk_width` queries.
    pub query: Vec<f32>,
    /// `seqs x q_heads x v_width` outputs; absent in a step given as input only.
    pub output: Option<Vec<f32>>,
}

/// The `decode` metadata: the step's parameters, which the step's tensors are checked
/// against (widths as `kvlayout::ops::decode_widths` gives them for the layout).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StepMeta {
    /// Layer slot the step reads.
    pub layer: u64,
    pub seqs: u64,
    pub blocks_per_seq: u64,
    pub q_heads: u64,
    /// Elements of a query row (K's width).
    pub qk_width: u64,
    /// Elements of an output row (V's width).
    pub v_width: u64,
    /// Attend only to the last `window` tokens.
    pub window: Option<u64>,
    /// Logits soft-cap.
    pub soft_cap: Option<f32>,
    /// The backend that computed `output`, where there is one.
    #[serde(default)]
    pub backend: Option<String>,
}

impl StepMeta {
    /// Shape of the `query` tensor.
    pub(crate) fn query_shape(&self) -> [u64; 3] {
        [self.seqs, self.q_heads, self.qk_width]
    }

    /// Shape of the `output` tensor.
    pub(crate) fn output_shape(&self) -> [u64; 3] {
        [self.seqs, self.q_heads, self.v_width]
    }

    /// Shape of the `block_table` tensor.
    pub(crate) fn table_shape(&self) -> [u64; 2] {
        [self.seqs, self.blocks_per_seq]
    }
}
