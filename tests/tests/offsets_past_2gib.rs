//! The int32-offset bug class: offsets past 2^31 bytes. A cache of 33 000 blocks of
//! 64 KiB (2.16 GB) is written and decoded in its first and last blocks by every backend on
//! host memory, against the scalar reference. The buffers are allocated zeroed and lazily
//! (only the pages touched cost memory), so the case is cheap. A kernel build that truncates
//! offsets to 32 bits (planted bug 4) must fail it.

use kvlayout::ops::DecodeParams;
use kvlayout::KvCacheLayout;
use kvlayout_conformance::backend::{EmuOps, HostOps, ScalarReference};
use kvlayout_cpu::{Activations, CacheMut, CacheRef, CpuBackend, Decode, WriteKv};

const SPEC: &str = "kv L=1 B=33000 N=16 H=8 D=128 dtype=f16 order=NHD";
const LAST: u64 = 32_999;

/// A zeroed buffer per layout buffer (calloc: untouched pages are never materialized).
fn buffers(l: &KvCacheLayout) -> Vec<Vec<u8>> {
    l.extents()
        .iter()
        .map(|x| vec![0u8; x.end as usize])
        .collect()
}

/// Writes 4 tokens into block 0 and 4 into the last block, decodes one sequence over both;
/// returns the bytes of the two blocks and the decode output.
fn run(ops: &dyn HostOps, l: &KvCacheLayout) -> Result<(Vec<u8>, Vec<f32>), String> {
    let mut bufs = buffers(l);
    let (h, d) = (8usize, 128usize);
    let tokens = 8;
    let key: Vec<f32> = (0..tokens * h * d)
        .map(|i| ((i * 7919) % 997) as f32 / 997.0 - 0.5)
        .collect();
    let value: Vec<f32> = key.iter().map(|x| 0.25 - x).collect();
    let bs = l.geometry().block_size as i64;
    let slots: Vec<i64> = (0..4)
        .chain(LAST as i64 * bs..LAST as i64 * bs + 4)
        .collect();
    {
        let mut cache = CacheMut::new(l, bufs.iter_mut().map(|b| b.as_mut_slice()).collect())
            .map_err(|e| e.to_string())?;
        let w = WriteKv {
            layer: 0,
            key: Activations::F32(&key),
            value: Some(Activations::F32(&value)),
            slot_mapping: &slots,
        };
        ops.write_kv(&mut cache, &w)
            .map_err(|e| format!("write_kv: {e}"))?;
    }
    let cache =
        CacheRef::new(l, bufs.iter().map(|b| b.as_slice()).collect()).map_err(|e| e.to_string())?;
    let query: Vec<f32> = (0..8 * d)
        .map(|i| ((i * 31) % 17) as f32 / 17.0 - 0.5)
        .collect();
    let table = [0i32, LAST as i32];
    let lens = [bs as u32 + 4];
    let dc = Decode {
        layer: 0,
        query: Activations::F32(&query),
        block_table: &table,
        blocks_per_seq: 2,
        seq_lens: &lens,
        params: DecodeParams {
            num_q_heads: 8,
            scale: 0.088,
            sliding_window: None,
            soft_cap: None,
        },
    };
    let mut out = vec![0f32; 8 * d];
    ops.paged_decode(&cache, &dc, &mut out)
        .map_err(|e| format!("paged_decode: {e}"))?;
    let page = l.geometry().num_kv_heads as usize * 16 * 2 * d * 2;
    let last = LAST as usize * page;
    let mut bytes = bufs[0][..page].to_vec();
    bytes.extend_from_slice(&bufs[0][last..last + page]);
    Ok((bytes, out))
}

#[test]
fn every_backend_addresses_past_2_gib() {
    let l: KvCacheLayout = SPEC.parse().unwrap();
    assert!(
        l.extents()[0].end > 1 << 31,
        "the case must pass 2^31 bytes"
    );
    let (want_bytes, want_out) = run(&ScalarReference, &l).expect("reference");
    assert!(want_bytes.iter().any(|&b| b != 0));
    let backends: Vec<(&str, Box<dyn HostOps>)> = vec![
        ("cpu", Box::new(CpuBackend::new(Some(2)))),
        ("cuda-emu", Box::new(EmuOps::cuda())),
        ("hip-emu", Box::new(EmuOps::hip())),
    ];
    for (name, ops) in backends {
        let (bytes, out) = run(ops.as_ref(), &l).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            bytes == want_bytes,
            "{name}: written bytes differ from the reference"
        );
        for (i, (a, b)) in out.iter().zip(&want_out).enumerate() {
            assert!(
                (a - b).abs() <= 1e-4 * b.abs().max(1.0),
                "{name}: out[{i}] {a} vs {b}"
            );
        }
        kvlayout_conformance::report(&format!("offsets past 2 GiB: {name}: passed"));
    }
    let truncating = EmuOps::planted(4);
    let caught = match run(&truncating, &l) {
        Err(e) => format!("refused: {e}"),
        Ok((bytes, _)) if bytes != want_bytes => "written bytes differ".to_string(),
        Ok(_) => panic!("a kernel build with 32-bit offsets passed the 2 GiB case"),
    };
    kvlayout_conformance::report(&format!(
        "offsets past 2 GiB: planted bug 4 (int32 offsets) caught: {caught}"
    ));
}
