//! `Layout.as_view`: the zero-copy view of a field over the caller's allocation. The layout
//! gives the view (or refuses it); the allocation of the view's buffer is chosen by index from
//! a list where the layout has several buffers, and must be one contiguous run holding the
//! buffer's registered span. `kvlayout._arrays._strided_view` then builds the numpy array or
//! torch tensor, checking the view's extent once more against what it builds on.

use kvlayout::ops::OpError;
use kvlayout::{KvCacheLayout, TensorView};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use crate::arrays;
use crate::convert;
use crate::errors::{raise, Raised};

/// The view of `field` (or `kv`) of `layer` in `convention` over `buf`.
pub fn as_view<'py>(
    layout: &KvCacheLayout,
    buf: &Bound<'py, PyAny>,
    field: &str,
    convention: &str,
    layer: i128,
) -> PyResult<Bound<'py, PyAny>> {
    let c = convert::convention(convention)?;
    let t = convert::target(field)?;
    let layer = arrays::layer(layout, layer)?;
    let v = layout.view(c, t, layer).map_err(raise)?;
    let alloc = allocation(layout, buf, v.buffer)?;
    let d = arrays::describe(&alloc)?;
    if !d.c_contiguous {
        return Err(raise(Raised::array(format!(
            "the allocation of buffer {} (shape {:?}, strides {:?} elements) is not one \
             contiguous run of bytes",
            v.buffer, d.shape, d.strides
        ))));
    }
    let buffer = v.buffer as usize;
    let needed = layout.extents()[buffer].end.max(extent_end(&v));
    if d.nbytes < needed {
        return Err(raise(OpError::BufferTooShort {
            buffer,
            len: d.nbytes,
            needed,
        }));
    }
    crate::python::strided_view(buf.py())?.call1((
        alloc,
        v.offset,
        v.shape.clone(),
        v.strides.clone(),
        v.dtype.to_string(),
    ))
}

/// One past the last byte the view reads (its elements lie inside the registered span of a
/// validated layout; computed anyway, since nothing else bounds `as_strided`).
fn extent_end(v: &TensorView) -> u64 {
    let e = v.dtype.size_bytes();
    let last: u64 = v
        .shape
        .iter()
        .zip(&v.strides_bytes)
        .map(|(&n, &s)| n.saturating_sub(1).saturating_mul(s))
        .fold(0, u64::saturating_add);
    v.offset_bytes.saturating_add(last).saturating_add(e)
}

/// The allocation of buffer `index`: `buf` itself for a one-buffer layout, else item `index`
/// of a list or tuple of one allocation per buffer.
fn allocation<'py>(
    layout: &KvCacheLayout,
    buf: &Bound<'py, PyAny>,
    index: u32,
) -> PyResult<Bound<'py, PyAny>> {
    let n = layout.num_buffers();
    let items = if let Ok(list) = buf.cast::<PyList>() {
        Some(list.to_tuple())
    } else {
        buf.cast::<PyTuple>().ok().cloned()
    };
    match items {
        Some(items) if items.len() == n => items.get_item(index as usize),
        Some(items) => Err(raise(Raised::array(format!(
            "{} allocations for a layout of {n} buffers",
            items.len()
        )))),
        None if n == 1 => Ok(buf.clone()),
        None => Err(raise(Raised::array(format!(
            "the layout has {n} buffers (allocations); pass a list of {n}, indexed by buffer"
        )))),
    }
}
