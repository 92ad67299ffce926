//! [`CudaDevice`]: opening a device and the [`Device`] contract on it.

use std::sync::Arc;

use kvlayout_device::kernels::{GpuTarget, KernelCall};
use kvlayout_device::{Device, Place};

use crate::driver::{self, CudaBuffer, CudaEvent, DeviceHandles};
use crate::error::CudaError;
use crate::kernels::{choose_kernels, embedded_ptx, kernel_image, KernelPolicy, KernelSource};

/// What an opened device is, for reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Ordinal in the driver's list.
    pub ordinal: usize,
    /// The driver's name of the device.
    pub name: String,
    /// Compute capability `(major, minor)`.
    pub capability: (i32, i32),
    /// The kernels it loaded.
    pub kernels: KernelSource,
    /// PTX ISA version of those kernels.
    pub ptx_version: String,
    /// Streaming multiprocessors (`CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`): the decode's
    /// partitions are sized to fill them.
    pub sm_count: u32,
}

/// One NVIDIA GPU through the CUDA driver: its primary context, a non-blocking stream and
/// the project's kernels loaded into a module.
#[derive(Debug)]
pub struct CudaDevice {
    handles: Arc<DeviceHandles>,
    info: DeviceInfo,
}

impl CudaDevice {
    /// Device `ordinal`, with the kernels [`KernelPolicy::from_env`] allows.
    pub fn open(ordinal: usize) -> Result<CudaDevice, CudaError> {
        CudaDevice::open_with(ordinal, KernelPolicy::from_env()?)
    }

    /// Device `ordinal`, with the kernels `policy` allows.
    pub fn open_with(ordinal: usize, policy: KernelPolicy) -> Result<CudaDevice, CudaError> {
        if !driver::driver_present() {
            return Err(CudaError::NoDriver {
                why: "libcuda (the NVIDIA driver library) not found on the library path".into(),
            });
        }
        let no_device = |count, why: String| CudaError::NoDevice {
            ordinal,
            count,
            why,
        };
        let count = driver::device_count().map_err(|why| no_device(0, why))?;
        if count == 0 {
            return Err(no_device(0, "the driver lists no device".into()));
        }
        if ordinal >= count {
            return Err(no_device(count, "ordinal past the last device".into()));
        }
        let ctx = driver::primary_context(ordinal)?;
        let (name, capability, unified, sm_count) = driver::device_properties(&ctx)?;
        if !unified {
            return Err(CudaError::NoUnifiedAddressing { device: name });
        }
        let kernels = choose_kernels(capability, embedded_ptx(), policy)?;
        let (image, ptx_version) = kernel_image(&kernels)?;
        let handles = DeviceHandles::open(ctx, &image, &kernels.to_string(), &ptx_version)?;
        Ok(CudaDevice {
            handles: Arc::new(handles),
            info: DeviceInfo {
                ordinal,
                name,
                capability,
                kernels,
                ptx_version,
                sm_count,
            },
        })
    }

    /// The device and the kernels it loaded.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }
}

impl Device for CudaDevice {
    type Buffer = CudaBuffer;
    type Event = CudaEvent;
    type Error = CudaError;

    fn name(&self) -> &str {
        "cuda"
    }

    fn target(&self) -> GpuTarget {
        GpuTarget::CUDA.with_sm_count(self.info.sm_count)
    }

    fn alloc(&self, len: u64, misalign: u64, place: Place) -> Result<CudaBuffer, CudaError> {
        driver::alloc(&self.handles, len, misalign, place)
    }

    fn address(&self, buf: &CudaBuffer) -> u64 {
        buf.address()
    }

    fn len(&self, buf: &CudaBuffer) -> u64 {
        buf.len()
    }

    fn upload(&self, dst: &CudaBuffer, src: &[u8]) -> Result<(), CudaError> {
        driver::upload(&self.handles, dst, src)
    }

    fn download(&self, src: &CudaBuffer, dst: &mut [u8]) -> Result<(), CudaError> {
        driver::download(&self.handles, src, dst)
    }

    fn copy(
        &self,
        src: &CudaBuffer,
        src_offset: u64,
        dst: &CudaBuffer,
        dst_offset: u64,
        len: u64,
    ) -> Result<(), CudaError> {
        driver::copy(&self.handles, (src, src_offset), (dst, dst_offset), len)
    }

    #[allow(unsafe_code)]
    unsafe fn launch(&self, call: &KernelCall) -> Result<(), CudaError> {
        let args = call.args.block();
        self.handles.launch(call.args.kernel(), &call.config, &args)
    }

    fn record(&self) -> Result<CudaEvent, CudaError> {
        driver::record(&self.handles)
    }

    fn wait(&self, event: &CudaEvent) -> Result<(), CudaError> {
        driver::wait(&self.handles, event)
    }

    fn synchronize(&self) -> Result<(), CudaError> {
        self.handles.synchronize()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvlayout_device::DeviceBackend;

    fn send_sync<T: Send + Sync>() {}

    #[test]
    fn devices_buffers_and_events_cross_threads() {
        send_sync::<CudaDevice>();
        send_sync::<CudaBuffer>();
        send_sync::<CudaEvent>();
        send_sync::<DeviceBackend<CudaDevice>>();
    }
}
