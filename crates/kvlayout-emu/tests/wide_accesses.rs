//! The compiled kernels keep their 16-byte accesses: every kernel of [`WIDE`] has, in the PTX
//! for sm_80 and sm_90 (its `.entry` body and the `.func` bodies it calls), the vector loads
//! `ld.global.v4.u32` and stores `st.global.v4.u32` its table row names, and in the AMDGPU
//! code objects (`llvm-objdump-19 -d`, per symbol) `global_load_dwordx4` /
//! `global_store_dwordx4` (gfx90a, gfx942) or `global_load_b128` / `global_store_b128`
//! (gfx1100). A change that splits them into narrower accesses (a pointer cast the compiler
//! cannot prove aligned, a byte-wise copy) fails here, on a machine without a GPU. Skipped,
//! visibly, without clang-19, unless `KVLAYOUT_REQUIRE_CLANG=1`.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use common::run_script;

/// Which 16-byte accesses each kernel must have.
struct Wide {
    kernel: &'static str,
    loads: bool,
    stores: bool,
}

/// The kernels with a 16-byte path, and what the path does.
const WIDE: &[Wide] = &[
    // Rows copied in 16-byte units (`row_unit_bytes` 16).
    Wide {
        kernel: "kvl_move_blocks",
        loads: true,
        stores: true,
    },
    // 16 bytes of encoded elements per lane (`k_lane_bytes` / `v_lane_bytes` 16); the
    // activations are read element by element.
    Wide {
        kernel: "kvl_write_kv",
        loads: false,
        stores: true,
    },
    // Key and value rows read as 16-byte vectors (`k_vec_bytes` / `v_vec_bytes` 16); the
    // outputs are f32 elements.
    Wide {
        kernel: "kvl_paged_decode",
        loads: true,
        stores: false,
    },
];

fn tools_or_skip() -> bool {
    let have = |tool: &str| Command::new(tool).arg("--version").output().is_ok();
    if have("clang-19") && have("llvm-objdump-19") {
        return true;
    }
    if std::env::var("KVLAYOUT_REQUIRE_CLANG").as_deref() == Ok("1") {
        panic!("clang-19 or llvm-objdump-19 not found and KVLAYOUT_REQUIRE_CLANG=1");
    }
    eprintln!("skipped: wide accesses: clang-19 or llvm-objdump-19 not found");
    false
}

/// The body of PTX function `name` (`.entry` or `.func`), up to its closing brace.
fn ptx_body<'a>(ptx: &'a str, name: &str) -> Option<&'a str> {
    let start = [".entry", ".func"]
        .iter()
        .filter_map(|kind| {
            let decl = format!("{kind} {name}(");
            // A `.func` is declared once before its definition; the definition has a body.
            ptx.match_indices(&decl)
                .map(|(i, _)| i)
                .find(|&i| ptx[i..].find('{') < ptx[i..].find(';'))
        })
        .next()?;
    let body = &ptx[start..];
    let end = body.find("\n}").map_or(body.len(), |e| e + 2);
    Some(&body[..end])
}

/// The entry's body and the bodies of every `.func` it calls, transitively.
fn ptx_reachable(ptx: &str, entry: &str) -> String {
    let mut seen = BTreeSet::new();
    let mut todo = vec![entry.to_string()];
    let mut text = String::new();
    while let Some(name) = todo.pop() {
        if !seen.insert(name.clone()) {
            continue;
        }
        let body = ptx_body(ptx, &name).unwrap_or_else(|| panic!("no PTX body for {name}"));
        // `call.uni (retval0), name, (param0, ...);`, over one line or several.
        for (at, _) in body.match_indices("call") {
            let stmt = &body[at..at + body[at..].find(';').unwrap_or(0)];
            let callee = stmt
                .split([' ', '\t', '\n', ',', '(', ')'])
                .filter(|w| !w.is_empty())
                .find(|w| !["call", "retval", "param"].iter().any(|p| w.starts_with(p)));
            if let Some(c) = callee {
                todo.push(c.to_string());
            }
        }
        text.push_str(body);
    }
    text
}

/// `(symbol, instructions)` of each function in an AMDGPU code object's disassembly.
fn amdgpu_symbols(co: &Path) -> Vec<(String, String)> {
    let out = Command::new("llvm-objdump-19")
        .arg("-d")
        .arg(co)
        .output()
        .expect("llvm-objdump-19 runs");
    assert!(out.status.success(), "llvm-objdump-19 -d {}", co.display());
    let text = String::from_utf8(out.stdout).expect("utf-8 disassembly");
    let mut syms: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        if let Some(name) = line
            .strip_suffix(">:")
            .and_then(|l| l.split_once(" <"))
            .map(|(_, n)| n)
        {
            syms.push((name.to_string(), String::new()));
        } else if let Some((_, body)) = syms.last_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    syms
}

#[test]
fn kernels_keep_their_16_byte_accesses() {
    if !tools_or_skip() {
        return;
    }
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("kernels-wide");
    eprint!("{}", run_script("scripts/kernels.sh", &[&out]));
    for arch in ["sm_80", "sm_90"] {
        let ptx = std::fs::read_to_string(out.join(format!("kvlayout.{arch}.ptx"))).unwrap();
        for w in WIDE {
            let code = ptx_reachable(&ptx, w.kernel);
            for (wanted, what) in [
                (w.loads, "ld.global.v4.u32"),
                (w.stores, "st.global.v4.u32"),
            ] {
                assert!(
                    !wanted || code.contains(what),
                    "{arch} {}: no {what} (16-byte access) in its PTX",
                    w.kernel
                );
            }
            eprintln!(
                "wide accesses: {arch} {}: {} v4 loads, {} v4 stores",
                w.kernel,
                code.matches("ld.global.v4.").count(),
                code.matches("st.global.v4.").count()
            );
        }
    }
    for (gfx, load, store) in [
        ("gfx90a", "global_load_dwordx4", "global_store_dwordx4"),
        ("gfx942", "global_load_dwordx4", "global_store_dwordx4"),
        ("gfx1100", "global_load_b128", "global_store_b128"),
    ] {
        let syms = amdgpu_symbols(&out.join(format!("kvlayout.{gfx}.co")));
        for w in WIDE {
            let (_, code) = syms
                .iter()
                .find(|(name, _)| name == w.kernel)
                .unwrap_or_else(|| panic!("{gfx}: no symbol {}", w.kernel));
            // The bodies are inlined into the kernel: a call would hide the accesses.
            assert!(!code.contains("s_swappc"), "{gfx} {}: calls out", w.kernel);
            for (wanted, what) in [(w.loads, load), (w.stores, store)] {
                assert!(
                    !wanted || code.contains(what),
                    "{gfx} {}: no {what} (16-byte access) in its code",
                    w.kernel
                );
            }
        }
    }
}

/// The checks above can fail: code with only narrow accesses has none of the wide ones.
#[test]
fn the_checks_see_narrow_code() {
    let ptx = ".visible .entry k(\n)\n{\n\tld.global.u32 \t%r1, [%rd1];\n\tcall.uni \n\tf, \n\t(\n\tparam0\n\t);\n}\n\
               .func f(\n\t.param .b32 a\n)\n{\n\tst.global.v4.u32 \t[%rd2], {%r1, %r1, %r1, %r1};\n}\n";
    let code = ptx_reachable(ptx, "k");
    assert!(!code.contains("ld.global.v4.u32"));
    assert!(
        code.contains("st.global.v4.u32"),
        "the callee's body counts"
    );
    assert!(!ptx_reachable(ptx, "f").contains("ld.global.u32"));
}
