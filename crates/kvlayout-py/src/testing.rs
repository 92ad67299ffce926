//! The conformance suite's generators and comparisons for `kvlayout.testing`: seeded random
//! valid layouts of every kind (`kvlayout_conformance::gen`), each reproducible from its
//! seed; the suite's workloads ([`workload`]); the scalar reference's decode with the
//! magnitudes its tolerance is measured against, and the suite's comparisons ([`compare`]);
//! the element a byte belongs to ([`locate`]).

use kvlayout::ops::{
    check_decode, check_write, DecodeArgs, DecodeParams, HostTensor, OpError, WriteArgs,
};
use kvlayout::KvCacheLayout;
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use crate::errors::raise;
use crate::layout::Layout;

mod compare;
mod locate;
mod workload;

/// The module's generator and comparison functions.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(random_layout, m)?)?;
    m.add_function(wrap_pyfunction!(kv_ops_widths, m)?)?;
    m.add_function(wrap_pyfunction!(tensor_scales, m)?)?;
    workload::register(m)?;
    compare::register(m)?;
    locate::register(m)?;
    Ok(())
}

/// A runner whose random draws are a function of `seed` alone.
pub fn seeded_runner(seed: u64) -> TestRunner {
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &bytes),
    )
}

/// The random valid layout of `seed`, as the conformance suite draws them: every content kind
/// and placement, sizes that expose swaps (B=3, H=4, N=16, D=8) and the ambiguous ones (two
/// blocks, H=1, H=N), sometimes transformed (TP slice, layer range, kernel-block split).
pub fn layout_of_seed(seed: u64) -> PyResult<KvCacheLayout> {
    let mut runner = seeded_runner(seed);
    let tree = kvlayout_conformance::gen::any_layout()
        .new_tree(&mut runner)
        .map_err(|e| PyRuntimeError::new_err(format!("layout of seed {seed}: {e}")))?;
    Ok(tree.current())
}

/// The random valid layout of ``seed`` (the same layout for the same seed, on every machine).
#[pyfunction]
fn random_layout(seed: u64) -> PyResult<Layout> {
    Ok(Layout {
        inner: layout_of_seed(seed)?,
    })
}

/// `(query/key width, value width)` of a layout both `write_kv` and `paged_decode` accept,
/// asked of the contract's own checks (`kvlayout::ops::check_write` and `check_decode`) on
/// a call of no tokens and no sequences; their refusal otherwise.
pub fn widths(l: &KvCacheLayout) -> Result<(u64, u64), OpError> {
    let empty = HostTensor::F32(Vec::new());
    let w = WriteArgs {
        layer: 0,
        key: &empty,
        value: (!l.content().shares_latent()).then_some(&empty),
        slot_mapping: &[],
    };
    check_write(l, &w)?;
    let d = DecodeArgs {
        layer: 0,
        query: &empty,
        block_table: &[],
        blocks_per_seq: 0,
        seq_lens: &[],
        params: DecodeParams {
            num_q_heads: l.geometry().num_kv_heads,
            scale: 1.0,
            sliding_window: None,
            soft_cap: None,
        },
    };
    let s = check_decode(l, &d, 0)?;
    Ok((s.qk_width as u64, s.v_width as u64))
}

/// ``(query/key width, value width)`` of a layout both ``write_kv`` and ``paged_decode``
/// accept: K/V content (head sizes) or MLA (the latent and its first ``kv_lora_rank``
/// elements), one token per state. Raises ``UnsupportedError`` with the contract's reason
/// otherwise (no keys and values, compressed states).
#[pyfunction]
fn kv_ops_widths(layout: &Layout) -> PyResult<(u64, u64)> {
    widths(&layout.inner).map_err(raise)
}

/// ``(k_scale, v_scale)``: the per-tensor scales a stored K or V element is multiplied by
/// (1.0 unless the layout states them).
#[pyfunction]
fn tensor_scales(layout: &Layout) -> (f32, f32) {
    let s = layout.inner.scales();
    (s.k_scale, s.v_scale)
}
