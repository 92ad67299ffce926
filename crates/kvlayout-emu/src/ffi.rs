//! The C entry points of the emulated kernel builds (`csrc/emu_entry.h`) and the one safe
//! function that calls them. The only `unsafe` of the crate is here.

use std::ffi::{c_char, CStr};

use kvlayout::kernels::{DecodeKernelParams, LaunchConfig, MoveParams, WriteParams};
use kvlayout::KvFieldArgs;

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

impl Region {
    /// The bytes of `b`, to read.
    pub(crate) fn of<T>(b: &[T]) -> Self {
        Region {
            base: b.as_ptr() as u64,
            len: std::mem::size_of_val(b) as u64,
        }
    }

    /// The bytes of `b`, to write.
    pub(crate) fn of_mut(b: &mut [u8]) -> Self {
        Region {
            base: b.as_mut_ptr() as u64,
            len: b.len() as u64,
        }
    }
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
        })
    }
}

type Err = *mut c_char;
type Args = *const KvFieldArgs;
type WriteFn = unsafe extern "C" fn(
    *const EmuLaunch,
    Args,
    Args,
    Args,
    Args,
    *const WriteParams,
    Err,
    usize,
) -> i32;
type DecodeFn = unsafe extern "C" fn(
    *const EmuLaunch,
    Args,
    Args,
    Args,
    Args,
    *const DecodeKernelParams,
    Err,
    usize,
) -> i32;
type ReduceFn =
    unsafe extern "C" fn(*const EmuLaunch, Args, *const DecodeKernelParams, Err, usize) -> i32;
type MoveFn =
    unsafe extern "C" fn(*const EmuLaunch, Args, Args, *const MoveParams, Err, usize) -> i32;

/// The entry points of one build.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Kernels {
    warp_size: unsafe extern "C" fn() -> i32,
    write_kv: WriteFn,
    paged_decode: DecodeFn,
    paged_decode_reduce: ReduceFn,
    move_blocks: MoveFn,
}

macro_rules! build {
    ($const:ident, $warp:ident, $write:ident, $decode:ident, $reduce:ident, $move:ident) => {
        extern "C" {
            fn $warp() -> i32;
            fn $write(
                l: *const EmuLaunch,
                k: Args,
                v: Args,
                ks: Args,
                vs: Args,
                p: *const WriteParams,
                e: Err,
                n: usize,
            ) -> i32;
            fn $decode(
                l: *const EmuLaunch,
                k: Args,
                v: Args,
                ks: Args,
                vs: Args,
                p: *const DecodeKernelParams,
                e: Err,
                n: usize,
            ) -> i32;
            fn $reduce(
                l: *const EmuLaunch,
                v: Args,
                p: *const DecodeKernelParams,
                e: Err,
                n: usize,
            ) -> i32;
            fn $move(
                l: *const EmuLaunch,
                s: Args,
                d: Args,
                p: *const MoveParams,
                e: Err,
                n: usize,
            ) -> i32;
        }
        pub(crate) const $const: Kernels = Kernels {
            warp_size: $warp,
            write_kv: $write,
            paged_decode: $decode,
            paged_decode_reduce: $reduce,
            move_blocks: $move,
        };
    };
}

build!(
    CUDA,
    kvl_cuda_emu_warp_size,
    kvl_cuda_emu_write_kv,
    kvl_cuda_emu_paged_decode,
    kvl_cuda_emu_paged_decode_reduce,
    kvl_cuda_emu_move_blocks
);
build!(
    HIP,
    kvl_hip_emu_warp_size,
    kvl_hip_emu_write_kv,
    kvl_hip_emu_paged_decode,
    kvl_hip_emu_paged_decode_reduce,
    kvl_hip_emu_move_blocks
);

#[cfg(feature = "planted-bugs")]
pub(crate) mod planted {
    use super::*;
    build!(
        PLANT1,
        kvl_plant1_warp_size,
        kvl_plant1_write_kv,
        kvl_plant1_paged_decode,
        kvl_plant1_paged_decode_reduce,
        kvl_plant1_move_blocks
    );
    build!(
        PLANT2,
        kvl_plant2_warp_size,
        kvl_plant2_write_kv,
        kvl_plant2_paged_decode,
        kvl_plant2_paged_decode_reduce,
        kvl_plant2_move_blocks
    );
    build!(
        PLANT3,
        kvl_plant3_warp_size,
        kvl_plant3_write_kv,
        kvl_plant3_paged_decode,
        kvl_plant3_paged_decode_reduce,
        kvl_plant3_move_blocks
    );
    build!(
        PLANT4,
        kvl_plant4_warp_size,
        kvl_plant4_write_kv,
        kvl_plant4_paged_decode,
        kvl_plant4_paged_decode_reduce,
        kvl_plant4_move_blocks
    );
    build!(
        PLANT5,
        kvl_plant5_warp_size,
        kvl_plant5_write_kv,
        kvl_plant5_paged_decode,
        kvl_plant5_paged_decode_reduce,
        kvl_plant5_move_blocks
    );
    build!(
        PLANT6,
        kvl_plant6_warp_size,
        kvl_plant6_write_kv,
        kvl_plant6_paged_decode,
        kvl_plant6_paged_decode_reduce,
        kvl_plant6_move_blocks
    );
    /// Build `n` (1-based) of `kernels-cuda/src/kvl_plant.cuh`.
    pub(crate) const PLANTS: [Kernels; 6] = [PLANT1, PLANT2, PLANT3, PLANT4, PLANT5, PLANT6];
}

extern "C" {
    fn kvl_emu_encode(dtype: i32, x: f32, out: *mut u8);
    fn kvl_emu_decode(dtype: i32, bytes: *const u8) -> f32;
    fn kvl_emu_param_layout(which: i32, member: i32) -> i64;
}

/// One kernel call with its arguments, all by reference.
pub(crate) enum Call<'a> {
    /// `kvl_write_kv(k, v, k_scale, v_scale, p)`.
    Write(&'a [KvFieldArgs; 4], &'a WriteParams),
    /// `kvl_paged_decode(k, v, k_scale, v_scale, p)`.
    Decode(&'a [KvFieldArgs; 4], &'a DecodeKernelParams),
    /// `kvl_paged_decode_reduce(v, p)`.
    Reduce(&'a KvFieldArgs, &'a DecodeKernelParams),
    /// `kvl_move_blocks(src, dst, p)`.
    Move(&'a KvFieldArgs, &'a KvFieldArgs, &'a MoveParams),
}

impl Call<'_> {
    /// The kernel's name.
    pub(crate) fn kernel(&self) -> &'static str {
        match self {
            Call::Write(..) => "kvl_write_kv",
            Call::Decode(..) => "kvl_paged_decode",
            Call::Reduce(..) => "kvl_paged_decode_reduce",
            Call::Move(..) => "kvl_move_blocks",
        }
    }
}

impl Kernels {
    /// The warp width the build was compiled for.
    pub(crate) fn warp_size(&self) -> u32 {
        // SAFETY: a C function without arguments returning a compile-time constant.
        unsafe { (self.warp_size)() as u32 }
    }

    /// Runs `call` under the emulator; `Err` is the emulator's report (a kernel trap, a
    /// divergent barrier, an access outside the launch's regions, a launch over a limit).
    ///
    /// The caller guarantees what the kernel reads and writes: every address in the params
    /// points into memory that lives, unaliased by Rust references in use, for the call, and
    /// sized as the op's checks (`kvlayout::ops::check`) validated. Cache accesses are also
    /// confined by the emulator to the launch's regions.
    pub(crate) fn run(&self, launch: &EmuLaunch, call: Call<'_>) -> Result<(), String> {
        let mut err = [0 as c_char; 512];
        let (e, n) = (err.as_mut_ptr(), err.len());
        // SAFETY: every pointer argument is a live reference for the duration of the call
        // (the C side copies the structs it takes by value); the memory the params point to is
        // the caller's guarantee above; `err` is writable for `n` bytes and the C side
        // NUL-terminates what it writes within them.
        let rc = unsafe {
            match call {
                Call::Write([k, v, ks, vs], p) => (self.write_kv)(launch, k, v, ks, vs, p, e, n),
                Call::Decode([k, v, ks, vs], p) => {
                    (self.paged_decode)(launch, k, v, ks, vs, p, e, n)
                }
                Call::Reduce(v, p) => (self.paged_decode_reduce)(launch, v, p, e, n),
                Call::Move(s, d, p) => (self.move_blocks)(launch, s, d, p, e, n),
            }
        };
        if rc == 0 {
            return Ok(());
        }
        err[n - 1] = 0;
        // SAFETY: `err` is NUL-terminated (its last byte was just set to 0).
        let msg = unsafe { CStr::from_ptr(err.as_ptr()) };
        Err(msg.to_string_lossy().into_owned())
    }
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
