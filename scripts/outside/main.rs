//! A program outside the workspace, as a user writes it: depends on `kvlayout` and
//! `kvlayout-cpu` by path, without the `bench` feature (`scripts/outside-build.sh` builds it
//! with no C compiler). Writes two tokens into a cache and decodes them on the CPU backend.
//! The keys are zero, so both tokens get the same weight and the output is the mean of their
//! value rows, exactly.

use kvlayout::ops::{Backend, BufferShape, DecodeArgs, DecodeParams, HostTensor, WriteArgs};
use kvlayout::{DType, KvCacheLayout};
use kvlayout_cpu::Host;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let layout: KvCacheLayout = "kv L=1 B=3 N=16 H=4 D=8 dtype=f32 order=LBHNC".parse()?;
    let be = Host::cpu("cpu", Some(1));
    let mut cache = be.alloc_cache(&layout, &BufferShape::exact(&layout))?;
    // Two tokens, [tokens, heads, D]: value = 100 * token + 10 * head + d.
    let value: Vec<f32> = (0..2 * 4 * 8)
        .map(|i| (100 * (i / 32) + 10 * (i / 8 % 4) + i % 8) as f32)
        .collect();
    let key = be.upload_tensor(&HostTensor::F32(vec![0.0; 2 * 4 * 8]))?;
    let value = be.upload_tensor(&HostTensor::F32(value))?;
    let w = WriteArgs {
        layer: 0,
        key: &key,
        value: Some(&value),
        slot_mapping: &[2 * 16, 2 * 16 + 1],
    };
    be.wait(be.write_kv(&mut cache, &w)?)?;
    let query = be.upload_tensor(&HostTensor::F32(vec![1.0; 4 * 8]))?;
    let mut out = be.alloc_tensor(DType::F32, 4 * 8)?;
    let d = DecodeArgs {
        layer: 0,
        query: &query,
        block_table: &[2],
        blocks_per_seq: 1,
        seq_lens: &[2],
        params: DecodeParams {
            num_q_heads: 4,
            scale: 1.0,
            sliding_window: None,
            soft_cap: None,
        },
    };
    be.wait(be.paged_decode(&cache, &d, &mut out)?)?;
    let got = be.download_tensor(&out)?.to_f32();
    for (i, &x) in got.iter().enumerate() {
        let want = (50 + 10 * (i / 8) + i % 8) as f32;
        if x != want {
            return Err(format!("out[{i}] = {x}, expected {want}").into());
        }
    }
    println!("outside build: decode of 2 tokens x 4 heads on the CPU backend matches");
    Ok(())
}
