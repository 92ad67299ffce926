//! `kvlayout cpu` and `KVLAYOUT_CPU_HIDE`: the report equals what the library sees; hiding
//! narrows the kernel builds as a CPU without the features would, never adds one; `decode`
//! reports what was hidden; an unknown feature is a user error.

use kvlayout_cpu::{CpuBackend, CpuFeatures};

use super::{expect_ok, expect_user_error, kvlayout_hiding, ok, parse_json};

fn strings(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|x| {
            x.as_str()
                .unwrap_or_else(|| panic!("not a string: {x}"))
                .to_string()
        })
        .collect()
}

/// `kvlayout cpu --json` under `KVLAYOUT_CPU_HIDE=hide` (unset where `None`).
fn cpu_json(hide: Option<&str>) -> serde_json::Value {
    let args = ["cpu", "--json"];
    parse_json(&expect_ok(&args, kvlayout_hiding(hide, &args)))
}

#[test]
fn cpu_reports_what_this_process_sees() {
    let v = parse_json(&ok(&["cpu", "--json"]));
    let me = CpuFeatures::get();
    assert_eq!(strings(&v["detected"]), me.detected, "{v}");
    assert_eq!(strings(&v["hidden"]), me.hidden, "{v}");
    assert_eq!(v["cpu_hide"].as_str(), me.hide.as_deref(), "{v}");
    assert_eq!(strings(&v["builds"]), CpuBackend::kernel_builds(), "{v}");
    assert_eq!(v["kernels"], CpuBackend::kernels(), "{v}");
    let not_run: Vec<(String, String)> = v["builds_not_run"]
        .as_array()
        .expect("builds_not_run")
        .iter()
        .map(|n| (n["build"].to_string(), n["why"].to_string()))
        .collect();
    let want: Vec<(String, String)> = CpuBackend::kernels_not_run()
        .into_iter()
        .map(|(b, w)| (format!("{b:?}"), format!("{w:?}")))
        .collect();
    assert_eq!(not_run, want);
    let text = ok(&["cpu"]);
    for head in [
        "cpu      ",
        "features ",
        "hidden   ",
        "kernels  ",
        "builds   ",
    ] {
        assert!(
            text.contains(&format!("\n{head}")) || text.starts_with(head),
            "{text}"
        );
    }
}

/// Each host class the test command imitates: the builds left are those of the CPU minus what
/// the hidden features take, the features hidden are only ones the CPU has, and a build left
/// out for a hidden feature says so.
#[test]
fn hiding_narrows_the_builds_and_never_adds_one() {
    let native = cpu_json(None);
    let native_builds = strings(&native["builds"]);
    let detected = strings(&native["detected"]);
    assert!(strings(&native["hidden"]).is_empty(), "{native}");
    for (hide, gone) in [
        ("avx512bf16", &["avx512-bf16"][..]),
        ("avx512f", &["avx512-bf16", "avx512"][..]),
        ("avx2", &["avx512-bf16", "avx512", "avx2"][..]),
    ] {
        let v = cpu_json(Some(hide));
        assert_eq!(strings(&v["detected"]), detected, "{hide}: {v}");
        assert_eq!(v["cpu_hide"], hide, "{v}");
        let hidden = strings(&v["hidden"]);
        assert!(hidden.iter().all(|f| detected.contains(f)), "{hide}: {v}");
        assert_eq!(
            hidden.contains(&hide.to_string()),
            detected.contains(&hide.to_string())
        );
        let builds = strings(&v["builds"]);
        let want: Vec<&String> = native_builds
            .iter()
            .filter(|b| !gone.contains(&b.as_str()))
            .collect();
        let mut got: Vec<&String> = builds.iter().collect();
        let mut want_sorted = want.clone();
        got.sort();
        want_sorted.sort();
        assert_eq!(got, want_sorted, "{hide}: {v}");
        assert_eq!(v["kernels"], builds[0].as_str(), "{v}");
        for n in v["builds_not_run"].as_array().expect("builds_not_run") {
            let build = n["build"].as_str().unwrap_or_default();
            if native_builds.iter().any(|b| b == build) {
                let why = n["why"].as_str().unwrap_or_default();
                assert!(why.contains("KVLAYOUT_CPU_HIDE hides"), "{hide}: {n}");
            }
        }
    }
    assert_eq!(strings(&cpu_json(Some("avx2"))["builds"]), ["scalar"]);
}

#[test]
fn decode_reports_what_was_hidden() {
    let args = [
        "decode",
        "kv L=1 B=8 N=16 H=2 D=40 dtype=bf16 order=HND",
        "--seqs",
        "2",
        "--context",
        "50",
        "--runs",
        "1",
        "--bound-mib",
        "8",
        "--json",
    ];
    let v = parse_json(&expect_ok(&args, kvlayout_hiding(Some("avx2"), &args)));
    assert_eq!(v["kernels"], "scalar", "{v}");
    assert_eq!(v["cpu"]["cpu_hide"], "avx2", "{v}");
    let hidden = strings(&v["cpu"]["hidden"]);
    let detected = strings(&v["cpu"]["detected"]);
    assert_eq!(
        hidden.contains(&"avx2".to_string()),
        detected.contains(&"avx2".to_string()),
        "{v}"
    );
    let v = parse_json(&expect_ok(&args, kvlayout_hiding(None, &args)));
    assert!(v["cpu"]["cpu_hide"].is_null(), "{v}");
    assert!(strings(&v["cpu"]["hidden"]).is_empty(), "{v}");
    let text = expect_ok(&args[..10], kvlayout_hiding(Some("avx2"), &args[..10]));
    let line = text
        .lines()
        .find(|l| l.starts_with("cpu "))
        .expect("a cpu line");
    if detected.contains(&"avx2".to_string()) {
        assert!(line.contains("KVLAYOUT_CPU_HIDE hides avx2"), "{line}");
    }
}

#[test]
fn an_unknown_feature_is_a_user_error() {
    for args in [
        &["cpu"][..],
        &[
            "decode",
            "kv L=1 B=8 N=16 H=2 D=16 dtype=f32 order=NHD",
            "--seqs",
            "1",
            "--context",
            "16",
        ][..],
    ] {
        let e = expect_user_error(args, kvlayout_hiding(Some("avx512f,avx512bf"), args));
        assert!(e.contains("no CPU feature \"avx512bf\""), "{e}");
        assert!(e.contains("avx512bf16"), "{e}");
    }
}

/// `KVLAYOUT_KERNELS` naming a build this process does not run (hidden here, so on every
/// host with AVX2), or no build at all, is ignored with a warning on stderr, and the report
/// says why.
#[test]
fn a_kernels_override_this_process_cannot_run_is_ignored() {
    for (hide, kernels, why) in [
        ("avx2", "avx2", "KVLAYOUT_CPU_HIDE hides avx2"),
        ("", "sse9", "no kernel build \"sse9\""),
    ] {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_kvlayout"))
            .args(["cpu", "--json"])
            .env(kvlayout_cpu::CPU_HIDE_VAR, hide)
            .env("KVLAYOUT_KERNELS", kernels)
            .output()
            .expect("the kvlayout binary runs");
        assert!(o.status.success(), "{o:?}");
        let v = parse_json(&String::from_utf8_lossy(&o.stdout));
        let note = format!("KVLAYOUT_KERNELS={kernels} ignored: ");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(&note) && err.contains(why), "{err}");
        let chosen = v["kernels_why"].as_str().unwrap_or_default();
        assert!(chosen.contains(&note) && chosen.contains(why), "{v}");
        assert_ne!(v["kernels"], kernels, "{v}");
    }
}
