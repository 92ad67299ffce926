//! The kernels are race-free: resuming the fibers of each block in another order (the
//! emulator's seed) changes no bit of what `write_kv`, a partitioned `paged_decode` and
//! `convert` produce, on both builds. A kernel that read shared memory before the barrier
//! that publishes it would differ between orders (or read the 0xff fill).

mod common;

use common::{write_layer0, zeroed_cache};
use kvlayout::ops::{Backend, BufferShape, DecodeArgs, DecodeParams, HostTensor};
use kvlayout::{DType, KvCacheLayout};
use kvlayout_device::DeviceBackend;
use kvlayout_emu::EmuDevice;

const SPEC: &str = "kv L=1 B=80 N=16 H=2 D=64 dtype=bf16 order=HND";

/// Cache bytes after writing 1100 tokens of one sequence, and the decode of 4 query heads
/// over them (3 partitions), and the cache converted to NHD.
fn run(warp: u32, seed: u64) -> (Vec<Vec<u8>>, Vec<f32>, Vec<Vec<u8>>) {
    let be = DeviceBackend::new(EmuDevice::new(warp).unwrap().with_seed(seed));
    let l: KvCacheLayout = SPEC.parse().unwrap();
    let mut cache = zeroed_cache(&be, &l);
    let tokens = 1100usize;
    let vals = |seed: usize| -> Vec<f32> {
        (0..tokens * 2 * 64)
            .map(|i| (((i + seed) * 2654435761) % 1009) as f32 / 1009.0 - 0.5)
            .collect()
    };
    let key = be.upload_tensor(&HostTensor::F32(vals(1))).unwrap();
    let value = be.upload_tensor(&HostTensor::F32(vals(2))).unwrap();
    let slots: Vec<i64> = (0..tokens as i64).collect();
    write_layer0(&be, &mut cache, (&key, &value), &slots);
    let q = be
        .upload_tensor(&HostTensor::from_f32(DType::Bf16, &vals(3)[..4 * 64]).unwrap())
        .unwrap();
    let table: Vec<i32> = (0..70).collect();
    let mut out = be.alloc_tensor(DType::F32, 4 * 64).unwrap();
    let d = DecodeArgs {
        layer: 0,
        query: &q,
        block_table: &table,
        blocks_per_seq: 70,
        seq_lens: &[tokens as u32],
        params: DecodeParams {
            num_q_heads: 4,
            scale: 0.125,
            sliding_window: None,
            soft_cap: Some(1.0),
        },
    };
    be.wait(be.paged_decode(&cache, &d, &mut out).unwrap())
        .unwrap();
    let nhd: KvCacheLayout = SPEC.replace("HND", "NHD").parse().unwrap();
    let mut converted = be.alloc_cache(&nhd, &BufferShape::exact(&nhd)).unwrap();
    be.wait(be.convert(&cache, &mut converted).unwrap())
        .unwrap();
    (
        be.download_cache(&cache).unwrap(),
        be.download_tensor(&out).unwrap().to_f32(),
        be.download_cache(&converted).unwrap(),
    )
}

#[test]
fn fiber_order_changes_no_result() {
    for (name, warp) in [("cuda-emu", 32), ("hip-emu", 64)] {
        let (cache, out, converted) = run(warp, 0);
        assert!(
            out.iter().all(|x| x.is_finite() && *x != 0.0),
            "{name}: {out:?}"
        );
        for seed in [1, 2, 0x9e37_79b9] {
            let (c, o, v) = run(warp, seed);
            assert!(c == cache, "{name} seed {seed}: written cache differs");
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&o), bits(&out), "{name} seed {seed}: decode differs");
            assert!(
                v == converted,
                "{name} seed {seed}: converted cache differs"
            );
        }
    }
}
