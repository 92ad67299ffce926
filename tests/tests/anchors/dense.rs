// ---------------------------------------------------------------------------------------------
// Case 1: every physical order x dtype; sentinel-filled neighbour blocks stay untouched.
// ---------------------------------------------------------------------------------------------

use kvlayout::{Convention, DType, Field, KvCacheLayout, ViewTarget};

use crate::{dense_strides, layout, orders, span, sweep, view_refused, K};

/// `L, B, H, N, D` of every layout of case 1.
const DIMS: (u64, u64, u64, u64, u64) = (2, 3, 2, 4, 8);

/// `(field, byte offset in the row, width, element bytes, element type)`.
type FieldRow = (Field, u64, u64, u64, DType);

/// One layout of case 1, with what the test states about it.
struct Case1 {
    spec: String,
    l: KvCacheLayout,
    base: u64,
    /// Byte strides of `L, B, H, N`.
    strides: [u64; 4],
    /// Bytes of one `(l, b, h, n)` row of every field.
    row: u64,
    /// Bytes of the registered span.
    total: u64,
    fields: Vec<FieldRow>,
}

#[test]
fn case01_every_order_and_dtype_matches_the_dense_formula() {
    // (content kind, dtype, element bytes, f32 scales inline)
    let dtypes = [
        ("kv", "f32", DType::F32, 4u64),
        ("kv", "f16", DType::F16, 2),
        ("kv", "bf16", DType::Bf16, 2),
        ("kv", "fp8_e4m3", DType::Fp8E4m3, 1),
        ("kv", "fp8_e5m2", DType::Fp8E5m2, 1),
        ("kv-scaled", "int8", DType::Int8, 1),
        ("kv-scaled", "fp8_e4m3", DType::Fp8E4m3, 1),
    ];
    let orders = orders();
    assert_eq!(orders.len(), 24);
    for base in [0u64, 96] {
        for order in &orders {
            for (kind, name, dtype, e) in dtypes {
                let c = dense(kind, name, dtype, e, order, base);
                let (_, _, nh, nn, _) = DIMS;
                assert_eq!(c.l.registered_spans(), span(base, c.total), "{}", c.spec);
                assert_eq!(c.l.dense_page_bytes(), nh * nn * c.row, "{}", c.spec);
                assert_eq!(c.l.stored_fields().len(), c.fields.len(), "{}", c.spec);
                for f in &c.fields {
                    check_field(&c, f);
                }
                check_block_writes(&c);
            }
        }
    }
}

/// The layout of one order, dtype and base, and its fields as the test states them.
fn dense(kind: &str, name: &str, dtype: DType, e: u64, order: &str, base: u64) -> Case1 {
    let (nl, nb, nh, nn, nd) = DIMS;
    let spec = format!(
        "{kind} L={nl} B={nb} N={nn} H={nh} D={nd} dtype={name} order={order}C base={base}"
    );
    let l = layout(&spec);
    let (row, fields) = if kind == "kv" {
        (
            2 * nd * e,
            vec![
                (Field::K, 0, nd, e, dtype),
                (Field::V, nd * e, nd, e, dtype),
            ],
        )
    } else {
        // [K 8 B][k_scale 4 B][V 8 B][v_scale 4 B]
        (
            24,
            vec![
                (Field::K, 0, nd, 1, dtype),
                (Field::KScale, 8, 1, 4, DType::F32),
                (Field::V, 12, nd, 1, dtype),
                (Field::VScale, 20, 1, 4, DType::F32),
            ],
        )
    };
    Case1 {
        strides: dense_strides(order, [nl, nb, nh, nn], row),
        total: nl * nb * nh * nn * row,
        spec,
        l,
        base,
        row,
        fields,
    }
}

/// What a backend receives of one field: kernel arguments and strided views; and every
/// element against the dense formula.
fn check_field(c: &Case1, &(field, f_off, width, fe, fdt): &FieldRow) {
    let (l, spec, base) = (&c.l, &c.spec, c.base);
    let (nl, nb, nh, nn, nd) = DIMS;
    let [ls, bs, hs, ns] = c.strides;
    let a = l.kernel_args(field).unwrap();
    assert_eq!(
        (
            a.base_offset_bytes,
            a.layer_stride_bytes,
            a.block_stride_bytes,
            a.head_stride_bytes,
            a.slot_stride_bytes,
            a.dim_stride_bytes,
            a.width,
            a.elem_bytes,
            a.dtype,
        ),
        (
            (base + f_off) as i64,
            ls as i64,
            bs as i64,
            hs as i64,
            ns as i64,
            fe as i64,
            width as i64,
            fe as i32,
            fdt.abi_code(),
        ),
        "{spec}: {field}"
    );
    for layer in 0..nl {
        check_views(c, layer, &(field, f_off, width, fe, fdt));
    }
    // vLLM paged v1 K view of an unsplit row: [B, H, D/x, N, x], x = 16 / e.
    if field == Field::K {
        let x = 16 / fe;
        if nd % x == 0 {
            let v = l.view(Convention::VllmPagedV1, K, 0).unwrap();
            assert_eq!(v.shape, vec![nb, nh, nd / x, nn, x], "{spec}");
            assert_eq!(v.strides_bytes, vec![bs, hs, x * fe, ns, fe], "{spec}");
        } else {
            assert!(view_refused(l, Convention::VllmPagedV1, K), "{spec}");
        }
    }
    sweep(l, field, [nl, nb, nh, nn, width], |a, b, h, n, d| {
        base + a * ls + b * bs + h * hs + n * ns + f_off + d * fe
    });
}

/// The standard, FlashAttention and FlashInfer-HND views of one field of one layer.
fn check_views(c: &Case1, layer: u64, &(field, f_off, width, fe, fdt): &FieldRow) {
    let (l, spec, base) = (&c.l, &c.spec, c.base);
    let (_, nb, nh, nn, _) = DIMS;
    let [ls, bs, hs, ns] = c.strides;
    let v = l
        .view(Convention::Standard, ViewTarget::Field(field), layer)
        .unwrap();
    assert_eq!(v.dtype, fdt);
    assert_eq!(v.offset_bytes, base + layer * ls + f_off, "{spec}");
    assert_eq!(v.shape, vec![nb, nh, nn, width], "{spec}");
    assert_eq!(v.strides_bytes, vec![bs, hs, ns, fe], "{spec}");
    assert_eq!(v.strides, vec![bs / fe, hs / fe, ns / fe, 1], "{spec}");
    assert_eq!(v.offset, (base + layer * ls + f_off) / fe, "{spec}");
    let fa = l
        .view(Convention::FlashAttn, ViewTarget::Field(field), layer)
        .unwrap();
    assert_eq!(fa.shape, vec![nb, nn, nh, width], "{spec}");
    assert_eq!(fa.strides_bytes, vec![bs, ns, hs, fe], "{spec}");
    let fih = l
        .view(Convention::FlashinferHnd, ViewTarget::Field(field), layer)
        .unwrap();
    assert_eq!(fih.shape, vec![nb, nh, nn, width], "{spec}");
    assert_eq!(fih.strides_bytes, vec![bs, hs, ns, fe], "{spec}");
}

const SENTINEL: u8 = 0xA5;

/// Write every element of block 1 (all layers, all heads) through the kernel arguments into a
/// sentinel-filled copy of the registered span: exactly block 1's regions change. The
/// neighbours then fill the rest exactly once: a dense layout is a bijection.
fn check_block_writes(c: &Case1) {
    let (l, spec, base) = (&c.l, &c.spec, c.base);
    let (nl, _, nh, nn, _) = DIMS;
    let mut mem = vec![SENTINEL; c.total as usize];
    let mut owner: Vec<Option<u64>> = vec![None; c.total as usize];
    write_block(c, 1, &mut mem, &mut owner);
    let regions = l.block_regions(1, 0..nl, 0..nh).unwrap();
    assert_eq!(
        regions.iter().map(|r| r.len).sum::<u64>(),
        nl * nh * nn * c.row,
        "{spec}: block 1 holds L*H*N rows"
    );
    let inside = |o: u64| {
        regions
            .iter()
            .any(|r| r.buffer == 0 && o >= r.offset && o < r.offset + r.len)
    };
    let mut written = 0u64;
    for (i, byte) in mem.iter().enumerate() {
        let o = base + i as u64;
        if inside(o) {
            assert_eq!(*byte, 0x12, "{spec}: byte {o} of block 1 not written");
            written += 1;
        } else {
            assert_eq!(*byte, SENTINEL, "{spec}: byte {o} outside block 1 touched");
        }
    }
    assert_eq!(written, nl * nh * nn * c.row, "{spec}");
    write_block(c, 0, &mut mem, &mut owner);
    write_block(c, 2, &mut mem, &mut owner);
    assert!(owner.iter().all(Option::is_some), "{spec}: span has holes");
    for (i, byte) in mem.iter().enumerate() {
        let o = base + i as u64;
        assert_eq!(inside(o), *byte == 0x12, "{spec}: byte {o}");
    }
}

/// Writes `0x11 + blk` to every byte of every element of block `blk`, through the kernel
/// arguments; no byte may be written twice.
fn write_block(c: &Case1, blk: u64, mem: &mut [u8], owner: &mut [Option<u64>]) {
    let (nl, _, nh, nn, _) = DIMS;
    let (spec, base, total) = (&c.spec, c.base, c.total);
    for &(field, _, width, fe, _) in &c.fields {
        let a = c.l.kernel_args(field).unwrap();
        for layer in 0..nl {
            for h in 0..nh {
                for n in 0..nn {
                    for d in 0..width {
                        let o = a
                            .offset(layer as i64, blk as i64, h as i64, n as i64, d as i64)
                            .unwrap() as u64;
                        assert!(o >= base && o + fe <= base + total, "{spec}");
                        for i in (o - base)..(o - base + fe) {
                            let i = i as usize;
                            assert_eq!(owner[i], None, "{spec}: byte {i} twice");
                            owner[i] = Some(blk);
                            mem[i] = 0x11 + blk as u8;
                        }
                    }
                }
            }
        }
    }
}
