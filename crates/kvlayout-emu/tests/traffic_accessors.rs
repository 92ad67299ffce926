//! The kernel bodies reach global memory other than the cache only through the recording
//! accessors (`kvl_act`, `kvl_ld`, `kvl_st` of `common.cuh`), so the traffic recorder sees
//! every load and store: no parameter pointer, nor a local pointer derived from one, is
//! indexed directly.

use std::path::Path;

/// Global pointers of the parameter structs (`kvl_kernels.h`), cache buffers aside.
const GLOBALS: [&str; 9] = [
    "query",
    "out",
    "partials",
    "block_table",
    "seq_lens",
    "slot_mapping",
    "pairs",
    "key",
    "value",
];

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Local pointers assigned from a global or from another such local.
fn aliases(source: &str) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    loop {
        let before = names.len();
        for line in source.lines() {
            let Some((lhs, rhs)) = line.split_once('=') else {
                continue;
            };
            let Some(star) = lhs.rfind('*') else { continue };
            let name = lhs[star + 1..].trim();
            if name.is_empty() || !name.chars().all(is_ident) || names.iter().any(|n| n == name) {
                continue;
            }
            let from_global = GLOBALS.iter().any(|g| rhs.contains(&format!("p.{g}")));
            let from_alias = names.iter().any(|n| indexed_or_named(rhs, n, false));
            if from_global || from_alias {
                names.push(name.to_string());
            }
        }
        if names.len() == before {
            return names;
        }
    }
}

/// `name` as a whole word in `text`, followed by `[` when `indexed`.
fn indexed_or_named(text: &str, name: &str, indexed: bool) -> bool {
    text.match_indices(name).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + name.len()..].chars().next();
        before.is_none_or(|c| !is_ident(c) && c != '.')
            && match after {
                Some('[') => true,
                Some(c) => !indexed && !is_ident(c),
                None => !indexed,
            }
    })
}

fn direct_accesses(source: &str) -> Vec<String> {
    let names = aliases(source);
    source
        .lines()
        .filter(|l| {
            GLOBALS
                .iter()
                .any(|g| l.contains(&format!("p.{g}[")) || l.contains(&format!("p->{g}[")))
                || names.iter().any(|n| indexed_or_named(l, n, true))
        })
        .map(|l| l.trim().to_string())
        .collect()
}

#[test]
fn global_accesses_go_through_the_recording_accessors() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels-cuda/src");
    for file in ["write_kv.cuh", "paged_decode.cuh", "move_blocks.cuh"] {
        let text = std::fs::read_to_string(src.join(file)).unwrap();
        assert_eq!(direct_accesses(&text), Vec::<String>::new(), "{file}");
    }
    // The check itself: a direct index of a parameter and of a derived local are found.
    let planted = "const int32_t *table = p.block_table + seq;\nx = table[t];\ny = p.out[0];\n";
    assert_eq!(
        direct_accesses(planted),
        vec!["x = table[t];", "y = p.out[0];"]
    );
    assert!(
        direct_accesses("x = kvl_ld(table + t);\nconst int32_t *table = p.block_table;").is_empty()
    );
}
