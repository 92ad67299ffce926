//! `kvlayout bench`: every op of the contract (`write_kv`, `paged_decode`, `copy_blocks`,
//! `swap_blocks`, `gather_blocks`, `scatter_blocks`, `convert`) on a backend chosen by name,
//! each timed against three bounds measured in the same run, next to its runs: memcpy of the
//! same bytes, the streaming read bound, and the paged read pattern (pages of the layout's
//! page size read in a random block-table order).
//!
//! This module owns the arguments, the report and its text. The setup of each op is in
//! [`ops`], the timing and the bounds in [`timing`]; the bounds themselves are
//! `kvlayout_cpu::bench`'s probes, not a second copy. Every byte count comes from the layout
//! (`block_regions`, `extents`); this module computes no offset or stride.

use std::io::IsTerminal;

use kvlayout::ops::Backend;
use kvlayout::KvCacheLayout;
use serde::Serialize;

use crate::common::limits;
use crate::CliError;

mod ops;
mod timing;

/// The layout `kvlayout bench` runs when no SPEC is given: 2 layers of 1024 blocks of a
/// Llama-3-8B-like bf16 NHD cache (128 MiB), so the whole bench takes seconds.
pub(crate) const DEFAULT_SPEC: &str = "kv L=2 B=1024 N=16 H=8 D=128 dtype=bf16 order=NHD";

/// What `kvlayout bench` was asked for (its options, besides the spec and `--json`).
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct BenchArgs {
    /// Backend to run the ops on: cpu, cpu:BUILD, reference, cuda-emu, hip-emu, cuda or cuda:N,
    /// hip or hip:N. The emulators run GPU kernels one thread block at a time: give them a small
    /// SPEC (e.g. B=16) and --runs 1.
    #[arg(long, value_name = "NAME", default_value = "cpu")]
    pub backend: String,
    /// Destination layout of `convert` and `swap_blocks` (default: SPEC in the other of the
    /// NHD and HND orders).
    #[arg(long, value_name = "SPEC")]
    pub to: Option<String>,
    /// Timed runs of each op, each right after a memcpy pass of the same bytes (1 to 10000).
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub runs: usize,
    /// Sequences of the `paged_decode` step (the blocks are split evenly among them).
    #[arg(long, value_name = "S", default_value_t = 8)]
    pub seqs: usize,
    /// Threads of the CPU backend and of the bounds, at most 1024 (default, or 0: every
    /// core).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// MiB per thread of the read bound's buffer (at least twice the last-level cache, so
    /// that a pass reads memory).
    #[arg(long, value_name = "MIB", default_value_t = 128)]
    pub bound_mib: usize,
    /// Refuse to run past this many GiB: an estimate of the largest allocations at once (the
    /// caches, their host copies, the activations and the bound buffers), not a hard bound
    /// (it leaves out each op's temporary vectors and the threads' stacks).
    #[arg(long, value_name = "GIB", default_value_t = 4.0)]
    pub max_gib: f64,
    /// Seed of the block table and the activations.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// One op's row: what it moved, how fast, and its ratio to each bound of the same run.
#[derive(Debug, Serialize)]
pub(crate) struct OpRow {
    pub op: &'static str,
    /// Why the op did not run on this layout (content without keys and values), if so.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
    /// Bytes of the elements the op writes (movers, `write_kv`) or reads (`paged_decode`).
    pub bytes: u64,
    pub runs: usize,
    pub time_ms_median: f64,
    pub time_ms_best: f64,
    /// `bytes / time_ms_median`, in GB/s (1e9 bytes).
    pub gb_s: f64,
    /// The bounds' bandwidths, measured next to this op's runs (GB/s).
    pub memcpy_gb_s: f64,
    pub read_gb_s: f64,
    pub paged_gb_s: f64,
    /// `gb_s` over each bound's bandwidth.
    pub ratio_memcpy: f64,
    pub ratio_read: f64,
    pub ratio_paged: f64,
}

/// What one `kvlayout bench` measured.
#[derive(Debug, Serialize)]
pub(crate) struct BenchReport {
    pub layout: String,
    /// Destination of `convert` and `swap_blocks`.
    pub to: String,
    pub cache_bytes: u64,
    pub backend: String,
    /// The kernel build the backend runs, and why.
    pub kernels: String,
    pub kernels_why: String,
    pub threads: usize,
    /// The host's CPU, and the features the CPU backend uses (those a kernel build checks
    /// for, less the hidden ones).
    pub cpu: crate::cpu::CpuReport,
    pub cpu_features_used: Vec<&'static str>,
    /// Bytes one pass of the read bound reads, and the page the paged pattern reads.
    pub read_bound_bytes: u64,
    pub paged_page_bytes: u64,
    pub seqs: usize,
    pub seed: u64,
    pub ops: Vec<OpRow>,
    pub total_s: f64,
}

impl BenchReport {
    pub(crate) fn to_text(&self) -> String {
        let mib = |b: u64| b as f64 / f64::from(1u32 << 20);
        let mut out = format!(
            "layout   {} ({:.1} MiB)\n\
             to       {} (convert, swap_blocks)\n\
             backend  {}, {} threads\n\
             kernels  {}: {}\n\
             cpu      {}\n\
             bounds   memcpy of each op's bytes; read: {:.0} MiB streamed; paged: {} KiB \
             pages in a random order; each measured next to the op's runs\n\
             \n{:<15} {:>9} {:>9} {:>7} {:>8} {:>6} {:>8} {:>6} {:>8} {:>6}\n",
            self.layout,
            mib(self.cache_bytes),
            self.to,
            self.backend,
            self.threads,
            self.kernels,
            if self.kernels_why.is_empty() {
                "-"
            } else {
                &self.kernels_why
            },
            self.cpu.summary,
            mib(self.read_bound_bytes),
            self.paged_page_bytes >> 10,
            "op",
            "bytes",
            "ms",
            "GB/s",
            "memcpy",
            "x",
            "read",
            "x",
            "paged",
            "x",
        );
        for r in &self.ops {
            if let Some(why) = &r.skipped {
                out += &format!("{:<15} skipped: {why}\n", r.op);
                continue;
            }
            out += &format!(
                "{:<15} {:>9} {:>9.3} {:>7.2} {:>8.2} {:>6.2} {:>8.2} {:>6.2} {:>8.2} {:>6.2}\n",
                r.op,
                crate::common::units::binary_size(r.bytes),
                r.time_ms_median,
                r.gb_s,
                r.memcpy_gb_s,
                r.ratio_memcpy,
                r.read_gb_s,
                r.ratio_read,
                r.paged_gb_s,
                r.ratio_paged,
            );
        }
        out += &format!(
            "\n{} runs per op (median); bandwidths in GB/s (1e9 bytes/s); x = the op's GB/s over \
             the bound's; {:.1} s in all\n",
            self.ops.first().map_or(0, |r| r.runs),
            self.total_s
        );
        out
    }
}

fn usage(m: String) -> CliError {
    CliError::Usage(m)
}

/// `kvlayout bench SPEC`: runs every op and reports it.
pub(crate) fn run(
    layout: KvCacheLayout,
    to: KvCacheLayout,
    a: &BenchArgs,
    as_json: bool,
) -> Result<BenchReport, CliError> {
    let start = std::time::Instant::now();
    limits::runs(a.runs)?;
    limits::gib("--max-gib", a.max_gib)?;
    let threads = limits::threads(a.threads)?;
    if a.seqs == 0 || a.bound_mib == 0 {
        return Err(usage(format!(
            "--seqs {} and --bound-mib {} must each be at least 1",
            a.seqs, a.bound_mib
        )));
    }
    let cpu = crate::cpu::features()?;
    let be = crate::common::backend::open(&a.backend, threads)?;
    let kernels = be.kernels();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads.unwrap_or(0))
        .build()
        .map_err(|e| CliError::Failed(format!("the bounds' threads: {e}")))?;
    let plan = ops::Plan::new(&layout, &to, a, pool.current_num_threads())?;
    let progress =
        timing::Progress::new(ops::OPS.len(), !as_json && std::io::stderr().is_terminal());
    let bounds = timing::Bounds::new(&pool, a.bound_mib, plan.page_bytes)?;
    let mut rows = Vec::new();
    for op in ops::OPS {
        progress.start(op);
        rows.push(plan.bench(&be, op, &bounds, &pool)?);
        progress.done();
    }
    progress.finish();
    be.synchronize().map_err(CliError::Failed)?;
    Ok(BenchReport {
        layout: layout.to_string(),
        to: to.to_string(),
        cache_bytes: plan.cache_bytes,
        backend: be.name().to_string(),
        kernels: kernels.build,
        kernels_why: kernels.why,
        threads: if kernels.threads > 0 {
            kernels.threads
        } else {
            pool.current_num_threads()
        },
        cpu_features_used: cpu.used(),
        cpu: crate::cpu::CpuReport::of(cpu),
        read_bound_bytes: bounds.read_bytes(),
        paged_page_bytes: bounds.page_bytes() as u64,
        seqs: a.seqs,
        seed: a.seed,
        ops: rows,
        total_s: start.elapsed().as_secs_f64(),
    })
}

/// The default destination of `convert` and `swap_blocks`: `layout` in standard pages of the
/// other of the NHD (`LBNHC`) and HND (`LBHNC`) orders, with no padding or base offset.
pub(crate) fn other_order(layout: &KvCacheLayout) -> Result<KvCacheLayout, CliError> {
    use kvlayout::{AxisOrder, Paged, Placement};
    let mut spec = layout.spec().clone();
    let order = match &spec.placement {
        Placement::Paged(p) if p.order == AxisOrder::LBHNC => AxisOrder::LBNHC,
        _ => AxisOrder::LBHNC,
    };
    spec.placement = Placement::Paged(Paged {
        order,
        base_offset: 0,
        alignment: 1,
        page_size_padded: None,
        layer_stride_bytes: None,
        block_stride_bytes: None,
    });
    Ok(KvCacheLayout::new(spec)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NHD and HND trade places; any other placement becomes HND.
    #[test]
    fn the_default_destination_is_the_other_order() {
        let to = |spec: &str| {
            let l: KvCacheLayout = spec.parse().expect("spec");
            other_order(&l).expect("other order").to_string()
        };
        assert!(to("kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=NHD").contains("order=LBHNC"));
        assert!(to("kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=HND").contains("order=LBNHC"));
        let from_legacy = to("kv L=1 B=3 N=16 H=4 D=8 dtype=f16 tensor=flash-attn-nhd");
        assert!(from_legacy.contains("order=LBHNC"), "{from_legacy}");
    }
}
