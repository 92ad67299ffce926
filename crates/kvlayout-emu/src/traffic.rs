//! Memory-traffic reports of emulated launches (`kernels-cuda/emu/kvl_emu_traffic.h`): the C
//! image the recorder fills, and what follows from it per launch (sector efficiency, bytes per
//! request, requests a warp can have in flight). A test-time option of [`EmuDevice`]
//! ([`EmuDevice::with_traffic`]); the device-level prediction is [`crate::model`]'s.
//!
//! It owns the counts and their arithmetic; it does not own the minimum bytes an op needs
//! (the caller knows the op) or the device (the model's).
//!
//! [`EmuDevice`]: crate::EmuDevice
//! [`EmuDevice::with_traffic`]: crate::EmuDevice::with_traffic

use kvlayout_device::kernels::{Kernel, LaunchConfig};

/// Bytes of a DRAM sector, the unit a GPU's L2 fetches from HBM.
pub const SECTOR_BYTES: u64 = 32;
/// Bytes of a cache line (four sectors).
pub const LINE_BYTES: u64 = 128;

/// The counts of one kind of access over a launch (`kvl_emu_traffic_kind`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TrafficKind {
    /// Warp requests: the accesses the lanes of one warp make at one call site in one
    /// occurrence (the same program point in the same iteration).
    pub requests: u64,
    /// Accesses of single lanes.
    pub lane_accesses: u64,
    /// Bytes the lanes asked for (a byte two lanes read counts twice).
    pub bytes: u64,
    /// Distinct bytes per request, summed over requests.
    pub useful_bytes: u64,
    /// Distinct 32-byte sectors per request, summed over requests.
    pub sectors: u64,
    /// Distinct 128-byte lines per request, summed over requests.
    pub lines: u64,
    /// Distinct sectors over the launch.
    pub unique_sectors: u64,
    /// Distinct lines over the launch.
    pub unique_lines: u64,
}

impl TrafficKind {
    /// Useful bytes over the bytes of the sectors the requests touch (1 when no request).
    pub fn sector_efficiency(&self) -> f64 {
        if self.sectors == 0 {
            return 1.0;
        }
        self.useful_bytes as f64 / (self.sectors * SECTOR_BYTES) as f64
    }

    /// Sector bytes a request moves, on average (0 when no request).
    pub fn sector_bytes_per_request(&self) -> f64 {
        if self.requests == 0 {
            return 0.0;
        }
        (self.sectors * SECTOR_BYTES) as f64 / self.requests as f64
    }

    /// Useful bytes a request moves, on average (0 when no request).
    pub fn useful_bytes_per_request(&self) -> f64 {
        if self.requests == 0 {
            return 0.0;
        }
        self.useful_bytes as f64 / self.requests as f64
    }

    /// Bytes of the distinct sectors touched over the launch: what must cross from DRAM at
    /// least once.
    pub fn unique_sector_bytes(&self) -> u64 {
        self.unique_sectors * SECTOR_BYTES
    }
}

/// One launch's memory traffic (`kvl_emu_traffic`): loads and stores of the cache buffers and
/// of everything else (activations, outputs, partials, block table, slot mapping, pairs).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TrafficReport {
    /// Loads of the cache buffers (`kvl_at_c`, the movers' sources).
    pub cache_loads: TrafficKind,
    /// Stores into the cache buffers (`kvl_at`, the movers' destinations).
    pub cache_stores: TrafficKind,
    /// Loads of other global memory (`kvl_act`, `kvl_ld`).
    pub other_loads: TrafficKind,
    /// Stores into other global memory (`kvl_st`).
    pub other_stores: TrafficKind,
    /// (warp, epoch) pairs with at least one load request (cache or other); an epoch is the
    /// part of a warp's run between two rendezvous (barrier, shuffle, ballot).
    pub load_epochs: u64,
    /// The most static shared memory a thread had declared, bytes.
    pub static_shared_bytes: u64,
    /// Blocks that made at least one access.
    pub blocks: u64,
}

impl TrafficReport {
    /// Load requests (cache and other) one warp issues between two rendezvous, on average:
    /// the requests it may have in flight at once, before the compiler's and the hardware's
    /// limits ([`crate::model::Assumptions::max_requests_in_flight_per_warp`]). 0 without
    /// loads.
    pub fn load_requests_per_epoch(&self) -> f64 {
        if self.load_epochs == 0 {
            return 0.0;
        }
        (self.cache_loads.requests + self.other_loads.requests) as f64 / self.load_epochs as f64
    }

    /// Useful bytes read from the cache buffers.
    pub fn cache_bytes_read(&self) -> u64 {
        self.cache_loads.useful_bytes
    }

    /// Every kind, in the C order (cache loads, cache stores, other loads, other stores).
    pub fn kinds(&self) -> [&TrafficKind; 4] {
        [
            &self.cache_loads,
            &self.cache_stores,
            &self.other_loads,
            &self.other_stores,
        ]
    }

    /// All kinds summed (the unique counts add up kinds, which touch different bytes).
    pub fn total(&self) -> TrafficKind {
        let mut t = TrafficKind::default();
        for k in self.kinds() {
            t.requests += k.requests;
            t.lane_accesses += k.lane_accesses;
            t.bytes += k.bytes;
            t.useful_bytes += k.useful_bytes;
            t.sectors += k.sectors;
            t.lines += k.lines;
            t.unique_sectors += k.unique_sectors;
            t.unique_lines += k.unique_lines;
        }
        t
    }
}

/// A recorded launch: which kernel, its configuration, the warp width, its traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchTraffic {
    /// The kernel.
    pub kernel: Kernel,
    /// Its grid, block and dynamic shared memory.
    pub config: LaunchConfig,
    /// Warp width of the build that ran it.
    pub warp: u32,
    /// What its accesses were.
    pub report: TrafficReport,
}

impl LaunchTraffic {
    /// Blocks of the grid.
    pub fn grid_blocks(&self) -> u64 {
        let g = self.config.grid;
        u64::from(g.x) * u64::from(g.y) * u64::from(g.z)
    }

    /// Warps per block.
    pub fn warps_per_block(&self) -> u32 {
        self.config.block.x.div_ceil(self.warp)
    }

    /// Shared memory per block, static and dynamic, bytes.
    pub fn shared_bytes_per_block(&self) -> u64 {
        u64::from(self.config.dyn_shared_bytes) + self.report.static_shared_bytes
    }
}
