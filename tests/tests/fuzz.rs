//! A fuzz test bounded in time: spec strings with one token edited, layouts' JSON with one
//! value replaced or one key dropped, and op arguments whose counts overflow when multiplied.
//! Every input either gets a typed, one-line error or is accepted, and nothing panics; every
//! accepted layout's stored fields lie inside its registered span without sharing a byte, and
//! `offset`, the kernel arguments and every view that exists agree element by element with an
//! independent reference; the fast path and the reference accept or refuse the same op
//! arguments, and a refused op leaves its output as it was.
//!
//! `KVLAYOUT_FUZZ_SECONDS` sets the budget (default 20 s, shared by the three kinds of input)
//! and `KVLAYOUT_FUZZ_SEED` the seed (default 7): the same seed draws the same inputs, as many
//! as the budget allows. A failure prints the input.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use kvlayout::ops::DecodeParams;
use kvlayout::{ByteRange, KvCacheLayout};
use kvlayout_conformance::domain::{
    coord_of, coords, for_each_index, reference_offset, CONVENTIONS,
};
use kvlayout_conformance::gen::any_layout;
use kvlayout_conformance::inputs::edited_spec;
use kvlayout_conformance::view_targets;
use kvlayout_cpu::{
    Activations, CpuBackend, Decode, HostCache, HostExec, ScalarReference, WriteKv,
};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

/// The whole budget.
fn budget() -> Duration {
    let secs = std::env::var("KVLAYOUT_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .unwrap_or(20.0);
    Duration::from_secs_f64(secs)
}

/// Elements of all readable fields above which a layout's element-by-element checks are left
/// out (its refusals and derivations are still run).
const MAX_CHECKED_ELEMENTS: u64 = 40_000;

/// Draws inputs of `strategy` for `time` and runs `check` on each; a panic or an `Err` fails
/// with the input. Returns (inputs, inputs `check` accepted).
fn fuzz<S: Strategy>(
    what: &str,
    strategy: S,
    time: Duration,
    check: impl Fn(&S::Value) -> Result<bool, String>,
) -> (u64, u64)
where
    S::Value: std::fmt::Debug,
{
    let seed = std::env::var("KVLAYOUT_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(7);
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &bytes),
    );
    let start = Instant::now();
    let (mut n, mut accepted) = (0u64, 0u64);
    while start.elapsed() < time {
        let Ok(tree) = strategy.new_tree(&mut runner) else {
            continue;
        };
        let input = tree.current();
        match catch_unwind(AssertUnwindSafe(|| check(&input))) {
            Ok(Ok(ok)) => accepted += u64::from(ok),
            Ok(Err(e)) => panic!("{what}: {e}\ninput: {input:?}"),
            Err(_) => panic!("{what}: panicked on input: {input:?}"),
        }
        n += 1;
    }
    kvlayout_conformance::report(&format!(
        "fuzz: {what}: {n} inputs in {:.1} s, {accepted} accepted",
        start.elapsed().as_secs_f64()
    ));
    (n, accepted)
}

/// An error's text: one line, not empty.
fn one_line(e: &impl std::fmt::Display) -> Result<(), String> {
    let text = e.to_string();
    if text.is_empty() || text.contains('\n') {
        return Err(format!("error is not one line: {text:?}"));
    }
    Ok(())
}

/// The invariants of an accepted layout, checked against the independent reference.
fn check_layout(l: &KvCacheLayout) -> Result<(), String> {
    let elements: u64 = l
        .readable_fields()
        .iter()
        .map(|&f| l.field_map(f).map_or(0, |m| m.num_elements()))
        .fold(0, u64::saturating_add);
    if elements > MAX_CHECKED_ELEMENTS {
        return Ok(());
    }
    check_stored_fields(l)?;
    check_offsets(l)?;
    check_views(l)
}

/// Stored fields: inside the registered span, no byte shared.
fn check_stored_fields(l: &KvCacheLayout) -> Result<(), String> {
    let spans = l.registered_spans();
    let mut ranges: Vec<ByteRange> = coords(l, true)
        .iter()
        .map(|c| {
            let (buffer, offset) = reference_offset(l, c);
            let len = l.field_map(c.field).map_or(1, |m| m.elem_bytes());
            ByteRange {
                buffer,
                offset,
                len,
            }
        })
        .collect();
    for r in &ranges {
        let s = spans[r.buffer as usize];
        if r.offset < s.offset || r.offset + r.len > s.offset + s.len {
            return Err(format!("{r:?} outside the registered span {s:?} of {l}"));
        }
    }
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        if w[0].buffer == w[1].buffer && w[0].offset + w[0].len > w[1].offset {
            return Err(format!("{:?} and {:?} share bytes in {l}", w[0], w[1]));
        }
    }
    Ok(())
}

/// Every readable field: offset and kernel arguments against the reference.
fn check_offsets(l: &KvCacheLayout) -> Result<(), String> {
    for c in coords(l, false) {
        let at = l.offset(&c).map_err(|e| format!("{c:?}: {e} in {l}"))?;
        if (at.buffer, at.offset) != reference_offset(l, &c) {
            return Err(format!("offset of {c:?} is {at:?} in {l}"));
        }
        let a = l.kernel_args(c.field).map_err(|e| e.to_string())?;
        let i = |x: u64| x as i64;
        let off = a
            .offset(i(c.layer), i(c.block), i(c.head), i(c.slot), i(c.dim))
            .map_err(|e| format!("kernel_args {c:?}: {e} in {l}"))?;
        if off as u64 != at.offset {
            return Err(format!("kernel_args offset of {c:?} is {off} in {l}"));
        }
    }
    Ok(())
}

/// Every view that exists, of the first and the last layer, element by element.
fn check_views(l: &KvCacheLayout) -> Result<(), String> {
    let targets = view_targets(l);
    let last = l.geometry().num_layers - 1;
    for conv in CONVENTIONS {
        for &t in &targets {
            for layer in [0, last] {
                let v = match l.view(conv, t, layer) {
                    Ok(v) => v,
                    Err(e) => {
                        one_line(&e)?;
                        continue;
                    }
                };
                let x = v.dtype.vllm_x();
                let mut bad = None;
                for_each_index(&v.shape, |idx| {
                    let c = coord_of(conv, t, layer, x, idx);
                    let want = reference_offset(l, &c);
                    let got = v.byte_offset(idx).map(|o| (v.buffer, o));
                    if got.as_ref().ok() != Some(&want) && bad.is_none() {
                        bad = Some((idx.to_vec(), want, got));
                    }
                });
                if let Some(b) = bad {
                    return Err(format!("{conv} {t} layer {layer} of {l}: {b:?}"));
                }
            }
        }
    }
    Ok(())
}

/// A layout's JSON with one value replaced by a wild one, or one key dropped.
fn edited_json() -> impl Strategy<Value = String> {
    let wild = prop::sample::select(vec![
        "0",
        "1",
        "3",
        "2147483648",
        "4294967296",
        "9007199254740993",
        "9223372036854775807",
        "9223372036854775808",
        "18446744073709551615",
        "18446744073709551616",
        "-1",
        "1.5",
        "1e300",
        "null",
        "true",
        "\"\"",
        "\"bf16\"",
        "\"LBHNC\"",
        "[]",
        "{}",
    ]);
    (
        any_layout(),
        any::<prop::sample::Index>(),
        wild,
        any::<bool>(),
    )
        .prop_map(|(l, at, value, drop)| {
            let mut doc = serde_json::to_value(&l).expect("a layout serializes");
            let mut leaves = Vec::new();
            paths(&doc, &mut Vec::new(), &mut leaves);
            if leaves.is_empty() {
                return doc.to_string();
            }
            let path = &leaves[at.index(leaves.len())];
            let (last, parent) = path.split_last().expect("a leaf has a path");
            let mut node = &mut doc;
            for key in parent {
                node = step(node, key);
            }
            match (node, drop) {
                (serde_json::Value::Object(m), true) => {
                    m.remove(last);
                }
                (node, _) => {
                    *step(node, last) = serde_json::from_str(value).expect("wild JSON parses");
                }
            }
            doc.to_string()
        })
}

/// Every leaf's path (object keys, array indices as text).
fn paths(v: &serde_json::Value, at: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                at.push(k.clone());
                paths(x, at, out);
                at.pop();
            }
        }
        serde_json::Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                at.push(i.to_string());
                paths(x, at, out);
                at.pop();
            }
        }
        _ => out.push(at.clone()),
    }
}

fn step<'a>(v: &'a mut serde_json::Value, key: &str) -> &'a mut serde_json::Value {
    match v {
        serde_json::Value::Array(a) => &mut a[key.parse::<usize>().expect("an index")],
        other => &mut other[key],
    }
}

/// `paged_decode` and `write_kv` arguments of a decodable layout, with counts that overflow
/// when multiplied or lie far past the cache.
#[derive(Debug, Clone)]
struct OpArgs {
    layout: KvCacheLayout,
    seqs: usize,
    blocks_per_seq: usize,
    table: Vec<i32>,
    lens: Vec<u32>,
    q_heads: u64,
    /// Query and output lengths: the shape's product (when small), 0, or a few elements.
    query_len: Option<usize>,
    layer: u64,
    slots: Vec<i64>,
}

fn op_args() -> impl Strategy<Value = OpArgs> {
    let decodable = any_layout().prop_filter("keys and values, one token per state", |l| {
        l.geometry().tokens_per_state == 1 && kvlayout::ops::decode_widths(l).is_ok()
    });
    let huge_usize = prop::sample::select(vec![
        0usize,
        1,
        2,
        3,
        usize::MAX / 3 + 1,
        usize::MAX / 2 + 1,
        usize::MAX,
    ]);
    let q_heads = prop::sample::select(vec![0u64, 1, 2, 4, 3, 1 << 61, 1 << 62, u64::MAX]);
    let block = prop_oneof![4 => 0i32..4, 1 => prop::sample::select(vec![-1, i32::MIN, i32::MAX])];
    let len = prop_oneof![4 => 0u32..40, 1 => prop::sample::select(vec![u32::MAX, 1 << 31])];
    let slot =
        prop_oneof![4 => -1i64..40, 1 => prop::sample::select(vec![i64::MIN, i64::MAX, 1 << 40])];
    (
        decodable,
        (0usize..4, huge_usize),
        prop::collection::vec(block, 0..12),
        prop::collection::vec(len, 0..4),
        (q_heads, prop::option::of(0usize..6)),
        prop::sample::select(vec![0u64, 1, u64::MAX]),
        prop::collection::vec(slot, 0..6),
    )
        .prop_map(
            |(layout, (seqs, blocks_per_seq), table, lens, (q_heads, query_len), layer, slots)| {
                OpArgs {
                    layout,
                    seqs,
                    blocks_per_seq,
                    table,
                    lens,
                    q_heads,
                    query_len,
                    layer,
                    slots,
                }
            },
        )
}

/// The fast path and the reference on the same wild arguments: same outcome, one-line errors,
/// nothing written by a refusal.
fn check_ops(be: &CpuBackend, a: &OpArgs) -> Result<bool, String> {
    let l = &a.layout;
    let (kw, vw) = kvlayout::ops::decode_widths(l).map_err(|e| e.to_string())?;
    let heads = l.geometry().num_kv_heads as usize;
    let mla = l.content().shares_latent();
    // A shape's element count when it is small enough to allocate, else none.
    let small = |xs: &[usize]| {
        xs.iter()
            .try_fold(1usize, |n, &x| n.checked_mul(x))
            .filter(|&n| n <= 1 << 16)
    };
    let tokens = a.slots.len();
    let k = vec![0.5f32; small(&[tokens, heads, kw as usize]).unwrap_or(0)];
    let v = vec![0.25f32; small(&[tokens, heads, vw as usize]).unwrap_or(0)];
    let w = WriteKv {
        layer: a.layer,
        key: Activations::F32(&k),
        value: (!mla).then_some(Activations::F32(&v)),
        slot_mapping: &a.slots,
    };
    let (mut fast, mut slow) = (
        HostCache::new(l.clone()).map_err(|e| e.to_string())?,
        HostCache::new(l.clone()).map_err(|e| e.to_string())?,
    );
    let rf = be.write_kv(&mut fast.as_mut(), &w);
    let rs = ScalarReference.write_kv(&mut slow.as_mut(), &w);
    if rf != rs {
        return Err(format!("write_kv: fast {rf:?}, reference {rs:?}"));
    }
    if let Err(e) = &rf {
        one_line(e)?;
    }
    let q_heads = usize::try_from(a.q_heads).unwrap_or(usize::MAX);
    let q_len = a
        .query_len
        .or_else(|| small(&[a.seqs, q_heads, kw as usize]))
        .unwrap_or(0);
    let out_len = a
        .query_len
        .or_else(|| small(&[a.seqs, q_heads, vw as usize]))
        .unwrap_or(0);
    let q = vec![0.125f32; q_len];
    let lens: Vec<u32> = a.lens.iter().copied().cycle().take(a.seqs).collect();
    let d = Decode {
        layer: a.layer,
        query: Activations::F32(&q),
        block_table: &a.table,
        blocks_per_seq: a.blocks_per_seq,
        seq_lens: if a.lens.is_empty() { &[] } else { &lens },
        params: DecodeParams {
            num_q_heads: a.q_heads,
            scale: 0.5,
            sliding_window: None,
            soft_cap: None,
        },
    };
    let (mut out_fast, mut out_slow) = (vec![-7.0f32; out_len], vec![-7.0f32; out_len]);
    let rf = be.paged_decode(&fast.as_ref(), &d, &mut out_fast);
    let rs = ScalarReference.paged_decode(&slow.as_ref(), &d, &mut out_slow);
    match (&rf, &rs) {
        (Ok(()), Ok(())) => Ok(true),
        (Err(a), Err(b)) if a == b => {
            one_line(a)?;
            if out_fast.iter().any(|&x| x != -7.0) {
                return Err(format!("refused decode ({a}) wrote its output"));
            }
            Ok(false)
        }
        _ => Err(format!("paged_decode: fast {rf:?}, reference {rs:?}")),
    }
}

#[test]
fn fuzz_specs_json_and_op_arguments() {
    let share = budget() / 3;
    let layouts = Cell::new(0u64);
    let (n, ok) = fuzz(
        "spec strings",
        edited_spec(),
        share,
        |s| match s.parse::<KvCacheLayout>() {
            Ok(l) => {
                check_layout(&l)?;
                layouts.set(layouts.get() + 1);
                Ok(true)
            }
            Err(e) => one_line(&e).map(|()| false),
        },
    );
    assert!(
        n > 0 && ok > 0 && ok < n,
        "spec strings: {ok} of {n} accepted"
    );
    let (n, ok) = fuzz(
        "layout JSON",
        edited_json(),
        share,
        |text| match KvCacheLayout::from_json(text) {
            Ok(l) => check_layout(&l).map(|()| true),
            Err(e) => one_line(&e).map(|()| false),
        },
    );
    assert!(
        n > 0 && ok > 0 && ok < n,
        "layout JSON: {ok} of {n} accepted"
    );
    let be = CpuBackend::new(Some(2));
    let (n, ok) = fuzz("op arguments", op_args(), share, |a| check_ops(&be, a));
    assert!(n > 0 && ok < n, "op arguments: {ok} of {n} accepted");
}
