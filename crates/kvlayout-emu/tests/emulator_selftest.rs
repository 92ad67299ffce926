//! The host emulator's own self-test (`kernels-cuda/emu/selftest.sh`): small kernels written
//! against `kvl_port.h` check barriers, shuffles, ballots at widths 32 and 64, early returns,
//! divergent barriers and incomplete warp operations reported as errors, launch limits,
//! shared memory, concurrent launches from several OS threads and seeded orders, built with
//! g++ (and clang++-19 where present, else a visible skip; required under
//! `KVLAYOUT_REQUIRE_CLANG=1`), with both widths linked together, with the ucontext
//! fallback, and under AddressSanitizer; and a kernel that writes past a heap buffer, built
//! with AddressSanitizer, must be reported as a heap-buffer-overflow.

mod common;

use common::run_script;

#[test]
fn emulator_selftest_and_asan_catches_a_planted_overflow() {
    let text = run_script("kernels-cuda/emu/selftest.sh", &[]);
    assert!(!text.contains("FAIL"), "{text}");
    for needle in [
        "PASS g++ -O1 warp 32",
        "PASS g++ -O1 warp 64",
        "PASS g++ -fsanitize=address warp 64",
        "PASS g++ ASan reports a kernel's heap-buffer-overflow",
    ] {
        assert!(text.contains(needle), "no `{needle}` in:\n{text}");
    }
    // The test command requires clang-19 (its set-up installs it): the clang++-19 builds ran.
    if std::env::var("KVLAYOUT_REQUIRE_CLANG").as_deref() == Ok("1") {
        let needle = "PASS clang++-19 ASan reports a kernel's heap-buffer-overflow";
        assert!(
            text.contains(needle),
            "KVLAYOUT_REQUIRE_CLANG=1, but:\n{text}"
        );
    }
    // Past the harness's capture, so the CI log shows what ran.
    use std::io::Write;
    let mut err = std::io::stderr().lock();
    for line in text
        .lines()
        .filter(|l| l.contains("ASan reports") || l.contains("speed"))
    {
        let _ = writeln!(err, "emulator selftest: {}", line.trim());
    }
    for line in text.lines().filter(|l| l.starts_with("skipped: ")) {
        let _ = writeln!(err, "{line}");
    }
}
