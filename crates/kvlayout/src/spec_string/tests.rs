//! Tests of the compact spec string: preset overrides, strided keys, extents, columns.

use super::parse_spec;
use crate::error::LayoutError;
use crate::layout::KvCacheLayout;
use crate::spec::{BufferExtent, EngineTensor, Placement};

#[test]
fn preset_placement_can_be_replaced() {
    let l: KvCacheLayout = "llama-3-8b B=4 legacy=vllm-paged-v1".parse().unwrap();
    assert!(matches!(
        l.placement(),
        Placement::EngineTensor {
            layout: EngineTensor::VllmPagedV1,
            ..
        }
    ));
    assert_eq!(l.geometry().num_layers, 32);
    let l: KvCacheLayout = "llama-3-8b B=4 order=HND page=70000".parse().unwrap();
    assert!(matches!(l.placement(), Placement::Paged(p) if p.page_size_padded == Some(70000)));
    // A bad override names its own column; the preset's keys name the preset.
    match "llama-3-8b B=x".parse::<KvCacheLayout>() {
        Err(LayoutError::Spec { column, .. }) => assert_eq!(column, 12),
        other => panic!("{other:?}"),
    }
}

/// Padding or alignment with L or B inside H or N is refused with the order named, the
/// innermost position included (it once indexed past the axes there).
#[test]
fn padding_needs_h_and_n_inside_l_and_b() {
    for (spec, says) in [
        (
            "mla L=1 B=1 N=1 H=1 rank=4 rope=2 dtype=f32 order=BHNLC align=2",
            "L innermost",
        ),
        (
            "kv L=2 B=3 N=16 H=4 D=8 dtype=f16 order=LHNBC page=4096",
            "B innermost",
        ),
        (
            "kv L=2 B=3 N=16 H=4 D=8 dtype=f16 order=LHBNC align=64",
            "N inside B",
        ),
    ] {
        match spec.parse::<KvCacheLayout>() {
            Err(LayoutError::Invalid(m)) => assert!(m.contains(says), "{spec}: {m}"),
            other => panic!("{spec}: {other:?}"),
        }
    }
    // H and N inside both: accepted.
    let spec = "kv L=2 B=3 N=16 H=4 D=8 dtype=f16 order=BLHNC align=64";
    assert!(spec.parse::<KvCacheLayout>().is_ok(), "{spec}");
}

/// Two K/V fields in buffer 0 (K at 0, V at 192) of a 384-byte buffer.
const STRIDED: &str = "kv L=1 B=3 N=4 H=1 D=8 dtype=f16 @k=0:0:0:64:64:16:8:16:2 \
                       @v=0:192:0:64:16:16:8:16:2";

/// The column and reason of a spec error.
fn spec_error(spec: &str) -> (usize, String, String) {
    match spec.parse::<KvCacheLayout>() {
        Err(LayoutError::Spec {
            column,
            token,
            reason,
        }) => (column, token, reason),
        other => panic!("{spec}: expected a spec error, got {other:?}"),
    }
}

/// Column of the last occurrence of `token`, in a spec that is ASCII before it.
fn column_of(spec: &str, token: &str) -> usize {
    spec.rfind(token).expect("token in spec") + 1
}

/// A buffer index has one spelling: `@buf00`, `@buf+0`, `@buf01` are not buffers 0 and 1,
/// so `@buf0=0..32 @buf00=0..1000000` cannot silently replace the first extent.
#[test]
fn buffer_indices_are_canonical_decimal() {
    let ok: KvCacheLayout = format!("{STRIDED} @buf0=0..384").parse().unwrap();
    assert_eq!(ok.extents(), [BufferExtent { start: 0, end: 384 }]);
    for key in [
        "@buf00", "@buf+0", "@buf-0", "@buf01", "@buf", "@buf0x1", "@buf١",
    ] {
        let spec = format!("{STRIDED} @buf0=0..384 {key}=0..1000000");
        let (column, token, reason) = spec_error(&spec);
        assert_eq!(column, column_of(&spec, key), "{spec}");
        assert_eq!(token, format!("{key}=0..1000000"));
        assert!(reason.contains("without sign or leading zeros"), "{reason}");
    }
    for buf in ["00", "+0", "01"] {
        let spec = format!("{STRIDED} @buf0=0..384").replace("@v=0:", &format!("@v={buf}:"));
        let (column, _, reason) = spec_error(&spec);
        assert_eq!(column, column_of(&spec, "@v="), "{spec}");
        assert_eq!(
            reason,
            format!(
                "buffer index '{buf}' is not a decimal index up to 4294967295 without sign \
                 or leading zeros"
            )
        );
    }
    // A field named twice in two spellings is refused at the second, naming the first.
    let spec = format!("{STRIDED} @buf0=0..384 @K=0:0:0:64:64:16:8:16:2");
    let (column, _, reason) = spec_error(&spec);
    assert_eq!(column, column_of(&spec, "@K="));
    assert_eq!(
        reason,
        format!(
            "field k given twice (first as @k at column {})",
            column_of(&spec, "@k=")
        )
    );
}

/// A field whose buffer has no extent names the missing `@bufN=` key.
#[test]
fn missing_buffer_extent_names_the_key() {
    let (column, _, reason) = spec_error(STRIDED);
    assert_eq!(column, column_of(STRIDED, "@k="));
    assert_eq!(
        reason,
        "no @buf0= extent was given (field k is in buffer 0)"
    );
    let spec = format!("{STRIDED} @buf0=0..384").replace("@v=0:192", "@v=1:0");
    let (column, _, reason) = spec_error(&spec);
    assert_eq!(column, column_of(&spec, "@v="));
    assert_eq!(
        reason,
        "no @buf1= extent was given (field v is in buffer 1)"
    );
}

/// Every extent is refused past `MAX_OFFSET`, used by a field or not, and a number above
/// u64 is named as out of range rather than as not an integer.
#[test]
fn every_buffer_extent_is_range_checked() {
    let limit = crate::MAX_OFFSET;
    for (extents, says) in [
        (
            "@buf0=0..384 @buf1=0..18446744073709551615",
            "buffer extent end 18446744073709551615 is out of range (limit 9223372036854775807)",
        ),
        (
            "@buf0=0..9223372036854775808",
            "buffer extent end 9223372036854775808 is out of range (limit 9223372036854775807)",
        ),
        (
            "@buf0=0..384 @buf1=0..18446744073709551616",
            "buffer extent end 18446744073709551616 is out of range (limit 9223372036854775807)",
        ),
        (
            "@buf0=99999999999999999999999..384",
            "buffer extent start 99999999999999999999999 is out of range (limit \
             9223372036854775807)",
        ),
        ("@buf0=0..x", "buffer extent is start..end (integers)"),
    ] {
        let spec = format!("{STRIDED} {extents}");
        assert_eq!(spec_error(&spec).2, says, "{spec}");
    }
    // The same limit for a spec built without the parser, the extent used or not.
    let mut spec = parse_spec(&format!("{STRIDED} @buf0=0..384 @buf1=0..8")).unwrap();
    assert!(KvCacheLayout::new(spec.clone()).is_ok());
    for (i, buffer) in [(1, "buffer 1 extent"), (0, "buffer 0 extent")] {
        let Placement::Strided { extents, .. } = &mut spec.placement else {
            unreachable!("strided spec");
        };
        extents[i].end = limit + 1;
        assert_eq!(
            KvCacheLayout::new(spec.clone()),
            Err(LayoutError::Overflow {
                what: buffer.into(),
                limit
            })
        );
    }
}

/// A paged alignment is a power of two (one-byte elements once took `align=3`).
#[test]
fn alignment_is_a_power_of_two() {
    let base = "kv L=2 B=3 N=16 H=4 D=8 dtype=fp8_e4m3 order=NHD";
    for align in [3u64, 6, 12, 48, (1 << 62) + 1] {
        assert_eq!(
            format!("{base} align={align}").parse::<KvCacheLayout>(),
            Err(LayoutError::NotPowerOfTwo {
                what: "alignment",
                value: align
            })
        );
    }
    for align in [1u64, 2, 64, 4096] {
        let l: KvCacheLayout = format!("{base} align={align}").parse().unwrap();
        let Placement::Paged(p) = l.placement() else {
            unreachable!("paged spec");
        };
        assert_eq!(p.alignment, align);
    }
}

/// Tokenizing is linear: 200 000 tokens of 98 characters (38 MB) are read once, where
/// recounting each token's column from the start would count 2 * 10^12 characters. The
/// duplicate at the end is reported at its character column (not its byte index).
#[test]
fn long_specs_are_tokenized_in_linear_time() {
    let n = 200_000;
    let pad = "é".repeat(90);
    let mut spec = String::from("kv");
    for i in 0..n {
        spec.push_str(&format!(" p{i:06}={pad}"));
    }
    spec.push_str(" p000000=1");
    let (column, token, reason) = spec_error(&spec);
    // "kv", then n times a space and 98 characters, then a space.
    assert_eq!(column, 2 + n * (1 + 98) + 2);
    assert_eq!(token, "p000000=1");
    assert_eq!(reason, "p000000 given twice (first at column 4)");
}

/// `tensor=` is the key, `legacy=` its alias: both parse to equal layouts, and the canonical
/// form prints `tensor=` and permutation names. `flash-attn` and `flashinfer` name the NHD
/// layouts, FlashAttention's and FlashInfer's defaults.
#[test]
fn tensor_key_with_legacy_alias_and_convention_names() {
    let new: KvCacheLayout = "kv L=1 B=8 N=16 H=4 D=8 Dv=8 dtype=bf16 tensor=flashinfer-hnd"
        .parse()
        .unwrap();
    let old: KvCacheLayout = "kv L=1 B=8 N=16 H=4 D=8 dtype=bf16 legacy=flashinfer-hnd"
        .parse()
        .unwrap();
    assert_eq!(new, old);
    assert_eq!(
        new.to_string(),
        "kv L=1 B=8 N=16 H=4 D=8 Dv=8 dtype=bf16 tensor=flashinfer-hnd"
    );
    for (short, long) in [
        ("flash-attn", "flash-attn-nhd"),
        ("flashinfer", "flashinfer-nhd"),
    ] {
        for key in ["tensor", "legacy"] {
            let a: KvCacheLayout = format!("kv B=3 N=16 H=4 D=8 dtype=f16 {key}={short}")
                .parse()
                .unwrap();
            assert_eq!(
                a.to_string(),
                format!("kv L=1 B=3 N=16 H=4 D=8 Dv=8 dtype=f16 tensor={long}")
            );
        }
    }
    let nhd: KvCacheLayout = "kv B=3 N=16 H=4 D=8 dtype=f16 order=NHD".parse().unwrap();
    assert_eq!(
        nhd.to_string(),
        "kv L=1 B=3 N=16 H=4 D=8 Dv=8 dtype=f16 order=LBNHC"
    );
    let hnd: KvCacheLayout = "kv B=3 N=16 H=4 D=8 dtype=f16 order=HND".parse().unwrap();
    assert_eq!(
        hnd.to_string(),
        "kv L=1 B=3 N=16 H=4 D=8 Dv=8 dtype=f16 order=LBHNC"
    );
    // A preset's order= is replaced by a user's tensor= or legacy=.
    let p: KvCacheLayout = "llama-3-8b B=4 tensor=flash-attn".parse().unwrap();
    assert!(p.to_string().ends_with("tensor=flash-attn-nhd"), "{p}");
    // tensor= and legacy= are one key: both given is a key given twice.
    let spec = "kv B=3 N=16 H=4 D=8 dtype=f16 tensor=flashinfer legacy=flashinfer";
    assert_eq!(
        spec_error(spec).2,
        "tensor= (or its alias legacy=) given twice (first at column 31)"
    );
    // In JSON: kind "tensor", with "legacy" read as its alias.
    let json = serde_json::to_string(new.spec()).unwrap();
    assert!(json.contains(r#""kind":"tensor""#), "{json}");
    let old_json = json.replace(r#""kind":"tensor""#, r#""kind":"legacy""#);
    let back: crate::LayoutSpec = serde_json::from_str(&old_json).unwrap();
    assert_eq!(&back, new.spec());
    let short_json = json.replace("flashinfer-hnd", "flash-attn");
    let back: crate::LayoutSpec = serde_json::from_str(&short_json).unwrap();
    assert!(matches!(
        back.placement,
        Placement::EngineTensor {
            layout: EngineTensor::FlashAttnNhd,
            ..
        }
    ));
}

/// A bad `dtype=`, `order=` or `tensor=` value lists the accepted values.
#[test]
fn bad_choices_list_the_accepted_values() {
    let base = "kv B=3 N=16 H=4 D=8";
    let (column, token, reason) = spec_error(&format!("{base} dtype=fp16 order=LBNHC"));
    assert_eq!((column, token.as_str()), (21, "dtype=fp16"));
    assert_eq!(
        reason,
        "unknown dtype= value 'fp16'; accepted: f32, f16, bf16, fp8_e4m3, fp8_e5m2, int8, u8"
    );
    let (_, _, reason) = spec_error(&format!("{base} dtype=f16 order=BHD"));
    assert!(
        reason.starts_with("unknown order= value 'BHD'; accepted: LBHNC, LBNHC, BLHNC,"),
        "{reason}"
    );
    assert!(reason.ends_with("NHBLC, NHD, HND"), "{reason}");
    let (_, _, reason) = spec_error(&format!("{base} dtype=f16 tensor=flash-infer"));
    assert_eq!(
        reason,
        "unknown tensor= value 'flash-infer'; accepted: vllm-paged-v1, flash-attn-nhd, \
         flash-attn-hnd, flashinfer-nhd, flashinfer-hnd, separate-nhd, separate-hnd, \
         flash-attn, flashinfer"
    );
    let (_, _, reason) = spec_error(&format!("{base} dtype=f16 legacy=vllm"));
    assert!(
        reason.starts_with("unknown legacy= value 'vllm'; accepted: vllm-paged-v1,"),
        "{reason}"
    );
    // Every accepted name parses.
    for name in crate::EngineTensor::NAMES {
        assert!(format!("{base} dtype=f16 tensor={name}")
            .parse::<KvCacheLayout>()
            .is_ok());
    }
    for name in crate::AxisOrder::NAMES {
        assert!(format!("{base} dtype=f16 order={name}")
            .parse::<KvCacheLayout>()
            .is_ok());
    }
    // And every variant is listed, under the name it prints as.
    use strum::IntoEnumIterator;
    for kind in crate::EngineTensor::iter() {
        assert!(
            crate::EngineTensor::NAMES.contains(&kind.to_string().as_str()),
            "{kind}"
        );
    }
    for order in crate::AxisOrder::iter() {
        assert!(
            crate::AxisOrder::NAMES.contains(&order.to_string().as_str()),
            "{order}"
        );
    }
}

/// Two placements are refused at the second, naming both.
#[test]
fn two_placements_are_refused() {
    let base = "kv L=1 B=3 N=4 H=1 D=8 dtype=f16";
    for (keys, says, second) in [
        (
            "order=LBNHC tensor=flashinfer-hnd",
            "two placements: order=.. and tensor=..; give one",
            "tensor=",
        ),
        (
            "legacy=flashinfer-hnd order=HND",
            "two placements: legacy=.. and order=..; give one",
            "order=",
        ),
        (
            "@k=0:0:0:64:64:16:8:16:2 @v=0:192:0:64:16:16:8:16:2 @buf0=0..384 order=LBNHC",
            "two placements: @field=.. strides and order=..; give one",
            "order=",
        ),
        (
            "tensor=separate-nhd @k=0:0:0:64:64:16:8:16:2 @v=0:192:0:64:16:16:8:16:2 \
             @buf0=0..384",
            "two placements: tensor=.. and @field=.. strides; give one",
            "@k=",
        ),
    ] {
        let spec = format!("{base} {keys}");
        let (column, _, reason) = spec_error(&spec);
        assert_eq!(reason, says, "{spec}");
        assert_eq!(column, column_of(&spec, second), "{spec}");
    }
}
