//! The embedded PTX: its hashes are its bytes', it is what `scripts/kernels.sh` compiles
//! from the sources now (the "embedded PTX is the one CI compiled" check), and every kernel
//! entry takes its parameters at the slots of `kvlayout_device::kernels::arg_slots`. Skipped,
//! visibly, where the crate was built without clang-19, unless `KVLAYOUT_REQUIRE_CLANG=1`.

mod common;

use std::path::Path;
use std::process::Command;

use common::shared::{kernels_sh, sha256_hex};
use common::{check_entries, entry_slots, report, skip};
use kvlayout_cuda::{embedded_ptx, kernels::ptx_version};

/// Whether PTX is embedded; a visible skip (a failure under `KVLAYOUT_REQUIRE_CLANG=1`) when
/// not.
fn embedded_here(what: &str) -> bool {
    if !embedded_ptx().is_empty() {
        return true;
    }
    let why = "no PTX embedded: built without clang-19 (the backend compiles with NVRTC)";
    skip(what, why, "KVLAYOUT_REQUIRE_CLANG");
    false
}

#[test]
fn embedded_hashes_are_the_bytes_hashes() {
    if !embedded_here("embedded ptx hashes") {
        return;
    }
    let archs: Vec<&str> = embedded_ptx().iter().map(|e| e.arch).collect();
    assert_eq!(archs, ["sm_80", "sm_90"]);
    for e in embedded_ptx() {
        assert_eq!(sha256_hex(e.ptx), e.sha256, "{}", e.arch);
        let text = std::str::from_utf8(e.ptx).unwrap();
        assert!(
            text.lines().any(|l| l == format!(".target {}", e.arch)),
            "{}",
            e.arch
        );
        assert_eq!(ptx_version(e.ptx), Some("7.8"), "{}", e.arch);
    }
}

#[test]
fn embedded_ptx_is_what_kernels_sh_compiles() {
    if !embedded_here("embedded ptx rebuild") {
        return;
    }
    let clang = std::env::var("KVLAYOUT_CLANG").unwrap_or_else(|_| "clang-19".into());
    let present = Command::new(&clang)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !present {
        let why = format!("{clang} not found, so the PTX cannot be rebuilt to compare");
        skip("embedded ptx rebuild", &why, "KVLAYOUT_REQUIRE_CLANG");
        return;
    }
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("ptx-{}", std::process::id()));
    kernels_sh(&out, "cuda");
    for e in embedded_ptx() {
        let fresh = std::fs::read(out.join(format!("kvlayout.{}.ptx", e.arch))).unwrap();
        assert_eq!(
            sha256_hex(&fresh),
            e.sha256,
            "{}: the embedded PTX is not what the sources compile to now",
            e.arch
        );
    }
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn embedded_entries_take_the_argument_slots() {
    if !embedded_here("embedded ptx parameters") {
        return;
    }
    for e in embedded_ptx() {
        check_entries(std::str::from_utf8(e.ptx).unwrap(), e.arch);
        report(&format!("embedded {}: sha256 {}", e.arch, e.sha256));
    }
}

#[test]
fn the_ptx_reader_takes_each_parameter_form() {
    let ptx =
        ".visible .entry f(\n\t.param .align 8 .b8 f_param_0[20],\n\t.param .b32 f_param_1,\n\t\
               .param .u64 .ptr .global .align 16 f_param_2 // a pointer\n)\n{";
    assert_eq!(entry_slots(ptx, "f"), Ok(vec![(0, 20), (20, 4), (24, 8)]));
    assert!(entry_slots(ptx, "g").is_err());
}
