//! The int32-offset bug class: offsets past 2^31 bytes. A cache of 33 000 blocks of
//! 64 KiB (2.16 GB) is written and decoded in its first and last blocks, and those two blocks
//! gathered into a small cache, by every backend that runs on this machine's memory, against
//! the scalar reference. Their allocations are zeroed and lazy (only the pages touched cost
//! memory), so the case is cheap. A kernel build that truncates offsets to 32 bits (planted
//! bug 4) must fail it.

use kvlayout::ops::{Backend, BufferShape, DecodeArgs, DecodeParams, HostTensor, WriteArgs};
use kvlayout::KvCacheLayout;
use kvlayout_conformance::backend::{DeviceBackend, EmuDevice, Host, ScalarReference};

const SPEC: &str = "kv L=1 B=33000 N=16 H=8 D=128 dtype=f16 order=NHD";
const LAST: u64 = 32_999;

/// Writes 4 tokens into block 0 and 4 into the last block, decodes one sequence over both;
/// returns the bytes of the two blocks (gathered into a small staging cache) and the decode
/// output.
fn run<B: Backend>(be: &B, l: &KvCacheLayout) -> Result<(Vec<Vec<u8>>, Vec<f32>), String> {
    let mut cache = be.alloc_cache(l, &BufferShape::exact(l))?;
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
    let (k, v) = (
        be.upload_tensor(&HostTensor::F32(key))?,
        be.upload_tensor(&HostTensor::F32(value))?,
    );
    let w = WriteArgs {
        layer: 0,
        key: &k,
        value: Some(&v),
        slot_mapping: &slots,
    };
    let done = be
        .write_kv(&mut cache, &w)
        .map_err(|e| format!("write_kv: {e}"))?;
    be.wait(done)?;
    let query: Vec<f32> = (0..8 * d)
        .map(|i| ((i * 31) % 17) as f32 / 17.0 - 0.5)
        .collect();
    let query = be.upload_tensor(&HostTensor::F32(query))?;
    let table = [0i32, LAST as i32];
    let lens = [bs as u32 + 4];
    let dc = DecodeArgs {
        layer: 0,
        query: &query,
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
    let mut out = be.alloc_tensor(kvlayout::DType::F32, 8 * d)?;
    let done = be
        .paged_decode(&cache, &dc, &mut out)
        .map_err(|e| format!("paged_decode: {e}"))?;
    be.wait(done)?;
    let two: KvCacheLayout = SPEC
        .replace("B=33000", "B=2")
        .parse()
        .map_err(|e| format!("{e}"))?;
    let mut staging = be.alloc_cache(&two, &BufferShape::exact(&two))?;
    let done = be
        .gather_blocks(&cache, &[0, LAST], 0..8, &mut staging)
        .map_err(|e| format!("gather_blocks: {e}"))?;
    be.wait(done)?;
    Ok((
        be.download_cache(&staging)?,
        be.download_tensor(&out)?.to_f32(),
    ))
}

#[test]
fn every_backend_addresses_past_2_gib() {
    let l: KvCacheLayout = SPEC.parse().unwrap();
    assert!(
        l.extents()[0].end > 1 << 31,
        "the case must pass 2^31 bytes"
    );
    let reference = Host::new("reference", ScalarReference);
    let (want_bytes, want_out) = run(&reference, &l).expect("reference");
    assert!(want_bytes.iter().flatten().any(|&b| b != 0));
    let options = kvlayout_backends::Options { threads: Some(2) };
    for name in ["cpu", "cuda-emu", "hip-emu"] {
        let be = kvlayout_backends::open_with(name, &options).expect("a host backend opens");
        let (bytes, out) = run(&be, &l).unwrap_or_else(|e| panic!("{name}: {e}"));
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
    let truncating = DeviceBackend::new(EmuDevice::planted(4).expect("build 4 exists"));
    let caught = match run(&truncating, &l) {
        Err(e) => format!("refused: {e}"),
        Ok((bytes, _)) if bytes != want_bytes => "written bytes differ".to_string(),
        Ok(_) => panic!("a kernel build with 32-bit offsets passed the 2 GiB case"),
    };
    kvlayout_conformance::report(&format!(
        "offsets past 2 GiB: planted bug 4 (int32 offsets) caught: {caught}"
    ));
}
