//! The prefill side: each prefill rank's cache, filled by `write_kv` on the chosen backend
//! with the prompts' keys and values of its heads in every layer, then downloaded to the
//! host bytes its transfer engine registers.
//!
//! It owns the seeded keys and values (the same model-wide tensor, whatever the TP split);
//! it does not own the slots' arithmetic beyond `block * block_size + token % block_size`,
//! the slot numbering `write_kv` takes.

use std::time::Instant;

use kvlayout::ops::{AnyBackend, Backend, BufferShape, HostTensor, WriteArgs};
use kvlayout::KvCacheLayout;

use super::scenario::Scenario;
use super::seeded;
use crate::CliError;

/// A failure of the backend itself (no memory, a device error), not of the arguments.
pub(crate) fn failed(e: String) -> CliError {
    CliError::Failed(e)
}

/// `n` zero bytes, every page written once (a fresh allocation is mapped on first write,
/// which would otherwise be timed as part of the first transfer into it).
pub(crate) fn touched(n: u64) -> Vec<u8> {
    let mut v = std::hint::black_box(vec![0u8; n as usize]);
    v.fill(0);
    v
}

/// Zeroed host buffers of `layout` (one per buffer, its registered span), touched.
pub(crate) fn zeros(layout: &KvCacheLayout) -> Vec<Vec<u8>> {
    layout.extents().iter().map(|x| touched(x.end)).collect()
}

/// Bytes one token and head takes in `layout`: every stored field's row (K and V, inline
/// scales, or the MLA latent), each once.
pub(crate) fn row_bytes(layout: &KvCacheLayout) -> u64 {
    layout
        .stored_fields()
        .iter()
        .map(|m| m.width * m.elem_bytes())
        .sum()
}

/// The model-wide keys or values of prompt `seq` in `layer`: `[tokens, kv_heads, width]`.
fn model_rows(sc: &Scenario, layer: u64, seq: usize, value: bool, width: u64) -> Vec<f32> {
    let n = sc.prompts[seq] as usize * (sc.kv_heads * width) as usize;
    let stream = (layer << 32) | ((seq as u64) << 1) | u64::from(value);
    seeded::stream(sc.seed, 1 << 48 | stream).signed_units(n)
}

/// Heads `heads` of `[tokens, kv_heads, width]` rows.
fn head_slice(rows: &[f32], kv_heads: u64, width: u64, heads: &std::ops::Range<u64>) -> Vec<f32> {
    let row = (kv_heads * width) as usize;
    let (from, to) = ((heads.start * width) as usize, (heads.end * width) as usize);
    rows.chunks(row)
        .flat_map(|r| r[from..to].to_vec())
        .collect()
}

/// The prefill ranks' caches as host bytes, and the seconds `write_kv` took (calls and
/// waits, summed over ranks).
pub(crate) struct Prefilled {
    pub bytes: Vec<Vec<Vec<u8>>>,
    pub seconds: f64,
    /// Bytes written: tokens x heads x the stored row, over layers and ranks.
    pub written: u64,
    /// `write_kv` calls.
    pub calls: u64,
}

/// Runs `write_kv` for every prompt and layer on every prefill rank.
pub(crate) fn prefill(be: &AnyBackend, sc: &Scenario) -> Result<Prefilled, CliError> {
    let p = &sc.prefill;
    let layout = &p.layout;
    let value_width = if layout.content().shares_latent() {
        None
    } else {
        Some(sc.value_width)
    };
    let n = p.block_size;
    let mut out = Prefilled {
        bytes: Vec::new(),
        seconds: 0.0,
        written: 0,
        calls: 0,
    };
    for rank in 0..p.tp {
        let heads = kvlayout::tp_head_range(sc.kv_heads, p.tp, rank)?;
        let mut cache = be
            .alloc_cache(layout, &BufferShape::exact(layout))
            .map_err(failed)?;
        be.upload_cache(&mut cache, &zeros(layout))
            .map_err(failed)?;
        for layer in 0..sc.layers {
            for (seq, table) in p.tables.iter().enumerate() {
                let tokens = u64::from(sc.prompts[seq]);
                let slots: Vec<i64> = (0..tokens)
                    .map(|t| (table[(t / n) as usize] * n + t % n) as i64)
                    .collect();
                let upload = |value: bool, width: u64| {
                    let rows = model_rows(sc, layer, seq, value, width);
                    let mine = head_slice(&rows, sc.kv_heads, width, &heads);
                    be.upload_tensor(&HostTensor::F32(mine)).map_err(failed)
                };
                let key = upload(false, sc.key_width)?;
                let value = value_width.map(|w| upload(true, w)).transpose()?;
                let w = WriteArgs {
                    layer,
                    key: &key,
                    value: value.as_ref(),
                    slot_mapping: &slots,
                };
                let t = Instant::now();
                let done = be.write_kv(&mut cache, &w)?;
                be.wait(done).map_err(failed)?;
                out.seconds += t.elapsed().as_secs_f64();
                out.calls += 1;
                out.written += tokens * (heads.end - heads.start) * row_bytes(layout);
            }
        }
        out.bytes.push(be.download_cache(&cache).map_err(failed)?);
    }
    Ok(out)
}
