//! # kvlayout-connector: KV blocks between serving instances
//!
//! This crate owns moving KV-cache blocks between two instances (a prefill and a decode
//! instance, say) whose caches may differ in layout, TP size and block size:
//!
//! - [`handshake`]: what each side publishes, its cache groups ([`handshake::CacheGroup`]:
//!   layout, model heads, TP rank and size, registered regions), and the checks a receiver
//!   runs on a peer's.
//! - [`mod@plan`]: the planner. From the local group, the remote groups and a block mapping, byte
//!   runs per remote rank, merged into maximal runs contiguous on both sides, every byte into
//!   its place; [`compact`] holds the same plan as runs repeated per layer. [`staged`]: a
//!   plan through a staging cache and a post-receive `scatter_blocks` on a backend, when the
//!   orders differ.
//! - [`engine`]: the engines that move runs ([`MemcpyEngine`]: in-process memcpy), and
//!   [`nixl`]: the NIXL engine, between processes and machines (over UCX; the library is
//!   loaded at run time, and its absence is an error, not an abort). Both register memory
//!   the engine owns or the caller lends ([`memory`]: [`Region`], host or device).
//! - [`executor`]: [`execute`] runs a direct or staged [`Plan`] on an engine to completion, or
//!   fails with an [`ExecuteError`] naming the local blocks and heads not received.
//! - [`pull`]: the two calls most users need. [`plan()`] plans a pull, direct or staged
//!   ([`PullMode::Auto`] takes the one with fewer descriptors and says why), and
//!   [`Pull::execute`] runs it. [`cost`]: [`plan_by_cost`] takes the cheaper plan under a
//!   [`CostModel`] (descriptors, wire, post-receive pass), which [`calibrate_memcpy`]
//!   measures.
//!
//! A decode rank adds each remote rank's engine as a peer from its handshake, then per request
//! calls [`plan()`] and [`Pull::execute`]. The main types are re-exported here.
//!
//! ```
//! use std::time::Duration;
//! use kvlayout::KvCacheLayout;
//! use kvlayout_connector::{plan, CacheGroup, MemcpyEngine, NoPostReceive, PullMode, Region};
//! use kvlayout_connector::{SeqBlocks, TransferEngine};
//!
//! // Two instances with the same layout (TP 1 each): a prefill cache and a decode cache.
//! let layout: KvCacheLayout = "kv L=2 B=4 N=16 H=2 D=8 dtype=bf16 order=LBNHC".parse()?;
//! let group = |layout: &KvCacheLayout| CacheGroup {
//!     name: "attn".into(),
//!     layout: layout.clone(),
//!     total_kv_heads: 2,
//!     tp_size: 1,
//!     tp_rank: 0,
//!     regions: Vec::new(), // planning reads no region
//! };
//! let len = layout.extents()[0].end as usize;
//! let prefill_cache: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
//! let mut decode_cache = vec![0u8; len];
//!
//! // One sequence of 40 tokens: prefill blocks 2, 0, 3 become decode blocks 1, 3, 0.
//! let seq = SeqBlocks { remote: vec![2, 0, 3], local: vec![1, 3, 0], tokens: 40 };
//! let pull = plan(&group(&layout), &[group(&layout)], &[seq], PullMode::Auto)?;
//! assert_eq!(pull.plan.kind(), "direct");
//!
//! let prefill = MemcpyEngine::new("doc-prefill", vec![prefill_cache.clone()])?;
//! MemcpyEngine::scope("doc-decode", vec![Region::host(&mut decode_cache)], |decode| {
//!     let metadata = prefill.local_metadata()?;
//!     decode.add_peer("doc-prefill", &metadata, &prefill.regions())?;
//!     let timeout = Duration::from_secs(5);
//!     pull.execute(decode, &["doc-prefill"], &mut NoPostReceive, b"done", timeout)?;
//!     Ok::<_, Box<dyn std::error::Error>>(())
//! })??;
//! // Block 2's first bytes landed in decode block 1 (each block spans a quarter of a layer).
//! let block = len / 8;
//! assert_eq!(decode_cache[block..block + 64], prefill_cache[2 * block..2 * block + 64]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! It does not own layouts (the `kvlayout` crate does; every offset comes from there), nor
//! backends (a staged plan's post-receive runs on one the caller passes). It never infers a
//! layout from a buffer's size or shape: each side states its layout in the handshake, and the
//! planner checks the two against each other.

#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod compact;
pub mod cost;
pub mod engine;
pub mod executor;
pub mod handshake;
#[allow(unsafe_code)]
pub mod memory;
#[allow(unsafe_code)]
pub mod nixl;
pub mod plan;
pub mod pull;
pub mod staged;
#[allow(unsafe_code)]
pub mod stream_copy;

pub use compact::{plan_pull_compact, plan_pull_compact_into, CompactPlan, CompactTransfer};
pub use cost::{calibrate_memcpy, choose_by_cost, plan_by_cost, Cost, CostModel};
pub use engine::{wait, EngineError, MemcpyEngine, TransferEngine};
pub use executor::{execute, ExecuteError, Plan};
pub use handshake::{
    check_compatible, Admission, CacheGroup, HandshakeError, KnownPeers, Limits, MemRegion,
    PeerMetadata,
};
pub use kvlayout::ops::{CopyRun, RunSet};
pub use memory::{MemKind, Region};
pub use nixl::{NixlEngine, NixlOptions};
pub use plan::{plan_pull, plan_pull_into, PlanError, SeqBlocks, TransferPlan};
pub use pull::{plan, Alternative, NoPostReceive, Pull, PullMode, PullPlan};
pub use staged::{
    plan_pull_staged, PostReceive, ReceiveError, Scatter, StagedPlan, StagedTransfer,
};
