//! [`KnownPeers`]: a reconnect with the same groups is taken (new regions kept), a changed
//! block size, order, padding, dtype, TP rank or group set is refused naming the field and
//! both values, and a forgotten peer starts afresh.

use kvlayout::KvCacheLayout;

use super::*;
use crate::handshake::MemRegion;

fn layout(spec: &str) -> KvCacheLayout {
    spec.parse().unwrap()
}

fn peer(id: &str, spec: &str, tp_rank: u64, base: u64) -> PeerMetadata {
    let layout = layout(spec);
    let regions = layout
        .extents()
        .iter()
        .enumerate()
        .map(|(i, x)| MemRegion::host(base + ((i as u64) << 32), x.end))
        .collect();
    PeerMetadata {
        engine_id: id.into(),
        groups: vec![CacheGroup {
            name: "attn".into(),
            total_kv_heads: layout.geometry().num_kv_heads * 2,
            layout,
            tp_size: 2,
            tp_rank,
            regions,
        }],
    }
}

const NHD16: &str = "kv L=2 B=8 N=16 H=4 D=8 dtype=bf16 order=NHD";

/// The refusal's `(group, field, before, after)`.
fn refusal(known: &mut KnownPeers, p: &PeerMetadata) -> (String, String, String, String) {
    match known.admit(p) {
        Err(HandshakeError::PeerChanged {
            peer,
            group,
            field,
            before,
            after,
        }) => {
            assert_eq!(peer, p.engine_id);
            (group, field, before, after)
        }
        other => panic!("not refused as changed: {other:?}"),
    }
}

fn known_with(p: &PeerMetadata) -> KnownPeers {
    let mut known = KnownPeers::new();
    assert_eq!(known.admit(p), Ok(Admission::First));
    known
}

#[test]
fn a_reconnect_with_the_same_groups_is_taken_with_its_new_regions() {
    let first = peer("prefill-0", NHD16, 1, 0x7f00_0000_0000);
    let mut known = known_with(&first);
    let again = peer("prefill-0", NHD16, 1, 0x7e00_0000_0000);
    assert_ne!(first, again, "the regions moved");
    assert_eq!(known.admit(&again), Ok(Admission::Same));
    assert_eq!(known.get("prefill-0"), Some(&again));
    // Another engine id is a first connect, whatever its layout.
    let other = peer(
        "prefill-1",
        "kv L=2 B=8 N=32 H=4 D=8 dtype=bf16 order=HND",
        0,
        0,
    );
    assert_eq!(known.admit(&other), Ok(Admission::First));
    assert_eq!(known.len(), 2);
}

#[test]
fn a_changed_block_size_is_refused_naming_it() {
    let mut known = known_with(&peer("p", NHD16, 0, 0x1000));
    let changed = peer(
        "p",
        "kv L=2 B=8 N=32 H=4 D=8 dtype=bf16 order=NHD",
        0,
        0x1000,
    );
    let (group, field, before, after) = refusal(&mut known, &changed);
    assert_eq!(group, "attn");
    assert_eq!(field, "layout.geometry.block_size");
    assert_eq!((before.as_str(), after.as_str()), ("16", "32"));
    // The refusal leaves the first connect's metadata in place.
    assert_eq!(known.get("p").unwrap().groups[0].layout, layout(NHD16));
    let e = known.admit(&changed).unwrap_err().to_string();
    assert!(e.contains("\"p\"") && e.contains("block_size"), "{e}");
    assert!(e.contains("16 before, 32 now"), "{e}");
}

#[test]
fn a_changed_order_padding_or_dtype_is_refused_naming_the_field() {
    let hnd = "kv L=2 B=8 N=16 H=4 D=8 dtype=bf16 order=HND";
    let padded = "kv L=2 B=8 N=16 H=4 D=8 dtype=bf16 order=NHD page=4096";
    let fp8 = "kv L=2 B=8 N=16 H=4 D=8 dtype=fp8_e4m3 order=NHD";
    for (spec, want) in [(hnd, "order"), (padded, "page"), (fp8, "dtype")] {
        let mut known = known_with(&peer("p", NHD16, 0, 0x1000));
        let (group, field, before, after) = refusal(&mut known, &peer("p", spec, 0, 0x1000));
        assert_eq!(group, "attn", "{spec}");
        assert!(field.starts_with("layout."), "{spec}: {field}");
        assert!(field.contains(want), "{spec}: {field}");
        assert_ne!(before, after, "{spec}: {field}");
    }
}

#[test]
fn a_changed_tp_rank_or_group_set_is_refused() {
    let mut known = known_with(&peer("p", NHD16, 0, 0x1000));
    assert_eq!(
        refusal(&mut known, &peer("p", NHD16, 1, 0x1000)),
        ("attn".into(), "tp_rank".into(), "0".into(), "1".into())
    );
    let mut two = peer("p", NHD16, 0, 0x1000);
    let mut second = two.groups[0].clone();
    second.name = "draft".into();
    two.groups.push(second);
    assert_eq!(
        refusal(&mut known, &two),
        (
            "*".into(),
            "groups".into(),
            r#"["attn"]"#.into(),
            r#"["attn", "draft"]"#.into()
        )
    );
    // Names are compared as a list, not as joined text: "a, b" is not "a" and "b".
    let mut joined = peer("q", NHD16, 0, 0x1000);
    joined.groups[0].name = "a, b".into();
    let mut split = peer("q", NHD16, 0, 0x1000);
    split.groups[0].name = "a".into();
    let mut b = split.groups[0].clone();
    b.name = "b".into();
    split.groups.push(b);
    let mut known = known_with(&joined);
    assert_eq!(
        refusal(&mut known, &split),
        (
            "*".into(),
            "groups".into(),
            r#"["a, b"]"#.into(),
            r#"["a", "b"]"#.into()
        )
    );
}

#[test]
fn a_forgotten_peer_connects_afresh() {
    let mut known = known_with(&peer("p", NHD16, 0, 0x1000));
    assert!(known.forget("p"));
    assert!(!known.forget("p"));
    assert!(known.is_empty());
    let hnd = peer(
        "p",
        "kv L=2 B=8 N=16 H=4 D=8 dtype=bf16 order=HND",
        0,
        0x1000,
    );
    assert_eq!(known.admit(&hnd), Ok(Admission::First));
}
