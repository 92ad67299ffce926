//! `kvlayout plan` refusals: the connector's and the handshake's reasons, one line, exit 2;
//! and a short randomized run of bad arguments (malformed block lists, negative and huge
//! ids, overflowing counts, bad TP placements) that never panics.

use super::fuzzing::Rng;
use std::time::{Duration, Instant};

use super::{kvlayout, stderr, user_error};

const NHD: &str = "kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=NHD";
const HND_H1: &str = "kv L=1 B=3 N=16 H=1 D=8 dtype=f16 order=HND";
const HND_H2: &str = "kv L=1 B=3 N=16 H=2 D=8 dtype=f16 order=HND";
/// Pages of 4096 layers x 256 tokens x 64 heads: 64 Mi K|V rows per block.
const HUGE_NHD: &str = "kv L=4096 B=2 N=256 H=64 D=8 dtype=f16 order=NHD";
const HUGE_HND: &str = "kv L=4096 B=2 N=256 H=64 D=8 dtype=f16 order=HND";

fn refusal(extra: &[&str], src: &str, dst: &str) -> String {
    let mut args = vec!["plan", src, dst];
    args.extend_from_slice(extra);
    user_error(&args)
}

#[test]
fn refusals_name_the_reason_in_one_line() {
    for (src, dst, extra, says) in [
        // H=1 per rank x TP 2 is 2 model heads; SRC has 4.
        (
            NHD,
            HND_H1,
            &["--dst-tp", "2"][..],
            "incompatible cache groups: total_kv_heads: 2 vs 4",
        ),
        (
            NHD,
            HND_H1,
            &["--dst-tp", "2", "--model-heads", "4"][..],
            "layout holds 1 heads, but rank 0 of tp_size 2 over 4 KV heads holds 2",
        ),
        (
            NHD,
            NHD,
            &["--seq", "3:0:16"][..],
            "plan refused: sequence 0: remote block 3 not below 3",
        ),
        (
            NHD,
            NHD,
            &["--seq", "0:0:16", "--seq", "1:0:16"][..],
            "sequence 1: tokens 0.. go to local block 0 twice",
        ),
        (
            NHD,
            NHD,
            &["--seq", "0:1:17"][..],
            "1 remote blocks for 17 tokens of 16-token blocks (needs 2)",
        ),
        (
            NHD,
            HND_H2,
            &["--dst-tp", "2", "--dst-rank", "2"][..],
            "DST rank 2: group 0 tp_rank 2 is not below tp_size 2",
        ),
        (
            HND_H2,
            NHD,
            &["--src-tp", "2", "--src-rank", "0,2"][..],
            "SRC rank 2: group 0 tp_rank 2 is not below tp_size 2",
        ),
        (
            HND_H2,
            NHD,
            &["--src-tp", "2", "--src-rank", "1"][..],
            "local head 0 is held by no remote rank offered (remote TP 2)",
        ),
        (
            NHD,
            "kv L=1 B=3 N=24 H=4 D=8 dtype=f16 order=NHD",
            &[][..],
            "local 24 and remote 16 tokens per block do not nest",
        ),
        (
            NHD,
            "kv L=1 B=3 N=16 H=4 D=8 dtype=bf16 order=NHD",
            &[][..],
            "incompatible cache groups: dtype: bf16 vs f16",
        ),
        (
            NHD,
            NHD,
            &["--src-tp", "0"][..],
            "tp_size 0 is outside 1..=1024",
        ),
        (
            NHD,
            NHD,
            &["--src-tp", "18446744073709551615"][..],
            "overflows: give --model-heads",
        ),
        (
            NHD,
            NHD,
            &["--dst-tp", "4096", "--model-heads", "4"][..],
            "tp_size 4096 is outside 1..=1024",
        ),
        (
            HUGE_NHD,
            HUGE_HND,
            &[][..],
            "about 67108864 units (the move plan's units per block pair x pairs x SRC ranks), \
             over the limit of 16777216",
        ),
    ] {
        let line = refusal(extra, src, dst);
        assert!(line.contains(says), "{extra:?}: {line}");
    }
}

#[test]
fn a_forced_plan_is_refused_with_its_own_reason() {
    // The staging cache is dense in the SRC order: a legacy SRC has no paged order.
    let legacy = "kv L=1 B=3 N=16 H=4 D=8 dtype=f16 tensor=flash-attn-nhd";
    let line = refusal(&["--mode", "staged"], legacy, NHD);
    assert!(
        line.contains("staged plan refused: staging: the remote layout is not paged"),
        "{line}"
    );
    // Auto falls back to the direct plan and says why.
    let out = super::ok(&["plan", legacy, NHD]);
    assert!(out.contains("direct plan:"), "{out}");
    assert!(out.contains("staged plan: refused: staging:"), "{out}");
}

/// A tiny xorshift generator: the seed is printed with every failing input.
impl Rng {
    /// A number, a huge one, a negative one, or garbage.
    fn number(&mut self) -> String {
        match self.next() % 8 {
            0 => "-1".into(),
            1 => u64::MAX.to_string(),
            2 => "18446744073709551616".into(),
            3 => "x".into(),
            4 => String::new(),
            _ => (self.next() % 6).to_string(),
        }
    }

    fn list(&mut self) -> String {
        let n = self.next() % 4;
        (0..n).map(|_| self.number()).collect::<Vec<_>>().join(",")
    }

    fn seq(&mut self) -> String {
        match self.next() % 5 {
            0 => format!("{}:{}", self.list(), self.list()),
            1 => format!(
                "{}:{}:{}:{}",
                self.list(),
                self.list(),
                self.number(),
                self.number()
            ),
            2 => self.list(),
            _ => format!("{}:{}:{}", self.list(), self.list(), self.number()),
        }
    }
}

/// Every input to `plan` and `diff`: success, or exit 2 with one `error:` line (clap's
/// usage errors add a hint line), or for `diff` exit 1 with one line; never a panic.
#[test]
fn random_bad_arguments_never_panic() {
    let seconds = super::fuzzing::seconds();
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
        | 1;
    let mut rng = Rng(seed);
    let layouts = [
        NHD,
        HND_H1,
        HND_H2,
        "kv L=2 B=2 N=32 H=4 D=8 dtype=f16 order=HND",
    ];
    let flags = [
        "--src-tp",
        "--dst-tp",
        "--dst-rank",
        "--src-rank",
        "--model-heads",
    ];
    let start = Instant::now();
    let mut runs = 0;
    while start.elapsed() < Duration::from_secs_f64(seconds) || runs < 20 {
        let command = if rng.next().is_multiple_of(4) {
            "diff"
        } else {
            "plan"
        };
        let mut args: Vec<String> = vec![command.into()];
        args.push(rng.pick(&layouts).into());
        args.push(rng.pick(&layouts).into());
        for _ in 0..rng.next() % 4 * u64::from(command == "plan") {
            args.push(rng.pick(&flags).into());
            args.push(rng.number());
        }
        for _ in 0..rng.next() % 3 * u64::from(command == "plan") {
            args.push("--seq".into());
            args.push(rng.seq());
        }
        if rng.next().is_multiple_of(2) {
            args.push("--json".into());
        }
        let o = kvlayout(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let err = stderr(&o);
        let errors = err.lines().filter(|l| l.starts_with("error: ")).count();
        let first_is_error = err.lines().next().is_some_and(|l| l.starts_with("error: "));
        let fine = o.status.success() && err.is_empty()
            || o.status.code() == Some(2) && errors == 1 && first_is_error
            // diff(1)'s status 1: the layouts differ, said in one line.
            || command == "diff" && o.status.code() == Some(1) && err.lines().count() == 1 && first_is_error;
        assert!(
            fine && !err.contains("panicked"),
            "seed {seed}: {args:?}: {:?}\n{err}",
            o.status
        );
        runs += 1;
    }
}
