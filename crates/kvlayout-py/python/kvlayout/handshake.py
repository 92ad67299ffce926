"""The connector's handshake: what a serving instance publishes so that a peer (Python or
Rust) can move KV blocks to or from it, and the checks that let a receiver trust it.

A :class:`PeerMetadata` is an engine id and its :class:`CacheGroup` s: per group the layout
of this rank's cache, the model's KV heads, the TP size and rank, and one :class:`MemRegion`
(address, bytes) per layout buffer. ``encode()`` gives the bytes to send: a 12-byte header
(``b"KVLH"``, version u16, reserved u16, body length u32, little-endian) and a JSON body.
``PeerMetadata.decode(data)`` reads a peer's bytes and checks everything under limits; a
refusal raises its :class:`kvlayout.errors.HandshakeError` subclass, carrying the value and
the limit. The format and the checks are those of the Rust crate ``kvlayout-connector``,
so a Python and a Rust connector read each other's bytes.

>>> import numpy as np
>>> import kvlayout
>>> from kvlayout.handshake import CacheGroup, MemRegion, PeerMetadata
>>> layout = kvlayout.Layout("llama-3-8b B=4 H=4")  # rank 1 of TP 2: 4 of 8 KV heads
>>> cache = np.zeros(layout.buffer_bytes[0], dtype=np.uint8)
>>> region = MemRegion(cache.__array_interface__["data"][0], cache.nbytes)
>>> group = CacheGroup("attn", layout, total_kv_heads=8, tp_size=2, tp_rank=1,
...                    regions=[region])
>>> group.head_range()
(4, 8)
>>> data = PeerMetadata("prefill-0", [group]).encode()
>>> data[:4], len(data) > 12
(b'KVLH', True)
>>> peer = PeerMetadata.decode(data)
>>> peer.groups[0] == group
True
>>> peer.groups[0].check_region(0, 4096, 64) == region.base + 4096
True
>>> PeerMetadata.decode(data[:7])
Traceback (most recent call last):
    ...
kvlayout.errors.HandshakeTooShortError: handshake is 7 bytes, shorter than the 12-byte header
"""

from ._native import CacheGroup, MemRegion, PeerMetadata, check_compatible
from ._native import HANDSHAKE_DEFAULT_LIMITS as _DEFAULT_LIMITS
from ._native import HANDSHAKE_HEADER_BYTES as HEADER_BYTES
from ._native import HANDSHAKE_MAGIC as MAGIC
from ._native import HANDSHAKE_VERSION as VERSION

#: The limits ``PeerMetadata.decode`` applies to a limit left ``None``: ``max_body_bytes``
#: (1 MiB), ``max_groups`` (64), ``max_tp`` (1024), ``max_name_bytes`` (256).
DEFAULT_LIMITS = dict(_DEFAULT_LIMITS)

__all__ = [
    "CacheGroup",
    "DEFAULT_LIMITS",
    "HEADER_BYTES",
    "MAGIC",
    "MemRegion",
    "PeerMetadata",
    "VERSION",
    "check_compatible",
]
