//! `kvlayout convert`: a dump converted there and back is identical on every element, on
//! the backend it names; other content or geometry is refused with one line.

use kvlayout::KvCacheLayout;

use super::dump_file::{
    check_coords, fill, read_st, Temp, HND, HND_1, INT8, INT8_HND, NHD, PADDED, SEPARATE,
};
use super::{ok, parse_json, user_error};

#[test]
fn convert_there_and_back_is_identical_on_elements() {
    for (from, to) in [
        (NHD, HND),
        (NHD, PADDED),
        (INT8, INT8_HND),
        (SEPARATE, HND_1),
    ] {
        let a = fill(from, "coords", "conv-a");
        let (b, c) = (Temp::new("conv-b"), Temp::new("conv-c"));
        let text = ok(&["convert", a.s(), "--to", to, "--out", b.s()]);
        assert!(text.starts_with(&format!("wrote {}", b.s())), "{text}");
        // Every element of the converted cache at its offset in the new layout.
        let st_b = read_st(&b.0);
        assert_eq!(st_b.layout(), to.parse::<KvCacheLayout>().unwrap());
        check_coords(&st_b, to);
        let j = parse_json(&ok(&[
            "convert",
            b.s(),
            "--to",
            from,
            "--out",
            c.s(),
            "--json",
        ]));
        assert_eq!(j["pattern"], "coords");
        let (st_a, st_c) = (read_st(&a.0), read_st(&c.0));
        assert_eq!(st_a.tensors, st_c.tensors, "{from} -> {to} -> back");
    }
}

#[test]
fn convert_runs_the_movers_of_the_backend_it_names() {
    // The GPU kernels under the host emulators, and the scalar reference, write the same
    // bytes as the CPU backend (padding included).
    let a = fill(INT8, "coords", "backends");
    let cpu = Temp::new("be-cpu");
    ok(&["convert", a.s(), "--to", INT8_HND, "--out", cpu.s()]);
    let want = read_st(&cpu.0);
    check_coords(&want, INT8_HND);
    for backend in ["reference", "cuda-emu", "hip-emu"] {
        let out = Temp::new("be");
        let j = parse_json(&ok(&[
            "convert",
            a.s(),
            "--to",
            INT8_HND,
            "--out",
            out.s(),
            "--backend",
            backend,
            "--json",
        ]));
        assert_eq!(j["backend"], backend);
        assert_eq!(read_st(&out.0).tensors, want.tensors, "{backend}");
    }
}

#[test]
fn convert_refuses_other_content_or_geometry() {
    let a = fill(NHD, "coords", "refuse");
    let out = Temp::new("refused");
    for (to, reason) in [
        (
            "kv L=2 B=4 N=16 H=4 D=8 dtype=f16 order=HND",
            "num_blocks 3 vs 4",
        ),
        (
            "kv L=2 B=3 N=16 H=4 D=8 dtype=bf16 order=HND",
            "dtype f16 vs bf16",
        ),
        (
            "kv L=2 B=3 N=32 H=4 D=8 dtype=f16 order=HND",
            "block_size 16 vs 32",
        ),
        (
            "kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=HND",
            "num_layers 2 vs 1",
        ),
    ] {
        let e = user_error(&["convert", a.s(), "--to", to, "--out", out.s()]);
        assert!(e.contains(reason), "{to}: {e}");
        assert!(!out.0.exists(), "{to}: nothing written");
    }
    let e = user_error(&[
        "convert",
        a.s(),
        "--to",
        HND,
        "--out",
        out.s(),
        "--backend",
        "gpu9",
    ]);
    assert!(e.contains("gpu9"), "{e}");
    let e = user_error(&["fill", NHD, "--pattern", "zeros", "--out", out.s()]);
    assert!(e.contains("coords, random"), "{e}");
    let e = user_error(&[
        "fill",
        "llama-3-8b",
        "--pattern",
        "coords",
        "--out",
        out.s(),
    ]);
    assert!(e.contains("--max-cache-gib"), "{e}");
}
