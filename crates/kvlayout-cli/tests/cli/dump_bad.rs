//! Bad dumps: lying metadata, truncated files and huge declared sizes, each refused by
//! `convert` and `decode --from` with one line naming the first disagreement and without a
//! large allocation. Damaged dumps at random are in `dump_fuzz`.

use std::process::{Command, Output};

use kvlayout::KvCacheLayout;
use serde_json::{json, Value};

use super::dump_file::{fill, remove_tensor, rewrite, Temp, HND, NHD, SEPARATE};
use super::{expect_user_error, ok, user_error};

/// Both readers (`convert` and `decode --from`) refuse `file` with one line containing
/// `reason`, writing nothing.
fn refused(file: &Temp, reason: &str) {
    let out = Temp::new("never");
    for args in [
        vec!["convert", file.s(), "--to", HND, "--out", out.s()],
        vec![
            "decode",
            "--from",
            file.s(),
            "--seqs",
            "1",
            "--context",
            "16",
            "--out",
            out.s(),
        ],
    ] {
        let e = user_error(&args);
        assert!(e.contains(file.s()) && e.contains(reason), "{reason}: {e}");
        assert!(!out.0.exists());
    }
}

#[test]
fn lying_metadata_is_refused_with_the_first_disagreement() {
    let good = fill(NHD, "coords", "lie");
    let sep = fill(SEPARATE, "coords", "lie-sep");
    let meta =
        |k: &'static str, v: Value| move |h: &mut Value, _: &mut Vec<u8>| h["__metadata__"][k] = v;
    let other_layout = "kv L=2 B=4 N=16 H=4 D=8 dtype=f16 order=NHD"
        .parse::<KvCacheLayout>()
        .unwrap()
        .to_json();
    let cases: Vec<(Temp, &str)> = vec![
        (
            rewrite(&good.0, "fmt", meta("format", json!("numpy"))),
            "format \"numpy\"",
        ),
        (
            rewrite(&good.0, "ver", meta("format_version", json!("2"))),
            "format_version \"2\"",
        ),
        (
            rewrite(&good.0, "writer", |h, _| {
                h["__metadata__"].as_object_mut().unwrap().remove("writer");
            }),
            "no \"writer\"",
        ),
        (
            rewrite(&good.0, "nometa", |h, _| {
                h.as_object_mut().unwrap().remove("__metadata__");
            }),
            "no __metadata__",
        ),
        (
            rewrite(&good.0, "badjson", meta("layout", json!("{not json"))),
            "metadata layout",
        ),
        (
            rewrite(
                &good.0,
                "badlayout",
                meta("layout", json!(r#"{"version": 1}"#)),
            ),
            "metadata layout",
        ),
        (
            rewrite(&good.0, "other", meta("layout", json!(other_layout))),
            "tensor buffer0 has shape [12288], expected [16384]",
        ),
        (
            rewrite(&good.0, "dtype", |h, _| {
                h["buffer0"]["dtype"] = json!("F16");
                h["buffer0"]["shape"] = json!([6144]);
            }),
            "tensor buffer0 is F16, expected U8",
        ),
        (
            rewrite(&good.0, "shape2", |h, _| {
                h["buffer0"]["shape"] = json!([2, 6144])
            }),
            "tensor buffer0 has shape [2, 6144]",
        ),
        (
            rewrite(&sep.0, "missing", |h, d| remove_tensor(h, d, "buffer1")),
            "no tensor buffer1",
        ),
        (
            rewrite(&good.0, "extra", |h, d| {
                let end = d.len();
                d.extend([1, 2, 3, 4]);
                h["junk"] = json!({"dtype": "U8", "shape": [4], "data_offsets": [end, end + 4]});
            }),
            "unexpected tensor junk",
        ),
        (
            rewrite(&good.0, "stepkey", meta("decode", json!(r#"{"layer": 0}"#))),
            "metadata decode",
        ),
    ];
    for (file, reason) in &cases {
        refused(file, reason);
    }
}

#[test]
fn lying_step_metadata_is_refused() {
    let spec = "kv L=1 B=4 N=16 H=2 D=8 dtype=f16 order=NHD";
    let d = Temp::new("step");
    ok(&[
        "decode",
        spec,
        "--seqs",
        "1",
        "--context",
        "20",
        "--runs",
        "1",
        "--bound-mib",
        "1",
        "--out",
        d.s(),
    ]);
    let step = |f: fn(&mut Value)| {
        move |h: &mut Value, _: &mut Vec<u8>| {
            let mut m: Value =
                serde_json::from_str(h["__metadata__"]["decode"].as_str().unwrap()).unwrap();
            f(&mut m);
            h["__metadata__"]["decode"] = json!(m.to_string());
        }
    };
    let cases = [
        (
            rewrite(&d.0, "qk", step(|m| m["qk_width"] = json!(16))),
            "qk_width 16; the layout's rows give 8",
        ),
        (
            rewrite(&d.0, "unknown", step(|m| m["heads"] = json!(1))),
            "unknown field `heads`",
        ),
        (
            rewrite(&d.0, "seqs", step(|m| m["seqs"] = json!(2))),
            "tensor block_table has shape [1, 2], expected [2, 2]",
        ),
        (
            rewrite(&d.0, "noquery", |h, d| remove_tensor(h, d, "query")),
            "no tensor query",
        ),
        // q_heads 4 where the query holds 8: the table and lengths agree, the query not.
        (
            rewrite(&d.0, "qheads", step(|m| m["q_heads"] = json!(4))),
            "tensor query has shape [1, 8, 8], expected [1, 4, 8]",
        ),
        (
            rewrite(&d.0, "lens", |h, _| h["seq_lens"]["dtype"] = json!("F32")),
            "tensor seq_lens is F32, expected I32",
        ),
    ];
    for (file, reason) in &cases {
        refused(file, reason);
    }
    // Without its output, a step is still an input.
    let no_out = rewrite(&d.0, "noout", |h, d| remove_tensor(h, d, "output"));
    ok(&[
        "decode",
        "--from",
        no_out.s(),
        "--runs",
        "1",
        "--bound-mib",
        "1",
    ]);
}

#[test]
fn truncated_files_are_refused() {
    let good = fill(SEPARATE, "coords", "trunc");
    let bytes = std::fs::read(&good.0).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    for cut in [
        0,
        1,
        7,
        8,
        9,
        8 + n / 2,
        8 + n - 1,
        8 + n,
        8 + n + 1,
        bytes.len() / 2 + n / 2,
        bytes.len() - 1,
    ] {
        let t = Temp::new("cut");
        std::fs::write(&t.0, &bytes[..cut]).unwrap();
        refused(&t, "truncated");
    }
    // One byte too many.
    let t = Temp::new("long");
    let mut long = bytes.clone();
    long.push(0);
    std::fs::write(&t.0, long).unwrap();
    refused(&t, "1 bytes after the last tensor");
}

/// `kvlayout` under a 1 GiB address-space limit: a reader that allocated what a file
/// declares would abort instead of refusing.
fn kvlayout_small_memory(args: &[&str]) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg("ulimit -v 1048576 && exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_kvlayout"))
        .args(args)
        .output()
        .expect("sh runs")
}

#[test]
fn huge_declared_sizes_are_refused_before_allocating() {
    let good = fill(NHD, "coords", "huge");
    let bytes = std::fs::read(&good.0).unwrap();
    let mut cases: Vec<(Temp, String)> = Vec::new();
    for declared in [u64::MAX, 1 << 40, (16 << 20) + 1] {
        let t = Temp::new("hdr");
        let mut b = bytes.clone();
        b[..8].copy_from_slice(&declared.to_le_bytes());
        std::fs::write(&t.0, b).unwrap();
        cases.push((
            t,
            format!("declares a header of {declared} bytes, more than the 16777216"),
        ));
    }
    let huge = 1u64 << 50;
    cases.push((
        rewrite(&good.0, "tensor", |h, _| {
            h["buffer0"]["shape"] = json!([huge]);
            h["buffer0"]["data_offsets"] = json!([0, huge]);
        }),
        format!("truncated: the header's tensors take {huge} bytes"),
    ));
    cases.push((
        rewrite(&good.0, "overflow", |h, _| {
            h["buffer0"]["shape"] = json!([1u64 << 40, 1u64 << 40])
        }),
        "header is no safetensors header".into(),
    ));
    cases.push((
        rewrite(&good.0, "hugelayout", |h, _| {
            let l = "kv L=2 B=1000000000 N=16 H=4 D=8 dtype=f16 order=NHD"
                .parse::<KvCacheLayout>()
                .unwrap();
            h["__metadata__"]["layout"] = json!(l.to_json());
        }),
        "tensor buffer0 has shape [12288], expected [4096000000000]".into(),
    ));
    let out = Temp::new("never");
    for (file, reason) in &cases {
        for args in [
            vec!["convert", file.s(), "--to", HND, "--out", out.s()],
            vec![
                "decode",
                "--from",
                file.s(),
                "--seqs",
                "1",
                "--context",
                "16",
            ],
        ] {
            let e = expect_user_error(&args, kvlayout_small_memory(&args));
            assert!(e.contains(reason.as_str()), "{reason}: {e}");
        }
    }
}
