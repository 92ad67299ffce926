//! `kvlayout demo`: the default scenario and its JSON record, a staged and a direct plan,
//! TP and block changes, other presets. Refused scenarios, bad flags and the random loop are
//! in `demo_bad.rs`.
//!
//! The expected sizes are computed here from the scenario's numbers (tokens, heads, head
//! size, dtype), independently of the layouts: llama-3-8b holds 8 KV heads of 128 bf16
//! elements for K and V, 512 bytes a token and head.

use serde_json::Value;

use super::{expect_ok, kvlayout, parse_json, user_error};

/// Bytes of K and V per token and head of llama-3-8b (2 x 128 x bf16).
const ROW: u64 = 2 * 128 * 2;

/// Every step of a run, in order.
const STEPS: [&str; 8] = [
    "write_kv",
    "handshake",
    "check",
    "plan",
    "transfer",
    "receive",
    "decode",
    "verify",
];

/// The steps that move data: they alone have a bandwidth and a ratio to memcpy.
const MOVING: [&str; 4] = ["write_kv", "transfer", "receive", "decode"];

/// `kvlayout demo --json ARGS`, which must succeed; its record.
pub(super) fn demo_json(args: &[&str]) -> Value {
    let mut all = vec!["demo", "--json"];
    all.extend_from_slice(args);
    let out = expect_ok(&all, kvlayout(&all));
    parse_json(&out)
}

/// The step named `name` of a record.
pub(super) fn step<'a>(record: &'a Value, name: &str) -> &'a Value {
    record["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .find(|s| s["step"] == name)
        .unwrap_or_else(|| panic!("no step {name}: {record}"))
}

pub(super) fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a u64: {v}"))
}

/// Every step is there, in order, with positive bytes, time and bandwidths; the
/// verification passed with nothing differing.
pub(super) fn assert_verified(record: &Value) {
    assert_eq!(record["version"], 2);
    let names: Vec<&str> = record["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|s| s["step"].as_str().expect("step name"))
        .collect();
    assert_eq!(names, STEPS);
    for s in record["steps"].as_array().unwrap() {
        assert!(u(&s["bytes"]) > 0, "{s}");
        let ms = s["ms"].as_f64().unwrap_or_else(|| panic!("ms: {s}"));
        assert!(ms > 0.0 && ms.is_finite(), "{s}");
        // Only the steps that move data have a bandwidth and a memcpy ratio.
        let moves = MOVING.contains(&s["step"].as_str().unwrap());
        for key in ["gb_s", "memcpy_gb_s", "of_memcpy"] {
            if moves {
                let x = s[key].as_f64().unwrap_or_else(|| panic!("{key}: {s}"));
                assert!(x > 0.0 && x.is_finite(), "{key}: {s}");
            } else {
                assert!(s[key].is_null(), "{key}: {s}");
            }
        }
    }
    assert!(u(&record["memcpy_threads"]) >= 1, "{record}");
    let v = &record["verification"];
    assert_eq!(v["passed"], true, "{v}");
    assert_eq!(u(&v["elements_differing"]), 0, "{v}");
    assert_eq!(u(&v["reference_differing"]), 0, "{v}");
    assert!(v["backend_error_to_bound"].as_f64().unwrap() <= 1.0, "{v}");
}

/// The sizes of a llama-3-8b run of `prompts` over `layers` layers, prefill blocks of 16
/// (the plan pairs 16-token sub-blocks, so each prompt moves whole ones).
fn assert_llama_sizes(record: &Value, prompts: &[u64], layers: u64, decode_tp: u64) {
    let tokens: u64 = prompts.iter().sum();
    let moved: u64 = prompts.iter().map(|t| t.div_ceil(16) * 16).sum();
    let heads = 8;
    assert_eq!(
        u(&step(record, "write_kv")["bytes"]),
        tokens * heads * ROW * layers
    );
    // Each decode rank pulls and reads its heads (one replicated head each once TP exceeds
    // the 8 heads).
    let read_heads = heads.max(decode_tp);
    for name in ["plan", "transfer"] {
        assert_eq!(
            u(&step(record, name)["bytes"]),
            moved * read_heads * ROW * layers,
            "{name}"
        );
    }
    assert_eq!(
        u(&step(record, "decode")["bytes"]),
        tokens * read_heads * ROW * layers
    );
    let v = &record["verification"];
    // K and V, 128 elements each, of every token, head held and layer.
    assert_eq!(u(&v["elements"]), tokens * read_heads * 256 * layers);
    // 32 query heads of 128 outputs per prompt and layer.
    assert_eq!(
        u(&v["reference_outputs"]),
        prompts.len() as u64 * 32 * 128 * layers
    );
}

#[test]
fn default_demo_is_staged_nhd16_tp1_to_padded_hnd32_tp2_and_verifies() {
    let r = demo_json(&[]);
    assert_verified(&r);
    let sc = &r["scenario"];
    assert_eq!(sc["preset"], "llama-3-8b");
    assert_eq!(sc["plan"], "staged");
    assert_eq!((u(&sc["prefill"]["tp"]), u(&sc["decode"]["tp"])), (1, 2));
    assert_eq!(u(&sc["prefill"]["block_size"]), 16);
    assert_eq!(u(&sc["decode"]["block_size"]), 32);
    let decode_spec = sc["decode"]["spec"].as_str().unwrap();
    assert!(
        decode_spec.contains("H=4") && decode_spec.contains("page=69632"),
        "{decode_spec}"
    );
    assert_eq!(r["engine"], "memcpy");
    assert_eq!(r["backend"], "cpu");
    assert_llama_sizes(&r, &[509, 77, 130], 2, 2);
    let per_rank = step(&r, "plan")["detail"]["descriptors_per_rank"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(per_rank, 2);
}

#[test]
fn text_output_is_one_line_per_step() {
    let args = ["demo", "--prompts", "40,23", "--blocks", "8"];
    let out = expect_ok(&args, kvlayout(&args));
    for name in STEPS {
        let lines: Vec<&str> = out
            .lines()
            .filter(|l| l.split_whitespace().next() == Some(name))
            .collect();
        assert_eq!(lines.len(), 1, "{name}:\n{out}");
        let rated = lines[0].contains(" GB/s, ") && !lines[0].contains("- x memcpy");
        assert_eq!(rated, MOVING.contains(&name), "{}", lines[0]);
        if !rated {
            assert!(
                lines[0].ends_with("= - GB/s, - x memcpy (no data moved)"),
                "{}",
                lines[0]
            );
        }
    }
    assert!(
        out.lines()
            .last()
            .unwrap()
            .starts_with("result:   verified bit for bit"),
        "{out}"
    );
}

#[test]
fn same_order_is_direct_and_differing_orders_staged_or_forced_direct() {
    let small = ["--prompts", "40,23", "--blocks", "8"];
    let with = |more: &[&str]| {
        let mut a = small.to_vec();
        a.extend_from_slice(more);
        demo_json(&a)
    };
    let direct = with(&["--decode", "order=NHD N=32"]);
    let staged = with(&[]);
    let forced = with(&["--plan", "direct"]);
    for (r, plan) in [
        (&direct, "direct"),
        (&staged, "staged"),
        (&forced, "direct"),
    ] {
        assert_verified(r);
        assert_eq!(r["scenario"]["plan"], plan);
        assert_llama_sizes(r, &[40, 23], 2, 2);
    }
    assert_eq!(step(&direct, "receive")["detail"]["post_receive"], "none");
    assert_eq!(
        step(&staged, "receive")["detail"]["post_receive"],
        "scatter_blocks"
    );
    // NHD into HND directly moves one head's row at a time; staged moves the NHD rows whole
    // into the staging cache: fewer descriptors for the same bytes.
    let d = |r: &Value| u(&step(r, "transfer")["descriptors"]);
    assert!(d(&forced) > d(&staged), "{} vs {}", d(&forced), d(&staged));
}

#[test]
fn tp_and_block_changes_move_the_same_tokens() {
    for (args, tp) in [
        (&["--tp", "4"][..], 4),
        (&["--tp", "16"][..], 16),
        (
            &[
                "--prefill-tp",
                "2",
                "--tp",
                "1",
                "--decode",
                "order=HND N=16 page=139264",
            ][..],
            1,
        ),
        (
            &[
                "--prefill-tp",
                "4",
                "--tp",
                "2",
                "--prefill",
                "order=HND N=16",
            ][..],
            2,
        ),
    ] {
        let mut a = vec!["--prompts", "40,23", "--blocks", "8", "--layers", "1"];
        a.extend_from_slice(args);
        let r = demo_json(&a);
        assert_verified(&r);
        assert_llama_sizes(&r, &[40, 23], 1, tp);
        let ranks = step(&r, "plan")["detail"]["descriptors_per_rank"]
            .as_array()
            .unwrap()
            .len();
        assert_eq!(ranks as u64, tp, "{args:?}");
    }
    let r = demo_json(&["--prompts", "40,23", "--blocks", "12", "--layers", "1"]);
    assert_eq!(u(&r["scenario"]["decode"]["blocks"]), 12);
    assert!(r["scenario"]["prefill"]["spec"]
        .as_str()
        .unwrap()
        .contains("B=12"));
}

#[test]
fn other_presets_verify() {
    for preset in ["qwen2.5-7b", "deepseek-v3"] {
        let r = demo_json(&[
            "--preset",
            preset,
            "--prompts",
            "20,3",
            "--blocks",
            "4",
            "--layers",
            "1",
            "--decode",
            "N=32",
        ]);
        assert_verified(&r);
        assert_eq!(r["scenario"]["preset"], preset);
    }
}

/// Without the NIXL library (the workspace run of scripts/test.sh), `--engine nixl` is one
/// line naming the library and how to provide it, exit 2. Where the library loads, a visible
/// skip: tests/nixl.rs runs the two-process demo there, apart from the other tests.
#[test]
fn engine_nixl_without_the_library_is_one_line() {
    if kvlayout_connector::nixl::available().is_ok() {
        println!("skipped: nixl present: tests/nixl.rs runs the demo over NIXL");
        return;
    }
    let line = user_error(&["demo", "--engine", "nixl", "--prompts", "40"]);
    assert!(line.contains("--engine nixl: "), "{line}");
    assert!(line.contains("libnixl_capi.so"), "{line}");
    assert!(line.contains("scripts/nixl-path.sh"), "{line}");
}
