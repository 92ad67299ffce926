//! [`Device`]: what a GPU runtime (CUDA, HIP, or the host emulator standing in for one)
//! offers the device executor: allocations, copies, kernel launches, events.

use crate::kernels::{GpuTarget, KernelCall};

/// Where an allocation lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Place {
    /// Device memory.
    Device,
    /// Page-locked host memory the device can copy from and to (and address).
    PinnedHost,
}

/// What a runtime offers the contract. Every method returns the runtime's typed error.
/// Copies and launches are enqueued in order on one stream; `download` and `wait` block.
pub trait Device {
    /// One allocation, freed when dropped (after the work enqueued before it).
    type Buffer;
    /// A point in the stream's work.
    type Event;
    /// The runtime's error.
    type Error: std::fmt::Display;

    /// Name in reports.
    fn name(&self) -> &str;
    /// The launch limits of the device's kernels.
    fn target(&self) -> GpuTarget;
    /// `len` bytes at `place`, starting `misalign` bytes past an aligned address.
    fn alloc(&self, len: u64, misalign: u64, place: Place) -> Result<Self::Buffer, Self::Error>;
    /// Address of byte 0 of `buf` in the kernels' address space.
    fn address(&self, buf: &Self::Buffer) -> u64;
    /// Bytes of `buf`.
    fn len(&self, buf: &Self::Buffer) -> u64;
    /// Enqueues copying `src` to the start of `dst`; `src` may be reused on return.
    fn upload(&self, dst: &Self::Buffer, src: &[u8]) -> Result<(), Self::Error>;
    /// Copies the start of `src` into `dst` after the work enqueued before.
    fn download(&self, src: &Self::Buffer, dst: &mut [u8]) -> Result<(), Self::Error>;
    /// Enqueues a copy of `len` bytes between two allocations (either place).
    fn copy(
        &self,
        src: &Self::Buffer,
        src_offset: u64,
        dst: &Self::Buffer,
        dst_offset: u64,
        len: u64,
    ) -> Result<(), Self::Error>;
    /// Enqueues one kernel launch ([`KernelCall::args`]' block, [`KernelCall::config`]).
    ///
    /// # Safety
    /// The kernel reads and writes through the addresses in the call's arguments, unchecked.
    /// Every one must point into a live allocation of this device, large enough for what the
    /// kernel addresses under the call's configuration (the op checks of `kvlayout::ops`
    /// establish that for the calls `kvlayout_device::kernels` builds from checked
    /// arguments), and nothing else may use the bytes the kernel writes until its work
    /// completes. [`crate::DeviceBackend`] upholds this for every launch it makes.
    #[allow(unsafe_code)]
    unsafe fn launch(&self, call: &KernelCall) -> Result<(), Self::Error>;
    /// An event after the work enqueued so far.
    fn record(&self) -> Result<Self::Event, Self::Error>;
    /// Waits for `event`; `Err` is a failure of the work before it.
    fn wait(&self, event: &Self::Event) -> Result<(), Self::Error>;
    /// Waits for all enqueued work.
    fn synchronize(&self) -> Result<(), Self::Error>;
}
