//! Code objects and kernels: a loaded [`Module`] and its [`Function`]s, and the launch of a
//! kernel with its packed argument block.

use std::ffi::{c_int, c_void};
use std::ptr;
use std::sync::Arc;

use hip_sys::hiprt::{hipFunction_t, hipModule_t};
use kvlayout_device::kernels::{arg_slots, Kernel, LaunchConfig};

use super::runtime::{set_device, Stream};
use super::status::check;
use super::sys::{
    hipModuleGetFunction, hipModuleLaunchKernel, hipModuleLoadData, hipModuleUnload,
    LAUNCH_PARAM_BUFFER_POINTER, LAUNCH_PARAM_BUFFER_SIZE, LAUNCH_PARAM_END,
};
use crate::code_objects::elf_extent;
use crate::error::{HipCallError, HipError};

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
