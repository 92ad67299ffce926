//! `kvlayout decode --backend`: the step runs on the backend named, each within the tolerance
//! of the kernels that ran, on the same cache bytes (the same seed gives the same output on
//! every backend, within tolerance); a backend that cannot open here, an unknown name, or
//! `--kernels` with another backend is one `error:` line.

use super::{ok, parse_json, user_error};

/// A small step the emulators run in a second or two.
const SMALL: [&str; 8] = [
    "--seqs",
    "2",
    "--context",
    "64",
    "--runs",
    "1",
    "--bound-mib",
    "16",
];

fn decode_on(backend: &str) -> serde_json::Value {
    let mut args = vec!["decode", "llama-3-8b B=64", "--backend", backend, "--json"];
    args.extend(SMALL);
    parse_json(&ok(&args))
}

#[test]
fn the_step_runs_on_the_reference_and_the_emulated_kernels() {
    for (backend, build) in [
        ("reference", "reference"),
        ("cuda-emu", "cuda"),
        ("hip-emu", "cdna"),
    ] {
        let v = decode_on(backend);
        assert_eq!(v["backend"], backend, "{v}");
        assert_eq!(v["kernels"], build, "{v}");
        assert_eq!(v["tolerance"]["products"], "f32", "{v}");
        let ratio = v["error_to_bound"].as_f64().expect("error_to_bound");
        assert!(ratio <= 1.0, "{backend}: {ratio} of the bound: {v}");
        assert_eq!(v["checked_seqs"], 1, "{v}");
        assert_eq!(v["blocks_used"], 8, "2 sequences x 64 tokens of 16: {v}");
    }
    // The reference against itself is exact: its check reads the same elements in the same
    // order, so any nonzero error would be a gather or a table that went wrong.
    assert_eq!(decode_on("reference")["max_error"], 0.0);
}

#[test]
fn a_backend_that_cannot_run_is_one_line() {
    for name in ["cuda:0", "hip:0"] {
        if kvlayout_backends::open(name).is_ok() {
            println!("skipped: {name} opens here; its refusal is not tested");
            continue;
        }
        let e = user_error(&["decode", "llama-3-8b", "--backend", name]);
        assert!(e.starts_with(&format!("error: --backend {name}: ")), "{e}");
    }
    let e = user_error(&["decode", "llama-3-8b", "--backend", "gpu"]);
    assert!(e.contains("\"gpu\" is not a backend name"), "{e}");
    let e = user_error(&[
        "decode",
        "llama-3-8b",
        "--backend",
        "reference",
        "--kernels",
        "avx2",
    ]);
    assert!(e.contains("--kernels avx2"), "{e}");
}
