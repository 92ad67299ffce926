//! `kvlayout decode`: one decode step of a layout on a backend chosen by name (the CPU
//! backend by default), in process.
//!
//! It fills one layer of a cache of the layout through `write_kv` (seeded random keys and
//! values of the new tokens, scattered by a random block table), runs `paged_decode`, gathers
//! the blocks of the first sequences into a small cache (`gather_blocks`) and checks those
//! sequences against the scalar f64 reference within the tolerance of the kernels that ran
//! (bf16 or f32 products, `Backend::bf16_products`), then times the step: each run is paired
//! with a pass of the host's memory read bound right before it (which also evicts the cache
//! from the last-level cache), and the ratio of the two bandwidths is what it reports, as the
//! decode benchmark does, also against the paged bound (the decode's page pattern with no
//! compute). Every address comes from the layout; this module only builds activations, a
//! block table and slot numbers. A cache (and block table and queries) given from a dump
//! replaces the filled one ([`Given`]); reading and writing dumps is [`crate::decode_dump`]'s.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

use kvlayout::ops::{
    decode_widths, AnyBackend, AnyCache, AnyTensor, Backend, BufferShape, DecodeArgs, DecodeParams,
    HostTensor, WriteArgs,
};
use kvlayout::KvCacheLayout;
use kvlayout_cpu::bench::{paired, Paired, ReadBound};
use kvlayout_cpu::tolerance::{decode_error, Tolerance};
use kvlayout_cpu::{reference, Activations, Decode, HostCache};
use serde::Serialize;

use crate::common::rng::Rng;
use crate::common::{backend, limits, units};
use crate::CliError;

/// What `kvlayout decode` was asked for (its options, besides the spec and `--json`).
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct StepArgs {
    /// Query heads (default: 4 per KV head; 16 for MLA).
    #[arg(long, value_name = "N")]
    pub q_heads: Option<u64>,
    /// Sequences in the step.
    #[arg(long, value_name = "S", default_value_t = 8)]
    pub seqs: usize,
    /// Tokens in each sequence.
    #[arg(long, value_name = "T", default_value_t = 1024)]
    pub context: u32,
    /// Layer slot to fill and read.
    #[arg(long, value_name = "L", default_value_t = 0)]
    pub layer: u64,
    /// Attend only to the last W tokens of each sequence.
    #[arg(long, value_name = "W")]
    pub window: Option<u64>,
    /// Logits soft-cap C: s = C * tanh(s / C) (Gemma 2: 50).
    #[arg(long, value_name = "C")]
    pub soft_cap: Option<f32>,
    /// Backend to run the step on: cpu, cpu:BUILD, reference, cuda-emu, hip-emu, cuda or
    /// cuda:N, hip or hip:N. The emulators run the GPU kernels on the CPU one thread block at a time,
    /// thousands of times slower than a GPU: give them a small step (e.g. a spec with B=64 and
    /// --seqs 2 --context 64 --runs 1).
    #[arg(long, value_name = "NAME", default_value = "cpu")]
    pub backend: String,
    /// Threads of the CPU backend and of the read bound, at most 1024 (default, or 0: every
    /// core).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Kernel build of the CPU backend (avx512-bf16, avx512, avx2, scalar; default: the one
    /// this machine prefers): the same as --backend cpu:BUILD.
    #[arg(long, value_name = "BUILD")]
    pub kernels: Option<String>,
    /// Timed runs, each right after a pass of the read bound (1 to 10000).
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub runs: usize,
    /// Sequences compared with the scalar f64 reference: the first ones (it takes about
    /// a second per 30 million tokens x query heads x (K + V width)).
    #[arg(long, value_name = "S", default_value_t = 1)]
    pub check_seqs: usize,
    /// Seed of the tokens, queries and block table.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Largest cache to allocate, in GiB (the whole layout is allocated).
    #[arg(long, value_name = "GIB", default_value_t = 8.0)]
    pub max_cache_gib: f64,
    /// MiB per thread of the read bound's buffer (at least twice the last-level cache, so
    /// that a pass reads memory and evicts the cache before each timed run).
    #[arg(long, value_name = "MIB", default_value_t = 512)]
    pub bound_mib: usize,
    /// Read the cache from this dump (`kvlayout fill`, `convert`, `decode --out`) instead of
    /// filling one with write_kv; where the dump holds a decode step, its block table, lengths
    /// and queries too, and the step's layer, sequences, context, query heads, window and
    /// soft-cap come from it. Give SPEC or --from, not both.
    #[arg(long, value_name = "FILE")]
    pub from: Option<PathBuf>,
    /// Write the step as a dump: the cache, block table, lengths, queries and output.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

/// Inputs of a step taken from a dump rather than generated.
pub(crate) struct Given {
    /// The dump's path, for the report.
    pub path: String,
    /// The cache's buffers (uploaded instead of `write_kv`).
    pub cache: Vec<Vec<u8>>,
    /// The block table, `seqs x blocks_per_seq`, where the dump holds one.
    pub table: Option<Vec<i32>>,
    /// The queries, `seqs x q_heads x qk_width`, where the dump holds them.
    pub query: Option<Vec<f32>>,
}

/// What a step ran on and computed, for `--out`.
pub(crate) struct Record {
    pub cache: Vec<Vec<u8>>,
    pub table: Vec<i32>,
    pub blocks_per_seq: u64,
    pub query: Vec<f32>,
    pub output: Vec<f32>,
}

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
    fn of(t: Tolerance) -> Self {
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

/// Bytes one decode step reads per token and KV head: every stored field of the row (K and
/// V, their inline scales, or the MLA latent that serves as both), each once.
fn row_bytes(layout: &KvCacheLayout) -> u64 {
    layout
        .stored_fields()
        .iter()
        .map(|m| m.width * m.elem_bytes())
        .sum()
}

/// Tokens written per `write_kv` call.
const WRITE_CHUNK: usize = 16 << 10;

/// What the step allocates besides the cache (which `--max-cache-gib` limits), sized with
/// checked arithmetic before anything is allocated.
struct Footprint {
    /// Query elements.
    query: usize,
    /// Bytes of the read bound's buffer per thread.
    bound_per_thread: usize,
    /// Every byte above together: query, output, one write chunk's keys and values, the read
    /// bound's buffers.
    total_bytes: u64,
}

impl Footprint {
    fn of(
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
    fn fits(&self, available: Option<u64>) -> Result<(), CliError> {
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

/// Memory the kernel says can be allocated without swapping (`MemAvailable` of
/// `/proc/meminfo`), where it says.
pub(crate) fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// `n` distinct block ids of `0..num_blocks` in a random order: the first `n` steps of a
/// Fisher-Yates shuffle, with only the moved entries kept.
fn random_blocks(rng: &mut Rng, num_blocks: u64, n: u64) -> Result<Vec<i32>, CliError> {
    if i32::try_from(num_blocks).is_err() {
        return Err(usage(format!(
            "B={num_blocks} exceeds the block ids of a block table (i32)"
        )));
    }
    let mut moved: HashMap<u64, u64> = HashMap::new();
    Ok((0..n)
        .map(|i| {
            let j = i + rng.next_u64() % (num_blocks - i);
            let at_j = *moved.get(&j).unwrap_or(&j);
            let at_i = *moved.get(&i).unwrap_or(&i);
            moved.insert(j, at_i);
            // Below `num_blocks`, which fits an i32 (checked above).
            at_j as i32
        })
        .collect())
}

fn usage(m: String) -> CliError {
    CliError::Usage(m)
}

/// Checks the step's sizes against the layout and `--max-cache-gib`; returns the blocks a
/// sequence uses, all of them, and the cache's bytes.
fn check_sizes(layout: &KvCacheLayout, a: &StepArgs) -> Result<(u64, u64, u64), CliError> {
    let g = layout.geometry();
    limits::runs(a.runs)?;
    if a.seqs == 0 || a.context == 0 || a.bound_mib == 0 || a.check_seqs == 0 {
        return Err(usage(format!(
            "--seqs {}, --context {}, --bound-mib {} and --check-seqs {} must each be at least 1",
            a.seqs, a.context, a.bound_mib, a.check_seqs
        )));
    }
    let per_seq = u64::from(a.context).div_ceil(g.block_size);
    let blocks = per_seq.saturating_mul(a.seqs as u64);
    if blocks > g.num_blocks {
        return Err(usage(format!(
            "{} sequences of {} tokens need {blocks} blocks of {} tokens; the layout has B={}",
            a.seqs, a.context, g.block_size, g.num_blocks
        )));
    }
    limits::gib("--max-cache-gib", a.max_cache_gib)?;
    let cache_bytes: u64 = layout.extents().iter().map(|x| x.end).sum();
    let cache_gib = units::gib(cache_bytes);
    if cache_gib > a.max_cache_gib {
        return Err(usage(format!(
            "the layout's buffers take {cache_gib:.2} GiB, more than --max-cache-gib {}; \
             lower B or L in the spec",
            a.max_cache_gib
        )));
    }
    Ok((per_seq, blocks, cache_bytes))
}

/// Writes every token of every sequence once, at the slot its block table gives, in chunks
/// of `WRITE_CHUNK` tokens (the activations of a chunk are all that is held); returns the
/// milliseconds `write_kv` took.
fn fill_cache(
    be: &AnyBackend,
    cache: &mut AnyCache,
    layout: &KvCacheLayout,
    a: &StepArgs,
    table: &[i32],
    rng: &mut Rng,
) -> Result<f64, CliError> {
    let (qk, vw) = decode_widths(layout)?;
    let g = layout.geometry();
    let is_mla = layout.content().shares_latent();
    let per_seq = u64::from(a.context).div_ceil(g.block_size) as usize;
    let bs = g.block_size;
    let tokens = a.seqs * a.context as usize;
    let heads = g.num_kv_heads as usize;
    let mut write_kv_ms = 0.0;
    for first in (0..tokens).step_by(WRITE_CHUNK) {
        let chunk = first..(first + WRITE_CHUNK).min(tokens);
        let slots: Vec<i64> = chunk
            .map(|i| {
                let (s, t) = (i / a.context as usize, i as u64 % u64::from(a.context));
                i64::from(table[s * per_seq + (t / bs) as usize]) * bs as i64 + (t % bs) as i64
            })
            .collect();
        let keys = upload(be, rng.signed_units(slots.len() * heads * qk as usize))?;
        let values = if is_mla {
            None
        } else {
            Some(upload(
                be,
                rng.signed_units(slots.len() * heads * vw as usize),
            )?)
        };
        let w = WriteArgs {
            layer: a.layer,
            key: &keys,
            value: values.as_ref(),
            slot_mapping: &slots,
        };
        let t = Instant::now();
        let done = be.write_kv(cache, &w)?;
        be.wait(done).map_err(backend_failed)?;
        write_kv_ms += t.elapsed().as_secs_f64() * 1e3;
    }
    Ok(write_kv_ms)
}

/// `values` as an f32 tensor of the backend.
fn upload(be: &AnyBackend, values: Vec<f32>) -> Result<AnyTensor, CliError> {
    be.upload_tensor(&HostTensor::F32(values))
        .map_err(backend_failed)
}

/// A failure of the backend itself (no memory, a device error), not of the arguments.
fn backend_failed(e: String) -> CliError {
    CliError::Failed(e)
}

/// The backend `a` names (`--backend`, or `cpu:<build>` for `--kernels`) on `threads`
/// (checked `--threads`), or why not.
fn open_backend(a: &StepArgs, threads: Option<usize>) -> Result<AnyBackend, CliError> {
    let name = match &a.kernels {
        None => a.backend.clone(),
        Some(k) if a.backend == "cpu" => format!("cpu:{k}"),
        Some(k) => {
            return Err(usage(format!(
                "--kernels {k} names a build of the CPU backend; --backend {} is another \
                 backend",
                a.backend
            )))
        }
    };
    backend::open(&name, threads)
}

/// The first `seqs` sequences' blocks (`table`, `per_seq` a row) gathered from `cache` into a
/// cache of their own, downloaded to the host: blocks `0..n` in the order of the table.
fn gather_checked(
    be: &AnyBackend,
    cache: &AnyCache,
    layout: &KvCacheLayout,
    table: &[i32],
) -> Result<HostCache, CliError> {
    let blocks: Vec<u64> = table.iter().map(|&b| b as u64).collect();
    let mut spec = layout.spec().clone();
    spec.geometry.num_blocks = blocks.len() as u64;
    let small = KvCacheLayout::new(spec)?;
    let mut staging = be
        .alloc_cache(&small, &BufferShape::exact(&small))
        .map_err(backend_failed)?;
    let heads = 0..layout.geometry().num_kv_heads;
    let done = be.gather_blocks(cache, &blocks, heads, &mut staging)?;
    be.wait(done).map_err(backend_failed)?;
    let bytes = be.download_cache(&staging).map_err(backend_failed)?;
    let mut host = HostCache::new(small)?;
    for (i, b) in bytes.iter().enumerate() {
        host.bytes_mut(i).copy_from_slice(b);
    }
    Ok(host)
}

/// Runs the step on the inputs `given` (generated where `None`); with `record`, also returns
/// what it ran on and computed. `Err` for any refusal (of the arguments here, or of the
/// backend's ops).
pub(crate) fn run_step(
    layout: KvCacheLayout,
    a: &StepArgs,
    given: Option<Given>,
    record: bool,
) -> Result<(StepReport, Option<Record>), CliError> {
    let (qk, vw) = decode_widths(&layout)?;
    let g = *layout.geometry();
    let kv_heads = g.num_kv_heads;
    let is_mla = layout.content().shares_latent();
    let q_heads = a.q_heads.unwrap_or(if is_mla { 16 } else { 4 * kv_heads });
    // The backend first: one that cannot run here is named before any size is checked.
    let cpu = crate::cpu::features()?;
    let threads = limits::threads(a.threads)?;
    let be = open_backend(a, threads)?;
    let kernels = be.kernels();
    let pool = bound_pool(threads)?;
    let (per_seq, blocks, cache_bytes) = check_sizes(&layout, a)?;
    let sizes = Footprint::of(a, q_heads, kv_heads, qk, vw, pool.current_num_threads())?;
    sizes.fits(available_memory())?;
    let mut rng = Rng::seeded(a.seed);
    let (given_cache, given_table, given_query) = match given {
        Some(d) => (Some((d.path, d.cache)), d.table, d.query),
        None => (None, None, None),
    };
    let table_from = given_cache
        .as_ref()
        .filter(|_| given_table.is_some())
        .map(|(path, _)| path.clone());
    let table = match given_table {
        Some(t) => t,
        None => random_blocks(&mut rng, g.num_blocks, blocks)?,
    };
    let per_seq = per_seq as usize;
    let mut cache = be
        .alloc_cache(&layout, &BufferShape::exact(&layout))
        .map_err(backend_failed)?;
    let (write_kv_ms, cache_from) = match given_cache {
        Some((path, bytes)) => {
            be.upload_cache(&mut cache, &bytes)
                .map_err(backend_failed)?;
            (0.0, Some(path))
        }
        None => (
            fill_cache(&be, &mut cache, &layout, a, &table, &mut rng)?,
            None,
        ),
    };

    let query = given_query.unwrap_or_else(|| rng.signed_units(sizes.query));
    let lens = vec![a.context; a.seqs];
    let params = DecodeParams {
        num_q_heads: q_heads,
        scale: 1.0 / (qk as f32).sqrt(),
        sliding_window: a.window,
        soft_cap: a.soft_cap,
    };
    let out_len = |seqs: usize| seqs * q_heads as usize * vw as usize;
    let query_t = upload(&be, query.clone())?;
    let mut out = be
        .alloc_tensor(kvlayout::DType::F32, out_len(a.seqs))
        .map_err(backend_failed)?;
    let step = DecodeArgs {
        layer: a.layer,
        query: &query_t,
        block_table: &table,
        blocks_per_seq: per_seq,
        seq_lens: &lens,
        params,
    };
    let done = be.paged_decode(&cache, &step, &mut out)?;
    be.wait(done).map_err(backend_failed)?;
    let got = be.download_tensor(&out).map_err(backend_failed)?.to_f32();
    let recorded = if record {
        Some(Record {
            cache: be.download_cache(&cache).map_err(backend_failed)?,
            table: table.clone(),
            blocks_per_seq: per_seq as u64,
            query: query.clone(),
            output: got.clone(),
        })
    } else {
        None
    };

    // The reference reads each element through the checked address function: seconds for a
    // few sequences of thousands of tokens, so only the first ones are compared, on their
    // blocks gathered into a cache of their own (blocks 0.. in table order).
    let checked = a.check_seqs.min(a.seqs);
    let small = gather_checked(&be, &cache, &layout, &table[..checked * per_seq])?;
    let small_table: Vec<i32> = (0..(checked * per_seq) as i32).collect();
    let mut want = vec![0f32; out_len(checked)];
    let check = Decode {
        layer: a.layer,
        query: Activations::F32(&query[..checked * q_heads as usize * qk as usize]),
        block_table: &small_table,
        blocks_per_seq: per_seq,
        seq_lens: &lens[..checked],
        params,
    };
    let mags = reference::paged_decode_magnitudes(&small.as_ref(), &check, &mut want)?;
    let tolerance = if be.bf16_products(layout.dtype()) {
        Tolerance::BF16_PRODUCTS
    } else {
        Tolerance::F32_PRODUCTS
    };
    let error = decode_error(&got[..want.len()], &want, &mags, tolerance);

    // Each sequence reads its last `window` tokens (all of them without a window).
    let attended = u64::from(a.context).min(a.window.unwrap_or(u64::MAX));
    let kv_bytes = row_bytes(&layout) * kv_heads * a.seqs as u64 * attended;
    let timed = time_steps(&pool, sizes.bound_per_thread, a.runs, kv_bytes, || {
        let done = be.paged_decode(&cache, &step, &mut out)?;
        be.wait(done).map_err(backend_failed)
    })?;
    let report = StepReport {
        layout: layout.to_string(),
        cache_bytes,
        layer: a.layer,
        seqs: a.seqs,
        context: a.context,
        window: a.window,
        soft_cap: a.soft_cap,
        q_heads,
        kv_heads,
        blocks_used: blocks as usize,
        seed: a.seed,
        cache_from,
        table_from,
        cpu: crate::cpu::CpuReport::of(cpu),
        backend: be.name().to_string(),
        kernels: kernels.build,
        kernels_why: kernels.why,
        threads: if kernels.threads > 0 {
            kernels.threads
        } else {
            pool.current_num_threads()
        },
        write_kv_ms,
        checked_seqs: checked,
        max_error: error.relative,
        error_to_bound: error.ratio,
        tolerance: ToleranceReport::of(tolerance),
        kv_bytes,
        runs: a.runs,
        step_ms_median: timed.pair.op_median * 1e3,
        step_ms_best: timed.pair.op_best * 1e3,
        kv_gb_s_median: kv_bytes as f64 / timed.pair.op_median / 1e9,
        read_gb_s_median: timed.pair.bound_median / 1e9,
        ratio_median: timed.pair.ratio_median,
        ratio_best: timed.pair.ratio_best,
        paged_bound: timed.paged_bound,
        ratio_to_paged_bound: timed.pair.ratio_median / timed.paged_bound,
    };
    Ok((report, recorded))
}

/// The pool the read bound runs on: `threads` threads (every core when `None`).
fn bound_pool(threads: Option<usize>) -> Result<rayon::ThreadPool, CliError> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads.unwrap_or(0))
        .build()
        .map_err(|e| CliError::Failed(format!("the read bound's threads: {e}")))
}

/// Timed runs of the step and their bounds.
struct Timed {
    pair: Paired,
    paged_bound: f64,
}

/// Times `runs` steps of `kv_bytes`, each paired with a pass of the sequential read bound,
/// after measuring the paged bound.
fn time_steps(
    pool: &rayon::ThreadPool,
    bound_per_thread: usize,
    runs: usize,
    kv_bytes: u64,
    mut step: impl FnMut() -> Result<(), CliError>,
) -> Result<Timed, CliError> {
    let bound = ReadBound::new(pool, bound_per_thread)?;
    bound.pass(pool); // first touch
    let paged_bound = bound.paged_fraction(pool, 3);
    let mut failed = None;
    let pair = paired(
        runs,
        bound.bytes() as f64,
        || bound.pass(pool),
        kv_bytes as f64,
        || {
            if let Err(e) = step() {
                failed = Some(e);
            }
        },
    );
    match failed {
        Some(e) => Err(e),
        None => Ok(Timed { pair, paged_bound }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_blocks_are_distinct_and_in_range() {
        let mut rng = Rng::from_state(7);
        for (num, n) in [(1, 1), (2, 2), (10, 3), (1000, 1000), (1 << 30, 500)] {
            let v = random_blocks(&mut rng, num, n).unwrap();
            assert_eq!(v.len() as u64, n);
            let mut sorted = v.clone();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(sorted.len() as u64, n, "distinct ({num}, {n})");
            assert!(v.iter().all(|&b| b >= 0 && (b as u64) < num));
            if num == n && n > 2 {
                assert_ne!(v, (0..n as i32).collect::<Vec<_>>(), "shuffled");
            }
        }
        assert!(random_blocks(&mut rng, 1 << 31, 1).is_err());
    }
}
