//! The backend contract: the arguments of every op, their validation against a layout, the
//! plan of the block moves, and the trait every backend implements.
//!
//! Every backend (CPU, CUDA, HIP) and the KV connector call these checks before they write
//! anything, so a bad slot mapping, block table or block pair is refused the same way
//! everywhere, with the index, the value and the limit; and they move blocks by the same plan.
//! Executing the ops is the backends' business. Pure: no unsafe, no I/O.
//!
//! - [`error`]: [`OpError`], the typed refusal.
//! - [`args`]: the op argument structs.
//! - [`check`]: the validations.
//! - [`backend`]: the [`Backend`] trait every backend implements, with [`HostTensor`] and
//!   [`BufferShape`].
//! - [`moves`]: the block movers as one [`BlockMove`], validated into [`Moves`], and the
//!   two-sided [`MovePlan`] that executes them.
//! - [`dynamic`]: [`AnyBackend`], any backend held as one type (a backend chosen at run
//!   time).
//! - [`runs`]: the same moves as byte copies merged into maximal runs ([`copy_runs`]).
//! - [`run_set`]: those runs held compactly, a list repeated at a stride ([`RunSet`]).

pub mod args;
pub mod backend;
pub mod check;
pub mod dynamic;
pub mod error;
pub mod moves;
pub mod run_set;
pub mod runs;

pub use args::*;
pub use backend::*;
pub use check::*;
pub use dynamic::*;
pub use error::*;
pub use moves::*;
pub use run_set::*;
pub use runs::*;
