//! The byte encoding: a 12-byte header, then a JSON body.
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | magic `b"KVLH"` |
//! | 4..6 | version, u16 little-endian ([`VERSION`]) |
//! | 6..8 | reserved, u16, 0 |
//! | 8..12 | body length in bytes, u32 little-endian |
//! | 12.. | body: `{"engine_id", "groups": [{"name", "layout", "total_kv_heads", "tp_size", "tp_rank", "regions": [{"base", "len", "device" (GPU memory only)}], "compat_hash"}]}` |
//!
//! `layout` is the layout's versioned JSON document ([`KvCacheLayout::to_json`]) as a string,
//! parsed back by [`KvCacheLayout::from_json`]. Unknown keys are refused at every level.
//! Decoding reads the magic and version before anything else, then the body length.

use kvlayout::KvCacheLayout;
use serde::{Deserialize, Serialize};

use super::{check_engine_and_count, CacheGroup, HandshakeError, Limits, MemRegion, PeerMetadata};

/// The first four bytes of every encoding.
pub const MAGIC: [u8; 4] = *b"KVLH";

/// Version written by this build and the only one it reads.
pub const VERSION: u16 = 1;

/// Bytes before the body: magic, version, reserved, body length.
pub const HEADER_BYTES: usize = 12;

/// Longest peer-supplied text an error message quotes, in bytes.
const QUOTE_BYTES: usize = 256;

/// The body as sent.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WirePeer {
    engine_id: String,
    groups: Vec<WireGroup>,
}

/// One group as sent.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireGroup {
    name: String,
    layout: String,
    total_kv_heads: u64,
    tp_size: u64,
    tp_rank: u64,
    regions: Vec<MemRegion>,
    compat_hash: String,
}

/// At most [`QUOTE_BYTES`] of `text`, cut at a character boundary, marked when cut.
fn quote(text: &str) -> String {
    if text.len() <= QUOTE_BYTES {
        return text.to_string();
    }
    let mut end = QUOTE_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes)", &text[..end], text.len())
}

/// Reads a little-endian u16 at `at` (the caller has checked the length).
fn le_u16(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([bytes[at], bytes[at + 1]])
}

impl PeerMetadata {
    /// The encoding: header, then the JSON body with each group's hash. A body longer than
    /// `u32::MAX` bytes gets the length `u32::MAX`, which decoding refuses.
    pub fn encode(&self) -> Vec<u8> {
        let wire = WirePeer {
            engine_id: self.engine_id.clone(),
            groups: self
                .groups
                .iter()
                .map(|g| WireGroup {
                    name: g.name.clone(),
                    layout: g.layout.to_json(),
                    total_kv_heads: g.total_kv_heads,
                    tp_size: g.tp_size,
                    tp_rank: g.tp_rank,
                    regions: g.regions.clone(),
                    compat_hash: g.compat_hash(),
                })
                .collect(),
        };
        // Strings, integers and sequences always serialize.
        let body = serde_json::to_vec(&wire).unwrap_or_default();
        let len = u32::try_from(body.len()).unwrap_or(u32::MAX);
        let mut out = Vec::with_capacity(HEADER_BYTES + body.len());
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// Decodes and checks a peer's encoding in two phases: the header (magic, version, body
    /// length against `limits` and the bytes present), then the body (JSON, counts, names,
    /// each layout, TP and heads, regions, and the carried hashes).
    pub fn decode(bytes: &[u8], limits: &Limits) -> Result<PeerMetadata, HandshakeError> {
        let body = decode_header(bytes, limits)?;
        let wire: WirePeer = serde_json::from_slice(body).map_err(|e| HandshakeError::Json {
            message: quote(&e.to_string()),
        })?;
        check_engine_and_count(&wire.engine_id, wire.groups.len(), limits)?;
        let groups = wire
            .groups
            .into_iter()
            .enumerate()
            .map(|(index, g)| decode_group(index, g, limits))
            .collect::<Result<Vec<_>, _>>()?;
        let peer = PeerMetadata {
            engine_id: wire.engine_id,
            groups,
        };
        peer.check_unique_names()?;
        Ok(peer)
    }
}

/// Phase one: the header. Returns the body.
fn decode_header<'a>(bytes: &'a [u8], limits: &Limits) -> Result<&'a [u8], HandshakeError> {
    let too_short = |needed| HandshakeError::TooShort {
        len: bytes.len(),
        needed,
    };
    // Magic and version first: an unknown version is refused before its layout is assumed.
    let [m0, m1, m2, m3, ..] = *bytes else {
        return Err(too_short(HEADER_BYTES));
    };
    if [m0, m1, m2, m3] != MAGIC {
        return Err(HandshakeError::BadMagic {
            got: [m0, m1, m2, m3],
            expected: MAGIC,
        });
    }
    if bytes.len() < 6 {
        return Err(too_short(HEADER_BYTES));
    }
    let version = le_u16(bytes, 4);
    if version != VERSION {
        return Err(HandshakeError::UnsupportedVersion {
            got: version,
            supported: VERSION,
        });
    }
    if bytes.len() < HEADER_BYTES {
        return Err(too_short(HEADER_BYTES));
    }
    let reserved = le_u16(bytes, 6);
    if reserved != 0 {
        return Err(HandshakeError::ReservedNonZero { got: reserved });
    }
    let declared = u64::from(u32::from_le_bytes([
        bytes[8], bytes[9], bytes[10], bytes[11],
    ]));
    if declared > limits.max_body_bytes {
        return Err(HandshakeError::BodyTooLarge {
            len: declared,
            limit: limits.max_body_bytes,
        });
    }
    let body = &bytes[HEADER_BYTES..];
    let actual = body.len() as u64;
    if declared != actual {
        return Err(HandshakeError::LengthMismatch { declared, actual });
    }
    Ok(body)
}

/// Phase two, one group: name, layout, the group's checks, then the carried hash.
fn decode_group(index: usize, g: WireGroup, limits: &Limits) -> Result<CacheGroup, HandshakeError> {
    super::check_name(
        || format!("group {index} name"),
        &g.name,
        limits.max_name_bytes,
    )?;
    let layout = KvCacheLayout::from_json(&g.layout).map_err(|source| HandshakeError::Layout {
        group: index,
        source,
    })?;
    let group = CacheGroup {
        name: g.name,
        layout,
        total_kv_heads: g.total_kv_heads,
        tp_size: g.tp_size,
        tp_rank: g.tp_rank,
        regions: g.regions,
    };
    group.check(index, limits)?;
    let computed = group.compat_hash();
    if g.compat_hash != computed {
        return Err(HandshakeError::HashMismatch {
            group: index,
            carried: quote(&g.compat_hash),
            computed,
        });
    }
    Ok(group)
}
