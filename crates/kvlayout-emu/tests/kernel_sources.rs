//! Rules the kernel sources keep, checked on their text:
//! - every kernel (`KVL_KERNEL`) takes only field arguments (`kvl_field_args`) and one
//!   parameter struct (`kvl_*_params`), by value: no bare integer stride or size;
//! - the parameter structs (`kvl_kernels.h`) hold no stride or extent of the cache;
//! - no warp width is written as a number (only `KVL_WARP`);
//! - the HIP translation unit holds no kernel of its own: it includes the shared bodies;
//! - the decode kernel's register tile of query heads is the launch configuration's limit.
//!
//! Each pattern checker is also run on a planted violation, so a rule that cannot fail fails.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Kernel bodies: every `.cuh` of kernels-cuda/src, with their names.
fn bodies() -> Vec<(String, String)> {
    let dir = root().join("kernels-cuda/src");
    let mut out: Vec<(String, String)> = std::fs::read_dir(&dir)
        .expect("kernels-cuda/src")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "cuh"))
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("kernel source");
            (p.file_name().unwrap().to_string_lossy().into_owned(), text)
        })
        .collect();
    out.sort();
    out
}

/// `(kernel, parameter)` pairs that are neither field arguments nor a parameter struct.
fn bad_parameters(source: &str) -> Vec<(String, String)> {
    let mut bad = Vec::new();
    for chunk in source.split("KVL_KERNEL ").skip(1) {
        let name = chunk.split('(').next().unwrap_or("").trim().to_string();
        let params = chunk
            .split_once('(')
            .and_then(|(_, rest)| rest.split_once(')'))
            .map_or("", |(p, _)| p);
        for p in params.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let ty = p.split_whitespace().next().unwrap_or("");
            let ok = ty == "kvl_field_args"
                || (ty.starts_with("kvl_") && ty.ends_with("_params") && !p.contains('*'));
            if !ok {
                bad.push((name.clone(), p.to_string()));
            }
        }
    }
    bad
}

/// Members of the parameter structs that name a stride or an extent of the cache.
fn cache_geometry_members(header: &str) -> Vec<String> {
    const WORDS: [&str; 7] = [
        "stride",
        "num_blocks",
        "num_heads",
        "num_slots",
        "block_size",
        "head_size",
        "width",
    ];
    header
        .lines()
        .map(|l| l.split("/*").next().unwrap_or("").trim())
        .filter(|l| l.ends_with(';') && !l.starts_with('}') && !l.starts_with("typedef"))
        .filter(|l| WORDS.iter().any(|w| l.contains(w)))
        .map(str::to_string)
        .collect()
}

/// Lines that write a warp width as a number.
fn literal_warps(source: &str) -> Vec<String> {
    source
        .lines()
        .filter(|l| {
            let code = l.split("//").next().unwrap_or("");
            let cleaned = code.replace("int32_t", "").replace("int64_t", "");
            cleaned
                .split(|c: char| !c.is_ascii_alphanumeric() && c != '_')
                .any(|w| w == "32" || w == "64")
        })
        .map(str::to_string)
        .collect()
}

#[test]
fn kernels_take_field_arguments_and_one_parameter_struct() {
    let mut kernels = 0;
    for (file, text) in bodies() {
        kernels += text.matches("KVL_KERNEL ").count();
        assert_eq!(bad_parameters(&text), Vec::new(), "{file}");
    }
    assert_eq!(
        kernels, 4,
        "write_kv, paged_decode, its reduction, move_blocks"
    );
    let planted = "KVL_KERNEL k(kvl_field_args k, int64_t block_stride, kvl_write_params *p)";
    assert_eq!(
        bad_parameters(planted),
        vec![
            ("k".to_string(), "int64_t block_stride".to_string()),
            ("k".to_string(), "kvl_write_params *p".to_string())
        ]
    );
}

#[test]
fn parameter_structs_hold_no_cache_geometry() {
    let header = read("kernels-cuda/include/kvl_kernels.h");
    assert_eq!(cache_geometry_members(&header), Vec::<String>::new());
    assert!(header.contains("typedef struct kvl_decode_params"));
    let planted = "typedef struct x {\n    int64_t v_head_stride; /* no */\n} x;";
    assert_eq!(
        cache_geometry_members(planted),
        vec!["int64_t v_head_stride;"]
    );
}

#[test]
fn no_warp_width_is_a_number() {
    for (file, text) in bodies() {
        let code: String = text
            .split("/*")
            .map(|chunk| chunk.split_once("*/").map_or(chunk, |(_, after)| after))
            .collect();
        assert_eq!(literal_warps(&code), Vec::<String>::new(), "{file}");
    }
    assert_eq!(literal_warps("for (int m = 16; m < 32; m++)").len(), 1);
    assert!(literal_warps("uint32_t x = KVL_WARP;").is_empty());
}

#[test]
fn hip_shares_the_cuda_bodies() {
    let hip = read("kernels-hip/src/kvlayout.hip");
    let cuda = read("kernels-cuda/src/kvlayout.cu");
    assert!(
        !hip.contains("KVL_KERNEL"),
        "the HIP unit defines no kernel"
    );
    let includes = |s: &str| -> Vec<String> {
        s.lines()
            .filter(|l| l.starts_with("#include"))
            .map(str::to_string)
            .collect()
    };
    assert_eq!(includes(&hip), includes(&cuda));
    assert!(includes(&hip).len() >= 4);
}

#[test]
fn the_decode_group_tile_limit_is_the_launch_configurations() {
    let decode = read("kernels-cuda/src/paged_decode.cuh");
    let value = decode
        .lines()
        .find_map(|l| l.strip_prefix("#define KVL_MAX_GROUP_TILE "))
        .and_then(|v| v.trim().parse::<u64>().ok());
    assert_eq!(value, Some(kvlayout_device::kernels::MAX_GROUP_TILE));
}
