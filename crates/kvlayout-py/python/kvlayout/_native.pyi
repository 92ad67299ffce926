"""Type stubs of the native module ``kvlayout._native`` (the package re-exports it)."""

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

__version__: str

Region = Tuple[int, int, int]
"""A byte range: ``(buffer, offset, length)``."""

class Layout:
    """A validated KV-cache layout: where every element of a paged KV cache lives.

    Made from a preset name, a spec string, a preset with overrides, or the JSON form
    (``Layout.from_json``). Immutable; ``str(layout)`` is its canonical spec string."""

    def __init__(self, spec: str) -> None:
        """Parses a preset name, a compact spec string, or a preset followed by overrides."""
    @staticmethod
    def preset(name: str) -> "Layout":
        """The layout of a preset by model name (``kvlayout.presets()`` lists them)."""
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
        """Element type of the main fields (``f16``, ``bf16``, ``fp8_e4m3``, ...)."""
    @property
    def content(self) -> str:
        """Content kind as the spec string names it (``kv``, ``kv_scaled``, ``mla``, ...)."""
    @property
    def kv_widths(self) -> Optional[Tuple[int, int]]:
        """``(key width, value width)`` of a K/V content, else ``None``."""
    @property
    def fields(self) -> list[str]:
        """Fields a view or an offset can name."""
    @property
    def num_buffers(self) -> int:
        """Allocations (buffers) the layout spans."""
    @property
    def buffer_bytes(self) -> list[int]:
        """Bytes each buffer must hold: the end of its registered span."""
    def explain(self) -> str:
        """A human account of the layout."""
    def explanation(self) -> dict[str, Any]:
        """The same account as a dict."""
    def offset(
        self, field: str, layer: int = 0, block: int = 0, head: int = 0, slot: int = 0, dim: int = 0
    ) -> Tuple[int, int]:
        """``(buffer, byte offset)`` of element ``dim`` of ``field`` at
        ``(layer, block, head, slot)``, every index checked against its axis."""
    def view(self, convention: str, field: str, layer: int = 0) -> "View":
        """The strided view of ``field`` (or ``"kv"``) of ``layer`` in ``convention``."""
    def block_regions(
        self,
        block: int,
        layers: Optional[Tuple[int, int]] = None,
        heads: Optional[Tuple[int, int]] = None,
    ) -> list[Region]:
        """The byte ranges of one block over layers and heads, merged where contiguous."""
    def layer_regions(self, layers: Optional[Tuple[int, int]] = None) -> list[Region]:
        """The byte ranges of a range of layers, merged where contiguous."""
    def registered_spans(self) -> list[Region]:
        """What to register for transfers: each buffer's whole owned extent."""
    def tp_heads(self, tp_size: int, tp_rank: int) -> Tuple[int, int]:
        """The heads ``tp_rank`` of ``tp_size`` holds, as ``(start, stop)``."""
    def tp_slice(self, tp_size: int, tp_rank: int) -> "Layout":
        """The view of this memory a TP rank sees: its heads only, same buffers."""
    def layer_range(self, start: int, stop: int) -> "Layout":
        """Layers ``start..stop`` of this memory, renumbered from 0."""
    def split_blocks(self, ratio: int) -> "Layout":
        """Each block seen as ``ratio`` kernel blocks."""
    def slot_range(self, start: int, stop: int) -> "Layout":
        """Tokens ``start..stop`` of every block."""
    def same_addressing(self, other: "Layout") -> None:
        """Raises ``LayoutMismatchError`` unless both layouts address every element alike."""

class View:
    """A strided view of a field, relative to the start of its buffer."""

    @property
    def offset(self) -> int:
        """Offset of element 0, in elements."""
    @property
    def offset_bytes(self) -> int:
        """Offset of element 0, in bytes."""
    @property
    def shape(self) -> list[int]:
        """Extents."""
    @property
    def strides(self) -> list[int]:
        """Strides in elements."""
    @property
    def strides_bytes(self) -> list[int]:
        """Strides in bytes."""
    @property
    def dtype(self) -> str:
        """Element type name."""
    @property
    def itemsize(self) -> int:
        """Bytes per element."""
    @property
    def buffer(self) -> int:
        """The buffer the view is into."""
    def byte_offset(self, index: Sequence[int]) -> int:
        """Byte offset of a multi-index, each index checked against its extent."""

class Backend:
    """A backend: ``write_kv``, ``paged_decode`` and the block movers on caches and tensors
    the caller owns (a cache is any object with ``layout`` and ``buffers``, e.g.
    ``kvlayout.Cache``)."""

    @property
    def name(self) -> str:
        """The name it was opened by."""
    @property
    def memory(self) -> str:
        """``"host"`` (runs on the caller's arrays in place) or ``"device"`` (copies them)."""
    @property
    def kernels(self) -> dict[str, Any]:
        """What runs the ops: ``build``, ``why``, ``threads``."""
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
        """One decode step; returns (or fills ``out``) the f32 output
        ``[seqs, num_q_heads, head_size_v]``."""
    def copy_blocks(self, cache: Any, pairs: Any) -> None:
        """Copies blocks within one cache, every layer."""
    def swap_blocks(self, src_cache: Any, dst_cache: Any, pairs: Any) -> None:
        """Copies blocks between two caches of the same content."""
    def gather_blocks(self, cache: Any, blocks: Any, heads: Tuple[int, int], staging: Any) -> None:
        """Copies cache block ``blocks[i]``, heads ``heads``, to staging block ``i``."""
    def scatter_blocks(self, staging: Any, blocks: Any, heads: Tuple[int, int], cache: Any) -> None:
        """The inverse of ``gather_blocks``."""
    def convert(self, src_cache: Any, dst_cache: Any) -> None:
        """Converts a whole cache to another layout of the same content and block count."""
    def _time_decode(
        self, cache: Any, query: Any, block_table: Any, seq_lens: Any, layer: int = 0, runs: int = 10
    ) -> list[float]:
        """Benchmark support: the seconds of each of ``runs`` decodes timed inside Rust."""

def open(name: str, threads: Optional[int] = None) -> Backend:
    """Opens a backend by name (``cpu``, ``cpu:<build>``, ``reference``, ``cuda-emu``,
    ``hip-emu``, ``cuda[:n]``, ``hip[:n]``)."""

def backend_names() -> list[str]:
    """Every backend name of this build, in report order."""

def presets() -> list[str]:
    """The preset names (models)."""

def conventions() -> list[str]:
    """The view convention names ``Layout.view`` takes."""

def random_layout(seed: int) -> Layout:
    """The conformance suite's random valid layout of ``seed``."""

def _time_calls(layout: Layout, what: str, n: int) -> float:
    """Benchmark support: nanoseconds per Rust call of ``offset``, ``view`` or ``check``."""

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
