//! The ops of `kvlayout bench` on one layout: what each one runs (its caches, block table,
//! activations), how many bytes it moves (from the layout's `block_regions`), and its timed
//! row. The caches are allocated once, sized and checked against `--max-gib` first.
//!
//! It does not own the bounds or the timing ([`super::timing`]) or the report's text.

use kvlayout::ops::{
    decode_widths, AnyBackend, AnyCache, AnyTensor, Backend, BufferShape, DecodeArgs, DecodeParams,
    HostTensor, OpError, WriteArgs,
};
use kvlayout::{DType, KvCacheLayout};

use super::timing::{time_op, Bounds};
use super::{usage, BenchArgs, OpRow};
use crate::common::rng::Rng;
use crate::common::units;
use crate::CliError;

/// Every op the bench runs, in report order.
pub(super) const OPS: [&str; 7] = [
    "write_kv",
    "paged_decode",
    "copy_blocks",
    "swap_blocks",
    "gather_blocks",
    "scatter_blocks",
    "convert",
];

/// Bytes of `blocks`' elements in `layers` (every head), from the layout's block regions.
fn region_bytes(
    l: &KvCacheLayout,
    blocks: &[u64],
    layers: std::ops::Range<u64>,
) -> Result<u64, CliError> {
    let heads = 0..l.geometry().num_kv_heads;
    let mut total = 0u64;
    for &b in blocks {
        for r in l.block_regions(b, layers.clone(), heads.clone())? {
            total = total.saturating_add(r.len);
        }
    }
    Ok(total)
}

/// Bytes of a layout's buffers.
fn buffer_bytes(l: &KvCacheLayout) -> u64 {
    l.extents()
        .iter()
        .fold(0u64, |n, e| n.saturating_add(e.end))
}

/// What the ops run on: the layouts, a random block table over every block, and the sizes.
pub(super) struct Plan {
    layout: KvCacheLayout,
    to: KvCacheLayout,
    staging: KvCacheLayout,
    table: Vec<u64>,
    seqs: usize,
    runs: usize,
    seed: u64,
    /// Bytes of the layout's buffers.
    pub(super) cache_bytes: u64,
    /// Bytes of one page: one block's elements in one layer.
    pub(super) page_bytes: u64,
}

impl Plan {
    /// The plan of `a` on `layout` (and `to`), refused before anything is allocated when its
    /// caches, activations and bounds together pass `--max-gib`.
    pub(super) fn new(
        layout: &KvCacheLayout,
        to: &KvCacheLayout,
        a: &BenchArgs,
        threads: usize,
    ) -> Result<Self, CliError> {
        let g = layout.geometry();
        if g.num_blocks > i32::MAX as u64 {
            return Err(usage(format!(
                "B={} exceeds the block ids of a block table (i32)",
                g.num_blocks
            )));
        }
        if a.seqs as u64 > g.num_blocks {
            return Err(usage(format!(
                "--seqs {} is more than the layout's {} blocks (one block a sequence at least)",
                a.seqs, g.num_blocks
            )));
        }
        // Gathered blocks land in a cache of the same layout, block i holding table[i].
        let staging = layout.clone();
        let cache_bytes = buffer_bytes(layout);
        // At most at once, in one op: the source cache and its zeros on the host, the
        // destination (`to` or staging), memcpy's source and destination of the op's bytes
        // (each at most the larger cache), the activations of `write_kv` (every slot, f32 at
        // most) and the read bound's buffers.
        let larger = u128::from(cache_bytes.max(buffer_bytes(to)));
        let slots = u128::from(g.num_blocks) * u128::from(g.block_size);
        let row = layout.stored_fields().iter().map(|m| m.width).sum::<u64>();
        let activations = slots * u128::from(g.num_kv_heads) * u128::from(row) * 4;
        let bound = (a.bound_mib as u128) << 20;
        let total = 5 * larger + activations + bound * threads as u128;
        let gib = units::gib_wide(total);
        if gib > a.max_gib {
            return Err(usage(format!(
                "the bench needs {gib:.2} GiB (caches, activations, bound buffers), more than \
                 --max-gib {}; lower B or L in the spec, or --bound-mib",
                a.max_gib
            )));
        }
        if let Some(free) = crate::common::memory::available_memory() {
            if total > u128::from(free) {
                return Err(usage(format!(
                    "the bench needs {gib:.2} GiB (caches, activations, bound buffers); this \
                     machine has {:.2} GiB available: lower B or L in the spec, or --bound-mib",
                    units::gib(free)
                )));
            }
        }
        let table = Rng::seeded(a.seed).permutation(g.num_blocks);
        let page_bytes = region_bytes(layout, &table[..1], 0..1)?;
        Ok(Plan {
            layout: layout.clone(),
            to: to.clone(),
            staging,
            table,
            seqs: a.seqs,
            runs: a.runs,
            seed: a.seed,
            cache_bytes,
            page_bytes,
        })
    }

    /// Runs and times op `name`.
    pub(super) fn bench(
        &self,
        be: &AnyBackend,
        name: &'static str,
        bounds: &Bounds,
        pool: &rayon::ThreadPool,
    ) -> Result<OpRow, CliError> {
        let l = &self.layout;
        let every_layer = 0..l.geometry().num_layers;
        let alloc = |l: &KvCacheLayout| -> Result<AnyCache, CliError> {
            be.alloc_cache(l, &BufferShape::exact(l))
                .map_err(CliError::Failed)
        };
        let wait = |r: Result<_, OpError>| -> Result<(), CliError> {
            be.wait(r?).map_err(CliError::Failed)
        };
        let mut src = alloc(l)?;
        // Write every byte once (the first writes to the pages are not what is timed).
        let zeros: Vec<Vec<u8>> = l
            .extents()
            .iter()
            .map(|e| vec![0; e.end as usize])
            .collect();
        be.upload_cache(&mut src, &zeros)
            .map_err(CliError::Failed)?;
        let blocks = &self.table;
        let half = blocks.len() / 2;
        let heads = 0..l.geometry().num_kv_heads;
        match name {
            "write_kv" | "paged_decode" => {
                if decode_widths(l).is_err() {
                    let why = refusal(be, &mut src, name)?;
                    return Ok(OpRow::skipped(name, why, self.runs));
                }
                let w = self.write_args(be)?;
                let written = region_bytes(l, blocks, 0..1)?;
                let write = |c: &mut AnyCache| {
                    let args = WriteArgs {
                        layer: 0,
                        key: &w.0,
                        value: w.1.as_ref(),
                        slot_mapping: &w.2,
                    };
                    wait(be.write_kv(c, &args))
                };
                if name == "write_kv" {
                    return time_op(name, written, self.runs, bounds, pool, || write(&mut src));
                }
                write(&mut src)?;
                self.decode(be, &src, bounds, pool)
            }
            "copy_blocks" => {
                let pairs: Vec<(u64, u64)> =
                    (0..half).map(|i| (blocks[i], blocks[half + i])).collect();
                let bytes = region_bytes(l, &blocks[half..2 * half], every_layer)?;
                time_op(name, bytes, self.runs, bounds, pool, || {
                    wait(be.copy_blocks(&mut src, &pairs))
                })
            }
            "swap_blocks" => {
                let mut dst = alloc(&self.to)?;
                let pairs: Vec<(u64, u64)> = blocks.iter().copied().zip(0..).collect();
                let bytes = region_bytes(
                    &self.to,
                    &(0..blocks.len() as u64).collect::<Vec<_>>(),
                    every_layer,
                )?;
                time_op(name, bytes, self.runs, bounds, pool, || {
                    wait(be.swap_blocks(&src, &mut dst, &pairs))
                })
            }
            "gather_blocks" | "scatter_blocks" => {
                let mut staging = alloc(&self.staging)?;
                let staged: Vec<u64> = (0..blocks.len() as u64).collect();
                let bytes = region_bytes(&self.staging, &staged, every_layer)?;
                if name == "gather_blocks" {
                    return time_op(name, bytes, self.runs, bounds, pool, || {
                        wait(be.gather_blocks(&src, blocks, heads.clone(), &mut staging))
                    });
                }
                wait(be.gather_blocks(&src, blocks, heads.clone(), &mut staging))?;
                time_op(name, bytes, self.runs, bounds, pool, || {
                    wait(be.scatter_blocks(&staging, blocks, heads.clone(), &mut src))
                })
            }
            _ => {
                let mut dst = alloc(&self.to)?;
                let bytes = region_bytes(l, blocks, every_layer)?;
                time_op(name, bytes, self.runs, bounds, pool, || {
                    wait(be.convert(&src, &mut dst))
                })
            }
        }
    }

    /// Keys, values (none for MLA) and slots of a `write_kv` of every slot of every block
    /// in layer 0, in block-table order; activations in the cache's dtype where it is an
    /// activation dtype (f32, f16, bf16), f32 otherwise.
    fn write_args(
        &self,
        be: &AnyBackend,
    ) -> Result<(AnyTensor, Option<AnyTensor>, Vec<i64>), CliError> {
        let l = &self.layout;
        let (qk, vw) = decode_widths(l)?;
        let g = l.geometry();
        let bs = g.block_size;
        let slots: Vec<i64> = self
            .table
            .iter()
            .flat_map(|&b| (0..bs).map(move |t| (b * bs + t) as i64))
            .collect();
        let dtype = match l.dtype() {
            d @ (DType::F32 | DType::F16 | DType::Bf16) => d,
            _ => DType::F32,
        };
        let mut rng = Rng::from_state(self.seed);
        let mut fill = |n: u64| -> Result<AnyTensor, CliError> {
            let values = rng.signed_units(n as usize);
            be.upload_tensor(&HostTensor::from_f32(dtype, &values)?)
                .map_err(CliError::Failed)
        };
        let per_token = g.num_kv_heads;
        let n = slots.len() as u64 * per_token;
        let key = fill(n * qk)?;
        let value = if l.content().shares_latent() {
            None
        } else {
            Some(fill(n * vw)?)
        };
        Ok((key, value, slots))
    }

    /// `paged_decode` of layer 0 over every block, `--seqs` sequences of equal length.
    fn decode(
        &self,
        be: &AnyBackend,
        cache: &AnyCache,
        bounds: &Bounds,
        pool: &rayon::ThreadPool,
    ) -> Result<OpRow, CliError> {
        let l = &self.layout;
        let (qk, vw) = decode_widths(l)?;
        let g = l.geometry();
        // At least one block per sequence (checked in `Plan::new`).
        let seqs = self.seqs;
        let per_seq = self.table.len() / seqs;
        let used = &self.table[..seqs * per_seq];
        let table: Vec<i32> = used.iter().map(|&b| b as i32).collect();
        let context = u32::try_from(per_seq as u64 * g.block_size)
            .map_err(|_| usage("a sequence longer than 2^32 tokens".into()))?;
        let lens = vec![context; seqs];
        let q_heads = if l.content().shares_latent() {
            16
        } else {
            4 * g.num_kv_heads
        };
        let n = seqs as u64 * q_heads;
        let query: Vec<f32> = (0..n * qk).map(|i| ((i % 17) as f32 - 8.0) / 8.0).collect();
        let query = be
            .upload_tensor(&HostTensor::F32(query))
            .map_err(CliError::Failed)?;
        let mut out = be
            .alloc_tensor(DType::F32, (n * vw) as usize)
            .map_err(CliError::Failed)?;
        let args = DecodeArgs {
            layer: 0,
            query: &query,
            block_table: &table,
            blocks_per_seq: per_seq,
            seq_lens: &lens,
            params: DecodeParams {
                num_q_heads: q_heads,
                scale: 1.0 / (qk as f32).sqrt(),
                sliding_window: None,
                soft_cap: None,
            },
        };
        let bytes = region_bytes(l, used, 0..1)?;
        time_op("paged_decode", bytes, self.runs, bounds, pool, || {
            be.wait(be.paged_decode(cache, &args, &mut out)?)
                .map_err(CliError::Failed)
        })
    }
}

/// Why the backend refuses `write_kv` or `paged_decode` (`op`) on `cache`, content without
/// keys and values: its own refusal of a one-token call.
fn refusal(be: &AnyBackend, cache: &mut AnyCache, op: &str) -> Result<String, CliError> {
    let key = be
        .upload_tensor(&HostTensor::F32(vec![0.0; 8]))
        .map_err(CliError::Failed)?;
    let refused = if op == "write_kv" {
        let w = WriteArgs {
            layer: 0,
            key: &key,
            value: None,
            slot_mapping: &[0],
        };
        be.write_kv(cache, &w).err()
    } else {
        let mut out = be.alloc_tensor(DType::F32, 8).map_err(CliError::Failed)?;
        let d = DecodeArgs {
            layer: 0,
            query: &key,
            block_table: &[0],
            blocks_per_seq: 1,
            seq_lens: &[1],
            params: DecodeParams {
                num_q_heads: 1,
                scale: 1.0,
                sliding_window: None,
                soft_cap: None,
            },
        };
        be.paged_decode(cache, &d, &mut out).err()
    };
    match refused {
        Some(e) => Ok(e.to_string()),
        None => Err(CliError::Failed(format!(
            "{op} accepted content without keys and values"
        ))),
    }
}

impl OpRow {
    /// The row of an op that does not apply to the layout.
    fn skipped(op: &'static str, why: String, runs: usize) -> Self {
        OpRow {
            op,
            skipped: Some(why),
            bytes: 0,
            runs,
            time_ms_median: 0.0,
            time_ms_best: 0.0,
            gb_s: 0.0,
            memcpy_gb_s: 0.0,
            read_gb_s: 0.0,
            paged_gb_s: 0.0,
            ratio_memcpy: 0.0,
            ratio_read: 0.0,
            ratio_paged: 0.0,
        }
    }
}
