//! GQA groups as real models have them, on both emulated builds against the scalar reference:
//! groups above the decode's group tile that are not a multiple of it (12 as Command R+'s 96
//! query heads over 8 KV heads, 20), exact multiples (16), and tiles forced below the group by
//! a small shared-memory target (`EmuDevice::with_shared_bytes`: MLA's 576-wide rows in tiles
//! of 3). Each run states the launch shape it takes (single pass or partitions and a
//! reduction; tile equal to the group, below it in whole tiles, or below it with a ragged last
//! tile), and the test fails unless every shape ran on both builds.

mod common;

use std::collections::BTreeSet;

use common::zeroed_cache;
use kvlayout::ops::{Backend, DecodeArgs, DecodeParams, DecodeShape, HostTensor, WriteArgs};
use kvlayout::{DType, KvCacheLayout};
use kvlayout_cpu::reference::paged_decode_magnitudes;
use kvlayout_cpu::tolerance::{decode_error, Tolerance};
use kvlayout_cpu::{Activations, CacheRef, Decode, Host, ScalarReference};
use kvlayout_device::kernels::{decode_plan, CacheAddrs, DecodeLaunch};
use kvlayout_device::{Device, DeviceBackend};
use kvlayout_emu::{EmuDevice, HIP_EMU_SEED};

fn values(n: usize, salt: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (((i + salt) * 2_654_435_761) % 2003) as f32 / 2003.0 - 0.5)
        .collect()
}

/// One layout and decode: the layout, `(K width, V width)`, whether V is K's prefix (MLA).
struct Case {
    spec: &'static str,
    widths: (usize, usize),
    mla: bool,
}

/// Sequence lengths: partitioned (600: over one partition, and the grid is far below the
/// device's SMs) or one pass (120: under two partition granules), an empty sequence, and a
/// last sequence that is not empty (a tile reading past its KV head's query rows reads past
/// the query tensor there, which the emulator refuses).
const LENS_LONG: [u32; 3] = [600, 0, 37];
const LENS_SHORT: [u32; 3] = [120, 0, 37];

/// The cache bytes after writing the sequences' tokens, and the decode output.
fn run<B: Backend>(
    be: &B,
    c: &Case,
    l: &KvCacheLayout,
    lens: &[u32],
    table: &[i32],
    params: DecodeParams,
) -> (Vec<Vec<u8>>, Vec<f32>) {
    let (d, dv) = c.widths;
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
    let key = HostTensor::F32(values(slots.len() * h * d, 1));
    let key = be.upload_tensor(&key).unwrap();
    let value = (!c.mla).then(|| {
        let v = HostTensor::F32(values(slots.len() * h * dv, 2));
        be.upload_tensor(&v).unwrap()
    });
    let w = WriteArgs {
        layer: 0,
        key: &key,
        value: value.as_ref(),
        slot_mapping: &slots,
    };
    be.wait(be.write_kv(&mut cache, &w).unwrap()).unwrap();
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
    let done = be.paged_decode(&cache, &args, &mut out);
    let done = done.unwrap_or_else(|e| panic!("{} x{q_heads}: paged_decode: {e}", c.spec));
    be.wait(done).unwrap();
    (
        be.download_cache(&cache).unwrap(),
        be.download_tensor(&out).unwrap().to_f32(),
    )
}

/// The launch shape a plan takes, as the table of `design/kernels.md` names it.
fn shape_of(plan: &DecodeLaunch, group: u64) -> (&'static str, &'static str) {
    let pass = if plan.reduce.is_some() {
        "partitions+reduce"
    } else {
        "single pass"
    };
    let tile = u64::from(plan.group_tile);
    let tiles = if tile == group {
        "tile = group"
    } else if group.is_multiple_of(tile) {
        "tile < group, whole tiles"
    } else {
        "tile < group, ragged last tile"
    };
    (pass, tiles)
}

/// The emulated builds, each at its own target and at a small shared-memory limit.
fn devices(small_shared: u32) -> Vec<(String, EmuDevice)> {
    let cuda = || EmuDevice::new(32).unwrap();
    let hip = || EmuDevice::new(64).unwrap().with_seed(HIP_EMU_SEED);
    vec![
        ("cuda-emu".into(), cuda()),
        ("hip-emu".into(), hip()),
        (
            format!("cuda-emu shared={small_shared}"),
            cuda().with_shared_bytes(small_shared),
        ),
        (
            format!("hip-emu shared={small_shared}"),
            hip().with_shared_bytes(small_shared),
        ),
    ]
}

/// Every device against the reference on one case, group and length set; the shapes run,
/// by warp width.
fn check(c: &Case, q_heads: u64, lens: &[u32], small_shared: u32, hit: &mut Shapes) {
    let reference = Host::new("reference", ScalarReference);
    let l: KvCacheLayout = c.spec.parse().unwrap();
    let (d, dv) = c.widths;
    let params = DecodeParams {
        num_q_heads: q_heads,
        scale: 1.0 / (d as f32).sqrt(),
        sliding_window: None,
        soft_cap: Some(30.0),
    };
    // 40 blocks a row, scattered; the last sequence takes the 40 blocks the first does not.
    let row_of = [0, 2, 1];
    let table: Vec<i32> = (0..3 * 40)
        .map(|i: i32| ((row_of[i as usize / 40] * 40 + i % 40) * 7) % 80)
        .collect();
    let (want_bytes, want) = run(&reference, c, &l, lens, &table, params);
    let refs: Vec<&[u8]> = want_bytes.iter().map(|b| b.as_slice()).collect();
    let cache = CacheRef::new(&l, refs).unwrap();
    let q = values(lens.len() * q_heads as usize * d, 3);
    let q16: Vec<half::f16> = q.iter().map(|&x| half::f16::from_f32(x)).collect();
    let dec = Decode {
        layer: 0,
        query: Activations::F16(&q16),
        block_table: &table,
        blocks_per_seq: 40,
        seq_lens: lens,
        params,
    };
    let mut out = vec![0f32; want.len()];
    let mags = paged_decode_magnitudes(&cache, &dec, &mut out).unwrap();
    let group = q_heads / l.geometry().num_kv_heads;
    let shape = DecodeShape {
        seqs: lens.len(),
        q_heads: q_heads as usize,
        group: group as usize,
        qk_width: d,
        v_width: dv,
    };
    for (name, dev) in devices(small_shared) {
        // Buffer bases pick the row paths only, not the passes or tiles this test names.
        let addrs = CacheAddrs {
            layout: &l,
            bases: [0, 0],
        };
        let plan = decode_plan(&dev.target(), &addrs, &shape, lens, &params)
            .unwrap()
            .unwrap();
        let (pass, tiles) = shape_of(&plan, group);
        hit.insert((dev.warp_size(), pass, tiles));
        let be = DeviceBackend::new(dev);
        let (bytes, got) = run(&be, c, &l, lens, &table, params);
        let what = format!(
            "{name} {} group {group} (tile {}, {pass})",
            c.spec, plan.group_tile
        );
        assert!(bytes == want_bytes, "{what}: written bytes differ");
        let e = decode_error(&got, &want, &mags, Tolerance::F32_PRODUCTS);
        assert!(
            e.passed(),
            "{what}: {:.3} x the bound at {:?}",
            e.ratio,
            e.worst
        );
    }
}

type Shapes = BTreeSet<(u32, &'static str, &'static str)>;

const KV1: Case = Case {
    spec: "kv B=80 N=16 H=1 D=32 dtype=bf16 order=NHD",
    widths: (32, 32),
    mla: false,
};
const KV2: Case = Case {
    spec: "kv B=80 N=16 H=2 D=32 dtype=f16 order=HND",
    widths: (32, 32),
    mla: false,
};
const MLA: Case = Case {
    spec: "mla B=80 N=16 rank=512 rope=64 dtype=bf16 order=NHD",
    widths: (576, 512),
    mla: true,
};

#[test]
fn groups_above_the_tile_on_both_builds() {
    let mut hit = Shapes::new();
    // 8 KiB: query rows of 32 and 512 logits fit 3 heads a block.
    for lens in [&LENS_LONG[..], &LENS_SHORT[..]] {
        check(&KV1, 12, lens, 8 << 10, &mut hit); // Command R+'s group: tiles 8 + 4
        check(&KV1, 20, lens, 8 << 10, &mut hit); // 8 + 8 + 4
        check(&KV2, 24, lens, 8 << 10, &mut hit); // group 12 over 2 KV heads
        check(&KV2, 32, lens, 8 << 10, &mut hit); // group 16: two whole tiles
        check(&KV2, 4, lens, 8 << 10, &mut hit); // group 4: one tile (3 + 1 at 8 KiB)
    }
    for warp in [32, 64] {
        for pass in ["single pass", "partitions+reduce"] {
            for tiles in [
                "tile = group",
                "tile < group, whole tiles",
                "tile < group, ragged last tile",
            ] {
                assert!(
                    hit.contains(&(warp, pass, tiles)),
                    "warps of {warp}: no run with {pass}, {tiles} (ran {hit:?})"
                );
            }
        }
    }
}

/// MLA: 16 query heads of 576-wide rows; 16 KiB of shared memory fits tiles of 3 (the last
/// of one head), 12 heads are four whole tiles.
#[test]
fn mla_tiles_forced_below_the_group() {
    let mut hit = Shapes::new();
    check(&MLA, 16, &LENS_LONG, 16 << 10, &mut hit);
    check(&MLA, 12, &LENS_SHORT, 16 << 10, &mut hit);
    for warp in [32, 64] {
        for tiles in [
            "tile < group, whole tiles",
            "tile < group, ragged last tile",
        ] {
            assert!(
                hit.iter().any(|&(w, _, t)| w == warp && t == tiles),
                "warps of {warp}: no MLA run with {tiles} ({hit:?})"
            );
        }
    }
}
