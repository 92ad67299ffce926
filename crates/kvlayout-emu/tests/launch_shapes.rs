//! Every launch-shape choice of `write_kv` and the movers runs on both emulated builds and
//! matches the scalar reference byte for byte: the mover's row unit (16, 8, 4, 2 and 1 bytes
//! for rows that are one run, by the buffers' alignment; 0, element by element, for the legacy
//! x-split key) and `write_kv`'s 16-byte lanes (plain, per-tensor-scaled fp8), 8-byte lanes
//! (inline-scaled int8 and fp8 rows, 8-aligned buffers) and its element-wise path. The choices are the launch builder's
//! (`row_unit_bytes`, `write_lane_bytes`), from the layout and the buffer addresses; the
//! table states each one's expected value, and the test fails unless every value ran.
//! Decode shapes are in `group_shapes.rs`.

mod common;

use std::collections::BTreeSet;

use kvlayout::ops::{Backend, BlockMove, BufferShape, HostTensor, WriteArgs};
use kvlayout::{Field, KvCacheLayout};
use kvlayout_cpu::{Host, ScalarReference};
use kvlayout_device::kernels::{row_unit_bytes, write_lane_bytes};

/// A layout, the misalignment of its buffers on the device, and the expected choices: the
/// mover's unit for K and `write_kv`'s lane bytes for K (16 or 8; 0: element-wise).
struct Shape {
    spec: &'static str,
    misalign: u64,
    unit: u32,
    k_lane_bytes: u32,
}

const SHAPES: &[Shape] = &[
    // f16 rows of 8 elements: 16 bytes, one run.
    Shape {
        spec: "kv L=2 B=3 N=16 H=4 D=8 dtype=f16 order=NHD",
        misalign: 0,
        unit: 16,
        k_lane_bytes: 16,
    },
    Shape {
        spec: "kv L=2 B=3 N=16 H=4 D=8 dtype=f16 order=NHD",
        misalign: 8,
        unit: 8,
        k_lane_bytes: 8,
    },
    Shape {
        spec: "kv L=2 B=3 N=16 H=4 D=8 dtype=bf16 order=HND",
        misalign: 4,
        unit: 4,
        k_lane_bytes: 0,
    },
    Shape {
        spec: "kv L=2 B=3 N=16 H=4 D=8 dtype=f16 order=HND",
        misalign: 2,
        unit: 2,
        k_lane_bytes: 0,
    },
    // fp8 rows of 8 bytes: never 16-byte lanes; a byte-misaligned buffer copies bytes.
    Shape {
        spec: "kv L=2 B=3 N=16 H=4 D=8 dtype=fp8_e4m3 order=NHD",
        misalign: 1,
        unit: 1,
        k_lane_bytes: 0,
    },
    // f32: 4 elements per lane; K and V are 32-byte runs.
    Shape {
        spec: "kv L=1 B=3 N=16 H=2 D=8 dtype=f32 order=NHD",
        misalign: 0,
        unit: 16,
        k_lane_bytes: 16,
    },
    // Per-tensor-scaled fp8: 16 elements per lane.
    Shape {
        spec: "kv L=1 B=3 N=16 H=2 D=16 dtype=fp8_e4m3 k_scale=0.5 v_scale=2 order=HND",
        misalign: 0,
        unit: 16,
        k_lane_bytes: 16,
    },
    // Inline-scaled int8 and fp8 rows: a 4-byte scale after each row, so rows start 8 bytes
    // apart at best: the block max, then 8 codes per lane.
    Shape {
        spec: "kv-scaled L=1 B=3 N=16 H=2 D=16 dtype=int8 order=NHD",
        misalign: 0,
        unit: 8,
        k_lane_bytes: 8,
    },
    Shape {
        spec: "kv-scaled L=1 B=3 N=16 H=2 D=32 dtype=fp8_e5m2 order=HND",
        misalign: 0,
        unit: 8,
        k_lane_bytes: 8,
    },
    // D=12 int8 with its scale: 16-byte row starts, but 12-byte rows.
    Shape {
        spec: "kv-scaled L=1 B=3 N=16 H=2 D=12 dtype=int8 order=NHD",
        misalign: 0,
        unit: 4,
        k_lane_bytes: 0,
    },
    // Legacy vLLM: the key row is split in pieces of x elements (element by element).
    Shape {
        spec: "kv L=2 B=3 N=16 H=2 D=32 dtype=f16 tensor=vllm-paged-v1",
        misalign: 0,
        unit: 0,
        k_lane_bytes: 0,
    },
];

fn values(n: usize, salt: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (((i + salt) * 2_654_435_761) % 2003) as f32 / 1001.0 - 1.0)
        .collect()
}

/// The cache bytes after a `write_kv` of 20 tokens (two padding slots among them), and after
/// a `copy_blocks` of block 0 to 2 (and 1 onto itself), on buffers misaligned by `misalign`.
fn run<B: Backend>(be: &B, l: &KvCacheLayout, misalign: u64) -> [Vec<Vec<u8>>; 2] {
    let shapes: Vec<BufferShape> = BufferShape::exact(l)
        .into_iter()
        .map(|s| BufferShape { misalign, ..s })
        .collect();
    let mut cache = be.alloc_cache(l, &shapes).unwrap();
    let sentinel: Vec<Vec<u8>> = shapes.iter().map(|s| vec![0xa5; s.len as usize]).collect();
    be.upload_cache(&mut cache, &sentinel).unwrap();
    let (kw, vw) = l.content().kv_widths().unwrap();
    let h = l.geometry().num_kv_heads as usize;
    let slots: Vec<i64> = (0..20).map(|t| if t % 9 == 4 { -1 } else { t }).collect();
    let key = HostTensor::F32(values(slots.len() * h * kw as usize, 1));
    let value = HostTensor::F32(values(slots.len() * h * vw as usize, 2));
    let (key, value) = (
        be.upload_tensor(&key).unwrap(),
        be.upload_tensor(&value).unwrap(),
    );
    let w = WriteArgs {
        layer: l.geometry().num_layers - 1,
        key: &key,
        value: Some(&value),
        slot_mapping: &slots,
    };
    be.wait(be.write_kv(&mut cache, &w).unwrap()).unwrap();
    let written = be.download_cache(&cache).unwrap();
    let pairs = [(0, 2), (1, 1)];
    let done = be.move_blocks(None, &mut cache, &BlockMove::Copy(&pairs));
    be.wait(done.unwrap()).unwrap();
    [written, be.download_cache(&cache).unwrap()]
}

#[test]
fn every_row_unit_and_write_lane_width_on_both_builds() {
    let reference = Host::new("reference", ScalarReference);
    let mut units = BTreeSet::new();
    let mut lanes = BTreeSet::new();
    for s in SHAPES {
        let l: KvCacheLayout = s.spec.parse().unwrap();
        let k = l.field_map(Field::K).unwrap();
        assert_eq!(
            row_unit_bytes(&k, &k, s.misalign, s.misalign),
            s.unit,
            "{} at +{}: mover unit",
            s.spec,
            s.misalign
        );
        assert_eq!(
            write_lane_bytes(&k, s.misalign),
            s.k_lane_bytes,
            "{} at +{}: write lanes",
            s.spec,
            s.misalign
        );
        let want = run(&reference, &l, 0);
        for (name, be) in [
            ("cuda-emu", kvlayout_emu::cuda_emu()),
            ("hip-emu", kvlayout_emu::hip_emu()),
        ] {
            let got = run(&be, &l, s.misalign);
            assert!(
                got[0] == want[0],
                "{name} {} +{}: write_kv",
                s.spec,
                s.misalign
            );
            assert!(got[1] == want[1], "{name} {} +{}: copy", s.spec, s.misalign);
        }
        units.insert(s.unit);
        lanes.insert(s.k_lane_bytes);
    }
    assert_eq!(
        units,
        BTreeSet::from([0, 1, 2, 4, 8, 16]),
        "mover units run"
    );
    assert_eq!(lanes, BTreeSet::from([0, 8, 16]), "write lane widths run");
}
