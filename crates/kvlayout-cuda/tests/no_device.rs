//! Opening a device: without a driver or a device, a typed error and a visible skip (a
//! failure under `KVLAYOUT_REQUIRE_GPU=1`); with one, a smoke check through `DeviceBackend`:
//! a device cache moved by the mover kernel and a pinned host cache swapped both ways by
//! copies, each compared with the bytes moved by hand from the layout's block regions.

mod common;

use common::shared::moved;
use common::{report, skip};
use kvlayout::ops::{Backend, BufferShape};
use kvlayout::KvCacheLayout;
use kvlayout_cuda::{availability, cuda, CudaDevice, CudaError, KernelPolicy};
use kvlayout_device::{Device, DeviceBackend, Place};

const LAYOUT: &str = "kv B=3 N=16 H=4 D=8 dtype=f16 order=HND";

/// The device, or `None` after a visible skip of `what` when there is no driver or no device.
fn device(what: &str) -> Option<CudaDevice> {
    match CudaDevice::open(0) {
        Ok(d) => Some(d),
        Err(e @ (CudaError::NoDriver { .. } | CudaError::NoDevice { .. })) => {
            skip(what, &e.to_string(), "KVLAYOUT_REQUIRE_GPU");
            None
        }
        Err(e) => panic!("a CUDA device is present but does not open: {e}"),
    }
}

#[test]
fn opening_is_a_device_or_a_typed_error() {
    let Some(dev) = device("cuda") else {
        // Every entry point refuses the same way, without panicking.
        assert!(availability().is_err());
        assert!(cuda(0).is_err());
        for policy in [KernelPolicy::Nvrtc, KernelPolicy::Embedded] {
            let e = CudaDevice::open_with(0, policy).unwrap_err();
            assert!(
                matches!(e, CudaError::NoDriver { .. } | CudaError::NoDevice { .. }),
                "{e:?}"
            );
        }
        return;
    };
    let info = dev.info();
    report(&format!(
        "cuda: device {} ({}, compute {}.{}): {} (PTX ISA {})",
        info.ordinal,
        info.name,
        info.capability.0,
        info.capability.1,
        info.kernels,
        info.ptx_version
    ));
    assert_eq!(availability(), Ok(()));
    let past = CudaDevice::open(usize::MAX).unwrap_err();
    assert!(matches!(past, CudaError::NoDevice { .. }), "{past:?}");
}

#[test]
fn buffers_round_trip_and_refuse_ranges_past_their_end() {
    let Some(dev) = device("cuda buffers") else {
        return;
    };
    for place in [Place::Device, Place::PinnedHost] {
        let bytes: Vec<u8> = (0..100u32).map(|i| (i * 7 + 1) as u8).collect();
        let buf = dev.alloc(100, 3, place).unwrap();
        assert_eq!(dev.address(&buf) % 8, 3, "{place:?}");
        dev.upload(&buf, &bytes).unwrap();
        let other = dev.alloc(100, 0, place).unwrap();
        dev.copy(&buf, 10, &other, 0, 90).unwrap();
        let mut back = vec![0u8; 90];
        dev.download(&other, &mut back).unwrap();
        assert_eq!(back, bytes[10..], "{place:?}");
        assert!(matches!(
            dev.upload(&buf, &[0; 101]),
            Err(CudaError::OutOfRange { .. })
        ));
        assert!(matches!(
            dev.copy(&buf, 50, &other, 0, 51),
            Err(CudaError::OutOfRange { .. })
        ));
        assert!(matches!(
            dev.download(&buf, &mut [0; 101]),
            Err(CudaError::OutOfRange { .. })
        ));
        let empty = dev.alloc(0, 0, place).unwrap();
        dev.upload(&empty, &[]).unwrap();
        dev.download(&empty, &mut []).unwrap();
    }
    dev.synchronize().unwrap();
}

fn pattern(layout: &KvCacheLayout, seed: u32) -> Vec<Vec<u8>> {
    layout
        .extents()
        .iter()
        .map(|x| {
            (0..x.end as u32)
                .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13) as u8)
                .collect()
        })
        .collect()
}

#[test]
fn blocks_move_through_the_backend_as_the_layout_says() {
    let Some(dev) = device("cuda backend") else {
        return;
    };
    let be = DeviceBackend::new(dev);
    let layout: KvCacheLayout = LAYOUT.parse().unwrap();

    // Device cache: the mover kernel.
    let mut cache = be
        .alloc_cache(&layout, &BufferShape::exact(&layout))
        .unwrap();
    let bytes = pattern(&layout, 1);
    be.upload_cache(&mut cache, &bytes).unwrap();
    be.wait(be.copy_blocks(&mut cache, &[(0, 2)]).unwrap())
        .unwrap();
    let after = moved(&layout, &bytes, &bytes, &[(0, 2)]);
    assert_ne!(after, bytes);
    assert_eq!(be.download_cache(&cache).unwrap(), after);

    // Pinned host cache: swapped in and out by copies.
    let mut host = be.alloc_host_cache(&layout).unwrap();
    let host_bytes = pattern(&layout, 2);
    be.upload_cache(&mut host, &host_bytes).unwrap();
    be.wait(be.swap_blocks(&host, &mut cache, &[(1, 0)]).unwrap())
        .unwrap();
    let after = moved(&layout, &host_bytes, &after, &[(1, 0)]);
    assert_eq!(be.download_cache(&cache).unwrap(), after);
    be.wait(be.swap_blocks(&cache, &mut host, &[(2, 1)]).unwrap())
        .unwrap();
    let host_after = moved(&layout, &after, &host_bytes, &[(2, 1)]);
    assert_eq!(be.download_cache(&host).unwrap(), host_after);
    be.synchronize().unwrap();
}
