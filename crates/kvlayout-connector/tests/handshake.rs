//! The handshake: round trips over presets, TP sizes and replication; every refusal from a
//! hand-made encoding (header, body, counts, layout, TP, regions, hash), each a typed error;
//! `check_compatible` accepting what the planner reconciles and naming what it cannot; and a
//! fuzz over mutated encodings that never panics and only accepts what re-encodes to itself.

use kvlayout::{KvCacheLayout, LayoutError};
use kvlayout_connector::handshake::{
    check_compatible, CacheGroup, HandshakeError, Limits, MemRegion, PeerMetadata, HEADER_BYTES,
    MAGIC, VERSION,
};
use proptest::prelude::*;
use serde_json::Value;

fn layout(spec: &str) -> KvCacheLayout {
    spec.parse().unwrap_or_else(|e| panic!("{spec}: {e}"))
}

/// Regions exactly the registered spans, 1 TiB apart.
fn regions_of(l: &KvCacheLayout) -> Vec<MemRegion> {
    (0u64..)
        .zip(l.extents())
        .map(|(i, x)| MemRegion::host((i + 1) << 40, x.end))
        .collect()
}

/// Rank `tp_rank` of `tp_size` of the full layout `spec` (all the model's heads).
fn rank_group(name: &str, spec: &str, tp_size: u64, tp_rank: u64) -> CacheGroup {
    let full = layout(spec);
    let l = full.tp_slice(tp_size, tp_rank).unwrap();
    CacheGroup {
        name: name.into(),
        regions: regions_of(&l),
        layout: l,
        total_kv_heads: full.geometry().num_kv_heads,
        tp_size,
        tp_rank,
    }
}

fn peer(groups: Vec<CacheGroup>) -> PeerMetadata {
    PeerMetadata {
        engine_id: "prefill-0".into(),
        groups,
    }
}

fn decode(bytes: &[u8]) -> Result<PeerMetadata, HandshakeError> {
    PeerMetadata::decode(bytes, &Limits::default())
}

/// A header for `body` (version 1, reserved 0, its own length).
fn frame(body: &[u8]) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend(VERSION.to_le_bytes());
    out.extend(0u16.to_le_bytes());
    out.extend((body.len() as u32).to_le_bytes());
    out.extend(body);
    out
}

/// The body of an encoding as JSON, to edit.
fn body_of(p: &PeerMetadata) -> Value {
    serde_json::from_slice(&p.encode()[HEADER_BYTES..]).unwrap()
}

/// Edits the body of `p`'s encoding and decodes it.
fn decode_edited(
    p: &PeerMetadata,
    edit: impl FnOnce(&mut Value),
) -> Result<PeerMetadata, HandshakeError> {
    let mut body = body_of(p);
    edit(&mut body);
    decode(&frame(&serde_json::to_vec(&body).unwrap()))
}

/// Edits group 0's layout document.
fn edit_layout(body: &mut Value, edit: impl FnOnce(&mut Value)) {
    let text = body["groups"][0]["layout"].as_str().unwrap();
    let mut doc: Value = serde_json::from_str(text).unwrap();
    edit(&mut doc);
    body["groups"][0]["layout"] = Value::String(doc.to_string());
}

fn llama() -> PeerMetadata {
    peer(vec![rank_group("attn", "llama-3-8b B=64", 1, 0)])
}

/// A two-buffer layout (separate K and V allocations).
const SEPARATE: &str = "kv L=2 B=3 N=4 H=4 D=16 dtype=f16 tensor=separate-hnd";

#[test]
fn round_trips_presets_tp_and_replication() {
    assert!(kvlayout::PRESET_NAMES.contains(&"deepseek-v3"));
    let specs = [
        "llama-3-8b B=64",
        "llama-3-8b B=64 dtype=fp8_e4m3 order=HND k_scale=0.5 v_scale=0.25",
        "kv B=3 N=16 H=4 D=8 dtype=f16 order=HND",
        "kv-scaled L=2 B=4 N=16 H=4 D=64 Dv=32 dtype=int8 order=NHD",
        "llama-3-8b B=8 order=HND page=81920",
        SEPARATE,
        "deepseek-v3 B=8",
        "mamba2-2.7b B=4",
        "kv B=4 N=16 H=2 D=8 dtype=f16 order=NHD",
    ];
    for spec in specs {
        let heads = layout(spec).geometry().num_kv_heads;
        for tp in [1u64, 2, 4] {
            // MLA (one head) and H = 2 at TP 4 replicate; every other case slices.
            for rank in 0..tp {
                let g = rank_group("attn", spec, tp, rank);
                let expected = layout(spec).tp_heads(tp, rank).unwrap();
                assert_eq!(
                    g.head_range(),
                    Some(expected.clone()),
                    "{spec} tp {tp}/{rank}"
                );
                assert_eq!(
                    g.layout.geometry().num_kv_heads,
                    expected.end - expected.start
                );
                if tp > heads {
                    assert_eq!(g.layout.geometry().num_kv_heads, 1);
                }
                let p = peer(vec![g]);
                p.validate(&Limits::default()).unwrap();
                let bytes = p.encode();
                assert_eq!(&bytes[..4], b"KVLH");
                assert_eq!(&bytes[4..8], &[1, 0, 0, 0]);
                let back = decode(&bytes).unwrap_or_else(|e| panic!("{spec} tp {tp}/{rank}: {e}"));
                assert_eq!(back, p);
                assert_eq!(back.encode(), bytes);
            }
        }
    }
    // Several groups, one of them two buffers, with regions larger than the spans.
    let mut p = peer(vec![
        rank_group("attn", "llama-3-8b B=64", 2, 1),
        rank_group("kv2", SEPARATE, 1, 0),
        rank_group("mla", "deepseek-v3 B=8", 8, 5),
    ]);
    p.groups[1].regions[1].len += 4096;
    assert_eq!(decode(&p.encode()).unwrap(), p);
}

#[test]
fn compat_text_is_the_documented_canonical_form() {
    let g = rank_group("attn", "llama-3-8b B=64", 2, 0);
    assert_eq!(
        g.compat_text(),
        "kvlayout-compat v1\ncontent=kv\nhead_size=128\nhead_size_v=128\ndtype=bf16\n\
         k_scale=3f800000\nv_scale=3f800000\nnum_layers=32\ntotal_kv_heads=8\ntokens_per_state=1\n"
    );
    let h = g.compat_hash();
    assert_eq!(h.len(), 64);
    assert!(h
        .bytes()
        .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
    let mla = rank_group("mla", "deepseek-v3 B=8", 1, 0);
    assert!(mla
        .compat_text()
        .contains("content=mla\nkv_lora_rank=512\nrope_dim=64\n"));
}

#[test]
fn check_compatible_accepts_what_the_planner_reconciles() {
    let local = rank_group("attn", "llama-3-8b B=64 N=16 order=NHD", 1, 0);
    for remote in [
        rank_group("attn", "llama-3-8b B=32 N=32 order=HND", 2, 1),
        rank_group("attn", "llama-3-8b B=7 N=64 order=BLHNC page=1048576", 4, 3),
        rank_group("other-name", "llama-3-8b B=64", 8, 0),
    ] {
        check_compatible(&local, &remote).unwrap();
        assert_eq!(local.compat_hash(), remote.compat_hash());
    }
}

#[test]
fn check_compatible_names_the_first_differing_field() {
    let local = rank_group("attn", "llama-3-8b B=64", 1, 0);
    let cases = [
        (
            "llama-3-8b B=64 dtype=fp8_e4m3",
            "dtype",
            "bf16",
            "fp8_e4m3",
        ),
        (
            "kv L=32 B=64 N=16 H=8 D=64 dtype=bf16 order=NHD",
            "head_size",
            "128",
            "64",
        ),
        (
            "kv L=32 B=64 N=16 H=8 D=128 Dv=64 dtype=bf16 order=NHD",
            "head_size_v",
            "128",
            "64",
        ),
        ("llama-3-8b B=64 L=16", "num_layers", "32", "16"),
        ("llama-3-8b B=64 H=4", "total_kv_heads", "8", "4"),
        (
            "mla L=32 B=64 N=16 rank=128 rope=0 dtype=bf16 order=NHD",
            "content",
            "kv",
            "mla",
        ),
        (
            "llama-3-8b B=64 k_scale=0.5",
            "k_scale",
            "1 (bits 3f800000)",
            "0.5 (bits 3f000000)",
        ),
    ];
    for (spec, field, a, b) in cases {
        let remote = rank_group("attn", spec, 1, 0);
        let err = check_compatible(&local, &remote).unwrap_err();
        assert_eq!(
            err,
            HandshakeError::Incompatible {
                field,
                local: a.into(),
                remote: b.into()
            },
            "{spec}"
        );
        assert_ne!(local.compat_hash(), remote.compat_hash(), "{spec}");
        assert!(
            err.to_string().contains(&format!("{field}: {a} vs {b}")),
            "{err}"
        );
    }
}

#[test]
fn header_refusals() {
    let good = llama().encode();
    // An unknown version is refused before anything after it is read.
    let mut v2 = good.clone();
    v2[4] = 2;
    assert_eq!(
        decode(&v2),
        Err(HandshakeError::UnsupportedVersion {
            got: 2,
            supported: 1
        })
    );
    assert_eq!(
        decode(b"KVLH\x07\x01"),
        Err(HandshakeError::UnsupportedVersion {
            got: 263,
            supported: 1
        })
    );
    for n in [0, 3, 5, 8, 11] {
        assert_eq!(
            decode(&good[..n]),
            Err(HandshakeError::TooShort { len: n, needed: 12 }),
            "{n} bytes"
        );
    }
    let mut magic = good.clone();
    magic[0] = b'X';
    assert!(matches!(decode(&magic), Err(HandshakeError::BadMagic { got, .. }) if got == *b"XVLH"));
    let mut reserved = good.clone();
    reserved[6] = 1;
    assert_eq!(
        decode(&reserved),
        Err(HandshakeError::ReservedNonZero { got: 1 })
    );

    let actual = (good.len() - HEADER_BYTES) as u64;
    let mut long = good.clone();
    long.push(b' ');
    assert_eq!(
        decode(&long),
        Err(HandshakeError::LengthMismatch {
            declared: actual,
            actual: actual + 1
        })
    );
    assert_eq!(
        decode(&good[..good.len() - 1]),
        Err(HandshakeError::LengthMismatch {
            declared: actual,
            actual: actual - 1
        })
    );
    // A declared length past the limit is refused before the body is looked at.
    let mut huge = good[..HEADER_BYTES].to_vec();
    huge[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(
        decode(&huge),
        Err(HandshakeError::BodyTooLarge {
            len: u32::MAX as u64,
            limit: 1 << 20
        })
    );
    let small = Limits {
        max_body_bytes: 100,
        ..Limits::default()
    };
    assert_eq!(
        PeerMetadata::decode(&good, &small),
        Err(HandshakeError::BodyTooLarge {
            len: actual,
            limit: 100
        })
    );
}

#[test]
fn body_json_refusals() {
    for body in [
        &b"{not json"[..],
        b"",
        b"[]",
        b"{\"engine_id\": 5, \"groups\": []}",
        b"\xff\xfe",
    ] {
        assert!(
            matches!(decode(&frame(body)), Err(HandshakeError::Json { .. })),
            "{body:?}"
        );
    }
    let err = decode_edited(&llama(), |b| b["groups"][0]["extra"] = Value::from(1)).unwrap_err();
    assert!(
        matches!(&err, HandshakeError::Json { message } if message.contains("extra")),
        "{err}"
    );
    let err = decode_edited(&llama(), |b| b["groups"][0]["tp_size"] = Value::from(-1)).unwrap_err();
    assert!(matches!(err, HandshakeError::Json { .. }), "{err}");
    // A number past u64.
    let text = String::from_utf8(body_of(&llama()).to_string().into_bytes()).unwrap();
    let edited = text.replace("\"tp_size\":1", "\"tp_size\":18446744073709551616");
    assert_ne!(edited, text);
    assert!(matches!(
        decode(&frame(edited.as_bytes())),
        Err(HandshakeError::Json { .. })
    ));
}

#[test]
fn count_and_name_refusals() {
    let g = rank_group("attn", "kv B=3 N=16 H=4 D=8 dtype=f16 order=HND", 1, 0);
    let many: Vec<CacheGroup> = (0..65)
        .map(|i| CacheGroup {
            name: format!("g{i}"),
            ..g.clone()
        })
        .collect();
    assert_eq!(
        decode(&peer(many.clone()).encode()),
        Err(HandshakeError::TooManyGroups {
            count: 65,
            limit: 64
        })
    );
    assert!(decode(&peer(many[..64].to_vec()).encode()).is_ok());
    let two = Limits {
        max_groups: 2,
        ..Limits::default()
    };
    assert_eq!(
        PeerMetadata::decode(&peer(many[..3].to_vec()).encode(), &two),
        Err(HandshakeError::TooManyGroups { count: 3, limit: 2 })
    );
    assert_eq!(
        decode(&peer(vec![]).encode()),
        Err(HandshakeError::NoGroups)
    );
    assert_eq!(
        decode(&peer(vec![g.clone(), g.clone()]).encode()),
        Err(HandshakeError::DuplicateGroup {
            name: "attn".into(),
            first: 0,
            second: 1
        })
    );
    let mut p = peer(vec![g.clone()]);
    p.engine_id = String::new();
    assert_eq!(
        decode(&p.encode()),
        Err(HandshakeError::EmptyName {
            what: "engine id".into()
        })
    );
    p.engine_id = "e".repeat(257);
    assert_eq!(
        decode(&p.encode()),
        Err(HandshakeError::NameTooLong {
            what: "engine id".into(),
            len: 257,
            limit: 256
        })
    );
    p.engine_id = "é".repeat(128); // 256 bytes
    p.groups[0].name = String::new();
    assert_eq!(
        decode(&p.encode()),
        Err(HandshakeError::EmptyName {
            what: "group 0 name".into()
        })
    );
    // The region count must equal the layout's buffers.
    for (spec, keep) in [
        ("llama-3-8b B=64", 0),
        ("llama-3-8b B=64", 2),
        (SEPARATE, 1),
        (SEPARATE, 3),
    ] {
        let p = peer(vec![rank_group("attn", spec, 1, 0)]);
        let buffers = p.groups[0].layout.num_buffers();
        let err = decode_edited(&p, |b| {
            let r = b["groups"][0]["regions"].as_array_mut().unwrap();
            let first = r[0].clone();
            r.resize(keep, first);
        })
        .unwrap_err();
        assert_eq!(
            err,
            HandshakeError::RegionCount {
                group: 0,
                count: keep,
                buffers
            },
            "{spec}"
        );
    }
}

#[test]
fn region_refusals() {
    // Bug class 5: registering numel * elem of a padded cache, or one element short.
    let p = peer(vec![rank_group(
        "attn",
        "llama-3-8b B=8 order=HND page=81920",
        1,
        0,
    )]);
    let span = p.groups[0].layout.extents()[0].end;
    let numel_elem = 32 * 8 * 8 * 16 * 256 * 2; // L B H N (K|V) bf16
    assert!(numel_elem < span);
    for len in [numel_elem, span - 2] {
        let mut q = p.clone();
        q.groups[0].regions[0].len = len;
        let want = HandshakeError::RegionTooSmall {
            group: 0,
            buffer: 0,
            len,
            needed: span,
        };
        assert_eq!(decode(&q.encode()), Err(want.clone()));
        assert_eq!(q.validate(&Limits::default()), Err(want));
    }
    // base + len past u64, through a hand-edited number.
    let err = decode_edited(&p, |b| {
        b["groups"][0]["regions"][0]["base"] = Value::from(u64::MAX)
    })
    .unwrap_err();
    assert_eq!(
        err,
        HandshakeError::RegionOverflow {
            group: 0,
            buffer: 0,
            base: u64::MAX,
            len: span
        }
    );
    // Overlapping regions of a two-buffer layout: V's region starts one byte before K's ends.
    let mut q = peer(vec![rank_group("kv", SEPARATE, 1, 0)]);
    let k = q.groups[0].regions[0];
    q.groups[0].regions[1].base = k.base + k.len - 1;
    assert!(matches!(
        decode(&q.encode()),
        Err(HandshakeError::RegionsOverlap {
            group: 0,
            first: 0,
            second: 1,
            ..
        })
    ));
    q.groups[0].regions[1].base = k.base + k.len;
    assert!(decode(&q.encode()).is_ok());
    q.groups[0].regions[1].base = k.base;
    assert!(matches!(
        decode(&q.encode()),
        Err(HandshakeError::RegionsOverlap { .. })
    ));
}

#[test]
fn layout_tp_and_head_refusals() {
    // A layout that fails validation: zero heads.
    let err = decode_edited(&llama(), |b| {
        edit_layout(b, |doc| doc["geometry"]["num_kv_heads"] = Value::from(0))
    })
    .unwrap_err();
    assert_eq!(
        err,
        HandshakeError::Layout {
            group: 0,
            source: LayoutError::ZeroSize {
                what: "num_kv_heads"
            }
        }
    );
    let err =
        decode_edited(&llama(), |b| b["groups"][0]["layout"] = Value::from("{}")).unwrap_err();
    assert!(matches!(
        err,
        HandshakeError::Layout {
            group: 0,
            source: LayoutError::Json(_)
        }
    ));

    let full = |total, tp, rank| CacheGroup {
        total_kv_heads: total,
        tp_size: tp,
        tp_rank: rank,
        ..rank_group("attn", "llama-3-8b B=64", 1, 0)
    };
    let cases = [
        // The whole layout (8 heads) presented as one rank of two.
        (
            full(8, 2, 0),
            HandshakeError::HeadsMismatch {
                group: 0,
                held: 8,
                expected: 4,
                total_kv_heads: 8,
                tp_size: 2,
                tp_rank: 0,
            },
        ),
        (
            full(16, 1, 0),
            HandshakeError::HeadsMismatch {
                group: 0,
                held: 8,
                expected: 16,
                total_kv_heads: 16,
                tp_size: 1,
                tp_rank: 0,
            },
        ),
        (
            full(8, 0, 0),
            HandshakeError::TpSize {
                group: 0,
                tp_size: 0,
                limit: 1024,
            },
        ),
        (
            full(8, 2048, 0),
            HandshakeError::TpSize {
                group: 0,
                tp_size: 2048,
                limit: 1024,
            },
        ),
        (
            full(8, 2, 2),
            HandshakeError::TpRank {
                group: 0,
                tp_rank: 2,
                tp_size: 2,
            },
        ),
        (full(0, 1, 0), HandshakeError::ZeroTotalHeads { group: 0 }),
    ];
    for (g, want) in cases {
        assert_eq!(decode(&peer(vec![g]).encode()), Err(want));
    }
    for (total, tp) in [(8, 3), (8, 12), (6, 4)] {
        assert!(matches!(
            decode(&peer(vec![full(total, tp, 0)]).encode()),
            Err(HandshakeError::TpSplitRefused { group: 0, total_kv_heads, tp_size, .. })
                if (total_kv_heads, tp_size) == (total, tp)
        ));
    }
    // Replication: 2 heads over TP 4 gives one head per rank; two heads at TP 4 are refused.
    let rep = rank_group("attn", "kv B=4 N=16 H=2 D=8 dtype=f16 order=NHD", 4, 3);
    assert_eq!(rep.head_range(), Some(1..2));
    assert!(decode(&peer(vec![rep.clone()]).encode()).is_ok());
    let two_heads = CacheGroup {
        layout: layout("kv B=4 N=16 H=2 D=8 dtype=f16 order=NHD"),
        ..rep
    };
    assert!(matches!(
        decode(&peer(vec![two_heads]).encode()),
        Err(HandshakeError::HeadsMismatch {
            held: 2,
            expected: 1,
            ..
        })
    ));
    // A Mamba conv state is not split over head slots.
    let conv = rank_group("conv", "mamba2-2.7b-conv B=4", 1, 0);
    assert!(decode(&peer(vec![conv.clone()]).encode()).is_ok());
    let conv2 = CacheGroup { tp_size: 2, ..conv };
    assert!(matches!(
        decode(&peer(vec![conv2]).encode()),
        Err(HandshakeError::TpSplitRefused { tp_size: 2, .. })
    ));
}

#[test]
fn hash_mismatch_is_refused() {
    let p = llama();
    let err = decode_edited(&p, |b| b["groups"][0]["compat_hash"] = Value::from("00")).unwrap_err();
    assert_eq!(
        err,
        HandshakeError::HashMismatch {
            group: 0,
            carried: "00".into(),
            computed: p.groups[0].compat_hash()
        }
    );
    // A covered field edited without its hash: the dtype, then the model's heads.
    let err = decode_edited(&p, |b| {
        edit_layout(b, |doc| doc["dtype"] = Value::from("fp8_e4m3"))
    })
    .unwrap_err();
    assert!(
        matches!(err, HandshakeError::HashMismatch { group: 0, .. }),
        "{err}"
    );
    let two = peer(vec![rank_group("attn", "llama-3-8b B=64", 2, 0)]);
    let err = decode_edited(&two, |b| {
        b["groups"][0]["total_kv_heads"] = Value::from(4);
        b["groups"][0]["tp_size"] = Value::from(1);
    })
    .unwrap_err();
    assert!(
        matches!(err, HandshakeError::HashMismatch { group: 0, .. }),
        "{err}"
    );
    // Fields outside the hash may change freely.
    let ok = decode_edited(&p, |b| {
        edit_layout(b, |doc| doc["geometry"]["num_blocks"] = Value::from(32));
        b["groups"][0]["regions"][0]["base"] = Value::from(4096);
    })
    .unwrap();
    assert_eq!(ok.groups[0].layout.geometry().num_blocks, 32);
    // A long carried hash is quoted, not echoed whole.
    let err = decode_edited(&p, |b| {
        b["groups"][0]["compat_hash"] = Value::from("a".repeat(100_000))
    })
    .unwrap_err();
    assert!(err.to_string().len() < 1000);
}

#[test]
fn check_region_bounds_a_transfer() {
    let g = rank_group("kv", SEPARATE, 1, 0);
    let v = g.regions[1];
    assert_eq!(g.check_region(1, 0, v.len), Ok(v.base));
    assert_eq!(g.check_region(1, 100, 28), Ok(v.base + 100));
    assert_eq!(g.check_region(1, v.len, 0), Ok(v.base + v.len));
    assert_eq!(
        g.check_region(1, v.len - 1, 2),
        Err(HandshakeError::OutsideRegion {
            buffer: 1,
            offset: v.len - 1,
            len: 2,
            region_len: v.len
        })
    );
    assert!(matches!(
        g.check_region(0, u64::MAX, 2),
        Err(HandshakeError::OutsideRegion { .. })
    ));
    assert_eq!(
        g.check_region(2, 0, 1),
        Err(HandshakeError::NoSuchBuffer {
            buffer: 2,
            buffers: 2
        })
    );
}

/// One change to an encoding.
#[derive(Debug, Clone)]
enum Mutation {
    /// Flips one bit.
    Flip(usize, u8),
    /// Inserts a byte.
    Insert(usize, u8),
    /// Deletes a byte.
    Delete(usize),
    /// Cuts the encoding.
    Truncate(usize),
    /// Replaces the n-th run of digits with a number.
    Number(usize, &'static str),
    /// Appends a copy of a group, renamed or not.
    Duplicate(bool),
}

const NUMBERS: [&str; 9] = [
    "18446744073709551615",
    "18446744073709551616",
    "9223372036854775807",
    "4294967296",
    "0",
    "1",
    "-1",
    "1e308",
    "3.5",
];

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        2 => (any::<usize>(), 0u8..8).prop_map(|(a, b)| Mutation::Flip(a, b)),
        1 => (any::<usize>(), any::<u8>()).prop_map(|(a, b)| Mutation::Insert(a, b)),
        1 => any::<usize>().prop_map(Mutation::Delete),
        1 => any::<usize>().prop_map(Mutation::Truncate),
        4 => (any::<usize>(), prop::sample::select(&NUMBERS[..])).prop_map(|(a, n)| Mutation::Number(a, n)),
        1 => any::<bool>().prop_map(Mutation::Duplicate),
    ]
}

fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    let n = bytes.len().max(1);
    match *m {
        Mutation::Flip(at, bit) if !bytes.is_empty() => bytes[at % n] ^= 1 << bit,
        Mutation::Insert(at, b) => bytes.insert(at % (bytes.len() + 1), b),
        Mutation::Delete(at) if !bytes.is_empty() => {
            bytes.remove(at % n);
        }
        Mutation::Truncate(at) => bytes.truncate(at % n),
        Mutation::Number(nth, value) => {
            let body = bytes.get(HEADER_BYTES..).unwrap_or_default();
            let mut runs = Vec::new();
            let mut i = 0;
            while i < body.len() {
                if body[i].is_ascii_digit() {
                    let start = i;
                    while i < body.len() && body[i].is_ascii_digit() {
                        i += 1;
                    }
                    runs.push(HEADER_BYTES + start..HEADER_BYTES + i);
                } else {
                    i += 1;
                }
            }
            if !runs.is_empty() {
                let r = runs[nth % runs.len()].clone();
                bytes.splice(r, value.bytes());
            }
        }
        Mutation::Duplicate(rename) => {
            let Some(Ok(mut body)) = bytes
                .get(HEADER_BYTES..)
                .map(serde_json::from_slice::<Value>)
            else {
                return;
            };
            let Some(groups) = body.get_mut("groups").and_then(Value::as_array_mut) else {
                return;
            };
            let Some(mut copy) = groups.first().cloned() else {
                return;
            };
            if rename {
                copy["name"] = Value::from("copy");
            }
            groups.push(copy);
            *bytes = frame(&serde_json::to_vec(&body).unwrap());
        }
        _ => {}
    }
}

/// Valid encodings to mutate.
fn seeds() -> Vec<Vec<u8>> {
    vec![
        llama().encode(),
        peer(vec![rank_group(
            "attn",
            "kv B=3 N=16 H=4 D=8 dtype=f16 order=HND",
            2,
            1,
        )])
        .encode(),
        peer(vec![
            rank_group("kv", SEPARATE, 4, 2),
            rank_group("mla", "deepseek-v3 B=8", 4, 3),
        ])
        .encode(),
        peer(vec![rank_group(
            "rep",
            "kv B=4 N=16 H=2 D=8 dtype=f16 order=NHD",
            4,
            1,
        )])
        .encode(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Mutated encodings never panic; whatever decodes re-encodes and decodes to itself.
    #[test]
    fn mutated_encodings_never_panic(
        seed in 0usize..4,
        mutations in prop::collection::vec(mutation(), 1..4),
        fix_length in prop::bool::weighted(0.8),
    ) {
        let mut bytes = seeds().swap_remove(seed);
        for m in &mutations {
            apply(&mut bytes, m);
        }
        if fix_length && bytes.len() >= HEADER_BYTES {
            let len = (bytes.len() - HEADER_BYTES) as u32;
            bytes[8..12].copy_from_slice(&len.to_le_bytes());
        }
        if let Ok(p) = decode(&bytes) {
            let again = p.encode();
            prop_assert_eq!(decode(&again), Ok(p.clone()));
            prop_assert!(p.validate(&Limits::default()).is_ok());
        }
    }
}
