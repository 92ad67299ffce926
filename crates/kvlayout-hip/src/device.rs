//! [`HipDevice`]: one AMD GPU as the contract's [`Device`] — a non-blocking stream, the
//! first embedded code object the runtime loads on it, and its four kernels. Each method
//! makes the device current first (the runtime's current device is per thread).

use std::ffi::c_int;
use std::sync::Arc;

use kvlayout_device::kernels::{GpuTarget, Kernel, KernelCall};
use kvlayout_device::{Device, DeviceBackend, Place};

use crate::code_objects::{code_objects, why_not_embedded, CodeObject};
use crate::error::{CodeObjectRefusal, HipCallError, HipError};
use crate::ffi::{self, Allocation, Event, Function, Module, Stream};

/// The backend of HIP device `ordinal`: [`HipDevice::open`] under [`DeviceBackend`].
pub fn hip(ordinal: usize) -> Result<DeviceBackend<HipDevice>, HipError> {
    HipDevice::open(ordinal).map(DeviceBackend::new)
}

/// The four kernels of the loaded code object.
#[derive(Debug)]
struct Functions {
    write_kv: Function,
    paged_decode: Function,
    paged_decode_reduce: Function,
    move_blocks: Function,
}

impl Functions {
    fn get(module: &Arc<Module>) -> Result<Functions, HipCallError> {
        Ok(Functions {
            write_kv: module.function(Kernel::WriteKv)?,
            paged_decode: module.function(Kernel::PagedDecode)?,
            paged_decode_reduce: module.function(Kernel::PagedDecodeReduce)?,
            move_blocks: module.function(Kernel::MoveBlocks)?,
        })
    }

    fn of(&self, kernel: Kernel) -> &Function {
        match kernel {
            Kernel::WriteKv => &self.write_kv,
            Kernel::PagedDecode => &self.paged_decode,
            Kernel::PagedDecodeReduce => &self.paged_decode_reduce,
            Kernel::MoveBlocks => &self.move_blocks,
        }
    }
}

/// One AMD GPU through the HIP runtime: its own non-blocking stream, on which every copy and
/// launch is enqueued in order, and the project's kernels from the first embedded code object
/// the runtime accepts. `Send + Sync`: the HIP runtime is thread-safe, and every handle it
/// holds is (see `ffi`).
#[derive(Debug)]
pub struct HipDevice {
    ordinal: usize,
    raw_ordinal: c_int,
    code_object: &'static CodeObject,
    // Dropped before `stream`; each function keeps its module loaded.
    functions: Functions,
    stream: Arc<Stream>,
}

/// An allocation of a [`HipDevice`] (device or pinned host memory), freed on drop after the
/// work enqueued before.
#[derive(Debug)]
pub struct HipBuffer(Allocation);

impl HipBuffer {
    /// Bytes.
    pub fn len(&self) -> u64 {
        self.0.len()
    }

    /// Whether it holds no byte.
    pub fn is_empty(&self) -> bool {
        self.0.len() == 0
    }

    /// Address of byte 0 in the kernels' address space.
    pub fn address(&self) -> u64 {
        self.0.address()
    }

    /// Where it lives.
    pub fn place(&self) -> Place {
        self.0.place()
    }
}

/// A point in a [`HipDevice`]'s stream.
#[derive(Debug)]
pub struct HipEvent(Event);

impl HipDevice {
    /// Opens device `ordinal`: `hipInit`, `hipGetDeviceCount`, `hipSetDevice`, a
    /// non-blocking stream, then each embedded code object in turn until the runtime loads
    /// one with all four kernels ([`HipDevice::code_object`] says which).
    ///
    /// [`HipError::NoDevice`] when the runtime does not start, finds no device or fewer than
    /// `ordinal + 1`; [`HipError::NoCodeObjects`] for a build without clang-19;
    /// [`HipError::NoLoadableCodeObject`] with each object's refusal when none loads.
    pub fn open(ordinal: usize) -> Result<HipDevice, HipError> {
        let init = ffi::init().err();
        let counted = ffi::device_count();
        let count = counted
            .as_ref()
            .map_or(0, |&n| u32::try_from(n).unwrap_or(0));
        let raw_ordinal = c_int::try_from(ordinal)
            .ok()
            .filter(|_| init.is_none() && counted.is_ok() && ordinal < count as usize);
        let Some(raw_ordinal) = raw_ordinal else {
            let mut why: Vec<String> = init
                .into_iter()
                .chain(counted.err())
                .map(|e| e.to_string())
                .collect();
            if why.is_empty() {
                why.push(format!(
                    "ordinal {ordinal} is past the {count} device(s) the runtime reports"
                ));
            }
            return Err(HipError::NoDevice {
                ordinal,
                count,
                why: why.join("; "),
            });
        };
        let objects = code_objects();
        if objects.is_empty() {
            return Err(HipError::NoCodeObjects {
                why: why_not_embedded().unwrap_or("the build embedded none"),
            });
        }
        ffi::set_device(raw_ordinal)?;
        let stream = Arc::new(Stream::new(raw_ordinal)?);
        let mut refusals = Vec::new();
        for object in objects {
            let loaded = Module::load(raw_ordinal, object.arch, object.bytes)
                .and_then(|module| Functions::get(&module).map_err(HipError::from));
            match loaded {
                Ok(functions) => {
                    return Ok(HipDevice {
                        ordinal,
                        raw_ordinal,
                        code_object: object,
                        functions,
                        stream,
                    })
                }
                Err(HipError::Call(error)) => refusals.push(CodeObjectRefusal {
                    arch: object.arch,
                    error,
                }),
                Err(other) => return Err(other),
            }
        }
        Err(HipError::NoLoadableCodeObject { ordinal, refusals })
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The code object the runtime loaded.
    pub fn code_object(&self) -> &'static CodeObject {
        self.code_object
    }

    /// Makes the device current on the calling thread.
    fn current(&self) -> Result<(), HipError> {
        ffi::set_device(self.raw_ordinal)?;
        Ok(())
    }
}

impl Drop for HipDevice {
    fn drop(&mut self) {
        // Launches in flight use the module, unloaded when the functions drop.
        let _ = ffi::set_device(self.raw_ordinal);
        let _ = self.stream.synchronize();
    }
}

impl Device for HipDevice {
    type Buffer = HipBuffer;
    type Event = HipEvent;
    type Error = HipError;

    fn name(&self) -> &str {
        "hip"
    }

    fn target(&self) -> GpuTarget {
        self.code_object.target()
    }

    fn alloc(&self, len: u64, misalign: u64, place: Place) -> Result<HipBuffer, HipError> {
        self.current()?;
        Allocation::new(&self.stream, len, misalign, place).map(HipBuffer)
    }

    fn address(&self, buf: &HipBuffer) -> u64 {
        buf.address()
    }

    fn len(&self, buf: &HipBuffer) -> u64 {
        buf.len()
    }

    fn upload(&self, dst: &HipBuffer, src: &[u8]) -> Result<(), HipError> {
        self.current()?;
        dst.0.upload(&self.stream, src)
    }

    fn download(&self, src: &HipBuffer, dst: &mut [u8]) -> Result<(), HipError> {
        self.current()?;
        src.0.download(&self.stream, dst)
    }

    fn copy(
        &self,
        src: &HipBuffer,
        src_offset: u64,
        dst: &HipBuffer,
        dst_offset: u64,
        len: u64,
    ) -> Result<(), HipError> {
        self.current()?;
        Allocation::copy(&self.stream, &src.0, src_offset, &dst.0, dst_offset, len)
    }

    #[allow(unsafe_code)]
    unsafe fn launch(&self, call: &KernelCall) -> Result<(), HipError> {
        self.current()?;
        let block = call.args.block();
        self.functions
            .of(call.args.kernel())
            .launch(&self.stream, &call.config, &block)
    }

    fn record(&self) -> Result<HipEvent, HipError> {
        self.current()?;
        Ok(HipEvent(Event::record(&self.stream)?))
    }

    fn wait(&self, event: &HipEvent) -> Result<(), HipError> {
        self.current()?;
        event.0.synchronize()?;
        Ok(())
    }

    fn synchronize(&self) -> Result<(), HipError> {
        self.current()?;
        self.stream.synchronize()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send_sync<T: Send + Sync>() {}

    #[test]
    fn handles_cross_threads() {
        send_sync::<HipDevice>();
        send_sync::<HipBuffer>();
        send_sync::<HipEvent>();
        send_sync::<DeviceBackend<HipDevice>>();
    }
}
