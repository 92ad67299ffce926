//! The connector's handshake (`kvlayout.handshake`): `MemRegion`, `CacheGroup`,
//! `PeerMetadata` with its byte encoding, and `check_compatible`. Every answer comes from
//! `kvlayout_connector::handshake`; a refusal is raised as its `HandshakeError` class.

use std::borrow::Cow;

use kvlayout_connector::handshake::{
    self as hs, HandshakeError, Limits, HEADER_BYTES, MAGIC, VERSION,
};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::errors::raise;
use crate::layout::Layout;

/// The module's handshake classes, function and constants (`HANDSHAKE_*`).
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<MemRegion>()?;
    m.add_class::<CacheGroup>()?;
    m.add_class::<PeerMetadata>()?;
    m.add_function(wrap_pyfunction!(check_compatible, m)?)?;
    let py = m.py();
    m.add("HANDSHAKE_MAGIC", PyBytes::new(py, &MAGIC))?;
    m.add("HANDSHAKE_VERSION", VERSION)?;
    m.add("HANDSHAKE_HEADER_BYTES", HEADER_BYTES)?;
    let limits = Limits::default();
    let defaults = PyDict::new(py);
    defaults.set_item("max_body_bytes", limits.max_body_bytes)?;
    defaults.set_item("max_groups", limits.max_groups)?;
    defaults.set_item("max_tp", limits.max_tp)?;
    defaults.set_item("max_name_bytes", limits.max_name_bytes)?;
    m.add("HANDSHAKE_DEFAULT_LIMITS", defaults)?;
    Ok(())
}

/// The Python exception of a handshake error. A layout refused inside a handshake also
/// carries the layout's own exception as ``__cause__``.
fn raise_handshake(e: HandshakeError) -> PyErr {
    let cause = match &e {
        HandshakeError::Layout { source, .. } => Some(raise(source.clone())),
        _ => None,
    };
    let err = raise(e);
    if cause.is_some() {
        Python::attach(|py| err.set_cause(py, cause));
    }
    err
}

/// One registered allocation of a peer: ``len`` bytes from address ``base``.
#[pyclass(module = "kvlayout.handshake", frozen, eq, hash, from_py_object)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct MemRegion {
    inner: hs::MemRegion,
}

#[pymethods]
impl MemRegion {
    /// A region of ``len`` bytes from address ``base`` (both unsigned 64-bit).
    #[new]
    fn new(base: u64, len: u64) -> Self {
        MemRegion {
            inner: hs::MemRegion::host(base, len),
        }
    }

    /// Address of the buffer's byte 0.
    #[getter]
    fn base(&self) -> u64 {
        self.inner.base
    }

    /// Bytes registered from ``base``.
    #[getter(len)]
    fn length(&self) -> u64 {
        self.inner.len
    }

    fn __repr__(&self) -> String {
        format!(
            "MemRegion(base={:#x}, len={})",
            self.inner.base, self.inner.len
        )
    }
}

/// One cache group of an instance for one TP rank: a layout (this rank's heads only), the
/// model's KV heads, the TP size and rank, and one ``MemRegion`` per layout buffer (or none
/// where the memory is not described yet). Built as given; ``PeerMetadata.validate`` and
/// ``PeerMetadata.decode`` check it.
#[pyclass(module = "kvlayout.handshake", frozen, eq)]
#[derive(Clone, PartialEq)]
pub struct CacheGroup {
    inner: hs::CacheGroup,
}

#[pymethods]
impl CacheGroup {
    /// A group named ``name`` (matched between peers) holding ``layout``.
    #[new]
    #[pyo3(signature = (name, layout, total_kv_heads, tp_size, tp_rank, regions=Vec::new()))]
    fn new(
        name: String,
        layout: &Bound<'_, Layout>,
        total_kv_heads: u64,
        tp_size: u64,
        tp_rank: u64,
        regions: Vec<MemRegion>,
    ) -> Self {
        CacheGroup {
            inner: hs::CacheGroup {
                name,
                layout: layout.get().inner.clone(),
                total_kv_heads,
                tp_size,
                tp_rank,
                regions: regions.into_iter().map(|r| r.inner).collect(),
            },
        }
    }

    /// Name the two peers match groups by (e.g. ``attn``).
    #[getter]
    fn name(&self) -> &str {
        &self.inner.name
    }

    /// The layout of this rank's cache.
    #[getter]
    fn layout(&self) -> Layout {
        Layout {
            inner: self.inner.layout.clone(),
        }
    }

    /// The model's KV heads before TP slicing.
    #[getter]
    fn total_kv_heads(&self) -> u64 {
        self.inner.total_kv_heads
    }

    /// TP size of the peer.
    #[getter]
    fn tp_size(&self) -> u64 {
        self.inner.tp_size
    }

    /// TP rank this group describes.
    #[getter]
    fn tp_rank(&self) -> u64 {
        self.inner.tp_rank
    }

    /// One region per layout buffer (empty where not described).
    #[getter]
    fn regions(&self) -> Vec<MemRegion> {
        let regions = self.inner.regions.iter();
        regions.map(|&inner| MemRegion { inner }).collect()
    }

    /// The canonical text the compatibility hash covers: ``key=value`` lines after
    /// ``kvlayout-compat v1``.
    fn compat_text(&self) -> String {
        self.inner.compat_text()
    }

    /// SHA-256 of ``compat_text()``, 64 lowercase hex digits.
    fn compat_hash(&self) -> String {
        self.inner.compat_hash()
    }

    /// The model heads this rank holds as ``(start, stop)``; ``None`` where the TP placement
    /// names no heads.
    fn head_range(&self) -> Option<(u64, u64)> {
        self.inner.head_range().map(|r| (r.start, r.end))
    }

    /// The absolute address of bytes ``[offset, offset + len)`` of buffer ``buffer``; raises
    /// ``HandshakeNoSuchBufferError`` or ``HandshakeOutsideRegionError`` unless the range lies
    /// inside the buffer's registered region.
    fn check_region(&self, buffer: usize, offset: u64, len: u64) -> PyResult<u64> {
        let r = self.inner.check_region(buffer, offset, len);
        r.map_err(raise_handshake)
    }

    fn __repr__(&self) -> String {
        let g = &self.inner;
        let regions: Vec<String> = self.regions().iter().map(MemRegion::__repr__).collect();
        format!(
            "CacheGroup(name={:?}, layout=Layout({:?}), total_kv_heads={}, tp_size={}, \
             tp_rank={}, regions=[{}])",
            g.name,
            g.layout.to_string(),
            g.total_kv_heads,
            g.tp_size,
            g.tp_rank,
            regions.join(", ")
        )
    }
}

/// What one peer publishes: its engine id and its cache groups. ``encode()`` gives the bytes
/// to send; ``PeerMetadata.decode(data)`` reads and checks a peer's bytes.
#[pyclass(module = "kvlayout.handshake", frozen, eq)]
#[derive(Clone, PartialEq)]
pub struct PeerMetadata {
    inner: hs::PeerMetadata,
}

/// `Limits::default()` with the fields given replaced.
fn limits(
    max_body_bytes: Option<u64>,
    max_groups: Option<usize>,
    max_tp: Option<u64>,
    max_name_bytes: Option<usize>,
) -> Limits {
    let d = Limits::default();
    Limits {
        max_body_bytes: max_body_bytes.unwrap_or(d.max_body_bytes),
        max_groups: max_groups.unwrap_or(d.max_groups),
        max_tp: max_tp.unwrap_or(d.max_tp),
        max_name_bytes: max_name_bytes.unwrap_or(d.max_name_bytes),
    }
}

#[pymethods]
impl PeerMetadata {
    /// The metadata of engine ``engine_id`` with ``groups`` (a list of ``CacheGroup``).
    #[new]
    fn new(engine_id: String, groups: Vec<Bound<'_, CacheGroup>>) -> Self {
        let groups = groups.iter().map(|g| g.get().inner.clone()).collect();
        PeerMetadata {
            inner: hs::PeerMetadata { engine_id, groups },
        }
    }

    /// The peer's engine id.
    #[getter]
    fn engine_id(&self) -> &str {
        &self.inner.engine_id
    }

    /// Its cache groups.
    #[getter]
    fn groups(&self) -> Vec<CacheGroup> {
        let groups = self.inner.groups.iter().cloned();
        groups.map(|inner| CacheGroup { inner }).collect()
    }

    /// The encoding: a 12-byte header (``b"KVLH"``, version u16, reserved u16, body length
    /// u32, little-endian), then the JSON body with each group's compatibility hash.
    fn encode<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.inner.encode())
    }

    /// Decodes and checks a peer's bytes (``bytes`` or ``bytearray``): header, body, names,
    /// counts, layouts, TP and heads, regions and hashes. A limit left ``None`` takes its
    /// default (``kvlayout.handshake.DEFAULT_LIMITS``: body 1 MiB, 64 groups, TP 1024, names
    /// 256 bytes). Raises a ``HandshakeError`` subclass naming the value and the limit.
    #[staticmethod]
    #[pyo3(signature = (data, *, max_body_bytes=None, max_groups=None, max_tp=None, max_name_bytes=None))]
    fn decode(
        data: Cow<'_, [u8]>,
        max_body_bytes: Option<u64>,
        max_groups: Option<usize>,
        max_tp: Option<u64>,
        max_name_bytes: Option<usize>,
    ) -> PyResult<Self> {
        let limits = limits(max_body_bytes, max_groups, max_tp, max_name_bytes);
        let inner = hs::PeerMetadata::decode(&data, &limits).map_err(raise_handshake)?;
        Ok(PeerMetadata { inner })
    }

    /// Checks what decoding checks except the hashes (names, group count, each group's
    /// regions, TP and heads), under the same limits as ``decode``; a sender runs it before
    /// publishing. Raises a ``HandshakeError`` subclass.
    #[pyo3(signature = (*, max_groups=None, max_tp=None, max_name_bytes=None))]
    fn validate(
        &self,
        max_groups: Option<usize>,
        max_tp: Option<u64>,
        max_name_bytes: Option<usize>,
    ) -> PyResult<()> {
        let limits = limits(None, max_groups, max_tp, max_name_bytes);
        self.inner.validate(&limits).map_err(raise_handshake)
    }

    fn __repr__(&self) -> String {
        let groups: Vec<String> = self.groups().iter().map(CacheGroup::__repr__).collect();
        format!(
            "PeerMetadata(engine_id={:?}, groups=[{}])",
            self.inner.engine_id,
            groups.join(", ")
        )
    }
}

/// ``None`` when two groups agree on every field the compatibility hash covers; otherwise
/// raises ``HandshakeIncompatibleError`` naming the first differing field and both values.
#[pyfunction]
fn check_compatible(local: &Bound<'_, CacheGroup>, remote: &Bound<'_, CacheGroup>) -> PyResult<()> {
    hs::check_compatible(&local.get().inner, &remote.get().inner).map_err(raise_handshake)
}
