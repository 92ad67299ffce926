//! Runs the built `kvlayout` binary: outputs on good input, one `error:` line and exit 2 on bad.

use std::process::{Command, Output};

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

/// Succeeds with nothing on stderr; returns stdout.
fn ok(args: &[&str]) -> String {
    let o = kvlayout(args);
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
    let o = kvlayout(args);
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

#[test]
fn explain_every_preset_mentions_its_registered_span() {
    for (name, _, _) in kvlayout::PRESETS {
        let out = ok(&["explain", name]);
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
    let out = ok(&["explain", "llama-3-8b"]);
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
        "offset", SMALL, "--block", "1", "--head", "2", "--token", "3", "--field", "v", "--dim",
        "5",
    ];
    assert_eq!(ok(&args).trim(), expected.to_string());

    let mut json_args = args.to_vec();
    json_args.push("--json");
    let j = parse_json(&ok(&json_args));
    assert_eq!(j["buffer"].as_u64(), Some(0));
    assert_eq!(j["offset"].as_u64(), Some(expected));
}

#[test]
fn offset_names_the_buffer_when_there_are_two() {
    // Separate K and V allocations [B, N, H, D]: V lives in buffer 1 from its byte 0.
    let spec = "kv B=3 N=16 H=4 D=8 dtype=f16 legacy=separate-nhd";
    let expected = (16 * 4 * 8 + 3 * 4 * 8 + 2 * 8 + 5) * 2;
    let out = ok(&[
        "offset", spec, "--block", "1", "--head", "2", "--token", "3", "--field", "v", "--dim", "5",
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
        "--token",
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
    let list = j.as_array().expect("array");
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
    let path = temp_path("roundtrip");
    std::fs::write(&path, layout.to_json()).expect("temp file written");
    let p = path.to_string_lossy().into_owned();
    let from_file = kvlayout(&["explain", &p]);
    let from_spec = ok(&["explain", &layout.to_string()]);
    let _ = std::fs::remove_file(&path);
    assert!(from_file.status.success(), "{}", stderr(&from_file));
    assert_eq!(stdout(&from_file), from_spec);
}

#[test]
fn bad_spec_names_the_column() {
    let line = user_error(&["explain", "kv L=1 B=x N=16 H=4 D=8 dtype=f16 order=NHD"]);
    assert!(line.contains("column 8"), "{line}");
}

#[test]
fn unknown_preset_is_one_line() {
    let line = user_error(&["explain", "gpt-5"]);
    assert!(line.contains("unknown preset 'gpt-5'"), "{line}");
    assert!(line.contains("llama-3-8b"), "{line}");
}

#[test]
fn missing_file_names_the_path() {
    let line = user_error(&["explain", "/nonexistent/x.json"]);
    assert!(line.contains("/nonexistent/x.json"), "{line}");
}

#[test]
fn bad_json_file_names_the_path() {
    let path = temp_path("bad");
    std::fs::write(&path, "{\"version\": 1,\n \"geometry\": ").expect("temp file written");
    let p = path.to_string_lossy().into_owned();
    let line = user_error(&["explain", &p]);
    let _ = std::fs::remove_file(&path);
    assert!(line.contains(&p) && line.contains("JSON"), "{line}");
}

#[test]
fn out_of_range_coordinate_is_refused() {
    let line = user_error(&[
        "offset", SMALL, "--block", "1", "--head", "4", "--token", "3", "--field", "v", "--dim",
        "5",
    ]);
    assert!(line.contains("head index 4"), "{line}");
    user_error(&[
        "offset", SMALL, "--layer", "1", "--block", "0", "--head", "0", "--token", "0", "--field",
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
        "offset", SMALL, "--block", "0", "--head", "0", "--token", "0", "--field", "kv", "--dim",
        "0",
    ]);
}

#[test]
fn usage_errors_exit_2_without_panicking() {
    for args in [
        &["offset", SMALL, "--block", "0"][..],
        &[
            "offset", SMALL, "--block", "-1", "--head", "0", "--token", "0", "--field", "k",
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

/// `kvlayout decode` with a small read bound (8 MiB per thread) and two timed runs, on the
/// default thread count and kernel build unless `extra` names them.
fn decode_json(spec: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["decode", spec, "--runs", "2", "--bound-mib", "8", "--json"];
    args.extend_from_slice(extra);
    parse_json(&ok(&args))
}

fn num(v: &serde_json::Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} is not a number: {v}"))
}

/// The threads a backend gets by default: `RAYON_NUM_THREADS` when set to a positive number,
/// else one per core the process may use (what rayon's default pool takes).
fn default_threads() -> u64 {
    std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u64))
}

/// The decode report's check: within its bound, under the tolerance of the kernel build that
/// ran on the cache's dtype (bf16 products where `avx512-bf16` runs bf16 or fp8 rows, f32
/// products otherwise), never a figure one build alone meets.
fn assert_checked(v: &serde_json::Value, dtype: &str) {
    use kvlayout_cpu::Tolerance;
    let kernels = v["kernels"].as_str().expect("kernels");
    let bf16 = kernels == "avx512-bf16" && ["bf16", "fp8_e4m3", "fp8_e5m2"].contains(&dtype);
    let (products, t) = if bf16 {
        ("bf16", Tolerance::BF16_PRODUCTS)
    } else {
        ("f32", Tolerance::F32_PRODUCTS)
    };
    let tol = &v["tolerance"];
    assert_eq!(tol["products"], products, "{v}");
    assert_eq!(tol["relative"].as_f64(), Some(t.relative), "{v}");
    assert_eq!(tol["per_logit"].as_f64(), Some(t.per_logit), "{v}");
    assert!(num(v, "error_to_bound") <= 1.0, "{v}");
    // The bound's own size: at most its relative part plus its logit part for logits of up
    // to a few units (these steps' queries and keys lie in [-1, 1]).
    assert!(num(v, "max_error") <= t.relative + 8.0 * t.per_logit, "{v}");
    assert!(!v["kernels_why"].as_str().unwrap_or("").is_empty(), "{v}");
}

#[test]
fn decode_step_checks_against_the_reference() {
    // 3 sequences of 100 tokens in blocks of 16: 7 blocks each; layer 1 of 2.
    let v = decode_json(
        "kv L=2 B=40 N=16 H=4 D=32 dtype=bf16 order=HND",
        &[
            "--seqs",
            "3",
            "--context",
            "100",
            "--layer",
            "1",
            "--check-seqs",
            "3",
        ],
    );
    assert_eq!(v["layer"], 1);
    assert_eq!(v["q_heads"], 16, "4 query heads per KV head by default");
    assert_eq!(v["kv_heads"], 4);
    assert_eq!(v["blocks_used"], 21);
    assert_eq!(v["checked_seqs"], 3);
    assert_eq!(v["runs"], 2);
    assert_eq!(v["threads"], default_threads(), "{v}");
    // 2 layers x 40 blocks x 4 heads x 16 tokens x (32 + 32) x 2 bytes.
    assert_eq!(v["cache_bytes"], 2 * 40 * 4 * 16 * 64 * 2);
    // 300 tokens x 4 heads x (32 + 32) elements x 2 bytes.
    assert_eq!(v["kv_bytes"], 300 * 4 * 64 * 2);
    assert_checked(&v, "bf16");
    for key in [
        "step_ms_median",
        "kv_gb_s_median",
        "read_gb_s_median",
        "ratio_median",
        "paged_bound",
        "ratio_to_paged_bound",
    ] {
        assert!(num(&v, key) > 0.0, "{key}: {v}");
    }
}

#[test]
fn decode_step_on_a_stated_thread_count() {
    let v = decode_json(
        "kv L=1 B=8 N=16 H=2 D=16 dtype=f32 order=NHD",
        &["--seqs", "2", "--context", "40", "--threads", "3"],
    );
    assert_eq!(v["threads"], 3);
    assert_checked(&v, "f32");
}

#[test]
fn decode_step_of_mla_and_inline_scales() {
    // MLA: one 80-wide latent (K and V share it), 16 query heads by default.
    let v = decode_json(
        "mla L=1 B=8 N=64 rank=64 rope=16 dtype=f32 order=NHD",
        &["--seqs", "2", "--context", "200"],
    );
    assert_eq!(v["q_heads"], 16);
    assert_eq!(v["kv_bytes"], 400 * 80 * 4);
    assert_checked(&v, "f32");
    // int8 with an f32 scale after each row: 32 + 4 + 32 + 4 bytes per token and head.
    let v = decode_json(
        "kv-scaled L=1 B=16 N=16 H=2 D=32 dtype=int8 order=NHD",
        &["--seqs", "2", "--context", "50", "--q-heads", "6"],
    );
    assert_eq!(v["q_heads"], 6);
    assert_eq!(v["kv_bytes"], 100 * 2 * 72);
    assert_checked(&v, "int8");
}

#[test]
fn decode_step_as_text() {
    let out = ok(&[
        "decode",
        "kv L=1 B=8 N=16 H=2 D=16 dtype=fp8_e4m3 order=NHD",
        "--seqs",
        "2",
        "--context",
        "40",
        "--runs",
        "1",
        "--bound-mib",
        "8",
    ]);
    assert!(out.contains("query heads 8, KV heads 2"), "{out}");
    assert!(out.contains("of its bound ("), "{out}");
    assert!(out.contains(" products: "), "{out}");
    assert!(out.contains("): ok\n"), "{out}");
    assert!(out.contains("x the read bandwidth of this run"), "{out}");
    assert!(out.contains("x the paged bound"), "{out}");
    assert!(out.contains("\nkernels  "), "{out}");
}

/// Every kernel build this machine runs, named with `--kernels` and with `KVLAYOUT_KERNELS`,
/// on bf16 and fp8 rows (where the builds differ), each within its own tolerance; a build it
/// cannot run is refused with what it lacks.
#[test]
fn decode_step_on_every_kernel_build() {
    let spec = |dtype| format!("kv L=1 B=8 N=16 H=2 D=40 dtype={dtype} order=HND");
    for build in kvlayout_cpu::CpuBackend::kernel_builds() {
        for dtype in ["bf16", "fp8_e4m3"] {
            let v = decode_json(
                &spec(dtype),
                &["--seqs", "2", "--context", "50", "--kernels", build],
            );
            assert_eq!(v["kernels"], build);
            assert_eq!(v["kernels_why"], "chosen by the caller");
            assert_checked(&v, dtype);
        }
        let o = Command::new(env!("CARGO_BIN_EXE_kvlayout"))
            .args(["decode", &spec("bf16"), "--seqs", "2", "--context", "50"])
            .args(["--runs", "1", "--bound-mib", "8", "--json"])
            .env("KVLAYOUT_KERNELS", build)
            .output()
            .expect("the kvlayout binary runs");
        assert!(o.status.success(), "{build}: {}", stderr(&o));
        let v = parse_json(&stdout(&o));
        assert_eq!(v["kernels"], build);
        assert_eq!(v["kernels_why"], format!("KVLAYOUT_KERNELS={build}"));
        assert_checked(&v, "bf16");
    }
    for (build, why) in kvlayout_cpu::CpuBackend::kernels_not_run() {
        let e = user_error(&["decode", &spec("bf16"), "--kernels", build]);
        assert!(e.contains(&why), "{e}");
    }
    let e = user_error(&["decode", "llama-3-8b", "--kernels", "sse9"]);
    assert!(e.contains("no kernel build \"sse9\""), "{e}");
}

#[test]
fn decode_refusals_are_one_line() {
    let small = "kv L=1 B=8 N=16 H=2 D=16 dtype=f16 order=NHD";
    let e = user_error(&["decode", "mamba2-2.7b"]);
    assert!(e.contains("holds no keys and values"), "{e}");
    let e = user_error(&["decode", small, "--seqs", "3", "--context", "48"]);
    assert!(e.contains("need 9 blocks") && e.contains("B=8"), "{e}");
    let e = user_error(&[
        "decode",
        small,
        "--context",
        "16",
        "--seqs",
        "1",
        "--layer",
        "1",
    ]);
    assert!(e.contains("layer") && e.contains('1'), "{e}");
    let e = user_error(&["decode", small, "--runs", "0"]);
    assert!(e.contains("--runs 0"), "{e}");
    let e = user_error(&["decode", small, "--check-seqs", "0"]);
    assert!(e.contains("--check-seqs 0"), "{e}");
    let e = user_error(&[
        "decode",
        small,
        "--q-heads",
        "3",
        "--seqs",
        "1",
        "--context",
        "16",
    ]);
    assert!(e.contains("multiple of 2"), "{e}");
    let e = user_error(&[
        "decode",
        small,
        "--seqs",
        "1",
        "--context",
        "16",
        "--max-cache-gib",
        "NaN",
    ]);
    assert!(e.contains("--max-cache-gib NaN"), "{e}");
    let e = user_error(&["decode", "llama-3-8b B=100000"]);
    assert!(e.contains("--max-cache-gib 8"), "{e}");
    // Sized before anything is allocated: counts that overflow 64 bits, and sizes no machine
    // of any kind holds (petabytes), are one line each, not an abort.
    for (flag, value, says) in [
        ("--q-heads", "18446744073709551615", "overflows 64 bits"),
        ("--bound-mib", "17592186044416", "overflows 64 bits"),
        ("--q-heads", "1099511627776", "GiB"),
        ("--bound-mib", "1000000000", "GiB"),
    ] {
        let e = user_error(&[
            "decode",
            small,
            "--seqs",
            "1",
            "--context",
            "16",
            flag,
            value,
        ]);
        assert!(e.contains(says), "{flag} {value}: {e}");
    }
    let e = user_error(&[
        "decode",
        "mla L=1 B=8 N=64 tps=4 rank=64 rope=16 dtype=bf16 order=NHD",
        "--seqs",
        "1",
        "--context",
        "16",
    ]);
    assert!(e.contains("tokens_per_state"), "{e}");
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
    let text = ok(&[
        "explain",
        "kv L=2 B=3 N=16 H=1 D=8 dtype=f16 order=LHBNC page=544",
    ]);
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
        "--token",
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
    let text = ok(&[
        "explain",
        "kv L=1 B=2 N=2 H=2 D=4 dtype=f16 legacy=separate-nhd",
    ]);
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
