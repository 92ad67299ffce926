//! `Layout.check`: a framework's tensor against the layout's view, never guessed. The tensor's
//! dtype, shape and strides come from `kvlayout._arrays.describe` and are checked first; then,
//! where a base is stated (an address, or the allocation itself, whose size is then checked
//! against the layout), its storage offset. `KvCacheLayout::check_tensor` compares them and
//! names the first disagreement.

use kvlayout::ops::OpError;
use kvlayout::{
    Convention, DType, KvCacheLayout, LayoutError, TensorClaim, TensorView, ViewTarget,
};
use pyo3::prelude::*;

use crate::arrays::{self, Base, Described};
use crate::convert;
use crate::errors::raise;

/// What `Layout.check` was asked.
pub struct Request<'a, 'py> {
    /// The tensor.
    pub obj: &'a Bound<'py, PyAny>,
    /// Field name or `kv`.
    pub field: &'a str,
    /// Convention name.
    pub convention: &'a str,
    /// Layer, as given.
    pub layer: i128,
    /// The base address or allocation, if stated.
    pub base: Option<&'a Bound<'py, PyAny>>,
    /// The device the tensor must be on, if stated.
    pub device: Option<&'a str>,
}

/// Checks `r.obj` against `layout`'s view: returns `()` or raises the first disagreement.
pub fn check(layout: &KvCacheLayout, r: &Request<'_, '_>) -> PyResult<()> {
    let c = convert::convention(r.convention)?;
    let t = convert::target(r.field)?;
    let layer = arrays::layer(layout, r.layer)?;
    let v = layout.view(c, t, layer).map_err(raise)?;
    if let Some(want) = r.device {
        arrays::valid_device(want)?;
    }
    let d = arrays::describe(r.obj)?;
    let mismatch = |s: String| raise(LayoutError::TensorMismatch(format!("{c} {t}: {s}")));
    if let Some(want) = r.device {
        if !arrays::same_device(&d.device, want) {
            return Err(mismatch(format!(
                "the tensor is on {}, expected {want}",
                d.device
            )));
        }
    }
    let Ok(dtype) = d.dtype.parse::<DType>() else {
        return Err(mismatch(format!(
            "dtype {}, the layout stores {}",
            d.dtype, v.dtype
        )));
    };
    let strides = element_strides(&v, &d, c, t)?;
    let claim = TensorClaim {
        convention: c,
        target: t,
        layer,
        shape: &d.shape,
        strides: &strides,
        dtype,
        storage_offset: None,
    };
    layout.check_tensor(&claim).map_err(raise)?;
    if let Some(b) = r.base {
        let off = storage_offset(layout, &v, &d, &arrays::base(b)?, c, t)?;
        let claim = TensorClaim {
            storage_offset: Some(kvlayout::StorageOffset::Elements(off)),
            ..claim
        };
        layout.check_tensor(&claim).map_err(raise)?;
    }
    Ok(())
}

/// The strides as `check_tensor` takes them: a negative stride on an axis of extent > 1 is a
/// mismatch (the layout's views only step forward); on an axis of extent 1 it carries nothing.
fn element_strides(
    v: &TensorView,
    d: &Described,
    c: Convention,
    t: ViewTarget,
) -> PyResult<Vec<u64>> {
    let mut out = Vec::with_capacity(d.strides.len());
    for (i, (&s, &n)) in d.strides.iter().zip(&d.shape).enumerate() {
        match u64::try_from(s) {
            Ok(s) => out.push(s),
            Err(_) if n <= 1 => out.push(0),
            Err(_) => {
                let axis = v.axes.get(i).copied().unwrap_or("past the view's dims");
                return Err(raise(LayoutError::TensorMismatch(format!(
                    "{c} {t}: axis {i} ({axis}): stride {s}, the layout's strides are positive \
                     (strides {:?})",
                    v.strides
                ))));
            }
        }
    }
    Ok(out)
}

/// The tensor's storage offset in its elements from `base`. An allocation must hold the
/// layout's buffer (its registered span ends within it), be on the tensor's device and
/// contain the tensor's bytes.
fn storage_offset(
    layout: &KvCacheLayout,
    v: &TensorView,
    d: &Described,
    base: &Base,
    c: Convention,
    t: ViewTarget,
) -> PyResult<u64> {
    let mismatch = |s: String| raise(LayoutError::TensorMismatch(format!("{c} {t}: {s}")));
    let start = match base {
        Base::Address(a) => *a,
        Base::Allocation(alloc) => {
            let buffer = v.buffer as usize;
            let needed = layout.extents()[buffer].end;
            if alloc.nbytes < needed {
                return Err(raise(OpError::BufferTooShort {
                    buffer,
                    len: alloc.nbytes,
                    needed,
                }));
            }
            if !arrays::same_device(&d.device, &alloc.device) {
                return Err(mismatch(format!(
                    "the tensor is on {}, its allocation on {}",
                    d.device, alloc.device
                )));
            }
            let (lo, hi) = (
                alloc.address,
                u128::from(alloc.address) + u128::from(alloc.nbytes),
            );
            let end = u128::from(d.address) + u128::from(d.nbytes);
            if d.address < lo || end > hi {
                return Err(mismatch(format!(
                    "the tensor's bytes {:#x}..{end:#x} are not inside its allocation {lo:#x}..{hi:#x}",
                    d.address
                )));
            }
            lo
        }
    };
    let Some(bytes) = d.address.checked_sub(start) else {
        return Err(mismatch(format!(
            "element 0 at {:#x} lies {} B before the base {start:#x}",
            d.address,
            start - d.address
        )));
    };
    if bytes % d.itemsize != 0 {
        return Err(mismatch(format!(
            "element 0 lies {bytes} B past the base, not a whole number of {}-byte elements",
            d.itemsize
        )));
    }
    Ok(bytes / d.itemsize)
}
