//! An outside reference nobody here wrote: numpy computes the same decode attention from the
//! dense inputs (before they were written into any cache), and the CPU backend's
//! `paged_decode` on caches in several layouts must agree.
//!
//! Skipped, visibly, when python3 with numpy is absent — unless `KVLAYOUT_REQUIRE_NUMPY=1`
//! (set by `scripts/test.sh`, after `scripts/setup.sh` installed numpy), which makes it fail.

use std::path::PathBuf;
use std::process::Command;

use kvlayout::ops::DecodeParams;
use kvlayout::KvCacheLayout;
use kvlayout_conformance::cases::data;
use kvlayout_cpu::{Activations, CpuBackend, Decode, HostCache, WriteKv};

fn numpy_available() -> bool {
    Command::new("python3")
        .args(["-c", "import numpy"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

fn write_f32(path: &PathBuf, v: &[f32]) {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    std::fs::write(path, bytes).unwrap();
}

struct Setup {
    spec: &'static str,
    q_heads: usize,
    window: Option<u64>,
    cap: Option<f32>,
    tolerance: f32,
}

fn check(s: &Setup) {
    let l: KvCacheLayout = s.spec.parse().unwrap();
    let g = *l.geometry();
    let (hkv, bs) = (g.num_kv_heads as usize, g.block_size as usize);
    let (d, dv) = match *l.content() {
        kvlayout::Content::Kv {
            head_size,
            head_size_v,
        } => (head_size as usize, head_size_v as usize),
        _ => unreachable!("K/V content"),
    };
    let lens = [45u32, 16, 1, 30];
    let max_len = 48usize;
    let per_seq = max_len / bs;
    let seqs = lens.len();
    // Dense inputs [seqs, max_len, kv_heads, width] and a scrambled block table.
    let k = data(seqs * max_len * hkv * d, 11);
    let v = data(seqs * max_len * hkv * dv, 12);
    let q = data(seqs * s.q_heads * d, 13);
    let nb = seqs * per_seq;
    let table: Vec<i32> = (0..nb).map(|i| ((i * 5 + 2) % nb) as i32).collect();
    let slots: Vec<i64> = (0..seqs * max_len)
        .map(|i| {
            let (seq, t) = (i / max_len, i % max_len);
            if t < lens[seq] as usize {
                i64::from(table[seq * per_seq + t / bs]) * bs as i64 + (t % bs) as i64
            } else {
                -1
            }
        })
        .collect();
    let be = CpuBackend::new(Some(2));
    let mut cache = HostCache::new(l.clone()).unwrap();
    let w = WriteKv {
        layer: 0,
        key: Activations::F32(&k),
        value: Some(Activations::F32(&v)),
        slot_mapping: &slots,
    };
    be.write_kv(&mut cache.as_mut(), &w).unwrap();
    let scale = 1.0 / (d as f32).sqrt();
    let dec = Decode {
        layer: 0,
        query: Activations::F32(&q),
        block_table: &table,
        blocks_per_seq: per_seq,
        seq_lens: &lens,
        params: DecodeParams {
            num_q_heads: s.q_heads as u64,
            scale,
            sliding_window: s.window,
            soft_cap: s.cap,
        },
    };
    let mut out = vec![0f32; seqs * s.q_heads * dv];
    be.paged_decode(&cache.as_ref(), &dec, &mut out).unwrap();

    let dir = std::env::temp_dir().join(format!(
        "kvlayout-sdpa-{}-{}",
        std::process::id(),
        s.spec.len() + s.q_heads
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let meta = serde_json::json!({
        "seqs": seqs, "q_heads": s.q_heads, "kv_heads": hkv, "head": d, "head_v": dv,
        "max_len": max_len, "lens": lens, "scale": scale,
        "window": s.window, "soft_cap": s.cap,
    });
    std::fs::write(dir.join("meta.json"), meta.to_string()).unwrap();
    write_f32(&dir.join("q.f32"), &q);
    write_f32(&dir.join("k.f32"), &k);
    write_f32(&dir.join("v.f32"), &v);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("python/sdpa_reference.py");
    let run = Command::new("python3")
        .arg(&script)
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "numpy reference failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let bytes = std::fs::read(dir.join("out.f32")).unwrap();
    let want: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(want.len(), out.len());
    for (i, (a, b)) in out.iter().zip(&want).enumerate() {
        assert!(
            (a - b).abs() <= s.tolerance * b.abs().max(1.0),
            "{}: out[{i}] = {a}, numpy {b}",
            s.spec
        );
    }
}

#[test]
fn paged_decode_agrees_with_numpy() {
    if !numpy_available() {
        let msg = "skipped: outside reference: numpy not installed (run scripts/setup.sh)";
        assert!(
            std::env::var("KVLAYOUT_REQUIRE_NUMPY").as_deref() != Ok("1"),
            "{msg}, but KVLAYOUT_REQUIRE_NUMPY=1"
        );
        println!("{msg}");
        return;
    }
    let setups = [
        Setup {
            spec: "kv B=16 N=16 H=2 D=64 dtype=f32 order=NHD",
            q_heads: 8,
            window: None,
            cap: None,
            tolerance: 1e-5,
        },
        Setup {
            spec: "kv B=16 N=16 H=2 D=64 dtype=f32 order=HND",
            q_heads: 2,
            window: Some(20),
            cap: None,
            tolerance: 1e-5,
        },
        Setup {
            spec: "kv B=16 N=16 H=2 D=128 Dv=64 dtype=f32 order=BLNHC",
            q_heads: 4,
            window: None,
            cap: Some(30.0),
            tolerance: 1e-5,
        },
        Setup {
            spec: "kv B=16 N=16 H=2 D=64 dtype=f32 legacy=vllm-paged-v1",
            q_heads: 4,
            window: None,
            cap: None,
            tolerance: 1e-5,
        },
        Setup {
            spec: "kv B=16 N=16 H=1 D=64 dtype=f32 legacy=flashinfer-hnd",
            q_heads: 8,
            window: None,
            cap: None,
            tolerance: 1e-5,
        },
        Setup {
            spec: "kv B=16 N=16 H=2 D=64 dtype=bf16 order=NHD",
            q_heads: 8,
            window: None,
            cap: None,
            tolerance: 2e-2,
        },
        Setup {
            spec: "kv B=16 N=16 H=2 D=64 dtype=f16 legacy=flash-attn-hnd",
            q_heads: 4,
            window: None,
            cap: None,
            tolerance: 2e-2,
        },
    ];
    for s in &setups {
        check(s);
    }
    println!(
        "outside reference: numpy agrees on {} layouts",
        setups.len()
    );
}
