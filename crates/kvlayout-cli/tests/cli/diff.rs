//! `kvlayout diff`: identical layouts (exit 0), NHD against HND (exit 1, the head and token
//! strides named), one head where the order moves nothing (exit 0, the order listed), a
//! padded page against a dense one, a transfer the handshake refuses, block sizes that
//! differ (the sequence planned fits both pools and its label says what it moves), and a bad
//! argument.

use serde_json::Value;

use super::{kvlayout, ok, parse_json, stderr, stdout, u64s, user_error};

const H: u64 = 4;
const N: u64 = 16;
const D: u64 = 8;
/// f16.
const ELEM: u64 = 2;
const NHD: &str = "kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=NHD";
const HND: &str = "kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=HND";
const PADDED: &str = "kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=NHD page=4096";

/// A K|V row of one head and token in bytes, and the dense page.
const ROW: u64 = 2 * D * ELEM;
const PAGE: u64 = H * N * ROW;

/// `kvlayout diff A B --json` that exits 1 with one `error:` line naming the difference; its
/// JSON.
fn differing(a: &str, b: &str, says: &str) -> Value {
    let o = kvlayout(&["diff", a, b, "--json"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{a} vs {b}: {err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("error: layouts differ: "), "{err}");
    assert!(err.contains(says), "{err}");
    parse_json(&stdout(&o))
}

/// The stride difference of `field`'s `stride`, as `(a, b, matters)`.
fn stride(v: &Value, field: &str, stride: &str) -> Option<(u64, u64, bool)> {
    v["stride_differences"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["field"] == field && d["stride"] == stride)
        .map(|d| {
            (
                d["a"].as_u64().unwrap(),
                d["b"].as_u64().unwrap(),
                d["matters"].as_bool().unwrap(),
            )
        })
}

fn spec_difference(v: &Value, path: &str) -> Option<(Value, Value)> {
    v["spec_differences"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["path"] == path)
        .map(|d| (d["a"].clone(), d["b"].clone()))
}

#[test]
fn identical_layouts_are_byte_compatible_and_move_a_page_as_one_run() {
    let text = ok(&["diff", NHD, NHD]);
    assert!(
        text.contains("byte-compatible: every element at the same place"),
        "{text}"
    );
    let v = parse_json(&ok(&["diff", NHD, NHD, "--json"]));
    assert_eq!(v["version"], 2);
    assert_eq!(v["byte_compatible"], true);
    assert_eq!(v["addressing"], "same");
    for list in [
        "spec_differences",
        "stride_differences",
        "extent_differences",
    ] {
        assert_eq!(v[list].as_array().unwrap().len(), 0, "{list}");
    }
    assert_eq!(v["transfer"]["needs"], "direct");
    assert_eq!(v["transfer"]["direct"]["runs"], 1);
    assert_eq!(v["transfer"]["direct"]["bytes"].as_u64(), Some(PAGE));
}

#[test]
fn nhd_against_hnd_names_the_head_and_token_strides() {
    let v = differing(NHD, HND, "head stride");
    assert_eq!(v["byte_compatible"], false);
    // NHD: heads one K|V row apart, tokens H rows. HND: tokens one row apart, heads N rows.
    for field in ["k", "v"] {
        assert_eq!(stride(&v, field, "head"), Some((ROW, N * ROW, true)));
        assert_eq!(stride(&v, field, "slot"), Some((H * ROW, ROW, true)));
        assert_eq!(stride(&v, field, "block"), None, "same dense page");
    }
    let (a, b) = spec_difference(&v, "placement.order").expect("the order differs");
    assert_eq!((a.as_str(), b.as_str()), (Some("LBNHC"), Some("LBHNC")));
    let t = &v["transfer"];
    assert_eq!(t["needs"], "staged");
    let (direct, staged) = (t["direct"]["runs"].as_u64(), t["staged"]["runs"].as_u64());
    assert!(staged < direct, "{t}");
    // Direct: both pages keep a (token, head)'s K|V row whole, so one run per row.
    assert_eq!(direct, Some(H * N));
    assert_eq!(t["direct"]["bytes"].as_u64(), Some(PAGE));
    let text = stdout(&kvlayout(&["diff", NHD, HND]));
    assert!(
        text.contains("not byte-compatible: layouts differ: field k: head stride"),
        "{text}"
    );
    assert!(text.contains("needs: staged"), "{text}");
}

#[test]
fn one_head_in_two_blocks_is_byte_compatible_whatever_the_order() {
    let (a, b) = (
        "kv L=1 B=2 N=16 H=1 D=8 dtype=f16 order=NHD",
        "kv L=1 B=2 N=16 H=1 D=8 dtype=f16 order=HND",
    );
    let o = kvlayout(&["diff", a, b, "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v = parse_json(&stdout(&o));
    assert_eq!(v["byte_compatible"], true);
    assert!(spec_difference(&v, "placement.order").is_some());
    let (x, y, matters) = stride(&v, "k", "head").expect("the head stride differs");
    assert!(!matters && x != y);
    assert_eq!(v["transfer"]["needs"], "direct");
    assert_eq!(v["transfer"]["direct"]["runs"], 1);
}

#[test]
fn a_padded_page_against_a_dense_one() {
    let v = differing(NHD, PADDED, "block stride");
    let (a, b) = spec_difference(&v, "placement.page_size_padded").unwrap();
    assert_eq!((a, b), (Value::Null, Value::from(4096)));
    assert_eq!(stride(&v, "k", "block"), Some((PAGE, 4096, true)));
    assert_eq!(stride(&v, "k", "head"), None);
    assert_eq!(v["padded_page_bytes"], serde_json::json!([PAGE, 4096]));
    assert_eq!(v["dense_page_bytes"], serde_json::json!([PAGE, PAGE]));
    let spans = &v["extent_differences"][0];
    assert_eq!(spans["a"], serde_json::json!([0, 3 * PAGE]));
    assert_eq!(spans["b"], serde_json::json!([0, 3 * 4096]));
    // One page lands whole in the padded page: one run.
    assert_eq!(v["transfer"]["needs"], "direct");
    assert_eq!(v["transfer"]["direct"]["runs"], 1);
    assert_eq!(v["transfer"]["direct"]["bytes"].as_u64(), Some(PAGE));
}

#[test]
fn a_transfer_the_handshake_refuses_says_why() {
    let bf16 = "kv L=1 B=3 N=16 H=4 D=8 dtype=bf16 order=NHD";
    let v = differing(NHD, bf16, "content");
    assert_eq!(
        spec_difference(&v, "dtype").unwrap(),
        ("f16".into(), "bf16".into())
    );
    assert_eq!(v["transfer"]["needs"], "refused");
    let reason = v["transfer"]["reason"].as_str().unwrap();
    assert!(reason.contains("dtype: bf16 vs f16"), "{reason}");
}

/// `kv L=1 B={blocks} N={n} H=4 D=8 dtype=f16 order={order}`.
fn sized(blocks: u64, n: u64, order: &str) -> String {
    format!("kv L=1 B={blocks} N={n} H={H} D={D} dtype=f16 order={order}")
}

/// The transfer part of `diff a b`: the JSON's `transfer`, and the text's transfer line.
fn transfer(a: &str, b: &str) -> (Value, String) {
    let v = differing(a, b, "block_size");
    let text = stdout(&kvlayout(&["diff", a, b]));
    let line = text
        .lines()
        .find(|l| l.starts_with("transfer A -> B"))
        .unwrap_or_else(|| panic!("no transfer line: {text}"))
        .to_string();
    (v["transfer"].clone(), line)
}

#[test]
fn one_small_block_against_one_large_block_plans_what_the_pool_holds() {
    // The review's case: A's one block holds 16 tokens, B's one block 32. Both pools hold
    // the 16 tokens of A's block, into the first half of B's block.
    let (t, line) = transfer(&sized(1, 16, "NHD"), &sized(1, 32, "HND"));
    assert_eq!(t["tokens"], 16);
    assert_eq!(
        (u64s(&t["src_blocks"]), u64s(&t["dst_blocks"])),
        (vec![0], vec![0])
    );
    assert_ne!(t["needs"], "refused", "{t}");
    assert_eq!(t["needs"], "staged", "{t}");
    for plan in ["direct", "staged"] {
        assert_eq!(t[plan]["bytes"].as_u64(), Some(16 * H * ROW), "{plan}: {t}");
    }
    // Direct: one run per (token, head) K|V row, NHD rows into HND.
    assert_eq!(t["direct"]["runs"].as_u64(), Some(16 * H));
    let why = "all that A's 1 block of 16 tokens holds; B's blocks hold 32";
    assert_eq!(t["tokens_why"], why);
    assert_eq!(
        line,
        format!("transfer A -> B (TP 1 each): A blocks [0] -> B blocks [0], 16 tokens ({why})")
    );
}

#[test]
fn larger_a_blocks_label_the_tokens_and_blocks_planned() {
    // Pools of three: one 32-token A block fills two 16-token B blocks.
    let (t, line) = transfer(&sized(3, 32, "NHD"), &sized(3, 16, "NHD"));
    assert_eq!(t["tokens"], 32);
    assert_eq!(
        (u64s(&t["src_blocks"]), u64s(&t["dst_blocks"])),
        (vec![0], vec![0, 1])
    );
    assert_eq!(t["needs"], "direct");
    // A's page is B's two pages in a row (NHD, same head rows): one run.
    assert_eq!(t["direct"]["runs"], 1);
    assert_eq!(t["direct"]["bytes"].as_u64(), Some(32 * H * ROW));
    assert_eq!(
        line,
        "transfer A -> B (TP 1 each): A blocks [0] -> B blocks [0, 1], 32 tokens (whole \
         blocks on both sides, of 32 and 16 tokens)"
    );
    assert!(!line.contains("one B block"), "{line}");
    // B's pool of one 16-token block holds half of A's block.
    let (t, line) = transfer(&sized(1, 32, "NHD"), &sized(1, 16, "NHD"));
    assert_eq!(t["tokens"], 16);
    assert_eq!(
        (u64s(&t["src_blocks"]), u64s(&t["dst_blocks"])),
        (vec![0], vec![0])
    );
    assert_eq!(t["needs"], "direct");
    assert_eq!(t["direct"]["bytes"].as_u64(), Some(16 * H * ROW));
    assert!(
        line.ends_with(
            "A blocks [0] -> B blocks [0], 16 tokens (all that B's 1 block of 16 tokens \
             holds; A's blocks hold 32)"
        ),
        "{line}"
    );
}

#[test]
fn a_bad_layout_is_one_line() {
    let line = user_error(&["diff", NHD, "kv L=1 B=3 N=16 H=4 D=8 dtype=f17"]);
    assert!(line.contains("f17"), "{line}");
}
