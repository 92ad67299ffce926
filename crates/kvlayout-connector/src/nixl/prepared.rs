//! Prepared descriptor lists: for one peer and one pairing of a local and a remote layout,
//! the byte ranges both layouts give per block (or per block and layer) for the heads they
//! exchange, handed to NIXL once (`prepXferDlist`), so that a transfer is made from indices
//! into them (`makeXferReq`, which merges consecutive indices) instead of fresh descriptor
//! lists. This module owns the entries (derived from the layouts through
//! [`KvCacheLayout::block_regions`], never from sizes), the mapping of a transfer's runs onto
//! them, and the path a transfer took ([`NixlPath`]). The engine's methods that prepare the
//! lists (the NIXL calls and the checks against the registered lengths) live in `prepare`.

use std::ops::Range;

use kvlayout::{ByteRange, KvCacheLayout};
use nixl_sys::XferDlistHandle;

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
