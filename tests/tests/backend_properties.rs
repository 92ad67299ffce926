//! The backends on host memory against the scalar reference over random layouts of every kind
//! (`kvlayout_conformance::gen`): the CPU backend's fast paths and the GPU kernels under the
//! emulator (`cuda-emu`, `hip-emu` with a seeded fiber order). Byte-identical results for the
//! block movers and for `write_kv`, decode outputs within each one's tolerance (every CPU
//! kernel build); and wild arguments refused alike, without a write.

use std::cell::Cell;
use std::sync::OnceLock;

use kvlayout::ops::DecodeParams;
use kvlayout::ops::{Backend, BufferShape};
use kvlayout::{AxisOrder, KvCacheLayout, Paged, Placement};
use kvlayout_conformance::backend::Hosted;
use kvlayout_conformance::cases::widths;
use kvlayout_conformance::gen::any_layout;
use kvlayout_cpu::tolerance::{decode_error, Tolerance};
use kvlayout_cpu::{
    reference, Activations, CacheMut, CpuBackend, Decode, HostCache, HostExec, OpError,
    PrefetchLevel, ScalarReference, WriteKv,
};
use kvlayout_device::DeviceBackend;
use kvlayout_emu::EmuDevice;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

fn filled(l: &KvCacheLayout, seed: u8) -> HostCache {
    let mut c = HostCache::new(l.clone()).unwrap();
    for i in 0..l.num_buffers() {
        for (j, b) in c.bytes_mut(i).iter_mut().enumerate() {
            *b = (j as u8).wrapping_mul(29).wrapping_add(seed);
        }
    }
    c
}

fn same(a: &HostCache, b: &HostCache) -> bool {
    (0..a.layout().num_buffers()).all(|i| a.bytes(i) == b.bytes(i))
}

/// A backend checked against the reference, by name.
type Checked = (&'static str, Box<dyn HostExec + Send + Sync>);

/// The backends checked against the reference, built once (a CPU backend owns a thread
/// pool): the CPU backend's fast paths (the build it picks), and the emulated CUDA and HIP
/// kernel builds.
fn backends() -> &'static [Checked] {
    static BACKENDS: OnceLock<Vec<Checked>> = OnceLock::new();
    BACKENDS.get_or_init(|| {
        vec![
            ("cpu", Box::new(CpuBackend::new(Some(2)))),
            ("cuda-emu", Box::new(Hosted(kvlayout_emu::cuda_emu()))),
            ("hip-emu", Box::new(Hosted(kvlayout_emu::hip_emu()))),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, max_global_rejects: 100_000, ..ProptestConfig::default() })]

    /// convert / swap / copy / gather / scatter: fast == reference, byte for byte.
    #[test]
    fn movers_match_reference(a in any_layout(), b in any_layout(), pick in 0u64..1000) {
        for (name, be) in backends() {
            movers(name, be.as_ref(), &a, &b, pick)?;
        }
    }

    /// swap_blocks between a device cache and a pinned host cache of the device backend
    /// (`cuda-emu`: byte copies merged into runs, or the mover kernel where the moves have no
    /// byte-run form), both ways == the reference; the runs cover the moved bytes once, never
    /// overlap at the destination, and none continues the next.
    #[test]
    fn host_device_swaps_match_reference(a in any_layout(), pick in 0u64..1000) {
        // The host pool: `a` itself, or its content in dense pages of one of the orders.
        let orders = [AxisOrder::LBHNC, AxisOrder::LBNHC, AxisOrder::BLHNC, AxisOrder::BLNHC];
        let b = match pick % 5 {
            0 => a.clone(),
            i => {
                let mut spec = a.spec().clone();
                spec.placement = Placement::Paged(Paged::new(orders[i as usize - 1]));
                KvCacheLayout::new(spec).unwrap()
            }
        };
        host_device_swaps(&a, &b, pick)?;
    }

    /// write_kv: fast == reference, byte for byte, and padding slots write nothing.
    #[test]
    fn write_kv_matches_reference(l in any_layout(), seed in 0u32..1000) {
        for (name, be) in backends() {
            write(name, be.as_ref(), &l, seed)?;
        }
    }
}

/// convert / swap / copy / gather / scatter on `be` == the reference, byte for byte.
fn movers(
    name: &str,
    be: &dyn HostExec,
    a: &KvCacheLayout,
    b: &KvCacheLayout,
    pick: u64,
) -> Result<(), TestCaseError> {
    let nb = a.geometry().num_blocks;
    // copy_blocks within `a`
    if nb >= 2 {
        let pairs = [(pick % nb, (pick + 1) % nb)];
        let what = format!("{name}: copy_blocks on {a}");
        as_reference(be, &what, a, 1, |x, c| x.copy_blocks(c, &pairs))?;
    }
    // convert / swap into `b` when the content matches
    if kvlayout::ops::check_same_content(a, b).is_ok() {
        let src = filled(a, 2);
        let pairs = [(pick % nb, (pick / 7) % b.geometry().num_blocks)];
        let what = format!("{name}: swap {a} -> {b}");
        as_reference(be, &what, b, 3, |x, c| {
            x.swap_blocks(&src.as_ref(), c, &pairs)
        })?;
        if nb == b.geometry().num_blocks {
            let what = format!("{name}: convert {a} -> {b}");
            as_reference(be, &what, b, 3, |x, c| x.convert(&src.as_ref(), c))?;
        }
    }
    // gather a head slice into a staging layout of the same kind (`a` sliced by TP), and
    // scatter it back.
    let h = a.geometry().num_kv_heads;
    if h.is_multiple_of(2) {
        let staging_layout: KvCacheLayout = {
            let s = a.tp_slice(2, 1).unwrap();
            // A dense staging cache of the slice's content in the parent's order.
            let mut spec = s.spec().clone();
            spec.placement =
                kvlayout::Placement::Paged(kvlayout::Paged::new(kvlayout::AxisOrder::LBHNC));
            KvCacheLayout::new(spec).unwrap()
        };
        let cache = filled(a, 4);
        let blocks = [pick % nb];
        let gather = |x: &dyn HostExec, c: &mut CacheMut<'_>| {
            x.gather_blocks(&cache.as_ref(), &blocks, h / 2..h, c)
        };
        let what = format!("{name}: gather {a}");
        let staging = as_reference(be, &what, &staging_layout, 5, gather)?;
        let scatter = |x: &dyn HostExec, c: &mut CacheMut<'_>| {
            x.scatter_blocks(&staging.as_ref(), &blocks, h / 2..h, c)
        };
        as_reference(be, &format!("{name}: scatter {a}"), a, 6, scatter)?;
    }
    Ok(())
}

/// `op` run by `be` and by the reference, each on its own cache of `l` filled with `seed`:
/// checks that both leave the same bytes, and returns the reference's cache.
fn as_reference(
    be: &dyn HostExec,
    what: &str,
    l: &KvCacheLayout,
    seed: u8,
    op: impl Fn(&dyn HostExec, &mut CacheMut<'_>) -> Result<(), OpError>,
) -> Result<HostCache, TestCaseError> {
    let (mut fast, mut slow) = (filled(l, seed), filled(l, seed));
    op(be, &mut fast.as_mut()).unwrap();
    op(&ScalarReference, &mut slow.as_mut()).unwrap();
    prop_assert!(same(&fast, &slow), "{}", what);
    Ok(slow)
}

fn bytes_of(c: &HostCache) -> Vec<Vec<u8>> {
    (0..c.layout().num_buffers())
        .map(|i| c.bytes(i).to_vec())
        .collect()
}

/// A cache of the emulated device.
type EmuCache = <DeviceBackend<EmuDevice> as Backend>::Cache;

/// `swap_blocks` of `pairs` on `be` from `src` (a cache on `be` that holds the bytes of the
/// host cache given with it) into `dst` (a cache on `be`, first uploaded with `filled(_, seed)`
/// of its layout), checked against the reference's swap of the same bytes; that swap's
/// result, which `dst` now holds.
fn swap_as_reference(
    be: &DeviceBackend<EmuDevice>,
    (src, src_bytes): (&EmuCache, &HostCache),
    (dst, seed): (&mut EmuCache, u8),
    pairs: &[(u64, u64)],
) -> Result<HostCache, TestCaseError> {
    let (from, to) = (src_bytes.layout(), dst.layout().clone());
    let mut want = filled(&to, seed);
    ScalarReference
        .swap_blocks(&src_bytes.as_ref(), &mut want.as_mut(), pairs)
        .unwrap();
    be.upload_cache(dst, &bytes_of(&filled(&to, seed))).unwrap();
    be.wait(be.swap_blocks(src, dst, pairs).unwrap()).unwrap();
    prop_assert_eq!(
        be.download_cache(dst).unwrap(),
        bytes_of(&want),
        "{} -> {}",
        from,
        to
    );
    Ok(want)
}

/// Device -> pinned host and back on the device backend, against the reference, and the
/// post-conditions of the copy runs.
fn host_device_swaps(a: &KvCacheLayout, b: &KvCacheLayout, pick: u64) -> Result<(), TestCaseError> {
    static BE: OnceLock<DeviceBackend<EmuDevice>> = OnceLock::new();
    let be = BE.get_or_init(kvlayout_emu::cuda_emu);
    let (na, nb) = (a.geometry().num_blocks, b.geometry().num_blocks);
    let pairs: Vec<(u64, u64)> = (0..na.min(nb).min(3))
        .map(|i| ((pick + i) % na, (pick / 3 + i) % nb))
        .collect();
    let mut uniq: Vec<u64> = pairs.iter().map(|p| p.1).collect();
    uniq.sort_unstable();
    uniq.dedup();
    if uniq.len() != pairs.len() {
        return Ok(());
    }
    let m = kvlayout::ops::BlockMove::Swap(&pairs)
        .plan(Some(a), b)
        .unwrap();
    if let Some(runs) = kvlayout::ops::copy_runs(a, b, &m, 1 << 20) {
        let plan = m.plan(a, b).unwrap();
        let total: u64 = runs.iter().map(|r| r.len).sum();
        prop_assert_eq!(total, plan.bytes_per_pair() * pairs.len() as u64);
        // In destination order, each run ends before the next begins.
        let mut by_dst = runs.clone();
        by_dst.sort_unstable_by_key(|r| (r.dst_buffer, r.dst_offset, r.len));
        for w in by_dst.windows(2) {
            let apart =
                w[0].dst_buffer != w[1].dst_buffer || w[0].dst_offset + w[0].len <= w[1].dst_offset;
            prop_assert!(apart, "overlap in {a} -> {b}");
        }
        for w in runs.windows(2) {
            let joined = w[0].src_buffer == w[1].src_buffer
                && w[0].dst_buffer == w[1].dst_buffer
                && w[0].src_offset + w[0].len == w[1].src_offset
                && w[0].dst_offset + w[0].len == w[1].dst_offset;
            prop_assert!(!joined, "unmerged runs in {a} -> {b}");
        }
    }
    // Device `a` -> pinned host `b`, and back: pinned host `b` -> device `a`, the pairs
    // reversed.
    let src = filled(a, 11);
    let mut dev = be.alloc_cache(a, &BufferShape::exact(a)).unwrap();
    be.upload_cache(&mut dev, &bytes_of(&src)).unwrap();
    let mut host = be.alloc_host_cache(b).unwrap();
    let on_host = swap_as_reference(be, (&dev, &src), (&mut host, 12), &pairs)?;
    let back: Vec<(u64, u64)> = pairs.iter().map(|&(s, d)| (d, s)).collect();
    swap_as_reference(be, (&host, &on_host), (&mut dev, 13), &back)?;
    Ok(())
}

/// write_kv on `be` == the reference, byte for byte, and padding slots write nothing.
fn write(name: &str, be: &dyn HostExec, l: &KvCacheLayout, seed: u32) -> Result<(), TestCaseError> {
    let g = *l.geometry();
    let Some((kw, vw, mla)) = widths(l) else {
        return Ok(());
    };
    if g.tokens_per_state != 1 {
        return Ok(());
    }
    let heads = g.num_kv_heads as usize;
    let total = g.num_blocks * g.block_size;
    let slots: Vec<i64> = (0..5u64)
        .map(|t| {
            if t == 2 {
                -1
            } else {
                ((u64::from(seed) + t * 7) % total) as i64
            }
        })
        .collect();
    let mut uniq = slots.clone();
    uniq.sort_unstable();
    uniq.dedup();
    if uniq.len() != slots.len() {
        return Ok(());
    }
    let k: Vec<f32> = (0..5 * heads * kw)
        .map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 125.0 - 4.0)
        .collect();
    let v: Vec<f32> = (0..5 * heads * vw)
        .map(|i| (((i as u32).wrapping_mul(40503) ^ seed) % 1000) as f32 / 125.0 - 4.0)
        .collect();
    let w = WriteKv {
        layer: 0,
        key: Activations::F32(&k),
        value: (!mla).then_some(Activations::F32(&v)),
        slot_mapping: &slots,
    };
    let (mut fast, mut slow) = (filled(l, 9), filled(l, 9));
    be.write_kv(&mut fast.as_mut(), &w).unwrap();
    ScalarReference.write_kv(&mut slow.as_mut(), &w).unwrap();
    prop_assert!(same(&fast, &slow), "{name}: write_kv on {l}");
    Ok(())
}

/// Arguments for every op of a cache, mostly near-valid: wrong lengths, slots, block ids,
/// layers, head ranges and parameters now and then, at the limits of their types.
#[derive(Debug, Clone)]
struct Wild {
    tokens: usize,
    slots: Vec<i64>,
    /// Elements added to the right key, value and query lengths (mostly 0).
    len_err: (i64, i64, i64),
    layer: u64,
    seqs: usize,
    blocks_per_seq: usize,
    table: Vec<i32>,
    lens: Vec<u32>,
    /// Query heads: a multiple of the KV heads (`Ok`), or a raw count (`Err`).
    q_heads: Result<u64, u64>,
    window: Option<u64>,
    cap: Option<f32>,
    scale: f32,
    /// Block pairs to copy; their sources are also gathered and scattered.
    pairs: Vec<(u64, u64)>,
    /// The head range gathered and scattered.
    heads: (u64, u64),
}

fn wild() -> impl Strategy<Value = Wild> {
    let off = || prop_oneof![8 => Just(0i64), 1 => -2i64..3];
    let slot = prop_oneof![8 => -1i64..12, 1 => prop_oneof![Just(i64::MIN), Just(i64::MAX), Just(1 << 31)]];
    let block = prop_oneof![8 => 0i32..3, 1 => prop_oneof![Just(-1), Just(i32::MIN), Just(i32::MAX), 3i32..20]];
    let len = prop_oneof![8 => 0u32..20, 1 => prop_oneof![Just(u32::MAX), 20u32..100]];
    let cap = prop::option::of(
        prop_oneof![6 => Just(30.0f32), 1 => Just(0.0), 1 => Just(-1.0), 1 => Just(f32::NAN)],
    );
    (
        (
            0usize..5,
            prop::collection::vec(slot, 0..6),
            (off(), off(), off()),
            prop_oneof![8 => Just(0u64), 1 => 0u64..3],
        ),
        (
            0usize..4,
            0usize..4,
            prop::collection::vec(block, 0..12),
            prop::collection::vec(len, 0..5),
        ),
        (
            prop_oneof![8 => (1u64..4).prop_map(Ok), 1 => (0u64..9).prop_map(Err)],
            prop::option::of(0u64..40),
            cap,
            prop_oneof![8 => Just(0.3f32), 1 => Just(f32::NAN)],
        ),
        (
            prop::collection::vec((0u64..20, 0u64..20), 0..4),
            (0u64..5, 0u64..9),
        ),
    )
        .prop_map(
            |(
                (tokens, slots, len_err, layer),
                (seqs, blocks_per_seq, table, lens),
                (q_heads, window, cap, scale),
                (pairs, heads),
            )| Wild {
                tokens,
                slots,
                len_err,
                layer,
                seqs,
                blocks_per_seq,
                table,
                lens,
                q_heads,
                window,
                cap,
                scale,
                pairs,
                heads,
            },
        )
}

/// A layout `write_kv` and `paged_decode` accept: keys and values (plain or scaled) or an
/// MLA latent, one token per state.
fn decodable_layout() -> impl Strategy<Value = KvCacheLayout> {
    any_layout().prop_filter("no keys and values, or compressed states", |l| {
        l.geometry().tokens_per_state == 1 && kvlayout::ops::decode_widths(l).is_ok()
    })
}

fn snapshot(c: &HostCache) -> Vec<Vec<u8>> {
    (0..c.layout().num_buffers())
        .map(|i| c.bytes(i).to_vec())
        .collect()
}

/// A runner of `cases` cases that persists no failures (the inputs are printed instead).
fn runner(cases: u32, max_local_rejects: u32) -> TestRunner {
    TestRunner::new(Config {
        cases,
        failure_persistence: None,
        max_global_rejects: 100_000,
        max_local_rejects,
        ..Config::default()
    })
}

/// Every op on wild arguments, on every backend: it and the reference accept or refuse alike;
/// a refusal is a typed error that leaves the cache (and a decode's output) as it was;
/// nothing panics. Both outcomes must come up for `write_kv` and `paged_decode`.
#[test]
fn wild_arguments_are_refused_alike_and_write_nothing() {
    let counts: [Cell<u32>; 4] = Default::default(); // write ok / refused, decode ok / refused
    let tally = |i: usize, ok: bool| {
        counts[2 * i + usize::from(!ok)].set(counts[2 * i + usize::from(!ok)].get() + 1)
    };
    runner(1500, 10_000_000)
        .run(
            &(
                prop_oneof![4 => decodable_layout(), 1 => any_layout()],
                wild(),
            ),
            |(l, a)| {
                for (_, be) in backends() {
                    let be = be.as_ref();
                    let (mut fast, mut slow) = (filled(&l, 3), filled(&l, 3));
                    tally(0, wild_write(be, &a, &mut fast, &mut slow)?);
                    tally(1, wild_decode(be, &a, &fast, &slow)?);
                    wild_movers(be, &a, &mut fast, &mut slow)?;
                }
                Ok(())
            },
        )
        .unwrap();
    let [w_ok, w_err, d_ok, d_err] = counts.map(|c| c.get());
    assert!(
        w_ok > 50 && w_err > 50 && d_ok > 50 && d_err > 50,
        "write_kv {w_ok} ok / {w_err} refused, decode {d_ok} / {d_err}"
    );
}

/// `(K width, V width, KV heads, query heads)` of wild arguments on a layout (widths of 8
/// where it has no keys and values).
fn wild_sizes(l: &KvCacheLayout, a: &Wild) -> (usize, usize, usize, u64) {
    let (kw, vw) =
        kvlayout::ops::decode_widths(l).map_or((8, 8), |(k, v)| (k as usize, v as usize));
    let heads = l.geometry().num_kv_heads as usize;
    let q_heads = a.q_heads.unwrap_or_else(|raw| raw) * a.q_heads.map_or(1, |_| heads as u64);
    (kw, vw, heads, q_heads)
}

/// `n` elements, `err` more or fewer (none below zero).
fn sized(n: usize, err: i64) -> usize {
    (n as i64 + err).max(0) as usize
}

/// `write_kv`: the fast path and the reference alike, and a refusal writes nothing; whether
/// the write was accepted.
fn wild_write(
    be: &dyn HostExec,
    a: &Wild,
    fast: &mut HostCache,
    slow: &mut HostCache,
) -> Result<bool, TestCaseError> {
    let l = fast.layout().clone();
    let (kw, vw, heads, _) = wild_sizes(&l, a);
    let k: Vec<f32> = (0..sized(a.tokens * heads * kw, a.len_err.0))
        .map(|i| (i % 17) as f32 * 0.25 - 2.0)
        .collect();
    let v: Vec<f32> = (0..sized(a.tokens * heads * vw, a.len_err.1))
        .map(|i| (i % 13) as f32 * 0.25 - 1.5)
        .collect();
    let slots: Vec<i64> = a.slots.iter().copied().take(a.tokens).collect();
    let mla = l.content().shares_latent();
    let w = WriteKv {
        layer: a.layer,
        key: Activations::F32(&k),
        value: (!mla || a.len_err.1 != 0).then_some(Activations::F32(&v)),
        slot_mapping: &slots,
    };
    let before = snapshot(fast);
    let (rf, rs) = (
        be.write_kv(&mut fast.as_mut(), &w),
        ScalarReference.write_kv(&mut slow.as_mut(), &w),
    );
    prop_assert_eq!(&rf, &rs, "write_kv on {}", l);
    prop_assert!(same(fast, slow), "write_kv on {}", l);
    if rf.is_err() {
        prop_assert!(snapshot(fast) == before, "refused write_kv wrote: {}", l);
    }
    Ok(rf.is_ok())
}

/// `paged_decode`: the fast path and the reference alike, and a refusal leaves the output as
/// it was; whether the decode was accepted.
fn wild_decode(
    be: &dyn HostExec,
    a: &Wild,
    fast: &HostCache,
    slow: &HostCache,
) -> Result<bool, TestCaseError> {
    let l = fast.layout();
    let (kw, vw, _, q_heads) = wild_sizes(l, a);
    let q: Vec<f32> = (0..sized(a.seqs * q_heads as usize * kw, a.len_err.2))
        .map(|i| (i % 7) as f32 * 0.1)
        .collect();
    let lens: Vec<u32> = a.lens.iter().copied().take(a.seqs).collect();
    let table: Vec<i32> = a
        .table
        .iter()
        .copied()
        .take(a.seqs * a.blocks_per_seq)
        .collect();
    let params = DecodeParams {
        num_q_heads: q_heads,
        scale: a.scale,
        sliding_window: a.window,
        soft_cap: a.cap,
    };
    let d = Decode {
        layer: a.layer,
        query: Activations::F32(&q),
        block_table: &table,
        blocks_per_seq: a.blocks_per_seq,
        seq_lens: &lens,
        params,
    };
    let n = a.seqs * q_heads as usize * vw;
    let (mut out_fast, mut out_slow) = (vec![-7.0f32; n], vec![-7.0f32; n]);
    let rf = be.paged_decode(&fast.as_ref(), &d, &mut out_fast);
    let rs = ScalarReference.paged_decode(&slow.as_ref(), &d, &mut out_slow);
    prop_assert_eq!(&rf, &rs, "paged_decode on {}", l);
    if rf.is_err() {
        prop_assert!(
            out_fast.iter().all(|&x| x == -7.0),
            "refused decode wrote its output: {}",
            l
        );
    }
    Ok(rf.is_ok())
}

/// `copy_blocks` (the fast path and the reference alike), then `gather_blocks` and
/// `scatter_blocks` of the pairs' sources: a refusal writes nothing.
fn wild_movers(
    be: &dyn HostExec,
    a: &Wild,
    fast: &mut HostCache,
    slow: &mut HostCache,
) -> Result<(), TestCaseError> {
    let l = fast.layout().clone();
    let before = snapshot(fast);
    let (rf, rs) = (
        be.copy_blocks(&mut fast.as_mut(), &a.pairs),
        ScalarReference.copy_blocks(&mut slow.as_mut(), &a.pairs),
    );
    prop_assert_eq!(&rf, &rs, "copy_blocks on {}", l);
    prop_assert!(
        rf.is_ok() || snapshot(fast) == before,
        "refused copy_blocks wrote: {}",
        l
    );
    let blocks: Vec<u64> = a.pairs.iter().map(|p| p.0).collect();
    let heads = a.heads.0..a.heads.1;
    let mut staging = filled(&l, 5);
    let before = snapshot(&staging);
    let r = be.gather_blocks(
        &fast.as_ref(),
        &blocks,
        heads.clone(),
        &mut staging.as_mut(),
    );
    prop_assert!(
        r.is_ok() || snapshot(&staging) == before,
        "refused gather wrote: {}",
        l
    );
    let before = snapshot(fast);
    let r = be.scatter_blocks(&staging.as_ref(), &blocks, heads, &mut fast.as_mut());
    prop_assert!(
        r.is_ok() || snapshot(fast) == before,
        "refused scatter wrote: {}",
        l
    );
    Ok(())
}

/// A decode step drawn for a layout: sequences, lengths, a block table, the query head
/// multiple, window, soft-cap and seeds for the values.
#[derive(Debug, Clone)]
struct Step {
    lens: Vec<u32>,
    table_seed: u64,
    q_mult: u64,
    window: Option<u64>,
    cap: Option<f32>,
    seed: u32,
}

fn step() -> impl Strategy<Value = Step> {
    (
        prop::collection::vec(0u32..70, 1..4),
        any::<u64>(),
        1u64..4,
        prop::option::of(1u64..20),
        prop::option::of(prop_oneof![Just(5.0f32), Just(30.0)]),
        any::<u32>(),
    )
        .prop_map(|(lens, table_seed, q_mult, window, cap, seed)| Step {
            lens,
            table_seed,
            q_mult,
            window,
            cap,
            seed,
        })
}

/// A value in [-2, 2) from an index and a seed.
fn value(i: usize, seed: u32) -> f32 {
    (((i as u32).wrapping_mul(2_654_435_761) ^ seed) % 1024) as f32 / 256.0 - 2.0
}

/// `paged_decode` of every CPU kernel build and the emulated GPU kernels (within the f32
/// products' tolerance) against the f64 reference on random decodable
/// layouts (every order, padded pages, inline scales, MLA, and TP-sliced, block-split or
/// layer-ranged layouts with explicit strides), every slot of layer 0 written through
/// `write_kv`, with random lengths (sequences longer than one block, and empty ones), block
/// tables, GQA groups, windows and soft-caps: within the dtype's tolerance.
#[test]
fn decode_matches_reference_on_random_layouts() {
    // Every build this machine runs, each with its tiles for rows prefetched to L1 and to L2.
    let builds: Vec<CpuBackend> = CpuBackend::kernel_builds()
        .into_iter()
        .flat_map(|k| {
            [PrefetchLevel::L1, PrefetchLevel::L2].map(|level| {
                CpuBackend::with_kernels(Some(2), k)
                    .unwrap()
                    .with_prefetch_level(level)
            })
        })
        .collect();
    runner(2000, 1_000_000)
        .run(&(decodable_layout(), step()), |(l, s)| {
            let cache = written(&builds[0], &l, s.seed);
            let (lens, table, per_seq) = sequences(&l, &s);
            let (kw, vw) = kvlayout::ops::decode_widths(&l).unwrap();
            let (kw, vw) = (kw as usize, vw as usize);
            let q_heads = l.geometry().num_kv_heads * s.q_mult;
            let q: Vec<f32> = (0..lens.len() * q_heads as usize * kw)
                .map(|i| value(i, s.seed ^ 0x5555))
                .collect();
            let params = DecodeParams {
                num_q_heads: q_heads,
                scale: 1.0 / (kw as f32).sqrt(),
                sliding_window: s.window,
                soft_cap: s.cap,
            };
            let d = Decode {
                layer: 0,
                query: Activations::F32(&q),
                block_table: &table,
                blocks_per_seq: per_seq,
                seq_lens: &lens,
                params,
            };
            let n = lens.len() * q_heads as usize * vw;
            let mut want = vec![0f32; n];
            let mags = reference::paged_decode_magnitudes(&cache.as_ref(), &d, &mut want).unwrap();
            for (name, be) in backends().iter().skip(1) {
                let mut got = vec![f32::NAN; n];
                be.paged_decode(&cache.as_ref(), &d, &mut got).unwrap();
                let e = decode_error(&got, &want, &mags, Tolerance::F32_PRODUCTS);
                prop_assert!(e.passed(), "{} on {}: {:?} (lens {:?})", name, l, e, lens);
            }
            for be in &builds {
                let mut got = vec![f32::NAN; n];
                be.paged_decode(&cache.as_ref(), &d, &mut got).unwrap();
                // Each build within its own tolerance (f32 or bf16 products), relative to the
                // magnitudes of the values and logits it combined.
                let e = decode_error(&got, &want, &mags, be.decode_tolerance(l.dtype()));
                prop_assert!(
                    e.passed(),
                    "{} kernels ({:?}) on {}: {:?} (lens {:?})",
                    be.kernel_build(),
                    be.prefetch_level(),
                    l,
                    e,
                    lens
                );
            }
            Ok(())
        })
        .unwrap();
}

/// A cache of `l` with every slot of layer 0 written through `be`'s `write_kv`.
fn written(be: &CpuBackend, l: &KvCacheLayout, seed: u32) -> HostCache {
    let g = *l.geometry();
    let (kw, vw) = kvlayout::ops::decode_widths(l).unwrap();
    let (kw, vw) = (kw as usize, vw as usize);
    let mla = l.content().shares_latent();
    let heads = g.num_kv_heads as usize;
    let slots = (g.num_blocks * g.block_size) as usize;
    let k: Vec<f32> = (0..slots * heads * kw).map(|i| value(i, seed)).collect();
    let v: Vec<f32> = (0..slots * heads * vw).map(|i| value(i, !seed)).collect();
    let mapping: Vec<i64> = (0..slots as i64).collect();
    let w = WriteKv {
        layer: 0,
        key: Activations::F32(&k),
        value: (!mla).then_some(Activations::F32(&v)),
        slot_mapping: &mapping,
    };
    let mut cache = filled(l, 1);
    be.write_kv(&mut cache.as_mut(), &w).unwrap();
    cache
}

/// The step's lengths within the cache, and a block table of ids drawn with repeats
/// (sequences may share blocks): `(lens, table, blocks per sequence)`.
fn sequences(l: &KvCacheLayout, s: &Step) -> (Vec<u32>, Vec<i32>, usize) {
    let g = *l.geometry();
    let bs = g.block_size as u32;
    let lens: Vec<u32> = s
        .lens
        .iter()
        .map(|&n| n.min(bs * g.num_blocks as u32))
        .collect();
    let per_seq = lens
        .iter()
        .map(|&n| n.div_ceil(bs))
        .max()
        .unwrap_or(0)
        .max(1) as usize;
    let mut r = s.table_seed;
    let table: Vec<i32> = (0..lens.len() * per_seq)
        .map(|_| {
            r = r
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((r >> 33) % g.num_blocks) as i32
        })
        .collect();
    (lens, table, per_seq)
}
