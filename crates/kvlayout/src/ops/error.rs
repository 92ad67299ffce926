//! Why an op was refused: the typed error every backend returns.

use thiserror::Error;

use crate::error::LayoutError;

/// Why an op was refused. Nothing has been written when an op returns one of these.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum OpError {
    /// A layout-level error.
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// A slot mapping entry past the cache.
    #[error(
        "slot_mapping[{token}] = {slot} is out of range (limit {limit} = num_blocks x block_size)"
    )]
    SlotOutOfRange {
        /// Token index.
        token: usize,
        /// Its slot.
        slot: i64,
        /// Exclusive limit.
        limit: u64,
    },
    /// Two tokens of one write naming the same slot (the result would depend on their order).
    #[error("slot_mapping[{token}] = {slot} repeats slot_mapping[{first}]")]
    DuplicateSlot {
        /// The later token.
        token: usize,
        /// The slot.
        slot: i64,
        /// The earlier token with that slot.
        first: usize,
    },
    /// A block table entry that is not a block of the cache.
    #[error("block_table[{seq}][{position}] = {block} is out of range (limit {limit})")]
    BlockOutOfRange {
        /// Sequence.
        seq: usize,
        /// Position in its row.
        position: usize,
        /// The entry.
        block: i64,
        /// Exclusive limit.
        limit: u64,
    },
    /// A sequence longer than the blocks it is given.
    #[error("seq_lens[{seq}] = {len} exceeds its {capacity} tokens of blocks ({blocks} per sequence x block size)")]
    SequenceTooLong {
        /// Sequence.
        seq: usize,
        /// Its length.
        len: u64,
        /// Blocks per row.
        blocks: usize,
        /// Tokens those blocks hold.
        capacity: u64,
    },
    /// A tensor with the wrong number of elements or shape.
    #[error("{what}: expected {expected}, got {got}")]
    Shape {
        /// Which argument.
        what: String,
        /// What the layout requires.
        expected: String,
        /// What was given.
        got: String,
    },
    /// A buffer too short for the layout's registered span.
    #[error("buffer {buffer} holds {len} bytes; the layout needs {needed}")]
    BufferTooShort {
        /// Buffer index.
        buffer: usize,
        /// Its length.
        len: u64,
        /// Required length (extent end).
        needed: u64,
    },
    /// A buffer whose start is not aligned for the elements it holds.
    #[error("buffer {buffer} starts at address {address:#x}, not a multiple of {align}")]
    Misaligned {
        /// Buffer index.
        buffer: usize,
        /// Its address.
        address: u64,
        /// Required alignment.
        align: u64,
    },
    /// Two caches that cannot exchange blocks.
    #[error("caches are incompatible: {0}")]
    Incompatible(String),
    /// A block pair that is out of range or conflicts with another.
    #[error("block pair {index} ({src} -> {dst}): {reason}")]
    BadPair {
        /// Index in the list.
        index: usize,
        /// Source block.
        src: u64,
        /// Destination block.
        dst: u64,
        /// Why.
        reason: String,
    },
    /// Host memory the machine could not provide for a cache's buffer.
    #[error("cannot allocate buffer {buffer}: {bytes} bytes")]
    OutOfMemory {
        /// Buffer index.
        buffer: usize,
        /// Bytes asked for.
        bytes: u64,
    },
    /// An op this layout's content does not support.
    #[error("{op} does not apply: {reason}")]
    Unsupported {
        /// The op.
        op: &'static str,
        /// Why.
        reason: String,
    },
    /// A kernel that failed while it ran (a trap, an access outside its memory, a launch over
    /// a limit): the backend's report. What it wrote before failing is unspecified.
    #[error("kernel {kernel} failed: {detail}")]
    Kernel {
        /// The kernel.
        kernel: &'static str,
        /// The backend's report.
        detail: String,
    },
}
