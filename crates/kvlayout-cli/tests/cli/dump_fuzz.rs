//! Damaged dumps at random: a file written by `fill` or `decode --out` with bytes flipped,
//! cut or appended, read by `convert` and `decode --from` (seeded, `KVLAYOUT_FUZZ_SECONDS`
//! scales the 3 s budget): each is refused with one `error:` line or read; never a panic.

use super::dump_file::{fill, Temp, INT8, SEPARATE};
use super::fuzzing::Rng;
use super::{kvlayout, ok, stderr, stdout};

#[test]
fn randomized_bad_dumps_are_refused_or_read_never_a_panic() {
    let secs: f64 = super::fuzzing::seconds();
    let seed: u64 = std::env::var("KVLAYOUT_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(7);
    let step = Temp::new("fuzz-step");
    ok(&[
        "decode",
        "kv L=1 B=4 N=16 H=2 D=8 dtype=f16 order=NHD",
        "--seqs",
        "1",
        "--context",
        "20",
        "--runs",
        "1",
        "--bound-mib",
        "1",
        "--out",
        step.s(),
    ]);
    let seeds = [
        fill(SEPARATE, "coords", "fuzz-a"),
        fill(INT8, "random", "fuzz-b"),
        step,
    ];
    let originals: Vec<Vec<u8>> = seeds.iter().map(|t| std::fs::read(&t.0).unwrap()).collect();
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let start = std::time::Instant::now();
    let (mut runs, mut refusals) = (0, 0);
    let file = Temp::new("fuzz");
    let out = Temp::new("fuzz-out");
    while runs < 4 || start.elapsed().as_secs_f64() < secs {
        let k = rng.below(originals.len());
        let mut b = originals[k].clone();
        let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
        let what = match rng.below(4) {
            0 => {
                let cut = rng.below(b.len());
                b.truncate(cut);
                format!("truncated at {cut}")
            }
            1 => {
                let mut flips = Vec::new();
                for _ in 0..1 + rng.below(4) {
                    let at = rng.below(8 + n);
                    let bit = 1u8 << rng.below(8);
                    b[at] ^= bit;
                    flips.push((at, bit));
                }
                format!("header bits flipped {flips:?}")
            }
            2 => {
                let at = 8 + n + rng.below(b.len() - 8 - n);
                b[at] ^= 0xff;
                format!("data byte {at} inverted")
            }
            _ => {
                let v = rng.next() >> rng.below(64);
                b[..8].copy_from_slice(&v.to_le_bytes());
                format!("header length {v}")
            }
        };
        std::fs::write(&file.0, &b).unwrap();
        let args = if runs % 4 == 3 {
            vec![
                "decode",
                "--from",
                file.s(),
                "--seqs",
                "1",
                "--context",
                "16",
                "--runs",
                "1",
                "--bound-mib",
                "1",
            ]
        } else {
            vec![
                "convert",
                file.s(),
                "--to",
                "kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=HND",
                "--out",
                out.s(),
            ]
        };
        let o = kvlayout(&args);
        let err = stderr(&o);
        let input = format!("seed {seed}, run {runs}: dump {k} with {what}: {args:?}");
        match o.status.code() {
            Some(0) => {}
            Some(2) => {
                assert!(o.stdout.is_empty(), "{input}: stdout {}", stdout(&o));
                assert_eq!(err.lines().count(), 1, "{input}: {err}");
                assert!(err.starts_with("error: "), "{input}: {err}");
                refusals += 1;
            }
            // A decode of a changed cache may disagree with the reference (exit 1, after
            // its report): a finding about the data, not a failure to read it.
            Some(1) if args[0] == "decode" && err.contains("differs from the reference") => {}
            _ => panic!("{input}: {:?}\n{err}", o.status),
        }
        runs += 1;
    }
    assert!(refusals > 0, "{runs} runs, none refused");
}
