//! The one error type of the handshake: each refusal names the group, the value and the limit.

use kvlayout::LayoutError;
use thiserror::Error;

/// Why a peer's metadata, or a byte range asked of it, is refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum HandshakeError {
    /// The encoding is shorter than its fixed header.
    #[error("handshake is {len} bytes, shorter than the {needed}-byte header")]
    TooShort {
        /// Bytes received.
        len: usize,
        /// Bytes the header needs.
        needed: usize,
    },
    /// The first four bytes are not the handshake magic.
    #[error("handshake magic is {got:?}, expected {expected:?}")]
    BadMagic {
        /// The four bytes received.
        got: [u8; 4],
        /// The magic, `b"KVLH"`.
        expected: [u8; 4],
    },
    /// A format version this build does not read.
    #[error("handshake version {got} is not supported (this build reads version {supported})")]
    UnsupportedVersion {
        /// The version received.
        got: u16,
        /// The version this build reads.
        supported: u16,
    },
    /// The reserved header field is not zero.
    #[error("reserved header field is {got}, must be 0 in version 1")]
    ReservedNonZero {
        /// The value received.
        got: u16,
    },
    /// The declared body length is over the limit.
    #[error("handshake body declares {len} bytes, over the limit of {limit}")]
    BodyTooLarge {
        /// Declared length.
        len: u64,
        /// [`Limits::max_body_bytes`](crate::handshake::Limits::max_body_bytes).
        limit: u64,
    },
    /// The declared body length is not the number of bytes after the header.
    #[error("handshake body declares {declared} bytes, but {actual} bytes follow the header")]
    LengthMismatch {
        /// Declared length.
        declared: u64,
        /// Bytes after the header.
        actual: u64,
    },
    /// The body is not the expected JSON.
    #[error("handshake body: {message}")]
    Json {
        /// The parser's message (with line and column).
        message: String,
    },
    /// The peer lists no cache group.
    #[error("handshake lists no cache group")]
    NoGroups,
    /// The peer lists more cache groups than allowed.
    #[error("handshake lists {count} cache groups, over the limit of {limit}")]
    TooManyGroups {
        /// Groups listed.
        count: usize,
        /// [`Limits::max_groups`](crate::handshake::Limits::max_groups).
        limit: usize,
    },
    /// An engine id or group name is empty.
    #[error("{what} is empty")]
    EmptyName {
        /// Which name, e.g. `group 2 name`.
        what: String,
    },
    /// An engine id or group name is too long.
    #[error("{what} is {len} bytes, over the limit of {limit}")]
    NameTooLong {
        /// Which name, e.g. `engine id`.
        what: String,
        /// Its length in bytes.
        len: usize,
        /// [`Limits::max_name_bytes`](crate::handshake::Limits::max_name_bytes).
        limit: usize,
    },
    /// Two groups share a name.
    #[error("groups {first} and {second} are both named '{name}'")]
    DuplicateGroup {
        /// The shared name.
        name: String,
        /// Index of the first group with it.
        first: usize,
        /// Index of the second.
        second: usize,
    },
    /// A group's layout fails to parse or validate.
    #[error("group {group} layout: {source}")]
    Layout {
        /// Group index.
        group: usize,
        /// The layout's own error.
        source: LayoutError,
    },
    /// A group registers a number of regions other than its layout's buffers.
    #[error("group {group} registers {count} regions, but its layout has {buffers} buffers")]
    RegionCount {
        /// Group index.
        group: usize,
        /// Regions listed.
        count: usize,
        /// Buffers of the layout.
        buffers: usize,
    },
    /// A TP size of zero or over the limit.
    #[error("group {group} tp_size {tp_size} is outside 1..={limit}")]
    TpSize {
        /// Group index.
        group: usize,
        /// TP size given.
        tp_size: u64,
        /// [`Limits::max_tp`](crate::handshake::Limits::max_tp).
        limit: u64,
    },
    /// A TP rank not below the TP size.
    #[error("group {group} tp_rank {tp_rank} is not below tp_size {tp_size}")]
    TpRank {
        /// Group index.
        group: usize,
        /// TP rank given.
        tp_rank: u64,
        /// TP size given.
        tp_size: u64,
    },
    /// A model with zero KV heads.
    #[error("group {group} total_kv_heads must be at least 1, got 0")]
    ZeroTotalHeads {
        /// Group index.
        group: usize,
    },
    /// The model's KV heads do not split over the TP size.
    #[error(
        "group {group}: {total_kv_heads} KV heads do not split over tp_size {tp_size}: {reason}"
    )]
    TpSplitRefused {
        /// Group index.
        group: usize,
        /// The model's KV heads.
        total_kv_heads: u64,
        /// TP size given.
        tp_size: u64,
        /// Why.
        reason: String,
    },
    /// The rank's layout holds another number of heads than TP gives it.
    #[error(
        "group {group} layout holds {held} heads, but rank {tp_rank} of tp_size {tp_size} over \
         {total_kv_heads} KV heads holds {expected}"
    )]
    HeadsMismatch {
        /// Group index.
        group: usize,
        /// Heads of the layout.
        held: u64,
        /// Heads the rank must hold.
        expected: u64,
        /// The model's KV heads.
        total_kv_heads: u64,
        /// TP size.
        tp_size: u64,
        /// TP rank.
        tp_rank: u64,
    },
    /// A region whose end does not fit in 64 bits.
    #[error("group {group} region {buffer}: base {base} + len {len} overflows u64")]
    RegionOverflow {
        /// Group index.
        group: usize,
        /// Buffer (region) index.
        buffer: usize,
        /// Base address.
        base: u64,
        /// Length.
        len: u64,
    },
    /// A region shorter than its buffer's registered span (padding included).
    #[error("group {group} region {buffer} is {len} bytes, shorter than the layout's registered span of {needed}")]
    RegionTooSmall {
        /// Group index.
        group: usize,
        /// Buffer (region) index.
        buffer: usize,
        /// Registered length.
        len: u64,
        /// The layout's span end for the buffer.
        needed: u64,
    },
    /// Two regions of one group share bytes.
    #[error("group {group} regions {first} [{first_base:#x}, +{first_len}) and {second} [{second_base:#x}, +{second_len}) overlap")]
    RegionsOverlap {
        /// Group index.
        group: usize,
        /// One region.
        first: usize,
        /// Its base.
        first_base: u64,
        /// Its length.
        first_len: u64,
        /// The other region.
        second: usize,
        /// Its base.
        second_base: u64,
        /// Its length.
        second_len: u64,
    },
    /// The carried compatibility hash is not the one its group computes to.
    #[error("group {group} compat_hash is '{carried}', but its fields hash to '{computed}'")]
    HashMismatch {
        /// Group index.
        group: usize,
        /// Hash in the encoding.
        carried: String,
        /// Hash recomputed from the group.
        computed: String,
    },
    /// Two groups differ in a field the compatibility hash covers.
    #[error("incompatible cache groups: {field}: {local} vs {remote}")]
    Incompatible {
        /// The first differing covered field, e.g. `dtype`.
        field: &'static str,
        /// Its local value.
        local: String,
        /// Its remote value.
        remote: String,
    },
    /// A transfer names a buffer the group does not have.
    #[error("buffer {buffer} does not exist: the group registers {buffers} regions")]
    NoSuchBuffer {
        /// Buffer asked for.
        buffer: usize,
        /// Regions registered.
        buffers: usize,
    },
    /// A transfer's byte range leaves its registered region.
    #[error("bytes [{offset}, {offset} + {len}) of buffer {buffer} leave its registered region of {region_len} bytes")]
    OutsideRegion {
        /// Buffer index.
        buffer: usize,
        /// Offset in the buffer.
        offset: u64,
        /// Length of the range.
        len: u64,
        /// Length registered.
        region_len: u64,
    },
    /// A peer seen before connects again with a different layout, TP rank or size, model
    /// heads or set of groups ([`KnownPeers`](crate::handshake::KnownPeers)).
    #[error("peer {peer:?} reconnected with a changed {field} in group {group:?}: {before} before, {after} now")]
    PeerChanged {
        /// The peer's engine id.
        peer: String,
        /// The group (`*` for the set of groups).
        group: String,
        /// The first differing field, e.g. `layout.placement.order` or `tp_rank`.
        field: String,
        /// Its value at the first connect.
        before: String,
        /// Its value now.
        after: String,
    },
}
