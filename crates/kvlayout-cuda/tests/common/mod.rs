//! What the integration tests share: skip reports, a reader of PTX entry parameters checked
//! against the argument slots of `kvlayout_device::kernels`, and what the HIP backend's tests
//! share too (`kvlayout-device/tests/shared`).

#![allow(dead_code)] // Each test binary uses a part.

#[path = "../../../kvlayout-device/tests/shared/mod.rs"]
pub mod shared;

use kvlayout::{Field, KvCacheLayout};
use kvlayout_device::kernels::{
    arg_slots, move_calls, CacheAddrs, DecodeKernelParams, GpuTarget, Kernel, KernelArgs,
    WriteParams,
};

/// Writes `line` straight to stderr, past the test harness's capture, so CI logs count it.
pub fn report(line: &str) {
    use std::io::Write;
    // One write, so no output of the harness lands inside the line; best effort: a closed
    // stderr must not fail the test that reports.
    let _ = std::io::stderr()
        .lock()
        .write_all(format!("{line}\n").as_bytes());
}

/// Reports `skipped: <what>: <why>`; panics instead when the variable `require` is 1 (or,
/// for `KVLAYOUT_REQUIRE_GPU`, `cuda`).
pub fn skip(what: &str, why: &str, require: &str) {
    let line = format!("skipped: {what}: {why}");
    let value = std::env::var(require).unwrap_or_default();
    assert!(
        !(value == "1" || (require == "KVLAYOUT_REQUIRE_GPU" && value == "cuda")),
        "{require}={value}, but {}",
        &line["skipped: ".len()..]
    );
    report(&line);
}

/// Size in bytes of a PTX fundamental type (`.b8`, `.u64`, `.f32`, ...).
fn type_bytes(ty: &str) -> Option<usize> {
    let bits: usize = ty
        .strip_prefix(".b")
        .or_else(|| ty.strip_prefix(".u"))
        .or_else(|| ty.strip_prefix(".s"))
        .or_else(|| ty.strip_prefix(".f"))?
        .parse()
        .ok()?;
    matches!(bits, 8 | 16 | 32 | 64).then_some(bits / 8)
}

/// `(alignment, size)` of one `.param` declaration: `.param .align A .b8 name[N]` or
/// `.param .u64 name` (a `.ptr` attribute's `.align` is the pointee's, not the parameter's).
fn param(decl: &str) -> Result<(usize, usize), String> {
    let tokens: Vec<&str> = decl.split_whitespace().collect();
    if tokens.first() != Some(&".param") {
        return Err(format!("not a parameter: {decl:?}"));
    }
    let ty = tokens[1..]
        .iter()
        .find_map(|t| type_bytes(t))
        .ok_or_else(|| format!("no type in {decl:?}"))?;
    let ptr_at = tokens
        .iter()
        .position(|t| *t == ".ptr")
        .unwrap_or(tokens.len());
    let align = match tokens[..ptr_at].iter().position(|t| *t == ".align") {
        Some(i) => tokens
            .get(i + 1)
            .and_then(|a| a.parse().ok())
            .ok_or_else(|| format!("bad .align in {decl:?}"))?,
        None => ty,
    };
    let name = tokens.last().copied().unwrap_or_default();
    let count = match name.split_once('[') {
        Some((_, n)) => n
            .trim_end_matches(']')
            .parse()
            .map_err(|_| format!("bad array size in {decl:?}"))?,
        None => 1,
    };
    Ok((align, ty * count))
}

/// `(offset, size)` of each parameter of entry `name` in `ptx`: in order, each at the next
/// multiple of its alignment.
pub fn entry_slots(ptx: &str, name: &str) -> Result<Vec<(usize, usize)>, String> {
    let head = format!(".entry {name}(");
    let start = ptx.find(&head).ok_or_else(|| format!("no entry {name}"))? + head.len();
    let body = &ptx[start..];
    let end = body
        .find(')')
        .ok_or_else(|| format!("entry {name}: no end of parameters"))?;
    let list: String = body[..end]
        .lines()
        .map(|l| l.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join(" ");
    let mut at = 0usize;
    list.split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| {
            let (align, size) = param(d)?;
            let slot = (at.next_multiple_of(align), size);
            at = slot.0 + size;
            Ok(slot)
        })
        .collect()
}

/// One argument block per kernel, of real field arguments of a layout (and a real move call).
pub fn sample_args() -> Vec<KernelArgs> {
    let layout: KvCacheLayout = "kv B=3 N=16 H=4 D=8 dtype=f16 order=HND".parse().unwrap();
    let k = layout.kernel_args(Field::K).unwrap();
    let v = layout.kernel_args(Field::V).unwrap();
    let cache = CacheAddrs {
        layout: &layout,
        bases: [0x10_0000, 0],
    };
    let moves = kvlayout::ops::BlockMove::Copy(&[(0, 2)])
        .plan(None, &layout)
        .unwrap();
    let calls = move_calls(&GpuTarget::CUDA, &cache, &cache, &moves, 0x20_0000).unwrap();
    vec![
        KernelArgs::Write {
            fields: [k, v, k, v],
            params: WriteParams::default(),
        },
        KernelArgs::Decode {
            fields: [k, v, k, v],
            params: DecodeKernelParams::default(),
        },
        KernelArgs::Reduce {
            v,
            params: DecodeKernelParams::default(),
        },
        calls[0].args,
    ]
}

/// Every kernel of `ptx` (described by `what`) takes the parameters at the slots of
/// [`arg_slots`], and its parameters end where the argument block does.
pub fn check_entries(ptx: &str, what: &str) {
    let args = sample_args();
    for kernel in Kernel::ALL {
        let slots = entry_slots(ptx, kernel.name()).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(slots, arg_slots(kernel), "{what}: {}", kernel.name());
        let block = args.iter().find(|a| a.kernel() == kernel).unwrap().block();
        let end = slots.last().map_or(0, |&(o, s)| o + s);
        assert_eq!(end, block.len(), "{what}: {}", kernel.name());
    }
}
