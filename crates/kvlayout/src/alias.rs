//! Exact overlap tests for strided byte maps.
//!
//! Two elements overlap when their byte intervals intersect. For affine maps this is the
//! question whether some integer combination `sum k_i * s_i`, each `k_i` in a range, lands in
//! a target interval. We answer it exactly by a depth-first search from the largest stride,
//! pruning with the reach of the smaller ones; real layouts need a handful of nodes.

use crate::field_map::FieldMap;

/// One term `k * stride` with `k` in `[lo, hi]`.
#[derive(Debug, Clone, Copy)]
struct Term {
    stride: i128,
    lo: i128,
    hi: i128,
}

/// The search gave up: the layout is too irregular to decide cheaply.
#[derive(Debug)]
pub(crate) struct Undecided;

const NODE_BUDGET: u64 = 200_000;

fn search(
    terms: &[Term],
    lo: i128,
    hi: i128,
    any_nonzero: bool,
    need_nonzero: bool,
    budget: &mut u64,
) -> Result<bool, Undecided> {
    if *budget == 0 {
        return Err(Undecided);
    }
    *budget -= 1;
    let Some((first, rest)) = terms.split_first() else {
        return Ok(lo <= 0 && 0 <= hi && (any_nonzero || !need_nonzero));
    };
    let reach_min: i128 = rest.iter().map(|t| t.lo * t.stride).sum();
    let reach_max: i128 = rest.iter().map(|t| t.hi * t.stride).sum();
    // k * s must lie in [lo - reach_max, hi - reach_min].
    let k_min = (lo - reach_max).div_euclid(first.stride)
        + i128::from((lo - reach_max).rem_euclid(first.stride) != 0);
    let k_max = (hi - reach_min).div_euclid(first.stride);
    let (k_min, k_max) = (k_min.max(first.lo), k_max.min(first.hi));
    let mut k = k_min;
    while k <= k_max {
        let shift = k * first.stride;
        if search(
            rest,
            lo - shift,
            hi - shift,
            any_nonzero || k != 0,
            need_nonzero,
            budget,
        )? {
            return Ok(true);
        }
        k += 1;
    }
    Ok(false)
}

fn sorted(mut terms: Vec<Term>) -> Vec<Term> {
    terms.retain(|t| t.stride != 0 && t.lo != t.hi);
    terms.sort_by_key(|t| std::cmp::Reverse(t.stride));
    terms
}

/// Whether two distinct coordinates of `map` touch a common byte.
pub(crate) fn self_overlaps(map: &FieldMap) -> Result<bool, Undecided> {
    let e = map.elem_bytes() as i128;
    let mut terms = Vec::new();
    for (ext, stride) in map.axes() {
        if ext > 1 {
            if stride == 0 {
                return Ok(true);
            }
            let ext = ext as i128;
            terms.push(Term {
                stride: stride as i128,
                lo: -(ext - 1),
                hi: ext - 1,
            });
        }
    }
    let terms = sorted(terms);
    let mut budget = NODE_BUDGET;
    search(&terms, -(e - 1), e - 1, false, true, &mut budget)
}

/// Whether any element of `a` overlaps any element of `b` (same buffer assumed).
pub(crate) fn cross_overlaps(a: &FieldMap, b: &FieldMap) -> Result<bool, Undecided> {
    let (ea, eb) = (a.elem_bytes() as i128, b.elem_bytes() as i128);
    // Quick accept: disjoint bounding intervals.
    let (a0, a1) = (a.strides.base_offset, a.data_end());
    let (b0, b1) = (b.strides.base_offset, b.data_end());
    if a1 <= b0 || b1 <= a0 {
        return Ok(false);
    }
    // sum_a k s - sum_b k' s in [base_b - base_a - ea + 1, base_b - base_a + eb - 1]
    let mut terms: Vec<Term> = Vec::new();
    let mut push = |stride: u64, lo: i128, hi: i128| {
        let stride = stride as i128;
        if let Some(t) = terms.iter_mut().find(|t| t.stride == stride) {
            t.lo += lo;
            t.hi += hi;
        } else {
            terms.push(Term { stride, lo, hi });
        }
    };
    for (ext, stride) in a.axes() {
        push(stride, 0, ext as i128 - 1);
    }
    for (ext, stride) in b.axes() {
        push(stride, -(ext as i128 - 1), 0);
    }
    let delta = b.strides.base_offset as i128 - a.strides.base_offset as i128;
    let terms = sorted(terms);
    let mut budget = NODE_BUDGET;
    search(
        &terms,
        delta - ea + 1,
        delta + eb - 1,
        false,
        false,
        &mut budget,
    )
}
