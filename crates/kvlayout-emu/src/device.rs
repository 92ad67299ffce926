//! The emulator as a [`Device`]: "device memory" is host memory the emulated kernels address,
//! and a launch takes the argument block a GPU driver would take. So
//! [`DeviceBackend<EmuDevice>`](kvlayout_device::DeviceBackend) runs, on this machine, the
//! code path of the CUDA and HIP backends: validation, staging of index metadata into device
//! temporaries, argument blocks, copy runs between pinned host and device caches.
//!
//! Work runs when enqueued, so events are ready when recorded. Each launch's cache accesses
//! are confined to the allocations its cache buffer addresses fall in. With
//! [`EmuDevice::with_traffic`] each launch's memory traffic is recorded.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use kvlayout_device::kernels::{GpuTarget, KernelArgs, KernelCall};
use kvlayout_device::{Device, Place};

use crate::ffi::{EmuLaunch, Kernels, Region, CUDA, HIP};
use crate::mem::HostAlloc;
use crate::traffic::{LaunchTraffic, TrafficReport};

/// Live allocations: address of byte 0 -> length.
type Live = Arc<Mutex<BTreeMap<u64, u64>>>;

/// An emulated device running one kernel build: the kernel sources compiled with warps of
/// 32 (the CUDA build, launched within CUDA's limits) or 64 (the HIP build, CDNA's limits).
#[derive(Debug)]
pub struct EmuDevice {
    name: &'static str,
    kernels: Kernels,
    target: GpuTarget,
    seed: u64,
    live: Live,
    traffic: Option<Arc<Mutex<Vec<LaunchTraffic>>>>,
    /// Blocks run per launch along grid x (0: all).
    run_grid_x: u32,
}

/// An allocation of an [`EmuDevice`].
#[derive(Debug)]
pub struct EmuBuffer {
    mem: HostAlloc,
    place: Place,
    live: Live,
}

impl EmuBuffer {
    /// Where it was allocated.
    pub fn place(&self) -> Place {
        self.place
    }
}

impl Drop for EmuBuffer {
    fn drop(&mut self) {
        let mut live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        live.remove(&self.mem.address());
    }
}

/// An emulator error: an access past an allocation, or the kernel's report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmuError(pub String);

impl std::fmt::Display for EmuError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for EmuError {}

impl EmuDevice {
    /// The kernel build with warps of `warp` threads: 32 is `cuda-emu`, 64 `hip-emu`. Each
    /// block's threads are resumed in thread order ([`EmuDevice::with_seed`] changes it). Any
    /// other width is refused: no build has it.
    ///
    /// ```
    /// let dev = kvlayout_emu::EmuDevice::new(64)?;
    /// assert_eq!(dev.warp_size(), 64);
    /// assert!(kvlayout_emu::EmuDevice::new(16).is_err());
    /// # Ok::<(), kvlayout_emu::EmuError>(())
    /// ```
    pub fn new(warp: u32) -> Result<Self, EmuError> {
        let (name, kernels, target) = match warp {
            32 => ("cuda-emu", CUDA, GpuTarget::CUDA),
            64 => ("hip-emu", HIP, GpuTarget::CDNA),
            other => {
                return Err(EmuError(format!(
                "no emulated kernel build has warps of {other} threads (32: cuda-emu, 64: hip-emu)"
            )))
            }
        };
        Ok(EmuDevice {
            name,
            kernels,
            target,
            seed: 0,
            live: Arc::default(),
            traffic: None,
            run_grid_x: 0,
        })
    }

    /// The same device with the fibers of each block resumed in the order `seed` picks (0:
    /// thread order).
    pub fn with_seed(self, seed: u64) -> Self {
        EmuDevice { seed, ..self }
    }

    /// The same device with blocks limited to `bytes` of shared memory, static and dynamic
    /// together: the launch builder fits decode group tiles to it and the emulator refuses a
    /// launch over it. A smaller target's launch shapes (group tiles below the group) on this
    /// machine.
    pub fn with_shared_bytes(self, bytes: u32) -> Self {
        let target = GpuTarget {
            shared_bytes: bytes,
            ..self.target
        };
        EmuDevice { target, ..self }
    }

    /// The same device recording the memory traffic of every launch
    /// (`kernels-cuda/emu/kvl_emu_traffic.h`): each global load and store the kernels make,
    /// grouped into warp requests. Slower; for tests and the traffic report. Read the records
    /// with [`EmuDevice::take_traffic`].
    pub fn with_traffic(self) -> Self {
        EmuDevice {
            traffic: Some(Arc::default()),
            ..self
        }
    }

    /// The same device running only the blocks whose x index is below `grid_x` (0: all) and
    /// skipping the rest, whose outputs stay unwritten. For traffic reports of grids whose
    /// blocks along x are alike (a decode's sequences): record the first ones and scale.
    pub fn with_run_grid_x(self, grid_x: u32) -> Self {
        EmuDevice {
            run_grid_x: grid_x,
            ..self
        }
    }

    /// The traffic of the launches since the last call, in launch order (empty unless
    /// [`EmuDevice::with_traffic`]).
    pub fn take_traffic(&self) -> Vec<LaunchTraffic> {
        match &self.traffic {
            Some(t) => std::mem::take(&mut *t.lock().unwrap_or_else(PoisonError::into_inner)),
            None => Vec::new(),
        }
    }

    /// Runs traffic probe `pattern` of `crates/kvlayout-emu/csrc/traffic_probe.cuh` (hand-made
    /// access patterns: the recorder's own tests) on one block of `threads` threads over a
    /// 128 KiB buffer aligned to 128 bytes.
    pub fn traffic_probe(&self, pattern: i32, threads: u32) -> Result<TrafficReport, EmuError> {
        self.kernels
            .traffic_probe(pattern, threads, 128 << 10)
            .map_err(EmuError)
    }

    /// Deliberately broken CUDA build `n` of `kernels-cuda/src/kvl_plant.cuh`, for tests;
    /// `None` when `n` is not 1 to 6.
    #[cfg(feature = "planted-bugs")]
    pub fn planted(n: usize) -> Option<Self> {
        let kernels = *crate::ffi::planted::PLANTS.get(n.checked_sub(1)?)?;
        let cuda = EmuDevice::new(32).ok()?;
        Some(EmuDevice { kernels, ..cuda })
    }

    /// The warp width the kernels were compiled with.
    pub fn warp_size(&self) -> u32 {
        self.kernels.warp_size()
    }

    /// The allocation holding address `a`, as a region.
    fn region_of(&self, a: u64) -> Option<Region> {
        let live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        let (&base, &len) = live.range(..=a).next_back()?;
        (a < base + len.max(1)).then_some(Region { base, len })
    }

    /// The regions a call addresses: its cache buffers, block table, and the activation,
    /// slot, length and output tensors its kernel reads through the checked accessors.
    fn regions(&self, call: &KernelCall) -> Vec<Region> {
        let bases: Vec<u64> = match &call.args {
            KernelArgs::Write { params, .. } => {
                let mut b = params.buffers.to_vec();
                b.extend([params.key, params.value, params.slot_mapping]);
                b
            }
            KernelArgs::Decode { params, .. } | KernelArgs::Reduce { params, .. } => {
                let mut b = params.buffers.to_vec();
                b.extend([params.block_table, params.query, params.seq_lens]);
                b.extend([params.out, params.partials]);
                b
            }
            KernelArgs::Move { params, .. } => {
                let mut b = params.src_buffers.to_vec();
                b.extend(params.dst_buffers);
                b
            }
        };
        let mut regions: Vec<Region> = Vec::new();
        for r in bases.into_iter().filter_map(|a| self.region_of(a)) {
            if !regions.iter().any(|q| q.base == r.base) {
                regions.push(r);
            }
        }
        regions
    }
}

fn in_range(what: &str, buf: &EmuBuffer, offset: u64, len: u64) -> Result<(), EmuError> {
    match offset.checked_add(len) {
        Some(end) if end <= buf.mem.len() as u64 => Ok(()),
        _ => Err(EmuError(format!(
            "{what}: {len} bytes at {offset} past an allocation of {}",
            buf.mem.len()
        ))),
    }
}

impl Device for EmuDevice {
    type Buffer = EmuBuffer;
    type Event = ();
    type Error = EmuError;

    fn name(&self) -> &str {
        self.name
    }

    fn target(&self) -> GpuTarget {
        self.target
    }

    fn alloc(&self, len: u64, misalign: u64, place: Place) -> Result<EmuBuffer, EmuError> {
        let len = usize::try_from(len).map_err(|_| EmuError(format!("{len} bytes")))?;
        let mem = HostAlloc::new(len, (misalign % 64) as usize)
            .ok_or_else(|| EmuError(format!("no memory for {len} bytes")))?;
        let mut live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        live.insert(mem.address(), len as u64);
        Ok(EmuBuffer {
            mem,
            place,
            live: Arc::clone(&self.live),
        })
    }

    fn address(&self, buf: &EmuBuffer) -> u64 {
        buf.mem.address()
    }

    fn len(&self, buf: &EmuBuffer) -> u64 {
        buf.mem.len() as u64
    }

    fn upload(&self, dst: &EmuBuffer, src: &[u8]) -> Result<(), EmuError> {
        in_range("upload", dst, 0, src.len() as u64)?;
        dst.mem.write(0, src);
        Ok(())
    }

    fn download(&self, src: &EmuBuffer, dst: &mut [u8]) -> Result<(), EmuError> {
        in_range("download", src, 0, dst.len() as u64)?;
        src.mem.read(0, dst);
        Ok(())
    }

    fn copy(
        &self,
        src: &EmuBuffer,
        src_offset: u64,
        dst: &EmuBuffer,
        dst_offset: u64,
        len: u64,
    ) -> Result<(), EmuError> {
        in_range("copy source", src, src_offset, len)?;
        in_range("copy destination", dst, dst_offset, len)?;
        HostAlloc::copy(
            &src.mem,
            src_offset as usize,
            &dst.mem,
            dst_offset as usize,
            len as usize,
        );
        Ok(())
    }

    #[allow(unsafe_code)]
    unsafe fn launch(&self, call: &KernelCall) -> Result<(), EmuError> {
        let regions = self.regions(call);
        let mut launch =
            EmuLaunch::new(&call.config, self.target.shared_bytes, self.seed, &regions)
                .map_err(EmuError)?;
        launch.run_grid_x = u64::from(self.run_grid_x);
        let mut report = TrafficReport::default();
        let recording = self.traffic.as_ref();
        let kernel = call.args.kernel();
        // SAFETY: the caller's guarantee (`Device::launch`) is `Kernels::run`'s.
        unsafe {
            self.kernels.run(
                &launch,
                kernel,
                &call.args.block(),
                recording.map(|_| &mut report),
            )
        }
        .map_err(EmuError)?;
        if let Some(t) = recording {
            t.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(LaunchTraffic {
                    kernel,
                    config: call.config,
                    warp: self.target.warp,
                    report,
                });
        }
        Ok(())
    }

    fn record(&self) -> Result<(), EmuError> {
        Ok(())
    }

    fn wait(&self, _: &()) -> Result<(), EmuError> {
        Ok(())
    }

    fn synchronize(&self) -> Result<(), EmuError> {
        Ok(())
    }
}
