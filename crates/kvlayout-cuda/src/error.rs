//! [`CudaError`]: every way the CUDA backend fails, each driver or NVRTC failure with the
//! call and the result's name.

use cudarc::driver::DriverError;
use cudarc::nvrtc::result::NvrtcError;

/// A failure of the CUDA backend.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CudaError {
    /// The CUDA driver library (libcuda) is not installed.
    #[error("no CUDA driver: {why}")]
    NoDriver {
        /// What was looked for.
        why: String,
    },
    /// The driver has no device at the ordinal (or none at all).
    #[error("no CUDA device {ordinal}: {why} ({count} devices)")]
    NoDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// Devices the driver reports (0 when `cuInit` failed).
        count: usize,
        /// What failed.
        why: String,
    },
    /// The device lacks unified addressing, which pinned host buffers rely on.
    #[error("CUDA device {device}: no unified addressing")]
    NoUnifiedAddressing {
        /// Device name.
        device: String,
    },
    /// The NVRTC library (libnvrtc) is not installed.
    #[error("no NVRTC: {why}")]
    NoNvrtc {
        /// What was looked for.
        why: String,
    },
    /// No kernel source fits the device under the `KVLAYOUT_CUDA_KERNELS` setting.
    #[error("no CUDA kernels: {why}")]
    NoKernels {
        /// Why.
        why: String,
    },
    /// A driver call failed.
    #[error("{call}: {result}")]
    Driver {
        /// The driver function.
        call: &'static str,
        /// The `CUresult` name.
        result: String,
    },
    /// The driver refused the kernels' PTX (`cuModuleLoadDataEx`).
    #[error("{call} of {source_name} (PTX ISA {ptx_version}): {result}: {log}")]
    ModuleLoad {
        /// The driver function.
        call: &'static str,
        /// Which PTX: embedded `sm_xx` or NVRTC `compute_xx`.
        source_name: String,
        /// The PTX's `.version` (drivers load ISA versions up to their CUDA release).
        ptx_version: String,
        /// The `CUresult` name.
        result: String,
        /// The JIT compiler's error log.
        log: String,
    },
    /// The loaded module lacks a kernel entry point.
    #[error("cuModuleGetFunction({kernel}) in {source_name}: {result}")]
    MissingKernel {
        /// Entry point name.
        kernel: &'static str,
        /// Which PTX.
        source_name: String,
        /// The `CUresult` name.
        result: String,
    },
    /// An NVRTC call failed.
    #[error("{call} ({arch}): {result}{}", log_suffix(.log))]
    Nvrtc {
        /// The NVRTC function.
        call: &'static str,
        /// The virtual architecture compiled for.
        arch: String,
        /// The `nvrtcResult` name.
        result: String,
        /// The program log.
        log: String,
    },
    /// A byte range past the end of a buffer.
    #[error("{what}: bytes {offset}..{offset}+{len} of a {buffer_len}-byte buffer")]
    OutOfRange {
        /// Which access.
        what: &'static str,
        /// First byte.
        offset: u64,
        /// Bytes.
        len: u64,
        /// Bytes of the buffer.
        buffer_len: u64,
    },
    /// A size that does not fit the address space.
    #[error("{what}: {len} + {misalign} bytes overflow")]
    TooLarge {
        /// Which allocation.
        what: &'static str,
        /// Bytes asked for.
        len: u64,
        /// Offset of the start past the aligned base.
        misalign: u64,
    },
    /// A buffer or event of another [`crate::CudaDevice`].
    #[error("{what}: belongs to another CUDA device")]
    ForeignHandle {
        /// Which argument.
        what: &'static str,
    },
}

/// `log` on lines of its own after a colon, or nothing when empty.
fn log_suffix(log: &str) -> String {
    if log.is_empty() {
        String::new()
    } else {
        format!(":\n{log}")
    }
}

/// `Err` of a driver call `call`.
pub(crate) fn driver(call: &'static str) -> impl Fn(DriverError) -> CudaError {
    move |e| CudaError::Driver {
        call,
        result: result_name(e),
    }
}

/// The `CUresult` name of `e` (the variant name, as `cuGetErrorName` spells it).
pub(crate) fn result_name(e: DriverError) -> String {
    format!("{:?}", e.0)
}

/// `Err` of an NVRTC call `call` compiling for `arch`.
pub(crate) fn nvrtc(
    call: &'static str,
    arch: &str,
    log: String,
) -> impl FnOnce(NvrtcError) -> CudaError {
    let arch = arch.to_string();
    move |e| CudaError::Nvrtc {
        call,
        arch,
        result: format!("{:?}", e.0),
        log,
    }
}
