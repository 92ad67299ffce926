//! The cross-backend conformance suite: every case of `kvlayout_conformance::cases` and every
//! op of the contract, on every backend present, against the scalar reference; absent
//! backends are reported as skipped, by name.

use std::collections::HashSet;

use kvlayout::ops::{DecodeParams, OpError};
use kvlayout::{Coord, DType, KvCacheLayout};
use kvlayout_conformance::backend::{absent_backends, Backend, Cpu, Reference};
use kvlayout_conformance::cases::{
    data, kv_cases, other_cases, widths, Case, BLOCKS, BLOCK_SIZE, KV_DTYPES,
};
use kvlayout_cpu::{Activations, CacheMut, CpuBackend, Decode, HostCache, WriteKv};

const SENTINEL: u8 = 0xA5;

fn sentinel_buffers(l: &KvCacheLayout) -> Vec<Vec<u8>> {
    l.extents()
        .iter()
        .map(|x| vec![SENTINEL; x.end as usize])
        .collect()
}

/// Every byte of every stored element of `(layer, block, slot)` triples, per buffer.
fn element_bytes(l: &KvCacheLayout, sel: impl Fn(u64, u64, u64) -> bool) -> HashSet<(u32, u64)> {
    let mut out = HashSet::new();
    for m in l.stored_fields() {
        for layer in 0..m.num_layers {
            for block in 0..m.num_blocks {
                for slot in 0..m.num_slots {
                    if !sel(layer, block, slot) {
                        continue;
                    }
                    for head in 0..m.num_heads {
                        for dim in 0..m.width {
                            let at = l
                                .offset(&Coord {
                                    layer,
                                    block,
                                    head,
                                    slot,
                                    field: m.field,
                                    dim,
                                })
                                .unwrap();
                            for b in 0..m.elem_bytes() {
                                out.insert((at.buffer, at.offset + b));
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

fn tolerance(d: DType) -> f32 {
    match d {
        DType::F32 => 1e-5,
        DType::F16 | DType::Bf16 => 2e-2,
        other => other.epsilon() as f32,
    }
}

struct Inputs {
    k: Vec<f32>,
    v: Vec<f32>,
    slots: Vec<i64>,
    table: Vec<i32>,
    lens: Vec<u32>,
    q: Vec<f32>,
}

const LENS: [u32; 2] = [37, 20];
const PER_SEQ: usize = 3;

fn inputs(l: &KvCacheLayout, q_heads: usize, seed: u32) -> Inputs {
    let (kw, vw, _) = widths(l);
    let heads = l.geometry().num_kv_heads as usize;
    // Sequence 0 owns blocks 5, 1, 3; sequence 1 owns 0, 4 (then 2, unused).
    let table = vec![5, 1, 3, 0, 4, 2];
    let mut slots = Vec::new();
    for (s, len) in LENS.iter().enumerate() {
        for t in 0..*len as usize {
            slots.push(
                i64::from(table[s * PER_SEQ + t / BLOCK_SIZE as usize]) * BLOCK_SIZE as i64
                    + (t % BLOCK_SIZE as usize) as i64,
            );
            if t % 11 == 3 {
                slots.push(-1); // a padding token between real ones
            }
        }
    }
    Inputs {
        k: data(slots.len() * heads * kw, seed),
        v: data(slots.len() * heads * vw, seed + 1),
        slots,
        table,
        lens: LENS.to_vec(),
        q: data(LENS.len() * q_heads * kw, seed + 2),
    }
}

/// Runs every op of one case on `be` and on the reference; returns the number of checks.
fn run_case<B: Backend>(be: &B, case: &Case, layer: u64) -> usize {
    let r = Reference;
    let l = &case.layout;
    let name = format!("{} {}", be.name(), case.spec);
    let (_, vw, mla) = widths(l);
    let heads = l.geometry().num_kv_heads as usize;
    let q_heads = if mla { 4 } else { 2 * heads };
    let inp = inputs(l, q_heads, 7);
    let w = WriteKv {
        layer,
        key: Activations::F32(&inp.k),
        value: (!mla).then_some(Activations::F32(&inp.v)),
        slot_mapping: &inp.slots,
    };
    // write_kv: byte-identical to the reference; nothing outside the written slots touched.
    let mut got = be.upload(l, &sentinel_buffers(l)).unwrap();
    be.wait(be.write_kv(&mut got, &w).unwrap()).unwrap();
    let mut want = r.upload(l, &sentinel_buffers(l)).unwrap();
    r.write_kv(&mut want, &w).unwrap();
    let (got_b, want_b) = (be.download(&got), r.download(&want));
    assert_eq!(got_b, want_b, "{name}: write_kv differs from the reference");
    let written: HashSet<u64> = inp
        .slots
        .iter()
        .filter(|s| **s >= 0)
        .map(|s| *s as u64)
        .collect();
    let bs = BLOCK_SIZE;
    let touched = element_bytes(l, |ly, b, n| ly == layer && written.contains(&(b * bs + n)));
    for (i, buf) in got_b.iter().enumerate() {
        for (o, byte) in buf.iter().enumerate() {
            if !touched.contains(&(i as u32, o as u64)) {
                assert_eq!(
                    *byte, SENTINEL,
                    "{name}: write_kv touched byte {o} of buffer {i} outside the written slots"
                );
            }
        }
    }
    let mut checks = 2;
    // paged_decode: plain, then with a window and a soft-cap.
    for (window, cap) in [(None, None), (Some(10), Some(20.0))] {
        let d = Decode {
            layer,
            query: Activations::F32(&inp.q),
            block_table: &inp.table,
            blocks_per_seq: PER_SEQ,
            seq_lens: &inp.lens,
            params: DecodeParams {
                num_q_heads: q_heads as u64,
                scale: 0.25,
                sliding_window: window,
                soft_cap: cap,
            },
        };
        let n = LENS.len() * q_heads * vw;
        let mut out = be.alloc_output(n);
        be.wait(be.paged_decode(&got, &d, &mut out).unwrap())
            .unwrap();
        let mut reference = r.alloc_output(n);
        r.paged_decode(&want, &d, &mut reference).unwrap();
        let (o, rf) = (be.download_output(&out), r.download_output(&reference));
        let tol = tolerance(l.dtype());
        for (i, (a, b)) in o.iter().zip(&rf).enumerate() {
            assert!(
                (a - b).abs() <= tol * b.abs().max(1.0),
                "{name}: decode out[{i}] = {a}, reference {b}"
            );
        }
        checks += 1;
    }
    // copy_blocks.
    let pairs = [(5, 2), (1, 4), (3, 3)];
    be.wait(be.copy_blocks(&mut got, &pairs).unwrap()).unwrap();
    r.copy_blocks(&mut want, &pairs).unwrap();
    assert_eq!(be.download(&got), r.download(&want), "{name}: copy_blocks");
    // gather heads into a staging cache of its own layout, then scatter back: identity.
    let h = l.geometry().num_kv_heads;
    let (h0, h1) = if h > 1 { (1, h.min(3)) } else { (0, 1) };
    let mut staging_spec = l.spec().clone();
    staging_spec.geometry.num_kv_heads = h1 - h0;
    staging_spec.geometry.num_blocks = 3;
    staging_spec.placement =
        kvlayout::Placement::Paged(kvlayout::Paged::new(kvlayout::AxisOrder::LBHNC));
    let staging_l = KvCacheLayout::new(staging_spec).unwrap();
    let mut staging = be
        .upload(&staging_l, &sentinel_buffers(&staging_l))
        .unwrap();
    let mut staging_r = r.upload(&staging_l, &sentinel_buffers(&staging_l)).unwrap();
    let blocks = [5, 0, 2];
    be.wait(
        be.gather_blocks(&got, &blocks, h0..h1, &mut staging)
            .unwrap(),
    )
    .unwrap();
    r.gather_blocks(&want, &blocks, h0..h1, &mut staging_r)
        .unwrap();
    assert_eq!(
        be.download(&staging),
        r.download(&staging_r),
        "{name}: gather_blocks"
    );
    let before = be.download(&got);
    be.wait(
        be.scatter_blocks(&staging, &blocks, h0..h1, &mut got)
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        be.download(&got),
        before,
        "{name}: scatter(gather(x)) is not x"
    );
    checks + 3
}

/// `convert` A -> B -> A is the identity on every element, for every pair of layouts of one
/// content and dtype; `swap_blocks` A -> B agrees with the reference.
fn run_pairs<B: Backend>(be: &B, cases: &[Case]) -> usize {
    let r = Reference;
    let mut checks = 0;
    for a in cases {
        let mut bufs = sentinel_buffers(&a.layout);
        for (i, b) in bufs.iter_mut().enumerate() {
            for (j, x) in b.iter_mut().enumerate() {
                *x = (j as u8).wrapping_mul(37).wrapping_add(i as u8);
            }
        }
        let src = be.upload(&a.layout, &bufs).unwrap();
        for b in cases {
            if kvlayout::ops::check_same_content(&a.layout, &b.layout).is_err()
                || a.layout.geometry().num_blocks != b.layout.geometry().num_blocks
            {
                continue;
            }
            let mut mid = be.upload(&b.layout, &sentinel_buffers(&b.layout)).unwrap();
            be.wait(be.convert(&src, &mut mid).unwrap()).unwrap();
            let mut back = be.upload(&a.layout, &sentinel_buffers(&a.layout)).unwrap();
            be.wait(be.convert(&mid, &mut back).unwrap()).unwrap();
            let (x, y) = (be.download(&src), be.download(&back));
            for (buf, off) in element_bytes(&a.layout, |_, _, _| true) {
                let (buf, off) = (buf as usize, off as usize);
                assert_eq!(
                    x[buf][off],
                    y[buf][off],
                    "{}: convert {} -> {} -> back differs at buffer {buf} byte {off}",
                    be.name(),
                    a.spec,
                    b.spec
                );
            }
            let pairs = [(0, 3), (4, 1)];
            let mut d1 = be.upload(&b.layout, &sentinel_buffers(&b.layout)).unwrap();
            be.wait(be.swap_blocks(&src, &mut d1, &pairs).unwrap())
                .unwrap();
            let ra = r.upload(&a.layout, &bufs).unwrap();
            let mut d2 = r.upload(&b.layout, &sentinel_buffers(&b.layout)).unwrap();
            r.swap_blocks(&ra, &mut d2, &pairs).unwrap();
            assert_eq!(
                be.download(&d1),
                r.download(&d2),
                "{}: swap {} -> {}",
                be.name(),
                a.spec,
                b.spec
            );
            checks += 2;
        }
    }
    checks
}

fn run_suite<B: Backend>(be: &B) -> usize {
    let mut checks = 0;
    for dtype in KV_DTYPES {
        let cases = kv_cases(dtype);
        for c in &cases {
            checks += run_case(be, c, c.layout.geometry().num_layers - 1);
        }
        checks += run_pairs(be, &cases);
    }
    for c in other_cases() {
        checks += run_case(be, &c, 0);
    }
    checks
}

#[test]
fn every_case_on_every_backend() {
    let cpu = Cpu(CpuBackend::new(Some(2)));
    let n = run_suite(&cpu);
    println!("conformance: {}: {n} checks passed", cpu.name());
    let n = run_suite(&Reference);
    println!(
        "conformance: {}: {n} checks passed (self-consistency)",
        Reference.name()
    );
    for (name, why) in absent_backends() {
        println!("skipped: {name}: {why}");
    }
}

/// Bad input: a typed error, and the cache unchanged.
#[test]
fn refusals_leave_the_cache_untouched() {
    let be = CpuBackend::new(Some(2));
    let l: KvCacheLayout =
        format!("kv L=1 B={BLOCKS} N={BLOCK_SIZE} H=4 D=16 dtype=bf16 order=NHD")
            .parse()
            .unwrap();
    let mut cache = HostCache::new(l.clone()).unwrap();
    cache.fill(SENTINEL);
    let inp = inputs(&l, 8, 3);
    let snapshot = cache.bytes(0).to_vec();
    let write = |slots: &[i64], cache: &mut HostCache| {
        let w = WriteKv {
            layer: 0,
            key: Activations::F32(&inp.k[..slots.len() * 64]),
            value: Some(Activations::F32(&inp.v[..slots.len() * 64])),
            slot_mapping: slots,
        };
        be.write_kv(&mut cache.as_mut(), &w)
    };
    let limit = (BLOCKS * BLOCK_SIZE) as i64;
    assert!(matches!(
        write(&[0, limit, 2], &mut cache),
        Err(OpError::SlotOutOfRange { token: 1, .. })
    ));
    assert!(matches!(
        write(&[0, 5, 5], &mut cache),
        Err(OpError::DuplicateSlot {
            token: 2,
            first: 1,
            ..
        })
    ));
    let mut out = vec![0f32; 2 * 8 * 16];
    let mut d = Decode {
        layer: 0,
        query: Activations::F32(&inp.q),
        block_table: &[5, 1, 9, 0, 4, 2],
        blocks_per_seq: PER_SEQ,
        seq_lens: &LENS,
        params: DecodeParams {
            num_q_heads: 8,
            scale: 1.0,
            sliding_window: None,
            soft_cap: None,
        },
    };
    assert!(matches!(
        be.paged_decode(&cache.as_ref(), &d, &mut out),
        Err(OpError::BlockOutOfRange {
            seq: 0,
            position: 2,
            block: 9,
            ..
        })
    ));
    d.block_table = &inp.table;
    d.seq_lens = &[49, 20];
    assert!(matches!(
        be.paged_decode(&cache.as_ref(), &d, &mut out),
        Err(OpError::SequenceTooLong {
            seq: 0,
            len: 49,
            ..
        })
    ));
    assert!(matches!(
        be.copy_blocks(&mut cache.as_mut(), &[(0, 1), (2, 1)]),
        Err(OpError::BadPair {
            index: 0,
            dst: 1,
            ..
        })
    ));
    assert!(matches!(
        be.copy_blocks(&mut cache.as_mut(), &[(0, BLOCKS)]),
        Err(OpError::BadPair { .. })
    ));
    let other: KvCacheLayout =
        format!("kv L=1 B={BLOCKS} N={BLOCK_SIZE} H=4 D=16 dtype=f16 order=NHD")
            .parse()
            .unwrap();
    let src = HostCache::new(other).unwrap();
    assert!(matches!(
        be.swap_blocks(&src.as_ref(), &mut cache.as_mut(), &[(0, 0)]),
        Err(OpError::Incompatible(_))
    ));
    assert!(matches!(
        be.convert(&src.as_ref(), &mut cache.as_mut()),
        Err(OpError::Incompatible(_))
    ));
    assert_eq!(
        cache.bytes(0),
        &snapshot[..],
        "a refused op changed the cache"
    );
    // Host buffers: too short, misaligned.
    let mut short = vec![0u8; l.extents()[0].end as usize - 1];
    assert!(matches!(
        CacheMut::new(&l, vec![&mut short[..]]),
        Err(OpError::BufferTooShort { buffer: 0, .. })
    ));
    let mut long = vec![0u16; l.extents()[0].end as usize];
    let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut long);
    assert!(matches!(
        CacheMut::new(&l, vec![&mut bytes[1..]]),
        Err(OpError::Misaligned {
            buffer: 0,
            align: 2,
            ..
        })
    ));
}
