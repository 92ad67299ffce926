//! Test support shared by the device backends' integration tests (`kvlayout-cuda`,
//! `kvlayout-hip`), which include this file by path (a test helper crate would be one more
//! dependency): the bytes a block move leaves, worked out by hand from the layout's block
//! regions; a command run to success; `scripts/kernels.sh`; a SHA-256 in hex.
//!
//! It is no test of this crate: cargo builds only the files directly under `tests/`.

#![allow(dead_code)] // Each test binary uses a part.

use std::path::Path;
use std::process::{Command, Output};

use kvlayout::KvCacheLayout;
use sha2::{Digest, Sha256};

/// `dst` after copying each `(src, dst)` block of `pairs` from `src` by hand, region by
/// region of `layout` (all layers and heads).
pub fn moved(
    layout: &KvCacheLayout,
    src: &[Vec<u8>],
    dst: &[Vec<u8>],
    pairs: &[(u64, u64)],
) -> Vec<Vec<u8>> {
    let g = layout.geometry();
    let regions = |block| {
        layout
            .block_regions(block, 0..g.num_layers, 0..g.num_kv_heads)
            .unwrap_or_else(|e| panic!("regions of block {block}: {e}"))
    };
    let mut out = dst.to_vec();
    for &(s, d) in pairs {
        let (from, to) = (regions(s), regions(d));
        assert_eq!(from.len(), to.len());
        for (f, t) in from.iter().zip(&to) {
            assert_eq!((f.buffer, f.len), (t.buffer, t.len));
            let (fo, to_, n) = (f.offset as usize, t.offset as usize, f.len as usize);
            out[t.buffer as usize][to_..to_ + n]
                .copy_from_slice(&src[f.buffer as usize][fo..fo + n]);
        }
    }
    out
}

/// What `cmd` printed, once it has succeeded (else a panic with its output).
pub fn succeeded(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?} cannot be run: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs `scripts/kernels.sh <out> <target>` (`cuda` or `hip`): the kernels of `target`
/// compiled into `out`, or a panic.
pub fn kernels_sh(out: &Path, target: &str) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/kernels.sh");
    succeeded(Command::new("bash").arg(script).arg(out).arg(target));
}

/// SHA-256 of `bytes`, in lower-case hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
