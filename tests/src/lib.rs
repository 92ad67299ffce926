//! The cross-backend conformance suite of kvlayout.
//!
//! This crate owns the tests that every part of the workspace must pass: property tests of
//! the descriptor over random layouts of every kind, the regression cases of the engines'
//! layouts and the known bug classes, and the check that the C header of the kernel ABI
//! agrees with the Rust side. Its library holds what the tests share: a generator of random
//! valid layouts ([`gen`]), an independent enumeration of a layout's domain ([`domain`]), the
//! cases and workloads of the cross-backend suite ([`cases`]), the backends it drives
//! ([`backend`]: adapters over the contract's `Backend` trait), and the suite's checks of a
//! backend against the reference ([`suite`], which `kvlayout check` runs too). It does not
//! implement any layout logic or op of its own beyond what a reference needs.

#![forbid(unsafe_code)]

pub mod backend;
pub mod cases;
pub mod domain;
pub mod gen;
pub mod gpu_bench;
pub mod inputs;
pub mod suite;

/// Writes one line of the suite's report to stderr, past the test harness's capture (which
/// takes `println!` and `eprintln!` of passing tests): what was skipped, and why, and what
/// each backend passed must show in every CI log, not only when a test fails.
pub fn report(line: &str) {
    use std::io::Write;
    // Best effort: a closed stderr must not fail the test that reports.
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// Every view target of `l`: each readable field, and K and V together.
pub fn view_targets(l: &kvlayout::KvCacheLayout) -> Vec<kvlayout::ViewTarget> {
    let fields = l.readable_fields().into_iter();
    let targets = fields.map(kvlayout::ViewTarget::Field);
    targets.chain([kvlayout::ViewTarget::Kv]).collect()
}
