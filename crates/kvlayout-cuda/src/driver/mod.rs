//! The CUDA driver calls, and every `unsafe` block that makes them.
//!
//! [`DeviceHandles`] owns one opened device's primary context (through cudarc's
//! [`CudaContext`]), its non-blocking stream and the kernels' module, and launches the
//! kernels. [`memory`] holds the buffers and the copies, [`event`] the events; both keep the
//! handles alive and free what they own on drop. Every function binds the context to the
//! calling thread first and maps each failing call to [`CudaError`].

mod event;
mod memory;

pub use event::CudaEvent;
pub(crate) use event::{record, wait};
pub use memory::CudaBuffer;
pub(crate) use memory::{alloc, copy, download, upload};

use std::ffi::{c_uint, c_void, CStr};
use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::result;
use cudarc::driver::sys::{self, CUdevice_attribute, CUjit_option};
use cudarc::driver::CudaContext;
use kvlayout_device::kernels::{Kernel, LaunchConfig};

use crate::error::{driver, result_name, CudaError};

/// Whether the driver library (libcuda) loads.
pub(crate) fn driver_present() -> bool {
    // SAFETY: only tries to open each candidate library name; calls no CUDA function.
    unsafe { sys::is_culib_present() }
}

/// `cuInit`, then the number of devices; `Err` is the failing call and its result.
pub(crate) fn device_count() -> Result<usize, String> {
    result::init().map_err(|e| format!("cuInit: {}", result_name(e)))?;
    let n =
        result::device::get_count().map_err(|e| format!("cuDeviceGetCount: {}", result_name(e)))?;
    Ok(usize::try_from(n).unwrap_or(0))
}

/// The primary context of device `ordinal` (which [`device_count`] counted).
pub(crate) fn primary_context(ordinal: usize) -> Result<Arc<CudaContext>, CudaError> {
    CudaContext::new(ordinal).map_err(driver("cuDevicePrimaryCtxRetain (CudaContext::new)"))
}

/// Name, compute capability, unified addressing and multiprocessor count of the context's
/// device.
pub(crate) fn device_properties(
    ctx: &CudaContext,
) -> Result<(String, (i32, i32), bool, u32), CudaError> {
    let attr = |a: CUdevice_attribute| ctx.attribute(a).map_err(driver("cuDeviceGetAttribute"));
    let major = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    let unified = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING)? != 0;
    let sm_count = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
    let mut name = [0u8; 256];
    // SAFETY: the buffer holds `len` bytes; the driver writes a NUL-terminated name into it.
    unsafe {
        sys::cuDeviceGetName(name.as_mut_ptr().cast(), name.len() as i32, ctx.cu_device())
            .result()
            .map_err(driver("cuDeviceGetName"))?;
    }
    let name = CStr::from_bytes_until_nul(&name)
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok((
        name,
        (major, minor),
        unified,
        u32::try_from(sm_count).unwrap_or(0),
    ))
}

/// Entry points in [`Kernel::ALL`] order.
const KERNELS: usize = Kernel::ALL.len();

fn kernel_index(kernel: Kernel) -> usize {
    match kernel {
        Kernel::WriteKv => 0,
        Kernel::PagedDecode => 1,
        Kernel::PagedDecodeReduce => 2,
        Kernel::MoveBlocks => 3,
    }
}

/// One opened device: its context, its stream and the loaded kernels.
#[derive(Debug)]
pub(crate) struct DeviceHandles {
    ctx: Arc<CudaContext>,
    stream: sys::CUstream,
    module: sys::CUmodule,
    functions: [sys::CUfunction; KERNELS],
    /// Whether the device has stream-ordered allocation (`cuMemAllocAsync`).
    async_alloc: bool,
    /// Held while enqueueing copies and launches, and while the host touches pinned memory
    /// after a stream synchronization, so no transfer enqueued by another thread meanwhile
    /// races the host's access.
    order: Mutex<()>,
}

// SAFETY: the handles are plain driver handles; the driver API is thread-safe, and every
// method binds the context to the calling thread before using them.
unsafe impl Send for DeviceHandles {}
// SAFETY: as for `Send`; the methods take `&self` and the driver serializes work on the stream.
unsafe impl Sync for DeviceHandles {}

/// What the JIT compiler may write into the error log of a module load.
const JIT_LOG_BYTES: usize = 16 << 10;

impl DeviceHandles {
    /// A non-blocking stream on `ctx` and the module of the NUL-terminated PTX `image` (named
    /// `source_name`, of ISA `ptx_version`, in errors), with its four kernels.
    pub(crate) fn open(
        ctx: Arc<CudaContext>,
        image: &[u8],
        source_name: &str,
        ptx_version: &str,
    ) -> Result<DeviceHandles, CudaError> {
        ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        let stream = result::stream::create(result::stream::StreamKind::NonBlocking)
            .map_err(driver("cuStreamCreate"))?;
        let mut handles = DeviceHandles {
            async_alloc: ctx.has_async_alloc(),
            ctx,
            stream,
            module: std::ptr::null_mut(),
            functions: [std::ptr::null_mut(); KERNELS],
            order: Mutex::new(()),
        };
        // From here on, dropping `handles` destroys what was created.
        if image.last() != Some(&0) {
            return Err(CudaError::NoKernels {
                why: format!("{source_name}: image not NUL-terminated"),
            });
        }
        let mut log = vec![0u8; JIT_LOG_BYTES];
        let mut options = [
            CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
            CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
        ];
        let mut values: [*mut c_void; 2] = [
            log.as_mut_ptr().cast(),
            std::ptr::without_provenance_mut(log.len()),
        ];
        // SAFETY: `image` is NUL-terminated PTX text; the log buffer outlives the call and
        // its size is passed by value, as the option requires; the module is written on
        // success only.
        let loaded = unsafe {
            sys::cuModuleLoadDataEx(
                &mut handles.module,
                image.as_ptr().cast(),
                options.len() as c_uint,
                options.as_mut_ptr(),
                values.as_mut_ptr(),
            )
        }
        .result();
        if let Err(e) = loaded {
            handles.module = std::ptr::null_mut();
            let log = CStr::from_bytes_until_nul(&log)
                .map(|c| c.to_string_lossy().trim().to_string())
                .unwrap_or_default();
            return Err(CudaError::ModuleLoad {
                call: "cuModuleLoadDataEx",
                source_name: source_name.to_string(),
                ptx_version: ptx_version.to_string(),
                result: result_name(e),
                log,
            });
        }
        for kernel in Kernel::ALL {
            let name = kernel.name();
            let missing = |e| CudaError::MissingKernel {
                kernel: name,
                source_name: source_name.to_string(),
                result: result_name(e),
            };
            let cname = std::ffi::CString::new(name).map_err(|_| CudaError::NoKernels {
                why: format!("kernel name {name:?} holds a NUL byte"),
            })?;
            // SAFETY: the module was loaded above and is unloaded only by `drop`; the name is
            // NUL-terminated.
            let f =
                unsafe { result::module::get_function(handles.module, cname) }.map_err(missing)?;
            handles.functions[kernel_index(kernel)] = f;
        }
        Ok(handles)
    }

    fn bind(&self) -> Result<(), CudaError> {
        self.ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))
    }

    fn order(&self) -> MutexGuard<'_, ()> {
        // A panic while holding the guard leaves nothing inconsistent: it guards no data.
        self.order.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for the work enqueued on the stream.
    pub(crate) fn synchronize(&self) -> Result<(), CudaError> {
        self.bind()?;
        self.sync_bound()
    }

    fn sync_bound(&self) -> Result<(), CudaError> {
        // SAFETY: the stream lives as long as `self`.
        unsafe { result::stream::synchronize(self.stream) }.map_err(driver("cuStreamSynchronize"))
    }

    /// Enqueues `kernel` with `config` and the packed argument block `args`.
    pub(crate) fn launch(
        &self,
        kernel: Kernel,
        config: &LaunchConfig,
        args: &[u8],
    ) -> Result<(), CudaError> {
        // The block, copied to 8-aligned storage (every parameter is 8-aligned).
        let mut words = vec![0u64; args.len().div_ceil(8)];
        for (w, chunk) in words.iter_mut().zip(args.chunks(8)) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            *w = u64::from_ne_bytes(b);
        }
        let mut size: usize = args.len();
        let mut extra: [*mut c_void; 5] = [
            std::ptr::without_provenance_mut(sys::CU_LAUNCH_PARAM_BUFFER_POINTER_AS_INT as usize),
            words.as_mut_ptr().cast(),
            std::ptr::without_provenance_mut(sys::CU_LAUNCH_PARAM_BUFFER_SIZE_AS_INT as usize),
            (&mut size as *mut usize).cast(),
            std::ptr::without_provenance_mut(sys::CU_LAUNCH_PARAM_END_AS_INT as usize),
        ];
        self.bind()?;
        let _order = self.order();
        // SAFETY: the function belongs to the module `self` keeps loaded; `extra` holds the
        // buffer pointer, a pointer to its size and the end marker, all alive during the call,
        // which copies the arguments. The kernel reads and writes the addresses in `args`:
        // `DeviceBackend` builds them from live buffers it checked against their layouts.
        unsafe {
            sys::cuLaunchKernel(
                self.functions[kernel_index(kernel)],
                config.grid.x,
                config.grid.y,
                config.grid.z,
                config.block.x,
                config.block.y,
                config.block.z,
                config.dyn_shared_bytes,
                self.stream,
                std::ptr::null_mut(),
                extra.as_mut_ptr(),
            )
        }
        .result()
        .map_err(driver("cuLaunchKernel"))
    }
}

impl Drop for DeviceHandles {
    fn drop(&mut self) {
        // Failures are ignored: nothing is left to report them to.
        if self.ctx.bind_to_thread().is_err() {
            return;
        }
        // SAFETY: the stream and module were created by `open` and are released once, here,
        // after the work on the stream has finished; buffers and events hold an `Arc` to
        // `self`, so none is left.
        unsafe {
            let _ = result::stream::synchronize(self.stream);
            if !self.module.is_null() {
                let _ = result::module::unload(self.module);
            }
            let _ = result::stream::destroy(self.stream);
        }
    }
}
