//! A bandwidth model: from one launch's recorded traffic ([`LaunchTraffic`]) and a device
//! description ([`DeviceSpec`]), the expected fraction of the device's HBM bandwidth the
//! launch moves useful bytes at, by Little's law. A tool to steer kernel work by, not a
//! measurement: it knows the access pattern and the launch configuration, not the compiled
//! code, caches, clocks or DRAM scheduling.
//!
//! It lives beside the recorder because it consumes the recorder's counts and nothing else;
//! the device crates own real launches and know nothing of traffic. It does not own the
//! minimum bytes an op needs (the report tool computes that from the descriptor and the op).
//!
//! The arithmetic, per launch:
//! - resident blocks per SM = the least of the SM's block limit, threads / block threads,
//!   registers / (block threads x [`Assumptions::registers_per_thread`]) and shared memory /
//!   (block shared memory + the per-block reservation); allocation granularity is ignored;
//! - requests in flight per warp = the load requests a warp issues between two rendezvous,
//!   capped at [`Assumptions::max_requests_in_flight_per_warp`];
//! - bytes in flight per block = warps x that x sector bytes per load request x (all sector
//!   bytes / load sector bytes): stores are posted, they ride along with the loads;
//! - bytes that must be in flight on the device = bandwidth x latency;
//! - the grid runs in waves of SMs x resident blocks; wave k of b_k blocks runs at
//!   f_k = min(1, b_k x bytes in flight per block / needed), so the latency-bound fraction is
//!   sum(b_k) / sum(b_k / f_k) (a last, partial wave counts for its time);
//! - expected fraction of HBM bandwidth = that x sector efficiency (useful bytes over the
//!   bytes of the sectors requested, of the cache traffic, or of all traffic when a kernel
//!   does not touch the cache).

use kvlayout_device::kernels::Kernel;

use crate::traffic::{LaunchTraffic, TrafficKind, SECTOR_BYTES};

/// What the model needs of a GPU. Figures from the vendors' datasheets and programming or
/// tuning guides (named on each constant); the latency is an assumption, stated there.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeviceSpec {
    /// Name in reports.
    pub name: &'static str,
    /// Streaming multiprocessors (NVIDIA) or compute units (AMD).
    pub sms: u32,
    /// Peak HBM bandwidth, bytes per second.
    pub hbm_bytes_per_s: f64,
    /// Loaded DRAM latency assumed, seconds.
    pub latency_s: f64,
    /// Warp (wavefront) width.
    pub warp: u32,
    /// Most resident threads per SM.
    pub max_threads_per_sm: u32,
    /// Most resident blocks per SM.
    pub max_blocks_per_sm: u32,
    /// 32-bit registers per SM.
    pub registers_per_sm: u32,
    /// Shared memory (LDS) per SM, bytes.
    pub shared_bytes_per_sm: u32,
    /// Shared memory the hardware reserves per resident block, bytes.
    pub shared_reserved_per_block: u32,
}

/// NVIDIA H100 SXM5 80 GB. 132 SMs and 3.35 TB/s HBM3: NVIDIA H100 Tensor Core GPU
/// datasheet and the "NVIDIA H100 Tensor Core GPU Architecture" whitepaper. Per SM (compute
/// capability 9.0): 2048 threads, 32 blocks, 64 K registers, 228 KiB shared memory with
/// 1 KiB reserved per block: CUDA C++ Programming Guide, "Compute Capabilities" table, and
/// the NVIDIA Hopper Tuning Guide. Latency 600 ns assumed: pointer-chase measurements (Chips
/// and Cheese, "Nvidia's H100: Funny L2, and Tons of Bandwidth", 2023) put idle HBM latency
/// near half a microsecond, and queues under load add to it.
pub const H100_SXM: DeviceSpec = DeviceSpec {
    name: "H100 SXM",
    sms: 132,
    hbm_bytes_per_s: 3.35e12,
    latency_s: 600e-9,
    warp: 32,
    max_threads_per_sm: 2048,
    max_blocks_per_sm: 32,
    registers_per_sm: 65_536,
    shared_bytes_per_sm: 228 << 10,
    shared_reserved_per_block: 1 << 10,
};

/// NVIDIA H200 SXM 141 GB: the H100's GH100 die (132 SMs, the same per-SM limits) with
/// 4.8 TB/s HBM3e: NVIDIA H200 Tensor Core GPU datasheet. Latency as [`H100_SXM`]'s
/// (assumed).
pub const H200: DeviceSpec = DeviceSpec {
    name: "H200",
    hbm_bytes_per_s: 4.8e12,
    ..H100_SXM
};

/// AMD Instinct MI300X: 304 compute units, 5.3 TB/s HBM3: AMD Instinct MI300X data sheet.
/// Wavefronts of 64; per CU 4 SIMDs of up to 8 wavefronts (2048 work-items), 512 VGPRs per
/// SIMD lane (4 x 512 x 64 registers), 64 KiB LDS: AMD CDNA 3 ISA reference and the ROCm
/// "AMD Instinct MI300X workload optimization" guide. Latency 800 ns assumed (HBM behind the
/// Infinity Fabric and a 256 MB Infinity Cache is slower to reach than on H100).
pub const MI300X: DeviceSpec = DeviceSpec {
    name: "MI300X",
    sms: 304,
    hbm_bytes_per_s: 5.3e12,
    latency_s: 800e-9,
    warp: 64,
    max_threads_per_sm: 2048,
    max_blocks_per_sm: 32,
    registers_per_sm: 4 * 512 * 64,
    shared_bytes_per_sm: 64 << 10,
    shared_reserved_per_block: 0,
};

/// What the model assumes of the compiled kernel: stated, not measured (no `ptxas` here).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Assumptions {
    /// 32-bit registers per thread.
    pub registers_per_thread: u32,
    /// Most independent load requests a warp has in flight: the compiler hoists the loads of
    /// an unrolled loop ahead of their uses, about this many deep.
    pub max_requests_in_flight_per_warp: f64,
}

impl Default for Assumptions {
    /// 64 registers per thread (the decode's accumulators for a tile of 8 heads), 4 requests
    /// in flight per warp.
    fn default() -> Self {
        Assumptions {
            registers_per_thread: 64,
            max_requests_in_flight_per_warp: 4.0,
        }
    }
}

impl Assumptions {
    /// The stated estimate for one of the project's kernels: 64 registers for `paged_decode`
    /// (a tile's 8 dot products and 8 accumulators per thread besides the addressing), 32 for
    /// the reduce, `write_kv` and the movers; 4 requests in flight per warp for all.
    pub fn for_kernel(kernel: Kernel) -> Self {
        let registers_per_thread = match kernel {
            Kernel::PagedDecode => 64,
            Kernel::PagedDecodeReduce | Kernel::WriteKv | Kernel::MoveBlocks => 32,
        };
        Assumptions {
            registers_per_thread,
            ..Assumptions::default()
        }
    }
}

/// What limits the resident blocks of an SM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// The SM's block limit.
    Blocks,
    /// Threads.
    Threads,
    /// Registers.
    Registers,
    /// Shared memory.
    SharedMemory,
}

/// The model's prediction for one launch on one device.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prediction {
    /// Blocks an SM holds at once (at least 1).
    pub resident_blocks_per_sm: u32,
    /// What caps them.
    pub limited_by: Limit,
    /// Grid blocks over SMs x resident blocks.
    pub waves: f64,
    /// Load requests in flight per warp (capped).
    pub requests_in_flight_per_warp: f64,
    /// Sector bytes in flight per SM in the first wave.
    pub bytes_in_flight_per_sm: f64,
    /// Sector bytes each SM must keep in flight for the full bandwidth.
    pub bytes_needed_per_sm: f64,
    /// Useful bytes over requested sector bytes.
    pub sector_efficiency: f64,
    /// The fraction of the bandwidth the launch's bytes in flight sustain, over its waves.
    pub latency_fraction: f64,
    /// Expected fraction of HBM bandwidth carrying useful bytes.
    pub fraction_of_hbm: f64,
}

/// Resident blocks per SM of `threads` threads and `shared` bytes of shared memory each, and
/// what caps them (at least 1: a launch that fits no SM does not launch at all).
pub fn resident_blocks(
    device: &DeviceSpec,
    threads: u32,
    shared: u64,
    registers_per_thread: u32,
) -> (u32, Limit) {
    let threads = threads.div_ceil(device.warp).max(1) * device.warp;
    let mut best = (device.max_blocks_per_sm, Limit::Blocks);
    let mut cap = |n: u64, why: Limit| {
        if n < u64::from(best.0) {
            best = (n as u32, why);
        }
    };
    cap(
        u64::from(device.max_threads_per_sm / threads),
        Limit::Threads,
    );
    let regs = u64::from(threads) * u64::from(registers_per_thread);
    if let Some(n) = u64::from(device.registers_per_sm).checked_div(regs) {
        cap(n, Limit::Registers);
    }
    if shared > 0 {
        let per_block = shared + u64::from(device.shared_reserved_per_block);
        cap(
            u64::from(device.shared_bytes_per_sm) / per_block,
            Limit::SharedMemory,
        );
    }
    (best.0.max(1), best.1)
}

/// The traffic whose sector efficiency counts: the cache's loads and stores, or all traffic
/// when the kernel does not touch the cache.
fn primary(t: &LaunchTraffic) -> TrafficKind {
    let r = &t.report;
    let mut k = TrafficKind::default();
    let kinds = if r.cache_loads.requests + r.cache_stores.requests > 0 {
        vec![&r.cache_loads, &r.cache_stores]
    } else {
        r.kinds().to_vec()
    };
    for x in kinds {
        k.useful_bytes += x.useful_bytes;
        k.sectors += x.sectors;
    }
    k
}

/// The model's prediction for `launch` on `device` under `assumptions`.
pub fn predict(
    launch: &LaunchTraffic,
    device: &DeviceSpec,
    assumptions: &Assumptions,
) -> Prediction {
    let r = &launch.report;
    let (resident, limited_by) = resident_blocks(
        device,
        launch.config.block.x,
        launch.shared_bytes_per_block(),
        assumptions.registers_per_thread,
    );
    let load_requests = r.cache_loads.requests + r.other_loads.requests;
    let load_sector_bytes = (r.cache_loads.sectors + r.other_loads.sectors) * SECTOR_BYTES;
    let all_sector_bytes = r.total().sectors * SECTOR_BYTES;
    let in_flight = r
        .load_requests_per_epoch()
        .min(assumptions.max_requests_in_flight_per_warp);
    let per_block = if load_requests == 0 || load_sector_bytes == 0 {
        0.0
    } else {
        f64::from(launch.warps_per_block())
            * in_flight
            * (load_sector_bytes as f64 / load_requests as f64)
            * (all_sector_bytes as f64 / load_sector_bytes as f64)
    };
    let blocks = launch.grid_blocks();
    let slots = u64::from(device.sms) * u64::from(resident);
    let needed = device.hbm_bytes_per_s * device.latency_s;
    let latency_fraction = wave_fraction(blocks, slots, per_block, needed);
    let first_wave = blocks.min(slots) as f64 / f64::from(device.sms);
    let sector_efficiency = primary(launch).sector_efficiency();
    Prediction {
        resident_blocks_per_sm: resident,
        limited_by,
        waves: blocks as f64 / slots as f64,
        requests_in_flight_per_warp: in_flight,
        bytes_in_flight_per_sm: first_wave * per_block,
        bytes_needed_per_sm: needed / f64::from(device.sms),
        sector_efficiency,
        latency_fraction,
        fraction_of_hbm: latency_fraction * sector_efficiency,
    }
}

/// sum(b_k) / sum(b_k / f_k) over the waves of `blocks` blocks in `slots` at a time, each
/// wave at f_k = min(1, b_k x `per_block` / `needed`); 0 when nothing is in flight.
pub fn wave_fraction(blocks: u64, slots: u64, per_block: f64, needed: f64) -> f64 {
    if blocks == 0 || slots == 0 || per_block <= 0.0 {
        return 0.0;
    }
    let wave = |b: u64| (b as f64 * per_block / needed).min(1.0);
    let (full, last) = (blocks / slots, blocks % slots);
    let mut time = full as f64 * slots as f64 / wave(slots);
    if last > 0 {
        time += last as f64 / wave(last);
    }
    blocks as f64 / time
}
