//! The device backends' benchmark (run by `scripts/gpu-check.sh`, not a timed test): each
//! figure beside a bound measured in the same run on the same device.
//!
//! - `paged_decode` KV bytes read per second beside a device-to-device copy of the same
//!   bytes (target: at least 0.8 of it at contexts of 1024 tokens and more).
//! - `swap_blocks` device -> pinned host beside one copy of the same bytes between the same
//!   two memories (target: at least 0.9 of it), for consecutive blocks (one merged run) and
//!   for every other block (a copy per block).
//!
//! Times are wall-clock over `iters` enqueued ops, after warm-up, waited for once.

use std::time::Instant;

use kvlayout::ops::{
    Backend, BlockMove, BufferShape, DecodeArgs, DecodeParams, HostTensor, WriteArgs,
};
use kvlayout::{DType, KvCacheLayout};
use kvlayout_device::{Device, DeviceBackend, Place};

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Sequences per decode step.
    pub seqs: usize,
    /// Context lengths to measure, tokens.
    pub contexts: Vec<u32>,
    /// Timed iterations per figure.
    pub iters: usize,
    /// The cache: a compact spec with `B` left to the bench (`B={blocks}` is appended).
    pub spec: String,
    /// Query heads.
    pub q_heads: u64,
}

impl Default for BenchConfig {
    /// Llama-3-8B's attention (8 KV heads of 128, 32 query heads), bf16, head-major pages
    /// of 16 tokens, 8 sequences at 1024 and 4096 tokens.
    fn default() -> Self {
        BenchConfig {
            seqs: 8,
            contexts: vec![1024, 4096],
            iters: 20,
            spec: "kv N=16 H=8 D=128 dtype=bf16 order=HND".into(),
            q_heads: 32,
        }
    }
}

/// One figure beside its bound, in bytes per second.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    /// What was measured.
    pub what: String,
    /// Bytes per operation.
    pub bytes: u64,
    /// The op's bytes per second.
    pub op_bytes_per_s: f64,
    /// The bound's bytes per second.
    pub bound_bytes_per_s: f64,
    /// The target ratio.
    pub target: f64,
}

impl Figure {
    /// Op over bound.
    pub fn ratio(&self) -> f64 {
        self.op_bytes_per_s / self.bound_bytes_per_s
    }
}

impl std::fmt::Display for Figure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {:.1} MB, {:.1} GB/s vs bound {:.1} GB/s = {:.2} (target >= {:.2})",
            self.what,
            self.bytes as f64 / 1e6,
            self.op_bytes_per_s / 1e9,
            self.bound_bytes_per_s / 1e9,
            self.ratio(),
            self.target
        )
    }
}

/// Seconds per run of `f`, over `iters` runs after two of warm-up; `f` enqueues, `sync` waits.
fn time<E>(
    iters: usize,
    mut f: impl FnMut() -> Result<(), E>,
    sync: impl Fn() -> Result<(), E>,
) -> Result<f64, E> {
    for _ in 0..2 {
        f()?;
    }
    sync()?;
    let t = Instant::now();
    for _ in 0..iters {
        f()?;
    }
    sync()?;
    Ok(t.elapsed().as_secs_f64() / iters.max(1) as f64)
}

fn layout(cfg: &BenchConfig, blocks: u64) -> Result<KvCacheLayout, String> {
    format!("{} B={blocks}", cfg.spec)
        .parse()
        .map_err(|e| format!("bench layout: {e}"))
}

/// Every figure of `cfg` on `be`.
pub fn run<D: Device>(be: &DeviceBackend<D>, cfg: &BenchConfig) -> Result<Vec<Figure>, String> {
    let mut figures = Vec::new();
    for &ctx in &cfg.contexts {
        figures.push(decode(be, cfg, ctx)?);
    }
    let ctx = cfg.contexts.iter().copied().max().unwrap_or(1024);
    figures.push(swap(be, cfg, ctx, 1)?);
    figures.push(swap(be, cfg, ctx, 2)?);
    Ok(figures)
}

fn decode<D: Device>(be: &DeviceBackend<D>, cfg: &BenchConfig, ctx: u32) -> Result<Figure, String> {
    let dev = be.device();
    let e = |x: D::Error| x.to_string();
    let per_seq = u64::from(ctx).div_ceil(16);
    let l = layout(cfg, per_seq * cfg.seqs as u64)?;
    let g = *l.geometry();
    let mut cache = be.alloc_cache(&l, &BufferShape::exact(&l))?;
    // Fill every slot with real values through write_kv, as a prefill would.
    let (width, v_width, mla) = crate::cases::widths(&l).ok_or("bench layout: K and V")?;
    if mla || v_width != width {
        return Err("bench layout: K and V of one head size".into());
    }
    let tokens = (g.num_blocks * g.block_size) as usize;
    let chunk = 4096usize;
    for start in (0..tokens).step_by(chunk) {
        let n = chunk.min(tokens - start);
        let vals: Vec<f32> = (0..n * g.num_kv_heads as usize * width)
            .map(|i| ((i % 97) as f32 - 48.0) / 64.0)
            .collect();
        let k = be
            .upload_tensor(&HostTensor::from_f32(DType::Bf16, &vals).map_err(|e| e.to_string())?)?;
        let slots: Vec<i64> = (start..start + n).map(|s| s as i64).collect();
        let w = WriteArgs {
            layer: 0,
            key: &k,
            value: Some(&k),
            slot_mapping: &slots,
        };
        let c = be.write_kv(&mut cache, &w).map_err(|e| e.to_string())?;
        be.wait(c)?;
    }
    let q: Vec<f32> = (0..cfg.seqs * cfg.q_heads as usize * width)
        .map(|i| ((i % 13) as f32 - 6.0) / 8.0)
        .collect();
    let query =
        be.upload_tensor(&HostTensor::from_f32(DType::Bf16, &q).map_err(|e| e.to_string())?)?;
    let mut out = be.alloc_tensor(DType::F32, cfg.seqs * cfg.q_heads as usize * width)?;
    let table: Vec<i32> = (0..g.num_blocks as i32).collect();
    let lens = vec![ctx; cfg.seqs];
    let d = DecodeArgs {
        layer: 0,
        query: &query,
        block_table: &table,
        blocks_per_seq: per_seq as usize,
        seq_lens: &lens,
        params: DecodeParams {
            num_q_heads: cfg.q_heads,
            scale: 1.0 / (width as f32).sqrt(),
            sliding_window: None,
            soft_cap: None,
        },
    };
    // Bytes of one head's K and V rows of a token, as stored.
    let row: u64 = l
        .stored_fields()
        .iter()
        .map(|f| f.width * f.elem_bytes())
        .sum();
    let kv_bytes = u64::from(ctx) * cfg.seqs as u64 * g.num_kv_heads * row;
    let op = time(
        cfg.iters,
        || {
            be.paged_decode(&cache, &d, &mut out)
                .map(drop)
                .map_err(|e| e.to_string())
        },
        || be.synchronize(),
    )?;
    let scratch = dev.alloc(kv_bytes, 0, Place::Device).map_err(e)?;
    let src = &cache.buffers()[0];
    let bound = time(
        cfg.iters,
        || dev.copy(src, 0, &scratch, 0, kv_bytes).map_err(e),
        || dev.synchronize().map_err(e),
    )?;
    Ok(Figure {
        what: format!(
            "paged_decode {} seqs x {ctx} tokens ({})",
            cfg.seqs, cfg.spec
        ),
        bytes: kv_bytes,
        op_bytes_per_s: kv_bytes as f64 / op,
        bound_bytes_per_s: kv_bytes as f64 / bound,
        target: 0.8,
    })
}

/// Half the device pool's blocks, every `stride`-th, to the first half of the host pool: one
/// run when `stride` is 1, a run per block when 2.
fn swap<D: Device>(
    be: &DeviceBackend<D>,
    cfg: &BenchConfig,
    ctx: u32,
    stride: u64,
) -> Result<Figure, String> {
    let dev = be.device();
    let e = |x: D::Error| x.to_string();
    let blocks = u64::from(ctx).div_ceil(16) * cfg.seqs as u64;
    let gpu = layout(cfg, blocks)?;
    let cpu = layout(cfg, blocks)?;
    let src = be.alloc_cache(&gpu, &BufferShape::exact(&gpu))?;
    let mut dst = be.alloc_host_cache(&cpu)?;
    let pairs: Vec<(u64, u64)> = (0..blocks / 2).map(|i| (stride * i, i)).collect();
    let plan = BlockMove::Swap(&pairs)
        .plan(Some(&gpu), &cpu)
        .map_err(|e| e.to_string())?
        .plan(&gpu, &cpu)
        .ok_or("bench layouts have a byte plan")?;
    let bytes = plan.bytes_per_pair() * pairs.len() as u64;
    let op = time(
        cfg.iters,
        || {
            be.swap_blocks(&src, &mut dst, &pairs)
                .map(drop)
                .map_err(|e| e.to_string())
        },
        || be.synchronize(),
    )?;
    let bound = time(
        cfg.iters,
        || {
            dev.copy(&src.buffers()[0], 0, &dst.buffers()[0], 0, bytes)
                .map_err(e)
        },
        || dev.synchronize().map_err(e),
    )?;
    Ok(Figure {
        what: format!(
            "swap_blocks device -> pinned host, {} blocks, every {}",
            pairs.len(),
            if stride == 1 {
                "one (one run)".into()
            } else {
                format!("{stride}th (a run each)")
            }
        ),
        bytes,
        op_bytes_per_s: bytes as f64 / op,
        bound_bytes_per_s: bytes as f64 / bound,
        target: 0.9,
    })
}
