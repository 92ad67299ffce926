//! # `kvlayout`: the command line of the kvlayout descriptor
//!
//! This crate owns the `kvlayout` binary and nothing else. It turns a SPEC argument (a preset
//! name, a compact spec string, or a path to a layout JSON file) into a
//! [`kvlayout::KvCacheLayout`] and runs one command on it:
//!
//! - the main job, [`demo`]: a prefill instance's KV cache pulled by the decode ranks of an
//!   instance of another layout, TP size and block size through the connector, decoded and
//!   verified bit for bit (`demo-peer`, hidden, is its decode side over NIXL);
//! - the descriptor's questions: `explain` (with a picture, [`svg`]), `offset`, `view`,
//!   `presets`;
//! - transfers: [`plan`] (the connector's plan between two layouts, or its refusal) and
//!   [`diff`] (whether two layouts are byte-compatible, and what a transfer needs);
//! - dumps ([`dump`]): [`fill`] writes a cache as safetensors, [`convert`] re-lays one through
//!   a backend's movers, `decode --from/--out` ([`decode_dump`]) reads and writes a step;
//! - backends: [`decode`] (one decode step, checked and timed), [`bench`](mod@bench) (every op against
//!   bounds of the same run), [`check`] (the conformance suite as a matrix), [`cpu`] (what the
//!   CPU backend runs here).
//!
//! It owns the reading and writing of files, the argument syntax, the output formats (text, or
//! JSON with a `"version"` field: [`JSON_VERSION`]) and the exit codes: 0 on success, 2 with
//! exactly one `error: ...` line on stderr for any user error (clap's own usage errors aside,
//! which clap prints and which also exit 2, and a backend that cannot open here), 1 when a
//! check fails (a decode or demo that disagrees with the reference, a conformance failure, two
//! layouts that differ in `diff`) or a backend fails while running (no memory, a device error).
//!
//! It does not own any layout arithmetic, validation, view derivation, spec-string grammar,
//! plan or kernel: every offset, stride, region and run it prints or uses comes from `kvlayout`,
//! the connector or a backend.

#![forbid(unsafe_code)]

use std::io::{self, Write};
use std::path::Path;
use std::process::ExitCode;

use clap::Parser;
use kvlayout::{Convention, Coord, Field, KvCacheLayout, ViewTarget, PRESETS};

mod bench;
mod check;
mod cli;
mod common;
mod convert;
mod cpu;
mod decode;
mod decode_dump;
mod demo;
mod diff;
mod dump;
mod error;
mod fill;
mod plan;
mod svg;

pub(crate) use cli::SPEC_HELP;
use cli::{Cli, Command};
pub(crate) use error::CliError;

/// Exit status of every user error (the same as clap's usage errors).
const USER_ERROR: u8 = 2;

/// Exit status of a check that fails (a decode or demo that disagrees with the reference, a
/// conformance failure, layouts that differ in `diff`) or of a backend that failed while running.
const CHECK_FAILED: u8 = 1;

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
const JSON_VERSION: u64 = 2;

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
            slot,
            field,
            dim,
            json: as_json,
        } => {
            let layout = load(&spec)?;
            let coord = Coord {
                layer,
                block,
                head,
                slot,
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
