//! With the `bench` feature only: compiles the decode bench's C peer
//! (`benches/peer/decode_f32.c`, a plain C loop built `-O3 -march=native -ffast-math`) against
//! the kernel header. Only the decode bench calls it. Without the feature this script does
//! nothing, so the library builds without a C compiler and carries no code built for this
//! machine's instruction set.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "bench")]
    compile_peer();
}

#[cfg(feature = "bench")]
fn compile_peer() {
    for path in [
        "benches/peer/decode_f32.c",
        "../../kernels-cuda/include/kvlayout.h",
    ] {
        println!("cargo:rerun-if-changed={path}");
    }
    cc::Build::new()
        .file("benches/peer/decode_f32.c")
        .include("../../kernels-cuda/include")
        .std("c11")
        .opt_level(3)
        .flag_if_supported("-march=native")
        .flag_if_supported("-ffast-math")
        .warnings(true)
        .compile("kvl_decode_peer");
}
