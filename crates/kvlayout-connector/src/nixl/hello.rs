//! [`Hello`], the message that carries a peer's handshake and its NIXL agent metadata
//! together, and [`blocks_written`], the blocks a failed or cancelled transfer leaves undefined.

use std::collections::HashMap;

use kvlayout::ops::CopyRun;
use kvlayout::{KvCacheLayout, LayoutError};

#[cfg(doc)]
use crate::engine::TransferEngine;
use crate::handshake::{HandshakeError, Limits, PeerMetadata};

/// The blocks of `layout` whose bytes (any layer, head or field) some run's destination
/// touches, ascending: after a failed or cancelled transfer into a cache of this layout, the
/// blocks not received.
pub fn blocks_written(layout: &KvCacheLayout, runs: &[CopyRun]) -> Result<Vec<u64>, LayoutError> {
    // Destination ranges per buffer, sorted and merged.
    let mut dst: HashMap<u32, Vec<(u64, u64)>> = HashMap::new();
    for r in runs.iter().filter(|r| r.len > 0) {
        let end = r.dst_offset.saturating_add(r.len);
        dst.entry(r.dst_buffer)
            .or_default()
            .push((r.dst_offset, end));
    }
    for ranges in dst.values_mut() {
        ranges.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
        for &(s, e) in ranges.iter() {
            match merged.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        *ranges = merged;
    }
    let hits = |buffer: u32, start: u64, end: u64| {
        dst.get(&buffer).is_some_and(|ranges| {
            // The first range ending after `start` is the only candidate.
            let i = ranges.partition_point(|&(_, e)| e <= start);
            ranges.get(i).is_some_and(|&(s, _)| s < end)
        })
    };
    let g = layout.geometry();
    let mut out = Vec::new();
    for block in 0..g.num_blocks {
        let touched = layout
            .block_regions(block, 0..g.num_layers, 0..g.num_kv_heads)?
            .iter()
            .any(|b| hits(b.buffer, b.offset, b.offset.saturating_add(b.len)));
        if touched {
            out.push(block);
        }
    }
    Ok(out)
}

/// What a peer sends to connect: its handshake ([`PeerMetadata::encode`]) and its NIXL agent
/// metadata ([`TransferEngine::local_metadata`]), in one message.
///
/// | bytes | field |
/// |---|---|
/// | 0..4 | magic `b"KVNX"` |
/// | 4..8 | handshake length `h`, u32 little-endian |
/// | 8..8+h | the handshake |
/// | 8+h..12+h | agent metadata length `m`, u32 little-endian |
/// | 12+h.. | the agent metadata, `m` bytes, nothing after |
///
/// ```
/// use kvlayout_connector::handshake::{CacheGroup, Limits, MemRegion, PeerMetadata};
/// use kvlayout_connector::nixl::Hello;
/// let layout: kvlayout::KvCacheLayout = "kv B=4 N=16 H=2 D=8 dtype=f16 order=NHD".parse()?;
/// let regions = layout.extents().iter().map(|x| MemRegion::host(1 << 40, x.end));
/// let group = CacheGroup {
///     name: "attn".into(),
///     layout: layout.clone(),
///     total_kv_heads: 2,
///     tp_size: 1,
///     tp_rank: 0,
///     regions: regions.collect(),
/// };
/// let peer = PeerMetadata { engine_id: "prefill".into(), groups: vec![group] };
/// let bytes = Hello { peer: peer.clone(), agent_metadata: b"md".to_vec() }.encode();
/// let back = Hello::decode(&bytes, &Limits::default())?;
/// assert_eq!((back.peer, back.agent_metadata), (peer, b"md".to_vec()));
/// // Cut short: refused with the lengths.
/// assert!(Hello::decode(&bytes[..bytes.len() - 1], &Limits::default()).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Hello {
    /// The peer's handshake.
    pub peer: PeerMetadata,
    /// Its NIXL agent metadata, for [`TransferEngine::add_peer`].
    pub agent_metadata: Vec<u8>,
}

impl Hello {
    /// The first four bytes.
    pub const MAGIC: [u8; 4] = *b"KVNX";

    /// The encoding (a part longer than `u32::MAX` bytes gets that length, which decoding
    /// refuses).
    pub fn encode(&self) -> Vec<u8> {
        let handshake = self.peer.encode();
        let md = &self.agent_metadata;
        let len32 = |n: usize| u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes();
        let mut out = Vec::with_capacity(12 + handshake.len() + md.len());
        out.extend_from_slice(&Self::MAGIC);
        out.extend_from_slice(&len32(handshake.len()));
        out.extend_from_slice(&handshake);
        out.extend_from_slice(&len32(md.len()));
        out.extend_from_slice(md);
        out
    }

    /// Decodes and checks a peer's message: the framing (magic, each length within
    /// `limits.max_body_bytes` and equal to what follows), then the handshake with
    /// [`PeerMetadata::decode`]. The agent metadata is opaque here; NIXL checks it when loaded.
    pub fn decode(bytes: &[u8], limits: &Limits) -> Result<Hello, HandshakeError> {
        let too_short = |needed: usize| HandshakeError::TooShort {
            len: bytes.len(),
            needed,
        };
        let magic: [u8; 4] = bytes
            .get(..4)
            .and_then(|m| m.try_into().ok())
            .ok_or(too_short(4))?;
        if magic != Self::MAGIC {
            return Err(HandshakeError::BadMagic {
                got: magic,
                expected: Self::MAGIC,
            });
        }
        // A length at `at`, bounded, and the `at + 4 + len` it ends at.
        let part = |at: usize| -> Result<(usize, usize), HandshakeError> {
            let len = bytes
                .get(at..at + 4)
                .and_then(|b| b.try_into().ok())
                .map(u32::from_le_bytes)
                .ok_or(too_short(at + 4))?;
            if u64::from(len) > limits.max_body_bytes {
                return Err(HandshakeError::BodyTooLarge {
                    len: len.into(),
                    limit: limits.max_body_bytes,
                });
            }
            let start = at + 4;
            let end = start.saturating_add(len as usize);
            if bytes.len() < end {
                return Err(HandshakeError::LengthMismatch {
                    declared: len.into(),
                    actual: (bytes.len() - start) as u64,
                });
            }
            Ok((start, end))
        };
        let (h0, h1) = part(4)?;
        let (m0, m1) = part(h1)?;
        if bytes.len() != m1 {
            return Err(HandshakeError::LengthMismatch {
                declared: (m1 - m0) as u64,
                actual: (bytes.len() - m0) as u64,
            });
        }
        Ok(Hello {
            peer: PeerMetadata::decode(&bytes[h0..h1], limits)?,
            agent_metadata: bytes[m0..m1].to_vec(),
        })
    }
}
