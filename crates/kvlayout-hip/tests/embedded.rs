//! The embedded code objects are the ones `scripts/kernels.sh` compiles (same SHA-256), and
//! each one's kernels take exactly the argument blocks `kvlayout_device::kernels` packs: explicit
//! arguments at `arg_slots`, hidden ones after the block, the target's wavefront width.
//! Tools that are missing (clang-19, llvm-readelf-19) skip visibly; with
//! `KVLAYOUT_REQUIRE_CLANG=1` they fail instead.

#[path = "../../kvlayout-device/tests/shared/mod.rs"]
mod shared;

use std::path::{Path, PathBuf};
use std::process::Command;

use kvlayout::ops::{
    check_decode, check_write, BlockMove, DecodeArgs, DecodeParams, TensorDesc, WriteArgs,
};
use kvlayout::{DType, KvCacheLayout};
use kvlayout_device::kernels::{
    arg_slots, decode_calls, decode_plan, move_calls, write_kv_call, CacheAddrs, DecodeAddrs,
    DecodeSite, GpuTarget, Kernel, KernelCall, WriteAddrs,
};
use kvlayout_hip::{code_objects, why_not_embedded, CodeObject};
use shared::{kernels_sh, sha256_hex, succeeded};

fn require_clang() -> bool {
    std::env::var("KVLAYOUT_REQUIRE_CLANG").is_ok_and(|v| v == "1")
}

/// Prints the skip line, or fails under `KVLAYOUT_REQUIRE_CLANG=1`.
fn skip(what: &str, why: &str) {
    assert!(
        !require_clang(),
        "KVLAYOUT_REQUIRE_CLANG=1 but {what}: {why}"
    );
    // Straight to stderr, past the test harness's capture, so CI logs show it.
    use std::io::Write;
    let _ = std::io::stderr()
        .lock()
        .write_all(format!("skipped: {what}: {why}\n").as_bytes());
}

/// The embedded objects, or `None` after printing why there are none.
fn embedded(what: &str) -> Option<&'static [CodeObject]> {
    let objects = code_objects();
    if objects.is_empty() {
        skip(
            what,
            why_not_embedded().unwrap_or("no code objects embedded"),
        );
        return None;
    }
    Some(objects)
}

/// A fresh directory under the system's temporary directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let dir = std::env::temp_dir().join(format!(
            "kvlayout-hip-{name}-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("create a temporary directory");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tool(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_string())
}

/// `Ok` when `program --version` runs, else why not.
fn runs(program: &str) -> Result<(), String> {
    match Command::new(program).arg("--version").output() {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!("`{program} --version` failed ({})", o.status)),
        Err(e) => Err(format!("{program} cannot be run ({e})")),
    }
}

#[test]
fn embedded_objects_are_the_three_targets_with_their_hashes() {
    let Some(objects) = embedded("hip code objects") else {
        return;
    };
    let archs: Vec<_> = objects.iter().map(|o| (o.arch, o.wavefront_size)).collect();
    assert_eq!(archs, [("gfx90a", 64), ("gfx942", 64), ("gfx1100", 32)]);
    for o in objects {
        assert_eq!(sha256_hex(o.bytes), o.sha256, "{}", o.arch);
        let target = o.target();
        let want = if o.wavefront_size == 64 {
            GpuTarget::CDNA
        } else {
            GpuTarget::RDNA
        };
        assert_eq!(target, want, "{}", o.arch);
    }
}

#[test]
fn kernels_sh_reproduces_the_embedded_objects() {
    let Some(objects) = embedded("hip code objects vs kernels.sh") else {
        return;
    };
    let clang = tool("KVLAYOUT_CLANG", "clang-19");
    let readelf = tool("KVLAYOUT_READELF", "llvm-readelf-19");
    if let Err(why) = runs(&clang).and_then(|()| runs(&readelf)) {
        return skip("hip code objects vs kernels.sh", &why);
    }
    let dir = TempDir::new("kernels");
    kernels_sh(&dir.0, "hip");
    for o in objects {
        let path = dir.0.join(format!("kvlayout.{}.co", o.arch));
        let bytes = std::fs::read(&path).expect("read a compiled code object");
        assert_eq!(
            sha256_hex(&bytes),
            o.sha256,
            "{}: the embedded code object differs from what kernels.sh compiles",
            o.arch
        );
    }
}

/// One kernel argument of the AMDGPU metadata.
#[derive(Debug, Default, Clone)]
struct MetaArg {
    offset: usize,
    size: usize,
    value_kind: String,
}

/// One kernel of the AMDGPU metadata.
#[derive(Debug, Default, Clone)]
struct MetaKernel {
    name: String,
    args: Vec<MetaArg>,
    kernarg_segment_size: usize,
    wavefront_size: u32,
}

/// `key: value` of a YAML mapping line (the value may be empty).
fn key_value(line: &str) -> Option<(&str, &str)> {
    let (k, v) = line.split_once(':')?;
    Some((k.trim(), v.trim()))
}

fn number(key: &str, v: &str) -> usize {
    v.parse()
        .unwrap_or_else(|_| panic!("{key}: not a number: {v:?}"))
}

/// The `amdhsa.kernels` list of `llvm-readelf --notes` output: kernels at one indentation,
/// their keys two deeper, the `.args` list items two deeper again, their keys two deeper.
fn parse_kernels(notes: &str) -> Vec<MetaKernel> {
    let mut lines = notes.lines().skip_while(|l| l.trim() != "amdhsa.kernels:");
    lines.next();
    let mut kernels: Vec<MetaKernel> = Vec::new();
    let mut kernel_indent = None;
    let mut in_args = false;
    for line in lines {
        let content = line.trim_start();
        let indent = line.len() - content.len();
        let base = *kernel_indent.get_or_insert(indent);
        if indent < base || (indent == base && !content.starts_with("- ")) {
            break; // the next top-level key
        }
        let (item, body, body_indent) = match content.strip_prefix("- ") {
            Some(rest) => (true, rest, indent + 2),
            None => (false, content, indent),
        };
        if item && indent == base {
            kernels.push(MetaKernel::default());
            in_args = false;
        }
        let kernel = kernels.last_mut().expect("a kernel item first");
        let Some((key, value)) = key_value(body) else {
            continue;
        };
        if body_indent == base + 2 {
            in_args = key == ".args";
            match key {
                ".name" => kernel.name = value.to_string(),
                ".kernarg_segment_size" => kernel.kernarg_segment_size = number(key, value),
                ".wavefront_size" => kernel.wavefront_size = number(key, value) as u32,
                _ => {}
            }
        } else if in_args && body_indent == base + 6 {
            if item && indent == base + 4 {
                kernel.args.push(MetaArg::default());
            }
            let arg = kernel.args.last_mut().expect("an argument item first");
            match key {
                ".offset" => arg.offset = number(key, value),
                ".size" => arg.size = number(key, value),
                ".value_kind" => arg.value_kind = value.to_string(),
                _ => {}
            }
        }
    }
    kernels
}

/// `llvm-readelf --notes` of `object`, written to a file in `dir`.
fn notes(readelf: &str, dir: &Path, object: &CodeObject) -> String {
    let path = dir.join(format!("kvlayout.{}.co", object.arch));
    std::fs::write(&path, object.bytes).expect("write the code object");
    let out = succeeded(Command::new(readelf).arg("--notes").arg(&path));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A dense activation tensor's description.
struct Act(DType, usize);

impl TensorDesc for Act {
    fn dtype(&self) -> DType {
        self.0
    }
    fn len(&self) -> usize {
        self.1
    }
}

/// Real launches of every kernel, as DeviceBackend builds them: a write, a decode long
/// enough to be partitioned (main kernel and reduction) and a block copy.
fn real_calls(target: &GpuTarget) -> Vec<KernelCall> {
    let layout: KvCacheLayout = "kv B=64 N=16 H=4 D=8 dtype=f16 order=HND"
        .parse()
        .expect("layout");
    let cache = CacheAddrs {
        layout: &layout,
        bases: [0x10_0000, 0],
    };
    let mut calls = Vec::new();

    let slots = [0i64, 17];
    let (key, value) = (Act(DType::F16, 2 * 4 * 8), Act(DType::F16, 2 * 4 * 8));
    let w = WriteArgs {
        layer: 0,
        key: &key,
        value: Some(&value),
        slot_mapping: &slots,
    };
    let shape = check_write(&layout, &w).expect("write shape");
    let at = WriteAddrs {
        key: 0x20_0000,
        value: 0x30_0000,
        slot_mapping: 0x40_0000,
    };
    calls.extend(
        write_kv_call(target, &cache, &shape, slots.len(), 0, DType::F16, &at).expect("write call"),
    );

    let seq_lens = [600u32];
    let blocks_per_seq = 40;
    let table: Vec<i32> = (0..blocks_per_seq as i32).collect();
    let query = Act(DType::F16, 4 * 8);
    let params = DecodeParams {
        num_q_heads: 4,
        scale: 0.35,
        sliding_window: None,
        soft_cap: None,
    };
    let d = DecodeArgs {
        layer: 0,
        query: &query,
        block_table: &table,
        blocks_per_seq,
        seq_lens: &seq_lens,
        params,
    };
    let shape = check_decode(&layout, &d, 4 * 8).expect("decode shape");
    let launch = decode_plan(target, &cache, &shape, &seq_lens, &params)
        .expect("decode plan")
        .expect("one sequence");
    let site = DecodeSite {
        layer: 0,
        blocks_per_seq,
        act_dtype: DType::F16,
        params,
    };
    let at = DecodeAddrs {
        query: 0x50_0000,
        block_table: 0x60_0000,
        seq_lens: 0x70_0000,
        out: 0x80_0000,
        partials: 0x90_0000,
    };
    calls.extend(decode_calls(&cache, &shape, &launch, &site, &at).expect("decode calls"));

    let m = BlockMove::Copy(&[(0, 2), (1, 3)])
        .plan(None, &layout)
        .expect("moves");
    calls.extend(move_calls(target, &cache, &cache, &m, 0xabc0).expect("move calls"));
    calls
}

#[test]
fn metadata_matches_the_argument_blocks() {
    let Some(objects) = embedded("hip kernel metadata") else {
        return;
    };
    let readelf = tool("KVLAYOUT_READELF", "llvm-readelf-19");
    if let Err(why) = runs(&readelf) {
        return skip("hip kernel metadata", &why);
    }
    let dir = TempDir::new("notes");
    for object in objects {
        let notes = notes(&readelf, &dir.0, object);
        let kernels = parse_kernels(&notes);
        let calls = real_calls(&object.target());
        for kernel in Kernel::ALL {
            let what = format!("{} {}", object.arch, kernel.name());
            let meta = kernels
                .iter()
                .find(|k| k.name == kernel.name())
                .unwrap_or_else(|| panic!("{what}: not in the metadata"));
            assert_eq!(meta.wavefront_size, object.wavefront_size, "{what}");
            let explicit = meta
                .args
                .iter()
                .take_while(|a| !a.value_kind.starts_with("hidden_"))
                .collect::<Vec<_>>();
            assert!(
                explicit.iter().all(|a| a.value_kind == "by_value"),
                "{what}: explicit arguments not all by value: {explicit:?}"
            );
            let slots: Vec<(usize, usize)> = explicit.iter().map(|a| (a.offset, a.size)).collect();
            assert_eq!(slots, arg_slots(kernel), "{what}: explicit arguments");
            let end = slots.last().map_or(0, |&(o, s)| o + s);
            let hidden = &meta.args[explicit.len()..];
            assert!(!hidden.is_empty(), "{what}: no hidden arguments");
            for a in hidden {
                assert!(
                    a.value_kind.starts_with("hidden_"),
                    "{what}: explicit argument after a hidden one: {a:?}"
                );
                assert!(a.offset >= end, "{what}: hidden {a:?} inside the block");
            }
            assert!(meta.kernarg_segment_size >= end, "{what}: kernarg segment");
            let mut launched = 0;
            for call in calls.iter().filter(|c| c.args.kernel() == kernel) {
                assert_eq!(
                    call.args.block().len(),
                    end,
                    "{what}: argument block length"
                );
                launched += 1;
            }
            assert!(launched > 0, "{what}: no real call built");
        }
    }
}

#[test]
fn metadata_parser_reads_nested_lists() {
    let notes = "\
amdhsa.kernels:
  - .args:
      - .offset:         0
        .size:           144
        .value_kind:     by_value
      - .offset:         144
        .size:           8
        .value_kind:     hidden_block_count_x
    .name:           k
    .reqd_workgroup_size:
      - 64
      - 1
    .wavefront_size: 64
    .kernarg_segment_size: 400
  - .args:           []
    .name:           j
    .wavefront_size: 32
amdhsa.target:   amdgcn-amd-amdhsa--gfx90a
";
    let k = parse_kernels(notes);
    assert_eq!(k.len(), 2);
    assert_eq!(k[0].name, "k");
    assert_eq!(k[0].args.len(), 2);
    assert_eq!((k[0].args[1].offset, k[0].args[1].size), (144, 8));
    assert_eq!(k[0].wavefront_size, 64);
    assert_eq!(k[0].kernarg_segment_size, 400);
    assert_eq!(
        (k[1].name.as_str(), k[1].args.len(), k[1].wavefront_size),
        ("j", 0, 32)
    );
}
