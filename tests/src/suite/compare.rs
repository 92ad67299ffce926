//! Comparing a backend's outcome with the reference's.

use crate::cases::{widths, DecodeCase, Ops, Workload};
use kvlayout::{Coord, Field, KvCacheLayout};
use kvlayout_cpu::tolerance::{decode_error, Tolerance};
use kvlayout_cpu::{reference, CacheRef};

use super::bytes::{
    byte_equal, equal_on, host_cache, sentinel, untouched_outside, within, Bytes, Mask, Outcome,
};
use super::report::Report;
use super::run::{CaseOutcome, PairOutcome, Prepared};

/// Both outcomes' values, or what failed (the reference's failure named as such).
fn both<'a, T>(got: &'a Outcome<T>, want: &'a Outcome<T>) -> Outcome<(&'a T, &'a T)> {
    let want = want
        .as_ref()
        .map_err(|e| format!("the reference failed: {e}"))?;
    let got = got.as_ref().map_err(|e| e.clone())?;
    Ok((got, want))
}

/// Byte-equal to the reference's, and every byte outside `mask` unchanged from `before` (the
/// sentinel when `None`).
fn same_bytes(
    got: &Outcome<Bytes>,
    want: &Outcome<Bytes>,
    before: Option<&Bytes>,
    mask: &Mask,
) -> Outcome<()> {
    both(got, want).and_then(|(g, r)| {
        byte_equal(g, r)?;
        untouched_outside(g, before, mask)
    })
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

/// Checks one case's outcome on a backend against the reference's.
pub fn compare_case(rep: &mut Report, p: &Prepared, got: &CaseOutcome, want: &CaseOutcome) {
    let name = &p.case.name;
    let spec = &p.case.spec;
    let what = format!("{name} [{spec}]");
    if let Some(w) = &p.work {
        compare_write_and_decodes(rep, p, w, &what, got, want);
    } else if p.case.ops == Ops::NoKeys {
        rep.check("unsupported", &what, got.unsupported.clone());
    }
    let plan = &p.plan;
    rep.check(
        "copy_blocks",
        &format!("{what} pairs {:?}", plan.copy_pairs),
        same_bytes(&got.copy, &want.copy, Some(&p.src), &p.copy_dst),
    );
    rep.check(
        "gather_blocks",
        &format!(
            "{what} blocks {:?} heads {:?} into [{}]",
            plan.gather_blocks, plan.heads, plan.staging
        ),
        same_bytes(&got.gather, &want.gather, None, &p.staging_used),
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
        same_bytes(&got.scatter_fresh, &want.scatter_fresh, None, &p.scattered),
    );
}

/// Checks one ordered pair's outcome on a backend against the reference's.
pub fn compare_pair(
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
        same_bytes(&got.convert, &want.convert, None, &b.every),
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
        same_bytes(&got.swap, &want.swap, None, &b.swap_dst),
    );
}

/// `write_kv` (the workload, and padding slots only) and every decode step of a case.
fn compare_write_and_decodes(
    rep: &mut Report,
    p: &Prepared,
    w: &Workload,
    what: &str,
    got: &CaseOutcome,
    want: &CaseOutcome,
) {
    rep.check(
        "write_kv",
        what,
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
}
