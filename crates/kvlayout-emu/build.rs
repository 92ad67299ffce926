//! Compiles the GPU kernel sources for the host under the emulation header
//! (`kernels-cuda/emu/kvl_emu.h`): the CUDA translation unit with warps of 32, the HIP one
//! with wavefronts of 64, the element conversions on their own, and with the `planted-bugs`
//! feature one deliberately broken CUDA build per bug class (`kvl_plant.cuh`).

use std::path::PathBuf;

/// Bug classes of `kernels-cuda/src/kvl_plant.cuh`.
const PLANTS: u32 = 6;

fn build(files: &[PathBuf], defines: &[(&str, String)], name: &str) {
    let mut b = cc::Build::new();
    b.cpp(true)
        .std("c++20")
        .opt_level(2)
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        .include("csrc")
        .include("../../kernels-cuda/include")
        .include("../../kernels-cuda/src")
        .include("../../kernels-cuda/emu")
        .include("../../kernels-hip/src")
        // Host numerics as the kernels write them: no FMA contraction.
        .flag_if_supported("-ffp-contract=off");
    // Under `-Zsanitizer=address` the kernels and the emulator are instrumented too, with
    // clang (whose instrumentation rustc's ASan runtime serves), and the emulator tells ASan
    // about its fiber switches.
    let sanitize = std::env::var("CARGO_CFG_SANITIZE").unwrap_or_default();
    if sanitize.split(',').any(|s| s == "address") {
        b.compiler("clang++-19")
            .flag("-fsanitize=address")
            .flag("-fno-omit-frame-pointer");
    }
    for (k, v) in defines {
        b.define(k, v.as_str());
    }
    for f in files {
        b.file(f);
    }
    b.compile(name);
}

fn main() {
    for dir in [
        "csrc",
        "../../kernels-cuda/include",
        "../../kernels-cuda/src",
        "../../kernels-cuda/emu",
        "../../kernels-hip/src",
    ] {
        println!("cargo:rerun-if-changed={dir}");
    }
    build(
        &[
            "csrc/cuda_emu.cpp".into(),
            "csrc/hip_emu.cpp".into(),
            "csrc/probe.cpp".into(),
        ],
        &[],
        "kvl_emu",
    );
    if std::env::var_os("CARGO_FEATURE_PLANTED_BUGS").is_some() {
        let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
        let here = std::env::current_dir().expect("build script directory");
        for n in 1..=PLANTS {
            // One wrapper file per variant, so each compiles to its own object.
            let file = out.join(format!("plant_{n}.cpp"));
            let body = format!(
                "#define KVL_PLANT {n}\n#include \"{}\"\n",
                here.join("csrc/plant.cpp").display()
            );
            std::fs::write(&file, body).expect("write the plant wrapper");
            build(&[file], &[], &format!("kvl_emu_plant_{n}"));
        }
    }
}
