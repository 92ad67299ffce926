//! The arguments of the ops from Python: a cache (a layout and its buffers), activations,
//! index arrays, block ids and pairs, each checked before an op sees it.

use half::{bf16, f16};
use kvlayout::ops::OpError;
use kvlayout_cpu::Activations;
use pyo3::prelude::*;

use crate::errors::{raise, ArrayError};
use crate::layout::Layout;
use crate::memory::{typed, HostArray};

fn array_error(reason: String) -> PyErr {
    raise(ArrayError(reason))
}

/// A cache argument: its layout and buffers.
pub(crate) struct CacheArg<'py> {
    pub(crate) layout: Bound<'py, Layout>,
    pub(crate) buffers: Vec<HostArray<'py>>,
}

pub(crate) fn cache_arg<'py>(cache: &Bound<'py, PyAny>, what: &str) -> PyResult<CacheArg<'py>> {
    let not_a_cache = |part: &str| {
        array_error(format!(
            "{what}.{part} is missing or not what a cache holds (a cache is \
             kvlayout.Cache(layout, buffers): a kvlayout.Layout and a list of arrays)"
        ))
    };
    let layout = cache.getattr("layout").map_err(|_| not_a_cache("layout"))?;
    let layout = layout
        .cast_into::<Layout>()
        .map_err(|_| not_a_cache("layout"))?;
    let buffers_obj = cache
        .getattr("buffers")
        .map_err(|_| not_a_cache("buffers"))?;
    let mut buffers = Vec::new();
    let items = buffers_obj.try_iter().map_err(|_| not_a_cache("buffers"))?;
    for (i, b) in items.enumerate() {
        buffers.push(HostArray::read(&b?, &format!("{what} buffer {i}"))?);
    }
    Ok(CacheArg { layout, buffers })
}

/// An index argument as a contiguous array of `dtype` (`kvlayout._ops.index_array` converts
/// lists and other integer types, refusing values that do not fit).
pub(crate) fn index_arg<'py>(
    py: Python<'py>,
    obj: &Bound<'py, PyAny>,
    dtype: &str,
    what: &str,
) -> PyResult<HostArray<'py>> {
    let arr = crate::python::index_array(py)?.call1((obj, dtype, what))?;
    HostArray::read(&arr, what)
}

pub(crate) fn activations<'a>(a: &HostArray, b: &'a [u8]) -> PyResult<Activations<'a>> {
    Ok(match a.dtype.as_str() {
        "f32" => Activations::F32(typed(a, b)?),
        "f16" => Activations::F16(typed::<f16>(a, b)?),
        "bf16" => Activations::Bf16(typed::<bf16>(a, b)?),
        other => {
            return Err(raise(OpError::Shape {
                what: format!("{} dtype", a.what),
                expected: "f32, f16 or bf16".into(),
                got: other.into(),
            }))
        }
    })
}

/// Block ids or pairs of them from Python: non-negative integers.
pub(crate) fn block_pairs(obj: &Bound<'_, PyAny>) -> PyResult<Vec<(u64, u64)>> {
    let list = if obj.hasattr("tolist")? {
        obj.call_method0("tolist")?
    } else {
        obj.clone()
    };
    let pairs: Vec<Vec<i64>> = list.extract()?;
    pairs
        .into_iter()
        .enumerate()
        .map(|(index, pair)| {
            let [s, d] = pair[..] else {
                return Err(raise(OpError::Shape {
                    what: format!("pairs[{index}]"),
                    expected: "a (src, dst) pair of block ids".into(),
                    got: format!("{pair:?}"),
                }));
            };
            if s < 0 || d < 0 {
                Err(raise(OpError::BadPair {
                    index,
                    src: s.max(0) as u64,
                    dst: d.max(0) as u64,
                    reason: format!("block ids must be non-negative, got ({s}, {d})"),
                }))
            } else {
                Ok((s as u64, d as u64))
            }
        })
        .collect()
}

pub(crate) fn block_ids(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u64>> {
    let list = if obj.hasattr("tolist")? {
        obj.call_method0("tolist")?
    } else {
        obj.clone()
    };
    let ids: Vec<i64> = list.extract()?;
    ids.into_iter()
        .enumerate()
        .map(|(i, b)| {
            u64::try_from(b).map_err(|_| {
                raise(OpError::Shape {
                    what: format!("blocks[{i}]"),
                    expected: "a non-negative block id".into(),
                    got: b.to_string(),
                })
            })
        })
        .collect()
}
