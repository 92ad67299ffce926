//! Formatting a spec as its canonical compact string (see the parent module's grammar).

use std::fmt;

use crate::dtype::TensorScales;
use crate::layout::KvCacheLayout;
use crate::spec::{BufferExtent, Content, LayoutSpec, Paged, Placement, StridedField};

impl fmt::Display for LayoutSpec {
    /// The canonical compact spec string.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let g = &self.geometry;
        write!(
            f,
            "{} L={} B={} N={} H={}",
            self.content.spec_name(),
            g.num_layers,
            g.num_blocks,
            g.block_size,
            g.num_kv_heads
        )?;
        if g.tokens_per_state != 1 {
            write!(f, " tps={}", g.tokens_per_state)?;
        }
        write_content_sizes(f, &self.content)?;
        write!(f, " dtype={}", self.dtype)?;
        if self.scales != TensorScales::default() {
            write!(
                f,
                " k_scale={:?} v_scale={:?}",
                self.scales.k_scale, self.scales.v_scale
            )?;
        }
        match &self.placement {
            Placement::Paged(p) => write_paged(f, p),
            Placement::EngineTensor {
                layout,
                base_offset,
            } => {
                write!(f, " tensor={layout}")?;
                if *base_offset != 0 {
                    write!(f, " base={base_offset}")?;
                }
                Ok(())
            }
            Placement::Strided { fields, extents } => write_strided(f, fields, extents),
        }
    }
}

/// The content's size keys: ` D= Dv=`, ` rank= rope=`, ` row=`, and so on.
fn write_content_sizes(f: &mut fmt::Formatter<'_>, content: &Content) -> fmt::Result {
    for (name, value) in content.sizes() {
        write!(f, " {}={value}", size_key(name))?;
    }
    Ok(())
}

/// The spec-string key of a content size named as in the JSON form.
fn size_key(name: &'static str) -> &'static str {
    match name {
        "head_size" => "D",
        "head_size_v" => "Dv",
        "kv_lora_rank" => "rank",
        "rope_dim" => "rope",
        "row_bytes" => "row",
        "state_size" => "state",
        same => same,
    }
}

/// A paged placement's keys: `order=`, then each of the others that differs from its default.
fn write_paged(f: &mut fmt::Formatter<'_>, p: &Paged) -> fmt::Result {
    write!(f, " order={}", p.order)?;
    if p.base_offset != 0 {
        write!(f, " base={}", p.base_offset)?;
    }
    if p.alignment != 1 {
        write!(f, " align={}", p.alignment)?;
    }
    for (key, v) in [
        ("page", p.page_size_padded),
        ("layer_stride", p.layer_stride_bytes),
        ("block_stride", p.block_stride_bytes),
    ] {
        if let Some(v) = v {
            write!(f, " {key}={v}")?;
        }
    }
    Ok(())
}

/// A strided placement's keys: `@FIELD=` strides per field, then `@bufI=` per buffer.
fn write_strided(
    f: &mut fmt::Formatter<'_>,
    fields: &[StridedField],
    extents: &[BufferExtent],
) -> fmt::Result {
    for sf in fields {
        let numbers = sf.strides.to_array().map(|n| n.to_string());
        write!(f, " @{}={}", sf.field, numbers.join(":"))?;
    }
    for (i, x) in extents.iter().enumerate() {
        write!(f, " @buf{i}={}..{}", x.start, x.end)?;
    }
    Ok(())
}

impl fmt::Display for KvCacheLayout {
    /// The canonical compact spec string; it parses back to an equal layout.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.spec().fmt(f)
    }
}
