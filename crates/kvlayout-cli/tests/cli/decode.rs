//! `kvlayout decode`: the step's report, checked against the reference under the tolerance
//! of the kernel build that ran, on every build; its refusals, one line each.

use std::process::Command;

use super::{ok, parse_json, stderr, stdout, user_error};

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
    let e = user_error(&["decode", small, "--runs", "0"]);
    assert!(e.contains("--runs 0"), "{e}");
    let e = user_error(&["decode", small, "--check-seqs", "0"]);
    assert!(e.contains("--check-seqs 0"), "{e}");
    let e = user_error(&["decode", "llama-3-8b B=100000"]);
    assert!(e.contains("--max-cache-gib 8"), "{e}");
    // One sequence of 16 tokens and one argument wrong. Sized before anything is allocated:
    // counts that overflow 64 bits, and sizes no machine of any kind holds (petabytes), are
    // one line each, not an abort.
    let step = ["--seqs", "1", "--context", "16"];
    for (flag, value, says) in [
        ("--layer", "1", "layer index 1"),
        ("--q-heads", "3", "multiple of 2"),
        ("--max-cache-gib", "NaN", "--max-cache-gib NaN"),
        ("--q-heads", "18446744073709551615", "overflows 64 bits"),
        ("--bound-mib", "17592186044416", "overflows 64 bits"),
        ("--q-heads", "1099511627776", "GiB"),
        ("--bound-mib", "1000000000", "GiB"),
    ] {
        let e = user_error(&[&["decode", small][..], &step, &[flag, value]].concat());
        assert!(e.contains(says), "{flag} {value}: {e}");
    }
    let mla = "mla L=1 B=8 N=64 tps=4 rank=64 rope=16 dtype=bf16 order=NHD";
    let e = user_error(&[&["decode", mla][..], &step].concat());
    assert!(e.contains("tokens_per_state"), "{e}");
}
