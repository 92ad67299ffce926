//! [`NixlEngine`]'s methods for prepared descriptor lists: preparing a pairing of layouts for
//! a peer (the entries checked against both sides' registered lengths and handed to NIXL
//! once), counting what is held, and finding a transfer's indices. The entries, the mapping
//! of runs onto them and the path a transfer took are `prepared`'s.

use kvlayout::ops::CopyRun;
use nixl_sys::{OptArgs, XferDescList};

use crate::engine::EngineError;
use crate::handshake::CacheGroup;
use crate::memory::{MemKind, Region};

use super::memory::mem_type;
use super::prepared::{Entries, Prepared, PreparedHandle};
use super::{nixl_error, NixlEngine, NixlPath, PrepareSide, PreparedCount};

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
