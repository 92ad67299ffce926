//! Properties of the descriptor over random valid layouts of every kind (see
//! `kvlayout_conformance::gen`), each checked against an independent enumeration; and edited
//! spec strings, which parse to such a layout or fail with a typed error (`properties/`: the
//! strided strategies, edited spec strings, refusals' texts and fixed layouts).

use kvlayout::{
    merge_ranges, ByteRange, Coord, Field, KvCacheLayout, LayoutError, TensorClaim, ViewTarget,
};
use kvlayout_conformance::domain::{
    coord_of, coords, for_each_index, reference_offset, CONVENTIONS,
};
use kvlayout_conformance::gen::{any_layout, base_layout};
use kvlayout_conformance::view_targets;
use proptest::prelude::*;

#[path = "properties/edited.rs"]
mod edited;
#[path = "properties/errors.rs"]
mod errors;
#[path = "properties/fixed.rs"]
mod fixed;
#[path = "properties/strategies.rs"]
mod strategies;

use strategies::{arbitrary_mla, arbitrary_strided, brute_force_overlap};

/// `cases` cases, with room for the layouts the strategies reject.
fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        max_global_rejects: 100_000,
        ..ProptestConfig::default()
    }
}

/// Byte ranges `[start, end)` of every stored element, per buffer.
fn element_ranges(l: &KvCacheLayout) -> Vec<ByteRange> {
    coords(l, true)
        .iter()
        .map(|c| {
            let (buffer, offset) = reference_offset(l, c);
            let len = l.field_map(c.field).unwrap().elem_bytes();
            ByteRange {
                buffer,
                offset,
                len,
            }
        })
        .collect()
}

proptest! {
    #![proptest_config(config(512))]

    /// Post-condition of construction: the address map is injective over its domain (no two
    /// elements of any two stored fields share a byte) and stays inside the registered span.
    #[test]
    fn address_map_injective_and_inside_span(l in any_layout()) {
        let mut ranges = element_ranges(&l);
        let spans = l.registered_spans();
        for r in &ranges {
            let span = spans[r.buffer as usize];
            prop_assert!(r.offset >= span.offset && r.offset + r.len <= span.offset + span.len,
                "{r:?} outside {span:?} in {l}");
        }
        ranges.sort_unstable();
        for w in ranges.windows(2) {
            prop_assert!(w[0].buffer != w[1].buffer || w[0].offset + w[0].len <= w[1].offset,
                "{:?} overlaps {:?} in {l}", w[0], w[1]);
        }
    }

    /// The checked address function equals the reference formula, and refuses one past the end
    /// of every axis.
    #[test]
    fn offset_matches_reference_and_bounds(l in any_layout()) {
        for c in coords(&l, false) {
            let at = l.offset(&c).unwrap();
            prop_assert_eq!((at.buffer, at.offset), reference_offset(&l, &c));
        }
        for field in l.readable_fields() {
            let m = l.field_map(field).unwrap();
            let zero = Coord { layer: 0, block: 0, head: 0, slot: 0, field, dim: 0 };
            let past = [
                Coord { layer: m.num_layers, ..zero },
                Coord { block: m.num_blocks, ..zero },
                Coord { head: m.num_heads, ..zero },
                Coord { slot: m.num_slots, ..zero },
                Coord { dim: m.width, ..zero },
            ];
            for c in past {
                let refused = matches!(l.offset(&c), Err(LayoutError::OutOfRange { .. }));
                prop_assert!(refused);
            }
        }
    }

    /// Every view that exists reproduces the address map element by element; its element and
    /// byte strides agree; and `check_tensor` accepts exactly it.
    #[test]
    fn views_reproduce_address_map(l in any_layout()) {
        let targets = view_targets(&l);
        let layer = l.geometry().num_layers - 1;
        for c in CONVENTIONS {
            for &t in &targets {
                let Ok(v) = l.view(c, t, layer) else { continue };
                let e = v.dtype.size_bytes();
                prop_assert_eq!(v.offset * e, v.offset_bytes);
                for ((s, sb), ext) in v.strides.iter().zip(&v.strides_bytes).zip(&v.shape) {
                    prop_assert!(s * e == *sb || *ext == 1);
                }
                let x = v.dtype.vllm_x();
                let mut bad = None;
                for_each_index(&v.shape, |idx| {
                    let want = l.offset(&coord_of(c, t, layer, x, idx)).unwrap();
                    let got = v.byte_offset(idx).unwrap();
                    if (want.buffer, want.offset) != (v.buffer, got) && bad.is_none() {
                        bad = Some((idx.to_vec(), want, got));
                    }
                });
                prop_assert!(bad.is_none(), "{c} {t} of {l}: {bad:?}");
                let claim = TensorClaim { convention: c, target: t, layer, shape: &v.shape, strides: &v.strides, dtype: v.dtype, storage_offset: Some(kvlayout::StorageOffset::Elements(v.offset)) };
                l.check_tensor(&claim).unwrap();
                // Swapping the strides of two size>1 axes with distinct strides is caught.
                let big: Vec<usize> = (0..v.shape.len()).filter(|&i| v.shape[i] > 1).collect();
                if let [i, j, ..] = big[..] {
                    if v.strides[i] != v.strides[j] {
                        let mut s = v.strides.clone();
                        s.swap(i, j);
                        let caught = matches!(l.check_tensor(&TensorClaim { strides: &s, storage_offset: None, ..claim }), Err(LayoutError::TensorMismatch(_)));
                        prop_assert!(caught);
                    }
                }
            }
        }
    }

    /// JSON and the compact spec string both round-trip to an equal layout.
    #[test]
    fn serde_and_spec_string_round_trip(l in any_layout()) {
        let json = l.to_json();
        prop_assert_eq!(&KvCacheLayout::from_json(&json).unwrap(), &l);
        let via_serde: KvCacheLayout = serde_json::from_str(&json).unwrap();
        prop_assert_eq!(&via_serde, &l);
        let s = l.to_string();
        let back: KvCacheLayout = s.parse().unwrap();
        prop_assert_eq!(&back, &l, "spec {}", s);
        prop_assert_eq!(back.to_string(), s);
    }

    /// The kernel arguments' offset function equals the address map.
    #[test]
    fn kernel_args_match_address_map(l in any_layout()) {
        for c in coords(&l, false) {
            let a = l.kernel_args(c.field).unwrap();
            let at = l.offset(&c).unwrap();
            prop_assert_eq!(a.buffer as u32, at.buffer);
            let off = a.offset(c.layer as i64, c.block as i64, c.head as i64, c.slot as i64, c.dim as i64).unwrap();
            prop_assert_eq!(off as u64, at.offset);
        }
    }

    /// Regions: a block's head range and a layer range cover exactly the bytes of their
    /// elements, merged (no two returned ranges touch).
    #[test]
    fn regions_cover_exactly_their_elements(l in any_layout(), pick in 0u64..64) {
        let g = *l.geometry();
        let block = pick % g.num_blocks;
        let h0 = pick % g.num_kv_heads;
        let h1 = h0 + 1 + (pick / 7) % (g.num_kv_heads - h0);
        let l0 = pick % g.num_layers;
        let check = |got: Vec<ByteRange>, sel: &dyn Fn(&Coord) -> bool| -> Result<(), TestCaseError> {
            let want: Vec<ByteRange> = merge_ranges(
                coords(&l, true).iter().filter(|c| sel(c)).map(|c| {
                    let (buffer, offset) = reference_offset(&l, c);
                    ByteRange { buffer, offset, len: l.field_map(c.field).unwrap().elem_bytes() }
                }).collect()).unwrap();
            prop_assert_eq!(&got, &want);
            for w in got.windows(2) {
                prop_assert!(w[0].buffer != w[1].buffer || w[0].offset + w[0].len < w[1].offset);
            }
            Ok(())
        };
        check(l.block_regions(block, l0..g.num_layers, h0..h1).unwrap(),
              &|c| c.block == block && c.layer >= l0 && c.head >= h0 && c.head < h1)?;
        check(l.layer_regions(l0..l0 + 1).unwrap(), &|c| c.layer == l0)?;
    }

    /// TP slice: `s.offset(.., h, ..) == a.offset(.., heads.start + h, ..)` on the sliced
    /// domain, heads as documented (replicated when tp > H), same registered span.
    #[test]
    fn tp_slice_post_conditions(l in base_layout(), tp in prop::sample::select(vec![1u64, 2, 3, 4, 8])) {
        let h = l.geometry().num_kv_heads;
        for rank in 0..tp {
            match l.tp_slice(tp, rank) {
                Ok(s) => {
                    let heads = l.tp_heads(tp, rank).unwrap();
                    if tp <= h {
                        prop_assert_eq!(heads.clone(), rank * h / tp..(rank + 1) * h / tp);
                    } else {
                        prop_assert_eq!(heads.clone(), rank * h / tp..rank * h / tp + 1);
                    }
                    prop_assert_eq!(s.geometry().num_kv_heads, heads.end - heads.start);
                    prop_assert_eq!(s.extents(), l.extents());
                    for c in coords(&s, false) {
                        let parent = Coord { head: c.head + heads.start, ..c };
                        prop_assert_eq!(s.offset(&c).unwrap(), l.offset(&parent).unwrap());
                    }
                }
                Err(_) => {
                    let divisible = if tp <= h { h % tp == 0 } else { tp % h == 0 };
                    let conv = l.content().tp_shards_channels() && tp > 1;
                    prop_assert!(!divisible || conv, "tp {tp} refused on {l}");
                }
            }
        }
    }

    /// Kernel-block split: new block `b*r + j`, slot `n` is old block `b`, slot `j*S/r + n`;
    /// refused exactly when some field's block stride is not `slots * slot stride`.
    #[test]
    fn split_blocks_post_conditions(l in base_layout(), r in prop::sample::select(vec![1u64, 2, 4])) {
        let slots = l.num_slots();
        let dense = l.stored_fields().iter().all(|m| m.strides.block == slots * m.strides.slot);
        let allowed = r == 1 || (dense && slots % r == 0 && !l.content().is_per_block_state());
        match l.split_blocks(r) {
            Ok(s) => {
                prop_assert!(allowed);
                prop_assert_eq!(s.geometry().num_blocks, l.geometry().num_blocks * r);
                prop_assert_eq!(s.num_slots(), slots / r);
                for c in coords(&s, false) {
                    let parent = Coord { block: c.block / r, slot: (c.block % r) * (slots / r) + c.slot, ..c };
                    prop_assert_eq!(s.offset(&c).unwrap(), l.offset(&parent).unwrap());
                }
            }
            Err(e) => {
                prop_assert!(!allowed, "split {r} refused on {l}: {e}");
                let typed = matches!(e, LayoutError::TransformRefused { .. });
                prop_assert!(typed);
            }
        }
    }

    /// Layer range: `s.offset(l, ..) == a.offset(start + l, ..)`, same registered span.
    #[test]
    fn layer_range_post_conditions(l in any_layout(), a in 0u64..3, b in 1u64..4) {
        let n = l.geometry().num_layers;
        let (start, end) = (a % n, (a % n + b).min(n));
        let s = l.layer_range(start..end).unwrap();
        prop_assert_eq!(s.geometry().num_layers, end - start);
        prop_assert_eq!(s.extents(), l.extents());
        for c in coords(&s, false) {
            prop_assert_eq!(s.offset(&c).unwrap(), l.offset(&Coord { layer: c.layer + start, ..c }).unwrap());
        }
        prop_assert!(l.layer_range(start..start).is_err());
        prop_assert!(l.layer_range(0..n + 1).is_err());
    }

    /// Slot range: `s.offset(.., slot, ..) == a.offset(.., start + slot, ..)`, blocks of
    /// `end - start` tokens, same registered span; refused for an empty or too long range and
    /// where slots are not tokens.
    #[test]
    fn slot_range_post_conditions(l in any_layout(), a in 0u64..64, b in 1u64..64) {
        let g = *l.geometry();
        match l.slot_range(a % g.block_size..(a % g.block_size + b).min(g.block_size)) {
            Ok(s) => {
                let start = a % g.block_size;
                prop_assert!(g.tokens_per_state == 1 && !l.content().is_per_block_state());
                prop_assert_eq!(s.geometry().block_size, (start + b).min(g.block_size) - start);
                prop_assert_eq!(s.extents(), l.extents());
                for c in coords(&s, false) {
                    prop_assert_eq!(s.offset(&c).unwrap(), l.offset(&Coord { slot: c.slot + start, ..c }).unwrap());
                }
            }
            Err(e) => {
                let tokens = g.tokens_per_state == 1 && !l.content().is_per_block_state();
                prop_assert!(!tokens, "slot range refused on {l}: {e}");
            }
        }
        prop_assert!(l.slot_range(0..0).is_err());
        prop_assert!(l.slot_range(0..g.block_size + 1).is_err());
    }

    /// A layout agrees with its identity transforms, and `same_addressing` agrees with
    /// element-by-element comparison.
    #[test]
    fn same_addressing_is_elementwise_equality(a in any_layout(), b in any_layout()) {
        prop_assert!(a.same_addressing(&a.tp_slice(1, 0).unwrap()).is_ok());
        prop_assert!(a.same_addressing(&a.layer_range(0..a.geometry().num_layers).unwrap()).is_ok());
        let comparable = a.geometry() == b.geometry() && a.content() == b.content()
            && a.dtype() == b.dtype() && a.scales() == b.scales();
        if comparable {
            let elementwise = coords(&a, true).iter().all(|c| a.offset(c).unwrap() == b.offset(c).unwrap());
            prop_assert_eq!(a.same_addressing(&b).is_ok(), elementwise);
        } else {
            prop_assert!(a.same_addressing(&b).is_err());
        }
    }
}

proptest! {
    #![proptest_config(config(3000))]

    /// Every map an MLA layout answers, derived K and V included, holds the invariants of a
    /// stored field: K's and V's element d is the latent's element d (computed from the stored
    /// latent's strides), inside the registered span, the same through `offset`, the kernel
    /// arguments and every view that exists. A spec that cannot hold them is a typed refusal.
    #[test]
    fn mla_derived_fields_address_the_latent(spec in arbitrary_mla()) {
        let Ok(l) = KvCacheLayout::new(spec) else { return Ok(()) };
        for field in [Field::K, Field::V] {
            prop_assert_eq!(l.field_map(field).unwrap().field, field);
        }
        let spans = l.registered_spans();
        for c in coords(&l, false) {
            let at = l.offset(&c).unwrap();
            let latent = Coord { field: Field::Latent, ..c };
            prop_assert_eq!(at, l.offset(&latent).unwrap(), "{:?} in {}", c, l);
            prop_assert_eq!((at.buffer, at.offset), reference_offset(&l, &c));
            let span = spans[at.buffer as usize];
            prop_assert!(at.offset >= span.offset && at.offset + 2 <= span.offset + span.len,
                "{:?} at {} outside {:?} in {}", c, at.offset, span, l);
            let a = l.kernel_args(c.field).unwrap();
            let off = a.offset(c.layer as i64, c.block as i64, c.head as i64, c.slot as i64, c.dim as i64).unwrap();
            prop_assert_eq!(off as u64, at.offset, "kernel_args {:?} in {}", c, l);
        }
        for field in [Field::K, Field::V] {
            for conv in CONVENTIONS {
                let Ok(v) = l.view(conv, ViewTarget::Field(field), 0) else { continue };
                let x = v.dtype.vllm_x();
                let mut bad = None;
                for_each_index(&v.shape, |idx| {
                    let c = coord_of(conv, ViewTarget::Field(field), 0, x, idx);
                    let (buffer, want) = reference_offset(&l, &c);
                    let got = v.byte_offset(idx).unwrap();
                    if (buffer, want) != (v.buffer, got) && bad.is_none() {
                        bad = Some((idx.to_vec(), want, got));
                    }
                });
                prop_assert!(bad.is_none(), "{} {} of {}: {:?}", conv, field, l, bad);
            }
        }
    }
}

proptest! {
    #![proptest_config(config(4000))]

    /// The aliasing test is exact: a strided spec is accepted iff no two elements share a byte
    /// (checked by brute force), and refused with `Aliasing` otherwise.
    #[test]
    fn aliasing_check_is_exact(spec in arbitrary_strided()) {
        let result = KvCacheLayout::new(spec.clone());
        let brute = brute_force_overlap(&spec);
        match result {
            Ok(_) => prop_assert!(!brute, "accepted an aliasing layout: {spec}"),
            Err(LayoutError::Aliasing { .. }) => prop_assert!(brute, "refused a valid layout: {spec}"),
            Err(e) => prop_assert!(false, "unexpected error {e} for {spec}"),
        }
    }
}
