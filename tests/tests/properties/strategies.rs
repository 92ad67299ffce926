//! Arbitrary explicit strides, aliasing or not, and the brute-force overlap test the
//! aliasing property checks the constructor against.

use std::collections::HashMap;

use kvlayout::Field;
use proptest::prelude::*;

/// Arbitrary explicit strides (aliasing or not) for a small K|V layout.
pub(crate) fn arbitrary_strided() -> impl Strategy<Value = kvlayout::LayoutSpec> {
    use kvlayout::{
        BufferExtent, Content, DType, FieldStrides, Geometry, LayoutSpec, Placement, StridedField,
        TensorScales,
    };
    let strides = || {
        (
            0u64..24,
            prop::collection::vec(
                prop::sample::select(vec![0u64, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48]),
                6,
            ),
            any::<bool>(),
        )
    };
    (
        (1u64..=2, 1u64..=3, 1u64..=3, 1u64..=3),
        (1u64..=2, 1u64..=2),
        strides(),
        strides(),
        any::<bool>(),
    )
        .prop_map(|((l, b, n, h), (dk, dv), ks, vs, separate)| {
            let dtype = DType::F16;
            let field =
                |f, (base, s, split): (u64, Vec<u64>, bool), width: u64, buffer| StridedField {
                    field: f,
                    strides: FieldStrides {
                        buffer,
                        base_offset: base * 2,
                        layer: s[0] * 2,
                        block: s[1] * 2,
                        head: s[2] * 2,
                        slot: s[3] * 2,
                        dim_split: if split && width.is_multiple_of(2) {
                            2
                        } else {
                            width
                        },
                        dim_chunk: s[4] * 2,
                        dim: s[5] * 2,
                    },
                };
            LayoutSpec {
                geometry: Geometry {
                    num_layers: l,
                    num_blocks: b,
                    block_size: n,
                    num_kv_heads: h,
                    tokens_per_state: 1,
                },
                content: Content::Kv {
                    head_size: 2 * dk,
                    head_size_v: 2 * dv,
                },
                dtype,
                scales: TensorScales::default(),
                placement: Placement::Strided {
                    fields: vec![
                        field(Field::K, ks, 2 * dk, 0),
                        field(Field::V, vs, 2 * dv, u32::from(separate)),
                    ],
                    extents: vec![
                        BufferExtent {
                            start: 0,
                            end: 1 << 20
                        };
                        2
                    ],
                },
            }
        })
}

/// Arbitrary explicit strides for a small MLA latent: split into chunks of any divisor of its
/// width (or not), chunks and elements anywhere, extents that may be too short.
pub(crate) fn arbitrary_mla() -> impl Strategy<Value = kvlayout::LayoutSpec> {
    use kvlayout::{
        BufferExtent, Content, DType, FieldStrides, Geometry, LayoutSpec, Placement, StridedField,
        TensorScales,
    };
    let stride = || prop::sample::select(vec![0u64, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]);
    (
        (1u64..=2, 1u64..=2, 1u64..=3),
        (
            prop::sample::select(vec![2u64, 4, 6, 8, 16]),
            prop::sample::select(vec![2u64, 4, 8]),
        ),
        (0u64..8, prop::collection::vec(stride(), 6), 1u64..=16),
        (
            prop::sample::select(vec![16u64, 64, 256, 1024, 4096]),
            any::<bool>(),
        ),
    )
        .prop_map(
            |((l, b, n), (rank, rope), (base, s, split), (end, scaled))| {
                let width = rank + rope;
                // Any divisor of the width (validation refuses one that splits V mid-chunk).
                let dim_split = (1..=split.min(width))
                    .rev()
                    .find(|d| width.is_multiple_of(*d))
                    .unwrap_or(width);
                LayoutSpec {
                    geometry: Geometry {
                        num_layers: l,
                        num_blocks: b,
                        block_size: n,
                        num_kv_heads: 1,
                        tokens_per_state: 1,
                    },
                    content: Content::Mla {
                        kv_lora_rank: rank,
                        rope_dim: rope,
                    },
                    dtype: DType::F16,
                    scales: if scaled {
                        TensorScales {
                            k_scale: 0.5,
                            v_scale: 2.0,
                        }
                    } else {
                        TensorScales::default()
                    },
                    placement: Placement::Strided {
                        fields: vec![StridedField {
                            field: Field::Latent,
                            strides: FieldStrides {
                                buffer: 0,
                                base_offset: base * 2,
                                layer: s[0] * 2,
                                block: s[1] * 2,
                                head: s[2] * 2,
                                slot: s[3] * 2,
                                dim_split,
                                dim_chunk: s[4] * 2,
                                dim: s[5] * 2,
                            },
                        }],
                        extents: vec![BufferExtent { start: 0, end }],
                    },
                }
            },
        )
}

/// Whether any two elements of a strided K|V spec share a byte, by enumeration.
pub(crate) fn brute_force_overlap(spec: &kvlayout::LayoutSpec) -> bool {
    let kvlayout::Placement::Strided { fields, .. } = &spec.placement else {
        unreachable!()
    };
    let kvlayout::Content::Kv {
        head_size,
        head_size_v,
    } = spec.content
    else {
        unreachable!()
    };
    let g = spec.geometry;
    let e = spec.dtype.size_bytes();
    let mut owner = HashMap::new();
    let mut id = 0u64;
    for f in fields {
        let s = f.strides;
        let width = if f.field == Field::K {
            head_size
        } else {
            head_size_v
        };
        for l in 0..g.num_layers {
            for b in 0..g.num_blocks {
                for h in 0..g.num_kv_heads {
                    for n in 0..g.block_size {
                        for d in 0..width {
                            id += 1;
                            let off = s.base_offset
                                + l * s.layer
                                + b * s.block
                                + h * s.head
                                + n * s.slot
                                + (d / s.dim_split) * s.dim_chunk
                                + (d % s.dim_split) * s.dim;
                            for byte in off..off + e {
                                if owner.insert((s.buffer, byte), id).is_some() {
                                    return true;
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    false
}
