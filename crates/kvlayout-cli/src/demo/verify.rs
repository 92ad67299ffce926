//! The demo's verification, three checks against the prefill side:
//!
//! 1. **Elements**: every stored element (K and V, or the MLA latent; inline scales where the
//!    content has them) of every prompt token, layer and head a decode rank holds equals, byte
//!    for byte, the prefill cache's element at the same (layer, token, model head, dim): each
//!    side read through its own layout's `offset` at the block its block table gives.
//! 2. **Reference**: the scalar reference's decode (f64 accumulation in token order, whatever
//!    the layout) on each decode rank's cache equals, bit for bit, the reference's decode on
//!    the prefill caches for the same query heads, in every layer.
//! 3. **Backend**: the chosen backend's `paged_decode` on each decode rank lies within the
//!    conformance suite's tolerance of the reference on that rank's cache
//!    (`kvlayout_cpu::tolerance`, bf16 or f32 products as the backend states).
//!
//! It owns these comparisons; it reads every address from the layouts.

use kvlayout::ops::{AnyBackend, Backend, DecodeParams};
use kvlayout::{Coord, KvCacheLayout};
use kvlayout_cpu::tolerance::{decode_error, Tolerance};
use kvlayout_cpu::{reference, Activations, Decode, HostCache};
use serde::Serialize;

use super::rank::RankRun;
use super::scenario::{Scenario, Side};
use crate::CliError;

/// What the verification found.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Verification {
    /// Elements compared byte for byte (check 1), and those that differed.
    pub elements: u64,
    /// Bytes those elements take on each side.
    pub element_bytes: u64,
    pub elements_differing: u64,
    /// The first differing element, described.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_difference: Option<String>,
    /// Reference outputs compared bit for bit (check 2), and those that differed.
    pub reference_outputs: u64,
    pub reference_differing: u64,
    /// The backend's outputs compared with the reference (check 3): the worst error relative
    /// to its row's magnitude, and as a fraction of its bound (at most 1 passes).
    pub backend_outputs: u64,
    pub backend_max_error: f64,
    pub backend_error_to_bound: f64,
    /// `bf16` or `f32`: the products the tolerance allows for.
    pub products: &'static str,
    pub passed: bool,
}

/// Refuses a cache that is not one buffer per extent of `layout`, each the extent's length.
fn check_lengths(layout: &KvCacheLayout, bytes: &[Vec<u8>]) -> Result<(), CliError> {
    let extents = layout.extents();
    if bytes.len() != extents.len()
        || bytes
            .iter()
            .zip(extents)
            .any(|(b, x)| b.len() as u64 != x.end)
    {
        return Err(CliError::Check(format!(
            "a cache of {} buffers ({:?} bytes) where the layout has {:?}",
            bytes.len(),
            bytes.iter().map(Vec::len).collect::<Vec<_>>(),
            extents.iter().map(|x| x.end).collect::<Vec<_>>()
        )));
    }
    Ok(())
}

/// A host cache of `layout` holding `bytes` (one per buffer, each the buffer's extent).
fn host_cache(layout: &KvCacheLayout, bytes: &[Vec<u8>]) -> Result<HostCache, CliError> {
    check_lengths(layout, bytes)?;
    let mut host = HostCache::new(layout.clone())?;
    for (i, b) in bytes.iter().enumerate() {
        host.bytes_mut(i).copy_from_slice(b);
    }
    Ok(host)
}

/// The reference decode of `layer` on `cache` (a cache of `side`) for query heads `q`: the
/// output `[prompt, q_head, value_width]` and each row's magnitudes.
fn reference_decode(
    sc: &Scenario,
    side: &Side,
    cache: &HostCache,
    layer: u64,
    q: &std::ops::Range<u64>,
) -> Result<(Vec<f32>, Vec<kvlayout_cpu::Magnitude>), CliError> {
    let (table, width) = side.decode_table();
    let query = sc.query_heads(layer, q);
    let d = Decode {
        layer,
        query: Activations::F32(&query),
        block_table: &table,
        blocks_per_seq: width,
        seq_lens: &sc.prompts,
        params: DecodeParams {
            num_q_heads: q.end - q.start,
            scale: 1.0 / (sc.key_width as f32).sqrt(),
            sliding_window: None,
            soft_cap: None,
        },
    };
    let mut out = vec![0f32; sc.prompts.len() * ((q.end - q.start) * sc.value_width) as usize];
    let mags = reference::paged_decode_magnitudes(&cache.as_ref(), &d, &mut out)?;
    Ok((out, mags))
}

/// The prefill rank holding model head `head` (the lowest, where heads are replicated) and
/// the head's index in its layout.
fn prefill_holder(sc: &Scenario, head: u64) -> Result<(usize, u64), CliError> {
    for rank in 0..sc.prefill.tp {
        let held = kvlayout::tp_head_range(sc.kv_heads, sc.prefill.tp, rank)?;
        if held.contains(&head) {
            return Ok((rank as usize, head - held.start));
        }
    }
    Err(CliError::Check(format!(
        "model head {head} is on no prefill rank"
    )))
}

/// Whether a row of `m`'s elements is adjacent bytes: its dim is not split and the stride the
/// layout reports between elements is one element.
fn contiguous(m: &kvlayout::FieldMap) -> bool {
    m.strides.dim_split == m.width && m.strides.dim == m.elem_bytes()
}

/// Check 1 on one decode rank: `(elements compared, differing, first difference)`.
fn compare_elements(
    sc: &Scenario,
    prefill: &[Vec<Vec<u8>>],
    run: &RankRun,
) -> Result<(u64, u64, u64, Option<String>), CliError> {
    let (p, d) = (&sc.prefill, &sc.decode);
    let heads = kvlayout::tp_head_range(sc.kv_heads, d.tp, run.rank)?;
    let (mut compared, mut bytes, mut differing, mut first) = (0u64, 0u64, 0u64, None);
    for h in 0..heads.end - heads.start {
        let (p_rank, p_head) = prefill_holder(sc, heads.start + h)?;
        for layer in 0..sc.layers {
            for (s, &tokens) in sc.prompts.iter().enumerate() {
                for t in 0..u64::from(tokens) {
                    let at = |side: &Side, head: u64, field, dim| Coord {
                        layer,
                        block: side.tables[s][(t / side.block_size) as usize],
                        head,
                        slot: t % side.block_size,
                        field,
                        dim,
                    };
                    for m in d.layout.stored_fields() {
                        let n = m.elem_bytes() as usize;
                        let pm = p.layout.field_map(m.field)?;
                        // A row whose elements are adjacent on both sides (the strides the
                        // layouts report) is compared in one slice; the elements of a row
                        // that differs, or is not adjacent, one by one.
                        if contiguous(m) && contiguous(&pm) {
                            let dl = d.layout.offset(&at(d, h, m.field, 0))?;
                            let pl = p.layout.offset(&at(p, p_head, m.field, 0))?;
                            let len = n * m.width as usize;
                            let got = &run.cache[dl.buffer as usize][dl.offset as usize..][..len];
                            let want =
                                &prefill[p_rank][pl.buffer as usize][pl.offset as usize..][..len];
                            if got == want {
                                compared += m.width;
                                bytes += len as u64;
                                continue;
                            }
                        }
                        for dim in 0..m.width {
                            let dl = d.layout.offset(&at(d, h, m.field, dim))?;
                            let pl = p.layout.offset(&at(p, p_head, m.field, dim))?;
                            let got = &run.cache[dl.buffer as usize][dl.offset as usize..][..n];
                            let want =
                                &prefill[p_rank][pl.buffer as usize][pl.offset as usize..][..n];
                            compared += 1;
                            bytes += n as u64;
                            if got != want {
                                differing += 1;
                                first.get_or_insert_with(|| {
                                    format!(
                                        "decode rank {} layer {layer} prompt {s} token {t} head \
                                         {} {} dim {dim}: {got:02x?} != prefill {want:02x?}",
                                        run.rank,
                                        heads.start + h,
                                        m.field
                                    )
                                });
                            }
                        }
                    }
                }
            }
        }
    }
    Ok((compared, bytes, differing, first))
}

/// Runs the three checks.
pub(crate) fn verify(
    be: &AnyBackend,
    sc: &Scenario,
    prefill: &[Vec<Vec<u8>>],
    ranks: &[RankRun],
) -> Result<Verification, CliError> {
    let tolerance = if be.bf16_products(sc.decode.layout.dtype()) {
        Tolerance::BF16_PRODUCTS
    } else {
        Tolerance::F32_PRODUCTS
    };
    let mut v = Verification {
        elements: 0,
        element_bytes: 0,
        elements_differing: 0,
        first_difference: None,
        reference_outputs: 0,
        reference_differing: 0,
        backend_outputs: 0,
        backend_max_error: 0.0,
        backend_error_to_bound: 0.0,
        products: if tolerance == Tolerance::BF16_PRODUCTS {
            "bf16"
        } else {
            "f32"
        },
        passed: false,
    };
    for bytes in prefill {
        check_lengths(&sc.prefill.layout, bytes)?;
    }
    for run in ranks {
        check_lengths(&sc.decode.layout, &run.cache)?;
    }
    for run in ranks {
        let (n, bytes, bad, first) = compare_elements(sc, prefill, run)?;
        v.elements += n;
        v.element_bytes += bytes;
        v.elements_differing += bad;
        if v.first_difference.is_none() {
            v.first_difference = first;
        }
    }
    let rows = |q: &std::ops::Range<u64>| (q.end - q.start) * sc.value_width;
    // The prefill side's reference for every query head, per layer,
    // `[prompt, q_head, value_width]`: each prefill rank's host cache built once.
    let per_prompt = (sc.q_heads * sc.value_width) as usize;
    let mut want_all = vec![vec![0f32; sc.prompts.len() * per_prompt]; sc.layers as usize];
    for (p_rank, bytes) in prefill.iter().enumerate() {
        let cache = host_cache(&sc.prefill.layout, bytes)?;
        let q = sc.q_range(sc.prefill.tp, p_rank as u64);
        let (from, n) = ((q.start * sc.value_width) as usize, rows(&q) as usize);
        for (layer, want) in want_all.iter_mut().enumerate() {
            let (out, _) = reference_decode(sc, &sc.prefill, &cache, layer as u64, &q)?;
            for s in 0..sc.prompts.len() {
                want[s * per_prompt + from..][..n].copy_from_slice(&out[s * n..][..n]);
            }
        }
    }
    // Each decode rank's host cache, built once, one rank at a time.
    for run in ranks {
        let cache = host_cache(&sc.decode.layout, &run.cache)?;
        let q = sc.q_range(sc.decode.tp, run.rank);
        let (from, n) = ((q.start * sc.value_width) as usize, rows(&q) as usize);
        for (layer, want_layer) in want_all.iter().enumerate() {
            let (mine, mags) = reference_decode(sc, &sc.decode, &cache, layer as u64, &q)?;
            for s in 0..sc.prompts.len() {
                let want = &want_layer[s * per_prompt + from..][..n];
                for (a, b) in mine[s * n..][..n].iter().zip(want) {
                    v.reference_outputs += 1;
                    v.reference_differing += u64::from(a.to_bits() != b.to_bits());
                }
            }
            let got = run.outputs.get(layer).ok_or_else(|| {
                CliError::Check(format!(
                    "decode rank {} has no output for layer {layer}",
                    run.rank
                ))
            })?;
            if got.len() != mine.len() {
                return Err(CliError::Check(format!(
                    "decode rank {} layer {layer}: {} outputs, the reference has {}",
                    run.rank,
                    got.len(),
                    mine.len()
                )));
            }
            let e = decode_error(got, &mine, &mags, tolerance);
            v.backend_outputs += got.len() as u64;
            v.backend_max_error = v.backend_max_error.max(e.relative);
            v.backend_error_to_bound = v.backend_error_to_bound.max(e.ratio);
        }
    }
    v.passed = v.elements > 0
        && v.elements_differing == 0
        && v.reference_outputs > 0
        && v.reference_differing == 0
        && v.backend_error_to_bound <= 1.0;
    Ok(v)
}
