"""Type stubs of the native module ``kvlayout._native`` (PyO3; the package re-exports it)."""

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

__version__: str

Region = Tuple[int, int, int]  # (buffer, byte offset, length)

class View:
    """A strided view of a field, relative to the start of its buffer."""

    @property
    def offset(self) -> int:
        """Offset of element 0, in elements."""
    @property
    def offset_bytes(self) -> int:
        """Offset of element 0, in bytes."""
    @property
    def shape(self) -> List[int]:
        """Extents."""
    @property
    def strides(self) -> List[int]:
        """Strides in elements."""
    @property
    def strides_bytes(self) -> List[int]:
        """Strides in bytes."""
    @property
    def axes(self) -> List[str]:
        """What each axis indexes: ``block``, ``head``, ``slot`` (the token position in the
        block), ``dim``, ``kv``, and vLLM's key ``dim / x`` and ``x``."""
    @property
    def dtype(self) -> str:
        """Element type name."""
    @property
    def itemsize(self) -> int:
        """Bytes per element."""
    @property
    def buffer(self) -> int:
        """The buffer (allocation) the view is into."""
    def byte_offset(self, index: Sequence[int]) -> int:
        """Byte offset of a multi-index, each index checked against its extent."""

class Layout:
    """A validated KV-cache layout: where every element of a paged KV cache lives."""

    def __init__(self, spec: str) -> None:
        """Parses a preset name, a compact spec string, or a preset followed by overrides."""
    @staticmethod
    def preset(name: str) -> "Layout":
        """The layout of a preset by model name."""
    @staticmethod
    def from_json(text: str) -> "Layout":
        """Parses and validates the versioned JSON form."""
    def to_json(self) -> str:
        """The versioned JSON form."""
    @property
    def spec(self) -> str:
        """The canonical compact spec string."""
    @property
    def num_layers(self) -> int:
        """Layer slots."""
    @property
    def num_blocks(self) -> int:
        """Blocks (pages)."""
    @property
    def block_size(self) -> int:
        """Tokens per block."""
    @property
    def num_kv_heads(self) -> int:
        """KV head slots."""
    @property
    def num_slots(self) -> int:
        """Token (or state) slots per block."""
    @property
    def dtype(self) -> str:
        """Element type of the main fields."""
    @property
    def content(self) -> str:
        """Content kind as the spec string names it."""
    @property
    def kv_widths(self) -> Optional[Tuple[int, int]]:
        """``(key width, value width)`` of a K/V content, else ``None``."""
    @property
    def fields(self) -> List[str]:
        """Fields a view or an offset can name."""
    @property
    def num_buffers(self) -> int:
        """Allocations (buffers) the layout spans."""
    @property
    def buffer_bytes(self) -> List[int]:
        """Bytes each buffer must hold: the end of its registered span."""
    def explain(self) -> str:
        """A human account of the layout."""
    def explanation(self) -> Any:
        """The same account as a dict."""
    def offset(
        self, field: str, layer: int = 0, block: int = 0, head: int = 0, slot: int = 0, dim: int = 0
    ) -> Tuple[int, int]:
        """Where an element lives: ``(buffer, byte offset)``."""
    def view(self, convention: str, field: str, layer: int = 0) -> View:
        """The strided view of ``field`` (or ``"kv"``) of one layer in a convention."""
    def block_regions(
        self, block: int, layers: Optional[Tuple[int, int]] = None, heads: Optional[Tuple[int, int]] = None
    ) -> List[Region]:
        """The byte ranges of one block over layers and heads, merged where contiguous."""
    def layer_regions(self, layers: Optional[Tuple[int, int]] = None) -> List[Region]:
        """The byte ranges of layers, every block and head, merged where contiguous."""
    def registered_spans(self) -> List[Region]:
        """What to register for transfers: each buffer's whole owned extent."""
    def tp_heads(self, tp_size: int, tp_rank: int) -> Tuple[int, int]:
        """The heads ``tp_rank`` of ``tp_size`` holds, as ``(start, stop)``."""
    def tp_slice(self, tp_size: int, tp_rank: int) -> "Layout":
        """The view of this memory a TP rank sees."""
    def layer_range(self, start: int, stop: int) -> "Layout":
        """Layers ``start..stop`` of this memory, renumbered from 0."""
    def split_blocks(self, ratio: int) -> "Layout":
        """Each block seen as ``ratio`` kernel blocks."""
    def slot_range(self, start: int, stop: int) -> "Layout":
        """Tokens ``start..stop`` of every block, as blocks of ``stop - start`` tokens."""
    def same_addressing(self, other: "Layout") -> None:
        """Raises ``LayoutMismatchError`` naming the first difference, if any."""

    # --- Tensors and allocations (kvlayout._arrays reads their memory) ---------------------

    def check(
        self,
        obj: Any,
        field: str,
        convention: str = "standard",
        layer: int = 0,
        base: Union[int, Any, None] = None,
        device: Optional[str] = None,
    ) -> None:
        """Checks a framework's tensor against the view of ``field`` (or ``"kv"``) of
        ``layer`` in ``convention``: ``None``, or ``TensorMismatchError`` naming the first
        disagreement (dtype, an axis's size or stride, the storage offset) with a hint at the
        likely mistake. The tensor's memory is read from ``__cuda_array_interface__``,
        ``__array_interface__`` or ``__dlpack__`` (``ArrayError`` if none).

        ``base``: the address of the tensor's buffer, or the allocation itself (it must then
        hold ``buffer_bytes[view.buffer]`` bytes, else ``BufferTooShortError``, and contain
        the tensor); the storage offset is checked only when given. ``device``: ``"cpu"``,
        ``"cuda"``, ``"cuda:N"``, ``"rocm"`` or ``"rocm:N"``, checked when given.
        """
    def as_view(self, buf: Any, field: str, convention: str = "standard", layer: int = 0) -> Any:
        """The zero-copy view of ``field`` (or ``"kv"``) of ``layer`` in ``convention`` over
        the allocation ``buf``: a numpy array sharing ``buf``'s memory (``ml_dtypes`` for bf16
        and fp8), or a torch tensor where ``buf`` is one. ``buf`` is one contiguous allocation
        holding the view's buffer (``BufferTooShortError`` otherwise), or a list of one per
        buffer. ``ViewRefusedError`` where no view exists without a copy."""

def presets() -> List[str]:
    """The preset names (models)."""

def conventions() -> List[str]:
    """The view convention names ``Layout.view`` takes."""

def random_layout(seed: int) -> Layout:
    """The conformance suite's random valid layout of ``seed`` (same seed, same layout)."""

# --- src/backend.rs: kvlayout.open and Backend ---------------------------------------------

class Backend:
    """A backend: ``write_kv``, ``paged_decode`` and the block movers on caller-owned caches."""

    @property
    def name(self) -> str:
        """The name it was opened by."""
    @property
    def memory(self) -> str:
        """``"host"`` (in place) or ``"device"`` (copies in and back)."""
    @property
    def kernels(self) -> dict:
        """What runs the ops: ``{"build": ..., "why": ..., "threads": ...}``."""
    def write_kv(
        self, cache: Any, key: Any, value: Optional[Any], slot_mapping: Any, layer: int = 0
    ) -> None:
        """Writes new tokens' K and V of one layer at their slots."""
    def paged_decode(
        self,
        cache: Any,
        query: Any,
        block_table: Any,
        seq_lens: Any,
        layer: int = 0,
        num_q_heads: Optional[int] = None,
        scale: Optional[float] = None,
        sliding_window: Optional[int] = None,
        soft_cap: Optional[float] = None,
        out: Optional[Any] = None,
    ) -> Any:
        """One decode step of one layer; returns (or fills ``out``) the f32 output."""
    def copy_blocks(self, cache: Any, pairs: Any) -> None:
        """Copies blocks within one cache, every layer."""
    def swap_blocks(self, src_cache: Any, dst_cache: Any, pairs: Any) -> None:
        """Copies blocks between two caches of the same content."""
    def gather_blocks(
        self, cache: Any, blocks: Any, heads: Tuple[int, int], staging: Any
    ) -> None:
        """Copies cache block ``blocks[i]``, heads ``heads``, to staging block ``i``."""
    def scatter_blocks(
        self, staging: Any, blocks: Any, heads: Tuple[int, int], cache: Any
    ) -> None:
        """Staging block ``i`` to cache block ``blocks[i]``, heads ``heads``."""
    def _time_decode(
        self,
        cache: Any,
        query: Any,
        block_table: Any,
        seq_lens: Any,
        layer: int = 0,
        runs: int = 10,
        out: Optional[Any] = None,
    ) -> list[float]:
        """Benchmark support: the seconds of each of ``runs`` decodes timed inside Rust."""
    def convert(self, src_cache: Any, dst_cache: Any) -> None:
        """Converts a whole cache to another layout of the same content and block count."""

def open(name: str, threads: Optional[int] = None) -> Backend:
    """Opens the backend ``name`` (``kvlayout.backend_names()`` lists them)."""

def backend_names() -> List[str]:
    """Every backend name of this build, in report order."""

# --- src/testing.rs, src/testing/: the generators and comparisons of kvlayout.testing -------

def kv_ops_widths(layout: Layout) -> Tuple[int, int]:
    """``(query/key width, value width)`` of a layout ``write_kv`` and ``paged_decode``
    accept; ``UnsupportedError`` otherwise."""

def tensor_scales(layout: Layout) -> Tuple[float, float]:
    """``(k_scale, v_scale)``: the per-tensor scales of stored K and V."""

def workload(layout: Layout, seed: int, activations: Optional[str] = None) -> dict:
    """The conformance suite's workload of ``layout`` seeded by ``seed``, as bytes, dtype
    names and shapes (``kvlayout.testing.workload`` makes numpy arrays of it)."""

def reference_decode(
    cache: Any,
    query: Any,
    block_table: Any,
    seq_lens: Any,
    num_q_heads: int,
    scale: float,
    layer: int = 0,
    sliding_window: Optional[int] = None,
    soft_cap: Optional[float] = None,
) -> Tuple[bytes, List[Tuple[float, float]]]:
    """The scalar reference's decode (f32 output as bytes) and each output row's
    ``(values, logits)`` magnitudes."""

def decode_tolerance(dtype: str) -> Tuple[float, float]:
    """``(relative, per_logit)`` the backend contract allows for a cache of ``dtype``."""

def decode_error(
    got: bytes, want: bytes, magnitudes: Sequence[Tuple[float, float]], dtype: str
) -> dict:
    """The suite's comparison of a decode output with the reference's: ``ratio``,
    ``relative``, ``worst``, ``bound``, ``passed``."""

def write_error(got: Any, want: Any, slot_mapping: Any, layer: int = 0) -> Optional[str]:
    """The suite's check of a write against the reference's: ``None`` or the first
    disagreement in words."""

def element_at(
    layout: Layout, buffer: int, offset: int
) -> Optional[Tuple[str, int, int, int, int, int]]:
    """``(field, layer, block, head, slot, dim)`` of the element holding a byte, or ``None``."""

# --- The connector's handshake (src/handshake.rs; re-exported by kvlayout.handshake) -------

HANDSHAKE_MAGIC: bytes
"""The first four bytes of every encoding, ``b"KVLH"``."""
HANDSHAKE_VERSION: int
"""The format version this build writes and the only one it reads."""
HANDSHAKE_HEADER_BYTES: int
"""Bytes before the JSON body: 12."""
HANDSHAKE_DEFAULT_LIMITS: Dict[str, int]
"""``max_body_bytes``, ``max_groups``, ``max_tp``, ``max_name_bytes`` as decode applies them
when left ``None``."""

class MemRegion:
    """One registered allocation of a peer: ``len`` bytes from address ``base``."""

    def __init__(self, base: int, len: int) -> None:
        """A region of ``len`` bytes from address ``base`` (both unsigned 64-bit)."""
    @property
    def base(self) -> int:
        """Address of the buffer's byte 0."""
    @property
    def len(self) -> int:
        """Bytes registered from ``base``."""
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...

class CacheGroup:
    """One cache group of an instance for one TP rank: a layout (this rank's heads only),
    the model's KV heads, the TP size and rank, and one ``MemRegion`` per layout buffer."""

    def __init__(
        self,
        name: str,
        layout: Any,
        total_kv_heads: int,
        tp_size: int,
        tp_rank: int,
        regions: List[MemRegion] = ...,
    ) -> None:
        """A group named ``name`` holding ``layout`` (a ``kvlayout.Layout``); regions
        default to none."""
    @property
    def name(self) -> str:
        """Name the two peers match groups by."""
    @property
    def layout(self) -> Any:
        """The ``kvlayout.Layout`` of this rank's cache."""
    @property
    def total_kv_heads(self) -> int:
        """The model's KV heads before TP slicing."""
    @property
    def tp_size(self) -> int:
        """TP size of the peer."""
    @property
    def tp_rank(self) -> int:
        """TP rank this group describes."""
    @property
    def regions(self) -> List[MemRegion]:
        """One region per layout buffer (empty where not described)."""
    def compat_text(self) -> str:
        """The canonical text the compatibility hash covers."""
    def compat_hash(self) -> str:
        """SHA-256 of ``compat_text()``, 64 lowercase hex digits."""
    def head_range(self) -> Optional[Tuple[int, int]]:
        """The model heads this rank holds as ``(start, stop)``."""
    def check_region(self, buffer: int, offset: int, len: int) -> int:
        """The absolute address of bytes ``[offset, offset + len)`` of buffer ``buffer``;
        raises ``HandshakeNoSuchBufferError`` or ``HandshakeOutsideRegionError``."""
    def __eq__(self, other: object) -> bool: ...

class PeerMetadata:
    """What one peer publishes: its engine id and its cache groups."""

    def __init__(self, engine_id: str, groups: List[CacheGroup]) -> None:
        """The metadata of engine ``engine_id`` with ``groups``."""
    @property
    def engine_id(self) -> str:
        """The peer's engine id."""
    @property
    def groups(self) -> List[CacheGroup]:
        """Its cache groups."""
    def encode(self) -> bytes:
        """The encoding: 12-byte header, then the JSON body."""
    @staticmethod
    def decode(
        data: Union[bytes, bytearray],
        *,
        max_body_bytes: Optional[int] = None,
        max_groups: Optional[int] = None,
        max_tp: Optional[int] = None,
        max_name_bytes: Optional[int] = None,
    ) -> "PeerMetadata":
        """Decodes and checks a peer's bytes; raises a ``HandshakeError`` subclass."""
    def validate(
        self,
        *,
        max_groups: Optional[int] = None,
        max_tp: Optional[int] = None,
        max_name_bytes: Optional[int] = None,
    ) -> None:
        """Checks what decoding checks except the hashes; raises a ``HandshakeError``
        subclass."""
    def __eq__(self, other: object) -> bool: ...

def check_compatible(local: CacheGroup, remote: CacheGroup) -> None:
    """``None`` when two groups agree on every field the compatibility hash covers; raises
    ``HandshakeIncompatibleError`` naming the first differing field otherwise."""

# --- Benchmark support (src/bench.rs) ----------------------------------------------------

def _time_calls(layout: Layout, what: str, n: int) -> float:
    """Nanoseconds per Rust call of ``offset``, ``view`` or ``check`` on ``layout``."""

def _read_ndarray(obj: Any) -> Optional[tuple]:
    """Test hook: the native reading of a numpy array, as ``kvlayout._arrays._fields``
    gives it, or ``None`` where it leaves the object to ``describe``."""
