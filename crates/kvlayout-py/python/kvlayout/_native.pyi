"""Type stubs of the native module ``kvlayout._native`` (the PyO3 extension).

Each part of the bindings adds its own section. Names without a section here are typed
``Any`` through the module ``__getattr__`` below (a partial stub).
"""

from typing import Any, Dict, List, Optional, Tuple, Union

def __getattr__(name: str) -> Any: ...

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
