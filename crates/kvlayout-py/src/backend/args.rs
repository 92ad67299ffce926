//! The arguments of the ops from Python: a cache (a layout and its buffers), activations,
//! index arrays, block ids and pairs, each checked before an op sees it.

use half::{bf16, f16};
use kvlayout::ops::OpError;
use kvlayout_cpu::Activations;
use pyo3::prelude::*;

use crate::errors::{raise, ArrayError};
use crate::layout::Layout;
use crate::memory::{typed, Call, HostArray};

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

/// The Python objects of a decode.
pub(crate) struct DecodeObjects<'a, 'py> {
    pub(crate) cache: &'a Bound<'py, PyAny>,
    pub(crate) query: &'a Bound<'py, PyAny>,
    pub(crate) block_table: &'a Bound<'py, PyAny>,
    pub(crate) seq_lens: &'a Bound<'py, PyAny>,
}

/// A decode's arrays, read: the cache, the query, the block table (`blocks_per_seq` its
/// second extent) and the sequence lengths (`seqs` of them).
pub(crate) struct DecodeInputs<'py> {
    pub(crate) cache: CacheArg<'py>,
    pub(crate) query: HostArray<'py>,
    pub(crate) table: HostArray<'py>,
    pub(crate) lens: HostArray<'py>,
    pub(crate) blocks_per_seq: usize,
    pub(crate) seqs: u64,
}

/// A decode's arrays as the op takes them: the query, the block table, the sequence lengths
/// and the cache's buffers.
pub(crate) type DecodeSlices<'c> = (Activations<'c>, &'c [i32], &'c [u32], Vec<&'c [u8]>);

impl<'py> DecodeObjects<'_, 'py> {
    /// Reads the arrays; a block table of other than two dims is refused.
    pub(crate) fn read(&self, py: Python<'py>) -> PyResult<DecodeInputs<'py>> {
        let cache = cache_arg(self.cache, "cache")?;
        let query = HostArray::read(self.query, "query")?;
        let table = index_arg(py, self.block_table, "i32", "block_table")?;
        let lens = index_arg(py, self.seq_lens, "u32", "seq_lens")?;
        let blocks_per_seq = match table.shape.as_slice() {
            [_, n] => *n as usize,
            other => {
                return Err(raise(OpError::Shape {
                    what: "block_table".into(),
                    expected: "2 dims [seqs, blocks_per_seq]".into(),
                    got: format!("shape {other:?}"),
                }))
            }
        };
        let seqs = lens.shape.iter().product();
        Ok(DecodeInputs {
            cache,
            query,
            table,
            lens,
            blocks_per_seq,
            seqs,
        })
    }
}

impl<'py> DecodeInputs<'py> {
    /// Refuses a query that is not `seqs x num_q_heads x qk_width` elements, before an
    /// output is sized from those numbers.
    pub(crate) fn check_query(&self, num_q_heads: u64, qk_width: u64) -> PyResult<()> {
        let seqs = self.seqs;
        let q_len = self
            .query
            .shape
            .iter()
            .try_fold(1u64, |n, &e| n.checked_mul(e));
        let want = seqs
            .checked_mul(num_q_heads)
            .and_then(|n| n.checked_mul(qk_width));
        if want.is_none() || q_len != want {
            return Err(raise(OpError::Shape {
                what: "query".into(),
                expected: format!(
                    "{seqs} x {num_q_heads} x {qk_width} elements [seqs, num_q_heads, head size]"
                ),
                got: format!("shape {:?}", self.query.shape),
            }));
        }
        Ok(())
    }

    /// The arrays the call reads (the query, the table, the lengths, the cache's buffers,
    /// in that order), with the arrays it writes, as one checked [`Call`].
    pub(crate) fn into_call(self, writes: Vec<HostArray<'py>>) -> PyResult<Call<'py>> {
        let mut reads = vec![self.query, self.table, self.lens];
        reads.extend(self.cache.buffers);
        Call::new(reads, writes)
    }
}

/// The slices of a call made by [`DecodeInputs::into_call`], typed.
pub(crate) fn decode_slices<'c>(
    reads: &[(&HostArray<'_>, &'c [u8])],
) -> PyResult<DecodeSlices<'c>> {
    let query = activations(reads[0].0, reads[0].1)?;
    let block_table = typed::<i32>(reads[1].0, reads[1].1)?;
    let seq_lens = typed::<u32>(reads[2].0, reads[2].1)?;
    let bufs = reads[3..].iter().map(|(_, b)| *b).collect();
    Ok((query, block_table, seq_lens, bufs))
}
