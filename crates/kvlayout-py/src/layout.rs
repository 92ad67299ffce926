//! `kvlayout.Layout`: a validated layout from a preset, a spec string or its JSON form, with
//! its offsets, views, byte regions and transformations; and `kvlayout.View`, one strided
//! view of a field.

use std::ops::Range;

use kvlayout::{ByteRange, Coord, KvCacheLayout, TensorView, PRESETS};
use pyo3::prelude::*;

use crate::convert::Index;
use crate::errors::raise;
use crate::{arrays, as_view, check, convert};

/// The module's layout classes and functions.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Layout>()?;
    m.add_class::<View>()?;
    m.add_function(wrap_pyfunction!(presets, m)?)?;
    m.add_function(wrap_pyfunction!(conventions, m)?)?;
    Ok(())
}

/// A validated KV-cache layout: where every element of a paged KV cache lives.
///
/// Made from a preset name (``Layout("llama-3-8b")``), a spec string
/// (``Layout("kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=NHD")``), a preset with overrides
/// (``Layout("llama-3-8b B=4096 dtype=fp8_e4m3")``), or the JSON form
/// (``Layout.from_json(text)``). Immutable; ``str(layout)`` is its canonical spec string.
#[pyclass(name = "Layout", module = "kvlayout", frozen, eq)]
#[derive(Clone, PartialEq)]
pub struct Layout {
    /// The descriptor.
    pub inner: KvCacheLayout,
}

impl Layout {
    fn wrap(r: kvlayout::Result<KvCacheLayout>) -> PyResult<Layout> {
        r.map(|inner| Layout { inner }).map_err(raise)
    }
}

fn range_of(r: Option<(Index, Index)>, whole: u64) -> Range<u64> {
    match r {
        Some((start, stop)) => start.0..stop.0,
        None => 0..whole,
    }
}

fn regions(r: Vec<ByteRange>) -> Vec<(u32, u64, u64)> {
    r.into_iter().map(|b| (b.buffer, b.offset, b.len)).collect()
}

#[pymethods]
impl Layout {
    /// Parses a preset name, a compact spec string, or a preset followed by overrides.
    #[new]
    fn new(spec: &str) -> PyResult<Self> {
        Layout::wrap(spec.parse())
    }

    /// The layout of a preset by model name (``kvlayout.presets()`` lists them).
    #[staticmethod]
    fn preset(name: &str) -> PyResult<Self> {
        Layout::wrap(kvlayout::preset(name))
    }

    /// Parses and validates the versioned JSON form.
    #[staticmethod]
    fn from_json(text: &str) -> PyResult<Self> {
        Layout::wrap(KvCacheLayout::from_json(text))
    }

    /// The versioned JSON form (``Layout.from_json`` reads it back to an equal layout).
    fn to_json(&self) -> String {
        self.inner.to_json()
    }

    /// The canonical compact spec string.
    #[getter]
    fn spec(&self) -> String {
        self.inner.to_string()
    }

    fn __str__(&self) -> String {
        self.inner.to_string()
    }

    fn __repr__(&self) -> String {
        format!("kvlayout.Layout({:?})", self.inner.to_string())
    }

    /// Layer slots.
    #[getter]
    fn num_layers(&self) -> u64 {
        self.inner.geometry().num_layers
    }

    /// Blocks (pages).
    #[getter]
    fn num_blocks(&self) -> u64 {
        self.inner.geometry().num_blocks
    }

    /// Tokens per block.
    #[getter]
    fn block_size(&self) -> u64 {
        self.inner.geometry().block_size
    }

    /// KV head slots.
    #[getter]
    fn num_kv_heads(&self) -> u64 {
        self.inner.geometry().num_kv_heads
    }

    /// Token (or state) slots per block.
    #[getter]
    fn num_slots(&self) -> u64 {
        self.inner.num_slots()
    }

    /// Element type of the main fields (``"f16"``, ``"bf16"``, ``"fp8_e4m3"``, ...).
    #[getter]
    fn dtype(&self) -> String {
        self.inner.dtype().to_string()
    }

    /// Content kind as the spec string names it (``kv``, ``kv_scaled``, ``mla``, ...).
    #[getter]
    fn content(&self) -> &'static str {
        self.inner.content().spec_name()
    }

    /// ``(key width, value width)`` of a K/V content, else ``None``.
    #[getter]
    fn kv_widths(&self) -> Option<(u64, u64)> {
        self.inner.content().kv_widths()
    }

    /// Fields a view or an offset can name (``["k", "v"]``, ``["latent"]``, ...).
    #[getter]
    fn fields(&self) -> Vec<String> {
        let fields = self.inner.readable_fields().into_iter();
        fields.map(|f| f.to_string()).collect()
    }

    /// Allocations (buffers) the layout spans.
    #[getter]
    fn num_buffers(&self) -> usize {
        self.inner.num_buffers()
    }

    /// Bytes each buffer must hold: the end of its registered span.
    #[getter]
    fn buffer_bytes(&self) -> Vec<u64> {
        self.inner.extents().iter().map(|x| x.end).collect()
    }

    /// A human account of the layout: geometry, pages, fields, every convention's view (or
    /// why there is none), the registered span, a picture of one page.
    fn explain(&self) -> String {
        self.inner.explain().to_text()
    }

    /// The same account as a dict (the CLI's ``explain --json``).
    fn explanation<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        convert::to_py(py, &self.inner.explain())
    }

    /// Where element ``dim`` of ``field`` at ``(layer, block, head, slot)`` lives:
    /// ``(buffer, byte offset)``. Every index is checked against its axis.
    #[pyo3(signature = (field, layer=0, block=0, head=0, slot=0, dim=0))]
    fn offset(
        &self,
        field: &str,
        layer: i128,
        block: i128,
        head: i128,
        slot: i128,
        dim: i128,
    ) -> PyResult<(u32, u64)> {
        let l = &self.inner;
        let field = convert::field(field)?;
        let g = l.geometry();
        // A negative index is refused here (the descriptor's coordinates are unsigned);
        // every other one by `offset`, against its axis.
        let width = || Ok(l.field_map(field).map_err(raise)?.width);
        let c = Coord {
            layer: arrays::index_or("layer", layer, || Ok(g.num_layers))?,
            block: arrays::index_or("block", block, || Ok(g.num_blocks))?,
            head: arrays::index_or("head", head, || Ok(g.num_kv_heads))?,
            slot: arrays::index_or("slot", slot, || Ok(l.num_slots()))?,
            field,
            dim: arrays::index_or("dim", dim, width)?,
        };
        let at = self.inner.offset(&c).map_err(raise)?;
        Ok((at.buffer, at.offset))
    }

    /// The strided view of ``field`` (or ``"kv"``: K and V stacked) of one layer in a
    /// consumer's convention (``standard``, ``vllm-paged-v1``, ``flash-attn``,
    /// ``flashinfer``, ``flashinfer-hnd``); refused with the reason where none exists without
    /// a copy.
    #[pyo3(signature = (convention, field, layer=0))]
    fn view(&self, convention: &str, field: &str, layer: i128) -> PyResult<View> {
        let (c, t) = (convert::convention(convention)?, convert::target(field)?);
        let layer = arrays::layer(&self.inner, layer)?;
        let v = self.inner.view(c, t, layer).map_err(raise)?;
        Ok(View { inner: v })
    }

    /// The byte ranges of one block over layers ``(start, stop)`` and heads ``(start, stop)``
    /// (all when ``None``), merged where contiguous: ``[(buffer, offset, length)]``.
    #[pyo3(signature = (block, layers=None, heads=None))]
    fn block_regions(
        &self,
        py: Python<'_>,
        block: Index,
        layers: Option<(Index, Index)>,
        heads: Option<(Index, Index)>,
    ) -> PyResult<Vec<(u32, u64, u64)>> {
        let g = self.inner.geometry();
        let layers = range_of(layers, g.num_layers);
        let heads = range_of(heads, g.num_kv_heads);
        let r = py.detach(|| self.inner.block_regions(block.0, layers, heads));
        r.map(regions).map_err(raise)
    }

    /// The byte ranges of layers ``(start, stop)`` (all when ``None``), every block and
    /// head, merged where contiguous: ``[(buffer, offset, length)]``. Up to
    /// ``kvlayout::MAX_REGIONS`` ranges are enumerated, without the GIL.
    #[pyo3(signature = (layers=None))]
    fn layer_regions(
        &self,
        py: Python<'_>,
        layers: Option<(Index, Index)>,
    ) -> PyResult<Vec<(u32, u64, u64)>> {
        let layers = range_of(layers, self.inner.geometry().num_layers);
        let r = py.detach(|| self.inner.layer_regions(layers));
        r.map(regions).map_err(raise)
    }

    /// What to register for transfers (NIXL): each buffer's whole owned extent, padding
    /// included: ``[(buffer, offset, length)]``.
    fn registered_spans(&self) -> Vec<(u32, u64, u64)> {
        regions(self.inner.registered_spans())
    }

    /// The heads ``tp_rank`` of ``tp_size`` holds, as ``(start, stop)``.
    fn tp_heads(&self, tp_size: Index, tp_rank: Index) -> PyResult<(u64, u64)> {
        let r = self.inner.tp_heads(tp_size.0, tp_rank.0).map_err(raise)?;
        Ok((r.start, r.end))
    }

    /// The view of this memory a TP rank sees: its heads only, same buffers and spans.
    fn tp_slice(&self, tp_size: Index, tp_rank: Index) -> PyResult<Layout> {
        Layout::wrap(self.inner.tp_slice(tp_size.0, tp_rank.0))
    }

    /// Layers ``start..stop`` of this memory, renumbered from 0.
    fn layer_range(&self, start: Index, stop: Index) -> PyResult<Layout> {
        Layout::wrap(self.inner.layer_range(start.0..stop.0))
    }

    /// Each block seen as ``ratio`` kernel blocks of ``block_size / ratio`` tokens.
    fn split_blocks(&self, ratio: Index) -> PyResult<Layout> {
        Layout::wrap(self.inner.split_blocks(ratio.0))
    }

    /// Tokens ``start..stop`` of every block, as blocks of ``stop - start`` tokens.
    fn slot_range(&self, start: Index, stop: Index) -> PyResult<Layout> {
        Layout::wrap(self.inner.slot_range(start.0..stop.0))
    }

    /// ``None`` when both layouts put every element at the same place; otherwise raises
    /// ``LayoutMismatchError`` naming the first difference.
    fn same_addressing(&self, other: &Layout) -> PyResult<()> {
        self.inner.same_addressing(&other.inner).map_err(raise)
    }

    /// Checks a framework's tensor against the view of ``field`` (or ``"kv"``) of ``layer``
    /// in ``convention``: ``None``, or ``TensorMismatchError`` naming the first disagreement
    /// (dtype, an axis's size or stride, the storage offset) with a hint at the likely
    /// mistake. Nothing is inferred from the tensor. Its memory is read from
    /// ``__cuda_array_interface__``, ``__array_interface__`` or ``__dlpack__``.
    ///
    /// ``base``: the address (int) of the buffer the tensor is in, or the allocation itself
    /// (then it must hold the layout's buffer, else ``BufferTooShortError``, and contain the
    /// tensor); the storage offset is checked only when it is given. ``device``: ``"cpu"``,
    /// ``"cuda"``, ``"cuda:N"``, ``"rocm"``, ``"rocm:N"``, checked when given.
    #[pyo3(signature = (obj, field, convention="standard", layer=0, base=None, device=None))]
    fn check(
        &self,
        obj: &Bound<'_, PyAny>,
        field: &str,
        convention: &str,
        layer: i128,
        base: Option<&Bound<'_, PyAny>>,
        device: Option<&str>,
    ) -> PyResult<()> {
        let request = check::Request {
            obj,
            field,
            convention,
            layer,
            base,
            device,
        };
        check::check(&self.inner, &request)
    }

    /// The zero-copy view of ``field`` (or ``"kv"``) of ``layer`` in ``convention`` over the
    /// allocation ``buf``: a numpy array (dtype from ``ml_dtypes`` for bf16 and fp8) sharing
    /// ``buf``'s memory, or a torch tensor where ``buf`` is one. ``buf`` is one contiguous
    /// allocation holding the layout's buffer (``BufferTooShortError`` otherwise), or a list
    /// of one per buffer where the layout has several. ``ViewRefusedError`` where no view
    /// exists without a copy.
    #[pyo3(signature = (buf, field, convention="standard", layer=0))]
    fn as_view<'py>(
        &self,
        buf: &Bound<'py, PyAny>,
        field: &str,
        convention: &str,
        layer: i128,
    ) -> PyResult<Bound<'py, PyAny>> {
        as_view::as_view(&self.inner, buf, field, convention, layer)
    }
}

/// A strided view of a field, relative to the start of its buffer: what
/// ``numpy.lib.stride_tricks.as_strided`` and ``torch.as_strided`` take.
#[pyclass(name = "View", module = "kvlayout", frozen, eq)]
#[derive(Clone, PartialEq)]
pub struct View {
    /// The view.
    pub inner: TensorView,
}

#[pymethods]
impl View {
    /// Offset of element 0, in elements.
    #[getter]
    fn offset(&self) -> u64 {
        self.inner.offset
    }

    /// Offset of element 0, in bytes.
    #[getter]
    fn offset_bytes(&self) -> u64 {
        self.inner.offset_bytes
    }

    /// Extents.
    #[getter]
    fn shape(&self) -> Vec<u64> {
        self.inner.shape.clone()
    }

    /// Strides in elements.
    #[getter]
    fn strides(&self) -> Vec<u64> {
        self.inner.strides.clone()
    }

    /// Strides in bytes.
    #[getter]
    fn strides_bytes(&self) -> Vec<u64> {
        self.inner.strides_bytes.clone()
    }

    /// Element type name.
    #[getter]
    fn dtype(&self) -> String {
        self.inner.dtype.to_string()
    }

    /// Bytes per element.
    #[getter]
    fn itemsize(&self) -> u64 {
        self.inner.dtype.size_bytes()
    }

    /// What each axis indexes: ``block``, ``head``, ``slot`` (the token position in the
    /// block), ``dim``, ``kv``, and vLLM's key ``dim / x`` and ``x``.
    #[getter]
    fn axes(&self) -> Vec<&'static str> {
        self.inner.axes.clone()
    }

    /// The buffer (allocation) the view is into.
    #[getter]
    fn buffer(&self) -> u32 {
        self.inner.buffer
    }

    /// Byte offset of a multi-index, each index checked against its extent.
    fn byte_offset(&self, index: Vec<Index>) -> PyResult<u64> {
        let index: Vec<u64> = index.into_iter().map(|i| i.0).collect();
        self.inner.byte_offset(&index).map_err(raise)
    }

    fn __repr__(&self) -> String {
        let v = &self.inner;
        format!(
            "kvlayout.View(buffer={}, offset={}, shape={:?}, strides={:?}, dtype={})",
            v.buffer, v.offset, v.shape, v.strides, v.dtype
        )
    }
}

/// The preset names (models), e.g. ``llama-3-8b``, ``deepseek-v3``.
#[pyfunction]
fn presets() -> Vec<&'static str> {
    PRESETS.iter().map(|(name, _, _)| *name).collect()
}

/// The view convention names ``Layout.view`` takes.
#[pyfunction]
fn conventions() -> Vec<&'static str> {
    kvlayout::CONVENTION_NAMES.to_vec()
}
