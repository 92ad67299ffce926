//! Random valid layouts of every kind, small enough to enumerate element by element.
//!
//! Sizes are drawn so that swaps show (B=3, H=4, N=16, D=8) and so that the ambiguous cases
//! (two blocks, H=1, H=N) come up often. Transformed layouts (TP slice, layer range,
//! kernel-block split) are included, so explicit-strided placements are covered too.

use kvlayout::{
    AxisOrder, Content, DType, EngineTensor, Geometry, KvCacheLayout, LayoutSpec, Paged, Placement,
    TensorScales,
};
use proptest::prelude::*;
use proptest::sample::select;
use strum_free::all_orders;

mod strum_free {
    use kvlayout::AxisOrder;
    /// All 24 physical orders (parsed from their names, so no strum dependency here).
    pub fn all_orders() -> Vec<AxisOrder> {
        let mut out = Vec::new();
        let axes = ['L', 'B', 'H', 'N'];
        for a in axes {
            for b in axes {
                for c in axes {
                    for d in axes {
                        let s: String = [a, b, c, d, 'C'].iter().collect();
                        let mut seen = [a, b, c, d];
                        seen.sort_unstable();
                        if seen == ['B', 'H', 'L', 'N'] {
                            out.push(s.parse().expect("permutation names an order"));
                        }
                    }
                }
            }
        }
        out
    }
}

/// The element types the generator draws: every dtype but raw bytes.
pub const DTYPES: [DType; 6] = [
    DType::F32,
    DType::F16,
    DType::Bf16,
    DType::Fp8E4m3,
    DType::Fp8E5m2,
    DType::Int8,
];

/// Content kinds the generator draws from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Packed K|V.
    Kv,
    /// K|k_scale|V|v_scale.
    KvScaled,
    /// MLA latent.
    Mla,
    /// Opaque bytes.
    Opaque,
    /// Mamba conv state.
    MambaConv,
    /// Mamba SSM state.
    MambaSsm,
}

/// The raw draws a layout is built from.
#[derive(Debug, Clone)]
pub struct Seed {
    /// Content kind.
    pub kind: Kind,
    /// L, B, N, H.
    pub dims: (u64, u64, u64, u64),
    /// Tokens per state choice.
    pub tps: u64,
    /// Head sizes (K, V) or kind-specific sizes.
    pub sizes: (u64, u64),
    /// Element type.
    pub dtype: DType,
    /// 0..=4: paged, paged with explicit strides, paged padded, legacy, paged with base.
    pub placement: u8,
    /// Physical order.
    pub order: AxisOrder,
    /// Legacy kind.
    pub legacy: EngineTensor,
    /// Padding / alignment / offset units.
    pub extra: (u64, u64, u64),
}

fn seed() -> impl Strategy<Value = Seed> {
    let kinds = select(vec![
        Kind::Kv,
        Kind::Kv,
        Kind::Kv,
        Kind::KvScaled,
        Kind::KvScaled,
        Kind::Mla,
        Kind::Opaque,
        Kind::MambaConv,
        Kind::MambaSsm,
    ]);
    let dims = (
        1u64..=3,
        select(vec![1u64, 2, 2, 3, 4]),
        select(vec![1u64, 2, 4, 4, 8, 16]),
        select(vec![1u64, 1, 2, 3, 4, 4]),
    );
    let sizes = (
        select(vec![4u64, 8, 8, 16, 32]),
        select(vec![4u64, 8, 12, 16]),
    );
    let dtypes = select(DTYPES.to_vec());
    // vLLM's x-split key and transposed value is the legacy layout most unlike the others:
    // three draws in nine.
    let legacy = select(vec![
        EngineTensor::VllmPagedV1,
        EngineTensor::VllmPagedV1,
        EngineTensor::VllmPagedV1,
        EngineTensor::FlashAttnNhd,
        EngineTensor::FlashAttnHnd,
        EngineTensor::FlashinferNhd,
        EngineTensor::FlashinferHnd,
        EngineTensor::SeparateNhd,
        EngineTensor::SeparateHnd,
    ]);
    (
        kinds,
        dims,
        select(vec![1u64, 1, 2, 4]),
        sizes,
        dtypes,
        // Legacy (3) for about a third of K/V draws: with the transforms, at least 10% of
        // all layouts stay legacy (`gen_shares` checks).
        select(vec![0u8, 0, 1, 2, 2, 3, 3, 3, 3, 3, 4]),
        prop_oneof![
            select(all_orders()),
            select(vec!["LBHNC", "LBNHC", "BLHNC", "BLNHC", "BHLNC"])
                .prop_map(|s| s.parse::<AxisOrder>().expect("named order")),
        ],
        legacy,
        (0u64..4, 0u64..4, 0u64..4),
    )
        .prop_map(
            |(kind, dims, tps, sizes, dtype, placement, order, legacy, extra)| Seed {
                kind,
                dims,
                tps,
                sizes,
                dtype,
                placement,
                order,
                legacy,
                extra,
            },
        )
}

/// Builds the spec of a seed; `None` when the draw cannot make a valid layout.
pub fn build(s: &Seed) -> Option<KvCacheLayout> {
    let (layers, blocks, block_size, _) = s.dims;
    let (content, dtype, heads) = content(s);
    let tokens_per_state = if block_size % s.tps == 0 && !content.is_per_block_state() {
        s.tps
    } else {
        1
    };
    let geometry = Geometry {
        num_layers: layers,
        num_blocks: blocks,
        block_size,
        num_kv_heads: heads,
        tokens_per_state,
    };
    let spec = LayoutSpec {
        geometry,
        content,
        dtype,
        // MLA's one latent has one scale; K and V scales differ elsewhere.
        scales: if s.extra.2 == 3 {
            TensorScales {
                k_scale: 0.5,
                v_scale: if s.kind == Kind::Mla { 0.5 } else { 2.0 },
            }
        } else {
            TensorScales::default()
        },
        placement: placement(s),
    };
    let layout = KvCacheLayout::new(spec.clone()).ok()?;
    Some(with_wider_strides(s, spec, layout))
}

/// Offsets, padding and alignment are drawn in units of this many bytes.
const ALIGN_UNIT: u64 = 16;

/// The content of a seed, its element type and its head count (one for the kinds that have
/// one head).
fn content(s: &Seed) -> (Content, DType, u64) {
    let (_, _, _, mut heads) = s.dims;
    let (a, b) = s.sizes;
    let mut dtype = s.dtype;
    let content = match s.kind {
        // Legacy layouts keep one head size (but separate K/V allocations may differ).
        Kind::Kv | Kind::KvScaled if s.placement == 3 => Content::Kv {
            head_size: a,
            head_size_v: if s.extra.2 == 1 { b } else { a },
        },
        Kind::Kv => Content::Kv {
            head_size: a,
            head_size_v: if s.extra.2.is_multiple_of(2) { a } else { b },
        },
        Kind::KvScaled => {
            if !dtype.is_quantized() {
                dtype = DType::Int8;
            }
            Content::KvScaled {
                head_size: a,
                head_size_v: b,
            }
        }
        Kind::Mla => {
            heads = 1;
            Content::Mla {
                kv_lora_rank: a,
                rope_dim: b / 2,
            }
        }
        Kind::Opaque => {
            heads = 1;
            dtype = DType::U8;
            Content::Opaque {
                row_bytes: a + b + 1,
            }
        }
        Kind::MambaConv => {
            heads = 1;
            Content::MambaConv {
                conv_dim: a,
                conv_width: 3,
            }
        }
        Kind::MambaSsm => Content::MambaSsm {
            head_dim: a / 2,
            state_size: b,
        },
    };
    (content, dtype, heads)
}

/// Whether the seed's order keeps pages contiguous (layers and blocks outermost), where a
/// padded page applies.
fn page_orders(s: &Seed) -> bool {
    matches!(&s.order.to_string()[..2], "LB" | "BL")
}

/// The placement of a seed before any stride is widened.
fn placement(s: &Seed) -> Placement {
    let e0 = s.extra.0;
    match s.placement {
        3 if matches!(s.kind, Kind::Kv | Kind::KvScaled) => Placement::EngineTensor {
            layout: s.legacy,
            base_offset: e0 * ALIGN_UNIT,
        },
        2 if page_orders(s) => Placement::Paged(Paged {
            alignment: [1, 16, 64, 256][e0 as usize],
            ..Paged::new(s.order)
        }),
        4 => Placement::Paged(Paged {
            base_offset: (e0 + 1) * ALIGN_UNIT,
            ..Paged::new(s.order)
        }),
        _ => Placement::Paged(Paged::new(s.order)),
    }
}

/// Padded pages and explicit strides: grows strides of the first stored field and rebuilds
/// (keeping `layout` where the grown spec is refused).
fn with_wider_strides(s: &Seed, spec: LayoutSpec, layout: KvCacheLayout) -> KvCacheLayout {
    let Placement::Paged(p) = spec.placement else {
        return layout;
    };
    let (e0, e1, _) = s.extra;
    let m = layout.stored_fields()[0].strides;
    let mut q = p;
    match s.placement {
        2 if page_orders(s) && e1 > 0 => {
            let page = if p.order.to_string().starts_with("LB") {
                m.block
            } else {
                m.layer
            };
            q.page_size_padded = Some(page + e1 * ALIGN_UNIT);
        }
        1 => {
            q.block_stride_bytes = Some(m.block + e1 * ALIGN_UNIT);
            if e0 % 2 == 1 {
                q.layer_stride_bytes = Some(m.layer * 2 + e1 * 64 * ALIGN_UNIT);
            }
        }
        _ => {}
    }
    if q == p {
        return layout;
    }
    KvCacheLayout::new(LayoutSpec {
        placement: Placement::Paged(q),
        ..spec
    })
    .unwrap_or(layout)
}

/// A transformation applied after building.
#[derive(Debug, Clone, Copy)]
pub enum Transform {
    /// None.
    Identity,
    /// `tp_slice(size, rank % size)`.
    Tp(u64, u64),
    /// `layer_range(start % L .. L)`.
    Layers(u64),
    /// `split_blocks(ratio)`.
    Split(u64),
}

fn transform() -> impl Strategy<Value = Transform> {
    prop_oneof![
        3 => Just(Transform::Identity),
        1 => (select(vec![1u64, 2, 4, 8]), 0u64..8).prop_map(|(s, r)| Transform::Tp(s, r % s)),
        1 => (0u64..3).prop_map(Transform::Layers),
        1 => select(vec![2u64, 4]).prop_map(Transform::Split),
    ]
}

/// Applies a transform, keeping the original when it is refused.
pub fn apply(l: KvCacheLayout, t: Transform) -> KvCacheLayout {
    let r = match t {
        Transform::Identity => return l,
        Transform::Tp(s, r) => l.tp_slice(s, r),
        Transform::Layers(a) => {
            let n = l.geometry().num_layers;
            l.layer_range(a % n..n)
        }
        Transform::Split(r) => l.split_blocks(r),
    };
    r.unwrap_or(l)
}

/// A random valid untransformed layout of any kind.
pub fn base_layout() -> impl Strategy<Value = KvCacheLayout> {
    seed().prop_filter_map("seed does not make a valid layout", |s| build(&s))
}

/// A random valid layout of any kind, sometimes transformed (explicit strides).
pub fn any_layout() -> impl Strategy<Value = KvCacheLayout> {
    (base_layout(), transform()).prop_map(|(l, t)| apply(l, t))
}
