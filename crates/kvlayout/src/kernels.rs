//! The GPU kernels' side of the contract: the parameter struct each kernel takes
//! ([`params`], mirrored by `kernels-cuda/include/kvl_kernels.h`) and the one function per op
//! that chooses its launch configuration from the descriptor and the op's validated shape
//! ([`launch`]). The host emulator uses them now; the device backends use the same ones.
//!
//! Pure: no unsafe, no I/O. Addresses in the parameter structs are device addresses as `u64`.

pub mod launch;
pub mod params;

pub use launch::*;
pub use params::*;
