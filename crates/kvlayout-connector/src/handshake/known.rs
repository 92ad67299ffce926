//! Peers seen before, by engine id: [`KnownPeers`] remembers each peer's cache groups from its
//! first connect and refuses a later connect of the same engine id (a restarted process, a
//! reconnect after a fault) whose groups differ in anything but their registered regions,
//! naming the first differing field and both values.
//!
//! Regions may change between connects: a restarted process registers new memory. Everything
//! else a group states (its layout, field by field, the model's KV heads, TP size and rank) and
//! the set of group names must stay: blocks planned against the first layout would otherwise be
//! read through the second. This module does not own the engines' peer tables: a receiver calls
//! [`KnownPeers::admit`] on each decoded handshake before `add_peer`.

use std::collections::HashMap;

use serde_json::Value;

use super::error::HandshakeError;
use super::{CacheGroup, PeerMetadata};

/// How [`KnownPeers::admit`] took a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// The engine id was not known: its groups are remembered from now on.
    First,
    /// Known, with the same groups (its regions may have moved; the new ones are kept).
    Same,
}

/// Each peer's metadata from its first connect, by engine id.
///
/// ```
/// use kvlayout_connector::handshake::{
///     Admission, CacheGroup, HandshakeError, KnownPeers, MemRegion, PeerMetadata,
/// };
/// let peer = |spec: &str| {
///     let layout: kvlayout::KvCacheLayout = spec.parse().unwrap();
///     let regions = layout.extents().iter().map(|x| MemRegion::host(0x1000, x.end)).collect();
///     let group = CacheGroup {
///         name: "attn".into(),
///         layout,
///         total_kv_heads: 4,
///         tp_size: 1,
///         tp_rank: 0,
///         regions,
///     };
///     PeerMetadata { engine_id: "prefill-0".into(), groups: vec![group] }
/// };
/// let mut known = KnownPeers::new();
/// let nhd = peer("kv L=2 B=8 N=16 H=4 D=8 dtype=bf16 order=NHD");
/// assert_eq!(known.admit(&nhd)?, Admission::First);
/// assert_eq!(known.admit(&nhd)?, Admission::Same);
/// // Restarted with blocks of 32 tokens: refused, naming the field and both values.
/// let err = known.admit(&peer("kv L=2 B=8 N=32 H=4 D=8 dtype=bf16 order=NHD")).unwrap_err();
/// assert!(matches!(&err, HandshakeError::PeerChanged { field, .. }
///     if field == "layout.geometry.block_size"));
/// assert!(err.to_string().contains("16 before, 32 now"));
/// # Ok::<(), HandshakeError>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct KnownPeers {
    peers: HashMap<String, PeerMetadata>,
}

impl KnownPeers {
    /// No peer known.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes `peer`'s metadata: remembered at its engine id's first connect; at a later one,
    /// refused with [`HandshakeError::PeerChanged`] where a group differs from the remembered
    /// one in anything but its regions, or the set of group names differs. An accepted
    /// reconnect replaces the remembered regions.
    pub fn admit(&mut self, peer: &PeerMetadata) -> Result<Admission, HandshakeError> {
        let Some(known) = self.peers.get_mut(&peer.engine_id) else {
            self.peers.insert(peer.engine_id.clone(), peer.clone());
            return Ok(Admission::First);
        };
        if let Some((group, field, before, after)) = first_difference(known, peer) {
            return Err(HandshakeError::PeerChanged {
                peer: peer.engine_id.clone(),
                group,
                field,
                before,
                after,
            });
        }
        *known = peer.clone();
        Ok(Admission::Same)
    }

    /// The metadata remembered for `engine_id`.
    pub fn get(&self, engine_id: &str) -> Option<&PeerMetadata> {
        self.peers.get(engine_id)
    }

    /// Forgets `engine_id` (its next connect is a first one); whether it was known.
    pub fn forget(&mut self, engine_id: &str) -> bool {
        self.peers.remove(engine_id).is_some()
    }

    /// Peers known.
    pub fn len(&self) -> usize {
        self.peers.len()
    }

    /// Whether no peer is known.
    pub fn is_empty(&self) -> bool {
        self.peers.is_empty()
    }
}

/// The first difference between two connects of one peer, regions aside: `(group, field,
/// before, after)`; `*` as the group for the set of group names.
fn first_difference(
    before: &PeerMetadata,
    after: &PeerMetadata,
) -> Option<(String, String, String, String)> {
    fn names(p: &PeerMetadata) -> Vec<&str> {
        let mut v: Vec<&str> = p.groups.iter().map(|g| g.name.as_str()).collect();
        v.sort_unstable();
        v
    }
    let (was, now) = (names(before), names(after));
    if was != now {
        let quoted = |v: &[&str]| format!("{v:?}");
        return Some(("*".into(), "groups".into(), quoted(&was), quoted(&now)));
    }
    for old in &before.groups {
        let Some(new) = after.groups.iter().find(|g| g.name == old.name) else {
            return Some((
                "*".into(),
                "groups".into(),
                old.name.clone(),
                "absent".into(),
            ));
        };
        if let Some((field, b, a)) = group_difference(old, new) {
            return Some((old.name.clone(), field, b, a));
        }
    }
    None
}

/// The first field two groups of one name differ in, regions aside: `(field, before, after)`.
fn group_difference(before: &CacheGroup, after: &CacheGroup) -> Option<(String, String, String)> {
    for (field, b, a) in [
        ("tp_size", before.tp_size, after.tp_size),
        ("tp_rank", before.tp_rank, after.tp_rank),
        (
            "total_kv_heads",
            before.total_kv_heads,
            after.total_kv_heads,
        ),
    ] {
        if b != a {
            return Some((field.into(), b.to_string(), a.to_string()));
        }
    }
    if before.layout == after.layout {
        return None;
    }
    let json = |g: &CacheGroup| serde_json::from_str::<Value>(&g.layout.to_json()).ok();
    match (json(before), json(after)) {
        (Some(b), Some(a)) => value_difference("layout", &b, &a).or_else(|| whole(before, after)),
        _ => whole(before, after),
    }
}

/// The two layouts as spec strings, where their documents show no difference.
fn whole(before: &CacheGroup, after: &CacheGroup) -> Option<(String, String, String)> {
    Some((
        "layout".into(),
        before.layout.to_string(),
        after.layout.to_string(),
    ))
}

/// The first path (`layout.geometry.block_size`) where two JSON values differ, with both
/// values; object keys in sorted order, arrays element by element.
fn value_difference(path: &str, before: &Value, after: &Value) -> Option<(String, String, String)> {
    match (before, after) {
        (Value::Object(b), Value::Object(a)) => {
            let mut keys: Vec<&String> = b.keys().chain(a.keys()).collect();
            keys.sort_unstable();
            keys.dedup();
            keys.into_iter().find_map(|k| {
                let at = format!("{path}.{k}");
                match (b.get(k), a.get(k)) {
                    (Some(x), Some(y)) => value_difference(&at, x, y),
                    (x, y) => Some((at, shown(x), shown(y))),
                }
            })
        }
        (Value::Array(b), Value::Array(a)) if b.len() == a.len() => b
            .iter()
            .zip(a)
            .enumerate()
            .find_map(|(i, (x, y))| value_difference(&format!("{path}[{i}]"), x, y)),
        (b, a) if b == a => None,
        (b, a) => Some((path.into(), shown(Some(b)), shown(Some(a)))),
    }
}

/// A value as a user reads it: strings without quotes, absence as `(absent)`.
fn shown(v: Option<&Value>) -> String {
    match v {
        None => "(absent)".into(),
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
    }
}

#[cfg(test)]
#[path = "known_tests.rs"]
mod tests;
