//! Head sizes 32 to 256 (and K wider than V) on both emulated builds: `write_kv` stores the
//! reference's bytes, and `paged_decode` (GQA 4, a window, two partitions for the longest
//! sequence) agrees with the scalar reference within the contract's tolerance.

mod common;

use common::{write_layer0, zeroed_cache};
use kvlayout::ops::{Backend, DecodeArgs, DecodeParams, HostTensor};
use kvlayout::{DType, KvCacheLayout};
use kvlayout_cpu::reference::paged_decode_magnitudes;
use kvlayout_cpu::tolerance::{decode_error, Tolerance};
use kvlayout_cpu::{Activations, CacheRef, Decode, Host, ScalarReference};

fn values(n: usize, salt: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (((i + salt) * 2_654_435_761) % 2003) as f32 / 2003.0 - 0.5)
        .collect()
}

/// The cache bytes after writing `lens` tokens per sequence, and the decode output.
fn run<B: Backend>(
    be: &B,
    l: &KvCacheLayout,
    (d, dv): (usize, usize),
    lens: &[u32],
    table: &[i32],
    params: DecodeParams,
) -> (Vec<Vec<u8>>, Vec<f32>) {
    let h = l.geometry().num_kv_heads as usize;
    let bs = l.geometry().block_size as i64;
    let bps = table.len() / lens.len();
    let mut slots = Vec::new();
    for (s, &n) in lens.iter().enumerate() {
        for t in 0..i64::from(n) {
            slots.push(i64::from(table[s * bps + (t / bs) as usize]) * bs + t % bs);
        }
    }
    let mut cache = zeroed_cache(be, l);
    let key = be
        .upload_tensor(&HostTensor::F32(values(slots.len() * h * d, 1)))
        .unwrap();
    let value = be
        .upload_tensor(&HostTensor::F32(values(slots.len() * h * dv, 2)))
        .unwrap();
    write_layer0(be, &mut cache, (&key, &value), &slots);
    let q_heads = params.num_q_heads as usize;
    let query = HostTensor::from_f32(DType::F16, &values(lens.len() * q_heads * d, 3)).unwrap();
    let query = be.upload_tensor(&query).unwrap();
    let mut out = be
        .alloc_tensor(DType::F32, lens.len() * q_heads * dv)
        .unwrap();
    let args = DecodeArgs {
        layer: 0,
        query: &query,
        block_table: table,
        blocks_per_seq: bps,
        seq_lens: lens,
        params,
    };
    be.wait(be.paged_decode(&cache, &args, &mut out).unwrap())
        .unwrap();
    (
        be.download_cache(&cache).unwrap(),
        be.download_tensor(&out).unwrap().to_f32(),
    )
}

/// Both emulated builds against the reference on one layout and decode step.
fn check(spec: &str, (d, dv): (usize, usize), params: DecodeParams) {
    let reference = Host::new("reference", ScalarReference);
    let l: KvCacheLayout = spec.parse().unwrap();
    let lens = [600u32, 37, 0];
    let table: Vec<i32> = (0..3 * 40).map(|i| (i * 7) % 80).collect();
    let (want_bytes, want) = run(&reference, &l, (d, dv), &lens, &table, params);
    // The reference's magnitudes of each output row bound the allowed error.
    let refs: Vec<&[u8]> = want_bytes.iter().map(|b| b.as_slice()).collect();
    let cache = CacheRef::new(&l, refs).unwrap();
    let q = values(lens.len() * params.num_q_heads as usize * d, 3);
    let q16: Vec<half::f16> = q.iter().map(|&x| half::f16::from_f32(x)).collect();
    let dec = Decode {
        layer: 0,
        query: Activations::F16(&q16),
        block_table: &table,
        blocks_per_seq: 40,
        seq_lens: &lens,
        params,
    };
    let mut out = vec![0f32; want.len()];
    let mags = paged_decode_magnitudes(&cache, &dec, &mut out).unwrap();
    assert_eq!(out, want);
    for (name, be) in [
        ("cuda-emu", kvlayout_emu::cuda_emu()),
        ("hip-emu", kvlayout_emu::hip_emu()),
    ] {
        let (bytes, got) = run(&be, &l, (d, dv), &lens, &table, params);
        assert!(bytes == want_bytes, "{name} {spec}: written bytes differ");
        let e = decode_error(&got, &want, &mags, Tolerance::F32_PRODUCTS);
        assert!(
            e.passed(),
            "{name} {spec} {params:?}: {:.3} x the bound at {:?}",
            e.ratio,
            e.worst
        );
    }
}

fn params(d: usize, sliding_window: Option<u64>) -> DecodeParams {
    DecodeParams {
        num_q_heads: 8,
        scale: 1.0 / (d as f32).sqrt(),
        sliding_window,
        soft_cap: None,
    }
}

#[test]
fn head_sizes_32_to_256() {
    for (d, dv) in [
        (32, 32),
        (64, 64),
        (80, 80),
        (96, 96),
        (128, 128),
        (192, 128),
        (256, 256),
    ] {
        let spec = format!("kv B=80 N=16 H=2 D={d} Dv={dv} dtype=f16 order=NHD");
        check(&spec, (d, dv), params(d, Some(590)));
    }
}

/// A window of 0 attends to nothing (zeros), one past every length to everything; small and
/// large soft-caps (`c * tanh(l / c)`; the checks refuse caps that are not finite and
/// positive).
#[test]
fn windows_and_caps_at_their_edges() {
    let spec = "kv B=80 N=16 H=2 D=32 dtype=bf16 order=HND";
    for w in [Some(0), Some(1), None, Some(10_000)] {
        check(spec, (32, 32), params(32, w));
    }
    for cap in [0.25, 50.0] {
        let p = DecodeParams {
            soft_cap: Some(cap),
            ..params(32, None)
        };
        check(spec, (32, 32), p);
    }
}
