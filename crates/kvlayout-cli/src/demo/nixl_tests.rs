//! Tests of the prefill process's checks on the decode process's reply (`receive_rank`).

use super::*;
use clap::Parser;

/// A small scenario: one layer, 8 blocks, two prompts, decode TP 2.
fn scenario() -> Scenario {
    let argv = [
        "kvlayout",
        "demo",
        "--prompts",
        "40,23",
        "--blocks",
        "8",
        "--layers",
        "1",
    ];
    match crate::Cli::try_parse_from(argv).unwrap().command {
        crate::Command::Demo { args, .. } => Scenario::from_args(&args).unwrap(),
        other => panic!("{other:?}"),
    }
}

/// `receive_rank` of rank `expected` on what `frames` sends (from a thread, so that a
/// large frame does not block), as an error line.
fn received(sc: &Scenario, expected: u64, frames: Vec<Vec<u8>>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let sender = std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        for f in frames {
            if send(&mut s, &f).is_err() {
                break;
            }
        }
    });
    let (mut s, _) = listener.accept().unwrap();
    timeouts(&s).unwrap();
    let e = receive_rank(&mut s, sc, expected).expect_err("a bad reply is refused");
    drop(s);
    let _ = sender.join();
    e.to_string()
}

fn figures(rank: u64, hash: &str) -> Vec<u8> {
    let run = RankRun {
        rank,
        compat_hash: hash.to_string(),
        ..RankRun::default()
    };
    serde_json::to_vec(&run).unwrap()
}

/// A reply of the wrong rank, a short hash, a buffer or an output of the wrong length is
/// one error naming it, never a panic.
#[test]
fn a_reply_that_does_not_fit_the_scenario_is_refused() {
    let sc = scenario();
    let hash = "0123456789abcdef0123";
    let extents: Vec<u64> = sc.decode.layout.extents().iter().map(|x| x.end).collect();
    let buffers = || extents.iter().map(|&n| vec![0u8; n as usize]);

    let e = received(&sc, 0, vec![figures(1, hash)]);
    assert!(e.contains("rank 1 where rank 0 of TP 2 was due"), "{e}");
    let e = received(&sc, 1, vec![figures(1, "ab")]);
    assert!(e.contains("compatibility hash \"ab\" is not a hash"), "{e}");

    let e = received(&sc, 0, vec![figures(0, hash), vec![0u8; 10]]);
    assert!(
        e.contains(&format!(
            "buffer 0 of 10 bytes, the layout's is {}",
            extents[0]
        )),
        "{e}"
    );

    // 2 prompts x 16 query heads x 128 values x 4 bytes, one byte short.
    let mut frames = vec![figures(0, hash)];
    frames.extend(buffers());
    frames.push(vec![0u8; 2 * 16 * 128 * 4 - 1]);
    let e = received(&sc, 0, frames);
    assert!(
        e.contains("layer 0's output of 16383 bytes, expected 16384"),
        "{e}"
    );
}
