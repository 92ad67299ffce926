//! What the emulator crate's integration tests share: a zeroed cache, a write of layer 0, and
//! a script of the repository run to success.

#![allow(dead_code)] // Each test binary uses a part.

use std::path::Path;
use std::process::Command;

use kvlayout::ops::{Backend, BufferShape, WriteArgs};
use kvlayout::KvCacheLayout;

/// A cache of `l` on `be`, every byte zero.
pub fn zeroed_cache<B: Backend>(be: &B, l: &KvCacheLayout) -> B::Cache {
    let mut cache = be.alloc_cache(l, &BufferShape::exact(l)).unwrap();
    let zeros: Vec<Vec<u8>> = l
        .extents()
        .iter()
        .map(|x| vec![0; x.end as usize])
        .collect();
    be.upload_cache(&mut cache, &zeros).unwrap();
    cache
}

/// `write_kv` of `key` and `value` (tensors of `be`) at `slots` of layer 0, waited for.
pub fn write_layer0<B: Backend>(
    be: &B,
    cache: &mut B::Cache,
    (key, value): (&B::Tensor, &B::Tensor),
    slots: &[i64],
) {
    let w = WriteArgs {
        layer: 0,
        key,
        value: Some(value),
        slot_mapping: slots,
    };
    be.wait(be.write_kv(cache, &w).unwrap()).unwrap();
}

/// `bash <script> <args>`, the script's path from the repository root: its stdout then its
/// stderr, once it has succeeded.
pub fn run_script(script: &str, args: &[&Path]) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let run = Command::new("bash")
        .arg(root.join(script))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {script}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(run.status.success(), "{script} failed:\n{text}");
    text
}
