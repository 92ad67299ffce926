//! The device benchmark's code on the emulated device backend, at a tiny size: every figure is
//! measured and finite. Its speeds mean nothing here; `scripts/gpu-check.sh` runs it on a GPU.

use kvlayout_conformance::gpu_bench::{run, BenchConfig};

#[test]
fn bench_runs_on_the_emulated_device() {
    let cfg = BenchConfig {
        seqs: 2,
        contexts: vec![40, 64],
        iters: 2,
        spec: "kv N=16 H=2 D=8 dtype=bf16 order=HND".into(),
        q_heads: 4,
    };
    let figures = run(&kvlayout_emu::cuda_emu(), &cfg).unwrap();
    assert_eq!(figures.len(), 4);
    // 2 seqs x 40 tokens x 2 heads x (K|V of 8) x 2 bytes.
    assert_eq!(figures[0].bytes, 2 * 40 * 2 * 16 * 2);
    // Half of 2 x 4 blocks of 2 x 16 x 16 x 2 bytes.
    assert_eq!(figures[2].bytes, 4 * 2 * 16 * 16 * 2);
    for f in &figures {
        assert!(f.ratio().is_finite() && f.ratio() > 0.0, "{f}");
    }
}
