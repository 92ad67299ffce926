//! The argument syntax: the `kvlayout` parser and its commands, each with its flags, its help
//! and an example. What each command does is in its own module.

use clap::{Parser, Subcommand};

use crate::{bench, check, convert, decode, demo, diff, fill, plan};

pub(crate) const SPEC_HELP: &str =
    "Preset name (`kvlayout presets`), compact spec string as one quoted \
argument (\"kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=NHD\", or \"llama-3-8b B=4096 \
dtype=fp8_e4m3\"), or the path of a layout JSON file";

/// Inspect paged KV cache layouts: addresses, views, and what to register for transfers.
#[derive(Debug, Parser)]
#[command(name = "kvlayout", version)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// The main job: a prompt's KV cache from a prefill instance (NHD, blocks of 16, TP 1)
    /// to a decode instance of another layout (HND, padded pages, blocks of 32, TP 2), each
    /// step on one line with its bytes, time and bandwidth against memcpy: write_kv,
    /// handshake, compatibility check, plan, transfer, post-receive scatter, paged_decode on
    /// every decode rank, verification against the reference bit for bit (exit 1 if it
    /// fails).
    #[command(after_help = demo::HELP)]
    Demo {
        #[command(flatten)]
        args: demo::DemoArgs,
        /// Print the whole record as JSON: scenario, every step, verification.
        #[arg(long)]
        json: bool,
    },
    /// The decode side of `demo --engine nixl`, run by the demo itself.
    #[command(hide = true, after_help = "Example:\n  kvlayout demo --engine nixl")]
    DemoPeer {
        #[command(flatten)]
        args: demo::PeerArgs,
    },
    /// Explain a layout: geometry, page size and padding, field strides, every convention's
    /// view (or why there is none), the registered span, and a picture of one page.
    #[command(
        after_help = "Example:\n  kvlayout explain llama-3-8b\n  kvlayout explain \"kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=HND\" --json\n  kvlayout explain \"kv L=1 B=3 N=16 H=4 D=16 dtype=f16 tensor=vllm-paged-v1\" --svg page.svg"
    )]
    Explain {
        #[arg(value_name = "SPEC", help = SPEC_HELP)]
        spec: String,
        /// Print the explanation as JSON.
        #[arg(long)]
        json: bool,
        /// Also write an SVG picture to FILE: the page of layer 0, block 0 with every element
        /// at its byte offset (fields, padding and strides marked), an x-split key as vLLM's
        /// paged-attention document draws it, and how the first blocks tile each buffer.
        /// Pages of at most 4096 elements are drawn one rectangle per element, larger ones
        /// one per run of contiguous elements; past 2048 rows or 3072 runs only the first two
        /// and the last heads and tokens, and if still past 3072 runs the first and the last
        /// runs in address order; the picture counts what it leaves out.
        #[arg(long, value_name = "FILE")]
        svg: Option<String>,
    },
    /// Byte offset of one element: (layer, block, head, slot, field, dim).
    #[command(
        after_help = "Example:\n  kvlayout offset llama-3-8b --layer 2 --block 7 --head 3 --slot 5 --field v --dim 64"
    )]
    Offset {
        #[arg(value_name = "SPEC", help = SPEC_HELP)]
        spec: String,
        /// Layer slot.
        #[arg(long, value_name = "L", default_value_t = 0)]
        layer: u64,
        /// Block (page) index.
        #[arg(long, value_name = "B")]
        block: u64,
        /// Head slot.
        #[arg(long, value_name = "H")]
        head: u64,
        /// Slot (token position in the block; a state slot where one holds several tokens):
        /// < block_size / tokens_per_state, 0 for per-block Mamba states. `--token` is an
        /// alias.
        #[arg(long, value_name = "N", alias = "token")]
        slot: u64,
        /// Field: k, v, k_scale, v_scale, latent, bytes, conv, ssm.
        #[arg(long, value_name = "F")]
        field: String,
        /// Element index within the field's row.
        #[arg(long, value_name = "D")]
        dim: u64,
        /// Print {"buffer": .., "offset": ..} as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Strided view (offset, shape, strides in elements) of one field, or of K and V
    /// together, in a consumer's convention; refused, with the reason, where it needs a copy.
    #[command(
        after_help = "Example:\n  kvlayout view llama-3-8b --as flashinfer --field kv --json"
    )]
    View {
        #[arg(value_name = "SPEC", help = SPEC_HELP)]
        spec: String,
        /// Convention: standard, vllm-paged-v1, flash-attn, flashinfer (flashinfer-nhd),
        /// flashinfer-hnd.
        #[arg(long = "as", value_name = "CONVENTION")]
        convention: String,
        /// Field: k, v, k_scale, v_scale, latent, bytes, conv, ssm, or kv (K and V stacked).
        #[arg(long, value_name = "F")]
        field: String,
        /// Layer slot.
        #[arg(long, value_name = "L", default_value_t = 0)]
        layer: u64,
        /// Print the view as JSON (elements and bytes).
        #[arg(long)]
        json: bool,
    },
    /// One decode step of the layout on a backend (`--backend`, the CPU backend by default),
    /// in process: one layer filled by `write_kv` (seeded random tokens, a random block
    /// table), `paged_decode` checked against the f64 reference and timed against the memory
    /// read bandwidth of the same run.
    #[command(
        after_help = "Example:\n  kvlayout decode llama-3-8b\n  kvlayout decode \"llama-3-8b order=HND dtype=fp8_e4m3\" --context 4096 --backend cpu\n  kvlayout decode --from cache.safetensors --seqs 1 --context 40 --out step.safetensors"
    )]
    Decode {
        #[arg(value_name = "SPEC", help = SPEC_HELP, required_unless_present = "from")]
        spec: Option<String>,
        #[command(flatten)]
        step: decode::StepArgs,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Write a cache of the layout filled with a pattern as a safetensors dump (one U8 tensor
    /// per buffer, the layout's JSON and every field's view in the metadata).
    #[command(
        after_help = "Example:\n  kvlayout fill \"kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=NHD\" --pattern coords --out cache.safetensors"
    )]
    Fill {
        #[arg(value_name = "SPEC", help = SPEC_HELP)]
        spec: String,
        #[command(flatten)]
        args: fill::FillArgs,
    },
    /// Re-lay a dump in another layout through a backend's movers (`convert`); layouts of
    /// other content or geometry are refused with the reason.
    #[command(
        after_help = "Example:\n  kvlayout convert cache.safetensors --to \"kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=HND\" --out hnd.safetensors"
    )]
    Convert {
        /// The dump to read (`kvlayout fill`, `convert`, `decode --out`).
        #[arg(value_name = "IN")]
        input: String,
        #[command(flatten)]
        args: convert::ConvertArgs,
    },
    /// Every op (write_kv, paged_decode, copy/swap/gather/scatter_blocks, convert) on a
    /// backend, timed against bounds measured in the same run: memcpy of the same bytes, the
    /// streaming read, and pages read in a random block-table order.
    #[command(
        after_help = "Example:\n  kvlayout bench\n  kvlayout bench \"kv L=1 B=64 N=16 H=4 D=64 dtype=f16 order=HND\" --backend cuda-emu --runs 1 --json"
    )]
    Bench {
        #[arg(value_name = "SPEC", help = SPEC_HELP, default_value = bench::DEFAULT_SPEC)]
        spec: String,
        #[command(flatten)]
        args: bench::BenchArgs,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// The conformance suite on backends: every case family x backend, each op checked against
    /// the scalar reference; a backend that cannot run here is a named skip.
    #[command(
        after_help = "Example:\n  kvlayout check --backend cpu,reference\n  kvlayout check --backend cpu,cuda-emu --family std,mla --json"
    )]
    Check {
        #[command(flatten)]
        args: check::CheckArgs,
        /// Print the matrix as JSON.
        #[arg(long)]
        json: bool,
    },
    /// The CPU as the backend sees it: the features it uses and those `KVLAYOUT_CPU_HIDE`
    /// hides, the kernel builds it runs (the one it picks, and why) and those it cannot.
    #[command(after_help = "Example:\n  KVLAYOUT_CPU_HIDE=avx512f kvlayout cpu")]
    Cpu {
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// The connector's transfer plan for a DST (local, decode side) rank to pull sequences
    /// from SRC (remote, prefill side) ranks, or its refusal with the reason (exit 2).
    ///
    /// SRC and DST are the layouts of one rank of each side. Both sides go through the
    /// handshake's checks (regions at synthetic addresses) and the compatibility check, then
    /// the connector's planner: direct (every byte into its place) or staged (into a staging
    /// cache in the SRC order, then scatter_blocks on the DST backend). The runs printed are
    /// the planner's: source buffer and offset, destination buffer and offset, length. Every
    /// layer moves, and the heads the DST rank holds (its TP rank picks them): the connector
    /// selects no other layers or heads.
    #[command(
        after_help = "Example:\n  kvlayout plan \"kv L=2 B=10 N=16 H=4 D=16 dtype=bf16 order=NHD\" \\\n    \"kv L=2 B=8 N=32 H=2 D=16 dtype=bf16 order=HND page=8192\" \\\n    --dst-tp 2 --dst-rank 1 --seq 3,7,1:5,2:40 --seq 0,9:6:23"
    )]
    Plan(plan::PlanArgs),
    /// Whether two layouts are byte-compatible (every element at the same place), each
    /// difference, and what a transfer from A to B needs.
    ///
    /// Differences are listed field by field (the specs) and stride by stride (each stored
    /// field's strides as the descriptor reports them), then the connector's direct and staged
    /// plans for one B block's tokens at TP 1 each (`kvlayout plan` takes TP sizes). Exit
    /// status as diff(1): 0 when A and B address every element alike (differences that move
    /// no element are listed all the same), 1 when they do not (the report on stdout, the
    /// first difference on stderr), 2 on an error; so a deployment script can gate on
    /// `kvlayout diff prefill.json decode.json`.
    #[command(
        after_help = "Example:\n  kvlayout diff \"kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=NHD\" \"kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=HND\""
    )]
    Diff(diff::DiffArgs),
    /// List the preset layouts: name, description and spec string.
    #[command(after_help = "Example:\n  kvlayout presets --json")]
    Presets {
        /// Print the list as JSON.
        #[arg(long)]
        json: bool,
    },
}
