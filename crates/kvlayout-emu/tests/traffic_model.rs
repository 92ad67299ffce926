//! The bandwidth model's arithmetic (`kvlayout_emu::model`) on cases worked out by hand.

use kvlayout_device::kernels::{Dim3, Kernel, LaunchConfig};
use kvlayout_emu::model::{
    predict, resident_blocks, wave_fraction, Assumptions, Limit, H100_SXM, H200, MI300X,
};
use kvlayout_emu::{LaunchTraffic, TrafficKind, TrafficReport};

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * b.abs().max(1.0)
}

#[test]
fn resident_blocks_take_the_tightest_limit() {
    // 2048 / 128 = 16 by threads, 65536 / (128 x 64) = 8 by registers, 233472 / 9216 = 25 by
    // shared memory, 32 by blocks.
    assert_eq!(
        resident_blocks(&H100_SXM, 128, 8 << 10, 64),
        (8, Limit::Registers)
    );
    // 8 by threads and 8 by registers: the first found (threads) is named.
    assert_eq!(resident_blocks(&H100_SXM, 256, 0, 32), (8, Limit::Threads));
    // 233472 / (61440 + 1024) = 3.
    assert_eq!(
        resident_blocks(&H100_SXM, 128, 60 << 10, 16),
        (3, Limit::SharedMemory)
    );
    // 32 threads, 16 registers: 64 by threads, 128 by registers: 32 by blocks.
    assert_eq!(resident_blocks(&H100_SXM, 32, 0, 16), (32, Limit::Blocks));
    // MI300X: 2048 / 256 = 8 by threads, 131072 / (256 x 64) = 8 by registers.
    assert_eq!(resident_blocks(&MI300X, 256, 0, 64), (8, Limit::Threads));
    // 65536 / 40000 = 1 by LDS.
    assert_eq!(
        resident_blocks(&MI300X, 64, 40_000, 32),
        (1, Limit::SharedMemory)
    );
    // A block larger than the SM still counts as one.
    assert_eq!(resident_blocks(&MI300X, 64, 100_000, 32).0, 1);
}

#[test]
fn waves_weigh_a_partial_wave_by_its_time() {
    // One partial wave: 128 blocks x 1024 bytes over 3.35e12 x 600e-9 = 2.01e6 bytes.
    let needed = H100_SXM.hbm_bytes_per_s * H100_SXM.latency_s;
    assert!(close(needed, 2.01e6));
    assert!(close(
        wave_fraction(128, 132 * 8, 1024.0, needed),
        131_072.0 / 2.01e6
    ));
    // Two full, saturated waves.
    assert_eq!(wave_fraction(2 * 1056, 1056, 4000.0, needed), 1.0);
    // A full wave of 10 at f = 1 (10 time units), a last wave of 5 at f = 0.5 (10 units):
    // 15 blocks in 20 units.
    assert!(close(wave_fraction(15, 10, 100.0, 1000.0), 0.75));
    assert_eq!(wave_fraction(0, 10, 100.0, 1000.0), 0.0);
    assert_eq!(wave_fraction(10, 10, 0.0, 1000.0), 0.0);
}

fn kind(requests: u64, useful_bytes: u64, sectors: u64) -> TrafficKind {
    TrafficKind {
        requests,
        lane_accesses: requests * 32,
        bytes: useful_bytes,
        useful_bytes,
        sectors,
        lines: sectors / 4,
        unique_sectors: sectors,
        unique_lines: sectors / 4,
    }
}

/// The shape of the decode's old analysis: 128 blocks of 4 warps, 64-byte requests, 4 in
/// flight per warp: 1 KiB per block, 128/132 KiB per SM of the 15227 bytes each SM needs.
fn decode_like(report: TrafficReport) -> LaunchTraffic {
    LaunchTraffic {
        kernel: Kernel::PagedDecode,
        config: LaunchConfig {
            grid: Dim3::new(8, 8, 2),
            block: Dim3::new(128, 1, 1),
            dyn_shared_bytes: 8192,
        },
        warp: 32,
        report: TrafficReport {
            static_shared_bytes: 64,
            ..report
        },
    }
}

#[test]
fn latency_bound_decode() {
    let t = decode_like(TrafficReport {
        cache_loads: kind(1000, 64_000, 2000),
        load_epochs: 250,
        ..TrafficReport::default()
    });
    let p = predict(&t, &H100_SXM, &Assumptions::default());
    assert_eq!(
        (p.resident_blocks_per_sm, p.limited_by),
        (8, Limit::Registers)
    );
    assert!(close(p.waves, 128.0 / 1056.0));
    assert_eq!(p.requests_in_flight_per_warp, 4.0);
    assert!(close(p.bytes_in_flight_per_sm, 128.0 / 132.0 * 1024.0));
    assert!(close(p.bytes_needed_per_sm, 2.01e6 / 132.0));
    assert_eq!(p.sector_efficiency, 1.0);
    assert!(close(p.latency_fraction, 131_072.0 / 2.01e6));
    assert!(close(p.fraction_of_hbm, 131_072.0 / 2.01e6));
    // H200: the same bytes in flight against 4.8e12 x 600e-9 = 2.88e6 needed.
    let p = predict(&t, &H200, &Assumptions::default());
    assert!(close(p.fraction_of_hbm, 131_072.0 / 2.88e6));
}

#[test]
fn caps_stores_and_sector_efficiency() {
    // 40 requests per epoch capped at 4; stores as many sectors as loads double the bytes in
    // flight; 2 useful bytes of each 32-byte sector read or written.
    let t = decode_like(TrafficReport {
        cache_loads: kind(1000, 4_000, 2000),
        cache_stores: kind(1000, 4_000, 2000),
        load_epochs: 25,
        ..TrafficReport::default()
    });
    let p = predict(&t, &H100_SXM, &Assumptions::default());
    assert_eq!(p.requests_in_flight_per_warp, 4.0);
    assert!(close(p.sector_efficiency, 8_000.0 / 128_000.0));
    assert!(close(p.latency_fraction, 2.0 * 131_072.0 / 2.01e6));
    assert!(close(
        p.fraction_of_hbm,
        2.0 * 131_072.0 / 2.01e6 * (1.0 / 16.0)
    ));
    // A deeper pipeline assumed: 32 in flight saturate (4 x 32 x 64 x 2 x 128 > 2.01e6), 16
    // do not.
    let deep = |n| Assumptions {
        max_requests_in_flight_per_warp: n,
        ..Assumptions::default()
    };
    assert_eq!(predict(&t, &H100_SXM, &deep(32.0)).latency_fraction, 1.0);
    assert!(close(
        predict(&t, &H100_SXM, &deep(16.0)).latency_fraction,
        8.0 * 131_072.0 / 2.01e6
    ));
}

#[test]
fn kernels_without_cache_traffic_use_all_of_it() {
    // The reduce: only other loads and stores; efficiency over both.
    let t = decode_like(TrafficReport {
        other_loads: kind(100, 3_200, 200),
        other_stores: kind(100, 3_200, 100),
        load_epochs: 100,
        ..TrafficReport::default()
    });
    let p = predict(&t, &H100_SXM, &Assumptions::default());
    assert!(close(p.sector_efficiency, 6_400.0 / 9_600.0));
    assert_eq!(p.requests_in_flight_per_warp, 1.0);
    // 4 warps x 1 x 64 bytes x (300 / 200 sectors).
    assert!(close(p.bytes_in_flight_per_sm, 128.0 / 132.0 * 384.0));
    // Nothing loaded: nothing in flight.
    let idle = decode_like(TrafficReport::default());
    assert_eq!(
        predict(&idle, &H100_SXM, &Assumptions::default()).fraction_of_hbm,
        0.0
    );
}
