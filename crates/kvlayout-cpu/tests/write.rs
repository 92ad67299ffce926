//! The fast `write_kv` against the reference, byte for byte, with sentinel-filled caches.

use half::{bf16, f16};
use kvlayout::KvCacheLayout;
use kvlayout_cpu::{
    Activations, CpuBackend, HostCache, HostExec, OpError, ScalarReference, WriteKv,
};

fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s % 2001) as f32 / 250.0 - 4.0
        })
        .collect()
}

/// Key and value widths per head, and whether the content is one MLA latent.
fn widths(l: &KvCacheLayout) -> (usize, usize, bool) {
    let c = l.content();
    let (k, v) = c.kv_widths().expect("a content of keys and values");
    if c.shares_latent() {
        (k as usize, 0, true)
    } else {
        (k as usize, v as usize, false)
    }
}

/// `w` with another slot mapping.
fn with_slots<'a>(w: &WriteKv<'a>, slots: &'a [i64]) -> WriteKv<'a> {
    WriteKv {
        slot_mapping: slots,
        ..*w
    }
}

/// Refused writes (a slot past the cache, a repeated slot) leave `cache` untouched.
fn check_refusals(be: &CpuBackend, cache: &mut HostCache, w: &WriteKv<'_>) {
    let l = cache.layout().clone();
    let g = *l.geometry();
    let before: Vec<Vec<u8>> = (0..l.num_buffers())
        .map(|i| cache.bytes(i).to_vec())
        .collect();
    let mut bad = w.slot_mapping.to_vec();
    bad[3] = (g.num_blocks * g.block_size) as i64;
    let err = be
        .write_kv(&mut cache.as_mut(), &with_slots(w, &bad))
        .unwrap_err();
    assert!(
        matches!(err, OpError::SlotOutOfRange { token: 3, .. }),
        "{err}"
    );
    bad[3] = 0;
    let err = be
        .write_kv(&mut cache.as_mut(), &with_slots(w, &bad))
        .unwrap_err();
    assert!(
        matches!(
            err,
            OpError::DuplicateSlot {
                token: 3,
                first: 2,
                ..
            }
        ),
        "{err}"
    );
    for (i, b) in before.iter().enumerate() {
        assert_eq!(cache.bytes(i), &b[..], "refused write changed the cache");
    }
}

fn check(spec: &str, input: &str) {
    let l: KvCacheLayout = spec.parse().unwrap();
    let g = *l.geometry();
    let heads = g.num_kv_heads as usize;
    let (kw, vw, mla) = widths(&l);
    let tokens = 7;
    let last = (g.num_blocks * g.block_size - 1) as i64;
    let slots: Vec<i64> = vec![5, -1, 0, 13, 2, -1, last];
    let k = data(tokens * heads * kw, 1);
    let v = data(tokens * heads * vw, 2);
    let (k16, v16): (Vec<f16>, Vec<f16>) = (
        k.iter().map(|x| f16::from_f32(*x)).collect(),
        v.iter().map(|x| f16::from_f32(*x)).collect(),
    );
    let (kb, vb): (Vec<bf16>, Vec<bf16>) = (
        k.iter().map(|x| bf16::from_f32(*x)).collect(),
        v.iter().map(|x| bf16::from_f32(*x)).collect(),
    );
    let (key, value) = match input {
        "f32" => (Activations::F32(&k), Activations::F32(&v)),
        "f16" => (Activations::F16(&k16), Activations::F16(&v16)),
        _ => (Activations::Bf16(&kb), Activations::Bf16(&vb)),
    };
    let w = WriteKv {
        layer: g.num_layers - 1,
        key,
        value: (!mla).then_some(value),
        slot_mapping: &slots,
    };
    let be = CpuBackend::new(Some(2));
    let mut fast = HostCache::new(l.clone()).unwrap();
    let mut slow = HostCache::new(l.clone()).unwrap();
    fast.fill(0xA5);
    slow.fill(0xA5);
    be.write_kv(&mut fast.as_mut(), &w).unwrap();
    ScalarReference.write_kv(&mut slow.as_mut(), &w).unwrap();
    for i in 0..l.num_buffers() {
        assert_eq!(fast.bytes(i), slow.bytes(i), "{spec} from {input}");
    }
    check_refusals(&be, &mut fast, &w);
}

#[test]
fn write_kv_matches_reference() {
    let specs = [
        "kv L=2 B=3 N=16 H=4 D=8 dtype=f32 order=NHD",
        "kv L=2 B=3 N=16 H=4 D=8 dtype=f16 order=HND",
        "kv L=1 B=3 N=16 H=4 D=8 dtype=bf16 order=BLNHC page=4096",
        "kv L=1 B=3 N=16 H=4 D=16 Dv=8 dtype=f16 order=NHD base=64",
        "kv L=1 B=3 N=16 H=4 D=16 dtype=fp8_e4m3 order=NHD k_scale=0.5 v_scale=2.0",
        "kv L=1 B=3 N=16 H=4 D=16 dtype=fp8_e5m2 order=HND",
        "kv-scaled L=1 B=3 N=16 H=4 D=8 dtype=int8 order=NHD",
        "kv-scaled L=1 B=3 N=16 H=2 D=16 dtype=fp8_e4m3 order=HND",
        "kv L=1 B=3 N=16 H=4 D=16 dtype=f16 tensor=vllm-paged-v1",
        "kv L=1 B=3 N=16 H=4 D=8 dtype=bf16 tensor=flashinfer-hnd",
        "kv L=1 B=3 N=16 H=4 D=8 Dv=4 dtype=f32 tensor=separate-nhd",
        "mla L=1 B=3 N=16 rank=16 rope=8 dtype=bf16 order=NHD",
    ];
    for spec in specs {
        for input in ["f32", "f16", "bf16"] {
            check(spec, input);
        }
    }
}
