//! The arguments of the ops, independent of where their tensors live.

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
