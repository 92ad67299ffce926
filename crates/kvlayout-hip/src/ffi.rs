//! Every call into the HIP runtime, and all of this crate's `unsafe`: the runtime functions,
//! and the owners of what they hand out — [`Stream`], [`Module`] with its [`Function`]s,
//! [`Allocation`] and [`Event`] — each released on drop. Every copy is checked against its
//! allocation's length here, before the runtime sees it.
//!
//! The functions are declared here rather than taken from `hip_sys::hiprt`, whose
//! declarations return `hipError_t` as a Rust enum: a runtime newer than those bindings may
//! return a code the enum lacks, and a Rust enum holding a value outside its variants is
//! undefined behaviour. Here a status is the C enum's integer ([`Status`]); same symbols,
//! same ABI. `hip-sys` links `libamdhip64` and supplies the handle types and flag values.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::ptr;
use std::sync::{Arc, Mutex, PoisonError};

use hip_sys::hiprt::{
    hipEventDisableTiming, hipEvent_t, hipFunction_t, hipHostMallocDefault, hipMemcpyKind,
    hipModule_t, hipStreamNonBlocking, hipStream_t,
};
use kvlayout_device::kernels::{arg_slots, Kernel, LaunchConfig};
use kvlayout_device::Place;

use crate::code_objects::elf_extent;
use crate::error::{HipCallError, HipError};

/// A `hipError_t` as the runtime returns it (a 32-bit C enum), read as its integer.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Status(c_int);

/// `hipSuccess`.
const SUCCESS: Status = Status(0);

/// `HIP_LAUNCH_PARAM_BUFFER_POINTER`, `HIP_LAUNCH_PARAM_BUFFER_SIZE`, `HIP_LAUNCH_PARAM_END`
/// of `hip_runtime_api.h` (`((void*)0x01)` to `((void*)0x03)`; bindgen does not translate
/// them).
const LAUNCH_PARAM_BUFFER_POINTER: usize = 0x01;
const LAUNCH_PARAM_BUFFER_SIZE: usize = 0x02;
const LAUNCH_PARAM_END: usize = 0x03;

extern "C" {
    fn hipInit(flags: c_uint) -> Status;
    fn hipGetDeviceCount(count: *mut c_int) -> Status;
    fn hipSetDevice(device_id: c_int) -> Status;
    fn hipGetErrorName(error: Status) -> *const c_char;
    fn hipGetErrorString(error: Status) -> *const c_char;
    fn hipStreamCreateWithFlags(stream: *mut hipStream_t, flags: c_uint) -> Status;
    fn hipStreamSynchronize(stream: hipStream_t) -> Status;
    fn hipStreamDestroy(stream: hipStream_t) -> Status;
    fn hipModuleLoadData(module: *mut hipModule_t, image: *const c_void) -> Status;
    fn hipModuleGetFunction(
        function: *mut hipFunction_t,
        module: hipModule_t,
        name: *const c_char,
    ) -> Status;
    fn hipModuleUnload(module: hipModule_t) -> Status;
    #[allow(clippy::too_many_arguments)]
    fn hipModuleLaunchKernel(
        f: hipFunction_t,
        grid_x: c_uint,
        grid_y: c_uint,
        grid_z: c_uint,
        block_x: c_uint,
        block_y: c_uint,
        block_z: c_uint,
        shared_bytes: c_uint,
        stream: hipStream_t,
        kernel_params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) -> Status;
    fn hipMalloc(ptr: *mut *mut c_void, size: usize) -> Status;
    fn hipFree(ptr: *mut c_void) -> Status;
    fn hipHostMalloc(ptr: *mut *mut c_void, size: usize, flags: c_uint) -> Status;
    fn hipHostFree(ptr: *mut c_void) -> Status;
    fn hipHostGetDevicePointer(
        device_ptr: *mut *mut c_void,
        host_ptr: *mut c_void,
        flags: c_uint,
    ) -> Status;
    fn hipMemcpyHtoDAsync(
        dst: *mut c_void,
        src: *mut c_void,
        size: usize,
        stream: hipStream_t,
    ) -> Status;
    fn hipMemcpyDtoHAsync(
        dst: *mut c_void,
        src: *mut c_void,
        size: usize,
        stream: hipStream_t,
    ) -> Status;
    fn hipMemcpyAsync(
        dst: *mut c_void,
        src: *const c_void,
        size: usize,
        kind: c_int,
        stream: hipStream_t,
    ) -> Status;
    fn hipEventCreateWithFlags(event: *mut hipEvent_t, flags: c_uint) -> Status;
    fn hipEventRecord(event: hipEvent_t, stream: hipStream_t) -> Status;
    fn hipEventSynchronize(event: hipEvent_t) -> Status;
    fn hipEventDestroy(event: hipEvent_t) -> Status;
}

/// A string the runtime returned (`"(none)"` for a null pointer).
fn runtime_text(p: *const c_char) -> String {
    if p.is_null() {
        return "(none)".to_string();
    }
    // SAFETY: non-null pointers from hipGetErrorName / hipGetErrorString point to
    // NUL-terminated strings in the runtime's static storage, valid for the process.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// `Ok` for `hipSuccess`, else the call with the runtime's name and description of `status`.
fn check(call: &'static str, status: Status) -> Result<(), HipCallError> {
    if status == SUCCESS {
        return Ok(());
    }
    // SAFETY: both take any hipError_t value by value and return a pointer to a static
    // string (for an unknown value, the runtime's "unknown" text).
    let (name, description) = unsafe { (hipGetErrorName(status), hipGetErrorString(status)) };
    Err(HipCallError {
        call,
        code: status.0,
        name: runtime_text(name),
        description: runtime_text(description),
    })
}

/// `hipInit(0)`.
pub(crate) fn init() -> Result<(), HipCallError> {
    // SAFETY: no pointer arguments; flags must be 0.
    check("hipInit", unsafe { hipInit(0) })
}

/// `hipGetDeviceCount`.
pub(crate) fn device_count() -> Result<c_int, HipCallError> {
    let mut count: c_int = 0;
    // SAFETY: `count` is a valid, writable c_int for the duration of the call.
    check("hipGetDeviceCount", unsafe {
        hipGetDeviceCount(&mut count)
    })?;
    Ok(count)
}

/// `hipSetDevice`: the calling thread's current device.
pub(crate) fn set_device(ordinal: c_int) -> Result<(), HipCallError> {
    // SAFETY: no pointer arguments; the runtime checks the ordinal.
    check("hipSetDevice", unsafe { hipSetDevice(ordinal) })
}

/// A non-blocking stream of one device, synchronized and destroyed on drop.
#[derive(Debug)]
pub(crate) struct Stream {
    raw: hipStream_t,
    ordinal: c_int,
}

// SAFETY: a stream is an opaque handle to a runtime object; the HIP runtime is thread-safe
// (its API may be called on one stream from several threads), and the handle stays valid
// until `Drop` destroys it, which needs exclusive ownership.
unsafe impl Send for Stream {}
// SAFETY: as for Send; no method gives out the handle.
unsafe impl Sync for Stream {}

impl Stream {
    /// A `hipStreamNonBlocking` stream on device `ordinal` (made current first).
    pub(crate) fn new(ordinal: c_int) -> Result<Stream, HipCallError> {
        set_device(ordinal)?;
        let mut raw: hipStream_t = ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer for the call.
        check("hipStreamCreateWithFlags", unsafe {
            hipStreamCreateWithFlags(&mut raw, hipStreamNonBlocking)
        })?;
        Ok(Stream { raw, ordinal })
    }

    /// The device the stream is on.
    pub(crate) fn ordinal(&self) -> c_int {
        self.ordinal
    }

    /// Waits for all work enqueued on the stream; an asynchronous fault surfaces here.
    pub(crate) fn synchronize(&self) -> Result<(), HipCallError> {
        // SAFETY: `raw` is a live stream (destroyed only in Drop).
        check("hipStreamSynchronize", unsafe {
            hipStreamSynchronize(self.raw)
        })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // Errors cannot be returned from drop; a failing runtime leaks the stream at worst.
        let _ = set_device(self.ordinal);
        let _ = self.synchronize();
        // SAFETY: `raw` is a live stream owned by this value, not used after this call.
        let _ = unsafe { hipStreamDestroy(self.raw) };
    }
}

/// A loaded code object, unloaded on drop (after every [`Function`] of it is gone).
#[derive(Debug)]
pub(crate) struct Module {
    raw: hipModule_t,
    ordinal: c_int,
}

// SAFETY: an opaque handle to a runtime object, valid until Drop; the runtime is thread-safe.
unsafe impl Send for Module {}
// SAFETY: as for Send; the handle is only passed to hipModuleGetFunction and hipModuleUnload.
unsafe impl Sync for Module {}

impl Module {
    /// `hipModuleLoadData` of `image` on the current device `ordinal`: `Err(HipError::Call)`
    /// when the runtime refuses it (another ISA), `Err(HipError::BadCodeObject)` when the
    /// image is not a complete AMDGPU ELF.
    pub(crate) fn load(
        ordinal: c_int,
        arch: &'static str,
        image: &'static [u8],
    ) -> Result<Arc<Module>, HipError> {
        elf_extent(image).map_err(|why| HipError::BadCodeObject { arch, why })?;
        let mut raw: hipModule_t = ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer. The runtime takes no length and reads the
        // image as far as its ELF headers say; `elf_extent` checked that the headers, the
        // program and section header tables and every section with file contents lie
        // within `image`, which is 'static (the runtime may refer to it after the call).
        check("hipModuleLoadData", unsafe {
            hipModuleLoadData(&mut raw, image.as_ptr().cast())
        })?;
        Ok(Arc::new(Module { raw, ordinal }))
    }

    /// The kernel `kernel` of the module.
    pub(crate) fn function(self: &Arc<Self>, kernel: Kernel) -> Result<Function, HipCallError> {
        // Entry point names are NUL-free ASCII literals.
        let name = format!("{}\0", kernel.name());
        let mut raw: hipFunction_t = ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer, `self.raw` a live module, and `name` a
        // NUL-terminated string that outlives the call.
        check("hipModuleGetFunction", unsafe {
            hipModuleGetFunction(&mut raw, self.raw, name.as_ptr().cast())
        })?;
        Ok(Function {
            raw,
            kernel,
            _module: Arc::clone(self),
        })
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        let _ = set_device(self.ordinal);
        // SAFETY: `raw` is a live module owned by this value; its functions hold an Arc of
        // it, so none is left, and their launches were synchronized by the device's drop.
        let _ = unsafe { hipModuleUnload(self.raw) };
    }
}

/// One kernel of a loaded [`Module`] (which it keeps loaded).
#[derive(Debug)]
pub(crate) struct Function {
    raw: hipFunction_t,
    kernel: Kernel,
    _module: Arc<Module>,
}

// SAFETY: an opaque handle into a module this value keeps loaded; the runtime is thread-safe.
unsafe impl Send for Function {}
// SAFETY: as for Send; launching is a runtime call on the handle, safe from any thread.
unsafe impl Sync for Function {}

impl Function {
    /// Enqueues the kernel on `stream` with `config` and the packed argument block `args`
    /// (`HIP_LAUNCH_PARAM_BUFFER_POINTER`; the runtime appends the hidden arguments).
    pub(crate) fn launch(
        &self,
        stream: &Stream,
        config: &LaunchConfig,
        args: &[u8],
    ) -> Result<(), HipError> {
        let expected = arg_slots(self.kernel)
            .last()
            .map_or(0, |&(offset, size)| offset + size);
        if args.len() != expected {
            return Err(HipError::ArgumentBlock {
                kernel: self.kernel.name(),
                len: args.len(),
                expected,
            });
        }
        let mut size: usize = args.len();
        let mut extra: [*mut c_void; 5] = [
            ptr::without_provenance_mut(LAUNCH_PARAM_BUFFER_POINTER),
            args.as_ptr().cast_mut().cast(),
            ptr::without_provenance_mut(LAUNCH_PARAM_BUFFER_SIZE),
            ptr::from_mut(&mut size).cast(),
            ptr::without_provenance_mut(LAUNCH_PARAM_END),
        ];
        let (g, b) = (config.grid, config.block);
        // SAFETY: `self.raw` is a function of a module this value keeps loaded and `stream`
        // a live stream. `extra` follows the HIP_LAUNCH_PARAM protocol: the runtime reads
        // each explicit argument at its metadata offset from `args` (never written, alive
        // for the call; the runtime copies it at enqueue) and `size` as a size_t. `args` is
        // exactly as long as the kernel's explicit arguments: its length was checked against
        // `arg_slots` above, and tests/embedded.rs checks `arg_slots` against each code
        // object's metadata. The addresses inside the block are the caller's contract
        // (`Device::launch`): DeviceBackend validates every one against live allocations.
        check("hipModuleLaunchKernel", unsafe {
            hipModuleLaunchKernel(
                self.raw,
                g.x,
                g.y,
                g.z,
                b.x,
                b.y,
                b.z,
                config.dyn_shared_bytes,
                stream.raw,
                ptr::null_mut(),
                extra.as_mut_ptr(),
            )
        })?;
        Ok(())
    }
}

/// One allocation in device memory (`hipMalloc`) or pinned host memory (`hipHostMalloc`),
/// `misalign` bytes of it before byte 0; freed on drop after its stream's work.
#[derive(Debug)]
pub(crate) struct Allocation {
    /// What the runtime returned (the host pointer for pinned memory); null when nothing
    /// was allocated (0 bytes).
    base: *mut c_void,
    /// `base` in the kernels' address space.
    device_base: u64,
    misalign: usize,
    len: usize,
    place: Place,
    /// Keeps the stream (and its device ordinal) for the drop.
    stream: Arc<Stream>,
    /// Held while the host reads or writes pinned memory.
    host_access: Mutex<()>,
}

// SAFETY: the pointers are addresses of a runtime allocation, valid until Drop frees it;
// the runtime is thread-safe, and host accesses to pinned memory hold `host_access`.
unsafe impl Send for Allocation {}
// SAFETY: as for Send: shared use only enqueues runtime copies or touches pinned memory
// under `host_access`.
unsafe impl Sync for Allocation {}

fn too_large(what: &'static str, bytes: u64, extra: u64) -> HipError {
    HipError::TooLarge { what, bytes, extra }
}

impl Allocation {
    /// `len` bytes at `place`, starting `misalign` bytes into the runtime's allocation, on the
    /// current device (`stream`'s).
    pub(crate) fn new(
        stream: &Arc<Stream>,
        len: u64,
        misalign: u64,
        place: Place,
    ) -> Result<Allocation, HipError> {
        let what = match place {
            Place::Device => "device allocation",
            Place::PinnedHost => "pinned host allocation",
        };
        let total = len
            .checked_add(misalign)
            .and_then(|t| usize::try_from(t).ok())
            .ok_or_else(|| too_large(what, len, misalign))?;
        let (len, misalign) = (total - misalign as usize, misalign as usize);
        let mut alloc = Allocation {
            base: ptr::null_mut(),
            device_base: 0,
            misalign,
            len,
            place,
            stream: Arc::clone(stream),
            host_access: Mutex::new(()),
        };
        if total == 0 {
            return Ok(alloc);
        }
        match place {
            Place::Device => {
                // SAFETY: `alloc.base` is a valid out-pointer; on failure it stays null and
                // Drop frees nothing.
                check("hipMalloc", unsafe { hipMalloc(&mut alloc.base, total) })?;
                alloc.device_base = alloc.base as u64;
            }
            Place::PinnedHost => {
                // SAFETY: as for hipMalloc. Default flags: mapped into the device's address
                // space.
                check("hipHostMalloc", unsafe {
                    hipHostMalloc(&mut alloc.base, total, hipHostMallocDefault)
                })?;
                let mut device: *mut c_void = ptr::null_mut();
                // SAFETY: `device` is a valid out-pointer and `alloc.base` a live
                // hipHostMalloc allocation (freed by Drop if this fails).
                check("hipHostGetDevicePointer", unsafe {
                    hipHostGetDevicePointer(&mut device, alloc.base, 0)
                })?;
                alloc.device_base = device as u64;
            }
        }
        Ok(alloc)
    }

    /// Byte 0 in the kernels' address space (0 for an empty allocation).
    pub(crate) fn address(&self) -> u64 {
        if self.base.is_null() {
            0
        } else {
            self.device_base.wrapping_add(self.misalign as u64)
        }
    }

    /// Bytes, the misalignment excluded.
    pub(crate) fn len(&self) -> u64 {
        self.len as u64
    }

    /// Where it lives.
    pub(crate) fn place(&self) -> Place {
        self.place
    }

    /// Offset from `base` of bytes `offset..offset + len`, after checking they are inside.
    fn range(&self, op: &'static str, offset: u64, len: usize) -> Result<usize, HipError> {
        let out = || HipError::OutOfRange {
            op,
            offset,
            len: len as u64,
            buffer_len: self.len as u64,
        };
        let start = usize::try_from(offset).map_err(|_| out())?;
        match start.checked_add(len) {
            Some(end) if end <= self.len => Ok(self.misalign + start),
            _ => Err(out()),
        }
    }

    /// `base + at` as the runtime's copies take it (a host pointer for pinned memory).
    fn at(&self, at: usize) -> *mut c_void {
        self.base.cast::<u8>().wrapping_add(at).cast()
    }

    /// Copies `src` to the start; `src` may be reused on return.
    pub(crate) fn upload(&self, stream: &Stream, src: &[u8]) -> Result<(), HipError> {
        let at = self.range("upload", 0, src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        match self.place {
            Place::Device => {
                // SAFETY: `at..at + src.len()` is inside this live device allocation (checked
                // by `range`); `src` is readable for `src.len()` bytes and the runtime only
                // reads it. The stream is synchronized before returning, so the copy has
                // finished with `src` when the caller gets it back.
                check("hipMemcpyHtoDAsync", unsafe {
                    hipMemcpyHtoDAsync(
                        self.at(at),
                        src.as_ptr().cast_mut().cast(),
                        src.len(),
                        stream.raw,
                    )
                })?;
                stream.synchronize()?;
            }
            Place::PinnedHost => {
                // Work enqueued before may read or write these bytes.
                stream.synchronize()?;
                let _host = self
                    .host_access
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                // SAFETY: `at..at + src.len()` is inside this live host allocation (`range`);
                // `src` is a distinct Rust slice, so the two do not overlap; the device's work
                // on the stream has finished and other host accesses hold `host_access`.
                unsafe {
                    ptr::copy_nonoverlapping(src.as_ptr(), self.at(at).cast::<u8>(), src.len());
                }
            }
        }
        Ok(())
    }

    /// Copies the start into `dst` after the work enqueued on `stream` before.
    pub(crate) fn download(&self, stream: &Stream, dst: &mut [u8]) -> Result<(), HipError> {
        let at = self.range("download", 0, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        match self.place {
            Place::Device => {
                // SAFETY: `at..at + dst.len()` is inside this live device allocation
                // (`range`); `dst` is writable for `dst.len()` bytes and exclusively borrowed
                // until the stream synchronization below, after which the copy has finished.
                check("hipMemcpyDtoHAsync", unsafe {
                    hipMemcpyDtoHAsync(dst.as_mut_ptr().cast(), self.at(at), dst.len(), stream.raw)
                })?;
                stream.synchronize()?;
            }
            Place::PinnedHost => {
                stream.synchronize()?;
                let _host = self
                    .host_access
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                // SAFETY: `at..at + dst.len()` is inside this live host allocation (`range`);
                // `dst` is an exclusive Rust slice, so they do not overlap; the device's work
                // on the stream has finished and other host accesses hold `host_access`.
                unsafe {
                    ptr::copy_nonoverlapping(self.at(at).cast::<u8>(), dst.as_mut_ptr(), dst.len());
                }
            }
        }
        Ok(())
    }

    /// Enqueues copying `len` bytes from `src` at `src_offset` to `dst` at `dst_offset`
    /// (`hipMemcpyDefault`: either may be device or pinned host memory).
    pub(crate) fn copy(
        stream: &Stream,
        src: &Allocation,
        src_offset: u64,
        dst: &Allocation,
        dst_offset: u64,
        len: u64,
    ) -> Result<(), HipError> {
        let n = usize::try_from(len).map_err(|_| too_large("copy", len, 0))?;
        let from = src.range("copy (source)", src_offset, n)?;
        let to = dst.range("copy (destination)", dst_offset, n)?;
        if n == 0 {
            return Ok(());
        }
        // SAFETY: both ranges are inside live allocations of the runtime (`range`), which the
        // runtime recognizes by address under hipMemcpyDefault. They stay allocated until the
        // copy is done: an Allocation synchronizes its stream before freeing.
        check("hipMemcpyAsync", unsafe {
            hipMemcpyAsync(
                dst.at(to),
                src.at(from),
                n,
                hipMemcpyKind::hipMemcpyDefault as c_int,
                stream.raw,
            )
        })?;
        Ok(())
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        if self.base.is_null() {
            return;
        }
        let _ = set_device(self.stream.ordinal());
        // Work enqueued before may still read or write the memory.
        let _ = self.stream.synchronize();
        // SAFETY: `base` is what hipMalloc / hipHostMalloc returned for this value, freed
        // once, here, with the matching call; nothing refers to it afterwards.
        let _ = unsafe {
            match self.place {
                Place::Device => hipFree(self.base),
                Place::PinnedHost => hipHostFree(self.base),
            }
        };
    }
}

/// A point in a stream's work (`hipEventDisableTiming`), destroyed on drop.
#[derive(Debug)]
pub(crate) struct Event {
    raw: hipEvent_t,
    ordinal: c_int,
}

// SAFETY: an opaque handle to a runtime object, valid until Drop; the runtime is thread-safe.
unsafe impl Send for Event {}
// SAFETY: as for Send; waiting on an event from several threads is allowed.
unsafe impl Sync for Event {}

impl Event {
    /// An event after the work enqueued on `stream` so far.
    pub(crate) fn record(stream: &Stream) -> Result<Event, HipCallError> {
        let mut raw: hipEvent_t = ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer.
        check("hipEventCreateWithFlags", unsafe {
            hipEventCreateWithFlags(&mut raw, hipEventDisableTiming)
        })?;
        let event = Event {
            raw,
            ordinal: stream.ordinal(),
        };
        // SAFETY: a live event and a live stream of the current device.
        check("hipEventRecord", unsafe {
            hipEventRecord(event.raw, stream.raw)
        })?;
        Ok(event)
    }

    /// Waits for the event; a fault of the work before it surfaces here.
    pub(crate) fn synchronize(&self) -> Result<(), HipCallError> {
        // SAFETY: `raw` is a live, recorded event.
        check("hipEventSynchronize", unsafe {
            hipEventSynchronize(self.raw)
        })
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let _ = set_device(self.ordinal);
        // SAFETY: `raw` is a live event owned by this value, not used after this call (a
        // pending event's resources are released by the runtime once it completes).
        let _ = unsafe { hipEventDestroy(self.raw) };
    }
}
