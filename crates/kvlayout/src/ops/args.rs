//! The arguments of the ops, independent of where their tensors live, and the shapes the
//! checks derive from them.

use crate::dtype::DType;

/// Parameters of one decode step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodeParams {
    /// Query heads (a multiple of the layout's KV heads: MHA, GQA, MQA).
    pub num_q_heads: u64,
    /// Softmax scale applied to `q . k` (usually `1 / sqrt(head_size)`).
    pub scale: f32,
    /// Attend only to the last `w` tokens of each sequence.
    pub sliding_window: Option<u64>,
    /// Logits soft-cap `c`: `s = c * tanh(s / c)`, applied after scaling.
    pub soft_cap: Option<f32>,
}

/// What the checks need to know of an activation tensor, wherever it lives: its element type
/// and count (tensors are dense and row-major).
pub trait TensorDesc {
    /// Element type.
    fn dtype(&self) -> DType;
    /// Number of elements.
    fn len(&self) -> usize;
    /// Whether it holds no element.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<T: TensorDesc + ?Sized> TensorDesc for &T {
    fn dtype(&self) -> DType {
        (**self).dtype()
    }
    fn len(&self) -> usize {
        (**self).len()
    }
}

/// `write_kv`: new tokens' K and V for one layer, scattered by slot (`block * block_size +
/// offset`; negative = padding, skipped). `T` is the backend's tensor handle.
#[derive(Debug, Clone, Copy)]
pub struct WriteArgs<'a, T> {
    /// Layer slot to write.
    pub layer: u64,
    /// `[tokens, num_kv_heads, head_size]`; for MLA the latent `[tokens, 1, rank + rope]`.
    pub key: T,
    /// `[tokens, num_kv_heads, head_size_v]`; `None` for MLA.
    pub value: Option<T>,
    /// One slot per token.
    pub slot_mapping: &'a [i64],
}

/// `paged_decode`: one query token per sequence. `T` is the backend's tensor handle.
#[derive(Debug, Clone, Copy)]
pub struct DecodeArgs<'a, T> {
    /// Layer slot to read.
    pub layer: u64,
    /// `[seqs, num_q_heads, qk_width]`.
    pub query: T,
    /// `[seqs, blocks_per_seq]` block ids, row-major.
    pub block_table: &'a [i32],
    /// Row length of the block table.
    pub blocks_per_seq: usize,
    /// Tokens in each sequence (the new token included).
    pub seq_lens: &'a [u32],
    /// Scale, window, soft-cap, query heads.
    pub params: DecodeParams,
}

/// The shape of a write, once validated ([`super::check_write`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteShape {
    /// Heads per token (1 for MLA).
    pub heads: usize,
    /// Key (or latent) elements per head.
    pub k_width: usize,
    /// Value elements per head (0 for MLA).
    pub v_width: usize,
    /// Whether one latent is stored (no value tensor).
    pub mla: bool,
}

/// The shape of a decode, once validated ([`super::check_decode`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeShape {
    /// Sequences (one query token each).
    pub seqs: usize,
    /// Query heads.
    pub q_heads: usize,
    /// Query heads per KV head.
    pub group: usize,
    /// Elements of a query row (and of a key row read).
    pub qk_width: usize,
    /// Elements of an output row (and of a value row read).
    pub v_width: usize,
}
