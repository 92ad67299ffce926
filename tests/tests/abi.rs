//! The C header of the kernel ABI (`kernels-cuda/include/kvlayout.h`) agrees with the Rust
//! side (`kvlayout::KvFieldArgs`, `crates/kvlayout/src/abi.rs`): same struct layout, same
//! constants, and the same offsets for every readable field of random valid layouts.
//!
//! The header is compiled by `build.rs` into two probes (`tests/c/abi_probe.c` as C11 and
//! `tests/c/abi_probe_cpp.cpp` as C++14, the latter through `kernels-hip/include/kvlayout.h`);
//! this is the one test file that calls foreign code, from the `unsafe` blocks of its `probe`
//! module.

#![deny(unsafe_code)]

use std::mem::{align_of, offset_of, size_of};

use kvlayout::{field_code, Coord, DType, Field, KvCacheLayout, KvFieldArgs};
use kvlayout_conformance::domain::reference_offset;
use kvlayout_conformance::gen::any_layout;
use proptest::prelude::*;
use DType::{Bf16, Fp8E4m3, Fp8E5m2, Int8, F16, F32, U8};
use Field::{Bytes, Conv, KScale, Latent, Ssm, VScale, K, V};

use probe::{c_in_domain, c_offset, c_slot_of_token, cpp_offset};

/// The C and C++ probes, and the safe functions that call them: the only `unsafe` of this
/// file.
#[allow(unsafe_code)]
mod probe {
    use kvlayout::KvFieldArgs as Args;

    // Coordinates `(l, b, h, n, d)`: layer, block, head, slot (token), dim.
    extern "C" {
        fn kvl_probe_sizeof() -> usize;
        fn kvl_probe_alignof() -> usize;
        fn kvl_probe_offsetof(i: i32) -> i64;
        fn kvl_probe_sizeof_member(i: i32) -> i64;
        fn kvl_probe_dtype_code(i: i32) -> i32;
        fn kvl_probe_field_code(i: i32) -> i32;
        fn kvl_probe_offset(a: *const Args, l: i64, b: i64, h: i64, n: i64, d: i64) -> i64;
        fn kvl_probe_in_domain(a: *const Args, l: i64, b: i64, h: i64, n: i64, d: i64) -> i32;
        fn kvl_probe_slot_of_token(a: *const Args, token_in_block: i64) -> i64;
        fn kvl_probe_cpp_sizeof() -> usize;
        fn kvl_probe_cpp_offset(a: *const Args, l: i64, b: i64, h: i64, n: i64, d: i64) -> i64;
    }

    /// `sizeof` and `alignof` of `kvl_field_args` in C, and its `sizeof` in C++.
    pub(crate) fn sizes() -> (usize, usize, usize) {
        // SAFETY: the probe functions take no arguments and return constants.
        unsafe {
            (
                kvl_probe_sizeof(),
                kvl_probe_alignof(),
                kvl_probe_cpp_sizeof(),
            )
        }
    }

    /// `offsetof` and `sizeof` of member `i` in C (-1 past the last member).
    pub(crate) fn member(i: i32) -> (i64, i64) {
        // SAFETY: the probes only index a static table, bounds-checked on the C side.
        unsafe { (kvl_probe_offsetof(i), kvl_probe_sizeof_member(i)) }
    }

    /// The C value of the `i`th `KVL_DTYPE_` constant (-1 past the last).
    pub(crate) fn dtype_code(i: i32) -> i32 {
        // SAFETY: the probe only indexes a static table, bounds-checked on the C side.
        unsafe { kvl_probe_dtype_code(i) }
    }

    /// The C value of the `i`th `KVL_FIELD_` constant (-1 past the last).
    pub(crate) fn field_code(i: i32) -> i32 {
        // SAFETY: the probe only indexes a static table, bounds-checked on the C side.
        unsafe { kvl_probe_field_code(i) }
    }

    /// C `kvl_offset` (through the C probe).
    pub(crate) fn c_offset(a: &Args, l: i64, b: i64, h: i64, n: i64, d: i64) -> i64 {
        // SAFETY: `a` is a live reference to a `#[repr(C)]` struct whose layout equals
        // `kvl_field_args` (checked by `struct_layout_matches`); the C function only reads it
        // and does plain integer arithmetic on the other arguments.
        unsafe { kvl_probe_offset(a, l, b, h, n, d) }
    }

    /// C++ `kvl_offset` (through the C++ probe).
    pub(crate) fn cpp_offset(a: &Args, l: i64, b: i64, h: i64, n: i64, d: i64) -> i64 {
        // SAFETY: as in `c_offset`; the C++ function is `extern "C"` and only reads `*a`.
        unsafe { kvl_probe_cpp_offset(a, l, b, h, n, d) }
    }

    /// C `kvl_in_domain`.
    pub(crate) fn c_in_domain(a: &Args, l: i64, b: i64, h: i64, n: i64, d: i64) -> i32 {
        // SAFETY: as in `c_offset`; the C function only reads `*a` and compares integers.
        unsafe { kvl_probe_in_domain(a, l, b, h, n, d) }
    }

    /// C `kvl_slot_of_token`.
    pub(crate) fn c_slot_of_token(a: &Args, token: i64) -> i64 {
        assert!(a.tokens_per_state >= 0, "a divisor C can divide by");
        // SAFETY: as in `c_offset`; `tokens_per_state` is 0 (which C handles) or positive
        // (asserted), so the C division is defined.
        unsafe { kvl_probe_slot_of_token(a, token) }
    }
}

/// `(name, Rust offset, size)` of each member named, the members of each size in a list.
macro_rules! members {
    ($($size:literal: [$($name:ident),* $(,)?]),* $(,)?) => {
        [$($((stringify!($name), offset_of!(KvFieldArgs, $name), $size)),*),*]
    };
}

/// Every member of `KvFieldArgs` in declaration order: (name, Rust offset, Rust size).
const MEMBERS: [(&str, usize, usize); 21] = members![
    8: [
        base_offset_bytes, layer_stride_bytes, block_stride_bytes, head_stride_bytes,
        slot_stride_bytes, dim_chunk_stride_bytes, dim_stride_bytes,
        num_layers, num_blocks, num_heads, num_slots, width, dim_split, block_size,
        tokens_per_state,
    ],
    4: [buffer, dtype, elem_bytes, field, scale, reserved],
];

/// Every dtype, in the order of the C probe's `KVL_DTYPE_*` list (a dtype's index here is its
/// index there).
const C_DTYPES: [DType; 7] = [F32, F16, Bf16, Fp8E4m3, Fp8E5m2, Int8, U8];

/// Every field, in the order of the C probe's `KVL_FIELD_*` list.
const C_FIELDS: [Field; 8] = [K, V, KScale, VScale, Latent, Bytes, Conv, Ssm];

/// Exhaustive on purpose: a new `DType` or `Field` variant does not compile here until the
/// lists above (and the header and the probe) have it.
const _: fn(DType, Field) = every_variant_is_listed;
fn every_variant_is_listed(d: DType, f: Field) {
    match d {
        F32 | F16 | Bf16 | Fp8E4m3 | Fp8E5m2 | Int8 | U8 => {}
    }
    match f {
        K | V | KScale | VScale | Latent | Bytes | Conv | Ssm => {}
    }
}

#[test]
fn struct_layout_matches() {
    let (c_size, c_align, cpp_size) = probe::sizes();
    assert_eq!(c_size, size_of::<KvFieldArgs>());
    assert_eq!(c_align, align_of::<KvFieldArgs>());
    assert_eq!(cpp_size, size_of::<KvFieldArgs>());
    assert_eq!(size_of::<KvFieldArgs>(), 144);
    assert_eq!(align_of::<KvFieldArgs>(), 8);

    let mut end = 0;
    for (i, &(name, rust_offset, rust_size)) in MEMBERS.iter().enumerate() {
        let i = i32::try_from(i).expect("21 members");
        let (c_off, c_size) = probe::member(i);
        assert_eq!(c_off, rust_offset as i64, "offset of {name}");
        assert_eq!(c_size, rust_size as i64, "size of {name}");
        // Declaration order with no implicit padding.
        assert_eq!(
            rust_offset, end,
            "{name} follows the previous member without a gap"
        );
        end = rust_offset + rust_size;
    }
    assert_eq!(end, size_of::<KvFieldArgs>(), "no trailing padding");
    assert_eq!(probe::member(21).0, -1, "C has no extra member");
}

#[test]
fn constants_match() {
    for (i, d) in (0..).zip(C_DTYPES) {
        assert_eq!(probe::dtype_code(i), d.abi_code(), "KVL_DTYPE_ of {d}");
    }
    for (i, f) in (0..).zip(C_FIELDS) {
        assert_eq!(probe::field_code(i), field_code(f), "KVL_FIELD_ of {f}");
    }
    let d_end = probe::dtype_code(C_DTYPES.len() as i32);
    let f_end = probe::field_code(C_FIELDS.len() as i32);
    assert_eq!((d_end, f_end), (-1, -1), "C lists no extra constants");
}

/// `[L, B, H, N, width]` of a field: the extent of each coordinate.
fn extents(a: &KvFieldArgs) -> [i64; 5] {
    [
        a.num_layers,
        a.num_blocks,
        a.num_heads,
        a.num_slots,
        a.width,
    ]
}

/// Coordinates `(l, b, h, n, d)` of a field: all of them below 4096 elements, else about 2000
/// evenly strided ones (row-major index), plus the last one.
fn sample(a: &KvFieldArgs) -> Vec<[i64; 5]> {
    let ext = extents(a);
    let total: i64 = ext.iter().product();
    let step = if total < 4096 { 1 } else { total / 2000 };
    let decode = |mut i: i64| {
        let mut c = [0i64; 5];
        for axis in (0..5).rev() {
            c[axis] = i % ext[axis];
            i /= ext[axis];
        }
        c
    };
    let mut out: Vec<[i64; 5]> = (0..total).step_by(step as usize).map(decode).collect();
    if (total - 1) % step != 0 {
        out.push(decode(total - 1));
    }
    out
}

fn check_field(layout: &KvCacheLayout, field: Field) -> Result<(), TestCaseError> {
    let a = layout
        .kernel_args(field)
        .expect("readable field has kernel arguments");
    let m = layout.field_map(field).expect("readable field");
    prop_assert_eq!(a.field, field_code(field));
    prop_assert_eq!(a.dtype, m.dtype.abi_code());
    prop_assert_eq!(a.elem_bytes as u64, m.elem_bytes());
    prop_assert_eq!(a.buffer as u32, m.strides.buffer);
    prop_assert_eq!(a.reserved, 0);

    for [l, b, h, n, d] in sample(&a) {
        let c = Coord {
            layer: l as u64,
            block: b as u64,
            head: h as u64,
            slot: n as u64,
            field,
            dim: d as u64,
        };
        let from_c = c_offset(&a, l, b, h, n, d);
        let from_rust = a.offset(l, b, h, n, d).expect("coordinate in the domain");
        let at = layout.offset(&c).expect("coordinate in the domain");
        let (ref_buffer, ref_offset) = reference_offset(layout, &c);
        prop_assert_eq!(from_c, from_rust, "C vs KvFieldArgs::offset at {:?}", c);
        prop_assert_eq!(from_c, cpp_offset(&a, l, b, h, n, d), "C vs C++ at {:?}", c);
        prop_assert_eq!(
            u64::try_from(from_c).ok(),
            Some(at.offset),
            "C vs layout.offset at {:?}",
            c
        );
        prop_assert_eq!(
            at.offset,
            ref_offset,
            "layout.offset vs reference at {:?}",
            c
        );
        prop_assert_eq!(at.buffer, a.buffer as u32);
        prop_assert_eq!(ref_buffer, a.buffer as u32);
        prop_assert_eq!(c_in_domain(&a, l, b, h, n, d), 1, "in domain: {:?}", c);
    }

    // Just outside each axis (one past the end, and -1), from the origin and the last corner.
    let ext = extents(&a);
    for corner in [[0i64; 5], ext.map(|e| e - 1)] {
        let [l, b, h, n, d] = corner;
        prop_assert_eq!(c_in_domain(&a, l, b, h, n, d), 1);
        for axis in 0..5 {
            for outside in [ext[axis], -1] {
                let mut p = corner;
                p[axis] = outside;
                let [l, b, h, n, d] = p;
                prop_assert_eq!(c_in_domain(&a, l, b, h, n, d), 0, "outside: {:?}", p);
            }
        }
    }

    // Token to slot, over the whole block.
    prop_assert_eq!(a.block_size as u64, layout.geometry().block_size);
    for t in 0..a.block_size {
        let rust = layout.slot_of_token(t as u64).expect("token in the block");
        let from_c = c_slot_of_token(&a, t);
        prop_assert_eq!(from_c as u64, rust, "slot of token {}", t);
        prop_assert!(
            from_c < a.num_slots,
            "slot {} of token {} in range",
            from_c,
            t
        );
    }
    prop_assert!(layout.slot_of_token(a.block_size as u64).is_err());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, max_global_rejects: 100_000, ..ProptestConfig::default() })]

    #[test]
    fn c_offsets_match_rust(layout in any_layout()) {
        for field in layout.readable_fields() {
            check_field(&layout, field)?;
        }
    }
}

/// More than 2^32 bytes: every stride and product must be 64-bit in C.
#[test]
fn large_layout_offsets_are_64_bit() {
    let layout: KvCacheLayout = "kv L=2 B=40000 N=16 H=8 D=128 dtype=bf16 order=NHD"
        .parse()
        .expect("valid spec");
    // Row [K 128][V 128] bf16 = 512 B per head; 8 heads per token; 16 tokens per block.
    let row = 2 * 128 * 2i64;
    let token = 8 * row;
    let block = 16 * token;
    let layer = 40_000 * block;
    assert_eq!(block, 65_536);
    assert_eq!(layer, 2_621_440_000, "a layer alone exceeds 2^31 bytes");

    for (field, field_start) in [(Field::K, 0), (Field::V, 256)] {
        let a = layout.kernel_args(field).expect("K and V are readable");
        assert_eq!(a.block_stride_bytes, block);
        assert_eq!(a.layer_stride_bytes, layer);
        assert_eq!(extents(&a), [2, 40_000, 8, 16, 128]);

        // Last block of layer 0: above 2^31.
        let last0 = 39_999 * block + 15 * token + 7 * row + field_start + 127 * 2;
        assert_eq!(last0, 2_621_439_742 + field_start);
        assert!(last0 > 1 << 31);
        assert_eq!(c_offset(&a, 0, 39_999, 7, 15, 127), last0);

        // Last element of the cache: above 2^32.
        let last1 = layer + last0;
        assert_eq!(last1, 5_242_879_742 + field_start);
        assert!(last1 > 1 << 32);
        assert_eq!(c_offset(&a, 1, 39_999, 7, 15, 127), last1);
        assert_eq!(cpp_offset(&a, 1, 39_999, 7, 15, 127), last1);
        assert_eq!(a.offset(1, 39_999, 7, 15, 127).unwrap(), last1);
        let c = Coord {
            layer: 1,
            block: 39_999,
            head: 7,
            slot: 15,
            field,
            dim: 127,
        };
        assert_eq!(layout.offset(&c).expect("in domain").offset, last1 as u64);
        assert_eq!(c_in_domain(&a, 1, 39_999, 7, 15, 127), 1);
        assert_eq!(c_in_domain(&a, 1, 40_000, 7, 15, 127), 0);
    }
}

/// The `scale` member carries each field's own per-tensor scale: K (and MLA's latent and K)
/// `k_scale`, V `v_scale`, everything else 1; with the two scales distinct, a V dequantized
/// with K's scale is caught here.
#[test]
fn kernel_args_scale_is_the_fields_own() {
    for (spec, want) in [
        (
            "kv B=3 N=16 H=4 D=8 dtype=fp8_e4m3 k_scale=0.5 v_scale=2.0 order=NHD",
            vec![(Field::K, 0.5f32), (Field::V, 2.0)],
        ),
        (
            "kv-scaled B=3 N=16 H=4 D=8 dtype=int8 k_scale=3.0 v_scale=0.25 order=HND",
            vec![
                (Field::K, 3.0),
                (Field::V, 0.25),
                (Field::KScale, 1.0),
                (Field::VScale, 1.0),
            ],
        ),
        (
            "mla B=3 N=16 rank=16 rope=8 dtype=bf16 k_scale=0.5 v_scale=0.5 order=NHD",
            vec![(Field::Latent, 0.5), (Field::K, 0.5), (Field::V, 0.5)],
        ),
    ] {
        let l: KvCacheLayout = spec.parse().unwrap();
        for (field, scale) in want {
            assert_eq!(
                l.kernel_args(field).unwrap().scale,
                scale,
                "{spec}: {field}"
            );
        }
    }
}

/// `KvFieldArgs::offset` answers inside the domain only: a negative index or one at its
/// extent, on every axis, is an error (as `kvl_in_domain` says 0), not an offset.
#[test]
fn kernel_args_offset_refuses_coordinates_outside_the_domain() {
    let l: KvCacheLayout = "kv L=2 B=3 N=16 H=4 D=8 dtype=f16 order=HND"
        .parse()
        .unwrap();
    let a = l.kernel_args(Field::V).unwrap();
    let inside = [1i64, 2, 3, 15, 7];
    let at = |c: [i64; 5]| a.offset(c[0], c[1], c[2], c[3], c[4]);
    assert!(at(inside).is_ok());
    for (axis, limit) in [2i64, 3, 4, 16, 8].into_iter().enumerate() {
        for bad in [-1, limit, i64::MAX] {
            let mut c = inside;
            c[axis] = bad;
            assert!(at(c).is_err(), "axis {axis} = {bad}");
            assert_eq!(c_in_domain(&a, c[0], c[1], c[2], c[3], c[4]), 0);
        }
    }
}
