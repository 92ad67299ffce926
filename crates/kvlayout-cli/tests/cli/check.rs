//! `kvlayout check`: the conformance suite's checks as a matrix of case families x backends.
//! A family passes on the CPU backend, the reference and the CUDA kernels under the emulator
//! with the same counts; a backend that cannot open is a named skip; a deliberately broken
//! kernel build (`planted:<n>`, a name only the test build has) fails, exit 1, with its first
//! failure's op and layout as a spec string that parses back to the case's layout; bad
//! names, families and filters are one `error:` line.

use kvlayout::KvCacheLayout;
use kvlayout_conformance::cases::all_cases;

use super::{kvlayout, ok, parse_json, stderr, stdout, user_error};

/// The table's cases of `family`.
fn cases_of(family: &str) -> usize {
    all_cases()
        .iter()
        .filter(|c| c.name.split('/').next() == Some(family))
        .count()
}

#[test]
fn a_family_passes_on_cpu_reference_and_the_emulator() {
    let v = parse_json(&ok(&[
        "check",
        "--backend",
        "cpu,reference,cuda-emu",
        "--family",
        "b2h2n2,hn",
        "--json",
    ]));
    assert_eq!(v["version"], 2, "{v}");
    assert_eq!(
        v["backends"],
        serde_json::json!(["cpu", "reference", "cuda-emu"])
    );
    let rows = v["rows"].as_array().expect("rows");
    let families: Vec<&str> = rows
        .iter()
        .map(|r| r["family"].as_str().expect("family"))
        .collect();
    assert_eq!(families, ["hn", "b2h2n2"], "table order: {v}");
    for r in rows {
        let family = r["family"].as_str().expect("family");
        assert_eq!(r["cases"].as_u64(), Some(cases_of(family) as u64), "{r}");
        let cells = r["cells"].as_array().expect("cells");
        let passed = cells[0]["passed"].as_u64().expect("passed");
        // Every case runs write_kv twice, four decode steps and four mover checks, and each
        // ordered pair three: more checks than cases.
        assert!(passed > r["cases"].as_u64().expect("cases"), "{r}");
        for c in cells {
            assert_eq!(c["failed"], 0, "{c}");
            assert!(c["skipped"].is_null(), "{c}");
            assert_eq!(
                c["passed"].as_u64(),
                Some(passed),
                "same checks on every backend: {r}"
            );
        }
    }
    assert_eq!(v["failed"], 0);
    assert!(v["first_failure"].is_null());
    let total: u64 = rows
        .iter()
        .flat_map(|r| r["cells"].as_array().expect("cells"))
        .map(|c| c["passed"].as_u64().expect("passed"))
        .sum();
    assert_eq!(v["passed"].as_u64(), Some(total));
}

/// A TP slice of H=2 replicated to one head has the content of the `h1` family's f32 layouts
/// and runs in their group (its `convert` pairs are with them), yet counts in its own row.
#[test]
fn every_case_counts_in_its_own_family() {
    let v = parse_json(&ok(&[
        "check",
        "--backend",
        "reference",
        "--family",
        "tp,h1",
        "--json",
    ]));
    let rows = v["rows"].as_array().expect("rows");
    let families: Vec<&str> = rows
        .iter()
        .map(|r| r["family"].as_str().expect("family"))
        .collect();
    assert_eq!(families, ["h1", "tp"], "table order: {v}");
    for r in rows {
        let family = r["family"].as_str().expect("family");
        assert_eq!(r["cases"].as_u64(), Some(cases_of(family) as u64), "{r}");
    }
    assert_eq!(
        v["cases"].as_u64(),
        Some((cases_of("h1") + cases_of("tp")) as u64)
    );
}

#[test]
fn a_backend_that_cannot_open_is_a_named_skip() {
    let name = "cuda:0";
    if kvlayout_backends::open(name).is_ok() {
        println!("skipped: {name} opens here; its skip is not tested");
        return;
    }
    let text = ok(&["check", "--backend", "cpu,cuda:0", "--family", "b2h2n2"]);
    let header = text.lines().next().expect("header");
    assert!(
        header.contains("cpu") && header.contains("cuda:0"),
        "{text}"
    );
    let row = text
        .lines()
        .find(|l| l.starts_with("b2h2n2 "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(row.contains(" passed") && row.contains("skipped"), "{row}");
    assert!(
        text.contains("skipped: cuda:0: "),
        "the reason is named: {text}"
    );
    // With no backend left, nothing is checked: never a silent pass.
    for args in [
        vec!["check", "--backend", "cuda:0", "--family", "b2h2n2"],
        vec![
            "check",
            "--backend",
            "cuda:0",
            "--family",
            "b2h2n2",
            "--json",
        ],
    ] {
        let e = user_error(&args);
        assert!(
            e.contains("nothing was checked") && e.contains("cuda:0: "),
            "the skip is named: {e}"
        );
    }
}

#[test]
fn a_broken_kernel_build_fails_with_its_layout_as_a_spec() {
    // Planted bug 3 ignores page padding: a padded-page case catches it.
    let case = "std/NHD+page=4160/f32";
    let want: KvCacheLayout = all_cases()
        .into_iter()
        .find(|c| c.name == case)
        .unwrap_or_else(|| panic!("no case {case}"))
        .layout;
    let args = ["check", "--backend", "planted:3", "--cases", case, "--json"];
    let o = kvlayout(&args);
    assert_eq!(o.status.code(), Some(1), "{args:?}: {}", stderr(&o));
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("error: ") && err.contains("checks failed"),
        "{err}"
    );
    let v = parse_json(&stdout(&o));
    let first = &v["first_failure"];
    assert_eq!(first["backend"], "planted:3", "{v}");
    assert_eq!(first["family"], "std", "{v}");
    let op = first["op"].as_str().expect("op");
    assert!(
        first["message"].as_str().expect("message").starts_with(op),
        "{v}"
    );
    let spec = first["layouts"][0].as_str().expect("a layout");
    let got: KvCacheLayout = spec.parse().unwrap_or_else(|e| panic!("{spec}: {e}"));
    assert_eq!(got, want, "the failure's layout is the case's");
    assert!(v["failed"].as_u64().expect("failed") > 0);

    // The text names the op and prints the layout.
    let o = kvlayout(&["check", "--backend", "cpu,planted:3", "--cases", case]);
    assert_eq!(o.status.code(), Some(1));
    let text = stdout(&o);
    assert!(
        text.contains(&format!("first failure: {op} on planted:3")),
        "{text}"
    );
    assert!(text.contains(&format!("  layout {spec}")), "{text}");
    let row = text
        .lines()
        .find(|l| l.starts_with("std "))
        .expect("std row");
    assert!(row.contains("FAILED"), "{row}");
}

#[test]
fn bad_backends_families_and_filters_are_one_line() {
    for (args, needle) in [
        (vec!["--backend", "gpu"], "\"gpu\" is not a backend name"),
        (vec!["--backend", "cpu,,reference"], "empty name"),
        (vec!["--backend", "cpu:sse9:x"], "not a backend name"),
        (vec!["--family", "nope"], "\"nope\" is no case family"),
        (vec!["--cases", "no-such-case"], "no case matches"),
        (
            vec!["--threads", "1025"],
            "--threads 1025 is more than 1024",
        ),
    ] {
        let mut all = vec!["check"];
        all.extend(&args);
        let e = user_error(&all);
        assert!(e.contains(needle), "{args:?}: {e}");
    }
    let o = kvlayout(&["check", "--threads", "x"]);
    assert_eq!(o.status.code(), Some(2));
}

/// Random backend lists, families and filters (seeded, `KVLAYOUT_FUZZ_SECONDS` scales the
/// 3 s budget): exit 0, or 2 with one `error:` line; never a panic.
#[test]
fn random_bad_input_is_refused_or_runs() {
    let budget = super::fuzzing::seconds();
    let start = std::time::Instant::now();
    let mut rng = super::fuzzing::Rng(0xC4EC_u64);
    let mut next = |n: usize| rng.below(n);
    let backends = [
        "cpu",
        "reference",
        "cuda:9",
        "hip:x",
        "",
        ",",
        "cpu:",
        "planted:99",
        "all,gpu",
    ];
    let families = ["b2h2n2", "std,", "", "mla-c4", "x"];
    let cases = ["b2h2n2/NHD/f32", "/", "zzz", ""];
    let mut runs = 0;
    while runs == 0 || start.elapsed().as_secs_f64() < budget {
        let mut args = vec!["check", "--backend", backends[next(backends.len())]];
        args.extend(["--family", families[next(families.len())]]);
        args.extend(["--cases", cases[next(cases.len())]]);
        let o = kvlayout(&args);
        let err = stderr(&o);
        match o.status.code() {
            Some(0) => {}
            Some(2) => {
                assert!(!err.contains("panicked"), "{args:?}: {err}");
                assert!(err.starts_with("error: "), "{args:?}: {err}");
                assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
            }
            other => panic!("{args:?}: exit {other:?}: {err}"),
        }
        runs += 1;
    }
    println!("{runs} random check invocations");
}
