//! One decode step on a backend chosen at run time, checked against the scalar reference.
//!
//! ```text
//! cargo run -p kvlayout-backends --example cpu_decode            # the CPU backend
//! cargo run -p kvlayout-backends --example cpu_decode -- cuda    # any name `open` takes
//! ```
//!
//! A bf16 cache of 2 layers, 3 blocks of 16 tokens, 4 KV heads of 8 elements; two sequences
//! written into layer 1 through the backend (`write_kv`), then decoded (`paged_decode`, 8
//! query heads: 2 per KV head). The scalar reference (f64) writes the same tokens into the
//! program's own buffers and decodes them there; the backend's cache must hold the same bytes,
//! and its output must lie within the tolerance the conformance suite holds every backend to.
//! Exits non-zero on a mismatch.

use kvlayout::ops::{Backend, BufferShape, DecodeArgs, DecodeParams, HostTensor, WriteArgs};
use kvlayout::{DType, KvCacheLayout};
use kvlayout_cpu::reference::paged_decode_magnitudes;
use kvlayout_cpu::tolerance::{decode_error, Tolerance};
use kvlayout_cpu::{Activations, CacheMut, CacheRef, Decode, HostExec, ScalarReference, WriteKv};

const SPEC: &str = "kv L=2 B=3 N=16 H=4 D=8 dtype=bf16 order=LBHNC";
const HEADS: usize = 4;
const Q_HEADS: usize = 8;
const D: usize = 8;
const LAYER: u64 = 1;

fn main() -> std::process::ExitCode {
    let name = std::env::args().nth(1).unwrap_or_else(|| "cpu".into());
    match run(&name) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cpu_decode: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Writes, decodes and compares on the backend `name`.
fn run(name: &str) -> Result<(), Box<dyn std::error::Error>> {
    let be = kvlayout_backends::open(name)?;
    let layout: KvCacheLayout = SPEC.parse()?;
    let k = be.kernels();
    println!("backend {} (kernels {}, {})", be.name(), k.build, k.why);
    println!("cache   {layout}");

    // Sequence 0: 18 tokens, blocks 2 then 0 (slots 32..48, then 0..2). Sequence 1: 3
    // tokens in block 1 (slots 16..19). Block table rows of 2; sequence 1's second entry is
    // past its length, unread.
    let slots: Vec<i64> = (32..48).chain(0..2).chain(16..19).collect();
    let table = [2, 0, 1, 1];
    let seq_lens = [18u32, 3];
    // `[tokens, heads, D]`: multiples of 1/8 within +-1, exact in bf16.
    let pattern = |salt: usize| -> Vec<f32> {
        (0..slots.len() * HEADS * D)
            .map(|i| ((i * 7 + salt) % 17) as f32 / 8.0 - 1.0)
            .collect()
    };
    let (key, value) = (pattern(3), pattern(11));
    let query: Vec<f32> = (0..seq_lens.len() * Q_HEADS * D)
        .map(|i| ((i * 5) % 13) as f32 / 4.0 - 1.5)
        .collect();
    let params = DecodeParams {
        num_q_heads: Q_HEADS as u64,
        scale: 1.0 / (D as f32).sqrt(),
        sliding_window: None,
        soft_cap: None,
    };

    // The backend under test: its own cache (zeroed), tensors uploaded, results downloaded.
    let mut cache = be.alloc_cache(&layout, &BufferShape::exact(&layout))?;
    let zeros: Vec<Vec<u8>> = layout
        .extents()
        .iter()
        .map(|x| vec![0u8; x.end as usize])
        .collect();
    be.upload_cache(&mut cache, &zeros)?;
    let (k_t, v_t) = (
        be.upload_tensor(&HostTensor::F32(key.clone()))?,
        be.upload_tensor(&HostTensor::F32(value.clone()))?,
    );
    let w = WriteArgs {
        layer: LAYER,
        key: &k_t,
        value: Some(&v_t),
        slot_mapping: &slots,
    };
    be.wait(be.write_kv(&mut cache, &w)?)?;
    let q_t = be.upload_tensor(&HostTensor::F32(query.clone()))?;
    let mut out_t = be.alloc_tensor(DType::F32, query.len())?;
    let d = DecodeArgs {
        layer: LAYER,
        query: &q_t,
        block_table: &table,
        blocks_per_seq: 2,
        seq_lens: &seq_lens,
        params,
    };
    be.wait(be.paged_decode(&cache, &d, &mut out_t)?)?;
    let got = be.download_tensor(&out_t)?.to_f32();
    let got_cache = be.download_cache(&cache)?;

    // The scalar reference on the program's own buffers (no copy: `CacheMut` over them).
    let mut want_cache = zeros.clone();
    let w = WriteKv {
        layer: LAYER,
        key: Activations::F32(&key),
        value: Some(Activations::F32(&value)),
        slot_mapping: &slots,
    };
    let bufs = want_cache.iter_mut().map(|b| &mut b[..]).collect();
    ScalarReference.write_kv(&mut CacheMut::new(&layout, bufs)?, &w)?;
    if got_cache != want_cache {
        return Err(format!(
            "{}: write_kv's bytes differ from the reference's",
            be.name()
        )
        .into());
    }
    println!(
        "write_kv: {} tokens, bytes equal to the reference's",
        slots.len()
    );
    let reference = CacheRef::new(&layout, want_cache.iter().map(|b| &b[..]).collect())?;
    let d = Decode {
        layer: LAYER,
        query: Activations::F32(&query),
        block_table: &table,
        blocks_per_seq: 2,
        seq_lens: &seq_lens,
        params,
    };
    let mut want = vec![0f32; got.len()];
    let magnitudes = paged_decode_magnitudes(&reference, &d, &mut want)?;
    let tol = Tolerance::contract(layout.dtype());
    let e = decode_error(&got, &want, &magnitudes, tol);
    for (s, o) in [(0, 0), (1, Q_HEADS * D - 1)] {
        let i = s * Q_HEADS * D + o;
        println!("out[{i}] = {:+.6}, reference {:+.6}", got[i], want[i]);
    }
    println!(
        "paged_decode: {} sequences x {Q_HEADS} query heads, worst {:.3} of the bound \
         (relative error {:.2e})",
        seq_lens.len(),
        e.ratio,
        e.relative
    );
    match e.worst {
        Some((i, a, b)) if !e.passed() => Err(format!(
            "{}: out[{i}] = {a}, reference {b}: outside {tol:?}",
            be.name()
        )
        .into()),
        _ => Ok(()),
    }
}
