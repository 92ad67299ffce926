//! The C entry points of the emulated kernel builds (`csrc/emu_entry.h`) and the one safe
//! function that calls them. The only `unsafe` of the crate is here.

use std::ffi::{c_char, CStr};

use kvlayout_device::kernels::{Kernel, LaunchConfig};

use crate::traffic::TrafficReport;

/// Regions a launch may touch through the cache accessors (`KVL_EMU_MAX_REGIONS`).
pub(crate) const MAX_REGIONS: usize = 8;

/// `kvl_emu_region`: `len` bytes at address `base`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Region {
    /// Address.
    pub(crate) base: u64,
    /// Bytes.
    pub(crate) len: u64,
}

/// `kvl_emu_launch`: a launch configuration, its limits and its memory regions.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct EmuLaunch {
    grid: [u32; 3],
    block: [u32; 3],
    dyn_shared_bytes: u32,
    shared_limit_bytes: u32,
    seed: u64,
    regions: [Region; MAX_REGIONS],
    n_regions: u64,
    traffic: *mut TrafficReport,
    /// Blocks at x index at or past it are skipped (0: none): traffic sampling only.
    pub(crate) run_grid_x: u64,
}

impl EmuLaunch {
    /// `config` with `shared_limit` bytes of shared memory per block, fibers resumed in the
    /// order `seed` picks (0: thread order), cache accesses confined to `regions`.
    pub(crate) fn new(
        config: &LaunchConfig,
        shared_limit: u32,
        seed: u64,
        regions: &[Region],
    ) -> Result<Self, String> {
        if regions.len() > MAX_REGIONS {
            return Err(format!(
                "{} memory regions, the emulator takes {MAX_REGIONS}",
                regions.len()
            ));
        }
        let mut r = [Region { base: 0, len: 0 }; MAX_REGIONS];
        r[..regions.len()].copy_from_slice(regions);
        Ok(EmuLaunch {
            grid: [config.grid.x, config.grid.y, config.grid.z],
            block: [config.block.x, config.block.y, config.block.z],
            dyn_shared_bytes: config.dyn_shared_bytes,
            shared_limit_bytes: shared_limit,
            seed,
            regions: r,
            n_regions: regions.len() as u64,
            traffic: std::ptr::null_mut(),
            run_grid_x: 0,
        })
    }
}

/// `kvl_<build>_traffic_probe(pattern, threads, len, out, err, err_len)`.
type ProbeFn = unsafe extern "C" fn(i32, u32, u64, *mut TrafficReport, *mut c_char, usize) -> i32;

/// `kvl_<build>_launch_block(launch, kernel, block, len, err, err_len)`.
type BlockFn =
    unsafe extern "C" fn(*const EmuLaunch, i32, *const u8, usize, *mut c_char, usize) -> i32;

/// The entry points of one build.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Kernels {
    warp_size: unsafe extern "C" fn() -> i32,
    launch_block: BlockFn,
    traffic_probe: ProbeFn,
}

macro_rules! build {
    ($const:ident, $warp:ident, $block:ident, $probe:ident) => {
        extern "C" {
            fn $warp() -> i32;
            fn $probe(
                pattern: i32,
                threads: u32,
                len: u64,
                out: *mut TrafficReport,
                err: *mut c_char,
                err_len: usize,
            ) -> i32;
            fn $block(
                l: *const EmuLaunch,
                kernel: i32,
                block: *const u8,
                len: usize,
                err: *mut c_char,
                err_len: usize,
            ) -> i32;
        }
        pub(crate) const $const: Kernels = Kernels {
            warp_size: $warp,
            launch_block: $block,
            traffic_probe: $probe,
        };
    };
}

build!(
    CUDA,
    kvl_cuda_emu_warp_size,
    kvl_cuda_emu_launch_block,
    kvl_cuda_emu_traffic_probe
);
build!(
    HIP,
    kvl_hip_emu_warp_size,
    kvl_hip_emu_launch_block,
    kvl_hip_emu_traffic_probe
);

#[cfg(feature = "planted-bugs")]
pub(crate) mod planted {
    use super::*;
    build!(
        PLANT1,
        kvl_plant1_warp_size,
        kvl_plant1_launch_block,
        kvl_plant1_traffic_probe
    );
    build!(
        PLANT2,
        kvl_plant2_warp_size,
        kvl_plant2_launch_block,
        kvl_plant2_traffic_probe
    );
    build!(
        PLANT3,
        kvl_plant3_warp_size,
        kvl_plant3_launch_block,
        kvl_plant3_traffic_probe
    );
    build!(
        PLANT4,
        kvl_plant4_warp_size,
        kvl_plant4_launch_block,
        kvl_plant4_traffic_probe
    );
    build!(
        PLANT5,
        kvl_plant5_warp_size,
        kvl_plant5_launch_block,
        kvl_plant5_traffic_probe
    );
    build!(
        PLANT6,
        kvl_plant6_warp_size,
        kvl_plant6_launch_block,
        kvl_plant6_traffic_probe
    );
    /// Build `n` (1-based) of `kernels-cuda/src/kvl_plant.cuh`.
    pub(crate) const PLANTS: [Kernels; 6] = [PLANT1, PLANT2, PLANT3, PLANT4, PLANT5, PLANT6];
}

extern "C" {
    fn kvl_emu_encode(dtype: i32, x: f32, out: *mut u8);
    fn kvl_emu_decode(dtype: i32, bytes: *const u8) -> f32;
    fn kvl_emu_param_layout(which: i32, member: i32) -> i64;
}

/// The C side's number of a kernel (`launch_block`'s `kernel`).
fn kernel_number(k: Kernel) -> i32 {
    match k {
        Kernel::WriteKv => 0,
        Kernel::PagedDecode => 1,
        Kernel::PagedDecodeReduce => 2,
        Kernel::MoveBlocks => 3,
    }
}

impl Kernels {
    /// The warp width the build was compiled for.
    pub(crate) fn warp_size(&self) -> u32 {
        // SAFETY: a C function without arguments returning a compile-time constant.
        unsafe { (self.warp_size)() as u32 }
    }

    /// Runs `kernel` with the argument block `block` under the emulator, which reads the
    /// parameters out of the block as a driver does; `Err` is the emulator's report (a block
    /// of the wrong size, a kernel trap, a divergent barrier, an access outside the launch's
    /// regions, a launch over a limit).
    /// Cache accesses are also confined by the emulator to the launch's regions.
    ///
    /// # Safety
    /// Every address in the block points into memory that lives, unaliased by Rust references
    /// in use, for the call, and is sized as the op's checks (`kvlayout::ops::check`)
    /// validated: the kernel reads and writes it unchecked.
    pub(crate) unsafe fn run(
        &self,
        launch: &EmuLaunch,
        kernel: Kernel,
        block: &[u8],
        traffic: Option<&mut TrafficReport>,
    ) -> Result<(), String> {
        let mut launch = *launch;
        if let Some(t) = traffic {
            launch.traffic = t;
        }
        let launch = &launch;
        let mut err = [0 as c_char; 512];
        let (e, n) = (err.as_mut_ptr(), err.len());
        // SAFETY: `launch` and `block` are live for the call and `block` is readable for its
        // length (the C side reads only within it and copies what it reads); the memory the
        // block's addresses point to is the caller's guarantee above; `err` is writable for
        // `n` bytes and the C side NUL-terminates what it writes within them.
        let rc = unsafe {
            (self.launch_block)(
                launch,
                kernel_number(kernel),
                block.as_ptr(),
                block.len(),
                e,
                n,
            )
        };
        message(rc, &mut err)
    }

    /// Runs traffic probe `pattern` (`csrc/traffic_probe.cuh`) on one block of `threads`
    /// threads over a buffer of `len` bytes the C side allocates, and returns what it
    /// recorded; `Err` is the emulator's report.
    pub(crate) fn traffic_probe(
        &self,
        pattern: i32,
        threads: u32,
        len: u64,
    ) -> Result<TrafficReport, String> {
        let mut out = TrafficReport::default();
        let mut err = [0 as c_char; 512];
        let (e, n) = (err.as_mut_ptr(), err.len());
        // SAFETY: `out` is a live, writable `kvl_emu_traffic` (TrafficReport is its C image);
        // `err` is writable for `n` bytes and NUL-terminated by the C side; the buffer the
        // probe touches is the C side's own allocation of `len` bytes, and the probe's
        // accesses are confined to it by the launch's region check.
        let rc = unsafe { (self.traffic_probe)(pattern, threads, len, &mut out, e, n) };
        message(rc, &mut err).map(|()| out)
    }
}

/// `Ok` for return code 0, else the C side's message in `err`.
fn message(rc: i32, err: &mut [c_char]) -> Result<(), String> {
    if rc == 0 {
        return Ok(());
    }
    let n = err.len();
    err[n - 1] = 0;
    // SAFETY: `err` is NUL-terminated (its last byte was just set to 0).
    let msg = unsafe { CStr::from_ptr(err.as_ptr()) };
    Err(msg.to_string_lossy().into_owned())
}

/// Four bytes aligned to 4, as every cache element is aligned to its size.
#[repr(C, align(4))]
struct Aligned([u8; 4]);

/// The kernels' encoding of `x` as `dtype` (`KVL_DTYPE_*` code) into `out` (bytes past the
/// element unchanged).
pub fn kernel_encode(dtype: i32, x: f32, out: &mut [u8; 4]) {
    let mut a = Aligned(*out);
    // SAFETY: `a` is 4 writable bytes aligned to 4, the most any dtype stores and needs.
    unsafe { kvl_emu_encode(dtype, x, a.0.as_mut_ptr()) }
    *out = a.0;
}

/// The kernels' decoding of one stored element of `dtype` (`KVL_DTYPE_*` code).
pub fn kernel_decode(dtype: i32, bytes: &[u8; 4]) -> f32 {
    let a = Aligned(*bytes);
    // SAFETY: `a` is 4 readable bytes aligned to 4, the most any dtype reads and needs.
    unsafe { kvl_emu_decode(dtype, a.0.as_ptr()) }
}

/// The C layout of kernel parameter struct `which` (0 `kvl_write_params`, 1
/// `kvl_decode_params`, 2 `kvl_move_params`): its size, and each member's offset in
/// declaration order.
pub fn kernel_param_layout(which: i32) -> (usize, Vec<usize>) {
    // SAFETY: a C function of two integers returning sizeof / offsetof constants.
    let size = unsafe { kvl_emu_param_layout(which, -1) } as usize;
    let offsets = (0..)
        // SAFETY: as above; the table ends with -1, where the iteration stops.
        .map(|m| unsafe { kvl_emu_param_layout(which, m) })
        .take_while(|&o| o >= 0)
        .map(|o| o as usize)
        .collect();
    (size, offsets)
}
