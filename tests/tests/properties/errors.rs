//! What a refusal says: the column of a bad spec token, an unknown name, a region count,
//! strides in words, the misaligned value, the sequence of a bad block id.

use std::collections::HashMap;

use kvlayout::{Convention, Field, KvCacheLayout, LayoutError, ViewTarget};

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
