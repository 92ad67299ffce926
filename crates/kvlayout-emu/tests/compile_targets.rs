//! The kernel sources compile for real GPU targets with Debian's clang-19 and no vendor
//! toolkit, warnings as errors (`scripts/kernels.sh`): PTX for sm_80 and sm_90, AMDGPU code
//! objects for gfx90a and gfx942 (wave64) and gfx1100 (wave32), each with every kernel.
//! Skipped, visibly, without clang-19, unless `KVLAYOUT_REQUIRE_CLANG=1` (the test command
//! sets it, and its set-up installs clang-19).

mod common;

use std::path::Path;
use std::process::Command;

use common::run_script;

#[test]
fn kernels_compile_to_ptx_and_amdgpu_code_objects() {
    let have_clang = Command::new("clang-19").arg("--version").output().is_ok();
    if !have_clang {
        if std::env::var("KVLAYOUT_REQUIRE_CLANG").as_deref() == Ok("1") {
            panic!(
                "clang-19 not found and KVLAYOUT_REQUIRE_CLANG=1 (apt-get install clang-19 lld-19)"
            );
        }
        eprintln!(
            "skipped: kernels to PTX/AMDGPU: clang-19 not found (apt-get install clang-19 lld-19)"
        );
        return;
    }
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("kernels");
    eprint!("{}", run_script("scripts/kernels.sh", &[&out]));
    for arch in ["sm_80", "sm_90"] {
        let ptx = std::fs::read_to_string(out.join(format!("kvlayout.{arch}.ptx"))).unwrap();
        assert!(ptx.contains(&format!(".target {arch}")));
        // No call into a library the build did not link (libdevice, vendor math).
        assert!(
            !ptx.contains(".extern .func"),
            "{arch}: unresolved function"
        );
        assert_eq!(ptx.matches(".visible .entry").count(), 4, "{arch}");
    }
    for gfx in ["gfx90a", "gfx942", "gfx1100"] {
        let co = std::fs::read(out.join(format!("kvlayout.{gfx}.co"))).unwrap();
        assert_eq!(
            &co[..4],
            b"\x7fELF",
            "{gfx}: a plain code object, not a bundle"
        );
    }
}
