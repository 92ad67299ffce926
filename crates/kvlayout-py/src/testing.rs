//! The conformance suite's generators for `kvlayout.testing`: seeded random valid layouts of
//! every kind (`kvlayout_conformance::gen`), each reproducible from its seed.

use kvlayout::KvCacheLayout;
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use crate::layout::Layout;

/// The module's generator functions.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(random_layout, m)?)?;
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
