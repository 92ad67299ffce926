//! The CPU backend's fast paths against its scalar reference over random layouts of every
//! kind (`kvlayout_conformance::gen`): byte-identical results for the block movers and for
//! `write_kv`.

use kvlayout::{Content, KvCacheLayout};
use kvlayout_conformance::gen::any_layout;
use kvlayout_cpu::{reference, Activations, CpuBackend, HostCache, WriteKv};
use proptest::prelude::*;

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

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, max_global_rejects: 100_000, ..ProptestConfig::default() })]

    /// convert / swap / copy / gather / scatter: fast == reference, byte for byte.
    #[test]
    fn movers_match_reference(a in any_layout(), b in any_layout(), pick in 0u64..1000) {
        let be = CpuBackend::new(Some(2));
        let nb = a.geometry().num_blocks;
        // copy_blocks within `a`
        if nb >= 2 {
            let pairs = [(pick % nb, (pick + 1) % nb)];
            let (mut fast, mut slow) = (filled(&a, 1), filled(&a, 1));
            be.copy_blocks(&mut fast.as_mut(), &pairs).unwrap();
            reference::copy_blocks(&mut slow.as_mut(), &pairs).unwrap();
            prop_assert!(same(&fast, &slow), "copy_blocks on {a}");
        }
        // convert / swap into `b` when the content matches
        if kvlayout::ops::check_same_content(&a, &b).is_ok() {
            let src = filled(&a, 2);
            let (mut fast, mut slow) = (filled(&b, 3), filled(&b, 3));
            let pairs = [(pick % nb, (pick / 7) % b.geometry().num_blocks)];
            be.swap_blocks(&src.as_ref(), &mut fast.as_mut(), &pairs).unwrap();
            reference::swap_blocks(&src.as_ref(), &mut slow.as_mut(), &pairs).unwrap();
            prop_assert!(same(&fast, &slow), "swap {a} -> {b}");
            if nb == b.geometry().num_blocks {
                be.convert(&src.as_ref(), &mut fast.as_mut()).unwrap();
                reference::convert(&src.as_ref(), &mut slow.as_mut()).unwrap();
                prop_assert!(same(&fast, &slow), "convert {a} -> {b}");
            }
        }
        // gather a head slice into a staging layout of the same kind (`a` sliced by TP).
        let h = a.geometry().num_kv_heads;
        if h % 2 == 0 {
            let staging_layout: KvCacheLayout = {
                let s = a.tp_slice(2, 1).unwrap();
                // A dense staging cache of the slice's content in the parent's order.
                let mut spec = s.spec().clone();
                spec.placement = kvlayout::Placement::Paged(kvlayout::Paged::new(kvlayout::AxisOrder::LBHNC));
                KvCacheLayout::new(spec).unwrap()
            };
            let cache = filled(&a, 4);
            let blocks = [pick % nb];
            let (mut fast, mut slow) = (filled(&staging_layout, 5), filled(&staging_layout, 5));
            be.gather_blocks(&cache.as_ref(), &blocks, h / 2..h, &mut fast.as_mut()).unwrap();
            reference::gather_blocks(&cache.as_ref(), &blocks, h / 2..h, &mut slow.as_mut()).unwrap();
            prop_assert!(same(&fast, &slow), "gather {a}");
            let (mut fast_c, mut slow_c) = (filled(&a, 6), filled(&a, 6));
            be.scatter_blocks(&fast.as_ref(), &blocks, h / 2..h, &mut fast_c.as_mut()).unwrap();
            reference::scatter_blocks(&slow.as_ref(), &blocks, h / 2..h, &mut slow_c.as_mut()).unwrap();
            prop_assert!(same(&fast_c, &slow_c), "scatter {a}");
        }
    }

    /// write_kv: fast == reference, byte for byte, and padding slots write nothing.
    #[test]
    fn write_kv_matches_reference(l in any_layout(), seed in 0u32..1000) {
        let g = *l.geometry();
        let (kw, vw, mla) = match *l.content() {
            Content::Kv { head_size, head_size_v } | Content::KvScaled { head_size, head_size_v } => (head_size as usize, head_size_v as usize, false),
            Content::Mla { kv_lora_rank, rope_dim } => ((kv_lora_rank + rope_dim) as usize, 0, true),
            _ => return Ok(()),
        };
        if g.tokens_per_state != 1 {
            return Ok(());
        }
        let heads = g.num_kv_heads as usize;
        let total = g.num_blocks * g.block_size;
        let slots: Vec<i64> = (0..5u64).map(|t| if t == 2 { -1 } else { ((u64::from(seed) + t * 7) % total) as i64 }).collect();
        let mut uniq = slots.clone();
        uniq.sort_unstable();
        uniq.dedup();
        if uniq.len() != slots.len() {
            return Ok(());
        }
        let k: Vec<f32> = (0..5 * heads * kw).map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 125.0 - 4.0).collect();
        let v: Vec<f32> = (0..5 * heads * vw).map(|i| (((i as u32).wrapping_mul(40503) ^ seed) % 1000) as f32 / 125.0 - 4.0).collect();
        let w = WriteKv { layer: 0, key: Activations::F32(&k), value: (!mla).then_some(Activations::F32(&v)), slot_mapping: &slots };
        let be = CpuBackend::new(Some(2));
        let (mut fast, mut slow) = (filled(&l, 9), filled(&l, 9));
        be.write_kv(&mut fast.as_mut(), &w).unwrap();
        reference::write_kv(&mut slow.as_mut(), &w).unwrap();
        prop_assert!(same(&fast, &slow), "write_kv on {l}");
    }
}
