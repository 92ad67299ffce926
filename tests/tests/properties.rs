//! Properties of the descriptor over random valid layouts of every kind (see
//! `kvlayout_conformance::gen`), each checked against an independent enumeration; and edited
//! spec strings, which parse to such a layout or fail with a typed error.

use std::collections::{BTreeSet, HashMap};

use kvlayout::{
    merge_ranges, ByteRange, Convention, Coord, Field, KvCacheLayout, LayoutError, TensorClaim,
    ViewTarget,
};
use kvlayout_conformance::domain::{
    coord_of, coords, for_each_index, reference_offset, CONVENTIONS,
};
use kvlayout_conformance::gen::{any_layout, base_layout};
use kvlayout_conformance::inputs::edited_spec;
use proptest::prelude::*;

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
        let mut targets: Vec<ViewTarget> = l.readable_fields().into_iter().map(ViewTarget::Field).collect();
        targets.push(ViewTarget::Kv);
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
                let claim = TensorClaim { convention: c, target: t, layer, shape: &v.shape, strides: &v.strides, dtype: v.dtype, storage_offset: Some(v.offset) };
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
                    let conv = matches!(l.content(), kvlayout::Content::MambaConv { .. }) && tp > 1;
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

/// Every data byte of the pictured page belongs to exactly one run.
#[test]
fn explain_page_runs_partition_the_page() {
    for name in [
        "llama-3-8b B=4",
        "deepseek-v3 B=2",
        "kv B=3 N=16 H=4 D=8 dtype=f16 legacy=vllm-paged-v1",
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

/// The spec-string parser names the column of the bad token.
#[test]
fn spec_errors_name_the_column() {
    let cases: HashMap<&str, usize> = [
        ("kv L=1 B=3 N=16 H=4 D=8 dtype=f17 order=NHD", 25),
        ("kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=XYZ", 35),
        ("kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=NHD bogus=1", 45),
        ("kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=NHD B=4", 45),
        ("kvv L=1", 1),
        ("llama-3-8b  B=x", 13),
    ]
    .into_iter()
    .collect();
    for (spec, column) in cases {
        match spec.parse::<KvCacheLayout>() {
            Err(LayoutError::Spec { column: c, .. }) => assert_eq!(c, column, "{spec}"),
            other => panic!("{spec}: expected a spec error, got {other:?}"),
        }
    }
}

/// A field or convention name that does not exist is an unknown name (not a field "this
/// layout" lacks, nor an invalid layout), with the known names listed.
#[test]
fn unknown_names_are_named_as_such() {
    let err = "q".parse::<ViewTarget>().unwrap_err();
    assert!(
        matches!(err, LayoutError::UnknownName { what: "field", .. }),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "unknown field 'q'; known: k, v, k_scale, v_scale, latent, bytes, conv, ssm, kv"
    );
    let err = Convention::from_name("flash").unwrap_err();
    assert!(
        matches!(
            err,
            LayoutError::UnknownName {
                what: "convention",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("flashinfer-hnd"), "{err}");
    let l: KvCacheLayout = "llama-3-8b B=4".parse().unwrap();
    let err = l
        .view(Convention::Standard, "latent".parse().unwrap(), 0)
        .unwrap_err();
    assert!(matches!(err, LayoutError::NoSuchField { .. }), "{err}");
}

/// Arbitrary explicit strides (aliasing or not) for a small K|V layout.
fn arbitrary_strided() -> impl Strategy<Value = kvlayout::LayoutSpec> {
    use kvlayout::{
        BufferExtent, Content, DType, FieldStrides, Geometry, LayoutSpec, Placement, StridedField,
        TensorScales,
    };
    let strides = || {
        (
            0u64..24,
            prop::collection::vec(
                prop::sample::select(vec![0u64, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48]),
                6,
            ),
            any::<bool>(),
        )
    };
    (
        (1u64..=2, 1u64..=3, 1u64..=3, 1u64..=3),
        (1u64..=2, 1u64..=2),
        strides(),
        strides(),
        any::<bool>(),
    )
        .prop_map(|((l, b, n, h), (dk, dv), ks, vs, separate)| {
            let dtype = DType::F16;
            let field =
                |f, (base, s, split): (u64, Vec<u64>, bool), width: u64, buffer| StridedField {
                    field: f,
                    strides: FieldStrides {
                        buffer,
                        base_offset: base * 2,
                        layer: s[0] * 2,
                        block: s[1] * 2,
                        head: s[2] * 2,
                        slot: s[3] * 2,
                        dim_split: if split && width.is_multiple_of(2) {
                            2
                        } else {
                            width
                        },
                        dim_chunk: s[4] * 2,
                        dim: s[5] * 2,
                    },
                };
            LayoutSpec {
                geometry: Geometry {
                    num_layers: l,
                    num_blocks: b,
                    block_size: n,
                    num_kv_heads: h,
                    tokens_per_state: 1,
                },
                content: Content::Kv {
                    head_size: 2 * dk,
                    head_size_v: 2 * dv,
                },
                dtype,
                scales: TensorScales::default(),
                placement: Placement::Strided {
                    fields: vec![
                        field(Field::K, ks, 2 * dk, 0),
                        field(Field::V, vs, 2 * dv, u32::from(separate)),
                    ],
                    extents: vec![
                        BufferExtent {
                            start: 0,
                            end: 1 << 20
                        };
                        2
                    ],
                },
            }
        })
}

/// Arbitrary explicit strides for a small MLA latent: split into chunks of any divisor of its
/// width (or not), chunks and elements anywhere, extents that may be too short.
fn arbitrary_mla() -> impl Strategy<Value = kvlayout::LayoutSpec> {
    use kvlayout::{
        BufferExtent, Content, DType, FieldStrides, Geometry, LayoutSpec, Placement, StridedField,
        TensorScales,
    };
    let stride = || prop::sample::select(vec![0u64, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]);
    (
        (1u64..=2, 1u64..=2, 1u64..=3),
        (
            prop::sample::select(vec![2u64, 4, 6, 8, 16]),
            prop::sample::select(vec![2u64, 4, 8]),
        ),
        (0u64..8, prop::collection::vec(stride(), 6), 1u64..=16),
        (
            prop::sample::select(vec![16u64, 64, 256, 1024, 4096]),
            any::<bool>(),
        ),
    )
        .prop_map(
            |((l, b, n), (rank, rope), (base, s, split), (end, scaled))| {
                let width = rank + rope;
                // Any divisor of the width (validation refuses one that splits V mid-chunk).
                let dim_split = (1..=split.min(width))
                    .rev()
                    .find(|d| width.is_multiple_of(*d))
                    .unwrap_or(width);
                LayoutSpec {
                    geometry: Geometry {
                        num_layers: l,
                        num_blocks: b,
                        block_size: n,
                        num_kv_heads: 1,
                        tokens_per_state: 1,
                    },
                    content: Content::Mla {
                        kv_lora_rank: rank,
                        rope_dim: rope,
                    },
                    dtype: DType::F16,
                    scales: if scaled {
                        TensorScales {
                            k_scale: 0.5,
                            v_scale: 2.0,
                        }
                    } else {
                        TensorScales::default()
                    },
                    placement: Placement::Strided {
                        fields: vec![StridedField {
                            field: Field::Latent,
                            strides: FieldStrides {
                                buffer: 0,
                                base_offset: base * 2,
                                layer: s[0] * 2,
                                block: s[1] * 2,
                                head: s[2] * 2,
                                slot: s[3] * 2,
                                dim_split,
                                dim_chunk: s[4] * 2,
                                dim: s[5] * 2,
                            },
                        }],
                        extents: vec![BufferExtent { start: 0, end }],
                    },
                }
            },
        )
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

/// Whether any two elements of a strided K|V spec share a byte, by enumeration.
fn brute_force_overlap(spec: &kvlayout::LayoutSpec) -> bool {
    let kvlayout::Placement::Strided { fields, .. } = &spec.placement else {
        unreachable!()
    };
    let kvlayout::Content::Kv {
        head_size,
        head_size_v,
    } = spec.content
    else {
        unreachable!()
    };
    let g = spec.geometry;
    let e = spec.dtype.size_bytes();
    let mut owner = HashMap::new();
    let mut id = 0u64;
    for f in fields {
        let s = f.strides;
        let width = if f.field == Field::K {
            head_size
        } else {
            head_size_v
        };
        for l in 0..g.num_layers {
            for b in 0..g.num_blocks {
                for h in 0..g.num_kv_heads {
                    for n in 0..g.block_size {
                        for d in 0..width {
                            id += 1;
                            let off = s.base_offset
                                + l * s.layer
                                + b * s.block
                                + h * s.head
                                + n * s.slot
                                + (d / s.dim_split) * s.dim_chunk
                                + (d % s.dim_split) * s.dim;
                            for byte in off..off + e {
                                if owner.insert((s.buffer, byte), id).is_some() {
                                    return true;
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    false
}

/// Every edited spec string either gets a typed error or parses to a layout whose canonical
/// form and JSON round-trip and whose derived views, arguments, regions and transformations
/// answer (a value or an error) without panicking. Both outcomes must come up.
#[test]
fn edited_spec_strings_parse_or_fail_cleanly() {
    use proptest::test_runner::{Config, TestRunner};
    let (parsed, refused) = (std::cell::Cell::new(0u32), std::cell::Cell::new(0u32));
    let mut runner = TestRunner::new(Config {
        failure_persistence: None,
        ..config(2000)
    });
    runner
        .run(&edited_spec(), |s| {
            let outcome = std::panic::catch_unwind(|| match s.parse::<KvCacheLayout>() {
                Ok(l) => {
                    exercise_derivations(&l);
                    true
                }
                Err(_) => false,
            });
            match outcome {
                Ok(true) => parsed.set(parsed.get() + 1),
                Ok(false) => refused.set(refused.get() + 1),
                Err(_) => return Err(TestCaseError::fail(format!("panic on {s:?}"))),
            }
            Ok(())
        })
        .unwrap();
    let (parsed, refused) = (parsed.get(), refused.get());
    assert!(
        parsed > 100 && refused > 100,
        "parsed {parsed}, refused {refused}"
    );
}

/// Calls every derivation of a layout with ordinary and extreme arguments; panics only on a
/// broken round trip.
fn exercise_derivations(l: &KvCacheLayout) {
    let text = l.to_string();
    let back: KvCacheLayout = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
    assert!(back.same_addressing(l).is_ok(), "{text}");
    let json = serde_json::to_string(l).unwrap();
    assert!(
        KvCacheLayout::from_json(&json)
            .unwrap()
            .same_addressing(l)
            .is_ok(),
        "{text}"
    );
    let _ = l.explain().to_text();
    let _ = l.registered_spans();
    let fields = l.readable_fields();
    for &field in &fields {
        let _ = l.kernel_args(field);
        for c in [
            [0, 0, 0, 0, 0],
            [u64::MAX, 0, 0, 0, 0],
            [0, u64::MAX, 0, 0, 0],
            [0, 0, 0, 0, u64::MAX],
        ] {
            let coord = Coord {
                layer: c[0],
                block: c[1],
                head: c[2],
                slot: c[3],
                field,
                dim: c[4],
            };
            let _ = l.offset(&coord);
        }
    }
    for tp in [0, 1, 2, 3, 8, u64::MAX] {
        for rank in [0, 1, u64::MAX] {
            let _ = l.tp_slice(tp, rank);
        }
    }
    for ratio in [0, 1, 2, 3, 16, u64::MAX] {
        let _ = l.split_blocks(ratio);
    }
    for (a, b) in [(0, 1), (0, u64::MAX), (u64::MAX, 0), (3, 2)] {
        let _ = l.layer_range(a..b);
        let _ = l.layer_regions(a..b);
        let _ = l.block_regions(a, 0..1, a..b);
    }
    let targets = [
        ViewTarget::Kv,
        ViewTarget::Field(Field::K),
        ViewTarget::Field(Field::V),
    ];
    for name in kvlayout::CONVENTION_NAMES {
        let c = Convention::from_name(name).unwrap();
        for t in targets {
            for layer in [0, u64::MAX] {
                let _ = l.view(c, t, layer);
            }
        }
    }
}

/// A region query is counted before it is enumerated: billions of separate rows are refused
/// with the count and the limit; billions of rows that fold into one run are not.
#[test]
fn region_queries_are_counted_before_they_are_enumerated() {
    let rows: KvCacheLayout =
        "mamba-ssm L=2 B=2 N=8 H=2147483648 head_dim=8 state=16 dtype=fp8_e5m2 order=BHLNC"
            .parse()
            .unwrap();
    match rows.layer_regions(0..1) {
        Err(LayoutError::TooManyRegions { count, limit }) => {
            assert_eq!(limit, kvlayout::MAX_REGIONS);
            assert_eq!(
                count,
                (2u64 * (1 << 31)).to_string(),
                "one run per (block, head)"
            );
        }
        other => panic!("expected TooManyRegions, got {other:?}"),
    }
    let folded: KvCacheLayout = "kv L=2 B=2147483648 N=16 H=8 D=128 dtype=bf16 order=LBNHC"
        .parse()
        .unwrap();
    let r = folded.layer_regions(1..2).unwrap();
    assert!(matches!(
        folded.layer_regions(1..1),
        Err(LayoutError::InvalidQuery(_))
    ));
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].len, (1u64 << 31) * 16 * 8 * 256 * 2);
}

/// An aliasing refusal names the strides in words, not as a Rust struct dump.
#[test]
fn aliasing_errors_name_the_strides_readably() {
    let spec = "kv B=2 N=2 H=1 D=4 dtype=f16 @k=0:0:0:0:0:0:4:8:2 @v=0:64:0:16:0:4:4:8:2 \
                @buf0=0..128";
    let e = spec.parse::<KvCacheLayout>().unwrap_err();
    assert!(matches!(e, LayoutError::Aliasing { .. }), "{e}");
    let text = e.to_string();
    assert!(
        !text.contains("FieldStrides") && !text.contains('{'),
        "{text}"
    );
    assert!(
        text.contains("field k") && text.contains("block 0"),
        "{text}"
    );
}

/// The random layouts give each kind of case the suite leans on a real share (at least 10%
/// each of 3000 deterministic draws): legacy placements (vLLM's among them), scaled content
/// (inline or per-tensor scales) and explicit-strided placements.
#[test]
fn gen_shares() {
    use kvlayout::{Content, LegacyKind, Placement};
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = any_layout();
    let n = 3000;
    let (mut legacy, mut vllm, mut scaled, mut strided) = (0, 0, 0, 0);
    for _ in 0..n {
        let l = strategy.new_tree(&mut runner).unwrap().current();
        match l.placement() {
            Placement::Legacy { layout, .. } => {
                legacy += 1;
                vllm += usize::from(*layout == LegacyKind::VllmPagedV1);
            }
            Placement::Strided { .. } => strided += 1,
            _ => {}
        }
        let s = l.scales();
        if matches!(l.content(), Content::KvScaled { .. }) || s.k_scale != 1.0 || s.v_scale != 1.0 {
            scaled += 1;
        }
    }
    let share = |k: usize| k as f64 / n as f64;
    for (what, k) in [("legacy", legacy), ("scaled", scaled), ("strided", strided)] {
        assert!(share(k) >= 0.10, "{what}: {k} of {n}");
    }
    assert!(share(vllm) >= 0.02, "vllm-paged-v1: {vllm} of {n}");
}

/// Alignment is checked on every axis of extent above one and only there: an f16 head stride
/// of an odd number of bytes is refused with two heads and accepted with one (a size-1 axis's
/// stride addresses nothing).
#[test]
fn alignment_is_checked_on_axes_of_extent_above_one() {
    let spec = |h: u64, head: u64| {
        format!(
            "kv B=2 N=2 H={h} D=4 dtype=f16 @k=0:0:0:64:{head}:8:4:8:2 \
             @v=0:128:0:64:{head}:8:4:8:2 @buf0=0..256"
        )
    };
    let e = spec(2, 33).parse::<KvCacheLayout>().unwrap_err();
    assert!(
        matches!(
            e,
            LayoutError::Misaligned {
                value: 33,
                align: 2,
                ..
            }
        ),
        "{e}"
    );
    let l: KvCacheLayout = spec(1, 33).parse().unwrap();
    assert_eq!(l.field_map(Field::K).unwrap().strides.head, 33);
    // The same for a block stride that is misaligned: refused with two blocks.
    let e = "kv B=2 N=2 H=1 D=4 dtype=f16 @k=0:0:0:65:0:8:4:8:2 @v=0:32:0:65:0:8:4:8:2 \
             @buf0=0..256"
        .parse::<KvCacheLayout>()
        .unwrap_err();
    assert!(
        matches!(e, LayoutError::Misaligned { value: 65, .. }),
        "{e}"
    );
}

/// The block table check reads each sequence's own row: an id past the cache only in the
/// last sequence's row is refused, naming that sequence and position.
#[test]
fn block_table_check_reads_every_sequences_row() {
    use kvlayout::ops::{check_block_table, OpError};
    let l: KvCacheLayout = "kv B=4 N=16 H=1 D=8 dtype=f16 order=NHD".parse().unwrap();
    let table = [0, 0, 1, 1, 2, 9];
    match check_block_table(&l, &table, 2, &[16, 16, 32]) {
        Err(OpError::BlockOutOfRange {
            seq: 2,
            position: 1,
            block: 9,
            limit: 4,
        }) => {}
        other => panic!("{other:?}"),
    }
    assert!(check_block_table(&l, &table, 2, &[16, 16, 16]).is_ok());
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
            "kv L=3 B=2 N=4 H=2 D=8 dtype=f16 legacy=flash-attn-nhd",
            Convention::FlashAttn,
        ),
        (
            "kv L=3 B=2 N=4 H=2 D=8 dtype=f16 legacy=flashinfer-hnd",
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
