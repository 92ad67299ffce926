//! The flags of `kvlayout decode`.

use std::path::PathBuf;

/// What `kvlayout decode` was asked for (its options, besides the spec and `--json`).
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct StepArgs {
    /// Query heads (default: 4 per KV head; 16 for MLA).
    #[arg(long, value_name = "N")]
    pub q_heads: Option<u64>,
    /// Sequences in the step.
    #[arg(long, value_name = "S", default_value_t = 8)]
    pub seqs: usize,
    /// Tokens in each sequence.
    #[arg(long, value_name = "T", default_value_t = 1024)]
    pub context: u32,
    /// Layer slot to fill and read.
    #[arg(long, value_name = "L", default_value_t = 0)]
    pub layer: u64,
    /// Attend only to the last W tokens of each sequence.
    #[arg(long, value_name = "W")]
    pub window: Option<u64>,
    /// Logits soft-cap C: s = C * tanh(s / C) (Gemma 2: 50).
    #[arg(long, value_name = "C")]
    pub soft_cap: Option<f32>,
    /// Backend to run the step on: cpu, cpu:BUILD, reference, cuda-emu, hip-emu, cuda or
    /// cuda:N, hip or hip:N. The emulators run the GPU kernels on the CPU one thread block at a time,
    /// thousands of times slower than a GPU: give them a small step (e.g. a spec with B=64 and
    /// --seqs 2 --context 64 --runs 1).
    #[arg(long, value_name = "NAME", default_value = "cpu")]
    pub backend: String,
    /// Threads of the CPU backend and of the read bound, at most 1024 (default, or 0: every
    /// core).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Kernel build of the CPU backend (avx512-bf16, avx512, avx2, scalar; default: the one
    /// this machine prefers): the same as --backend cpu:BUILD.
    #[arg(long, value_name = "BUILD")]
    pub kernels: Option<String>,
    /// Timed runs, each right after a pass of the read bound (1 to 10000).
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub runs: usize,
    /// Sequences compared with the scalar f64 reference: the first ones (it takes about
    /// a second per 30 million tokens x query heads x (K + V width)).
    #[arg(long, value_name = "S", default_value_t = 1)]
    pub check_seqs: usize,
    /// Seed of the tokens, queries and block table.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Largest cache to allocate, in GiB (the whole layout is allocated).
    #[arg(long, value_name = "GIB", default_value_t = 8.0)]
    pub max_cache_gib: f64,
    /// MiB per thread of the read bound's buffer (at least twice the last-level cache, so
    /// that a pass reads memory and evicts the cache before each timed run).
    #[arg(long, value_name = "MIB", default_value_t = 512)]
    pub bound_mib: usize,
    /// Read the cache from this dump (`kvlayout fill`, `convert`, `decode --out`) instead of
    /// filling one with write_kv; where the dump holds a decode step, its block table, lengths
    /// and queries too, and the step's layer, sequences, context, query heads, window and
    /// soft-cap come from it. Give SPEC or --from, not both.
    #[arg(long, value_name = "FILE")]
    pub from: Option<PathBuf>,
    /// Write the step as a dump: the cache, block table, lengths, queries and output.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}
