//! Edited spec strings: each a typed error or a layout whose every derivation answers.

use kvlayout::{Convention, Coord, Field, KvCacheLayout, ViewTarget};
use kvlayout_conformance::inputs::edited_spec;
use proptest::test_runner::TestCaseError;

use crate::config;

/// Every edited spec string either gets a typed error or parses to a layout whose canonical
/// form and JSON round-trip and whose derived views, arguments, regions and transformations
/// answer (a value or an error) without panicking. Both outcomes must come up.
#[test]
fn edited_spec_strings_parse_or_fail_cleanly() {
    use proptest::test_runner::{Config, TestRunner};
    let (parsed, refused) = (std::cell::Cell::new(0u32), std::cell::Cell::new(0u32));
    let mut runner = TestRunner::new(Config {
        failure_persistence: None,
        ..config(2000)
    });
    runner
        .run(&edited_spec(), |s| {
            let outcome = std::panic::catch_unwind(|| match s.parse::<KvCacheLayout>() {
                Ok(l) => {
                    exercise_derivations(&l);
                    true
                }
                Err(_) => false,
            });
            match outcome {
                Ok(true) => parsed.set(parsed.get() + 1),
                Ok(false) => refused.set(refused.get() + 1),
                Err(_) => return Err(TestCaseError::fail(format!("panic on {s:?}"))),
            }
            Ok(())
        })
        .unwrap();
    let (parsed, refused) = (parsed.get(), refused.get());
    assert!(
        parsed > 100 && refused > 100,
        "parsed {parsed}, refused {refused}"
    );
}

/// Calls every derivation of a layout with ordinary and extreme arguments; panics only on a
/// broken round trip.
fn exercise_derivations(l: &KvCacheLayout) {
    let text = l.to_string();
    let back: KvCacheLayout = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
    assert!(back.same_addressing(l).is_ok(), "{text}");
    let json = serde_json::to_string(l).unwrap();
    assert!(
        KvCacheLayout::from_json(&json)
            .unwrap()
            .same_addressing(l)
            .is_ok(),
        "{text}"
    );
    let _ = l.explain().to_text();
    let _ = l.registered_spans();
    let fields = l.readable_fields();
    for &field in &fields {
        let _ = l.kernel_args(field);
        for c in [
            [0, 0, 0, 0, 0],
            [u64::MAX, 0, 0, 0, 0],
            [0, u64::MAX, 0, 0, 0],
            [0, 0, 0, 0, u64::MAX],
        ] {
            let coord = Coord {
                layer: c[0],
                block: c[1],
                head: c[2],
                slot: c[3],
                field,
                dim: c[4],
            };
            let _ = l.offset(&coord);
        }
    }
    for tp in [0, 1, 2, 3, 8, u64::MAX] {
        for rank in [0, 1, u64::MAX] {
            let _ = l.tp_slice(tp, rank);
        }
    }
    for ratio in [0, 1, 2, 3, 16, u64::MAX] {
        let _ = l.split_blocks(ratio);
    }
    for (a, b) in [(0, 1), (0, u64::MAX), (u64::MAX, 0), (3, 2)] {
        let _ = l.layer_range(a..b);
        let _ = l.layer_regions(a..b);
        let _ = l.block_regions(a, 0..1, a..b);
    }
    let targets = [
        ViewTarget::Kv,
        ViewTarget::Field(Field::K),
        ViewTarget::Field(Field::V),
    ];
    for name in kvlayout::CONVENTION_NAMES {
        let c = Convention::from_name(name).unwrap();
        for t in targets {
            for layer in [0, u64::MAX] {
                let _ = l.view(c, t, layer);
            }
        }
    }
}
