//! `kvlayout bench`: every op runs on a small layout and reports bytes, time and the three
//! bounds of the same run, with ratios that agree with the figures; the CPU and the kernel
//! build are named as `kvlayout cpu` names them; a backend that cannot open here, bad flags and
//! sizes past `--max-gib` are one `error:` line (exit 2).

use super::{kvlayout, ok, parse_json, stderr, user_error};

/// B=16 blocks of 16 tokens, 4 heads, D=8 f16: 32 KiB of K and V elements per layer.
const LAYOUT: &str = "kv L=1 B=16 N=16 H=4 D=8 dtype=f16 order=NHD";
/// Bytes of LAYOUT's elements: B x N x H x (D + Dv) x 2 bytes.
const ELEMENT_BYTES: u64 = 16 * 16 * 4 * (8 + 8) * 2;

/// A quick bench of `spec` (2 runs, 8 MiB bound buffers), JSON.
fn bench_json(spec: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["bench", spec, "--runs", "2", "--bound-mib", "8", "--json"];
    args.extend(extra);
    parse_json(&ok(&args))
}

fn f64_of(v: &serde_json::Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} is not a number: {v}"))
}

/// `a` and `b` equal to 1e-9 of their size.
fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs())
}

#[test]
fn every_op_runs_with_its_bounds_and_consistent_ratios() {
    let v = bench_json(LAYOUT, &[]);
    assert_eq!(v["version"], 2, "{v}");
    let ops: Vec<&str> = v["ops"]
        .as_array()
        .expect("ops")
        .iter()
        .map(|r| r["op"].as_str().expect("op name"))
        .collect();
    assert_eq!(
        ops,
        [
            "write_kv",
            "paged_decode",
            "copy_blocks",
            "swap_blocks",
            "gather_blocks",
            "scatter_blocks",
            "convert"
        ]
    );
    // Bytes of each op, from the geometry: write_kv fills every slot of the one layer,
    // paged_decode reads every block (8 sequences of 2 blocks), copy_blocks writes half the
    // blocks, the others move every element.
    let want_bytes = [
        ELEMENT_BYTES,
        ELEMENT_BYTES,
        ELEMENT_BYTES / 2,
        ELEMENT_BYTES,
        ELEMENT_BYTES,
        ELEMENT_BYTES,
        ELEMENT_BYTES,
    ];
    for (r, want) in v["ops"].as_array().expect("ops").iter().zip(want_bytes) {
        let op = r["op"].as_str().expect("op");
        assert!(r.get("skipped").is_none(), "{op}: {r}");
        assert_eq!(r["bytes"].as_u64(), Some(want), "{op}: {r}");
        assert_eq!(r["runs"], 2, "{op}");
        let ms = f64_of(r, "time_ms_median");
        assert!(ms > 0.0 && f64_of(r, "time_ms_best") > 0.0, "{op}: {r}");
        assert!(f64_of(r, "time_ms_best") <= ms, "{op}: {r}");
        let gb_s = f64_of(r, "gb_s");
        assert!(close(gb_s, want as f64 / (ms / 1e3) / 1e9), "{op}: {r}");
        for bound in ["memcpy", "read", "paged"] {
            let bound_gb_s = f64_of(r, &format!("{bound}_gb_s"));
            assert!(bound_gb_s > 0.0, "{op} {bound}: {r}");
            let ratio = f64_of(r, &format!("ratio_{bound}"));
            assert!(close(ratio, gb_s / bound_gb_s), "{op} {bound}: {r}");
        }
    }
    // The CPU and the kernel build, as `kvlayout cpu` names them.
    let cpu = parse_json(&ok(&["cpu", "--json"]));
    assert!(!cpu["model_name"].as_str().expect("model").is_empty());
    assert_eq!(v["cpu"]["model_name"], cpu["model_name"], "{v}");
    assert_eq!(v["kernels"], cpu["kernels"], "{v}");
    assert_eq!(v["backend"], "cpu");
    assert_eq!(v["cache_bytes"].as_u64(), Some(ELEMENT_BYTES), "{v}");
    assert!(v["cpu_features_used"].is_array(), "{v}");
    assert!(v["read_bound_bytes"].as_u64().expect("read bytes") >= 8 << 20);
    // The other order by default: NHD (LBNHC) becomes HND (LBHNC).
    assert!(v["to"].as_str().expect("to").contains("order=LBHNC"), "{v}");
}

#[test]
fn the_table_names_the_cpu_and_every_op() {
    let text = ok(&[
        "bench",
        LAYOUT,
        "--runs",
        "1",
        "--bound-mib",
        "8",
        "--to",
        "kv L=1 B=16 N=16 H=4 D=8 dtype=f16 order=BLHNC page=2112",
    ]);
    let cpu = parse_json(&ok(&["cpu", "--json"]));
    let model = cpu["model_name"].as_str().expect("model");
    assert!(text.contains(&format!("cpu      {model}")), "{text}");
    assert!(
        text.contains("order=BLHNC"),
        "--to is the destination: {text}"
    );
    for op in [
        "write_kv",
        "paged_decode",
        "copy_blocks",
        "swap_blocks",
        "gather_blocks",
        "scatter_blocks",
        "convert",
    ] {
        let row = text
            .lines()
            .find(|l| l.starts_with(&format!("{op} ")))
            .unwrap_or_else(|| panic!("no {op} row: {text}"));
        // op, bytes, ms, GB/s, then each bound's GB/s and the ratio to it.
        assert_eq!(row.split_whitespace().count(), 10, "{row}");
    }
}

#[test]
fn movers_only_content_skips_write_and_decode_with_why() {
    let v = bench_json("bytes L=1 B=8 N=16 row=64 order=NHD", &[]);
    for r in v["ops"].as_array().expect("ops") {
        let op = r["op"].as_str().expect("op");
        if op == "write_kv" || op == "paged_decode" {
            let why = r["skipped"].as_str().unwrap_or_else(|| panic!("{r}"));
            assert!(
                why.contains("paged_decode") || why.contains("write_kv"),
                "{why}"
            );
        } else {
            assert!(r.get("skipped").is_none(), "{op}: {r}");
            assert!(r["bytes"].as_u64().expect("bytes") > 0, "{op}: {r}");
        }
    }
}

#[test]
fn a_backend_that_cannot_open_is_one_line() {
    for name in ["cuda", "hip:0"] {
        if kvlayout_backends::open(name).is_ok() {
            println!("skipped: {name} opens here; its refusal is not tested");
            continue;
        }
        let e = user_error(&["bench", LAYOUT, "--backend", name]);
        assert!(e.starts_with(&format!("error: --backend {name}: ")), "{e}");
    }
    let e = user_error(&["bench", LAYOUT, "--backend", "gpu"]);
    assert!(e.contains("\"gpu\" is not a backend name"), "{e}");
}

#[test]
fn bad_flags_and_sizes_are_one_line() {
    for (args, needle) in [
        (vec!["--runs", "0"], "--runs 0"),
        (vec!["--seqs", "0"], "--seqs 0"),
        (vec!["--bound-mib", "0"], "--bound-mib 0"),
        (vec!["--max-gib", "0.001"], "--max-gib 0.001"),
        (vec!["--seqs", "17"], "--seqs 17 is more than"),
        (
            vec!["--to", "kv L=1 B=16 N=16 H=2 D=8 dtype=f16 order=NHD"],
            "",
        ),
    ] {
        let mut all = vec!["bench", LAYOUT];
        if !args.contains(&"--bound-mib") {
            all.extend(["--bound-mib", "8"]);
        }
        all.extend(&args);
        let e = user_error(&all);
        assert!(e.contains(needle), "{args:?}: {e}");
    }
    // Sizes past the limit are refused before anything is allocated.
    let e = user_error(&[
        "bench",
        "kv L=80 B=1000000 N=16 H=8 D=128 dtype=bf16 order=NHD",
    ]);
    assert!(e.contains("--max-gib"), "{e}");
    for args in [
        vec!["bench", "--runs", "x"],
        vec!["bench", "--nonsense"],
        vec!["bench", "nonsense-layout"],
    ] {
        let o = kvlayout(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
    }
}

/// Random flag values (seeded, `KVLAYOUT_FUZZ_SECONDS` scales the 3 s budget): each run
/// exits 0, or 2 with one `error:` line; never a panic.
#[test]
fn random_bad_input_is_refused_or_runs() {
    let budget = super::fuzzing::seconds();
    let start = std::time::Instant::now();
    let mut rng = super::fuzzing::Rng(0x5EED_u64);
    let mut next = |n: usize| rng.below(n);
    let values = [
        "0",
        "1",
        "-1",
        "x",
        "1e9",
        "18446744073709551616",
        "0.0001",
        "3",
    ];
    let flags = [
        "--runs",
        "--seqs",
        "--bound-mib",
        "--max-gib",
        "--threads",
        "--seed",
    ];
    let specs = [
        LAYOUT,
        "kv L=1 B=2 N=1 H=1 D=1 dtype=f16",
        "kv B=0",
        "mla L=1 B=4 N=16 rank=32 rope=8",
    ];
    let mut runs = 0;
    while runs == 0 || start.elapsed().as_secs_f64() < budget {
        let mut args = vec![
            "bench",
            specs[next(specs.len())],
            "--bound-mib",
            "4",
            "--runs",
            "1",
        ];
        for _ in 0..=next(3) {
            args.push(flags[next(flags.len())]);
            args.push(values[next(values.len())]);
        }
        let o = kvlayout(&args);
        let err = stderr(&o);
        match o.status.code() {
            Some(0) => {}
            // One `error:` line (clap's usage errors add a hint line after theirs).
            Some(2) => {
                assert!(!err.contains("panicked"), "{args:?}: {err}");
                assert!(err.starts_with("error: "), "{args:?}: {err}");
                assert_eq!(
                    err.lines().filter(|l| l.starts_with("error")).count(),
                    1,
                    "{args:?}: {err}"
                );
            }
            other => panic!("{args:?}: exit {other:?}: {err}"),
        }
        runs += 1;
    }
    println!("{runs} random bench invocations");
}
