//! Inputs for the property and fuzz tests: values a spec string may carry where a number or a
//! name belongs, and canonical spec strings with one token edited.

use proptest::prelude::*;

use crate::gen::any_layout;

/// A value a spec string may carry where a number or a name belongs: small and boundary
/// numbers (2^31, 2^32, 2^63, 2^64), signs, fractions, non-numbers and names of other keys.
pub fn wild_value() -> impl Strategy<Value = String> {
    prop_oneof![
        (0u64..20).prop_map(|v| v.to_string()),
        prop::sample::select(vec![
            "0",
            "128",
            "4095",
            "2147483648",
            "4294967296",
            "9223372036854775808",
            "18446744073709551615",
            "18446744073709551616",
            "-1",
            "1.5",
            "1e3",
            "",
            "NaN",
            "inf",
            "bf16",
            "fp8_e4m3",
            "int8",
            "NHD",
            "HND",
            "LBHNC",
            "vllm-paged-v1",
            "flashinfer-hnd",
            "0..0",
            "1:2",
        ])
        .prop_map(str::to_string),
    ]
}

/// A canonical spec string with one of its tokens edited: a value replaced, a token
/// dropped, a key repeated, or a stray `key=value` or explicit-stride token appended.
pub fn edited_spec() -> impl Strategy<Value = String> {
    let keys = prop::sample::select(vec![
        "L",
        "B",
        "N",
        "H",
        "tps",
        "D",
        "Dv",
        "rank",
        "rope",
        "row",
        "conv_dim",
        "conv_width",
        "head_dim",
        "state",
        "dtype",
        "k_scale",
        "v_scale",
        "order",
        "base",
        "align",
        "page",
        "layer_stride",
        "block_stride",
        "tensor",
        "legacy",
        "@K",
        "@V",
        "@buf1",
    ]);
    (
        any_layout(),
        0usize..64,
        0u8..4,
        keys,
        wild_value(),
        prop::collection::vec(wild_value(), 0..10),
    )
        .prop_map(|(l, at, edit, key, value, parts)| {
            let mut tokens: Vec<String> = l.to_string().split(' ').map(str::to_string).collect();
            let i = 1 + at % (tokens.len() - 1).max(1);
            match edit {
                0 if i < tokens.len() => {
                    let k = tokens[i].split('=').next().unwrap_or("").to_string();
                    tokens[i] = format!("{k}={value}");
                }
                1 if i < tokens.len() => {
                    tokens.remove(i);
                }
                2 => tokens.push(format!("{key}={value}")),
                _ => tokens.push(format!("{key}={}", parts.join(":"))),
            }
            tokens.join(" ")
        })
}
