"""A KV cache in memory the caller owns: a layout and one allocation per layout buffer."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ._native import Layout

#: Alignment of the buffers ``Cache.zeros`` allocates (a cache line).
ALIGNMENT = 64


def aligned_zeros(nbytes: int, alignment: int = ALIGNMENT) -> np.ndarray:
    """``nbytes`` zero bytes (a uint8 array) whose address is a multiple of ``alignment``."""
    raw = np.zeros(nbytes + alignment, dtype=np.uint8)
    start = (-raw.__array_interface__["data"][0]) % alignment
    return raw[start : start + nbytes]


class Cache:
    """A cache the backends' ops run on: ``layout`` (a :class:`kvlayout.Layout`) and
    ``buffers``, one contiguous host array per layout buffer holding at least
    ``layout.buffer_bytes[i]`` bytes (a framework's own tensors, or ``Cache.zeros``).
    Nothing is copied: the ops read and write these arrays."""

    def __init__(self, layout: Layout, buffers: Sequence[Any] | Any) -> None:
        if not isinstance(layout, Layout):
            raise TypeError(f"layout must be a kvlayout.Layout, got {type(layout).__name__}")
        if not isinstance(buffers, (list, tuple)):
            buffers = [buffers]
        self.layout = layout
        self.buffers = list(buffers)

    @classmethod
    def zeros(cls, layout: Layout) -> "Cache":
        """A zeroed cache of ``layout``: one 64-byte aligned uint8 array per buffer."""
        return cls(layout, [aligned_zeros(n) for n in layout.buffer_bytes])

    def view(self, field: str, convention: str = "standard", layer: int = 0):
        """The zero-copy view of ``field`` (or ``"kv"``) of ``layer`` in ``convention``."""
        return self.layout.as_view(self.buffers, field, convention, layer)

    def __repr__(self) -> str:
        sizes = [getattr(b, "nbytes", "?") for b in self.buffers]
        return f"kvlayout.Cache({str(self.layout)!r}, buffers of {sizes} bytes)"
