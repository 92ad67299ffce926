//! # `kvlayout`: the command line of the kvlayout descriptor
//!
//! This crate owns the `kvlayout` binary and nothing else: it turns a SPEC argument (a preset
//! name, a compact spec string, or a path to a layout JSON file) into a
//! [`kvlayout::KvCacheLayout`], asks the core crate a question (`explain`, `offset`, `view`,
//! `presets`), says what the CPU backend runs on this machine (`cpu`, see [`cpu`]) or runs one
//! decode step of the layout on a backend chosen by name (`decode`, see [`decode`]), and
//! prints the answer as text or JSON. It owns the reading of files, the argument syntax, the
//! output formats and the exit codes: 0 on success, 2 with exactly one `error: ...` line on
//! stderr for any user error (clap's own usage errors aside, which clap prints and which also
//! exit 2, and a backend that cannot open here), 1 when a decode step disagrees with the
//! reference or the backend fails while running (no memory, a device error).
//!
//! It does not own any layout arithmetic, validation, view derivation, spec-string grammar or
//! kernel: every number it prints comes from `kvlayout` or a backend, and it never computes an offset
//! or a stride itself. It writes no files.

#![forbid(unsafe_code)]

use std::fmt;
use std::io::{self, Write};
use std::path::Path;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use kvlayout::ops::OpError;
use kvlayout::{Convention, Coord, Field, KvCacheLayout, LayoutError, ViewTarget, PRESETS};

mod bench;
mod check;
mod convert;
mod cpu;
mod decode;
mod decode_dump;
mod demo;
mod diff;
mod dump;
mod fill;
mod plan;
mod svg;

/// Exit status of every user error (the same as clap's usage errors).
const USER_ERROR: u8 = 2;

/// Exit status of a decode step whose output differs from the reference beyond tolerance, or
/// of a backend that failed while running.
const CHECK_FAILED: u8 = 1;

const SPEC_HELP: &str = "Preset name (`kvlayout presets`), compact spec string as one quoted \
argument (\"kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=NHD\", or \"llama-3-8b B=4096 \
dtype=fp8_e4m3\"), or the path of a layout JSON file";

/// Inspect paged KV cache layouts: addresses, views, and what to register for transfers.
#[derive(Debug, Parser)]
#[command(name = "kvlayout", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
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
        after_help = "Example:\n  kvlayout explain llama-3-8b\n  kvlayout explain \"kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=HND\" --json\n  kvlayout explain \"kv L=1 B=3 N=16 H=4 D=16 dtype=f16 legacy=vllm-paged-v1\" --svg page.svg"
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
    /// Byte offset of one element: (layer, block, head, token slot, field, dim).
    #[command(
        after_help = "Example:\n  kvlayout offset llama-3-8b --layer 2 --block 7 --head 3 --token 5 --field v --dim 64"
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
        /// Token (state) slot within the block: < block_size / tokens_per_state, 0 for
        /// per-block Mamba states.
        #[arg(long, value_name = "N")]
        token: u64,
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

/// A user error: printed as one `error: ...` line, exit status 2.
#[derive(Debug)]
enum CliError {
    /// The core crate refused (bad spec, out-of-range coordinate, refused view, ...).
    Layout(LayoutError),
    /// A layout JSON file that cannot be read or does not describe a layout.
    File { path: String, detail: String },
    /// A command-line value the core crate has no parser error for.
    Usage(String),
    /// The CPU backend refused an op (content without keys and values, a bad layer, ...).
    Op(OpError),
    /// A decode step that ran but disagrees with the reference (exit status 1).
    Check(String),
    /// A backend that failed while running (no memory, a device error; exit status 1).
    Failed(String),
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::Layout(e) => write!(f, "{e}"),
            CliError::File { path, detail } => write!(f, "{path}: {detail}"),
            CliError::Usage(m) | CliError::Check(m) | CliError::Failed(m) => f.write_str(m),
            CliError::Op(e) => write!(f, "{e}"),
        }
    }
}

impl From<LayoutError> for CliError {
    fn from(e: LayoutError) -> Self {
        CliError::Layout(e)
    }
}

impl From<OpError> for CliError {
    fn from(e: OpError) -> Self {
        match e {
            OpError::Layout(e) => CliError::Layout(e),
            e => CliError::Op(e),
        }
    }
}

/// Whether SPEC names a file rather than a preset or spec string: an existing file, anything
/// ending in `.json`, or a single word with a path separator (no spec token contains one).
fn is_path(spec: &str) -> bool {
    let p = Path::new(spec);
    let separator = spec.contains(std::path::MAIN_SEPARATOR) || spec.contains('/');
    p.is_file()
        || spec.to_ascii_lowercase().ends_with(".json")
        || (separator && !spec.contains(char::is_whitespace))
}

/// Resolves SPEC to a validated layout.
fn load(spec: &str) -> Result<KvCacheLayout, CliError> {
    if is_path(spec) {
        let file = |detail: String| CliError::File {
            path: spec.to_string(),
            detail,
        };
        let text = std::fs::read_to_string(spec).map_err(|e| file(format!("cannot read: {e}")))?;
        KvCacheLayout::from_json(&text).map_err(|e| file(e.to_string()))
    } else {
        spec.parse::<KvCacheLayout>().map_err(CliError::Layout)
    }
}

fn parse_convention(s: &str) -> Result<Convention, CliError> {
    Convention::from_name(s).map_err(CliError::Layout)
}

/// Version of the schema of every `--json` output: the `"version"` field of its top-level
/// object. It changes when a field is removed or changes meaning, not when one is added.
const JSON_VERSION: u64 = 1;

/// The `--json` output of a command: `value` as pretty JSON with a final newline, and
/// `"version": JSON_VERSION` added to its top-level object (a value that is not an object goes
/// under `"value"`).
fn json<T: serde::Serialize>(value: &T) -> Result<String, CliError> {
    let render = |e: serde_json::Error| CliError::Usage(format!("cannot render JSON: {e}"));
    let mut object = match serde_json::to_value(value).map_err(render)? {
        serde_json::Value::Object(map) => map,
        other => serde_json::Map::from_iter([("value".to_string(), other)]),
    };
    object.insert("version".into(), JSON_VERSION.into());
    let mut text = serde_json::to_string_pretty(&object).map_err(render)?;
    text.push('\n');
    Ok(text)
}

/// Runs one command and returns what goes to stdout.
fn run(command: Command) -> Result<String, CliError> {
    match command {
        Command::Explain {
            spec,
            json: as_json,
            svg: svg_path,
        } => {
            let layout = load(&spec)?;
            let explanation = layout.explain();
            if let Some(path) = &svg_path {
                svg::write(&layout, &explanation, path)?;
            }
            if as_json {
                json(&explanation)
            } else {
                Ok(explanation.to_text())
            }
        }
        Command::Offset {
            spec,
            layer,
            block,
            head,
            token,
            field,
            dim,
            json: as_json,
        } => {
            let layout = load(&spec)?;
            let coord = Coord {
                layer,
                block,
                head,
                slot: token,
                field: one_field(&field)?,
                dim,
            };
            offset_text(&layout, &coord, as_json)
        }
        Command::View {
            spec,
            convention,
            field,
            layer,
            json: as_json,
        } => {
            let layout = load(&spec)?;
            let c = parse_convention(&convention)?;
            let t = field.parse::<ViewTarget>()?;
            let v = layout.view(c, t, layer)?;
            if as_json {
                json(&v)
            } else {
                Ok(format!(
                    "{c} {t} layer {layer}: {} buffer {} offset {} shape {:?} strides {:?} \
                     (bytes: offset {} strides {:?})\n",
                    v.dtype,
                    v.buffer,
                    v.offset,
                    v.shape,
                    v.strides,
                    v.offset_bytes,
                    v.strides_bytes
                ))
            }
        }
        Command::Decode {
            spec,
            step,
            json: as_json,
        } => decode_cmd(spec.as_deref(), &step, as_json),
        Command::Fill { spec, args } => fill::run(load(&spec)?, &args),
        Command::Convert { input, args } => convert::run(&input, &args),
        Command::Demo {
            args,
            json: as_json,
        } => demo::command(&args, as_json),
        Command::DemoPeer { args } => demo::peer(&args),
        Command::Bench {
            spec,
            args,
            json: as_json,
        } => {
            let layout = load(&spec)?;
            let to = match &args.to {
                Some(to) => load(to)?,
                None => bench::other_order(&layout)?,
            };
            let report = bench::run(layout, to, &args, as_json)?;
            if as_json {
                json(&report)
            } else {
                Ok(report.to_text())
            }
        }
        Command::Check {
            args,
            json: as_json,
        } => check::run(&args, as_json),
        Command::Cpu { json: as_json } => cpu::run(as_json),
        Command::Plan(args) => plan::run(&args),
        Command::Diff(args) => diff::run(&args),
        Command::Presets { json: as_json } => presets_cmd(as_json),
    }
}

/// The field `--field` names (`k` or `v`; an offset is of one field).
fn one_field(field: &str) -> Result<Field, CliError> {
    match field.parse::<ViewTarget>()? {
        ViewTarget::Field(f) => Ok(f),
        ViewTarget::Kv => Err(CliError::Usage(
            "an offset is of one field: give --field k or --field v, not kv".into(),
        )),
    }
}

/// `offset`: the byte offset of one element.
fn offset_text(layout: &KvCacheLayout, coord: &Coord, as_json: bool) -> Result<String, CliError> {
    let at = layout.offset(coord)?;
    if as_json {
        json(&at)
    } else if layout.num_buffers() > 1 {
        Ok(format!("buffer {} offset {}\n", at.buffer, at.offset))
    } else {
        Ok(format!("{}\n", at.offset))
    }
}

/// `decode`: runs the step and reports it; a disagreement with the reference is an error
/// after the report is printed.
fn decode_cmd(
    spec: Option<&str>,
    step: &decode::StepArgs,
    as_json: bool,
) -> Result<String, CliError> {
    let report = decode_dump::run(spec, step)?;
    let text = if as_json {
        json(&report)?
    } else {
        report.to_text()
    };
    if report.passed() {
        Ok(text)
    } else {
        // The report goes to stdout all the same: it is what shows the disagreement.
        let _ = emit(&text);
        Err(CliError::Check(format!(
            "paged_decode differs from the reference by {:.2e} of the values' \
             magnitude, {:.2} x its bound ({} products, {} kernels)",
            report.max_error, report.error_to_bound, report.tolerance.products, report.kernels
        )))
    }
}

/// `presets`: every preset's name, description and spec.
fn presets_cmd(as_json: bool) -> Result<String, CliError> {
    if as_json {
        let list: Vec<serde_json::Value> = PRESETS
            .iter()
            .map(|(name, spec, description)| {
                serde_json::json!({
                    "name": name,
                    "description": description,
                    "spec": spec,
                })
            })
            .collect();
        json(&serde_json::json!({ "presets": list }))
    } else {
        let width = PRESETS.iter().map(|p| p.0.len()).max().unwrap_or(0);
        let mut out = String::new();
        for (name, spec, description) in PRESETS {
            out.push_str(&format!("{name:<width$}  {description}\n"));
            out.push_str(&format!("{:<width$}  {spec}\n", ""));
        }
        Ok(out)
    }
}

/// Writes to stdout; a closed pipe (`kvlayout explain .. | head`) is not an error.
fn emit(text: &str) -> ExitCode {
    let mut out = io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => fail(&CliError::Usage(format!("cannot write to stdout: {e}"))),
    }
}

/// Prints one `error: ...` line (newlines in a message are folded) and returns status 2 (1
/// for a decode step that disagrees with the reference).
fn fail(e: &CliError) -> ExitCode {
    let line = e.to_string().replace(['\r', '\n'], " ");
    // If stderr is gone there is nowhere left to report to; the status still says it failed.
    let _ = writeln!(io::stderr().lock(), "error: {line}");
    ExitCode::from(match e {
        CliError::Check(_) | CliError::Failed(_) => CHECK_FAILED,
        _ => USER_ERROR,
    })
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    match run(cli.command) {
        Ok(text) => emit(&text),
        Err(e) => fail(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_convention_parses() {
        for name in kvlayout::CONVENTION_NAMES {
            assert!(parse_convention(name).is_ok(), "{name}");
        }
    }

    #[test]
    fn clap_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn every_command_help_carries_an_example() {
        use clap::CommandFactory;
        for sub in Cli::command().get_subcommands() {
            let after = sub
                .get_after_help()
                .map(|h| h.to_string())
                .unwrap_or_default();
            assert!(
                after.starts_with("Example:\n  kvlayout ") || after.contains("kvlayout "),
                "`kvlayout {} --help` has no example: {after:?}",
                sub.get_name()
            );
        }
    }

    #[test]
    fn path_detection() {
        assert!(is_path("/nonexistent/x.json"));
        assert!(is_path("layout.JSON"));
        assert!(is_path("./some/dir/layout"));
        assert!(!is_path("llama-3-8b"));
        assert!(!is_path("kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=NHD"));
    }
}
