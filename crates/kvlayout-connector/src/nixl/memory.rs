//! The engine's registered memory: [`HostMemory`], its regions ([`Region`]: owned by the
//! engine or lent by its caller, host or device), copied in and out through raw pointers,
//! and [`InFlight`] (the count of transfers posted and not finished). The `unsafe` code of
//! the NIXL engine's memory lives here and in `crate::memory`, each block with its `SAFETY`
//! argument.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use nixl_sys::{MemType, MemoryRegion, NixlDescriptor};

use crate::engine::EngineError;
use crate::memory::{MemKind, Region};

#[cfg(doc)]
use super::NixlPending;

impl MemoryRegion for Region<'static> {
    /// The start of the region: valid for `size()` bytes while it is registered; NIXL moves
    /// bytes through it, never Rust references.
    ///
    /// # Safety
    /// None beyond the trait's: the body only reads the pointer; a caller dereferencing it
    /// must not outlive the region nor create a Rust reference to bytes a transfer may write.
    unsafe fn as_ptr(&self) -> *const u8 {
        self.ptr()
    }

    fn size(&self) -> usize {
        self.len()
    }
}

impl NixlDescriptor for Region<'static> {
    fn mem_type(&self) -> MemType {
        mem_type(self.kind())
    }

    fn device_id(&self) -> u64 {
        match self.kind() {
            MemKind::Host => 0,
            MemKind::Device { id } => id,
        }
    }
}

/// NIXL's memory type of `kind`.
pub(super) fn mem_type(kind: MemKind) -> MemType {
    match kind {
        MemKind::Host => MemType::Dram,
        MemKind::Device { .. } => MemType::Vram,
    }
}

/// The engine's cache regions. Kept alive by every transfer posted from them, so no transfer
/// can outlive the memory the engine owns.
#[derive(Debug)]
pub(super) struct HostMemory {
    pub(super) buffers: Vec<Region<'static>>,
}

impl HostMemory {
    pub(super) fn lens(&self) -> Vec<u64> {
        self.buffers.iter().map(|b| b.len() as u64).collect()
    }

    /// Refuses a copy of device memory, which only its backend reads.
    fn host_only(&self, what: &str) -> Result<(), EngineError> {
        match self.buffers.iter().position(|b| b.kind() != MemKind::Host) {
            None => Ok(()),
            Some(i) => Err(EngineError::Transport(format!(
                "nixl: {what}: buffer {i} is {:?} memory; read it through its backend",
                self.buffers[i].kind()
            ))),
        }
    }

    /// A copy of every buffer (host memory only).
    pub(super) fn read(&self) -> Result<Vec<Vec<u8>>, EngineError> {
        self.host_only("reading the buffers")?;
        Ok(self.buffers.iter().map(|b| b.read(0, b.len())).collect())
    }

    /// A copy of the first `len` bytes of buffer `i` (the caller checked the range).
    pub(super) fn read_one(&self, i: usize, len: usize) -> Result<Vec<u8>, EngineError> {
        let b = &self.buffers[i];
        if b.kind() != MemKind::Host {
            return Err(EngineError::Transport(format!(
                "nixl: reading buffer {i}: it is {:?} memory; read it through its backend",
                b.kind()
            )));
        }
        Ok(b.read(0, len))
    }

    /// Overwrites every buffer with `bytes` (the caller has checked the shapes; host memory
    /// only).
    pub(super) fn write(&self, bytes: &[Vec<u8>]) -> Result<(), EngineError> {
        self.host_only("replacing the buffers")?;
        for (b, src) in self.buffers.iter().zip(bytes) {
            let n = b.len().min(src.len());
            b.write(0, &src[..n]);
        }
        Ok(())
    }
}

/// Counts transfers posted and not finished; each [`NixlPending`] holds one count until it
/// completes, fails, is cancelled or dropped.
#[derive(Debug)]
pub(super) struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    pub(super) fn new(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        InFlight(Arc::clone(count))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
