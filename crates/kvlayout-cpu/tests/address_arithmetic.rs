//! The backend takes every address from the descriptor: no source file of this crate
//! multiplies by a stride field of a `FieldMap` (`FieldMap::slot_offset`, `head_offset`,
//! `offset_unchecked`, `split_strides` answer), nor binds a whole `strides` struct to a local,
//! which would hide such a product from this check.

use std::path::{Path, PathBuf};

const FIELDS: &str = "buffer|base_offset|layer|block|head|slot|dim_split|dim_chunk|dim";

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("readable source dir") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Offending lines of `text`: `(line number, line)`.
fn offences(text: &str) -> Vec<(usize, String)> {
    let fields: Vec<&str> = FIELDS.split('|').collect();
    let mut found = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        let mut bad = false;
        for f in &fields {
            let pat = format!("strides.{f}");
            let mut from = 0;
            while let Some(at) = code[from..].find(&pat) {
                let start = from + at;
                let end = start + pat.len();
                from = end;
                // A longer field name (`dim` in `dim_split`) is another field.
                if code[end..].starts_with(|c: char| c.is_alphanumeric() || c == '_') {
                    continue;
                }
                let after = code[end..].trim_start();
                let after = after.strip_prefix("as usize").unwrap_or(after).trim_start();
                // The operand before `strides.f` is a path such as `self.map.`.
                let before = code[..start]
                    .trim_end_matches(|c: char| c.is_alphanumeric() || c == '_' || c == '.')
                    .trim_end();
                if after.starts_with('*') || before.ends_with('*') {
                    bad = true;
                }
            }
        }
        let binds_whole = code.contains("strides;")
            && (code.contains("= &") || code.contains("= "))
            && code.trim_start().starts_with("let ");
        if bad || binds_whole {
            found.push((i + 1, line.trim().to_string()));
        }
    }
    found
}

#[test]
fn the_checker_sees_products_and_aliases() {
    assert_eq!(offences("let o = h * self.map.strides.head;").len(), 1);
    assert_eq!(offences("let o = m.strides.slot * n as u64;").len(), 1);
    assert_eq!(
        offences("let o = (h - h0) * self.k.map.strides.head as usize;").len(),
        1
    );
    assert_eq!(offences("let s = &self.map.strides;").len(), 1);
    assert_eq!(offences("if m.strides.head < m.strides.block {").len(), 0);
    assert_eq!(offences("let e = m.strides.dim_split == m.width;").len(), 0);
    assert_eq!(offences("// h * strides.head in a comment").len(), 0);
}

#[test]
fn no_backend_file_multiplies_by_a_stride() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    assert!(files.len() > 10, "found the sources: {files:?}");
    let mut report = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).expect("readable source");
        for (line, code) in offences(&text) {
            report.push(format!("{}:{line}: {code}", f.display()));
        }
    }
    assert!(
        report.is_empty(),
        "address arithmetic outside the descriptor (use FieldMap's helpers):\n{}",
        report.join("\n")
    );
}
