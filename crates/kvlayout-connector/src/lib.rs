//! # kvlayout-connector: KV blocks between serving instances
//!
//! This crate owns moving KV-cache blocks between two instances (a prefill and a decode
//! instance, say) whose caches may differ in layout, TP size and block size:
//!
//! - [`handshake`]: what each side publishes, its cache groups ([`handshake::CacheGroup`]:
//!   layout, model heads, TP rank and size, registered regions), and the checks a receiver
//!   runs on a peer's.
//! - [`plan`]: the planner. From the local group, the remote groups and a block mapping, byte
//!   runs per remote rank, merged into maximal runs contiguous on both sides, every byte into
//!   its place. [`staged`]: a plan through a staging cache and a post-receive
//!   `scatter_blocks` on a backend, when the orders differ.
//! - [`engine`]: the engines that move runs ([`engine::MemcpyEngine`]: in-process memcpy), and
//!   [`nixl`]: the NIXL engine, between processes and machines (host memory over UCX; the
//!   library is loaded at run time, and its absence is an error, not an abort).
//! - [`executor`]: [`execute`] runs a direct or staged [`Plan`] on an engine to completion, or
//!   fails with an [`ExecuteError`] naming the local blocks and heads not received.
//!
//! A decode rank adds each remote rank's engine as a peer from its handshake, then per request
//! plans ([`plan::plan_pull`] or [`staged::plan_pull_staged`]) and calls [`execute`].
//!
//! It does not own layouts (the `kvlayout` crate does; every offset comes from there), nor
//! backends (a staged plan's post-receive runs on one the caller passes). It never infers a
//! layout from a buffer's size or shape: each side states its layout in the handshake, and the
//! planner checks the two against each other.

#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod engine;
pub mod executor;
pub mod handshake;
#[allow(unsafe_code)]
pub mod nixl;
pub mod plan;
pub mod staged;

pub use executor::{execute, ExecuteError, Plan};
