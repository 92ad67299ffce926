//! The handshake: the versioned metadata each instance publishes so that a peer can move KV
//! blocks to or from it over NIXL, and the checks that let a receiver trust it.
//!
//! This module owns [`PeerMetadata`] (an engine id and its [`CacheGroup`]s: per group the
//! layout, the model's KV heads, the TP rank and size, and one registered [`MemRegion`] per
//! layout buffer), its byte encoding ([`PeerMetadata::encode`], [`PeerMetadata::decode`]),
//! the compatibility hash of a group ([`CacheGroup::compat_hash`], fields listed in
//! [`compat`]) with [`check_compatible`], and the bounds check of a transfer's byte range
//! ([`CacheGroup::check_region`]). The peer is untrusted: decoding reads the version first,
//! bounds every size by [`Limits`], and answers every defect with a [`HandshakeError`] naming
//! the group, the value and the limit; nothing panics on input. TP size, block size and
//! physical order may differ between peers; the planner ([`mod@crate::plan`]) reconciles them.
//!
//! ```
//! use kvlayout_connector::handshake::{CacheGroup, Limits, MemRegion, PeerMetadata};
//! // Rank 1 of TP 2 publishes its own dense cache of 4 of the 8 heads.
//! let layout = kvlayout::preset("llama-3-8b")?.tp_rank_layout(2, 1)?;
//! let regions = layout
//!     .extents()
//!     .iter()
//!     .map(|x| MemRegion::host(0x7f00_0000_0000, x.end))
//!     .collect();
//! let group = CacheGroup {
//!     name: "attn".into(),
//!     layout,
//!     total_kv_heads: 8,
//!     tp_size: 2,
//!     tp_rank: 1,
//!     regions,
//! };
//! let peer = PeerMetadata { engine_id: "prefill-0".into(), groups: vec![group] };
//! let bytes = peer.encode();
//! assert_eq!(PeerMetadata::decode(&bytes, &Limits::default())?, peer);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::ops::Range;

use kvlayout::KvCacheLayout;
use serde::{Deserialize, Serialize};

pub mod compat;
mod error;
mod known;
mod wire;

pub use compat::check_compatible;
pub use error::HandshakeError;
pub use known::{Admission, KnownPeers};
pub use wire::{HEADER_BYTES, MAGIC, VERSION};

/// Bounds a receiver puts on a peer's metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest body (the JSON after the 12-byte header) accepted, in bytes. Default 1 MiB.
    pub max_body_bytes: u64,
    /// Most cache groups accepted. Default 64.
    pub max_groups: usize,
    /// Largest TP size accepted. Default 1024.
    pub max_tp: u64,
    /// Longest engine id or group name accepted, in bytes. Default 256.
    pub max_name_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 1 << 20,
            max_groups: 64,
            max_tp: 1024,
            max_name_bytes: 256,
        }
    }
}

/// One registered allocation of the peer: `len` bytes from address `base`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemRegion {
    /// Address of the buffer's byte 0 in the peer's registered memory.
    pub base: u64,
    /// Bytes registered from `base`.
    pub len: u64,
    /// The GPU whose memory this is (CUDA or HIP device ordinal); `None` for host memory.
    /// Absent from the wire for host memory, as before the field existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<u64>,
}

impl MemRegion {
    /// `len` bytes of host memory from `base`.
    pub const fn host(base: u64, len: u64) -> Self {
        MemRegion {
            base,
            len,
            device: None,
        }
    }
}

/// One cache group of an instance: a layout and where its buffers live, for one TP rank. The
/// planner takes the local group and the peer's.
#[derive(Debug, Clone, PartialEq)]
pub struct CacheGroup {
    /// Name the two peers match groups by (e.g. `attn`, `mamba`).
    pub name: String,
    /// The layout this rank's cache has (its heads only).
    pub layout: KvCacheLayout,
    /// The model's KV heads before TP slicing.
    pub total_kv_heads: u64,
    /// TP size of the peer.
    pub tp_size: u64,
    /// TP rank this metadata describes, `< tp_size`.
    pub tp_rank: u64,
    /// One region per layout buffer: region `i` holds buffer `i` and spans at least the
    /// buffer's registered span (`layout.extents()[i].end`, padding included). Empty where
    /// the memory is not described yet: the planner reads no region, so a group that only
    /// plans needs none. A published group has one per buffer: [`PeerMetadata::validate`]
    /// and decoding refuse any other count.
    pub regions: Vec<MemRegion>,
}

/// What one peer publishes: its engine id and its cache groups.
#[derive(Debug, Clone, PartialEq)]
pub struct PeerMetadata {
    /// The peer's engine id.
    pub engine_id: String,
    /// Its cache groups, names unique.
    pub groups: Vec<CacheGroup>,
}

/// Checks a name is non-empty and within the limit.
fn check_name(what: impl Fn() -> String, name: &str, limit: usize) -> Result<(), HandshakeError> {
    if name.is_empty() {
        return Err(HandshakeError::EmptyName { what: what() });
    }
    if name.len() > limit {
        return Err(HandshakeError::NameTooLong {
            what: what(),
            len: name.len(),
            limit,
        });
    }
    Ok(())
}

impl CacheGroup {
    /// The canonical text the compatibility hash covers (format in [`compat`]).
    pub fn compat_text(&self) -> String {
        compat::compat_text(self)
    }

    /// SHA-256 of [`CacheGroup::compat_text`], 64 lowercase hex digits.
    pub fn compat_hash(&self) -> String {
        compat::compat_hash(self)
    }

    /// The model heads this rank holds (contiguous, or one replicated head when `tp_size`
    /// exceeds the heads); `None` where the TP placement names no heads. Always `Some` for a
    /// group that decoded or validated.
    pub fn head_range(&self) -> Option<Range<u64>> {
        kvlayout::tp_head_range(self.total_kv_heads, self.tp_size, self.tp_rank).ok()
    }

    /// The absolute address of bytes `[offset, offset + len)` of buffer `buffer`, refused
    /// unless the range lies inside the buffer's registered region.
    pub fn check_region(
        &self,
        buffer: usize,
        offset: u64,
        len: u64,
    ) -> Result<u64, HandshakeError> {
        let region = self
            .regions
            .get(buffer)
            .ok_or(HandshakeError::NoSuchBuffer {
                buffer,
                buffers: self.regions.len(),
            })?;
        let outside = HandshakeError::OutsideRegion {
            buffer,
            offset,
            len,
            region_len: region.len,
        };
        match offset.checked_add(len) {
            Some(end) if end <= region.len => region.base.checked_add(offset).ok_or(outside),
            _ => Err(outside),
        }
    }

    /// Checks this group as group `index` of a peer: name, region count, TP, heads, regions.
    /// The layout is valid by construction; the hash is checked where it is carried.
    fn check(&self, index: usize, limits: &Limits) -> Result<(), HandshakeError> {
        check_name(
            || format!("group {index} name"),
            &self.name,
            limits.max_name_bytes,
        )?;
        let buffers = self.layout.num_buffers();
        if self.regions.len() != buffers {
            return Err(HandshakeError::RegionCount {
                group: index,
                count: self.regions.len(),
                buffers,
            });
        }
        self.check_tp(index, limits)?;
        self.check_regions(index)
    }

    /// TP size within limits, rank below it, and the layout's heads those of the rank.
    fn check_tp(&self, group: usize, limits: &Limits) -> Result<(), HandshakeError> {
        let (tp_size, tp_rank, total_kv_heads) = (self.tp_size, self.tp_rank, self.total_kv_heads);
        if tp_size == 0 || tp_size > limits.max_tp {
            return Err(HandshakeError::TpSize {
                group,
                tp_size,
                limit: limits.max_tp,
            });
        }
        if tp_rank >= tp_size {
            return Err(HandshakeError::TpRank {
                group,
                tp_rank,
                tp_size,
            });
        }
        if total_kv_heads == 0 {
            return Err(HandshakeError::ZeroTotalHeads { group });
        }
        let refused = |reason| HandshakeError::TpSplitRefused {
            group,
            total_kv_heads,
            tp_size,
            reason,
        };
        if self.layout.content().tp_shards_channels() && tp_size > 1 {
            return Err(refused(
                "Mamba conv state is sharded along its channels, not head slots".into(),
            ));
        }
        let heads = kvlayout::tp_head_range(total_kv_heads, tp_size, tp_rank)
            .map_err(|e| refused(e.to_string()))?;
        let (expected, held) = (heads.end - heads.start, self.layout.geometry().num_kv_heads);
        if held != expected {
            return Err(HandshakeError::HeadsMismatch {
                group,
                held,
                expected,
                total_kv_heads,
                tp_size,
                tp_rank,
            });
        }
        Ok(())
    }

    /// Each region's end fits in u64 and covers its buffer's registered span, and no two
    /// regions share bytes.
    fn check_regions(&self, group: usize) -> Result<(), HandshakeError> {
        for (buffer, (r, extent)) in self.regions.iter().zip(self.layout.extents()).enumerate() {
            if r.base.checked_add(r.len).is_none() {
                return Err(HandshakeError::RegionOverflow {
                    group,
                    buffer,
                    base: r.base,
                    len: r.len,
                });
            }
            if r.len < extent.end {
                return Err(HandshakeError::RegionTooSmall {
                    group,
                    buffer,
                    len: r.len,
                    needed: extent.end,
                });
            }
        }
        let mut by_base: Vec<(usize, MemRegion)> =
            self.regions.iter().copied().enumerate().collect();
        by_base.sort_by_key(|(i, r)| (r.base, *i));
        for pair in by_base.windows(2) {
            let [(first, a), (second, b)] = [pair[0], pair[1]];
            // Ends fit in u64 (checked above); a region of zero bytes overlaps nothing.
            if a.len > 0 && b.len > 0 && a.base + a.len > b.base {
                return Err(HandshakeError::RegionsOverlap {
                    group,
                    first,
                    first_base: a.base,
                    first_len: a.len,
                    second,
                    second_base: b.base,
                    second_len: b.len,
                });
            }
        }
        Ok(())
    }
}

impl PeerMetadata {
    /// Checks what decoding checks, except the carried hashes: names, group count, and each
    /// group's regions, TP and heads. A sender runs it before publishing.
    pub fn validate(&self, limits: &Limits) -> Result<(), HandshakeError> {
        check_engine_and_count(&self.engine_id, self.groups.len(), limits)?;
        for (index, group) in self.groups.iter().enumerate() {
            group.check(index, limits)?;
        }
        self.check_unique_names()
    }

    /// No two groups share a name.
    fn check_unique_names(&self) -> Result<(), HandshakeError> {
        for (second, g) in self.groups.iter().enumerate() {
            if let Some(first) = self.groups[..second].iter().position(|o| o.name == g.name) {
                return Err(HandshakeError::DuplicateGroup {
                    name: g.name.clone(),
                    first,
                    second,
                });
            }
        }
        Ok(())
    }
}

/// The engine id is a valid name and `count` groups within `1..=max_groups`.
fn check_engine_and_count(
    engine_id: &str,
    count: usize,
    limits: &Limits,
) -> Result<(), HandshakeError> {
    check_name(|| "engine id".into(), engine_id, limits.max_name_bytes)?;
    if count == 0 {
        return Err(HandshakeError::NoGroups);
    }
    if count > limits.max_groups {
        return Err(HandshakeError::TooManyGroups {
            count,
            limit: limits.max_groups,
        });
    }
    Ok(())
}
