//! Properties pinned on fixed layouts: the pictured page, views of size-1 axes and of every
//! layer; and the shares of the random layouts the other properties draw.

use std::collections::BTreeSet;

use kvlayout::{Convention, Field, KvCacheLayout, ViewTarget};
use kvlayout_conformance::domain::{coord_of, for_each_index, CONVENTIONS};
use kvlayout_conformance::gen::any_layout;
use proptest::strategy::Strategy;

/// Every data byte of the pictured page belongs to exactly one run.
#[test]
fn explain_page_runs_partition_the_page() {
    for name in [
        "llama-3-8b B=4",
        "deepseek-v3 B=2",
        "kv B=3 N=16 H=4 D=8 dtype=f16 tensor=vllm-paged-v1",
    ] {
        let l: KvCacheLayout = name.parse().unwrap();
        let ex = l.explain();
        let bytes: u64 = ex.page_runs.iter().map(|r| r.len).sum();
        assert_eq!(bytes, l.dense_page_bytes(), "{name}");
        let starts: BTreeSet<u64> = ex.page_runs.iter().map(|r| r.offset).collect();
        assert_eq!(starts.len(), ex.page_runs.len());
        let text = ex.to_text();
        assert!(text.contains("registered span"), "{text}");
    }
}

/// The random layouts give each kind of case the suite leans on a real share (at least 10%
/// each of 3000 deterministic draws): legacy placements (vLLM's among them), scaled content
/// (inline or per-tensor scales) and explicit-strided placements.
#[test]
fn gen_shares() {
    use kvlayout::{EngineTensor, Placement};
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = any_layout();
    let n = 3000;
    let (mut legacy, mut vllm, mut scaled, mut strided) = (0, 0, 0, 0);
    for _ in 0..n {
        let l = strategy.new_tree(&mut runner).unwrap().current();
        match l.placement() {
            Placement::EngineTensor { layout, .. } => {
                legacy += 1;
                vllm += usize::from(*layout == EngineTensor::VllmPagedV1);
            }
            Placement::Strided { .. } => strided += 1,
            _ => {}
        }
        let s = l.scales();
        if l.content().inline_scales() || s.k_scale != 1.0 || s.v_scale != 1.0 {
            scaled += 1;
        }
    }
    let share = |k: usize| k as f64 / n as f64;
    for (what, k) in [("legacy", legacy), ("scaled", scaled), ("strided", strided)] {
        assert!(share(k) >= 0.10, "{what}: {k} of {n}");
    }
    assert!(share(vllm) >= 0.02, "vllm-paged-v1: {vllm} of {n}");
}

/// A size-1 axis may carry a stride that is no whole number of elements (a one-head TP slice
/// with an odd head stride): its views exist, the stride reported in whole elements; and a
/// view refused names its convention and target.
#[test]
fn views_of_a_size_one_axis_with_an_odd_stride() {
    let l: KvCacheLayout = "kv B=2 N=2 H=1 D=4 dtype=f16 @k=0:0:0:64:33:8:4:8:2 \
                            @v=0:128:0:64:33:8:4:8:2 @buf0=0..256"
        .parse()
        .unwrap();
    for conv in CONVENTIONS {
        let v = l.view(conv, ViewTarget::Field(Field::V), 0).unwrap();
        let x = v.dtype.vllm_x();
        for_each_index(&v.shape, |idx| {
            let c = coord_of(conv, ViewTarget::Field(Field::V), 0, x, idx);
            assert_eq!(v.byte_offset(idx).unwrap(), l.offset(&c).unwrap().offset);
        });
    }
    let e = l.view(Convention::Standard, ViewTarget::Kv, 0).unwrap_err();
    assert!(e.to_string().contains("standard view of field kv"), "{e}");
}

/// The stacked K/V view of every layer of a multi-layer cache exists and addresses each
/// element as the layout does (the K/V stride is taken in the layer asked for).
#[test]
fn kv_views_of_every_layer() {
    for (spec, conv) in [
        (
            "kv L=3 B=2 N=4 H=2 D=8 dtype=f16 tensor=flash-attn-nhd",
            Convention::FlashAttn,
        ),
        (
            "kv L=3 B=2 N=4 H=2 D=8 dtype=f16 tensor=flashinfer-hnd",
            Convention::FlashinferHnd,
        ),
        (
            "kv L=3 B=2 N=4 H=2 D=8 dtype=f16 order=LBNHC",
            Convention::Flashinfer,
        ),
    ] {
        let l: KvCacheLayout = spec.parse().unwrap();
        for layer in 0..3 {
            let v = l
                .view(conv, ViewTarget::Kv, layer)
                .unwrap_or_else(|e| panic!("{spec} {conv} layer {layer}: {e}"));
            for_each_index(&v.shape, |idx| {
                let c = coord_of(conv, ViewTarget::Kv, layer, 1, idx);
                let want = l.offset(&c).unwrap().offset;
                assert_eq!(v.byte_offset(idx).unwrap(), want, "{spec} {conv} {layer}");
            });
        }
    }
}
