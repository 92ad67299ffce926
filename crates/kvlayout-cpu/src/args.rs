//! The CPU backend's op arguments: the contract's argument structs over host activations.
//! Their validation is the contract's (`kvlayout::ops::check`).

use kvlayout::ops::{DecodeArgs, WriteArgs};

use crate::tensor::Activations;

pub(crate) use kvlayout::ops::{check_decode, check_write, DecodeShape};

/// New tokens' K and V for one layer, scattered by slot (`block * block_size + offset`,
/// negative = padding, skipped), as host activations.
pub type WriteKv<'a> = WriteArgs<'a, Activations<'a>>;

/// One decode step (one query token per sequence), the query as host activations.
pub type Decode<'a> = DecodeArgs<'a, Activations<'a>>;
