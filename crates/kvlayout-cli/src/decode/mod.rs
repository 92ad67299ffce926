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
use std::time::Instant;

use kvlayout::ops::{
    decode_widths, AnyBackend, AnyCache, AnyTensor, Backend, BufferShape, DecodeArgs, DecodeParams,
    HostTensor, WriteArgs,
};
use kvlayout::KvCacheLayout;
use kvlayout_cpu::tolerance::{decode_error, Tolerance};
use kvlayout_cpu::{reference, Activations, Decode, HostCache};

use crate::common::memory::available_memory;
use crate::common::rng::Rng;
use crate::common::{backend, limits, units};
use crate::CliError;

mod args;
mod footprint;
mod report;
mod timing;
pub(crate) use args::StepArgs;
use footprint::Footprint;
pub(crate) use report::{StepReport, ToleranceReport};
use timing::{bound_pool, time_steps};

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
