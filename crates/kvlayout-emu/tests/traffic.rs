//! The traffic recorder on hand-made access patterns (`csrc/traffic_probe.cuh`), one block of
//! 64 threads: two warps of 32 (cuda-emu's build) or one wavefront of 64 (hip-emu's). Every
//! count below is worked out by hand from the pattern, per width. And on a real kernel: a
//! decode whose group fits one tile reads every K and V byte of the attended tokens once.

use kvlayout::ops::{Backend, BufferShape, DecodeArgs, DecodeParams, HostTensor};
use kvlayout::{DType, KvCacheLayout};
use kvlayout_device::kernels::Kernel;
use kvlayout_device::DeviceBackend;
use kvlayout_emu::{EmuDevice, TrafficKind, TrafficReport};

const THREADS: u32 = 64;

fn probe(warp: u32, pattern: i32) -> TrafficReport {
    EmuDevice::new(warp)
        .unwrap()
        .traffic_probe(pattern, THREADS)
        .unwrap()
}

/// requests, lane accesses, bytes, useful bytes, sectors, lines, unique sectors, unique lines.
fn kind(c: [u64; 8]) -> TrafficKind {
    TrafficKind {
        requests: c[0],
        lane_accesses: c[1],
        bytes: c[2],
        useful_bytes: c[3],
        sectors: c[4],
        lines: c[5],
        unique_sectors: c[6],
        unique_lines: c[7],
    }
}

fn other_loads(k: TrafficKind, load_epochs: u64) -> TrafficReport {
    TrafficReport {
        other_loads: k,
        load_epochs,
        blocks: 1,
        ..TrafficReport::default()
    }
}

fn copies(k: TrafficKind, load_epochs: u64) -> TrafficReport {
    TrafficReport {
        cache_loads: k,
        cache_stores: k,
        load_epochs,
        blocks: 1,
        ..TrafficReport::default()
    }
}

/// Thread t loads float t: a warp of 32 asks for 128 aligned bytes (4 sectors, 1 line), a
/// wavefront of 64 for 256 (8 sectors, 2 lines). Full sectors.
#[test]
fn unit_stride() {
    let w32 = other_loads(kind([2, 64, 256, 256, 8, 2, 8, 2]), 2);
    let w64 = other_loads(kind([1, 64, 256, 256, 8, 2, 8, 2]), 1);
    assert_eq!(probe(32, 0), w32);
    assert_eq!(probe(64, 0), w64);
    assert_eq!(probe(32, 0).other_loads.sector_efficiency(), 1.0);
}

/// Thread t loads float 2t: a warp of 32 spans 256 bytes (8 sectors, 2 lines) for 128 useful.
#[test]
fn stride_two() {
    assert_eq!(
        probe(32, 1),
        other_loads(kind([2, 64, 256, 256, 16, 4, 16, 4]), 2)
    );
    assert_eq!(
        probe(64, 1),
        other_loads(kind([1, 64, 256, 256, 16, 4, 16, 4]), 1)
    );
    assert_eq!(probe(32, 1).other_loads.sector_efficiency(), 0.5);
}

/// 16-byte copies: a warp of 32 loads 512 contiguous bytes (16 sectors, 4 lines) and stores
/// as many 64 KiB further on.
#[test]
fn sixteen_byte_vectors() {
    let w32 = copies(kind([2, 64, 1024, 1024, 32, 8, 32, 8]), 2);
    let w64 = copies(kind([1, 64, 1024, 1024, 32, 8, 32, 8]), 1);
    assert_eq!(probe(32, 2), w32);
    assert_eq!(probe(64, 2), w64);
    assert_eq!(probe(32, 2).cache_loads.sector_bytes_per_request(), 512.0);
}

/// A gather: each lane loads 4 bytes of its own sector (lanes permuted): W sectors and W / 4
/// lines per request, 1/8 of each sector used.
#[test]
fn gather() {
    assert_eq!(
        probe(32, 3),
        other_loads(kind([2, 64, 256, 256, 64, 16, 64, 16]), 2)
    );
    assert_eq!(
        probe(64, 3),
        other_loads(kind([1, 64, 256, 256, 64, 16, 64, 16]), 1)
    );
    assert_eq!(probe(64, 3).other_loads.sector_efficiency(), 0.125);
}

/// Every lane loads float 0: 4 useful bytes per request, one sector; one over the launch.
#[test]
fn broadcast() {
    assert_eq!(
        probe(32, 4),
        other_loads(kind([2, 64, 256, 8, 2, 2, 1, 1]), 2)
    );
    assert_eq!(
        probe(64, 4),
        other_loads(kind([1, 64, 256, 4, 1, 1, 1, 1]), 1)
    );
}

/// Stores count as stores, and no load epoch.
#[test]
fn unit_stride_store() {
    let w32 = TrafficReport {
        other_stores: kind([2, 64, 256, 256, 8, 2, 8, 2]),
        blocks: 1,
        ..TrafficReport::default()
    };
    assert_eq!(probe(32, 5), w32);
}

/// Four copies from one call site are four requests per warp (one per occurrence); with no
/// rendezvous between them they share one epoch (4 requests per epoch), with a barrier after
/// each they take four (1 per epoch).
#[test]
fn iterations_and_epochs() {
    let w32 = kind([8, 256, 1024, 1024, 32, 8, 32, 8]);
    let w64 = kind([4, 256, 1024, 1024, 32, 8, 32, 8]);
    assert_eq!(probe(32, 6), copies(w32, 2));
    assert_eq!(probe(64, 6), copies(w64, 1));
    assert_eq!(probe(32, 7), copies(w32, 8));
    assert_eq!(probe(64, 7), copies(w64, 4));
    assert_eq!(probe(32, 6).load_requests_per_epoch(), 4.0);
    assert_eq!(probe(64, 7).load_requests_per_epoch(), 1.0);
}

/// Unit stride 4 bytes off alignment: bytes [4, 132) and [132, 260) take 5 sectors and 2
/// lines each; 9 sectors and 3 lines over the launch.
#[test]
fn misaligned_unit_stride() {
    assert_eq!(
        probe(32, 8),
        other_loads(kind([2, 64, 256, 256, 10, 4, 9, 3]), 2)
    );
    assert_eq!(
        probe(64, 8),
        other_loads(kind([1, 64, 256, 256, 9, 3, 9, 3]), 1)
    );
}

/// A 16-byte load the kernel makes itself, stated with `KVL_CACHE_LOAD`: as the copy's loads;
/// each lane then stores one float (unit stride, 64 KiB on).
#[test]
fn stated_vector_load() {
    let w32 = TrafficReport {
        cache_loads: kind([2, 64, 1024, 1024, 32, 8, 32, 8]),
        other_stores: kind([2, 64, 256, 256, 8, 2, 8, 2]),
        load_epochs: 2,
        blocks: 1,
        ..TrafficReport::default()
    };
    assert_eq!(probe(32, 9), w32);
}

/// Without `with_traffic` nothing is recorded; an unknown pattern traps.
#[test]
fn off_by_default_and_unknown_pattern() {
    let be = kvlayout_emu::cuda_emu();
    let l: KvCacheLayout = "kv B=3 N=16 H=4 D=8 dtype=f16 order=HND".parse().unwrap();
    let mut cache = be.alloc_cache(&l, &BufferShape::exact(&l)).unwrap();
    be.wait(be.copy_blocks(&mut cache, &[(0, 2)]).unwrap())
        .unwrap();
    assert!(be.device().take_traffic().is_empty());
    let err = EmuDevice::new(32)
        .unwrap()
        .traffic_probe(99, 32)
        .unwrap_err();
    assert!(err.0.contains("trapped"), "{err}");
}

/// The traffic report tool records one sequence and scales: two sequences of the same length
/// on other blocks make exactly twice the counts of one, distinct sectors included.
#[test]
fn decode_counts_scale_with_the_batch() {
    let be = DeviceBackend::new(EmuDevice::new(32).unwrap().with_traffic());
    let l: KvCacheLayout = "kv B=8 N=16 H=2 D=32 dtype=bf16 order=HND".parse().unwrap();
    let cache = be.alloc_cache(&l, &BufferShape::exact(&l)).unwrap();
    let run = |table: &[i32], lens: &[u32]| {
        let n = lens.len() * 4 * 32;
        let query = be
            .upload_tensor(&HostTensor::from_f32(DType::Bf16, &vec![0.5; n]).unwrap())
            .unwrap();
        let mut out = be.alloc_tensor(DType::F32, n).unwrap();
        let args = DecodeArgs {
            layer: 0,
            query: &query,
            block_table: table,
            blocks_per_seq: 2,
            seq_lens: lens,
            params: DecodeParams {
                num_q_heads: 4,
                scale: 0.25,
                sliding_window: None,
                soft_cap: None,
            },
        };
        be.wait(be.paged_decode(&cache, &args, &mut out).unwrap())
            .unwrap();
        be.device().take_traffic()[0].report
    };
    let one = run(&[0, 1], &[30]);
    let two = run(&[0, 1, 2, 3], &[30, 30]);
    for (a, b) in one.kinds().into_iter().zip(two.kinds()) {
        assert_eq!(
            [
                2 * a.requests,
                2 * a.bytes,
                2 * a.useful_bytes,
                2 * a.sectors
            ],
            [b.requests, b.bytes, b.useful_bytes, b.sectors]
        );
    }
    assert_eq!(2 * one.load_epochs, two.load_epochs);
    assert_eq!(
        2 * one.cache_loads.unique_sectors,
        two.cache_loads.unique_sectors
    );
}

/// GQA 2 (one tile per KV head), NHD f16, B=3 H=3: the decode loads each attended token's K
/// and V rows of every KV head once: lens 20 + 5 tokens x 3 heads x (8 + 8) elements x 2
/// bytes. No cache store; the outputs are 2 sequences x 6 heads x 8 floats.
#[test]
fn decode_reads_each_row_once() {
    for warp in [32, 64] {
        let be = DeviceBackend::new(EmuDevice::new(warp).unwrap().with_traffic());
        let l: KvCacheLayout = "kv B=3 N=16 H=3 D=8 dtype=f16 order=NHD".parse().unwrap();
        let cache = be.alloc_cache(&l, &BufferShape::exact(&l)).unwrap();
        let query = HostTensor::from_f32(DType::F16, &[0.5; 2 * 6 * 8]).unwrap();
        let query = be.upload_tensor(&query).unwrap();
        let mut out = be.alloc_tensor(DType::F32, 2 * 6 * 8).unwrap();
        let args = DecodeArgs {
            layer: 0,
            query: &query,
            block_table: &[1, 0, 2, 2],
            blocks_per_seq: 2,
            seq_lens: &[20, 5],
            params: DecodeParams {
                num_q_heads: 6,
                scale: 0.25,
                sliding_window: None,
                soft_cap: None,
            },
        };
        assert!(
            be.device().take_traffic().is_empty(),
            "uploads launch nothing"
        );
        be.wait(be.paged_decode(&cache, &args, &mut out).unwrap())
            .unwrap();
        let t = be.device().take_traffic();
        assert_eq!(t.len(), 1, "one launch: a single pass");
        assert_eq!(t[0].kernel, Kernel::PagedDecode);
        let r = t[0].report;
        assert_eq!(r.cache_loads.useful_bytes, 25 * 3 * 16 * 2);
        assert!(r.cache_loads.unique_sector_bytes() >= 25 * 3 * 16 * 2);
        assert_eq!(r.cache_stores, TrafficKind::default());
        assert_eq!(r.other_stores.useful_bytes, 2 * 6 * 8 * 4);
        assert_eq!(r.blocks, 2 * 3);
    }
}
