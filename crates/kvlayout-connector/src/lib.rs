//! # kvlayout-connector: KV blocks between serving instances
//!
//! This crate owns moving KV-cache blocks between two instances (a prefill and a decode
//! instance, say) whose caches may differ in layout, TP size and block size: the handshake
//! each side publishes ([`handshake`]), and the planner that turns two layouts and a block
//! mapping into byte regions on each side, merged into maximal runs contiguous on both
//! ([`plan`]), and the engines that move them ([`engine`]: in-process memcpy).
//!
//! It does not own layouts (the `kvlayout` crate does; every offset comes from there), and it
//! never infers a layout from a buffer's size or shape: each side states its layout in the
//! handshake, and the planner checks the two against each other.

#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod engine;
pub mod handshake;
pub mod plan;
