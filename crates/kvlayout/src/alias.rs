//! Exact overlap tests for strided byte maps.
//!
//! Two elements overlap when their byte intervals intersect. For affine maps this is the
//! question whether some integer combination `sum k_i * s_i`, each `k_i` in a range, lands in
//! a target interval. We answer it exactly by a depth-first search from the largest stride,
//! pruning with the reach of the smaller ones; real layouts need a handful of nodes.

use crate::field_map::FieldMap;
use crate::spec::FieldStrides;

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

/// A field's strides in words, for messages, e.g.
/// `buffer 0, base 0, layer 192, block 64, head 16, token 8, dim 2 (bytes)`. A content index
/// split into chunks that do not abut adds the chunk stride and the elements per chunk,
/// `chunk 64 (8 elements each)`, before `dim`; a split whose chunks abut addresses like none
/// and is not shown.
pub(crate) fn describe(s: &FieldStrides) -> String {
    let split = if s.dim_split > 0 && s.dim_chunk != s.dim_split.saturating_mul(s.dim) {
        format!(", chunk {} ({} elements each)", s.dim_chunk, s.dim_split)
    } else {
        String::new()
    };
    format!(
        "buffer {}, base {}, layer {}, block {}, head {}, token {}{split}, dim {} (bytes)",
        s.buffer, s.base_offset, s.layer, s.block, s.head, s.slot, s.dim
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Field, KvCacheLayout};

    fn strides(spec: &str, field: Field) -> FieldStrides {
        let l: KvCacheLayout = spec.parse().unwrap();
        l.field_map(field).unwrap().strides
    }

    /// Strides read as named byte counts; the vLLM key's split shows its chunks, an unsplit
    /// field (or a split whose chunks abut) does not.
    #[test]
    fn describe_names_every_stride() {
        // Token-major page: row [K 8][V 8] f16 = 32 B, 4 heads, 16 tokens, 3 blocks.
        let nhd = "kv L=2 B=3 N=16 H=4 D=8 dtype=f16 order=NHD base=64";
        assert_eq!(
            describe(&strides(nhd, Field::V)),
            "buffer 0, base 80, layer 6144, block 2048, head 32, token 128, dim 2 (bytes)"
        );
        // vLLM key [B, H, D/x, N, x], x = 8 for f16: head 16*4*2 = 128 B, token x*2 = 16 B,
        // chunk 4*8*2 = 64 B, block 4*2*16*2 = 256 B; K and V halves of 3 * 256 B per layer.
        let vllm = "kv L=2 B=3 N=4 H=2 D=16 dtype=f16 tensor=vllm-paged-v1";
        assert_eq!(
            describe(&strides(vllm, Field::K)),
            "buffer 0, base 0, layer 1536, block 256, head 128, token 16, \
             chunk 64 (8 elements each), dim 2 (bytes)"
        );
        // Separate V in buffer 1.
        let sep = "kv L=1 B=2 N=2 H=2 D=4 dtype=f16 tensor=separate-nhd";
        assert_eq!(
            describe(&strides(sep, Field::V)),
            "buffer 1, base 0, layer 64, block 32, head 8, token 16, dim 2 (bytes)"
        );
        // Abutting chunks, and a hand-built zero split, read as no split.
        let abut = FieldStrides {
            buffer: 0,
            base_offset: 0,
            layer: 192,
            block: 64,
            head: 16,
            slot: 8,
            dim_split: 2,
            dim_chunk: 4,
            dim: 2,
        };
        let plain = "buffer 0, base 0, layer 192, block 64, head 16, token 8, dim 2 (bytes)";
        assert_eq!(describe(&abut), plain);
        let zero = FieldStrides {
            dim_split: 0,
            dim_chunk: 16,
            ..abut
        };
        assert_eq!(describe(&zero), plain);
    }
}
