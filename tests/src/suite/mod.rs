//! The cross-backend checks of the conformance suite, as a library: the integration test
//! (`tests/conformance.rs`) and `kvlayout check` run the same functions.
//!
//! Per case ([`run::prepare`] computes its workload, mover plan and byte sets once), every op
//! runs through the contract's `Backend` trait on the backend under test and on the scalar
//! reference ([`run::case_outcome`], [`run::pair_outcome`]), and [`compare`] checks one
//! against the other, tallying into a [`report::Report`] per backend. Cases are run by group
//! (one content: the pairs of `convert` and `swap_blocks`), [`GroupRunner`].
//!
//! It does not own the cases ([`crate::cases`]), the backends ([`crate::backend`]), or the
//! refusal table (the integration test's).

pub mod bytes;
pub mod compare;
pub mod report;
pub mod run;

use crate::backend::{Backend, Host, ScalarReference};
use crate::cases::{all_cases, LayoutCase};

use bytes::{blocks_mask, regions_mask};
use compare::{compare_case, compare_pair};
use report::{guarded, Report};
use run::{case_outcome, pair_outcome, prepare, CaseOutcome, PairOutcome, Prepared};

/// Runs one group of cases (one content) on a backend.
pub struct GroupRunner<'a> {
    /// The group's cases.
    pub cases: &'a [Prepared],
    /// The reference's outcome on each case.
    pub oracle: &'a [CaseOutcome],
    /// The reference's outcome on each ordered pair `(i, j)` of cases.
    pub pair_oracle: &'a [Vec<PairOutcome>],
}

impl GroupRunner<'_> {
    /// Every case and ordered pair of the group on `be`, tallied in `rep` (whose `layouts`
    /// name the case, or the pair, each check is on).
    pub fn run<B: Backend>(&self, be: &B, rep: &mut Report) {
        for i in 0..self.cases.len() {
            self.run_case(be, i, rep);
        }
        for i in 0..self.cases.len() {
            for j in 0..self.cases.len() {
                self.run_pair(be, i, j, rep);
            }
        }
        self.synchronize(be, rep);
    }

    /// [`GroupRunner::run`] with a report per case (`reps[i]` for case `i`): case `i`'s
    /// checks and those of the pairs from it (`i -> j`) go to `reps[i]`; a failure to
    /// synchronize goes to `reps[0]`. For a tally by case, or by family where a group's cases
    /// are of several families.
    pub fn run_per_case<B: Backend>(&self, be: &B, reps: &mut [Report]) {
        assert_eq!(reps.len(), self.cases.len(), "one report per case");
        for (i, rep) in reps.iter_mut().enumerate() {
            self.run_case(be, i, rep);
        }
        for (i, rep) in reps.iter_mut().enumerate() {
            for j in 0..self.cases.len() {
                self.run_pair(be, i, j, rep);
            }
        }
        if let Some(rep) = reps.first_mut() {
            self.synchronize(be, rep);
        }
    }

    /// Case `i`'s ops on `be` against the reference's.
    fn run_case<B: Backend>(&self, be: &B, i: usize, rep: &mut Report) {
        let p = &self.cases[i];
        rep.layouts = vec![p.case.layout.to_string()];
        match guarded(&p.case.name, || case_outcome(be, p)) {
            Ok(got) => compare_case(rep, p, &got, &self.oracle[i]),
            Err(e) => rep.fail("panic", e),
        }
        rep.layouts.clear();
    }

    /// The ordered pair `i -> j`'s `convert` and `swap_blocks` on `be` against the
    /// reference's.
    fn run_pair<B: Backend>(&self, be: &B, i: usize, j: usize, rep: &mut Report) {
        let (a, b) = (&self.cases[i], &self.cases[j]);
        rep.layouts = vec![a.case.layout.to_string(), b.case.layout.to_string()];
        let what = format!("{} -> {}", a.case.name, b.case.name);
        match guarded(&what, || pair_outcome(be, a, b)) {
            Ok(got) => compare_pair(rep, a, b, &got, &self.pair_oracle[i][j]),
            Err(e) => rep.fail("panic", e),
        }
        rep.layouts.clear();
    }

    fn synchronize<B: Backend>(&self, be: &B, rep: &mut Report) {
        if let Err(e) = be.synchronize() {
            rep.fail("synchronize", format!("synchronize: {e}"));
        }
    }
}

/// The cases grouped by content, in table order.
fn groups(cases: Vec<LayoutCase>) -> Vec<Vec<LayoutCase>> {
    let mut groups: Vec<(String, Vec<LayoutCase>)> = Vec::new();
    for c in cases {
        match groups.iter_mut().find(|g| g.0 == c.group) {
            Some(g) => g.1.push(c),
            None => groups.push((c.group.clone(), vec![c])),
        }
    }
    groups.into_iter().map(|g| g.1).collect()
}

/// The element byte sets the suite uses agree with the layout's own block regions.
pub fn check_block_regions(layout_checks: &mut Report, p: &Prepared) {
    let l = &p.case.layout;
    let h = l.geometry().num_kv_heads;
    let blocks: Vec<u64> = (0..l.geometry().num_blocks).collect();
    for (blocks, heads) in [
        (vec![blocks[blocks.len() - 1]], 0..h),
        (p.plan.gather_blocks.clone(), p.plan.heads.clone()),
        (blocks, 0..h),
    ] {
        layout_checks.check(
            "block_regions",
            &format!("{} blocks {blocks:?} heads {heads:?}", p.case.name),
            regions_mask(l, &blocks, heads.clone()).and_then(|m| {
                (m == blocks_mask(l, &blocks, heads.clone()))
                    .then_some(())
                    .ok_or_else(|| "block_regions differ from the element bytes".into())
            }),
        );
    }
}

/// The reference's outcomes on a group: each case, and each ordered pair.
pub fn oracles(
    oracle: &Host<ScalarReference>,
    prepared: &[Prepared],
) -> (Vec<CaseOutcome>, Vec<Vec<PairOutcome>>) {
    let cases = prepared.iter().map(|p| case_outcome(oracle, p)).collect();
    let pairs = prepared
        .iter()
        .map(|a| {
            prepared
                .iter()
                .map(|b| pair_outcome(oracle, a, b))
                .collect()
        })
        .collect();
    (cases, pairs)
}

/// The table's groups, each with its cases prepared (numbered in table order).
pub fn prepared_groups() -> Vec<Vec<Prepared>> {
    prepared_groups_where(|_| true)
}

/// The groups of [`prepared_groups`] with only the cases `keep` takes (each numbered, and so
/// prepared, as in the whole table); groups left empty are dropped.
pub fn prepared_groups_where(keep: impl Fn(&LayoutCase) -> bool) -> Vec<Vec<Prepared>> {
    let mut index = 0;
    groups(all_cases())
        .into_iter()
        .map(|group| {
            group
                .into_iter()
                .filter_map(|c| {
                    index += 1;
                    keep(&c).then(|| prepare(c, index))
                })
                .collect::<Vec<_>>()
        })
        .filter(|g| !g.is_empty())
        .collect()
}

/// The family of a case: the first part of its name (`std`, `mla`, `vllm`, `tp`, ...; see
/// [`crate::cases`]).
pub fn family_of(case: &LayoutCase) -> &str {
    case.name.split('/').next().unwrap_or_default()
}

/// A deliberately broken build of the emulated CUDA kernels by name, `planted:<n>` (builds 1
/// to 6 of `kernels-cuda/src/kvl_plant.cuh`), where this crate is built with its
/// `planted-bugs` feature; `None` for any other name, and for every name without the feature.
pub fn planted_backend(name: &str) -> Option<crate::backend::AnyBackend> {
    #[cfg(feature = "planted-bugs")]
    {
        let n: usize = name.strip_prefix("planted:")?.parse().ok()?;
        let device = crate::backend::EmuDevice::planted(n)?;
        let be = crate::backend::DeviceBackend::new(device);
        Some(crate::backend::AnyBackend::new(be).named(name))
    }
    #[cfg(not(feature = "planted-bugs"))]
    {
        let _ = name;
        None
    }
}
