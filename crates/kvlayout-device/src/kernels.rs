//! The GPU kernels' side of the contract: the parameter struct each kernel takes
//! ([`params`], mirrored by `kernels-cuda/include/kvl_kernels.h`), the one function per op
//! that chooses its launch configuration from the descriptor and the op's validated shape
//! ([`launch`]), and the launches of each op with their argument blocks ([`calls`]). The host
//! emulator and the device backends all launch what [`calls`] builds.
//!
//! Pure: no unsafe, no I/O. Addresses in the parameter structs are device addresses as `u64`.

pub mod calls;
pub mod decode_paths;
pub mod launch;
pub mod params;

pub use calls::*;
pub use decode_paths::*;
pub use launch::*;
pub use params::*;
