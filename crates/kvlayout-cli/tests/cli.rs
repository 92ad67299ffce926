//! Runs the built `kvlayout` binary: outputs on good input, one `error:` line and exit 2 on bad.

use std::process::{Command, Output};

#[path = "cli/backend.rs"]
mod backend;
#[path = "cli/bench.rs"]
mod bench;
#[path = "cli/check.rs"]
mod check;
#[path = "cli/cpu.rs"]
mod cpu;
#[path = "cli/decode.rs"]
mod decode;
#[path = "cli/demo.rs"]
mod demo;
#[path = "cli/demo_bad.rs"]
mod demo_bad;
#[path = "cli/diff.rs"]
mod diff;
#[path = "cli/dump.rs"]
mod dump;
#[path = "cli/dump_bad.rs"]
mod dump_bad;
#[path = "cli/dump_convert.rs"]
mod dump_convert;
#[path = "cli/dump_file.rs"]
mod dump_file;
#[path = "cli/dump_fuzz.rs"]
mod dump_fuzz;
#[path = "cli/fuzzing.rs"]
mod fuzzing;
#[path = "cli/limits.rs"]
mod limits;
#[path = "cli/plan.rs"]
mod plan;
#[path = "cli/plan_bad.rs"]
mod plan_bad;
#[path = "cli/svg.rs"]
mod svg;
#[path = "cli/svg_command.rs"]
mod svg_command;
#[path = "cli/svg_read.rs"]
mod svg_read;

const SMALL: &str = "kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=NHD";

fn kvlayout(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvlayout"))
        .args(args)
        .output()
        .expect("the kvlayout binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `kvlayout` with `KVLAYOUT_CPU_HIDE` set to `hide`, or unset where `None` (whatever the test
/// process has).
fn kvlayout_hiding(hide: Option<&str>, args: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kvlayout"));
    match hide {
        Some(h) => c.env(kvlayout_cpu::CPU_HIDE_VAR, h),
        None => c.env_remove(kvlayout_cpu::CPU_HIDE_VAR),
    };
    c.args(args).output().expect("the kvlayout binary runs")
}

/// Succeeds with nothing on stderr; returns stdout.
fn ok(args: &[&str]) -> String {
    expect_ok(args, kvlayout(args))
}

/// What [`ok`] checks, of a run `o` of `args`.
fn expect_ok(args: &[&str], o: Output) -> String {
    assert!(
        o.status.success(),
        "{args:?} failed: {:?}\n{}",
        o.status,
        stderr(&o)
    );
    assert!(o.stderr.is_empty(), "{args:?}: stderr {}", stderr(&o));
    stdout(&o)
}

/// Fails with status 2, nothing on stdout, and exactly one `error: ...` line on stderr;
/// returns that line.
fn user_error(args: &[&str]) -> String {
    expect_user_error(args, kvlayout(args))
}

/// What [`user_error`] checks, of a run `o` of `args`.
fn expect_user_error(args: &[&str], o: Output) -> String {
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {:?} {err}", o.status);
    assert!(o.stdout.is_empty(), "{args:?}: stdout {}", stdout(&o));
    assert!(!err.contains("panicked"), "{args:?}: {err}");
    assert!(!err.contains("backtrace"), "{args:?}: {err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{args:?}: stderr {err:?}");
    assert!(lines[0].starts_with("error: "), "{args:?}: {err}");
    lines[0].to_string()
}

fn parse_json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

fn u64s(v: &serde_json::Value) -> Vec<u64> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|x| x.as_u64().unwrap_or_else(|| panic!("not a u64: {x}")))
        .collect()
}

/// A temp file name no other test run shares.
fn temp_path(tag: &str) -> std::path::PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    std::env::temp_dir().join(format!(
        "kvlayout-cli-{tag}-{}-{nanos}.json",
        std::process::id()
    ))
}

/// `kvlayout explain <layout>`, checked as [`ok`] checks it.
fn explain(layout: &str) -> String {
    ok(&["explain", layout])
}

/// `kvlayout explain` of a temp file holding `contents` (removed after): the file's path,
/// and the run.
fn explain_file(tag: &str, contents: &str) -> (String, Output) {
    let path = temp_path(tag);
    std::fs::write(&path, contents).expect("temp file written");
    let p = path.to_string_lossy().into_owned();
    let run = kvlayout(&["explain", &p]);
    let _ = std::fs::remove_file(&path);
    (p, run)
}

#[test]
fn explain_every_preset_mentions_its_registered_span() {
    for (name, _, _) in kvlayout::PRESETS {
        let out = explain(name);
        assert!(out.contains("registered span"), "{name}:\n{out}");
        let spans = kvlayout::preset(name)
            .expect("preset parses")
            .registered_spans();
        assert!(!spans.is_empty(), "{name}");
        for s in spans {
            assert!(
                out.contains(&format!("({} B)", s.len)),
                "{name}: span of {} B not shown:\n{out}",
                s.len
            );
        }
    }
}

#[test]
fn explain_llama_span_is_the_whole_cache() {
    // 32 layers x 1024 blocks x 16 tokens x 8 heads x (128 K + 128 V) bf16 elements.
    let bytes: u64 = 32 * 1024 * 16 * 8 * (128 + 128) * 2;
    let out = explain("llama-3-8b");
    assert!(out.contains(&format!("({bytes} B)")), "{out}");
    let j = parse_json(&ok(&["explain", "llama-3-8b", "--json"]));
    let spans = j["registered_spans"].as_array().expect("registered_spans");
    assert_eq!(spans.len(), 1);
    assert_eq!(spans[0]["len"].as_u64(), Some(bytes));
}

#[test]
fn explain_json_parses_for_every_preset() {
    for (name, _, _) in kvlayout::PRESETS {
        let j = parse_json(&ok(&["explain", name, "--json"]));
        assert!(j["spec"].is_string(), "{name}: {j}");
        assert!(j["views"].is_array(), "{name}");
        assert!(j["registered_spans"].is_array(), "{name}");
    }
}

#[test]
fn offset_matches_the_page_arithmetic() {
    // NHD page, f16: row = [K 8][V 8] = 32 B; token stride 4 heads * 32 B; block stride
    // 16 tokens * 128 B. V starts 8 elements (16 B) into the row.
    let (elem, d) = (2u64, 8u64);
    let row = 2 * d * elem;
    let token_stride = 4 * row;
    let block_stride = 16 * token_stride;
    let (block, head, token, dim) = (1u64, 2u64, 3u64, 5u64);
    let expected = block * block_stride + token * token_stride + head * row + d * elem + dim * elem;
    assert_eq!(expected, 2522);

    let args = [
        "offset", SMALL, "--block", "1", "--head", "2", "--slot", "3", "--field", "v", "--dim", "5",
    ];
    assert_eq!(ok(&args).trim(), expected.to_string());
    // `--token` is a hidden alias of `--slot`.
    let alias = args.map(|a| if a == "--slot" { "--token" } else { a });
    assert_eq!(ok(&alias).trim(), expected.to_string());

    let mut json_args = args.to_vec();
    json_args.push("--json");
    let j = parse_json(&ok(&json_args));
    assert_eq!(j["buffer"].as_u64(), Some(0));
    assert_eq!(j["offset"].as_u64(), Some(expected));
}

#[test]
fn offset_names_the_buffer_when_there_are_two() {
    // Separate K and V allocations [B, N, H, D]: V lives in buffer 1 from its byte 0.
    let spec = "kv B=3 N=16 H=4 D=8 dtype=f16 tensor=separate-nhd";
    let expected = (16 * 4 * 8 + 3 * 4 * 8 + 2 * 8 + 5) * 2;
    let out = ok(&[
        "offset", spec, "--block", "1", "--head", "2", "--slot", "3", "--field", "v", "--dim", "5",
    ]);
    assert_eq!(out.trim(), format!("buffer 1 offset {expected}"));
}

#[test]
fn offset_layer_defaults_to_zero() {
    let base = [
        "offset",
        "llama-3-8b",
        "--block",
        "0",
        "--head",
        "0",
        "--slot",
        "0",
        "--field",
        "k",
        "--dim",
        "0",
    ];
    assert_eq!(ok(&base).trim(), "0");
    let mut layer1 = base.to_vec();
    layer1.extend(["--layer", "1"]);
    // LBNHC: one layer is 1024 pages of 16 x 8 x 512 B.
    assert_eq!(ok(&layer1).trim(), (1024u64 * 16 * 8 * 512).to_string());
}

#[test]
fn view_standard_k_has_the_nhd_strides() {
    let j = parse_json(&ok(&[
        "view", SMALL, "--as", "standard", "--field", "k", "--json",
    ]));
    // [B, H, N, D] over an NHD page of 32-byte rows: block 2048 B, head 32 B, token 128 B.
    assert_eq!(u64s(&j["shape"]), [3, 4, 16, 8]);
    assert_eq!(u64s(&j["strides"]), [1024, 16, 64, 1]);
    assert_eq!(u64s(&j["strides_bytes"]), [2048, 32, 128, 2]);
    assert_eq!(j["offset"].as_u64(), Some(0));
    assert_eq!(j["offset_bytes"].as_u64(), Some(0));
    assert_eq!(j["buffer"].as_u64(), Some(0));
    assert_eq!(j["dtype"].as_str(), Some("f16"));

    let v = parse_json(&ok(&[
        "view", SMALL, "--as", "standard", "--field", "v", "--json",
    ]));
    assert_eq!(
        v["offset"].as_u64(),
        Some(8),
        "V starts after K's 8 elements"
    );
}

#[test]
fn view_text_is_one_line() {
    let out = ok(&["view", SMALL, "--as", "flashinfer", "--field", "kv"]);
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(out.contains("shape [3, 2, 16, 4, 8]"), "{out}");
}

#[test]
fn presets_lists_every_preset() {
    let out = ok(&["presets"]);
    let j = parse_json(&ok(&["presets", "--json"]));
    assert_eq!(j["version"], 2, "{j}");
    let list = j["presets"].as_array().expect("array");
    assert_eq!(list.len(), kvlayout::PRESETS.len());
    for (name, spec, description) in kvlayout::PRESETS {
        assert!(out.contains(name) && out.contains(spec) && out.contains(description));
        assert!(list
            .iter()
            .any(|p| p["name"] == *name && p["spec"] == *spec));
    }
}

#[test]
fn json_file_spec_round_trips() {
    let layout: kvlayout::KvCacheLayout = "llama-3-8b B=4096 dtype=fp8_e4m3 order=HND"
        .parse()
        .expect("spec parses");
    let (_, from_file) = explain_file("roundtrip", &layout.to_json());
    let from_spec = explain(&layout.to_string());
    assert!(from_file.status.success(), "{}", stderr(&from_file));
    assert_eq!(stdout(&from_file), from_spec);
}

/// A bad spec names the column, an unknown preset is one line that lists the presets, a
/// missing file names its path.
#[test]
fn bad_layout_arguments_name_what_is_wrong() {
    for (arg, says) in [
        (
            "kv L=1 B=x N=16 H=4 D=8 dtype=f16 order=NHD",
            &["column 8"][..],
        ),
        ("gpt-5", &["unknown preset 'gpt-5'", "llama-3-8b"]),
        ("/nonexistent/x.json", &["/nonexistent/x.json"]),
    ] {
        let line = user_error(&["explain", arg]);
        for s in says {
            assert!(line.contains(s), "{arg}: {line}");
        }
    }
}

#[test]
fn bad_json_file_names_the_path() {
    let (p, run) = explain_file("bad", "{\"version\": 1,\n \"geometry\": ");
    let line = expect_user_error(&["explain", &p], run);
    assert!(line.contains(&p) && line.contains("JSON"), "{line}");
}

#[test]
fn out_of_range_coordinate_is_refused() {
    let line = user_error(&[
        "offset", SMALL, "--block", "1", "--head", "4", "--slot", "3", "--field", "v", "--dim", "5",
    ]);
    assert!(line.contains("head index 4"), "{line}");
    user_error(&[
        "offset", SMALL, "--layer", "1", "--block", "0", "--head", "0", "--slot", "0", "--field",
        "k", "--dim", "0",
    ]);
    user_error(&[
        "view", SMALL, "--as", "standard", "--field", "k", "--layer", "1",
    ]);
}

#[test]
fn refused_view_and_bad_names_are_one_line() {
    let line = user_error(&["view", SMALL, "--as", "vllm-paged-v1", "--field", "kv"]);
    assert!(line.contains("without a copy"), "{line}");
    user_error(&["view", SMALL, "--as", "bogus", "--field", "k"]);
    user_error(&["view", SMALL, "--as", "standard", "--field", "bogus"]);
    user_error(&[
        "view",
        "deepseek-v3",
        "--as",
        "standard",
        "--field",
        "k_scale",
    ]);
    user_error(&[
        "offset", SMALL, "--block", "0", "--head", "0", "--slot", "0", "--field", "kv", "--dim",
        "0",
    ]);
}

#[test]
fn usage_errors_exit_2_without_panicking() {
    for args in [
        &["offset", SMALL, "--block", "0"][..],
        &[
            "offset", SMALL, "--block", "-1", "--head", "0", "--slot", "0", "--field", "k",
            "--dim", "0",
        ],
        &["explain"],
        &["nonsense"],
    ] {
        let o = kvlayout(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(!stderr(&o).contains("panicked"), "{args:?}");
    }
}

#[test]
fn padding_refusal_names_the_axis_outside_the_block() {
    let e = user_error(&[
        "explain",
        "kv L=2 B=3 N=16 H=4 D=8 dtype=f16 order=LHBNC page=4160",
    ]);
    assert!(
        e.ends_with("LHBNC has H (extent 4) outside B, only N inside B"),
        "{e}"
    );
}

#[test]
fn explain_one_head_outside_the_block_with_padded_pages() {
    // N=16, D=8 f16: dense page 16 * 32 = 512 B, padded to 544; span 2 * 3 * 544.
    let text = explain("kv L=2 B=3 N=16 H=1 D=8 dtype=f16 order=LHBNC page=544");
    assert!(
        text.contains("dense 512 B per (layer, block), padded to 544 B (32 B padding)"),
        "{text}"
    );
    assert!(text.contains("buffer 0: bytes 0..3264 (3264 B)"), "{text}");
    // Layer 1, block 2, token 3, V element 5: 1 * 3 * 544 + 2 * 544 + 3 * 32 + 16 + 5 * 2.
    let at = ok(&[
        "offset",
        "kv L=2 B=3 N=16 H=1 D=8 dtype=f16 order=LHBNC page=544",
        "--layer",
        "1",
        "--block",
        "2",
        "--head",
        "0",
        "--slot",
        "3",
        "--field",
        "v",
        "--dim",
        "5",
    ]);
    assert_eq!(
        at.trim(),
        (3 * 544 + 2 * 544 + 3 * 32 + 16 + 5 * 2).to_string()
    );
}

#[test]
fn explain_separate_buffers_picture_each_buffer() {
    let text = explain("kv L=1 B=2 N=2 H=2 D=4 dtype=f16 tensor=separate-nhd");
    let k = text
        .find("page of layer 0, block 0, buffer 0 (offsets from its first byte)")
        .unwrap_or_else(|| panic!("{text}"));
    let v = text
        .find("page of layer 0, block 0, buffer 1 (offsets from its first byte)")
        .unwrap_or_else(|| panic!("{text}"));
    assert!(k < v, "{text}");
    let runs = |part: &str, field: char| {
        let lines: Vec<&str> = part.lines().filter(|l| l.contains(" | ")).collect();
        assert_eq!(lines.len(), 4, "{part}");
        for (line, at) in lines.iter().zip(["+0 ", "+8 ", "+16 ", "+24 "]) {
            assert!(line.trim_start().starts_with(at), "{line}");
            assert!(line.contains(&format!("| {field} h")), "{line}");
        }
    };
    runs(&text[k..v], 'k');
    runs(&text[v..], 'v');
}
