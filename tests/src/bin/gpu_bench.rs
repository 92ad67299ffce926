//! `cargo run --release -p kvlayout-conformance --bin gpu_bench -- <backend> [seqs] [contexts]`:
//! the device backends' benchmark (`kvlayout_conformance::gpu_bench`) on `cuda`, `hip` or
//! `cuda-emu` (the emulator: for trying the bench, not for its figures). Prints one line per
//! figure; exits 2 when the backend cannot run here, saying why.

#![forbid(unsafe_code)]

use kvlayout_conformance::gpu_bench::{run, BenchConfig, Figure};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let backend = args.first().map_or("cuda", String::as_str);
    let mut cfg = BenchConfig::default();
    if let Some(s) = args.get(1) {
        cfg.seqs = s.parse().expect("seqs: a number");
    }
    if let Some(c) = args.get(2) {
        cfg.contexts = c
            .split(',')
            .map(|x| x.parse().expect("contexts: numbers separated by commas"))
            .collect();
    }
    let result: Result<Vec<Figure>, String> = match backend {
        "cuda" => kvlayout_cuda::cuda(0)
            .map_err(|e| format!("skipped: cuda: {e}"))
            .and_then(|be| run(&be, &cfg)),
        "hip" => kvlayout_hip::hip(0)
            .map_err(|e| format!("skipped: hip: {e}"))
            .and_then(|be| run(&be, &cfg)),
        "cuda-emu" => run(&kvlayout_emu::cuda_emu(), &cfg),
        other => Err(format!("no backend {other}: cuda, hip or cuda-emu")),
    };
    match result {
        Ok(figures) => {
            println!("gpu_bench: {backend}, host {}", std::env::consts::ARCH);
            for f in figures {
                println!("{f}");
            }
        }
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    }
}
