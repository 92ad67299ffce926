"""kvlayout: one validated descriptor for the memory layout of a paged KV cache.

A :class:`Layout` states where every element of a paged KV cache lives (made from a preset,
a spec string or its JSON form). From it come the offset of any element, zero-copy views of
a field in a consumer's convention, the check of a tensor a framework hands over, byte
regions to register for transfers, and the transformations (TP slice, layer range,
kernel-block split, slot range). Errors are exceptions of :mod:`kvlayout.errors`, one class
per error kind, carrying the value and the limit as attributes.

>>> import kvlayout
>>> layout = kvlayout.Layout("kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=NHD")
>>> layout.offset("v", block=1, head=2, slot=3, dim=5)  # 1*2048 + 3*128 + 2*32 + 16 + 5*2
(0, 2522)
>>> layout.view("flash-attn", "k").shape
[3, 16, 4, 8]

A zero-copy view of a field over an allocation, and the check of a tensor against the layout:

>>> import numpy
>>> buf = numpy.zeros(layout.buffer_bytes[0], numpy.uint8)
>>> k = layout.as_view(buf, "k", "flash-attn")
>>> k.shape, k.dtype.name, numpy.shares_memory(k, buf)
((3, 16, 4, 8), 'float16', True)
>>> layout.check(k, "k", "flash-attn", base=buf)
>>> layout.check(k, "k", "standard")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
kvlayout.errors.TensorMismatchError: ... standard k: axis 1 (head): size 16, expected 4 ...
"""

from . import errors, handshake
from ._arrays import ArrayDescription, describe, numpy_dtype
from ._native import Backend, Layout, View, __version__, backend_names, conventions, open, presets
from .cache import Cache

__all__ = [
    "ArrayDescription",
    "Backend",
    "Cache",
    "Layout",
    "View",
    "backend_names",
    "conventions",
    "describe",
    "errors",
    "handshake",
    "numpy_dtype",
    "open",
    "presets",
    "__version__",
]
