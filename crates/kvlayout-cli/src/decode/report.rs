//! What one `kvlayout decode` step reports: its figures, as text (one line per aspect) or as
//! JSON. It does not measure anything (the step in [`super`] does).

use kvlayout_cpu::tolerance::Tolerance;
use serde::Serialize;

use crate::common::units;

/// What one `kvlayout decode` measured.
#[derive(Debug, Serialize)]
pub(crate) struct StepReport {
    pub layout: String,
    pub cache_bytes: u64,
    pub layer: u64,
    pub seqs: usize,
    pub context: u32,
    pub window: Option<u64>,
    pub soft_cap: Option<f32>,
    pub q_heads: u64,
    pub kv_heads: u64,
    pub blocks_used: usize,
    pub seed: u64,
    /// The dump the cache (and the step's inputs it holds) came from; `null`: filled by
    /// `write_kv`.
    pub cache_from: Option<String>,
    /// The dump the block table and queries came from; `null`: generated from the seed.
    pub table_from: Option<String>,
    /// The CPU: the features the kernel builds check that it has, and those
    /// `KVLAYOUT_CPU_HIDE` hid from the backend.
    pub cpu: crate::cpu::CpuReport,
    /// The backend the step ran on, by the name it was opened by.
    pub backend: String,
    pub kernels: String,
    /// Why this build ran (chosen with `--kernels`, named by `KVLAYOUT_KERNELS`, the first
    /// the CPU runs, or timed against the other AVX-512 build).
    pub kernels_why: String,
    pub threads: usize,
    /// Time of the `write_kv` calls, which are the first writes to the cache's pages.
    pub write_kv_ms: f64,
    /// Sequences compared with the reference (the first ones).
    pub checked_seqs: usize,
    /// Largest `|fast - reference|` over the checked outputs, relative to the magnitude of the
    /// values its row combined (scales included).
    pub max_error: f64,
    /// The largest error as a fraction of its bound (at most 1 passes): each output element may
    /// differ by `values * (relative + per_logit * logits)` of its row's magnitudes.
    pub error_to_bound: f64,
    /// The tolerance of the kernel build that ran, for this cache's dtype.
    pub tolerance: ToleranceReport,
    /// K and V bytes one step reads (each stored element of the attended tokens once, inline
    /// scales included).
    pub kv_bytes: u64,
    pub runs: usize,
    pub step_ms_median: f64,
    pub step_ms_best: f64,
    pub kv_gb_s_median: f64,
    pub read_gb_s_median: f64,
    pub ratio_median: f64,
    pub ratio_best: f64,
    /// The decode's page pattern with no compute, as a fraction of the sequential read
    /// (`ReadBound::paged_fraction`): on hosts that read scattered pages far slower than
    /// sequentially, the bound the decode is held to.
    pub paged_bound: f64,
    /// `ratio_median / paged_bound`.
    pub ratio_to_paged_bound: f64,
}

/// A [`Tolerance`] as the report states it.
#[derive(Debug, Serialize)]
pub(crate) struct ToleranceReport {
    /// `f32` or `bf16`: the products the kernel build takes on this dtype's rows.
    pub products: &'static str,
    pub relative: f64,
    pub per_logit: f64,
}

impl ToleranceReport {
    pub(crate) fn of(t: Tolerance) -> Self {
        ToleranceReport {
            products: if t == Tolerance::BF16_PRODUCTS {
                "bf16"
            } else {
                "f32"
            },
            relative: t.relative,
            per_logit: t.per_logit,
        }
    }
}

impl StepReport {
    pub(crate) fn passed(&self) -> bool {
        self.error_to_bound <= 1.0
    }

    pub(crate) fn to_text(&self) -> String {
        let gib = units::gib(self.cache_bytes);
        let verdict = if self.passed() { "ok" } else { "FAILED" };
        format!(
            "layout   {} ({gib:.2} GiB)\n\
             step     layer {}: {} sequences x {} tokens{}; query heads {}, KV heads {}; \
             {} blocks of {}\n\
             {}\n\
             check    the first {} of {} sequences against the f64 reference: max error \
             {:.1e} of the values' magnitude, {:.3} of its bound ({} products: {:.1e} + \
             {:.1e} x the logits' magnitude): {verdict}\n\
             speed    {} ({} kernels, {} threads): {:.1} MiB of K and V per step, median \
             {:.3} ms = {:.1} GB/s\n\
             \x20        {:.2} x the read bandwidth of this run ({:.1} GB/s), best {:.2}; \
             {} runs, each right after a read pass\n\
             \x20        {:.2} x the paged bound (the decode's page pattern with no compute \
             reads {:.2} of the sequential read)\n\
             kernels  {}: {}\n\
             cpu      {}\n",
            self.layout,
            self.layer,
            self.seqs,
            self.context,
            self.window
                .map(|w| format!(", window {w}"))
                .into_iter()
                .chain(self.soft_cap.map(|c| format!(", soft-cap {c}")))
                .collect::<String>(),
            self.q_heads,
            self.kv_heads,
            self.blocks_used,
            match &self.table_from {
                Some(path) => format!("the block table of {path}"),
                None => format!("a random block table (seed {})", self.seed),
            },
            match &self.cache_from {
                Some(path) => format!("cache    from {path} (no write_kv)"),
                None => format!(
                    "write_kv {} tokens in {:.1} ms (the first writes to the cache's pages)",
                    self.seqs as u64 * u64::from(self.context),
                    self.write_kv_ms
                ),
            },
            self.checked_seqs,
            self.seqs,
            self.max_error,
            self.error_to_bound,
            self.tolerance.products,
            self.tolerance.relative,
            self.tolerance.per_logit,
            self.backend,
            self.kernels,
            self.threads,
            self.kv_bytes as f64 / f64::from(1u32 << 20),
            self.step_ms_median,
            self.kv_gb_s_median,
            self.ratio_median,
            self.read_gb_s_median,
            self.ratio_best,
            self.runs,
            self.ratio_to_paged_bound,
            self.paged_bound,
            self.kernels,
            self.kernels_why,
            self.cpu.summary,
        )
    }
}
