//! The bounds `bench`, `check` and `decode` share: `--threads` past 1024, `--runs` past
//! 10000 and a GiB cap that is no positive number are one `error:` line (exit 2) naming the
//! flag and the bound, at once, before any thread or buffer is made.

use std::time::Instant;

use super::{user_error, SMALL};

/// `args` is refused with one line containing every `needle`, in well under the seconds that
/// starting the threads or the runs would take.
fn refused_fast(args: &[&str], needles: &[&str]) {
    let start = Instant::now();
    let e = user_error(args);
    let took = start.elapsed().as_secs_f64();
    for n in needles {
        assert!(e.contains(n), "{args:?}: {e}");
    }
    assert!(took < 5.0, "{args:?} took {took:.1} s");
}

#[test]
fn too_many_threads_are_refused_in_every_command() {
    for args in [
        vec!["bench", SMALL, "--threads", "100000", "--runs", "1"],
        vec!["check", "--family", "std", "--threads", "100000"],
        vec![
            "decode",
            SMALL,
            "--seqs",
            "1",
            "--context",
            "16",
            "--threads",
            "100000",
        ],
        vec!["bench", SMALL, "--threads", "1025"],
    ] {
        let n = args[args.iter().position(|a| *a == "--threads").expect("flag") + 1];
        refused_fast(&args, &[&format!("--threads {n}"), "1024"]);
    }
}

#[test]
fn too_many_runs_are_refused_in_bench_and_decode() {
    for args in [
        vec!["bench", SMALL, "--runs", "100000000"],
        vec![
            "decode",
            SMALL,
            "--seqs",
            "1",
            "--context",
            "16",
            "--runs",
            "100000000",
        ],
        vec!["bench", SMALL, "--runs", "10001"],
        vec![
            "decode",
            SMALL,
            "--seqs",
            "1",
            "--context",
            "16",
            "--runs",
            "0",
        ],
    ] {
        let n = args[args.iter().position(|a| *a == "--runs").expect("flag") + 1];
        refused_fast(&args, &[&format!("--runs {n}"), "10000"]);
    }
}

#[test]
fn gib_caps_must_be_positive_numbers() {
    for v in ["nan", "inf", "-1", "0"] {
        let flag = format!("--max-gib={v}");
        refused_fast(&["bench", SMALL, &flag], &["--max-gib", "positive number"]);
        let flag = format!("--max-cache-gib={v}");
        refused_fast(
            &["decode", SMALL, "--seqs", "1", "--context", "16", &flag],
            &["--max-cache-gib", "positive number"],
        );
    }
}
