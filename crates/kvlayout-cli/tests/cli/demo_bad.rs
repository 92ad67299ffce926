//! `kvlayout demo` on bad input: refused scenarios and bad flags (exit 2, one line), the
//! memory and work bounds (refused at once, before anything is allocated), a layout that
//! disagrees with the model, `--preset` with its own key=value tokens, and a seeded loop of
//! random flag values.

use super::demo::{assert_verified, demo_json, step};
use super::fuzzing::Rng;
use super::{kvlayout, user_error};

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

/// Random values of every flag (small enough that a scenario that runs is quick): each run
/// succeeds or is one `error:` line with exit 2 (or exit 1 with one line, a failed
/// verification, which would be a bug the message shows); never a panic.
#[test]
fn random_flag_values_succeed_or_are_one_line() {
    let seconds: f64 = super::fuzzing::seconds();
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

/// `kvlayout demo ARGS` is refused with one line containing each of `says`, in under
/// `seconds` (nothing is allocated before the bounds are checked).
fn refused_quickly(args: &[&str], says: &[&str], seconds: f64) {
    let mut a = vec!["demo"];
    a.extend_from_slice(args);
    let start = std::time::Instant::now();
    let line = user_error(&a);
    let took = start.elapsed().as_secs_f64();
    for s in says {
        assert!(line.contains(s), "{args:?}: {line}");
    }
    assert!(took < seconds, "{args:?}: {took:.1} s");
}

/// The review's repros: many ranks of large caches each within the per-rank cap are over
/// the demo-wide 4 GiB (the estimate counts every rank's copies: with 8 + 8 ranks of about
/// 0.5 GB each, more than 8 GB), refused at once.
#[test]
fn memory_past_the_demo_cap_is_refused_at_once() {
    refused_quickly(
        &[
            "--tp",
            "8",
            "--prefill-tp",
            "8",
            "--blocks",
            "65000",
            "--layers",
            "1",
            "--prompts",
            "100",
            "--decode",
            "order=HND N=16",
        ],
        &["the demo would hold", "cap of 4 GiB", "--blocks"],
        10.0,
    );
    refused_quickly(
        &[
            "--prefill-tp",
            "16",
            "--tp",
            "16",
            "--layers",
            "1",
            "--prompts",
            "1",
            "--prefill",
            "kv L=1 B=131071 N=16 H=1 D=128 dtype=bf16 order=NHD",
            "--decode",
            "kv L=1 B=131071 N=16 H=1 D=128 dtype=bf16 order=HND",
        ],
        &["the demo would hold", "GiB"],
        10.0,
    );
}

/// Within every per-flag cap, 65536 tokens over 3 layers would take minutes to verify: the
/// work bound refuses it at once and names the limit (2^24 elements compared).
#[test]
fn work_past_the_bound_is_refused_at_once() {
    refused_quickly(
        &["--prompts", "65536", "--blocks", "4096", "--layers", "3"],
        &[
            "402653184 K/V elements (65536 tokens x 3 layers x 8 decode heads x 256)",
            "16777216",
            "--prompts",
        ],
        10.0,
    );
    // At the element bound, over the reference's: 4096 tokens x 2 layers x 32 query heads
    // x 256 = 67108864 products, more than 2^25.
    refused_quickly(
        &["--prompts", "4096", "--blocks", "512", "--layers", "2"],
        &["67108864 products", "33554432", "--layers"],
        10.0,
    );
}

/// A prefill layout whose heads or head sizes are not the model's names --prefill and the
/// two values (the decode side's are the compatibility check's, which names --decode).
#[test]
fn a_layout_that_disagrees_with_the_model_names_the_flag() {
    for (args, says) in [
        (
            &["--prefill", "H=3"][..],
            &["--prefill: its layout has H=3", "holds 8 of the 8 KV heads"][..],
        ),
        (
            &[
                "--prefill-tp",
                "2",
                "--prefill",
                "kv L=2 B=128 N=16 H=8 D=128 dtype=bf16 order=NHD",
            ],
            &["H=8", "--prefill-tp 2 holds 4 of the 8"],
        ),
        (
            &[
                "--prefill",
                "kv L=2 B=128 N=16 H=8 D=64 dtype=bf16 order=NHD",
            ],
            &[
                "--prefill: its layout has key width 64, value width 64",
                "key width 128, value width 128",
            ],
        ),
        (
            &["--decode", "order=HND D=64"],
            &["--decode against --prefill", "head_size: 64 vs 128"],
        ),
    ] {
        refused_quickly(args, says, 10.0);
    }
}

/// `--preset` with its own key=value tokens: merged with the side's modifiers key by key,
/// the later one winning, so the same key twice is no error; the layout is the merged one.
#[test]
fn preset_tokens_and_modifiers_merge_later_winning() {
    let small = ["--prompts", "40,23", "--blocks", "8", "--layers", "1"];
    let with = |more: &[&str]| {
        let mut a = small.to_vec();
        a.extend_from_slice(more);
        demo_json(&a)
    };
    let r = with(&[
        "--preset",
        "kv-scaled L=2 B=128 N=16 H=8 D=128 dtype=fp8_e4m3 order=NHD",
    ]);
    assert_verified(&r);
    // --layers 1 and --blocks 8 replace the preset's L=2 and B=128; --decode's order=HND
    // and N=32 its order and N.
    let decode = r["scenario"]["decode"]["spec"].as_str().unwrap();
    assert!(decode.contains("L=1 B=8 N=32 H=4"), "{decode}");
    assert!(decode.contains("order=LBHNC"), "{decode}");
    let prefill = r["scenario"]["prefill"]["spec"].as_str().unwrap();
    assert!(prefill.contains("L=1 B=8 N=16 H=8"), "{prefill}");
    let r = with(&["--preset", "llama-3-8b order=HND"]);
    assert_verified(&r);
    // The prefill side's modifiers (order=NHD) replace the preset's order=HND.
    let prefill = r["scenario"]["prefill"]["spec"].as_str().unwrap();
    assert!(prefill.contains("order=LBNHC"), "{prefill}");
    assert_eq!(
        step(&r, "receive")["detail"]["post_receive"],
        "scatter_blocks"
    );
}
