//! Prepared descriptor lists: for one peer and one pairing of a local and a remote layout,
//! the byte ranges both layouts give per block (or per block and layer) for the heads they
//! exchange, handed to NIXL once (`prepXferDlist`), so that a transfer is made from indices
//! into them (`makeXferReq`, which merges consecutive indices) instead of fresh descriptor
//! lists. This module owns the entries (derived from the layouts through
//! [`KvCacheLayout::block_regions`], never from sizes), the mapping of a transfer's runs onto
//! them, and the path a transfer took ([`NixlPath`]). The NIXL calls and the checks against the
//! registered lengths live in the engine.

use std::ops::Range;

use kvlayout::ops::CopyRun;
use kvlayout::{ByteRange, KvCacheLayout};
use nixl_sys::{OptArgs, XferDescList, XferDlistHandle};

use crate::engine::EngineError;
use crate::handshake::CacheGroup;
use crate::memory::{MemKind, Region};

use super::memory::mem_type;
use super::{nixl_error, NixlEngine};

/// At most this many ranges per (block, layer) on one side; more (a head slice of a
/// token-major page: one range per token) is not worth preparing.
const MAX_RANGES_PER_UNIT: usize = 4;
/// At most this many entries per side (NIXL indexes them with `i32`).
pub(crate) const MAX_ENTRIES: usize = 1 << 24;

/// One side of a pairing to prepare: a layout, the engine buffer its buffer 0 is (a staging
/// cache after the cache, for instance), and the heads of the layout the transfers move.
#[derive(Debug, Clone, PartialEq)]
pub struct PrepareSide<'a> {
    /// The layout of the memory on this side.
    pub layout: &'a KvCacheLayout,
    /// The engine buffer that holds the layout's buffer 0.
    pub first_buffer: u32,
    /// The layout's heads the transfers move (indices in this layout).
    pub heads: Range<u64>,
}

/// Which path a transfer took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NixlPath {
    /// Made from indices into the peer's prepared lists (`makeXferReq`): `entries` indices per
    /// side, before NIXL merges consecutive ones.
    Prepared {
        /// Indices posted per side.
        entries: usize,
    },
    /// Built from fresh descriptor lists (`createXferReq`), one descriptor per run.
    Listed {
        /// Descriptors posted per side.
        descriptors: usize,
        /// Why the prepared path was not taken.
        why: String,
    },
}

impl NixlPath {
    /// `prepared (N entries)` or `listed (N descriptors: why)`.
    pub fn describe(&self) -> String {
        match self {
            NixlPath::Prepared { entries } => format!("prepared ({entries} entries)"),
            NixlPath::Listed { descriptors, why } => {
                format!("listed ({descriptors} descriptors: {why})")
            }
        }
    }
}

/// Prepared lists and entries held: what [`crate::nixl::NixlEngine::prepared`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PreparedCount {
    /// NIXL prepared-list handles held (two per pairing: local and remote).
    pub handles: usize,
    /// Entries in them, both sides together.
    pub entries: usize,
}

/// The entries of one side, in engine buffers, sorted by (buffer, offset); an entry's index
/// in the prepared list is its position here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entries {
    pub(crate) ranges: Vec<ByteRange>,
}

impl Entries {
    /// The entries of `side`: per block (all layers) where `per_block`, else per block and
    /// layer, each the merged ranges of [`KvCacheLayout::block_regions`] for the side's heads.
    pub(crate) fn of(side: &PrepareSide<'_>, per_block: bool) -> Result<Entries, String> {
        let g = side.layout.geometry();
        let mut ranges = Vec::new();
        for block in 0..g.num_blocks {
            let layer_ranges: Vec<Range<u64>> = if per_block {
                std::iter::once(0..g.num_layers).collect()
            } else {
                (0..g.num_layers).map(|l| l..l + 1).collect()
            };
            for layers in layer_ranges {
                let unit = side
                    .layout
                    .block_regions(block, layers.clone(), side.heads.clone())
                    .map_err(|e| e.to_string())?;
                if unit.len() > MAX_RANGES_PER_UNIT {
                    return Err(format!(
                        "block {block}, layers {layers:?}, heads {:?} is {} ranges in {}; \
                         prepared entries take at most {MAX_RANGES_PER_UNIT}",
                        side.heads,
                        unit.len(),
                        side.layout
                    ));
                }
                for r in unit {
                    let buffer = r.buffer.checked_add(side.first_buffer).ok_or_else(|| {
                        format!("buffer {} after {} overflows", r.buffer, side.first_buffer)
                    })?;
                    ranges.push(ByteRange { buffer, ..r });
                }
                if ranges.len() > MAX_ENTRIES {
                    return Err(format!(
                        "more than {MAX_ENTRIES} entries for {}",
                        side.layout
                    ));
                }
            }
        }
        ranges.sort_unstable();
        Ok(Entries { ranges })
    }

    /// Whether every block of `side` is one range over all its layers.
    pub(crate) fn blocks_contiguous(side: &PrepareSide<'_>) -> bool {
        let g = side.layout.geometry();
        (0..g.num_blocks).all(|b| {
            side.layout
                .block_regions(b, 0..g.num_layers, side.heads.clone())
                .is_ok_and(|r| r.len() == 1)
        })
    }

    /// Appends to `out` the indices and lengths of the entries that tile `[offset, offset +
    /// len)` of `buffer` exactly, in order; false (with `out` unspecified) if they do not.
    fn tile(&self, buffer: u32, offset: u64, len: u64, out: &mut Vec<(i32, u64)>) -> bool {
        let key = (buffer, offset);
        let Ok(mut i) = self
            .ranges
            .binary_search_by(|r| (r.buffer, r.offset).cmp(&key))
        else {
            return false;
        };
        let (mut at, end) = (offset, offset.saturating_add(len));
        while at < end {
            match self.ranges.get(i) {
                Some(r) if r.buffer == buffer && r.offset == at && r.len <= end - at => {
                    out.push((i as i32, r.len));
                    at += r.len;
                    i += 1;
                }
                _ => return false,
            }
        }
        true
    }
}

/// A pairing's prepared lists on both sides and their entries.
pub(crate) struct Prepared {
    /// Released before the agent (the engine's field order).
    pub(crate) local: PreparedHandle,
    pub(crate) remote: PreparedHandle,
    pub(crate) local_entries: Entries,
    pub(crate) remote_entries: Entries,
    /// What was prepared: (local layout, first buffer, heads), the same for the remote.
    pub(crate) key: (SideKey, SideKey),
}

/// An owned description of a [`PrepareSide`].
pub(crate) type SideKey = (KvCacheLayout, u32, Range<u64>);

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared")
            .field("local_entries", &self.local_entries.ranges.len())
            .field("remote_entries", &self.remote_entries.ranges.len())
            .finish()
    }
}

/// A NIXL prepared-list handle, released on drop (`releasedDlistH`).
pub(crate) struct PreparedHandle(pub(crate) XferDlistHandle);

// SAFETY: the handle is an opaque pointer to a list NIXL owns, and the pointer of the agent
// that made it. The agent runs with `ThreadSync::Strict` (its calls are serialized by NIXL),
// the handle is only read by `makeXferReq` through `&self` and released once, on drop, which
// needs the owner; nothing ties it to the thread that made it.
unsafe impl Send for PreparedHandle {}
// SAFETY: as above: shared use is `makeXferReq` reading the list under the agent's lock.
unsafe impl Sync for PreparedHandle {}

impl Prepared {
    /// The local and remote indices of `sides` (local buffer, local offset, remote buffer,
    /// remote offset, length; zero-length runs skipped), or why they are not expressible as
    /// this pairing's entries.
    pub(crate) fn indices(
        &self,
        sides: &[(u32, u64, u32, u64, u64)],
    ) -> Result<(Vec<i32>, Vec<i32>), String> {
        let (mut local, mut remote) = (Vec::new(), Vec::new());
        let (mut l, mut r) = (Vec::new(), Vec::new());
        for (n, &(lb, lo, rb, ro, len)) in sides.iter().enumerate().filter(|s| s.1 .4 > 0) {
            l.clear();
            r.clear();
            if !self.local_entries.tile(lb, lo, len, &mut l) {
                return Err(format!(
                    "run {n} ({len} bytes at local buffer {lb} offset {lo}) is not a prepared \
                     local entry"
                ));
            }
            if !self.remote_entries.tile(rb, ro, len, &mut r) {
                return Err(format!(
                    "run {n} ({len} bytes at remote buffer {rb} offset {ro}) is not a prepared \
                     remote entry"
                ));
            }
            if l.len() != r.len() || l.iter().zip(&r).any(|(a, b)| a.1 != b.1) {
                return Err(format!(
                    "run {n}: the local and remote entries it covers differ in length"
                ));
            }
            local.extend(l.iter().map(|e| e.0));
            remote.extend(r.iter().map(|e| e.0));
        }
        Ok((local, remote))
    }
}

impl NixlEngine {
    /// Prepares, once, the descriptor lists of transfers with peer `peer` between `local` (this
    /// engine's buffers from `local.first_buffer` on) and `remote` (the peer's, as its
    /// handshake regions give them): per block where every block of both sides is one range
    /// over all layers, else per block and layer, for each side's heads. From then on a READ
    /// or WRITE with that peer whose runs each cover whole entries, the same lengths on both
    /// sides, is made from indices into these lists ([`NixlPath::Prepared`]); any other is
    /// posted as before ([`NixlPath::Listed`]). Preparing the same pairing again does nothing.
    /// Returns the entries of the pairing (both sides). Refused, with nothing prepared, where
    /// the peer is unknown, an entry lies outside either side's registered memory, a side
    /// spans two memory kinds, or a (block, layer) is more than a few ranges (a head slice of
    /// a token-major page: such transfers stay listed). Adding the peer again or removing it
    /// releases its lists.
    pub fn prepare_peer(
        &mut self,
        peer: &str,
        local: &PrepareSide<'_>,
        remote: &PrepareSide<'_>,
    ) -> Result<usize, EngineError> {
        let refuse = |why: String| EngineError::Transport(format!("nixl prepare {peer:?}: {why}"));
        let regions = self
            .peers
            .get(peer)
            .ok_or_else(|| EngineError::UnknownPeer(peer.to_string()))?;
        let side_key = |s: &PrepareSide<'_>| (s.layout.clone(), s.first_buffer, s.heads.clone());
        let key = (side_key(local), side_key(remote));
        if let Some(p) = self
            .prepared
            .get(peer)
            .into_iter()
            .flatten()
            .find(|p| p.key == key)
        {
            return Ok(p.local_entries.ranges.len() + p.remote_entries.ranges.len());
        }
        let per_block = Entries::blocks_contiguous(local) && Entries::blocks_contiguous(remote);
        let local_entries =
            Entries::of(local, per_block).map_err(|w| refuse(format!("local: {w}")))?;
        let remote_entries =
            Entries::of(remote, per_block).map_err(|w| refuse(format!("remote: {w}")))?;
        let local_lens = self.memory.lens();
        let remote_lens: Vec<u64> = regions.iter().map(|r| r.len).collect();
        let kinds_local: Vec<MemKind> = self.memory.buffers.iter().map(Region::kind).collect();
        let kinds_remote: Vec<MemKind> = regions
            .iter()
            .map(|r| r.device.map_or(MemKind::Host, |id| MemKind::Device { id }))
            .collect();
        let bases_local: Vec<u64> = self.memory.buffers.iter().map(Region::addr).collect();
        let bases_remote: Vec<u64> = regions.iter().map(|r| r.base).collect();
        let mut opt = OptArgs::new().map_err(|e| nixl_error("opt args", e))?;
        opt.add_backend(&self.backend)
            .map_err(|e| nixl_error("opt args", e))?;
        let mut handles = Vec::with_capacity(2);
        for (side, entries, lens, kinds, bases, agent) in [
            (
                "local",
                &local_entries,
                &local_lens,
                &kinds_local,
                &bases_local,
                "",
            ),
            (
                peer,
                &remote_entries,
                &remote_lens,
                &kinds_remote,
                &bases_remote,
                peer,
            ),
        ] {
            let list = descriptor_list(side, entries, lens, kinds, bases)?;
            // NIXL names the local side by the empty agent name (`NIXL_INIT_AGENT`).
            let handle = self
                .agent
                .prepare_xfer_dlist(agent, &list, Some(&opt))
                .map_err(|e| nixl_error(&format!("prep_xfer_dlist({side})"), e))?;
            handles.push(PreparedHandle(handle));
        }
        let remote_handle = handles.pop();
        let local_handle = handles.pop();
        let (Some(local_h), Some(remote_h)) = (local_handle, remote_handle) else {
            return Err(refuse("no handle".into()));
        };
        let entries = local_entries.ranges.len() + remote_entries.ranges.len();
        self.prepared
            .entry(peer.to_string())
            .or_default()
            .push(Prepared {
                local: local_h,
                remote: remote_h,
                local_entries,
                remote_entries,
                key,
            });
        Ok(entries)
    }

    /// [`NixlEngine::prepare_peer`] for a local rank's group and a remote rank's group from
    /// their handshakes: the heads the local rank takes from that remote rank (their TP head
    /// ranges' overlap, in each layout's own head numbering), the local cache at buffer
    /// `local_first_buffer`, the remote cache at the peer's buffer 0. Refused where the ranks
    /// share no head.
    pub fn prepare_groups(
        &mut self,
        peer: &str,
        local: &CacheGroup,
        remote: &CacheGroup,
        local_first_buffer: u32,
    ) -> Result<usize, EngineError> {
        let refuse = |why: String| EngineError::Transport(format!("nixl prepare {peer:?}: {why}"));
        let (Some(lh), Some(rh)) = (local.head_range(), remote.head_range()) else {
            return Err(refuse("a group's TP head range is invalid".into()));
        };
        let (start, end) = (lh.start.max(rh.start), lh.end.min(rh.end));
        if start >= end {
            return Err(refuse(format!(
                "local heads {lh:?} and remote heads {rh:?} do not overlap"
            )));
        }
        self.prepare_peer(
            peer,
            &PrepareSide {
                layout: &local.layout,
                first_buffer: local_first_buffer,
                heads: start - lh.start..end - lh.start,
            },
            &PrepareSide {
                layout: &remote.layout,
                first_buffer: 0,
                heads: start - rh.start..end - rh.start,
            },
        )
    }

    /// The prepared lists this engine holds, over all peers: for a soak test to see that
    /// preparing happens once per peer and pairing and that removing a peer releases them.
    pub fn prepared(&self) -> PreparedCount {
        let all = self.prepared.values().flatten();
        PreparedCount {
            handles: 2 * all.clone().count(),
            entries: all
                .map(|p| p.local_entries.ranges.len() + p.remote_entries.ranges.len())
                .sum(),
        }
    }

    /// The path a READ of `runs` from `peer` would take now, without posting it (the runs
    /// are not checked against the registered lengths here; posting checks them).
    pub fn path_for(&self, peer: &str, runs: &[CopyRun]) -> NixlPath {
        let sides: Vec<_> = runs
            .iter()
            .map(|r| {
                (
                    r.dst_buffer,
                    r.dst_offset,
                    r.src_buffer,
                    r.src_offset,
                    r.len,
                )
            })
            .collect();
        match self.prepared_indices(peer, &sides) {
            Ok((_, local, _)) => NixlPath::Prepared {
                entries: local.len(),
            },
            Err(why) => NixlPath::Listed {
                descriptors: sides.iter().filter(|s| s.4 > 0).count(),
                why,
            },
        }
    }

    /// The first of `peer`'s prepared pairings that expresses `sides`, with its indices, or
    /// why none does.
    pub(super) fn prepared_indices(
        &self,
        peer: &str,
        sides: &[(u32, u64, u32, u64, u64)],
    ) -> Result<(&Prepared, Vec<i32>, Vec<i32>), String> {
        let pairings = match self.prepared.get(peer) {
            Some(p) if !p.is_empty() => p,
            _ => return Err(format!("no prepared lists for peer {peer:?}")),
        };
        let mut why = String::new();
        for p in pairings {
            match p.indices(sides) {
                Ok((local, remote)) => return Ok((p, local, remote)),
                Err(w) => why = w,
            }
        }
        Err(why)
    }
}

/// The NIXL descriptor list of one side's entries: each inside its buffer's registered length
/// (`lens`), all of one memory kind, at the buffer's base address plus its offset.
fn descriptor_list(
    side: &str,
    entries: &Entries,
    lens: &[u64],
    kinds: &[MemKind],
    bases: &[u64],
) -> Result<XferDescList<'static>, EngineError> {
    let Some(first) = entries.ranges.first() else {
        return Err(EngineError::Transport(format!(
            "nixl prepare: no {side} entries"
        )));
    };
    let kind = kinds
        .get(first.buffer as usize)
        .copied()
        .unwrap_or(MemKind::Host);
    let mut list = XferDescList::new(mem_type(kind)).map_err(|e| nixl_error("dlist", e))?;
    let device = match kind {
        MemKind::Host => 0,
        MemKind::Device { id } => id,
    };
    for r in &entries.ranges {
        let b = r.buffer as usize;
        let registered = lens.get(b).copied().unwrap_or(0);
        if r.offset
            .checked_add(r.len)
            .is_none_or(|end| end > registered)
        {
            return Err(EngineError::OutOfRegion {
                side: side.to_string(),
                buffer: r.buffer,
                offset: r.offset,
                len: r.len,
                registered,
            });
        }
        if kinds.get(b) != Some(&kind) {
            return Err(EngineError::Transport(format!(
                "nixl prepare: {side} entries span {kind:?} and {:?} memory",
                kinds.get(b)
            )));
        }
        let addr = bases.get(b).and_then(|base| base.checked_add(r.offset));
        let (Some(addr), Ok(len)) = (
            addr.and_then(|a| usize::try_from(a).ok()),
            usize::try_from(r.len),
        ) else {
            return Err(EngineError::Transport(format!(
                "nixl prepare: {side} entry of {} bytes at buffer {b} offset {} has no address \
                 on this machine",
                r.len, r.offset
            )));
        };
        list.add_desc(addr, len, device);
    }
    Ok(list)
}

#[cfg(test)]
mod tests {
    //! The entries and the mapping of runs onto them, without the NIXL library.
    use super::*;

    fn side(layout: &KvCacheLayout, first_buffer: u32, heads: Range<u64>) -> PrepareSide<'_> {
        PrepareSide {
            layout,
            first_buffer,
            heads,
        }
    }

    /// Each entry is the byte range `block_regions` gives; a head slice of a head-major page
    /// is one entry per (block, layer); the first buffer shifts every entry.
    #[test]
    fn entries_are_the_layouts_block_regions() {
        let l: KvCacheLayout = "kv L=2 B=3 N=16 H=4 D=8 dtype=f16 order=HND"
            .parse()
            .unwrap();
        let e = Entries::of(&side(&l, 2, 2..4), false).unwrap();
        assert_eq!(e.ranges.len(), 3 * 2);
        for b in 0..3 {
            for layer in 0..2 {
                let want = l.block_regions(b, layer..layer + 1, 2..4).unwrap();
                assert_eq!(want.len(), 1);
                let want = ByteRange {
                    buffer: 2 + want[0].buffer,
                    ..want[0]
                };
                assert!(e.ranges.contains(&want), "{want:?} missing");
            }
        }
        assert!(e.ranges.windows(2).all(|w| w[0] < w[1]), "sorted, distinct");
    }

    /// A token-major page's head slice is one range per token: refused, naming the count.
    #[test]
    fn a_token_major_head_slice_is_refused_with_its_range_count() {
        let l: KvCacheLayout = "kv L=2 B=3 N=16 H=4 D=8 dtype=f16 order=NHD"
            .parse()
            .unwrap();
        let why = Entries::of(&side(&l, 0, 0..2), false).unwrap_err();
        assert!(
            why.contains("16 ranges") && why.contains("at most 4"),
            "{why}"
        );
        assert!(!Entries::blocks_contiguous(&side(&l, 0, 0..4)));
    }

    /// A run covering consecutive entries maps onto their indices; one that starts or ends
    /// inside an entry, or crosses a gap, does not.
    #[test]
    fn runs_tile_whole_entries_only() {
        let r = |offset, len| ByteRange {
            buffer: 0,
            offset,
            len,
        };
        let e = Entries {
            ranges: vec![r(0, 64), r(64, 64), r(256, 64), r(320, 32)],
        };
        let mut out = Vec::new();
        assert!(e.tile(0, 0, 128, &mut out));
        assert_eq!(out, vec![(0, 64), (1, 64)]);
        out.clear();
        assert!(e.tile(0, 256, 96, &mut out));
        assert_eq!(out, vec![(2, 64), (3, 32)]);
        for (offset, len) in [(0, 32), (32, 32), (0, 192), (64, 256), (320, 64)] {
            out.clear();
            assert!(!e.tile(0, offset, len, &mut out), "{offset}+{len}");
        }
        out.clear();
        assert!(!e.tile(1, 0, 64, &mut out), "another buffer");
    }
}
