//! The cross-backend conformance suite: every case of `kvlayout_conformance::cases` and every
//! op of the contract, on every backend present, against the scalar reference (run through
//! the same `Backend` trait). Backends that are not built are reported as skipped, by name.
//!
//! What is checked, per case and backend:
//! * `write_kv` (shuffled tokens, padding slots -1) into a sentinel-filled cache (0xA5): every
//!   written element within one quantization step of the reference's (`DType::epsilon`
//!   relative to the row's magnitude), every byte outside the written elements still the
//!   sentinel; a write of padding slots only leaves every byte the sentinel.
//! * `paged_decode`, four steps (MHA; GQA/MQA x4 with a sliding window; x2 with a soft-cap;
//!   x8 with window 1 and a soft-cap; an empty sequence in each), on the backend's own cache:
//!   within `tol * max(|ref|, 1)`, tol = 1e-5 (f32), 2e-2 (f16, bf16), `epsilon()` (fp8, int8).
//! * `copy_blocks`, `gather_blocks` (head range, into a staging layout), `scatter_blocks` back
//!   (identity) and into a sentinel cache, on caches of random bytes: byte for byte equal to
//!   the reference, and every byte outside the destination elements unchanged.
//! * For every ordered pair (A, B) of layouts of one content: `convert` A -> B (byte-equal to
//!   the reference, B's non-element bytes still the sentinel), B -> A (the identity on A's
//!   elements), `swap_blocks` A -> B (byte-equal, sentinel outside the destination blocks).
//! * Movers-only content (opaque rows, Mamba states, tokens_per_state 4): `write_kv` and
//!   `paged_decode` refused with `Unsupported`.
//!
//! Element byte sets are computed from the field strides (`base + l*Ls + b*Bs + h*Hs + n*Ns +
//! (d/x)*Xs + (d%x)*Ds`) and cross-checked against `layout.block_regions`.
//!
//! The refusals (`refusals_on_every_backend`): out-of-range slot, duplicate slot, block id
//! out of range or negative, sequence longer than its blocks, shape / dtype / geometry
//! mismatches, bad block pairs, incompatible caches, a buffer shorter than the registered
//! span (even when it covers every element), a misaligned buffer: each a typed `OpError`, and
//! every cache byte unchanged.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use kvlayout::ops::{DecodeParams, OpError};
use kvlayout::{Coord, DType, Field, KvCacheLayout};
use kvlayout_conformance::backend::{
    Backend, BackendVisitor, Backends, BufferShape, DecodeArgs, Host, HostTensor, ScalarReference,
    WriteArgs,
};
use kvlayout_conformance::cases::{
    all_cases, mover_plan, widths, workload, DecodeCase, LayoutCase, MoverPlan, Ops, Rng, Workload,
};
use kvlayout_cpu::tolerance::{decode_error, Tolerance};
use kvlayout_cpu::{reference, CacheRef, HostCache};

const SENTINEL: u8 = 0xA5;

type Bytes = Vec<Vec<u8>>;
type Mask = Vec<Vec<bool>>;
type Outcome<T> = Result<T, String>;

// ---------------------------------------------------------------------------------------
// Byte sets and host-side helpers.

fn sentinel(l: &KvCacheLayout) -> Bytes {
    l.extents()
        .iter()
        .map(|x| vec![SENTINEL; x.end as usize])
        .collect()
}

fn random_bytes(l: &KvCacheLayout, seed: &str) -> Bytes {
    let mut rng = Rng::new(seed);
    l.extents()
        .iter()
        .map(|x| rng.bytes(x.end as usize))
        .collect()
}

/// The bytes of every stored element whose `(layer, block, head, slot)` is selected, from
/// the field strides written out (not the layout's offset function).
fn mask(l: &KvCacheLayout, sel: impl Fn(u64, u64, u64, u64) -> bool) -> Mask {
    let mut m: Mask = l
        .extents()
        .iter()
        .map(|x| vec![false; x.end as usize])
        .collect();
    for f in l.stored_fields() {
        let s = f.strides;
        let e = f.elem_bytes();
        let buf = &mut m[s.buffer as usize];
        for layer in 0..f.num_layers {
            for block in 0..f.num_blocks {
                for head in 0..f.num_heads {
                    for slot in 0..f.num_slots {
                        if !sel(layer, block, head, slot) {
                            continue;
                        }
                        let row = s.base_offset
                            + layer * s.layer
                            + block * s.block
                            + head * s.head
                            + slot * s.slot;
                        for d in 0..f.width {
                            let at =
                                row + (d / s.dim_split) * s.dim_chunk + (d % s.dim_split) * s.dim;
                            for b in at..at + e {
                                buf[b as usize] = true;
                            }
                        }
                    }
                }
            }
        }
    }
    m
}

fn all_elements(l: &KvCacheLayout) -> Mask {
    mask(l, |_, _, _, _| true)
}

fn blocks_mask(l: &KvCacheLayout, blocks: &[u64], heads: Range<u64>) -> Mask {
    mask(l, |_, b, h, _| blocks.contains(&b) && heads.contains(&h))
}

/// The union of `block_regions` of `blocks` x `heads` (all layers), as a mask.
fn regions_mask(l: &KvCacheLayout, blocks: &[u64], heads: Range<u64>) -> Outcome<Mask> {
    let mut m: Mask = l
        .extents()
        .iter()
        .map(|x| vec![false; x.end as usize])
        .collect();
    for &b in blocks {
        let regions = l
            .block_regions(b, 0..l.geometry().num_layers, heads.clone())
            .map_err(|e| format!("block_regions({b}): {e}"))?;
        for r in regions {
            let buf = m
                .get_mut(r.buffer as usize)
                .ok_or_else(|| format!("region in buffer {} of {}", r.buffer, l.num_buffers()))?;
            for x in r.offset..r.offset + r.len {
                *buf.get_mut(x as usize)
                    .ok_or_else(|| format!("region {r:?} past the extent"))? = true;
            }
        }
    }
    Ok(m)
}

/// Every byte outside `mask` equals `before` (or the sentinel when `before` is `None`).
fn untouched_outside(after: &Bytes, before: Option<&Bytes>, mask: &Mask) -> Outcome<()> {
    for (i, buf) in after.iter().enumerate() {
        for (o, &byte) in buf.iter().enumerate() {
            if mask[i][o] {
                continue;
            }
            let want = before.map_or(SENTINEL, |b| b[i][o]);
            if byte != want {
                return Err(format!(
                    "byte {o} of buffer {i} outside the written elements changed: {byte:#04x}, was {want:#04x}"
                ));
            }
        }
    }
    Ok(())
}

/// Equal on the bytes of `mask`.
fn equal_on(got: &Bytes, want: &Bytes, mask: &Mask) -> Outcome<()> {
    for (i, m) in mask.iter().enumerate() {
        for (o, &inside) in m.iter().enumerate() {
            if inside && got[i][o] != want[i][o] {
                return Err(format!(
                    "buffer {i} byte {o}: {:#04x}, expected {:#04x}",
                    got[i][o], want[i][o]
                ));
            }
        }
    }
    Ok(())
}

fn byte_equal(got: &Bytes, want: &Bytes) -> Outcome<()> {
    if got.len() != want.len() {
        return Err(format!("{} buffers, expected {}", got.len(), want.len()));
    }
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        if g.len() != w.len() {
            return Err(format!(
                "buffer {i}: {} bytes, expected {}",
                g.len(),
                w.len()
            ));
        }
        if let Some(o) = g.iter().zip(w).position(|(a, b)| a != b) {
            let n = g.iter().zip(w).filter(|(a, b)| a != b).count();
            return Err(format!(
                "buffer {i} differs from the reference at byte {o} ({:#04x} vs {:#04x}; {n} bytes differ)",
                g[o], w[o]
            ));
        }
    }
    Ok(())
}

/// A host copy of downloaded bytes, aligned, to read values through the reference.
fn host_cache(l: &KvCacheLayout, bytes: &Bytes) -> HostCache {
    let mut c = HostCache::new(l.clone()).expect("host cache");
    for (i, b) in bytes.iter().enumerate() {
        c.bytes_mut(i).copy_from_slice(b);
    }
    c
}

/// `|got - want| <= bound`, false for NaN.
fn within(got: f64, want: f64, bound: f64) -> bool {
    (got - want).abs() <= bound
}

// ---------------------------------------------------------------------------------------
// Running ops through the trait.

fn upload<B: Backend>(be: &B, l: &KvCacheLayout, bytes: &Bytes) -> Outcome<B::Cache> {
    let mut c = be.alloc_cache(l, &BufferShape::exact(l))?;
    be.upload_cache(&mut c, bytes)?;
    Ok(c)
}

fn done<B: Backend>(be: &B, r: Result<B::Completion, OpError>) -> Outcome<()> {
    let c = r.map_err(|e| format!("refused: {e}"))?;
    be.wait(c)
}

/// A backend's results on one case.
struct CaseOutcome {
    write: Outcome<Bytes>,
    write_padding: Outcome<Bytes>,
    decodes: Vec<Outcome<Vec<f32>>>,
    unsupported: Outcome<()>,
    copy: Outcome<Bytes>,
    gather: Outcome<Bytes>,
    scatter_back: Outcome<Bytes>,
    scatter_fresh: Outcome<Bytes>,
}

/// Everything a case needs, computed once.
struct Prepared {
    case: LayoutCase,
    work: Option<Workload>,
    plan: MoverPlan,
    src: Bytes,
    written: Mask,
    copy_dst: Mask,
    staging_used: Mask,
    scattered: Mask,
    every: Mask,
    swap_dst: Mask,
}

fn prepare(case: LayoutCase, index: usize) -> Prepared {
    let l = case.layout.clone();
    let work = if case.ops == Ops::All {
        workload(&case)
    } else {
        None
    };
    let plan = mover_plan(&case, index);
    let written = match &work {
        Some(w) => {
            let bs = l.geometry().block_size;
            let slots: BTreeSet<u64> = w
                .slot_mapping
                .iter()
                .filter(|s| **s >= 0)
                .map(|s| *s as u64)
                .collect();
            mask(&l, |layer, b, _, n| {
                layer == w.layer && slots.contains(&(b * bs + n))
            })
        }
        None => mask(&l, |_, _, _, _| false),
    };
    let h = l.geometry().num_kv_heads;
    let copy_dsts: Vec<u64> = plan.copy_pairs.iter().map(|p| p.1).collect();
    let swap_dsts: Vec<u64> = plan.swap_pairs.iter().map(|p| p.1).collect();
    let staged: Vec<u64> = (0..plan.gather_blocks.len() as u64).collect();
    let sh = plan.staging.geometry().num_kv_heads;
    Prepared {
        src: random_bytes(&l, &format!("{}/bytes", case.name)),
        copy_dst: blocks_mask(&l, &copy_dsts, 0..h),
        staging_used: blocks_mask(&plan.staging, &staged, 0..sh),
        scattered: blocks_mask(&l, &plan.gather_blocks, plan.heads.clone()),
        every: all_elements(&l),
        swap_dst: blocks_mask(&l, &swap_dsts, 0..h),
        written,
        case,
        work,
        plan,
    }
}

fn run_write<B: Backend>(be: &B, p: &Prepared, w: &Workload, padding_only: bool) -> Outcome<Bytes> {
    let l = &p.case.layout;
    let mut cache = upload(be, l, &sentinel(l))?;
    let key = be.upload_tensor(&w.key)?;
    let value = w.value.as_ref().map(|v| be.upload_tensor(v)).transpose()?;
    let pads = vec![-1i64; w.slot_mapping.len()];
    let args = WriteArgs {
        layer: w.layer,
        key: &key,
        value: value.as_ref(),
        slot_mapping: if padding_only { &pads } else { &w.slot_mapping },
    };
    done(be, be.write_kv(&mut cache, &args))?;
    be.download_cache(&cache)
}

fn run_decode<B: Backend>(
    be: &B,
    l: &KvCacheLayout,
    cache: &Outcome<B::Cache>,
    w: &Workload,
    i: usize,
) -> Outcome<Vec<f32>> {
    let cache = cache.as_ref().map_err(|e| format!("no cache: {e}"))?;
    let dc = &w.decodes[i];
    let (_, vw, _) = widths(l).expect("K/V content");
    let q = be.upload_tensor(&dc.query)?;
    let n = w.seq_lens.len() * dc.params.num_q_heads as usize * vw;
    let mut out = be.alloc_tensor(DType::F32, n)?;
    let args = DecodeArgs {
        layer: w.layer,
        query: &q,
        block_table: &w.block_table,
        blocks_per_seq: w.blocks_per_seq,
        seq_lens: &w.seq_lens,
        params: dc.params,
    };
    done(be, be.paged_decode(cache, &args, &mut out))?;
    Ok(be.download_tensor(&out)?.to_f32())
}

fn case_outcome<B: Backend>(be: &B, p: &Prepared) -> CaseOutcome {
    let l = &p.case.layout;
    let skipped = || Err("not run".to_string());
    let (mut write, mut write_padding, mut decodes) = (skipped(), skipped(), Vec::new());
    let mut unsupported: Outcome<()> = Err("not run".to_string());
    if let Some(w) = &p.work {
        write = run_write(be, p, w, false);
        write_padding = run_write(be, p, w, true);
        let cache = write.clone().and_then(|b| upload(be, l, &b));
        decodes = (0..w.decodes.len())
            .map(|i| run_decode(be, l, &cache, w, i))
            .collect();
    } else if p.case.ops == Ops::NoKeys {
        unsupported = movers_only_refusals(be, l);
    }
    let plan = &p.plan;
    let copy = (|| {
        let mut c = upload(be, l, &p.src)?;
        done(be, be.copy_blocks(&mut c, &plan.copy_pairs))?;
        be.download_cache(&c)
    })();
    let mut staging_bytes = skipped();
    let gather = (|| {
        let c = upload(be, l, &p.src)?;
        let mut s = upload(be, &plan.staging, &sentinel(&plan.staging))?;
        done(
            be,
            be.gather_blocks(&c, &plan.gather_blocks, plan.heads.clone(), &mut s),
        )?;
        let b = be.download_cache(&s)?;
        staging_bytes = Ok(b.clone());
        Ok(b)
    })();
    let scatter_into = |bytes: &Bytes| -> Outcome<Bytes> {
        let staged = staging_bytes
            .as_ref()
            .map_err(|e| format!("no staging: {e}"))?;
        let s = upload(be, &plan.staging, staged)?;
        let mut c = upload(be, l, bytes)?;
        done(
            be,
            be.scatter_blocks(&s, &plan.gather_blocks, plan.heads.clone(), &mut c),
        )?;
        be.download_cache(&c)
    };
    CaseOutcome {
        scatter_back: scatter_into(&p.src),
        scatter_fresh: scatter_into(&sentinel(l)),
        write,
        write_padding,
        decodes,
        unsupported,
        copy,
        gather,
    }
}

/// `write_kv` and `paged_decode` on content without keys and values: `Unsupported`.
fn movers_only_refusals<B: Backend>(be: &B, l: &KvCacheLayout) -> Outcome<()> {
    let mut c = upload(be, l, &sentinel(l))?;
    let key = be.upload_tensor(&HostTensor::F32(vec![0.0; 8]))?;
    let w = WriteArgs {
        layer: 0,
        key: &key,
        value: None,
        slot_mapping: &[0],
    };
    match be.write_kv(&mut c, &w) {
        Err(OpError::Unsupported { op: "write_kv", .. }) => {}
        Err(e) => return Err(format!("write_kv: {e}, expected Unsupported")),
        Ok(_) => return Err("write_kv accepted content without keys".into()),
    }
    let mut out = be.alloc_tensor(DType::F32, 8)?;
    let d = DecodeArgs {
        layer: 0,
        query: &key,
        block_table: &[0],
        blocks_per_seq: 1,
        seq_lens: &[1],
        params: DecodeParams {
            num_q_heads: 1,
            scale: 1.0,
            sliding_window: None,
            soft_cap: None,
        },
    };
    match be.paged_decode(&c, &d, &mut out) {
        Err(OpError::Unsupported {
            op: "paged_decode", ..
        }) => {}
        Err(e) => return Err(format!("paged_decode: {e}, expected Unsupported")),
        Ok(_) => return Err("paged_decode accepted content without keys".into()),
    }
    byte_equal(&be.download_cache(&c)?, &sentinel(l))
}

struct PairOutcome {
    convert: Outcome<Bytes>,
    back: Outcome<Bytes>,
    swap: Outcome<Bytes>,
}

fn pair_outcome<B: Backend>(be: &B, a: &Prepared, b: &Prepared) -> PairOutcome {
    let (la, lb) = (&a.case.layout, &b.case.layout);
    let mut converted = Err("not run".to_string());
    let convert = (|| {
        let src = upload(be, la, &a.src)?;
        let mut dst = upload(be, lb, &sentinel(lb))?;
        done(be, be.convert(&src, &mut dst))?;
        let bytes = be.download_cache(&dst)?;
        converted = Ok(bytes.clone());
        Ok(bytes)
    })();
    let back = (|| {
        let mid = upload(be, lb, converted.as_ref().map_err(|e| e.clone())?)?;
        let mut dst = upload(be, la, &sentinel(la))?;
        done(be, be.convert(&mid, &mut dst))?;
        be.download_cache(&dst)
    })();
    let swap = (|| {
        let src = upload(be, la, &a.src)?;
        let mut dst = upload(be, lb, &sentinel(lb))?;
        done(be, be.swap_blocks(&src, &mut dst, &a.plan.swap_pairs))?;
        be.download_cache(&dst)
    })();
    PairOutcome {
        convert,
        back,
        swap,
    }
}

// ---------------------------------------------------------------------------------------
// Comparing a backend's outcome with the reference's.

fn both<'a, T>(got: &'a Outcome<T>, want: &'a Outcome<T>) -> Outcome<(&'a T, &'a T)> {
    let want = want
        .as_ref()
        .map_err(|e| format!("the reference failed: {e}"))?;
    let got = got.as_ref().map_err(|e| e.clone())?;
    Ok((got, want))
}

/// Written values within one quantization step of the reference's.
fn compare_write(p: &Prepared, got: &Bytes, want: &Bytes) -> Outcome<()> {
    let l = &p.case.layout;
    let w = p.work.as_ref().expect("workload");
    untouched_outside(got, None, &p.written)?;
    let (g, r) = (host_cache(l, got), host_cache(l, want));
    let (g, r) = (g.as_ref(), r.as_ref());
    let (kw, vw, mla) = widths(l).expect("K/V content");
    let fields: Vec<(Field, usize)> = if mla {
        vec![(Field::Latent, kw)]
    } else {
        vec![(Field::K, kw), (Field::V, vw)]
    };
    let bs = l.geometry().block_size as i64;
    let step = l.dtype().epsilon();
    for &slot in w.slot_mapping.iter().filter(|s| **s >= 0) {
        let (b, n) = ((slot / bs) as u64, (slot % bs) as u64);
        for h in 0..l.geometry().num_kv_heads {
            for &(field, width) in &fields {
                let at = |d| Coord::new(field, w.layer, b, h, n, d as u64);
                let want_row: Vec<f64> = (0..width)
                    .map(|d| reference::value_at(&r, &at(d)))
                    .collect();
                let amax = want_row.iter().fold(0f64, |a, x| a.max(x.abs()));
                for (d, &x) in want_row.iter().enumerate() {
                    let y = reference::value_at(&g, &at(d));
                    if !within(y, x, step * x.abs().max(amax) + 1e-12) {
                        return Err(format!(
                            "slot {slot} head {h} {field}[{d}] = {y}, reference {x} (one step: {step} x {amax})"
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

/// Within the contract's tolerance everywhere (`Tolerance::contract` of the cache's dtype,
/// relative to each output row's magnitudes, which the reference measures on the oracle's
/// cache `written`); returns the worst error as a fraction of its bound.
fn compare_decode(
    l: &KvCacheLayout,
    written: &Bytes,
    w: &Workload,
    dc: &DecodeCase,
    got: &[f32],
    want: &[f32],
) -> Outcome<f64> {
    if got.len() != want.len() {
        return Err(format!("{} outputs, expected {}", got.len(), want.len()));
    }
    let cache = CacheRef::new(l, written.iter().map(Vec::as_slice).collect())
        .map_err(|e| format!("oracle cache: {e}"))?;
    let d = w.decode_args(dc);
    let mut again = vec![0f32; want.len()];
    let mags = reference::paged_decode_magnitudes(&cache, &d, &mut again)
        .map_err(|e| format!("reference magnitudes: {e}"))?;
    let tol = Tolerance::contract(l.dtype());
    let e = decode_error(got, want, &mags, tol);
    match e.worst {
        Some((i, a, b)) if !e.passed() => Err(format!(
            "out[{i}] = {a}, reference {b}: {:.2} x its bound ({tol:?}, {:?})",
            e.ratio,
            mags[i / (want.len() / mags.len().max(1)).max(1)]
        )),
        _ => Ok(e.ratio),
    }
}

/// Checks tallied per op; failures with the case name.
#[derive(Default)]
struct Report {
    skipped: Option<String>,
    passed: BTreeMap<&'static str, usize>,
    failures: Vec<String>,
    /// Worst decode error as a fraction of its tolerance, per cache dtype.
    worst_decode: BTreeMap<String, f64>,
}

impl Report {
    fn check(&mut self, op: &'static str, what: &str, r: Outcome<()>) {
        match r {
            Ok(()) => *self.passed.entry(op).or_default() += 1,
            Err(e) => self.failures.push(format!("{op}: {what}: {e}")),
        }
    }

    fn total(&self) -> usize {
        self.passed.values().sum()
    }
}

fn compare_case(rep: &mut Report, p: &Prepared, got: &CaseOutcome, want: &CaseOutcome) {
    let name = &p.case.name;
    let spec = &p.case.spec;
    let what = format!("{name} [{spec}]");
    if let Some(w) = &p.work {
        rep.check(
            "write_kv",
            &what,
            both(&got.write, &want.write).and_then(|(g, r)| compare_write(p, g, r)),
        );
        rep.check(
            "write_kv",
            &format!("{what} (padding slots only)"),
            got.write_padding
                .as_ref()
                .map_err(|e| e.clone())
                .and_then(|g| byte_equal(g, &sentinel(&p.case.layout))),
        );
        for (i, dc) in w.decodes.iter().enumerate() {
            let (g, r) = (&got.decodes[i], &want.decodes[i]);
            let r = both(g, r).and_then(|(g, r)| {
                let written = want
                    .write
                    .as_ref()
                    .map_err(|e| format!("oracle write: {e}"))?;
                compare_decode(&p.case.layout, written, w, dc, g, r)
            });
            if let Ok(worst) = r {
                let w = rep
                    .worst_decode
                    .entry(p.case.layout.dtype().to_string())
                    .or_default();
                *w = w.max(worst);
            }
            rep.check(
                "paged_decode",
                &format!("{what} {} {:?}", dc.name, dc.params),
                r.map(|_| ()),
            );
        }
    } else if p.case.ops == Ops::NoKeys {
        rep.check("unsupported", &what, got.unsupported.clone());
    }
    let plan = &p.plan;
    rep.check(
        "copy_blocks",
        &format!("{what} pairs {:?}", plan.copy_pairs),
        both(&got.copy, &want.copy).and_then(|(g, r)| {
            byte_equal(g, r)?;
            untouched_outside(g, Some(&p.src), &p.copy_dst)
        }),
    );
    rep.check(
        "gather_blocks",
        &format!(
            "{what} blocks {:?} heads {:?} into [{}]",
            plan.gather_blocks, plan.heads, plan.staging
        ),
        both(&got.gather, &want.gather).and_then(|(g, r)| {
            byte_equal(g, r)?;
            untouched_outside(g, None, &p.staging_used)
        }),
    );
    rep.check(
        "scatter_blocks",
        &format!("{what}: scatter(gather(x)) == x"),
        got.scatter_back
            .as_ref()
            .map_err(|e| e.clone())
            .and_then(|g| byte_equal(g, &p.src)),
    );
    rep.check(
        "scatter_blocks",
        &format!("{what}: into a sentinel cache"),
        both(&got.scatter_fresh, &want.scatter_fresh).and_then(|(g, r)| {
            byte_equal(g, r)?;
            untouched_outside(g, None, &p.scattered)
        }),
    );
}

fn compare_pair(
    rep: &mut Report,
    a: &Prepared,
    b: &Prepared,
    got: &PairOutcome,
    want: &PairOutcome,
) {
    let what = format!("{} -> {}", a.case.name, b.case.name);
    rep.check(
        "convert",
        &what,
        both(&got.convert, &want.convert).and_then(|(g, r)| {
            byte_equal(g, r)?;
            untouched_outside(g, None, &b.every)
        }),
    );
    rep.check(
        "convert",
        &format!("{what} -> back is the identity"),
        got.back.as_ref().map_err(|e| e.clone()).and_then(|g| {
            equal_on(g, &a.src, &a.every)?;
            untouched_outside(g, None, &a.every)
        }),
    );
    rep.check(
        "swap_blocks",
        &format!("{what} pairs {:?}", a.plan.swap_pairs),
        both(&got.swap, &want.swap).and_then(|(g, r)| {
            byte_equal(g, r)?;
            untouched_outside(g, None, &b.swap_dst)
        }),
    );
}

/// Runs one group of cases (one content) on every backend.
struct GroupRunner<'a> {
    cases: &'a [Prepared],
    oracle: &'a [CaseOutcome],
    pair_oracle: &'a [Vec<PairOutcome>],
    reports: &'a mut BTreeMap<String, Report>,
}

fn guarded<T>(what: &str, f: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|e| {
        let msg = e
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        format!("{what}: panicked: {msg}")
    })
}

impl BackendVisitor for GroupRunner<'_> {
    fn visit<B: Backend>(&mut self, be: &B) {
        let rep = self.reports.entry(be.name().to_string()).or_default();
        if let Err(why) = be.available() {
            rep.skipped = Some(why);
            return;
        }
        for (p, want) in self.cases.iter().zip(self.oracle) {
            match guarded(&p.case.name, || case_outcome(be, p)) {
                Ok(got) => compare_case(rep, p, &got, want),
                Err(e) => rep.failures.push(e),
            }
        }
        for (i, a) in self.cases.iter().enumerate() {
            for (j, b) in self.cases.iter().enumerate() {
                let what = format!("{} -> {}", a.case.name, b.case.name);
                match guarded(&what, || pair_outcome(be, a, b)) {
                    Ok(got) => compare_pair(rep, a, b, &got, &self.pair_oracle[i][j]),
                    Err(e) => rep.failures.push(e),
                }
            }
        }
        if let Err(e) = be.synchronize() {
            rep.failures.push(format!("synchronize: {e}"));
        }
    }
}

fn print_reports(title: &str, reports: &BTreeMap<String, Report>, order: &[&str]) -> usize {
    let mut failures = 0;
    for name in order {
        let Some(r) = reports.get(*name) else {
            continue;
        };
        if let Some(why) = &r.skipped {
            kvlayout_conformance::report(&format!("skipped: {name}: {why}"));
            continue;
        }
        let per_op: Vec<String> = r.passed.iter().map(|(op, n)| format!("{op} {n}")).collect();
        kvlayout_conformance::report(&format!(
            "{title}: {name}: {} cases passed, {} failed ({})",
            r.total(),
            r.failures.len(),
            per_op.join(", ")
        ));
        if !r.worst_decode.is_empty() {
            let worst: Vec<String> = r
                .worst_decode
                .iter()
                .map(|(d, x)| format!("{d} {x:.1e}"))
                .collect();
            kvlayout_conformance::report(&format!(
                "{title}: {name}: paged_decode worst error / tolerance: {}",
                worst.join(", ")
            ));
        }
        for f in r.failures.iter().take(25) {
            println!("  FAIL {name}: {f}");
        }
        if r.failures.len() > 25 {
            println!("  ... and {} more", r.failures.len() - 25);
        }
        failures += r.failures.len();
    }
    failures
}

fn backend_names(backends: &Backends) -> Vec<String> {
    struct Names(Vec<String>);
    impl BackendVisitor for Names {
        fn visit<B: Backend>(&mut self, b: &B) {
            self.0.push(b.name().to_string());
        }
    }
    let mut n = Names(Vec::new());
    backends.for_each(&mut n);
    n.0
}

#[test]
fn every_case_on_every_backend() {
    let start = Instant::now();
    let backends = Backends::default();
    let oracle = Host::<ScalarReference>::reference();
    let cases = all_cases();
    let n_cases = cases.len();
    // Group the cases by content, keeping table order.
    let mut groups: Vec<(String, Vec<LayoutCase>)> = Vec::new();
    for c in cases {
        match groups.iter_mut().find(|g| g.0 == c.group) {
            Some(g) => g.1.push(c),
            None => groups.push((c.group.clone(), vec![c])),
        }
    }
    let mut reports: BTreeMap<String, Report> = BTreeMap::new();
    let mut layout_checks = Report::default();
    let mut index = 0;
    for (_, group) in groups {
        let prepared: Vec<Prepared> = group
            .into_iter()
            .map(|c| {
                index += 1;
                prepare(c, index)
            })
            .collect();
        for p in &prepared {
            // The element byte sets used above agree with the layout's own block regions.
            let l = &p.case.layout;
            let h = l.geometry().num_kv_heads;
            let blocks: Vec<u64> = (0..l.geometry().num_blocks).collect();
            for (blocks, heads) in [
                (vec![blocks[blocks.len() - 1]], 0..h),
                (p.plan.gather_blocks.clone(), p.plan.heads.clone()),
                (blocks, 0..h),
            ] {
                layout_checks.check(
                    "block_regions",
                    &format!("{} blocks {blocks:?} heads {heads:?}", p.case.name),
                    regions_mask(l, &blocks, heads.clone()).and_then(|m| {
                        (m == blocks_mask(l, &blocks, heads.clone()))
                            .then_some(())
                            .ok_or_else(|| "block_regions differ from the element bytes".into())
                    }),
                );
            }
        }
        let case_oracle: Vec<CaseOutcome> =
            prepared.iter().map(|p| case_outcome(&oracle, p)).collect();
        let pair_oracle: Vec<Vec<PairOutcome>> = prepared
            .iter()
            .map(|a| {
                prepared
                    .iter()
                    .map(|b| pair_outcome(&oracle, a, b))
                    .collect()
            })
            .collect();
        backends.for_each(&mut GroupRunner {
            cases: &prepared,
            oracle: &case_oracle,
            pair_oracle: &pair_oracle,
            reports: &mut reports,
        });
    }
    let mut failures = 0;
    let mut lr = BTreeMap::new();
    lr.insert("layout".to_string(), layout_checks);
    failures += print_reports("conformance", &lr, &["layout"]);
    let names = backend_names(&backends);
    let order: Vec<&str> = names.iter().map(String::as_str).collect();
    failures += print_reports("conformance", &reports, &order);
    kvlayout_conformance::report(&format!(
        "conformance: cpu ran the {} kernels; every other build this machine runs ran as \
         cpu/<build>",
        kvlayout_cpu::CpuBackend::kernels()
    ));
    for (build, why) in kvlayout_cpu::CpuBackend::kernels_not_run() {
        kvlayout_conformance::report(&format!("skipped: cpu kernels {build}: {why}"));
    }
    kvlayout_conformance::report(&format!(
        "conformance: {n_cases} layout cases, {:.1} s",
        start.elapsed().as_secs_f64()
    ));
    assert_eq!(failures, 0, "conformance failures (listed above)");
}

// ---------------------------------------------------------------------------------------
// Refusals: a typed error, and every cache byte unchanged.
#[path = "conformance/refusals.rs"]
mod refusals;

#[test]
fn the_table_covers_what_the_suite_promises() {
    let cases = all_cases();
    let names: Vec<&str> = cases.iter().map(|c| c.name.as_str()).collect();
    let specs: Vec<&str> = cases.iter().map(|c| c.spec.as_str()).collect();
    for order in kvlayout_conformance::cases::ALL_ORDERS {
        assert!(
            specs.iter().any(|s| s.contains(&format!("order={order}"))),
            "{order}"
        );
    }
    for needle in [
        "order=NHD",
        "order=HND",
        "page=",
        "base=",
        "legacy=vllm-paged-v1",
        "legacy=flash-attn-nhd",
        "legacy=flash-attn-hnd",
        "legacy=flashinfer-nhd",
        "legacy=flashinfer-hnd",
        "legacy=separate-nhd",
        "legacy=separate-hnd",
        "D=192 Dv=128",
        "rank=512 rope=64",
        "kv-scaled",
        "B=3 N=16 H=4 D=8",
        "B=2",
        "H=1",
        "N=4 H=4",
        "k_scale=",
    ] {
        assert!(
            specs.iter().any(|s| s.contains(needle)),
            "no case with {needle}"
        );
    }
    for dtype in ["f32", "f16", "bf16", "fp8_e4m3", "fp8_e5m2", "int8"] {
        assert!(
            names.iter().any(|n| n.ends_with(&format!("/{dtype}"))),
            "{dtype}"
        );
    }
    let groups: BTreeSet<&str> = cases.iter().map(|c| c.group.as_str()).collect();
    assert!(
        groups.len() < cases.len(),
        "some layouts share content (convert pairs)"
    );
}
