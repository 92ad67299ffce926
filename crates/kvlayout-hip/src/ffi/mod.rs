//! Every call into the HIP runtime, and all of this crate's `unsafe`: the runtime functions,
//! and the owners of what they hand out — [`Stream`], [`Module`] with its [`Function`]s,
//! [`Allocation`] and [`Event`] — each released on drop. Every copy is checked against its
//! allocation's length here, before the runtime sees it.
//!
//! The functions are declared here rather than taken from `hip_sys::hiprt`, whose
//! declarations return `hipError_t` as a Rust enum: a runtime newer than those bindings may
//! return a code the enum lacks, and a Rust enum holding a value outside its variants is
//! undefined behaviour. Here a status is the C enum's integer (`Status`); same symbols,
//! same ABI. `hip-sys` links `libamdhip64` and supplies the handle types and flag values.
//!
//! By concern: `sys` (the declarations), `status` (a failing call as a typed error),
//! `runtime` (the runtime, devices, streams and events), `module` (code objects, kernels and
//! their launch) and `memory` (allocations and copies).

mod memory;
mod module;
mod runtime;
mod status;
mod sys;

pub(crate) use memory::Allocation;
pub(crate) use module::{Function, Module};
pub(crate) use runtime::{device_count, init, set_device, Event, Stream};
