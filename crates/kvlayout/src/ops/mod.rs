//! The backend contract: the arguments of every op and their validation against a layout.
//!
//! Every backend (CPU, CUDA, HIP) calls these checks before it writes anything, so a bad slot
//! mapping, block table or block pair is refused the same way everywhere, with the index, the
//! value and the limit. Executing the ops is the backends' business; this module only decides
//! whether a call is well-formed. Pure: no unsafe, no I/O.
//!
//! - [`error`]: [`OpError`], the typed refusal.
//! - [`args`]: the op argument structs.
//! - [`check`]: the validations.

pub mod args;
pub mod check;
pub mod error;

pub use args::*;
pub use check::*;
pub use error::*;
