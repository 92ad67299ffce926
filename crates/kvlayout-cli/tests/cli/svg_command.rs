//! `kvlayout explain SPEC --svg FILE` as a command: `--svg` with `--json`, unwritable paths
//! and bad specs (exit 2, one line, nothing written), and random specs (a picture that parses
//! and whose elements lie where `layout.offset` puts them, or a clean refusal).

use super::fuzzing::Rng;
use std::time::{Duration, Instant};

use super::svg_read::{read_page, MAX_SVG_BYTES};
use super::{expect_user_error, kvlayout, ok, parse_json, temp_path, user_error};

#[test]
fn svg_with_json_writes_both() {
    let path = temp_path("svg-json").with_extension("svg");
    let p = path.to_string_lossy().into_owned();
    let out = ok(&["explain", super::SMALL, "--json", "--svg", &p]);
    let v = parse_json(&out);
    assert_eq!(v["version"], 2);
    assert_eq!(v["dense_page_bytes"], 2048);
    let text = std::fs::read_to_string(&path).expect("the SVG is written");
    let _ = std::fs::remove_file(&path);
    assert!(roxmltree::Document::parse(&text).is_ok());
}

#[test]
fn svg_to_an_unwritable_path_is_one_error_line() {
    let dir = std::env::temp_dir();
    let missing = dir.join("kvlayout-no-such-dir").join("page.svg");
    let missing = missing.to_string_lossy().into_owned();
    let line = user_error(&["explain", super::SMALL, "--svg", &missing]);
    assert!(
        line.contains(&missing) && line.contains("cannot write"),
        "{line}"
    );
    let dir = dir.to_string_lossy().into_owned();
    let line = user_error(&["explain", super::SMALL, "--svg", &dir]);
    assert!(line.contains("cannot write"), "{line}");
    // A bad spec is refused before anything is written.
    let path = temp_path("svg-bad").with_extension("svg");
    let p = path.to_string_lossy().into_owned();
    user_error(&[
        "explain",
        "kv L=1 B=3 N=16 H=4 D=8 dtype=f17 order=NHD",
        "--svg",
        &p,
    ]);
    assert!(!path.exists());
    let line = user_error(&["explain", super::SMALL, "--svg", ""]);
    assert!(line.contains("--svg needs a file name"), "{line}");
}

/// A spec of a random content kind with mostly good values (one in ten keys bad or left out).
fn random_spec(rng: &mut Rng) -> String {
    let sizes = &["1", "2", "3", "4", "8", "16", "64", "256"][..];
    let (kind, keys): (&str, Vec<(&str, &[&str])>) = match rng.next() % 6 {
        0 => (
            "kv-scaled",
            vec![
                ("D", &["8", "16", "128"][..]),
                ("dtype", &["int8", "fp8_e4m3"][..]),
            ],
        ),
        1 => (
            "mla",
            vec![
                ("rank", &["8", "512"][..]),
                ("rope", &["4", "64"][..]),
                ("dtype", &["bf16", "f16"][..]),
            ],
        ),
        2 => ("bytes", vec![("row", &["16", "24", "656"][..])]),
        3 => (
            "mamba-ssm",
            vec![
                ("head_dim", &["4", "64"][..]),
                ("state", &["8", "128"][..]),
                ("dtype", &["f32"][..]),
            ],
        ),
        4 => (
            rng.pick(&["llama-3-8b", "deepseek-v3", "mamba2-2.7b-conv"]),
            vec![],
        ),
        _ => (
            "kv",
            vec![
                ("D", &["4", "8", "32", "128"][..]),
                ("dtype", &["f16", "bf16", "f32", "fp8_e4m3"][..]),
            ],
        ),
    };
    let mut spec = kind.to_string();
    let common: [(&str, &[&str]); 4] = [("L", sizes), ("B", sizes), ("N", sizes), ("H", sizes)];
    let placement = rng.pick(&[
        "order=NHD",
        "order=HND",
        "order=BLNHC",
        "order=HBNLC",
        "order=LHBNC",
        "tensor=vllm-paged-v1",
        "tensor=flash-attn-hnd",
        "tensor=separate-nhd",
        "order=HND page=4160",
        "order=NHD align=4096",
        "",
    ]);
    for (key, values) in common.into_iter().chain(keys) {
        let value = match rng.next() % 20 {
            0 => continue,
            1 => rng.pick(&["0", "x", "-1", "99999999999999999999", "1e3"]),
            _ => rng.pick(values),
        };
        if !(kind == "mla" || kind == "bytes") || key != "H" {
            spec.push_str(&format!(" {key}={value}"));
        }
    }
    if !kind.contains('-') || kind.starts_with("kv") || kind.starts_with("mamba-") {
        spec.push_str(&format!(" {placement}"));
    }
    spec
}

/// Random specs, good and bad, with `--svg`: every run succeeds with a picture that parses,
/// or exits 2 with one error line; never a panic. `KVLAYOUT_FUZZ_SECONDS` sets the budget.
#[test]
fn svg_random_specs_render_or_fail_cleanly() {
    let seconds: f64 = super::fuzzing::seconds();
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let path = temp_path("svg-fuzz").with_extension("svg");
    let p = path.to_string_lossy().into_owned();
    let mut rng = Rng(0x5eed_0029);
    let (mut runs, mut pictures) = (0, 0);
    while Instant::now() < deadline || runs < 8 {
        let spec = random_spec(&mut rng);
        let args = ["explain", spec.as_str(), "--svg", p.as_str()];
        if std::env::var_os("KVLAYOUT_FUZZ_VERBOSE").is_some() {
            eprintln!("{spec}");
        }
        let o = kvlayout(&args);
        if o.status.success() {
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{spec}: succeeded without a picture: {e}"));
            assert!(
                text.len() < 4 * MAX_SVG_BYTES,
                "{spec}: {} bytes",
                text.len()
            );
            let doc = roxmltree::Document::parse(&text).unwrap_or_else(|e| panic!("{spec}: {e}"));
            let _ = read_page(&doc, &spec.parse().unwrap());
            pictures += 1;
        } else {
            expect_user_error(&args, o);
        }
        let _ = std::fs::remove_file(&path);
        runs += 1;
    }
    eprintln!("{runs} random specs, {pictures} pictures");
    assert!(
        pictures > 0 && pictures < runs,
        "{pictures} pictures of {runs} runs"
    );
}
