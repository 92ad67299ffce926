//! The op arguments of [`HostExec`](crate::HostExec): the contract's argument structs
//! (`WriteArgs`, `DecodeArgs`) over borrowed host activations, so the executor reads the
//! caller's slices without a copy. The `Backend` trait takes the same structs over its own
//! tensor handles (`WriteArgs<&B::Tensor>`). Their validation is the contract's
//! (`kvlayout::ops::check`).

use kvlayout::ops::{DecodeArgs, WriteArgs};

use crate::tensor::Activations;

pub(crate) use kvlayout::ops::{check_decode, check_write, DecodeShape};

/// New tokens' K and V for one layer, scattered by slot (`block * block_size + offset`,
/// negative = padding, skipped), as host activations: the arguments of
/// [`HostExec::write_kv`](crate::HostExec::write_kv) (the crate docs of `CpuBackend` show one).
pub type WriteKv<'a> = WriteArgs<'a, Activations<'a>>;

/// One decode step (one query token per sequence), the query as host activations: the
/// arguments of [`HostExec::paged_decode`](crate::HostExec::paged_decode).
pub type Decode<'a> = DecodeArgs<'a, Activations<'a>>;
