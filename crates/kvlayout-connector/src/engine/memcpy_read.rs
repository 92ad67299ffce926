//! The memcpy engine's read: checks runs once per transfer, copies them under the two pools'
//! locks (streamed past the caches for large transfers), notifies the peer. Owns the copy
//! only; registration and peers are [`super::MemcpyEngine`]'s.

use std::sync::{Arc, PoisonError};

use kvlayout::ops::CopyRun;

use super::{check_runs, registry, Copied, EngineError, MemcpyEngine};
use crate::stream_copy::{stream_fence, STREAM_MIN_RUN_BYTES};

impl MemcpyEngine {
    /// Copies `runs` (`bytes` in all) from `peer` once `checked` (runs bounding them all) lie
    /// inside both sides' memory, under the two pools' locks, then notifies the peer. Streams
    /// the stores past the caches ([`crate::stream_copy`]) for a transfer of at least
    /// [`MemcpyEngine::set_stream_min_bytes`].
    pub(super) fn copy_runs(
        &mut self,
        peer: &str,
        checked: &[CopyRun],
        (runs, bytes): (impl Iterator<Item = CopyRun>, u64),
        notify: &[u8],
    ) -> Result<Copied, EngineError> {
        let (pool, remote_lens) = self
            .peers
            .get(peer)
            .ok_or_else(|| EngineError::UnknownPeer(peer.to_string()))?;
        if Arc::ptr_eq(pool, &self.local) {
            return Err(EngineError::Transport(
                "an engine reading from itself".into(),
            ));
        }
        // Two engines may read from each other: take the two locks in address order.
        let (src, dst) = if Arc::as_ptr(pool) < Arc::as_ptr(&self.local) {
            let src = pool.read().unwrap_or_else(PoisonError::into_inner);
            (
                src,
                self.local.write().unwrap_or_else(PoisonError::into_inner),
            )
        } else {
            let dst = self.local.write().unwrap_or_else(PoisonError::into_inner);
            (pool.read().unwrap_or_else(PoisonError::into_inner), dst)
        };
        // The peer's registered lengths bound the runs, and so do its actual regions (none
        // once it is dropped or its scope ended).
        let bound: Vec<u64> = remote_lens
            .iter()
            .zip(src.iter())
            .map(|(a, b)| (*a).min(b.len() as u64))
            .collect();
        if src.is_empty() && !remote_lens.is_empty() {
            return Err(EngineError::Transport(format!(
                "peer {peer:?} no longer registers its memory (dropped, or its scope ended)"
            )));
        }
        if dst.is_empty() && !checked.is_empty() {
            return Err(EngineError::Transport(format!(
                "engine {:?} registers no memory (none was given, or its scope ended)",
                self.name
            )));
        }
        let local_lens: Vec<u64> = dst.iter().map(|b| b.len() as u64).collect();
        check_runs(checked, peer, &bound, &local_lens)?;
        let stream = bytes >= self.stream_min_bytes;
        for r in runs {
            let (s, d, n) = (r.src_offset as usize, r.dst_offset as usize, r.len as usize);
            let (to, from) = (&dst[r.dst_buffer as usize], &src[r.src_buffer as usize]);
            if stream && n >= STREAM_MIN_RUN_BYTES {
                to.stream_from(d, from, s, n);
            } else {
                to.copy_from(d, from, s, n);
            }
        }
        stream_fence();
        drop((src, dst));
        let reg = registry().lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, inbox)) = reg.get(peer) {
            inbox
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((self.name.clone(), notify.to_vec()));
        }
        Ok(Copied { bytes })
    }
}
