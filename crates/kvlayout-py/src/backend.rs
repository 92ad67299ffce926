//! `kvlayout.open(name)` and `kvlayout.Backend`: the backends of `kvlayout-backends` on
//! arrays the caller owns.
//!
//! A host executor (`cpu...`, `reference`) runs on the caller's arrays in place: no copy.
//! A backend with memory of its own (`cuda-emu`, `hip-emu`, `cuda:N`, `hip:N`) gets the
//! caller's host arrays copied into its memory and the results copied back. Every op
//! validates its arguments (the contract's checks) before it writes anything, and the GIL is
//! released while it runs.

use std::sync::Mutex;
use std::time::Instant;

use kvlayout::ops::{
    decode_widths, AnyBackend, Backend as _, BlockMove, DecodeArgs, DecodeParams, HostTensor,
    OpError, WriteArgs,
};
use kvlayout_backends::{Executor, HostExecutor, Options};
use kvlayout_cpu::{CacheMut, CacheRef, HostExec};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::raise;
use crate::memory::{typed, typed_mut, Call, HostArray};

mod args;
mod device;

pub(crate) use args::{activations, cache_arg, decode_slices, index_arg, DecodeObjects};
use args::{block_ids, block_pairs};
use device::{download, host_tensor, lock, raise_fail, upload, Fail};

/// The module's backend class and functions.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyBackend>()?;
    m.add_function(wrap_pyfunction!(open, m)?)?;
    m.add_function(wrap_pyfunction!(backend_names, m)?)?;
    Ok(())
}

/// Opens the backend ``name``: ``cpu`` (the kernel build it picks for this CPU),
/// ``cpu:<build>`` (``avx512-bf16``, ``avx512``, ``avx2``, ``scalar``), ``reference`` (the
/// scalar f64 reference), ``cuda-emu`` / ``hip-emu`` (the GPU kernels under the host
/// emulator), ``cuda[:n]``, ``hip[:n]``. ``threads`` sizes the CPU backend's pool (one per
/// core when ``None``). Raises ``UnknownBackendError`` or ``BackendUnavailableError`` (with
/// the reason: no device, a build this CPU lacks).
#[pyfunction]
#[pyo3(signature = (name, threads=None))]
fn open(name: &str, threads: Option<usize>) -> PyResult<PyBackend> {
    let exec = kvlayout_backends::open_executor(name, &Options { threads }).map_err(raise)?;
    Ok(match exec {
        Executor::Host { name, exec } => PyBackend {
            name,
            exec: Exec::Host(exec),
        },
        Executor::Device(be) => PyBackend {
            name: be.name().to_string(),
            exec: Exec::Device(Mutex::new(be)),
        },
    })
}

/// Every backend name of this build, in report order (some may not open here).
#[pyfunction]
fn backend_names() -> Vec<String> {
    kvlayout_backends::names()
}

enum Exec {
    Host(HostExecutor),
    Device(Mutex<AnyBackend>),
}

/// A backend: ``write_kv``, ``paged_decode`` and the block movers on caches and tensors the
/// caller owns. A cache is any object with ``layout`` (a ``Layout``) and ``buffers`` (one
/// contiguous host array per layout buffer, e.g. ``kvlayout.Cache.zeros(layout)``);
/// activations are contiguous f32, f16 or bf16 arrays; index arguments are integer arrays or
/// lists.
#[pyclass(name = "Backend", module = "kvlayout", frozen)]
pub struct PyBackend {
    name: String,
    exec: Exec,
}

/// The scalars of a decode call.
#[derive(Clone, Copy)]
struct DecodeCall {
    layer: i128,
    num_q_heads: Option<u64>,
    scale: Option<f32>,
    sliding_window: Option<u64>,
    soft_cap: Option<f32>,
}

#[pymethods]
impl PyBackend {
    /// The name it was opened by (``cuda`` reports as ``cuda:0``).
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// ``"host"`` when it runs on the caller's arrays in place, ``"device"`` when it copies
    /// them into memory of its own and back.
    #[getter]
    fn memory(&self) -> &'static str {
        match self.exec {
            Exec::Host(_) => "host",
            Exec::Device(_) => "device",
        }
    }

    /// What runs the ops: ``{"build": ..., "why": ..., "threads": ...}``.
    #[getter]
    fn kernels<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let k = match &self.exec {
            Exec::Host(e) => e.kernels(),
            Exec::Device(be) => lock(be).kernels(),
        };
        let d = PyDict::new(py);
        d.set_item("build", k.build)?;
        d.set_item("why", k.why)?;
        d.set_item("threads", k.threads)?;
        Ok(d)
    }

    fn __repr__(&self) -> String {
        format!("kvlayout.open({:?})", self.name)
    }

    /// Writes new tokens' K and V of one layer at their slots: ``key`` is
    /// ``[tokens, num_kv_heads, head_size]`` (for MLA the latent ``[tokens, 1, width]`` and
    /// ``value`` is ``None``), ``value`` ``[tokens, num_kv_heads, head_size_v]``,
    /// ``slot_mapping`` one slot per token (``block * block_size + offset``; negative =
    /// padding, skipped).
    #[pyo3(signature = (cache, key, value, slot_mapping, layer=0))]
    fn write_kv(
        &self,
        py: Python<'_>,
        cache: &Bound<'_, PyAny>,
        key: &Bound<'_, PyAny>,
        value: Option<&Bound<'_, PyAny>>,
        slot_mapping: &Bound<'_, PyAny>,
        layer: i128,
    ) -> PyResult<()> {
        let c = cache_arg(cache, "cache")?;
        let layer = crate::arrays::layer(&c.layout.get().inner, layer)?;
        let mut reads = vec![
            HostArray::read(key, "key")?,
            index_arg(py, slot_mapping, "i64", "slot_mapping")?,
        ];
        if let Some(v) = value {
            reads.push(HostArray::read(v, "value")?);
        }
        let mut call = Call::new(reads, c.buffers)?;
        let (reads, writes) = call.slices();
        let key = activations(reads[0].0, reads[0].1)?;
        let slot_mapping = typed::<i64>(reads[1].0, reads[1].1)?;
        let value = reads.get(2).map(|(a, b)| activations(a, b)).transpose()?;
        let mut bufs: Vec<&mut [u8]> = writes.into_iter().map(|(_, b)| b).collect();
        let layout = &c.layout.get().inner;
        match &self.exec {
            Exec::Host(exec) => py
                .detach(|| {
                    let mut cache = CacheMut::new(layout, bufs)?;
                    let w = WriteArgs {
                        layer,
                        key,
                        value,
                        slot_mapping,
                    };
                    exec.write_kv(&mut cache, &w)
                })
                .map_err(raise),
            Exec::Device(be) => py
                .detach(|| {
                    let be = lock(be);
                    let ro: Vec<&[u8]> = bufs.iter().map(|b| &b[..]).collect();
                    let mut dc = upload(&be, layout, &ro)?;
                    let kt = be.upload_tensor(&host_tensor(&key)).map_err(Fail::Memory)?;
                    let vt = value
                        .map(|v| be.upload_tensor(&host_tensor(&v)))
                        .transpose()
                        .map_err(Fail::Memory)?;
                    let w = WriteArgs {
                        layer,
                        key: &kt,
                        value: vt.as_ref(),
                        slot_mapping,
                    };
                    let done = be.write_kv(&mut dc, &w)?;
                    be.wait(done).map_err(Fail::Memory)?;
                    download(&be, &dc, &mut bufs)
                })
                .map_err(raise_fail),
        }
    }

    /// One decode step of one layer, one query token per sequence: ``query`` is
    /// ``[seqs, num_q_heads, head_size]``, ``block_table`` ``[seqs, blocks_per_seq]`` block
    /// ids, ``seq_lens`` the tokens of each sequence. Returns (or fills ``out``) the f32
    /// attention output ``[seqs, num_q_heads, head_size_v]``. ``num_q_heads`` defaults to the
    /// query's second extent, ``scale`` to ``1 / sqrt(head_size)``.
    #[pyo3(signature = (cache, query, block_table, seq_lens, layer=0, num_q_heads=None,
                        scale=None, sliding_window=None, soft_cap=None, out=None))]
    // Python's keyword arguments: one Rust parameter each.
    #[allow(clippy::too_many_arguments)]
    fn paged_decode<'py>(
        &self,
        py: Python<'py>,
        cache: &Bound<'py, PyAny>,
        query: &Bound<'py, PyAny>,
        block_table: &Bound<'py, PyAny>,
        seq_lens: &Bound<'py, PyAny>,
        layer: i128,
        num_q_heads: Option<u64>,
        scale: Option<f32>,
        sliding_window: Option<u64>,
        soft_cap: Option<f32>,
        out: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let args = DecodeCall {
            layer,
            num_q_heads,
            scale,
            sliding_window,
            soft_cap,
        };
        let objects = DecodeObjects {
            cache,
            query,
            block_table,
            seq_lens,
        };
        let (out, _) = self.decode(py, &objects, &args, out, 1)?;
        Ok(out)
    }

    /// Benchmark support: runs the same decode ``runs`` times on the same arguments, timing
    /// each run inside Rust (the op alone, no Python in between); returns the seconds of
    /// each.
    #[pyo3(name = "_time_decode", signature = (cache, query, block_table, seq_lens, layer=0, runs=10, out=None))]
    // Python's keyword arguments: one Rust parameter each.
    #[allow(clippy::too_many_arguments)]
    fn time_decode<'py>(
        &self,
        py: Python<'py>,
        cache: &Bound<'py, PyAny>,
        query: &Bound<'py, PyAny>,
        block_table: &Bound<'py, PyAny>,
        seq_lens: &Bound<'py, PyAny>,
        layer: i128,
        runs: usize,
        out: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Vec<f64>> {
        let args = DecodeCall {
            layer,
            num_q_heads: None,
            scale: None,
            sliding_window: None,
            soft_cap: None,
        };
        let objects = DecodeObjects {
            cache,
            query,
            block_table,
            seq_lens,
        };
        let (_, times) = self.decode(py, &objects, &args, out, runs)?;
        Ok(times)
    }

    /// Copies blocks within one cache, every layer: ``pairs`` of ``(src, dst)`` block ids.
    fn copy_blocks(
        &self,
        py: Python<'_>,
        cache: &Bound<'_, PyAny>,
        pairs: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let pairs = block_pairs(pairs)?;
        self.run_move(py, None, cache, &BlockMove::Copy(&pairs))
    }

    /// Copies blocks between two caches of the same content (their layouts may differ):
    /// block ``src`` of ``src_cache`` to block ``dst`` of ``dst_cache`` for each pair.
    fn swap_blocks(
        &self,
        py: Python<'_>,
        src_cache: &Bound<'_, PyAny>,
        dst_cache: &Bound<'_, PyAny>,
        pairs: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let pairs = block_pairs(pairs)?;
        self.run_move(py, Some(src_cache), dst_cache, &BlockMove::Swap(&pairs))
    }

    /// Copies cache block ``blocks[i]``, heads ``heads = (start, stop)``, to staging block
    /// ``i``.
    fn gather_blocks(
        &self,
        py: Python<'_>,
        cache: &Bound<'_, PyAny>,
        blocks: &Bound<'_, PyAny>,
        heads: (u64, u64),
        staging: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let blocks = block_ids(blocks)?;
        let op = BlockMove::Gather {
            blocks: &blocks,
            heads: heads.0..heads.1,
        };
        self.run_move(py, Some(cache), staging, &op)
    }

    /// The inverse of ``gather_blocks``: staging block ``i`` to cache block ``blocks[i]``,
    /// heads ``heads``.
    fn scatter_blocks(
        &self,
        py: Python<'_>,
        staging: &Bound<'_, PyAny>,
        blocks: &Bound<'_, PyAny>,
        heads: (u64, u64),
        cache: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let blocks = block_ids(blocks)?;
        let op = BlockMove::Scatter {
            blocks: &blocks,
            heads: heads.0..heads.1,
        };
        self.run_move(py, Some(staging), cache, &op)
    }

    /// Converts a whole cache to another layout of the same content and block count.
    fn convert(
        &self,
        py: Python<'_>,
        src_cache: &Bound<'_, PyAny>,
        dst_cache: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        self.run_move(py, Some(src_cache), dst_cache, &BlockMove::Convert)
    }
}

impl PyBackend {
    /// `paged_decode`, run `runs` times; the output and each run's seconds.
    fn decode<'py>(
        &self,
        py: Python<'py>,
        objects: &DecodeObjects<'_, 'py>,
        call: &DecodeCall,
        out: Option<Bound<'py, PyAny>>,
        runs: usize,
    ) -> PyResult<(Bound<'py, PyAny>, Vec<f64>)> {
        let DecodeCall {
            layer,
            num_q_heads,
            scale,
            sliding_window,
            soft_cap,
        } = *call;
        let inputs = objects.read(py)?;
        let layout_obj = inputs.cache.layout.clone();
        let layout = &layout_obj.get().inner;
        let layer = crate::arrays::layer(layout, layer)?;
        let num_q_heads = match (num_q_heads, inputs.query.shape.as_slice()) {
            (Some(n), _) => n,
            (None, [_, heads, _]) => *heads,
            (None, other) => {
                return Err(raise(OpError::Shape {
                    what: "query".into(),
                    expected: "3 dims [seqs, num_q_heads, head_size], or num_q_heads given".into(),
                    got: format!("shape {other:?}"),
                }))
            }
        };
        let (qk_width, v_width) = decode_widths(layout).map_err(raise)?;
        inputs.check_query(num_q_heads, qk_width)?;
        let (seqs, blocks_per_seq) = (inputs.seqs, inputs.blocks_per_seq);
        let out = match out {
            Some(o) => o,
            None => {
                crate::python::numpy_zeros(py)?.call1(((seqs, num_q_heads, v_width), "float32"))?
            }
        };
        let o = HostArray::read(&out, "out")?;
        if o.dtype != "f32" {
            return Err(raise(OpError::Shape {
                what: "out dtype".into(),
                expected: "f32".into(),
                got: o.dtype.clone(),
            }));
        }
        let mut call = inputs.into_call(vec![o])?;
        let (reads, mut writes) = call.slices();
        let (query, block_table, seq_lens, bufs) = decode_slices(&reads)?;
        let (o, ob) = writes.remove(0);
        let out_f32 = typed_mut::<f32>(o, ob)?;
        let params = DecodeParams {
            num_q_heads,
            scale: scale.unwrap_or(1.0 / (qk_width as f32).sqrt()),
            sliding_window,
            soft_cap,
        };
        let mut times = Vec::with_capacity(runs);
        match &self.exec {
            Exec::Host(exec) => py
                .detach(|| {
                    let cache = CacheRef::new(layout, bufs)?;
                    let d = DecodeArgs {
                        layer,
                        query,
                        block_table,
                        blocks_per_seq,
                        seq_lens,
                        params,
                    };
                    for _ in 0..runs {
                        let start = Instant::now();
                        exec.paged_decode(&cache, &d, out_f32)?;
                        times.push(start.elapsed().as_secs_f64());
                    }
                    Ok::<(), OpError>(())
                })
                .map_err(raise)?,
            Exec::Device(be) => py
                .detach(|| {
                    let be = lock(be);
                    let start = Instant::now();
                    let dc = upload(&be, layout, &bufs)?;
                    let qt = be
                        .upload_tensor(&host_tensor(&query))
                        .map_err(Fail::Memory)?;
                    let mut ot = be
                        .alloc_tensor(kvlayout::DType::F32, out_f32.len())
                        .map_err(Fail::Memory)?;
                    let d = DecodeArgs {
                        layer,
                        query: &qt,
                        block_table,
                        blocks_per_seq,
                        seq_lens,
                        params,
                    };
                    let done = be.paged_decode(&dc, &d, &mut ot)?;
                    be.wait(done).map_err(Fail::Memory)?;
                    match be.download_tensor(&ot).map_err(Fail::Memory)? {
                        HostTensor::F32(x) if x.len() == out_f32.len() => {
                            out_f32.copy_from_slice(&x);
                            times.push(start.elapsed().as_secs_f64());
                            Ok(())
                        }
                        other => Err(Fail::Memory(format!(
                            "the backend returned {} {} elements for {} f32",
                            other.len(),
                            other.dtype(),
                            out_f32.len()
                        ))),
                    }
                })
                .map_err(raise_fail)?,
        }
        Ok((out, times))
    }

    /// Runs block move `op` from `src` (`None`: within `dst`) to `dst`.
    fn run_move(
        &self,
        py: Python<'_>,
        src: Option<&Bound<'_, PyAny>>,
        dst: &Bound<'_, PyAny>,
        op: &BlockMove<'_>,
    ) -> PyResult<()> {
        let s = src.map(|s| cache_arg(s, "source cache")).transpose()?;
        let d = cache_arg(dst, "destination cache")?;
        let slayout = s.as_ref().map(|s| &s.layout.get().inner);
        let dlayout = &d.layout.get().inner;
        let reads = s.as_ref().map(|s| s.buffers.clone()).unwrap_or_default();
        let mut call = Call::new(reads, d.buffers.clone())?;
        let (reads, writes) = call.slices();
        let sbufs: Option<Vec<&[u8]>> = src.map(|_| reads.into_iter().map(|(_, b)| b).collect());
        let mut dbufs: Vec<&mut [u8]> = writes.into_iter().map(|(_, b)| b).collect();
        match &self.exec {
            Exec::Host(exec) => py
                .detach(|| {
                    let src = match (slayout, sbufs) {
                        (Some(l), Some(b)) => Some(CacheRef::new(l, b)?),
                        _ => None,
                    };
                    let mut dst = CacheMut::new(dlayout, dbufs)?;
                    exec.move_blocks(src.as_ref(), &mut dst, op)
                })
                .map_err(raise),
            Exec::Device(be) => py
                .detach(|| {
                    let be = lock(be);
                    let src = match (slayout, &sbufs) {
                        (Some(l), Some(b)) => Some(upload(&be, l, b)?),
                        _ => None,
                    };
                    let ro: Vec<&[u8]> = dbufs.iter().map(|b| &b[..]).collect();
                    let mut dst = upload(&be, dlayout, &ro)?;
                    let done = be.move_blocks(src.as_ref(), &mut dst, op)?;
                    be.wait(done).map_err(Fail::Memory)?;
                    download(&be, &dst, &mut dbufs)
                })
                .map_err(raise_fail),
        }
    }
}
