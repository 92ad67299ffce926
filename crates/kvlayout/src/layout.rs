//! [`KvCacheLayout`]: a validated, immutable layout and its checked address function.

use serde::{Deserialize, Serialize};

use crate::alias;
use crate::dtype::{DType, TensorScales};
use crate::error::{add, mul, positive, LayoutError, Result, MAX_OFFSET};
use crate::field_map::FieldMap;
use crate::lower::{lower, row_fields, Extents, RowField};
use crate::spec::{BufferExtent, Content, Field, FieldStrides, Geometry, LayoutSpec, Placement};

/// A validated KV cache layout: the one source of truth for every address.
///
/// Construction checks everything once (sizes, overflow, alignment, aliasing); afterwards
/// every coordinate in the domain has exactly one byte offset, and nothing outside the domain
/// has one.
///
/// ```
/// use kvlayout::{KvCacheLayout, Coord, Field};
/// let layout: KvCacheLayout = "kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=NHD".parse()?;
/// // token-major page: row = [K 8][V 8] f16 = 32 B, token stride = 4 heads * 32 B
/// let at = layout.offset(&Coord { layer: 0, block: 1, head: 2, slot: 3, field: Field::V, dim: 5 })?;
/// assert_eq!(at.offset, 1 * (16 * 4 * 32) + 3 * (4 * 32) + 2 * 32 + 16 + 5 * 2);
/// # Ok::<(), kvlayout::LayoutError>(())
/// ```
/// Its serde form is the versioned JSON document (`serde_doc`).
#[derive(Debug, Clone, PartialEq)]
pub struct KvCacheLayout {
    spec: LayoutSpec,
    fields: Vec<FieldMap>,
    extents: Vec<BufferExtent>,
}

/// A coordinate in the layout's domain: `(field, layer, block, head, slot, dim)`, in the order
/// of [`Coord::new`]'s arguments and of the fields below.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Coord {
    /// Which field.
    pub field: Field,
    /// Layer slot, `< num_layers`.
    pub layer: u64,
    /// Block, `< num_blocks`.
    pub block: u64,
    /// Head slot, `< num_kv_heads`.
    pub head: u64,
    /// Slot (token position in the block; a state slot where one holds several tokens),
    /// `< num_slots()`.
    pub slot: u64,
    /// Element index in the field's row, `< width`.
    pub dim: u64,
}

impl Coord {
    /// The coordinate of element `dim` of `field` at `(layer, block, head, slot)`; the
    /// arguments are in the order the fields are declared.
    ///
    /// ```
    /// use kvlayout::{Coord, Field};
    /// let c = Coord::new(Field::V, 0, 1, 2, 3, 4);
    /// assert_eq!((c.layer, c.block, c.head, c.slot, c.dim), (0, 1, 2, 3, 4));
    /// ```
    pub fn new(field: Field, layer: u64, block: u64, head: u64, slot: u64, dim: u64) -> Self {
        Coord {
            field,
            layer,
            block,
            head,
            slot,
            dim,
        }
    }
}

/// Where an element lives: a buffer (allocation) and a byte offset from its start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Location {
    /// Buffer index (0 unless K and V are separate allocations).
    pub buffer: u32,
    /// Byte offset from the buffer's start.
    pub offset: u64,
}

fn check_alignment(map: &FieldMap) -> Result<()> {
    let align = map.elem_bytes();
    let names = [
        "layer stride",
        "block stride",
        "head stride",
        "slot stride",
        "dim chunk stride",
        "dim stride",
    ];
    let mut checks = vec![("base offset", map.strides.base_offset)];
    for (name, (ext, stride)) in names.iter().zip(map.axes()) {
        if ext > 1 {
            checks.push((name, stride));
        }
    }
    for (what, value) in checks {
        if value % align != 0 {
            return Err(if matches!(map.field, Field::KScale | Field::VScale) {
                LayoutError::MisalignedScale {
                    field: format!("{} ({what})", map.field),
                    offset: value,
                    align,
                }
            } else {
                LayoutError::Misaligned {
                    what: format!("{} {what}", map.field),
                    value,
                    align,
                }
            });
        }
    }
    Ok(())
}

/// Checked `data_end` of a field: the largest offset plus one element, within 63 bits.
fn checked_end(map: &FieldMap) -> Result<u64> {
    let ctx = || format!("largest offset of field {}", map.field);
    let mut end = map.strides.base_offset;
    for (ext, stride) in map.axes() {
        end = add(end, mul(ext - 1, stride, ctx)?, ctx)?;
    }
    add(end, map.elem_bytes(), ctx)
}

/// The map of MLA's K (the whole latent) or V (its first `rank` elements, each addressed as
/// the latent's element of the same index). A latent split into chunks keeps its split for V
/// when a chunk is shorter than V (validation requires V to be whole chunks); otherwise V lies
/// in the first chunk and is not split.
fn mla_alias(latent: &FieldMap, field: Field, rank: u64) -> FieldMap {
    if field == Field::K {
        return FieldMap { field, ..*latent };
    }
    let s = latent.strides;
    let strides = if s.dim_split >= rank {
        FieldStrides {
            dim_split: rank,
            dim_chunk: s.dim.saturating_mul(rank),
            ..s
        }
    } else {
        s
    };
    FieldMap {
        field,
        width: rank,
        strides,
        ..*latent
    }
}

/// Aliasing the overlap check of `what` could not decide.
fn undecided(what: String) -> LayoutError {
    LayoutError::Aliasing {
        detail: format!("{what}: strides too irregular to prove disjoint"),
    }
}

/// The invariants every map a layout answers must hold, stored or derived: its bytes inside
/// its buffer's extent (within 63 bits), aligned to its element, no two elements sharing bytes.
fn check_map(map: &FieldMap, extents: &[BufferExtent]) -> Result<()> {
    let end = checked_end(map)?;
    check_alignment(map)?;
    // Lowering keeps every extent within MAX_OFFSET (checked arithmetic, or checked as given).
    let x = extents[map.strides.buffer as usize];
    if map.strides.base_offset < x.start || end > x.end {
        return Err(LayoutError::Invalid(format!(
            "field {} spans bytes [{}, {}) outside buffer {} extent [{}, {})",
            map.field, map.strides.base_offset, end, map.strides.buffer, x.start, x.end
        )));
    }
    if alias::self_overlaps(map).map_err(|_| undecided(map.field.to_string()))? {
        return Err(LayoutError::Aliasing {
            detail: format!(
                "two elements of field {} share bytes (strides: {})",
                map.field,
                alias::describe(&map.strides)
            ),
        });
    }
    Ok(())
}

/// The per-tensor scales are finite and positive, and one for MLA's one latent.
fn check_scales(spec: &LayoutSpec) -> Result<()> {
    for (what, v) in [
        ("k_scale", spec.scales.k_scale),
        ("v_scale", spec.scales.v_scale),
    ] {
        if !(v.is_finite() && v > 0.0) {
            return Err(LayoutError::Invalid(format!(
                "per-tensor {what} must be finite and positive, got {v}"
            )));
        }
    }
    if spec.content.shares_latent() && spec.scales.k_scale != spec.scales.v_scale {
        return Err(LayoutError::Invalid(format!(
            "MLA stores one latent for K and V, so its scale is one: k_scale {} and v_scale \
             {} differ",
            spec.scales.k_scale, spec.scales.v_scale
        )));
    }
    Ok(())
}

/// Token (state) slots per block: `block_size / tokens_per_state` (a whole number), or 1 for
/// per-block states.
fn slots_per_block(spec: &LayoutSpec) -> Result<u64> {
    let g = spec.geometry;
    if spec.content.is_per_block_state() {
        return Ok(1);
    }
    if !g.block_size.is_multiple_of(g.tokens_per_state) {
        return Err(LayoutError::Invalid(format!(
            "block_size {} is not a multiple of tokens_per_state {}",
            g.block_size, g.tokens_per_state
        )));
    }
    Ok(g.block_size / g.tokens_per_state)
}

/// Every axis extent is within [`MAX_OFFSET`].
fn check_extents_in_range(g: &Geometry) -> Result<()> {
    for (what, v) in [
        ("num_layers", g.num_layers),
        ("num_blocks", g.num_blocks),
        ("block_size", g.block_size),
        ("num_kv_heads", g.num_kv_heads),
    ] {
        if v > MAX_OFFSET {
            return Err(LayoutError::Overflow {
                what: what.into(),
                limit: MAX_OFFSET,
            });
        }
    }
    Ok(())
}

/// The address map of a lowered field, its split normalized: a split whose chunks abut (chunk
/// stride = split x element stride) addresses exactly like no split, so views and comparisons
/// see one form.
fn lowered_map(g: &Geometry, slots: u64, r: RowField, mut strides: FieldStrides) -> FieldMap {
    let chunks = r.width / strides.dim_split.max(1);
    if strides.dim_split != r.width
        && (chunks <= 1 || strides.dim_chunk == strides.dim_split.saturating_mul(strides.dim))
        && strides.dim_split > 0
        && r.width.is_multiple_of(strides.dim_split)
    {
        strides.dim_chunk = strides.dim.saturating_mul(r.width);
        strides.dim_split = r.width;
    }
    FieldMap {
        field: r.field,
        dtype: r.dtype,
        num_layers: g.num_layers,
        num_blocks: g.num_blocks,
        num_heads: g.num_kv_heads,
        num_slots: slots,
        width: r.width,
        strides,
    }
}

/// MLA's K and V maps, derived from the latent, hold the invariants of a stored map, V being
/// whole chunks of a split latent.
fn check_mla_aliases(latent: &FieldMap, kv_lora_rank: u64, extents: &[BufferExtent]) -> Result<()> {
    let s = latent.strides.dim_split;
    if s < kv_lora_rank && !kv_lora_rank.is_multiple_of(s) {
        return Err(LayoutError::Invalid(format!(
            "the MLA latent is split into chunks of {s} elements, so V (its first \
             kv_lora_rank = {kv_lora_rank} elements) is not whole chunks"
        )));
    }
    for field in [Field::K, Field::V] {
        check_map(&mla_alias(latent, field, kv_lora_rank), extents)?;
    }
    Ok(())
}

/// No two stored fields in one buffer share bytes.
fn check_fields_disjoint(fields: &[FieldMap]) -> Result<()> {
    for (i, a) in fields.iter().enumerate() {
        for b in &fields[i + 1..] {
            if a.strides.buffer == b.strides.buffer
                && alias::cross_overlaps(a, b)
                    .map_err(|_| undecided(format!("{} and {}", a.field, b.field)))?
            {
                return Err(LayoutError::Aliasing {
                    detail: format!("fields {} and {} share bytes", a.field, b.field),
                });
            }
        }
    }
    Ok(())
}

impl KvCacheLayout {
    /// Validates a spec and derives every field's address map.
    pub fn new(mut spec: LayoutSpec) -> Result<Self> {
        if let Placement::Strided { fields, .. } = &mut spec.placement {
            fields.sort_by_key(|f| f.field);
        }
        check_scales(&spec)?;
        let g = spec.geometry;
        positive("num_layers", g.num_layers)?;
        positive("num_blocks", g.num_blocks)?;
        positive("block_size", g.block_size)?;
        positive("num_kv_heads", g.num_kv_heads)?;
        positive("tokens_per_state", g.tokens_per_state)?;
        spec.content.check(spec.dtype, g.num_kv_heads)?;
        let slots = slots_per_block(&spec)?;
        check_extents_in_range(&g)?;
        let rows = row_fields(&spec.content, spec.dtype);
        let ext = Extents {
            layers: g.num_layers,
            blocks: g.num_blocks,
            heads: g.num_kv_heads,
            slots,
        };
        let (lowered, extents) = lower(&spec.placement, &rows, ext)?;
        let fields: Vec<FieldMap> = lowered
            .into_iter()
            .map(|(r, strides)| lowered_map(&g, slots, r, strides))
            .collect();
        for map in &fields {
            check_map(map, &extents)?;
        }
        // The maps derived from stored ones (MLA's K and V) hold the same invariants.
        if let Some(kv_lora_rank) = spec.content.kv_lora_rank() {
            check_mla_aliases(&fields[0], kv_lora_rank, &extents)?;
        }
        check_fields_disjoint(&fields)?;
        Ok(KvCacheLayout {
            spec,
            fields,
            extents,
        })
    }

    /// The spec this layout was built from.
    pub fn spec(&self) -> &LayoutSpec {
        &self.spec
    }

    /// Axis extents.
    pub fn geometry(&self) -> &Geometry {
        &self.spec.geometry
    }

    /// Content kind.
    pub fn content(&self) -> &Content {
        &self.spec.content
    }

    /// Cache element type.
    pub fn dtype(&self) -> DType {
        self.spec.dtype
    }

    /// Per-tensor scales.
    pub fn scales(&self) -> TensorScales {
        self.spec.scales
    }

    /// Placement as stated.
    pub fn placement(&self) -> &Placement {
        &self.spec.placement
    }

    /// Token (state) slots per block: `block_size / tokens_per_state`, or 1 for Mamba states.
    pub fn num_slots(&self) -> u64 {
        self.fields[0].num_slots
    }

    /// The slot that holds a token position of a block.
    pub fn slot_of_token(&self, token_in_block: u64) -> Result<u64> {
        let g = self.geometry();
        if token_in_block >= g.block_size {
            return Err(LayoutError::OutOfRange {
                axis: "token",
                value: token_in_block,
                limit: g.block_size,
            });
        }
        Ok(if self.spec.content.is_per_block_state() {
            0
        } else {
            token_in_block / g.tokens_per_state
        })
    }

    /// Address maps of the stored fields, in row order. Stored fields never overlap.
    pub fn stored_fields(&self) -> &[FieldMap] {
        &self.fields
    }

    /// Every field that can be addressed: the stored ones, plus K and V of MLA (aliases of the
    /// latent: K is all of it, V its first `kv_lora_rank` elements).
    pub fn readable_fields(&self) -> Vec<Field> {
        let mut out: Vec<Field> = self.fields.iter().map(|f| f.field).collect();
        if self.spec.content.shares_latent() {
            out.extend([Field::K, Field::V]);
        }
        out
    }

    /// The address map of a readable field.
    pub fn field_map(&self, field: Field) -> Result<FieldMap> {
        if let Some(m) = self.fields.iter().find(|m| m.field == field) {
            return Ok(*m);
        }
        if let Some(kv_lora_rank) = self.spec.content.kv_lora_rank() {
            if matches!(field, Field::K | Field::V) {
                return Ok(mla_alias(&self.fields[0], field, kv_lora_rank));
            }
        }
        Err(LayoutError::NoSuchField {
            field: field.to_string(),
            available: self
                .readable_fields()
                .iter()
                .map(|f| f.to_string())
                .collect::<Vec<_>>()
                .join(", "),
        })
    }

    /// The checked address function: `(layer, block, head, slot, field, dim)` to a byte offset.
    pub fn offset(&self, c: &Coord) -> Result<Location> {
        let m = self.field_map(c.field)?;
        for (axis, value, limit) in [
            ("layer", c.layer, m.num_layers),
            ("block", c.block, m.num_blocks),
            ("head", c.head, m.num_heads),
            ("slot", c.slot, m.num_slots),
            ("dim", c.dim, m.width),
        ] {
            if value >= limit {
                return Err(LayoutError::OutOfRange { axis, value, limit });
            }
        }
        Ok(Location {
            buffer: m.strides.buffer,
            offset: m.offset_unchecked(c.layer, c.block, c.head, c.slot, c.dim),
        })
    }

    /// Owned byte range of each buffer: the span to register for transfers (padding included).
    pub fn extents(&self) -> &[BufferExtent] {
        &self.extents
    }

    /// Number of buffers (allocations): 2 when K and V are allocated separately.
    pub fn num_buffers(&self) -> usize {
        self.extents.len()
    }

    /// Bytes of data (no padding) of one (layer, block) across all stored fields.
    pub fn dense_page_bytes(&self) -> u64 {
        self.fields.iter().fold(0u64, |acc, m| {
            acc.saturating_add(m.num_heads * m.num_slots * m.width * m.elem_bytes())
        })
    }
}
