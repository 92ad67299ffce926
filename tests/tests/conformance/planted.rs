//! The suite can fail: each deliberately broken kernel build (`kernels-cuda/src/kvl_plant.cuh`,
//! the known bug classes a kernel can commit) runs through the suite's
//! groups, in table order, until a check fails; the test asserts one does and reports the
//! first failure, which names the op and the case. Bug 4 (offsets truncated to 32 bits) needs
//! a cache past 2 GiB: `tests/offsets_past_2gib.rs` catches it.

use kvlayout_conformance::backend::{DeviceBackend, EmuDevice, Host, ScalarReference};

use crate::report::Report;
use crate::{oracles, prepared_groups, GroupRunner};

/// The planted builds the suite's cases catch: (build number, bug class).
const PLANTED: [(usize, &str); 5] = [
    (1, "swapped V strides"),
    (2, "block size read as the head count"),
    (3, "page padding ignored"),
    (5, "K's strides reused for V"),
    (6, "(2, B, ...) assumed for V"),
];

#[test]
fn planted_kernel_bugs_are_caught() {
    let oracle = Host::<ScalarReference>::reference();
    let groups = prepared_groups();
    let mut missed = Vec::new();
    for (n, bug) in PLANTED {
        let be = DeviceBackend::new(EmuDevice::planted(n).expect("builds 1 to 6 exist"));
        let mut caught = None;
        for prepared in &groups {
            let (case_oracle, pair_oracle) = oracles(&oracle, prepared);
            let mut rep = Report::default();
            GroupRunner {
                cases: prepared,
                oracle: &case_oracle,
                pair_oracle: &pair_oracle,
            }
            .run(&be, &mut rep);
            caught = rep.failures.first().map(|f| f.line.clone());
            if caught.is_some() {
                break;
            }
        }
        match caught {
            Some(f) => kvlayout_conformance::report(&format!(
                "planted bug {n} ({bug}): caught by {}",
                f.chars().take(300).collect::<String>()
            )),
            None => missed.push(format!("{n} ({bug})")),
        }
    }
    assert!(
        missed.is_empty(),
        "planted bugs the suite missed: {missed:?}"
    );
}
