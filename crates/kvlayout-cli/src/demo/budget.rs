//! The demo's bounds on the whole run, checked before anything is allocated: the memory it
//! holds at once (every rank's cache copies as the demo holds them, staging and the memcpy
//! bound included) against [`MAX_DEMO_BYTES`] and the machine's available memory, and the
//! work of the verification against [`MAX_ELEMENTS`] and [`MAX_PRODUCTS`], so that a run
//! that is accepted finishes in seconds.
//!
//! It owns these estimates; it does not own the per-rank and per-prompt limits (the
//! scenario's flags) or the allocations themselves.

use super::scenario::Scenario;
use super::step::MAX_BOUND_BYTES;
use crate::CliError;

/// Most memory the demo holds at once, in bytes (4 GiB).
pub(crate) const MAX_DEMO_BYTES: u64 = 4 << 30;

/// Most K/V elements the verification compares byte for byte (tokens x layers x every decode
/// rank's heads x the stored row).
pub(crate) const MAX_ELEMENTS: u64 = 1 << 24;

/// Most multiply-adds of one reference decode of every query head (tokens x layers x query
/// heads x (key width + value width)); the verification runs it on both sides. The default
/// scenario takes 11.7 M; this bound is about 3 times that.
pub(crate) const MAX_PRODUCTS: u64 = 1 << 25;

/// Bytes the demo holds at once, at most:
/// - the prefill side: every rank's downloaded cache (kept to the end, moved into its engine
///   during the pull), plus the rank being filled: its backend cache and its zeros;
/// - the decode side: every rank's downloaded cache (kept for the verification), plus the
///   rank that runs: its backend cache, its zeros, its engine's buffers or staging (at most
///   one prefill and one decode rank's cache), the engine's copy it receives and its
///   download; with `--engine nixl`, the decode process holds that rank once more;
/// - the verification's host caches (one rank at a time) and the memcpy bound's two buffers.
pub(crate) fn peak_bytes(sc: &Scenario, nixl: bool) -> u128 {
    let (p, d) = (&sc.prefill, &sc.decode);
    let (rank_p, rank_d) = (u128::from(p.rank_bytes), u128::from(d.rank_bytes));
    let running_decode_rank = 5 * rank_d + rank_p;
    let prefill = (u128::from(p.tp) + 2) * rank_p;
    let decode = u128::from(d.tp) * rank_d + running_decode_rank * if nixl { 2 } else { 1 };
    prefill + decode + rank_p.max(rank_d) + 2 * u128::from(MAX_BOUND_BYTES)
}

fn gib(bytes: u128) -> f64 {
    bytes as f64 / f64::from(1u32 << 30)
}

/// Refuses a scenario past the memory cap, the machine's available memory or the work
/// bounds, in one line naming the limit.
pub(crate) fn check(sc: &Scenario, nixl: bool) -> Result<(), CliError> {
    let tokens: u128 = sc.prompts.iter().map(|&t| u128::from(t)).sum();
    let layers = u128::from(sc.layers);
    let d = &sc.decode;
    let row: u64 = d.layout.stored_fields().iter().map(|m| m.width).sum();
    let held_heads = u128::from(d.layout.geometry().num_kv_heads) * u128::from(d.tp);
    let elements = tokens * layers * held_heads * u128::from(row);
    if elements > u128::from(MAX_ELEMENTS) {
        return Err(CliError::Usage(format!(
            "the verification would compare {elements} K/V elements ({tokens} tokens x \
             {layers} layers x {held_heads} decode heads x {row}), more than the demo's \
             {MAX_ELEMENTS}: lower --prompts or --layers"
        )));
    }
    let products =
        tokens * layers * u128::from(sc.q_heads) * u128::from(sc.key_width + sc.value_width);
    if products > u128::from(MAX_PRODUCTS) {
        return Err(CliError::Usage(format!(
            "the reference decode would take {products} products ({tokens} tokens x {layers} \
             layers x {} query heads x {} key and value widths), more than the demo's \
             {MAX_PRODUCTS}: lower --prompts or --layers",
            sc.q_heads,
            sc.key_width + sc.value_width
        )));
    }
    let peak = peak_bytes(sc, nixl);
    let why = "the ranks' caches as the demo holds them, staging and the memcpy bound";
    if peak > u128::from(MAX_DEMO_BYTES) {
        return Err(CliError::Usage(format!(
            "the demo would hold {:.2} GiB at once ({why}), more than its cap of {} GiB: \
             lower --blocks, --layers, --tp or --prefill-tp",
            gib(peak),
            MAX_DEMO_BYTES >> 30
        )));
    }
    if let Some(free) = crate::common::memory::available_memory() {
        if peak > u128::from(free) {
            return Err(CliError::Usage(format!(
                "the demo would hold {:.2} GiB at once ({why}); this machine has {:.2} GiB \
                 available: lower --blocks, --layers, --tp or --prefill-tp",
                gib(peak),
                gib(u128::from(free))
            )));
        }
    }
    Ok(())
}
