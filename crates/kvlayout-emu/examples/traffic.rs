//! The memory-traffic report of the current kernels on the target configurations:
//! a Llama-3-8B layer (8 KV heads, 32 query heads, D = 128), bf16 and fp8 e4m3, NHD, HND and
//! vLLM's legacy paged layout, batches of 8 x 1024 and 32 x 4096 tokens; per kernel and
//! layout the sector efficiency, bytes read (or written) over the op's minimum, sector bytes
//! in flight per SM and the bandwidth model's expected fraction of HBM bandwidth on an H100
//! SXM and an H200 (`kvlayout_emu::model`: a tool to steer by, not a measurement).
//!
//! The decode is launched for the whole batch (its partitions depend on the batch size), and
//! the emulator runs and records only the first sequence's blocks (`with_run_grid_x(1)`: the
//! sequences are alike); the movers are recorded on 64 block pairs. The counts are scaled to
//! the full batch and the movers' grid to its full size, from which the model takes waves and
//! blocks per SM.
//!
//! `cargo run --release -p kvlayout-emu --example traffic`

use kvlayout::ops::{Backend, BufferShape, DecodeArgs, DecodeParams, HostTensor, WriteArgs};
use kvlayout::{DType, KvCacheLayout};
use kvlayout_device::kernels::Kernel;
use kvlayout_device::DeviceBackend;
use kvlayout_emu::model::{predict, Assumptions, DeviceSpec, H100_SXM, H200};
use kvlayout_emu::{EmuDevice, LaunchTraffic, TrafficKind, TrafficReport};

type Be = DeviceBackend<EmuDevice>;

const KV_HEADS: u64 = 8;
const Q_HEADS: u64 = 32;
const HEAD: u64 = 128;
const BLOCK_TOKENS: u64 = 16;
/// Blocks of the emulated cache: one sequence of 4096 tokens, and the movers' pairs.
const CACHE_BLOCKS: u64 = 512;
/// Block pairs the movers are recorded on.
const MOVE_PAIRS: u64 = 64;

/// A kernel's launches, counts summed, scaled to the full op.
struct Op {
    kernel: Kernel,
    traffic: LaunchTraffic,
    /// Bytes the op needs at least: each K/V byte once (none for the reduce).
    minimum: Option<u64>,
}

fn scale_kind(k: &TrafficKind, by: u64) -> TrafficKind {
    TrafficKind {
        requests: k.requests * by,
        lane_accesses: k.lane_accesses * by,
        bytes: k.bytes * by,
        useful_bytes: k.useful_bytes * by,
        sectors: k.sectors * by,
        lines: k.lines * by,
        unique_sectors: k.unique_sectors * by,
        unique_lines: k.unique_lines * by,
    }
}

fn add_kind(a: &TrafficKind, b: &TrafficKind) -> TrafficKind {
    TrafficKind {
        requests: a.requests + b.requests,
        lane_accesses: a.lane_accesses + b.lane_accesses,
        bytes: a.bytes + b.bytes,
        useful_bytes: a.useful_bytes + b.useful_bytes,
        sectors: a.sectors + b.sectors,
        lines: a.lines + b.lines,
        unique_sectors: a.unique_sectors + b.unique_sectors,
        unique_lines: a.unique_lines + b.unique_lines,
    }
}

/// The launches of `kernel` in `all`, summed (they share one configuration), their counts
/// multiplied by `by` and grid x by `grid_by`.
fn merged(all: &[LaunchTraffic], kernel: Kernel, by: u64, grid_by: u64) -> Option<LaunchTraffic> {
    let mut it = all.iter().filter(|t| t.kernel == kernel);
    let mut t = *it.next()?;
    for o in it {
        let (a, b) = (&mut t.report, &o.report);
        a.cache_loads = add_kind(&a.cache_loads, &b.cache_loads);
        a.cache_stores = add_kind(&a.cache_stores, &b.cache_stores);
        a.other_loads = add_kind(&a.other_loads, &b.other_loads);
        a.other_stores = add_kind(&a.other_stores, &b.other_stores);
        a.load_epochs += b.load_epochs;
        a.blocks += b.blocks;
    }
    let r = t.report;
    t.report = TrafficReport {
        cache_loads: scale_kind(&r.cache_loads, by),
        cache_stores: scale_kind(&r.cache_stores, by),
        other_loads: scale_kind(&r.other_loads, by),
        other_stores: scale_kind(&r.other_stores, by),
        load_epochs: r.load_epochs * by,
        blocks: r.blocks * by,
        ..r
    };
    t.config.grid.x *= grid_by as u32;
    Some(t)
}

fn bf16(values: usize) -> HostTensor {
    HostTensor::from_f32(DType::Bf16, &vec![0.25; values]).expect("bf16 activations")
}

/// `paged_decode` of `seqs` sequences of `len` tokens (all reading the same blocks) with
/// `q_heads` query heads, launched for the whole batch on `be` (which runs the first
/// sequence's blocks only), scaled to `seqs`.
fn decode(be: &Be, l: &KvCacheLayout, q_heads: u64, seqs: u64, len: u64) -> Vec<Op> {
    let cache = be.alloc_cache(l, &BufferShape::exact(l)).expect("cache");
    let kv_heads = l.geometry().num_kv_heads;
    let rows = (seqs * q_heads * HEAD) as usize;
    let query = be.upload_tensor(&bf16(rows)).unwrap();
    let mut out = be.alloc_tensor(DType::F32, rows).unwrap();
    let per_seq = (len / BLOCK_TOKENS) as i32;
    let table: Vec<i32> = (0..seqs as i32).flat_map(|_| 0..per_seq).collect();
    let lens = vec![len as u32; seqs as usize];
    let args = DecodeArgs {
        layer: 0,
        query: &query,
        block_table: &table,
        blocks_per_seq: per_seq as usize,
        seq_lens: &lens,
        params: DecodeParams {
            num_q_heads: q_heads,
            scale: 1.0 / (HEAD as f32).sqrt(),
            sliding_window: None,
            soft_cap: None,
        },
    };
    be.device().take_traffic();
    be.wait(be.paged_decode(&cache, &args, &mut out).unwrap())
        .unwrap();
    let all = be.device().take_traffic();
    let elem = l.dtype().size_bytes();
    let minimum = seqs * len * kv_heads * 2 * HEAD * elem;
    let mut ops = vec![];
    if let Some(t) = merged(&all, Kernel::PagedDecode, seqs, 1) {
        ops.push(Op {
            kernel: Kernel::PagedDecode,
            traffic: t,
            minimum: Some(minimum),
        });
    }
    if let Some(t) = merged(&all, Kernel::PagedDecodeReduce, seqs, 1) {
        ops.push(Op {
            kernel: Kernel::PagedDecodeReduce,
            traffic: t,
            minimum: None,
        });
    }
    ops
}

/// `write_kv` of one decode step's tokens (one per sequence), all recorded.
fn write(be: &Be, l: &KvCacheLayout, seqs: u64) -> Op {
    let mut cache = be.alloc_cache(l, &BufferShape::exact(l)).expect("cache");
    let n = (seqs * KV_HEADS * HEAD) as usize;
    let (key, value) = (
        be.upload_tensor(&bf16(n)).unwrap(),
        be.upload_tensor(&bf16(n)).unwrap(),
    );
    let slots: Vec<i64> = (0..seqs as i64).map(|s| s * 37).collect();
    let w = WriteArgs {
        layer: 0,
        key: &key,
        value: Some(&value),
        slot_mapping: &slots,
    };
    be.device().take_traffic();
    be.wait(be.write_kv(&mut cache, &w).unwrap()).unwrap();
    let t = merged(&be.device().take_traffic(), Kernel::WriteKv, 1, 1).expect("a write launch");
    let minimum = seqs * KV_HEADS * 2 * HEAD * l.dtype().size_bytes();
    Op {
        kernel: Kernel::WriteKv,
        traffic: t,
        minimum: Some(minimum),
    }
}

/// `copy_blocks` of every block of the batch (`pairs`), recorded on 64 pairs and scaled.
fn copy(be: &Be, l: &KvCacheLayout, pairs: u64) -> Op {
    let mut cache = be.alloc_cache(l, &BufferShape::exact(l)).expect("cache");
    let list: Vec<(u64, u64)> = (0..MOVE_PAIRS).map(|i| (i, i + MOVE_PAIRS)).collect();
    be.device().take_traffic();
    be.wait(be.copy_blocks(&mut cache, &list).unwrap()).unwrap();
    let by = pairs / MOVE_PAIRS;
    let t = merged(&be.device().take_traffic(), Kernel::MoveBlocks, by, by).expect("move launches");
    let minimum = pairs * BLOCK_TOKENS * KV_HEADS * 2 * HEAD * l.dtype().size_bytes();
    Op {
        kernel: Kernel::MoveBlocks,
        traffic: t,
        minimum: Some(minimum),
    }
}

/// Bytes the op moved of the cache over its minimum: loads, or stores for `write_kv`.
fn over_minimum(op: &Op) -> String {
    let r = &op.traffic.report;
    let moved = if op.kernel == Kernel::WriteKv {
        r.cache_stores.useful_bytes
    } else {
        r.cache_loads.useful_bytes
    };
    op.minimum
        .map_or("-".into(), |m| format!("{:.2}", moved as f64 / m as f64))
}

/// The decode as one op (its launches one after another): the minimum bytes over the time the
/// model gives each launch, each moving its requested sector bytes at its latency-bound
/// fraction of the bandwidth; as a fraction of HBM bandwidth per device.
fn op_row(ops: &[Op], layout: &str, batch: &str, devices: &[DeviceSpec]) -> String {
    let minimum = ops.iter().find_map(|o| o.minimum).unwrap_or(0) as f64;
    let fractions: Vec<String> = devices
        .iter()
        .map(|d| {
            let time: f64 = ops
                .iter()
                .map(|o| {
                    let r = &o.traffic.report;
                    let sector_bytes = 32.0
                        * [r.cache_loads, r.cache_stores, r.other_loads, r.other_stores]
                            .iter()
                            .map(|k| k.sectors as f64)
                            .sum::<f64>();
                    let p = predict(&o.traffic, d, &Assumptions::for_kernel(o.kernel));
                    sector_bytes / p.latency_fraction.max(1e-9)
                })
                .sum();
            format!("{:.2}", minimum / time)
        })
        .collect();
    format!(
        "| paged_decode op (both launches) | {layout} | {batch} | | | | | | {} |",
        fractions.join(" | ")
    )
}

fn row(op: &Op, layout: &str, batch: &str, devices: &[DeviceSpec]) -> String {
    let a = Assumptions::for_kernel(op.kernel);
    let p: Vec<_> = devices
        .iter()
        .map(|d| predict(&op.traffic, d, &a))
        .collect();
    let fractions: Vec<String> = p
        .iter()
        .map(|p| format!("{:.2}", p.fraction_of_hbm))
        .collect();
    format!(
        "| {} | {layout} | {batch} | {:.3} | {} | {:.1} | {:.0} / {:.0} | {} x {} | {} |",
        op.kernel.name(),
        p[0].sector_efficiency,
        over_minimum(op),
        p[0].requests_in_flight_per_warp,
        p[0].bytes_in_flight_per_sm,
        p[0].bytes_needed_per_sm,
        op.traffic.grid_blocks(),
        p[0].resident_blocks_per_sm,
        fractions.join(" | "),
    )
}

fn main() {
    let devices = [H100_SXM, H200];
    let device = || {
        EmuDevice::new(32)
            .expect("the warp-32 build")
            .with_traffic()
    };
    let sampled = DeviceBackend::new(device().with_run_grid_x(1));
    let be = DeviceBackend::new(device());
    println!(
        "Llama-3-8B layer (8 KV heads, 32 query heads, D = 128), cuda-emu build (warps of 32)."
    );
    println!("Recorded: the decode launched for the whole batch, its first sequence's blocks run; 64 block pairs for the movers; counts scaled to the batch.");
    println!("Model: {} and {} (kvlayout_emu::model; assumptions per kernel: Assumptions::for_kernel).\n", devices[0].name, devices[1].name);
    println!("| kernel | layout | batch | sector eff. | bytes / min | req. in flight / warp | B in flight / needed per SM (H100) | blocks x per SM | H100 | H200 |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for dtype in ["bf16", "fp8_e4m3"] {
        for (label, tail) in [
            ("NHD", "order=NHD"),
            ("HND", "order=HND"),
            ("vLLM legacy", "legacy=vllm-paged-v1"),
        ] {
            let spec = format!("kv L=1 B={CACHE_BLOCKS} N={BLOCK_TOKENS} H={KV_HEADS} D={HEAD} dtype={dtype} {tail}");
            let l: KvCacheLayout = spec.parse().expect("a valid layout");
            let layout = format!("{label} {dtype}");
            for (seqs, len) in [(8u64, 1024u64), (32, 4096)] {
                let batch = format!("{seqs} x {len}");
                let ops = decode(&sampled, &l, Q_HEADS, seqs, len);
                for op in &ops {
                    println!("{}", row(op, &layout, &batch, &devices));
                }
                println!("{}", op_row(&ops, &layout, &batch, &devices));
                if label != "vLLM legacy" {
                    // MHA: as many KV heads as query heads (Llama-2-7B's 32).
                    let mha = format!("kv L=1 B={CACHE_BLOCKS} N={BLOCK_TOKENS} H={Q_HEADS} D={HEAD} dtype={dtype} {tail}");
                    let mha: KvCacheLayout = mha.parse().expect("a valid layout");
                    let ops = decode(&sampled, &mha, Q_HEADS, seqs, len);
                    let layout = format!("{layout} MHA");
                    for op in &ops {
                        println!("{}", row(op, &layout, &batch, &devices));
                    }
                    println!("{}", op_row(&ops, &layout, &batch, &devices));
                }
                println!("{}", row(&write(&be, &l, seqs), &layout, &batch, &devices));
                let pairs = seqs * len / BLOCK_TOKENS;
                println!("{}", row(&copy(&be, &l, pairs), &layout, &batch, &devices));
            }
        }
    }
}
