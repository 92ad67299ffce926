//! The HIP runtime functions this crate calls, declared with [`Status`] for `hipError_t`
//! (see the parent module for why), and the launch-parameter markers `bindgen` does not
//! translate. Declarations only: the calls, each in an `unsafe` block with its `SAFETY`
//! argument, are in the sibling modules.

use std::ffi::{c_char, c_int, c_uint, c_void};

use hip_sys::hiprt::{hipEvent_t, hipFunction_t, hipModule_t, hipStream_t};

/// A `hipError_t` as the runtime returns it (a 32-bit C enum), read as its integer.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Status(pub(super) c_int);

/// `hipSuccess`.
pub(super) const SUCCESS: Status = Status(0);

/// `HIP_LAUNCH_PARAM_BUFFER_POINTER`, `HIP_LAUNCH_PARAM_BUFFER_SIZE`, `HIP_LAUNCH_PARAM_END`
/// of `hip_runtime_api.h` (`((void*)0x01)` to `((void*)0x03)`; bindgen does not translate
/// them).
pub(super) const LAUNCH_PARAM_BUFFER_POINTER: usize = 0x01;
pub(super) const LAUNCH_PARAM_BUFFER_SIZE: usize = 0x02;
pub(super) const LAUNCH_PARAM_END: usize = 0x03;

extern "C" {
    pub(super) fn hipInit(flags: c_uint) -> Status;
    pub(super) fn hipGetDeviceCount(count: *mut c_int) -> Status;
    pub(super) fn hipSetDevice(device_id: c_int) -> Status;
    pub(super) fn hipGetErrorName(error: Status) -> *const c_char;
    pub(super) fn hipGetErrorString(error: Status) -> *const c_char;
    pub(super) fn hipStreamCreateWithFlags(stream: *mut hipStream_t, flags: c_uint) -> Status;
    pub(super) fn hipStreamSynchronize(stream: hipStream_t) -> Status;
    pub(super) fn hipStreamDestroy(stream: hipStream_t) -> Status;
    pub(super) fn hipModuleLoadData(module: *mut hipModule_t, image: *const c_void) -> Status;
    pub(super) fn hipModuleGetFunction(
        function: *mut hipFunction_t,
        module: hipModule_t,
        name: *const c_char,
    ) -> Status;
    pub(super) fn hipModuleUnload(module: hipModule_t) -> Status;
    // The runtime's signature: three grid and three block dimensions, shared bytes, stream,
    // parameters and `extra`, each a separate C argument.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn hipModuleLaunchKernel(
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
    pub(super) fn hipMalloc(ptr: *mut *mut c_void, size: usize) -> Status;
    pub(super) fn hipFree(ptr: *mut c_void) -> Status;
    pub(super) fn hipHostMalloc(ptr: *mut *mut c_void, size: usize, flags: c_uint) -> Status;
    pub(super) fn hipHostFree(ptr: *mut c_void) -> Status;
    pub(super) fn hipHostGetDevicePointer(
        device_ptr: *mut *mut c_void,
        host_ptr: *mut c_void,
        flags: c_uint,
    ) -> Status;
    pub(super) fn hipMemcpyHtoDAsync(
        dst: *mut c_void,
        src: *mut c_void,
        size: usize,
        stream: hipStream_t,
    ) -> Status;
    pub(super) fn hipMemcpyDtoHAsync(
        dst: *mut c_void,
        src: *mut c_void,
        size: usize,
        stream: hipStream_t,
    ) -> Status;
    pub(super) fn hipMemcpyAsync(
        dst: *mut c_void,
        src: *const c_void,
        size: usize,
        kind: c_int,
        stream: hipStream_t,
    ) -> Status;
    pub(super) fn hipEventCreateWithFlags(event: *mut hipEvent_t, flags: c_uint) -> Status;
    pub(super) fn hipEventRecord(event: hipEvent_t, stream: hipStream_t) -> Status;
    pub(super) fn hipEventSynchronize(event: hipEvent_t) -> Status;
    pub(super) fn hipEventDestroy(event: hipEvent_t) -> Status;
}
