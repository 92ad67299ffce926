//! What a decode step allocates besides its cache, sized before anything is allocated.

use super::{usage, StepArgs, WRITE_CHUNK};
use crate::common::units;
use crate::CliError;

/// What the step allocates besides the cache (which `--max-cache-gib` limits), sized with
/// checked arithmetic before anything is allocated.
pub(super) struct Footprint {
    /// Query elements.
    pub(super) query: usize,
    /// Bytes of the read bound's buffer per thread.
    pub(super) bound_per_thread: usize,
    /// Every byte above together: query, output, one write chunk's keys and values, the read
    /// bound's buffers.
    pub(super) total_bytes: u64,
}

impl Footprint {
    pub(super) fn of(
        a: &StepArgs,
        q_heads: u64,
        kv_heads: u64,
        qk: u64,
        vw: u64,
        threads: usize,
    ) -> Result<Self, CliError> {
        let too_big = |what: &str| {
            usage(format!(
                "{what} overflows 64 bits (--seqs {}, --q-heads {q_heads}, --context {}, \
                 --bound-mib {})",
                a.seqs, a.context, a.bound_mib
            ))
        };
        let product = |what: &str, xs: &[u64]| -> Result<u64, CliError> {
            xs.iter()
                .try_fold(1u64, |n, &x| n.checked_mul(x))
                .ok_or_else(|| too_big(what))
        };
        let seqs = a.seqs as u64;
        let query = product("the query's size", &[seqs, q_heads, qk, 4])?;
        let out = product("the output's size", &[seqs, q_heads, vw, 4])?;
        let chunk = (a.context as u64 * seqs).min(WRITE_CHUNK as u64);
        let write = product("a write chunk's size", &[chunk, kv_heads, qk + vw, 4])?;
        let bound_per_thread = product("the read bound's buffer", &[a.bound_mib as u64, 1 << 20])?;
        let bound = product(
            "the read bound's buffers",
            &[bound_per_thread, threads as u64],
        )?;
        let total_bytes = [query, out, write, bound]
            .iter()
            .try_fold(0u64, |n, &x| n.checked_add(x))
            .ok_or_else(|| too_big("the step's memory"))?;
        let to_usize = |x: u64| usize::try_from(x).map_err(|_| too_big("a buffer"));
        Ok(Footprint {
            query: to_usize(query / 4)?,
            bound_per_thread: to_usize(bound_per_thread)?,
            total_bytes,
        })
    }

    /// Refuses a step that needs more than `available` bytes of memory (when known).
    pub(super) fn fits(&self, available: Option<u64>) -> Result<(), CliError> {
        match available {
            Some(free) if self.total_bytes > free => Err(usage(format!(
                "the step needs {:.2} GiB of memory besides the cache (query, output, a write \
                 chunk, the read bound's buffers); this machine has {:.2} GiB available: lower \
                 --q-heads, --seqs or --bound-mib",
                units::gib(self.total_bytes),
                units::gib(free)
            ))),
            _ => Ok(()),
        }
    }
}
