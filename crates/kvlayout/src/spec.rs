//! The plain-data description a user writes: geometry, content, dtype, placement.
//!
//! A [`LayoutSpec`] is not yet trusted; [`crate::KvCacheLayout::new`] validates it once and
//! derives everything else from it.

use serde::{Deserialize, Serialize};
use strum::{Display, EnumIter, EnumString, IntoStaticStr};

use crate::dtype::{DType, TensorScales};

mod content;

pub use content::Content;

/// Extents of the logical axes `[L, B, H, N]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Geometry {
    /// Layer slots sharing the allocation (1 for a per-layer tensor).
    pub num_layers: u64,
    /// Blocks (pages) per layer.
    pub num_blocks: u64,
    /// Tokens per block, as the scheduler counts them.
    pub block_size: u64,
    /// Head slots: KV heads for attention, SSM heads for Mamba SSM state, 1 for MLA.
    pub num_kv_heads: u64,
    /// Tokens folded into one state slot (compressed token axis, e.g. 4); 1 normally.
    #[serde(default = "one")]
    pub tokens_per_state: u64,
}

fn one() -> u64 {
    1
}

/// A named part of the content row. K and V of MLA are readable aliases of `Latent`.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Display,
    EnumString,
    EnumIter,
    IntoStaticStr,
    Serialize,
    Deserialize,
)]
#[strum(serialize_all = "snake_case", ascii_case_insensitive)]
#[serde(rename_all = "snake_case")]
pub enum Field {
    /// Keys.
    K,
    /// Values.
    V,
    /// Inline per-token-head key scale (f32).
    KScale,
    /// Inline per-token-head value scale (f32).
    VScale,
    /// MLA latent.
    Latent,
    /// Opaque bytes.
    Bytes,
    /// Mamba conv state.
    Conv,
    /// Mamba SSM state.
    Ssm,
}

/// A logical axis outside the content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Display, EnumString, IntoStaticStr)]
pub enum Axis {
    /// Layer slot.
    L,
    /// Block.
    B,
    /// Head slot.
    H,
    /// Token / state slot within a block.
    N,
}

macro_rules! orders {
    ($($name:ident = [$a:ident, $b:ident, $c:ident, $d:ident] $(alias $disp:literal $alias:literal)?;)*) => {
        /// Physical order of `[L, B, H, N]`, outermost first; content C is always innermost.
        ///
        /// The aliases `NHD` (= `LBNHC`, token-major pages) and `HND` (= `LBHNC`, head-major
        /// pages) are packed K|V rows: each row holds K then V in the content axis. They are
        /// not FlashInfer's `(B, 2, H, N, D)` tensor, which is `tensor=flashinfer-hnd`. The
        /// canonical form prints the permutation name.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Display, EnumString, EnumIter,
                 IntoStaticStr, Serialize, Deserialize)]
        #[strum(ascii_case_insensitive)]
        pub enum AxisOrder {
            $(
                #[allow(missing_docs)]
                $(#[strum(to_string = $disp, serialize = $alias)] #[serde(alias = $alias)])?
                $name,
            )*
        }

        impl AxisOrder {
            /// The names `order=` accepts: the 24 permutations, then the aliases `NHD` and
            /// `HND` (packed K|V rows).
            pub const NAMES: &'static [&'static str] = &[$(stringify!($name),)* "NHD", "HND"];

            /// The four axes, outermost first.
            pub const fn axes(self) -> [Axis; 4] {
                match self {
                    $(AxisOrder::$name => [Axis::$a, Axis::$b, Axis::$c, Axis::$d],)*
                }
            }
        }
    };
}

orders! {
    LBHNC = [L, B, H, N] alias "LBHNC" "HND";
    LBNHC = [L, B, N, H] alias "LBNHC" "NHD";
    BLHNC = [B, L, H, N];
    BLNHC = [B, L, N, H];
    BHLNC = [B, H, L, N];
    BHNLC = [B, H, N, L];
    BNLHC = [B, N, L, H];
    BNHLC = [B, N, H, L];
    LHBNC = [L, H, B, N];
    LHNBC = [L, H, N, B];
    LNBHC = [L, N, B, H];
    LNHBC = [L, N, H, B];
    HLBNC = [H, L, B, N];
    HLNBC = [H, L, N, B];
    HBLNC = [H, B, L, N];
    HBNLC = [H, B, N, L];
    HNLBC = [H, N, L, B];
    HNBLC = [H, N, B, L];
    NLBHC = [N, L, B, H];
    NLHBC = [N, L, H, B];
    NBLHC = [N, B, L, H];
    NBHLC = [N, B, H, L];
    NHLBC = [N, H, L, B];
    NHBLC = [N, H, B, L];
}

/// Order of heads and tokens inside a page: token-major (NHD) or head-major (HND).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Display, EnumString, EnumIter, Serialize, Deserialize,
)]
#[strum(ascii_case_insensitive)]
pub enum InPageOrder {
    /// `[N, H, D]`: tokens outer, heads inner.
    NHD,
    /// `[H, N, D]`: heads outer, tokens inner.
    HND,
}

/// Another engine's K/V tensor layout, named by the spec key `tensor=` (alias `legacy=`).
///
/// `flash-attn` and `flashinfer` parse as `flash-attn-nhd` and `flashinfer-nhd`, the
/// defaults of FlashAttention and FlashInfer. [`EngineTensor::NAMES`] lists what parses.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Display,
    EnumString,
    EnumIter,
    IntoStaticStr,
    Serialize,
    Deserialize,
)]
#[strum(serialize_all = "kebab-case", ascii_case_insensitive)]
#[serde(rename_all = "kebab-case")]
pub enum EngineTensor {
    /// vLLM paged attention v1: key `[B, H, D/x, N, x]`, value `[B, H, D, N]`, both from one
    /// `(2, B, N*H*D)` allocation per layer; `x = 16 / element_size`.
    VllmPagedV1,
    /// FlashAttention `(2, B, N, H, D)`, identity stride order.
    #[strum(to_string = "flash-attn-nhd", serialize = "flash-attn")]
    #[serde(alias = "flash-attn")]
    FlashAttnNhd,
    /// FlashAttention `(2, B, N, H, D)` with stride order `(0, 1, 3, 2, 4)`.
    FlashAttnHnd,
    /// FlashInfer `(B, 2, N, H, D)`.
    #[strum(to_string = "flashinfer-nhd", serialize = "flashinfer")]
    #[serde(alias = "flashinfer")]
    FlashinferNhd,
    /// FlashInfer `(B, 2, H, N, D)`.
    FlashinferHnd,
    /// Separate K and V allocations `[B, N, H, D]` (buffer 0 and 1), as SGLang's k/v buffers.
    SeparateNhd,
    /// Separate K and V allocations `[B, H, N, D]`.
    SeparateHnd,
}

impl EngineTensor {
    /// The names `tensor=` accepts: each layout's canonical name, then the convention names
    /// that stand for their default (`flash-attn`, `flashinfer`).
    pub const NAMES: &'static [&'static str] = &[
        "vllm-paged-v1",
        "flash-attn-nhd",
        "flash-attn-hnd",
        "flashinfer-nhd",
        "flashinfer-hnd",
        "separate-nhd",
        "separate-hnd",
        "flash-attn",
        "flashinfer",
    ];
}

/// The standardized paged placement: a permutation of `[L, B, H, N]`, content innermost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Paged {
    /// Physical order.
    pub order: AxisOrder,
    /// Byte offset of the first page inside the buffer.
    #[serde(default)]
    pub base_offset: u64,
    /// Every page start is a multiple of this; the page is padded up to it. 1 = none.
    #[serde(default = "one")]
    pub alignment: u64,
    /// Padded page size in bytes (>= the dense page). Needs H and N inside both L and B (H may
    /// sit anywhere when it has extent 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_size_padded: Option<u64>,
    /// Explicit layer stride in bytes (shared allocations).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer_stride_bytes: Option<u64>,
    /// Explicit block stride in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_stride_bytes: Option<u64>,
}

impl Paged {
    /// A dense placement in `order` at offset 0.
    pub fn new(order: AxisOrder) -> Self {
        Paged {
            order,
            base_offset: 0,
            alignment: 1,
            page_size_padded: None,
            layer_stride_bytes: None,
            block_stride_bytes: None,
        }
    }
}

/// Fully explicit strides of one stored field; what transformations produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FieldStrides {
    /// Which buffer (allocation) the field lives in.
    pub buffer: u32,
    /// Byte offset of element (0, 0, 0, 0, 0).
    pub base_offset: u64,
    /// Bytes between layer slots.
    pub layer: u64,
    /// Bytes between blocks.
    pub block: u64,
    /// Bytes between head slots.
    pub head: u64,
    /// Bytes between token/state slots.
    pub slot: u64,
    /// The content index d is split as `(d / dim_split, d % dim_split)`; equal to the width
    /// when it is not split.
    pub dim_split: u64,
    /// Bytes between chunks `d / dim_split`.
    pub dim_chunk: u64,
    /// Bytes between elements `d % dim_split`.
    pub dim: u64,
}

impl FieldStrides {
    /// The nine numbers in declaration order, as the spec string's `@FIELD=` value lists
    /// them: buffer, base offset, layer, block, head, slot, dim split, dim chunk, dim.
    ///
    /// ```
    /// let l: kvlayout::KvCacheLayout = "kv L=1 B=3 N=4 H=1 D=8 dtype=f16 \
    ///     @k=0:0:0:64:64:16:8:16:2 @v=0:192:0:64:16:16:8:16:2 @buf0=0..384".parse()?;
    /// let v = l.field_map(kvlayout::Field::V)?.strides;
    /// assert_eq!(v.to_array(), [0, 192, 0, 64, 16, 16, 8, 16, 2]);
    /// # Ok::<(), kvlayout::LayoutError>(())
    /// ```
    pub fn to_array(&self) -> [u64; 9] {
        [
            u64::from(self.buffer),
            self.base_offset,
            self.layer,
            self.block,
            self.head,
            self.slot,
            self.dim_split,
            self.dim_chunk,
            self.dim,
        ]
    }
}

/// Byte range `[start, end)` of one buffer that the layout owns (its registered span).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BufferExtent {
    /// First byte.
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
}

/// One explicitly placed field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StridedField {
    /// The field.
    pub field: Field,
    /// Its strides.
    pub strides: FieldStrides,
}

/// Where the fields live.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Placement {
    /// Standardized pages.
    Paged(Paged),
    /// Another engine's K/V tensor layout (spec key `tensor=`; JSON kind `tensor`, alias
    /// `legacy`).
    #[serde(rename = "tensor", alias = "legacy")]
    EngineTensor {
        /// Which one.
        layout: EngineTensor,
        /// Byte offset inside the buffer(s).
        #[serde(default)]
        base_offset: u64,
    },
    /// Every field's strides stated, with the owned extent of each buffer.
    Strided {
        /// One entry per stored field.
        fields: Vec<StridedField>,
        /// One entry per buffer, indexed by `FieldStrides::buffer`.
        extents: Vec<BufferExtent>,
    },
}

/// The complete, unvalidated description of a KV cache layout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayoutSpec {
    /// Axis extents.
    pub geometry: Geometry,
    /// Content row.
    pub content: Content,
    /// Element type of the cache (K/V/latent/state values).
    pub dtype: DType,
    /// Per-tensor scales.
    #[serde(default)]
    pub scales: TensorScales,
    /// Placement in memory.
    pub placement: Placement,
}
