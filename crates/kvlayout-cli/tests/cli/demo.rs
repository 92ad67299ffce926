//! `kvlayout demo`: the default scenario and its JSON record, a staged and a direct plan,
//! TP and block changes, refused scenarios and bad flags (exit 2, one line), and a seeded
//! loop of random flag values.
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

/// `kvlayout demo --json ARGS`, which must succeed; its record.
fn demo_json(args: &[&str]) -> Value {
    let mut all = vec!["demo", "--json"];
    all.extend_from_slice(args);
    let out = expect_ok(&all, kvlayout(&all));
    parse_json(&out)
}

/// The step named `name` of a record.
fn step<'a>(record: &'a Value, name: &str) -> &'a Value {
    record["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .find(|s| s["step"] == name)
        .unwrap_or_else(|| panic!("no step {name}: {record}"))
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a u64: {v}"))
}

/// Every step is there, in order, with positive bytes, time and bandwidths; the
/// verification passed with nothing differing.
fn assert_verified(record: &Value) {
    assert_eq!(record["version"], 1);
    let names: Vec<&str> = record["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|s| s["step"].as_str().expect("step name"))
        .collect();
    assert_eq!(names, STEPS);
    for s in record["steps"].as_array().unwrap() {
        assert!(u(&s["bytes"]) > 0, "{s}");
        for key in ["ms", "gb_s", "memcpy_gb_s", "of_memcpy"] {
            let x = s[key].as_f64().unwrap_or_else(|| panic!("{key}: {s}"));
            assert!(x > 0.0 && x.is_finite(), "{key}: {s}");
        }
    }
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
        assert!(lines[0].contains("x memcpy"), "{}", lines[0]);
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

#[test]
fn refused_scenarios_exit_2_with_the_reason() {
    for (args, says) in [
        (&["--tp", "3"][..], "tp_size 3"),
        (
            &["--decode", "order=HND N=32 D=64"][..],
            "head_size: 64 vs 128",
        ),
        (
            &["--decode", "order=HND dtype=f16"][..],
            "dtype: f16 vs bf16",
        ),
        (
            &["--decode", "order=HND H=3"][..],
            "holds 4 of 8 KV heads, its layout has 3",
        ),
        (&["--decode", "order=HND N=24"][..], "do not nest"),
        (&["--tp", "1"][..], "page_size_padded = 69632"),
        (&["--preset", "mamba2-2.7b"][..], "holds no keys and values"),
        (&["--prompts", "5000"][..], "need 313 blocks of 16 tokens"),
        (
            &["--layers", "1", "--decode", "L=3 order=HND"][..],
            "num_layers: 3 vs 1",
        ),
    ] {
        let mut a = vec!["demo"];
        a.extend_from_slice(args);
        let line = user_error(&a);
        assert!(line.contains(says), "{args:?}: {line}");
    }
}

#[test]
fn bad_flags_exit_2_with_one_line() {
    for (args, says) in [
        (&["--tp", "x"][..], "--tp \"x\""),
        (&["--tp", "0"][..], "--tp 0: must be between 1 and 64"),
        (&["--tp", "-1"][..], "--tp \"-1\""),
        (&["--prefill-tp", "65"][..], "--prefill-tp 65"),
        (&["--layers", "0"][..], "--layers 0"),
        (&["--blocks", "99999999999"][..], "--blocks 99999999999"),
        (&["--prompts", ""][..], "--prompts \"\""),
        (&["--prompts", "1,,2"][..], "--prompts \"\""),
        (&["--prompts", "70000"][..], "--prompts 70000"),
        (
            &["--prompts", "60000,6000"][..],
            "66000 tokens in all, at most 65536",
        ),
        (&["--seed", "nope"][..], "--seed"),
        (&["--plan", "sideways"][..], "--plan \"sideways\""),
        (&["--engine", "rdma"][..], "--engine \"rdma\""),
        (&["--backend", "gpu"][..], "\"gpu\" is not a backend name"),
        (&["--preset", "gpt-5"][..], "--preset \"gpt-5\""),
        (&["--decode", "order=XYZ"][..], "--decode \"order=XYZ\""),
        (&["--prefill", "kv L=2"][..], "--prefill \"kv L=2\""),
    ] {
        let mut a = vec!["demo"];
        a.extend_from_slice(args);
        let line = user_error(&a);
        assert!(line.contains(says), "{args:?}: {line}");
    }
}

/// xorshift64 for the flag values.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut s = self.0;
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        self.0 = s;
        s
    }

    fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[(self.next() % xs.len() as u64) as usize]
    }
}

/// Random values of every flag (small enough that a scenario that runs is quick): each run
/// succeeds or is one `error:` line with exit 2 (or exit 1 with one line, a failed
/// verification, which would be a bug the message shows); never a panic.
#[test]
fn random_flag_values_succeed_or_are_one_line() {
    let seconds: f64 = std::env::var("KVLAYOUT_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    let start = std::time::Instant::now();
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let mut runs = 0;
    while runs == 0 || start.elapsed().as_secs_f64() < seconds {
        runs += 1;
        let flags: [(&str, &[&str]); 9] = [
            (
                "--tp",
                &["1", "2", "4", "3", "0", "x", "64", "65", "-2", ""],
            ),
            ("--prefill-tp", &["1", "2", "8", "5", "0"]),
            ("--layers", &["1", "2", "0", "1025", "z"]),
            ("--blocks", &["2", "8", "1", "16777217", "0", "4x"]),
            (
                "--prompts",
                &["1", "40,23", "17", "0", ",", "3,,", "99999", "1,2,3,4"],
            ),
            ("--plan", &["auto", "direct", "staged", "both"]),
            (
                "--decode",
                &[
                    "order=HND N=32",
                    "N=8",
                    "order=NHD",
                    "page=1",
                    "H=0",
                    "kv",
                    "N=16 order=HND page=70000",
                ],
            ),
            (
                "--prefill",
                &["order=NHD N=16", "N=4", "order=HND", "D=7", "B=0"],
            ),
            (
                "--preset",
                &[
                    "llama-3-8b",
                    "qwen2.5-7b",
                    "mamba2-2.7b-conv",
                    "nope",
                    "llama-3-8b L=1",
                ],
            ),
        ];
        let mut args = vec!["demo"];
        for (flag, values) in flags {
            if rng.next().is_multiple_of(2) {
                args.push(flag);
                args.push(rng.pick(values));
            }
        }
        let o = kvlayout(&args);
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        match o.status.code() {
            Some(0) => assert!(err.is_empty(), "{args:?}: {err}"),
            Some(2) => {
                let lines: Vec<&str> = err.lines().collect();
                assert_eq!(lines.len(), 1, "{args:?}: {err}");
                assert!(lines[0].starts_with("error: "), "{args:?}: {err}");
                assert!(o.stdout.is_empty(), "{args:?}");
            }
            other => panic!("{args:?}: exit {other:?}: {err}"),
        }
    }
    println!("{runs} random runs of kvlayout demo");
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
