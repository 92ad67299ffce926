//! Opening a HIP device: without one, a typed [`HipError::NoDevice`] with the runtime's
//! reason, never a panic (the test prints `skipped: hip: <why>`); with one, a smoke check of
//! the backend — a device cache uploaded, blocks copied by the mover kernel, downloaded and
//! compared with the same bytes moved by hand from the layout's offsets, and a round trip
//! through a pinned host cache with `swap_blocks`. `KVLAYOUT_REQUIRE_GPU=1` makes a device
//! that does not open a failure.

#[path = "../../kvlayout-device/tests/shared/mod.rs"]
mod shared;

use kvlayout::ops::{Backend, BufferShape, HostTensor};
use kvlayout::KvCacheLayout;
use kvlayout_device::{Device, DeviceBackend, Place};
use kvlayout_hip::{hip, HipDevice, HipError};
use shared::moved;

fn require_gpu() -> bool {
    std::env::var("KVLAYOUT_REQUIRE_GPU").is_ok_and(|v| v == "1" || v == "hip")
}

/// Writes `skipped: <what>: <why>` straight to stderr, past the test harness's capture, so
/// CI logs show (and count) it.
fn skip(what: &str, why: &dyn std::fmt::Display) {
    use std::io::Write;
    let _ = std::io::stderr()
        .lock()
        .write_all(format!("skipped: {what}: {why}\n").as_bytes());
}

/// Device 0's backend, or `None` after printing why it is skipped.
fn backend() -> Option<DeviceBackend<HipDevice>> {
    match hip(0) {
        Ok(b) => Some(b),
        Err(e) => {
            assert!(
                !require_gpu(),
                "KVLAYOUT_REQUIRE_GPU requires hip, but: {e}"
            );
            skip("hip", &e);
            None
        }
    }
}

#[test]
fn open_without_a_device_is_a_typed_error() {
    match HipDevice::open(0) {
        Ok(dev) => {
            let o = dev.code_object();
            eprintln!("hip: device 0 loaded the {} code object", o.arch);
            assert_eq!(dev.target().warp, o.wavefront_size);
            assert_eq!(dev.name(), "hip");
        }
        Err(e) => {
            assert!(
                !require_gpu(),
                "KVLAYOUT_REQUIRE_GPU requires hip, but: {e}"
            );
            if let HipError::NoDevice {
                ordinal,
                count,
                why,
            } = &e
            {
                assert_eq!(*ordinal, 0);
                if *count == 0 && why.contains("hip") {
                    // The runtime's own words: the call and hipGetErrorName's name.
                    assert!(why.contains("hipError"), "{why}");
                }
            }
            skip("hip", &e);
        }
    }
}

#[test]
fn an_ordinal_past_the_devices_is_no_device() {
    match HipDevice::open(usize::MAX) {
        Err(HipError::NoDevice { ordinal, why, .. }) => {
            assert_eq!(ordinal, usize::MAX);
            assert!(!why.is_empty());
        }
        other => panic!("expected NoDevice, got {other:?}"),
    }
}

/// Bytes `i` of buffer `b`: a pattern no two blocks share.
fn pattern(len: u64, b: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ (b as u8).wrapping_mul(7) ^ salt)
        .collect()
}

#[test]
fn smoke_copy_blocks_and_pinned_swap() {
    let Some(backend) = backend() else {
        return;
    };
    let layout: KvCacheLayout = "kv B=3 N=16 H=4 D=8 dtype=f16 order=HND"
        .parse()
        .expect("layout");
    let shapes = BufferShape::exact(&layout);
    let initial: Vec<Vec<u8>> = shapes
        .iter()
        .enumerate()
        .map(|(b, s)| pattern(s.len, b, 0x5a))
        .collect();

    // Device cache: the mover kernel.
    let mut cache = backend.alloc_cache(&layout, &shapes).expect("alloc");
    backend.upload_cache(&mut cache, &initial).expect("upload");
    let pairs = [(0, 2), (1, 0)];
    let done = backend
        .copy_blocks(&mut cache, &pairs)
        .expect("copy_blocks");
    backend.wait(done).expect("wait copy_blocks");
    let got = backend.download_cache(&cache).expect("download");
    assert_eq!(
        got,
        moved(&layout, &initial, &initial, &pairs),
        "copy_blocks"
    );

    // Pinned host cache: byte-run copies both ways.
    let mut host = backend.alloc_host_cache(&layout).expect("alloc host");
    assert!(host
        .buffers()
        .iter()
        .all(|b| b.place() == Place::PinnedHost));
    let host_initial: Vec<Vec<u8>> = shapes
        .iter()
        .enumerate()
        .map(|(b, s)| pattern(s.len, b, 0xc3))
        .collect();
    backend
        .upload_cache(&mut host, &host_initial)
        .expect("upload host");
    let out = [(2, 1)];
    let done = backend
        .swap_blocks(&cache, &mut host, &out)
        .expect("swap out");
    backend.wait(done).expect("wait swap out");
    let host_got = backend.download_cache(&host).expect("download host");
    let host_want = moved(&layout, &got, &host_initial, &out);
    assert_eq!(host_got, host_want, "swap to pinned host");

    let back = [(1, 1)];
    let done = backend
        .swap_blocks(&host, &mut cache, &back)
        .expect("swap in");
    backend.wait(done).expect("wait swap in");
    let got2 = backend
        .download_cache(&cache)
        .expect("download after swap in");
    assert_eq!(
        got2,
        moved(&layout, &host_want, &got, &back),
        "swap from pinned host"
    );

    // Activation tensors round trip.
    let t = HostTensor::F32((0..37).map(|i| i as f32 * 0.5).collect());
    let dev_t = backend.upload_tensor(&t).expect("upload tensor");
    assert_eq!(backend.download_tensor(&dev_t).expect("download tensor"), t);
    backend.synchronize().expect("synchronize");
}

#[test]
fn device_refuses_out_of_range_copies_and_bad_blocks() {
    let Some(backend) = backend() else {
        return;
    };
    let dev = backend.device();
    for place in [Place::Device, Place::PinnedHost] {
        let empty = dev.alloc(0, 0, place).expect("empty alloc");
        assert_eq!((dev.len(&empty), dev.address(&empty)), (0, 0));
        let a = dev.alloc(64, 3, place).expect("alloc");
        let b = dev.alloc(64, 0, place).expect("alloc");
        assert_eq!(dev.address(&a) % 256, 3, "{place:?} misalignment");
        assert!(matches!(
            dev.upload(&a, &[0; 65]),
            Err(HipError::OutOfRange { .. })
        ));
        assert!(matches!(
            dev.download(&a, &mut [0; 65]),
            Err(HipError::OutOfRange { .. })
        ));
        assert!(matches!(
            dev.copy(&a, 60, &b, 0, 5),
            Err(HipError::OutOfRange { .. })
        ));
        assert!(matches!(
            dev.copy(&a, 0, &b, u64::MAX, 1),
            Err(HipError::OutOfRange { .. })
        ));
        let bytes: Vec<u8> = (0..64).collect();
        dev.upload(&a, &bytes).expect("upload");
        dev.copy(&a, 8, &b, 0, 56).expect("copy");
        let mut out = vec![0u8; 56];
        dev.download(&b, &mut out).expect("download");
        assert_eq!(out, bytes[8..]);
    }
    assert!(matches!(
        dev.alloc(u64::MAX, 1, Place::Device),
        Err(HipError::TooLarge { .. })
    ));
}
