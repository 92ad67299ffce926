//! # kvlayout-connector: KV blocks between serving instances
//!
//! This crate owns moving KV-cache blocks between two instances (a prefill and a decode
//! instance, say) whose caches may differ in layout, TP size and block size: the handshake
//! each side publishes ([`handshake`]), and the planner that turns two layouts and a block
//! mapping into byte regions on each side, merged into maximal runs contiguous on both
//! ([`plan`]; [`staged`]: through a staging cache and a post-receive `scatter_blocks` when the
//! orders differ), and the engines that move them ([`engine`]: in-process memcpy).
//!
//! - [`nixl`]: the NIXL engine, between processes and machines (host memory over UCX; the
//!   library is loaded at run time, and its absence is an error, not an abort).
//!
//! It does not own layouts (the `kvlayout` crate does; every offset comes from there), and it
//! never infers a layout from a buffer's size or shape: each side states its layout in the
//! handshake, and the planner checks the two against each other.

#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod engine;
pub mod handshake;
#[allow(unsafe_code)]
pub mod nixl;
pub mod plan;
pub mod staged;
