//! Compiles the ABI probes (tests/c) against the kernel header `kernels-cuda/include/kvlayout.h`,
//! once as C and once as C++ (as nvcc / hipcc compile it), for `tests/abi.rs`.

fn main() {
    let include = "../kernels-cuda/include";
    for path in [
        "c/abi_probe.c",
        "c/abi_probe_cpp.cpp",
        "../kernels-cuda/include/kvlayout.h",
        "../kernels-hip/include/kvlayout.h",
    ] {
        println!("cargo:rerun-if-changed={path}");
    }

    cc::Build::new()
        .file("c/abi_probe.c")
        .include(include)
        .std("c11")
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        .flag_if_supported("-pedantic")
        .compile("kvl_abi_probe");

    cc::Build::new()
        .cpp(true)
        .file("c/abi_probe_cpp.cpp")
        .include(include)
        .std("c++14")
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        .flag_if_supported("-pedantic")
        .compile("kvl_abi_probe_cpp");
}
