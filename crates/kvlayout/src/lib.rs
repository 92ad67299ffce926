//! # kvlayout: one validated descriptor for the memory layout of a paged KV cache
//!
//! This crate owns [`KvCacheLayout`]: the description of where every element of a paged KV
//! cache lives, validated once, from which everything else is derived — the checked address
//! function, strided views in each consumer's convention (standard `[B, H, N, C]`, vLLM paged
//! v1, FlashAttention, FlashInfer), the `#[repr(C)]` field arguments every kernel takes
//! ([`KvFieldArgs`], mirrored by the C header in `kernels-cuda/include/`), byte regions for
//! transfers, and transformations (TP head slice, kernel-block split, layer range) with stated
//! post-conditions, and the dense cache of one TP rank ([`KvCacheLayout::tp_rank_layout`]). It
//! parses presets, compact spec strings (`order=` for standardized pages, `tensor=` for
//! another engine's tensor such as `tensor=flashinfer-hnd`) and a versioned JSON form. Its
//! [`ops`] module is the backend contract: the ops' arguments and their checks, the one
//! vocabulary of block moves and their plan, the [`ops::Backend`] trait, and
//! [`ops::AnyBackend`], any backend held as one type.
//!
//! It does not own memory, run kernels, build kernel launches, move bytes or read files:
//! `kvlayout-device`, the backends, the connector and the CLI do, and they take every offset
//! from here. It never guesses a layout from a tensor shape; [`KvCacheLayout::check_tensor`]
//! verifies a framework's tensor against a stated layout instead. No `unsafe`, no I/O.
//!
//! ```
//! use kvlayout::{Convention, Coord, Field, KvCacheLayout, ViewTarget};
//! // Llama-3-8B with fp8 and head-major pages of packed K|V rows, 4096 blocks.
//! let layout: KvCacheLayout = "llama-3-8b B=4096 dtype=fp8_e4m3 order=LBHNC".parse()?;
//! let at = layout.offset(&Coord { layer: 1, block: 2, head: 3, slot: 4, field: Field::V, dim: 5 })?;
//! let page = 8 * 16 * 256; // heads x tokens x (K|V) bytes
//! assert_eq!(at.offset, (4096 + 2) * page + 3 * (16 * 256) + 4 * 256 + 128 + 5);
//! let v = layout.view(Convention::Flashinfer, ViewTarget::Kv, 0);
//! assert!(v.is_ok()); // K and V share strides: (B, 2, N, H, D) is a plain strided view
//! // FlashInfer's own HND cache, (B, 2, H, N, D), is a different layout:
//! let fi: KvCacheLayout = "kv L=1 B=8 N=16 H=4 D=8 dtype=bf16 tensor=flashinfer-hnd".parse()?;
//! assert!(fi.view(Convention::FlashinferHnd, ViewTarget::Kv, 0)?.is_contiguous());
//! // See examples/describe_cache.rs for a tensor check and TP slicing.
//! # Ok::<(), kvlayout::LayoutError>(())
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod abi;
mod alias;
mod dtype;
mod error;
mod explain;
mod field_map;
mod layout;
mod lower;
pub mod ops;
mod presets;
mod regions;
mod serde_doc;
mod spec;
mod spec_string;
mod tensor_check;
mod transform;
mod view;

pub use abi::{field_code, KvFieldArgs, LeBytes};
pub use dtype::{DType, TensorScales};
pub use error::{LayoutError, Result, MAX_OFFSET};
pub use explain::{Explanation, FieldInfo, PageRun, ViewInfo};
pub use field_map::FieldMap;
pub use layout::{Coord, KvCacheLayout, Location};
pub use presets::{preset, PRESETS, PRESET_NAMES};
pub use regions::{merge_ranges, ByteRange, MAX_REGIONS};
pub use serde_doc::{LayoutDocument, JSON_VERSION, JSON_VERSIONS_READ};
pub use spec::{
    Axis, AxisOrder, BufferExtent, Content, EngineTensor, Field, FieldStrides, Geometry,
    InPageOrder, LayoutSpec, Paged, Placement, StridedField,
};
pub use spec_string::parse_spec;
pub use tensor_check::{StorageOffset, TensorClaim};
pub use transform::tp_head_range;
pub use view::{Convention, TensorView, ViewTarget, CONVENTION_NAMES};
