"""Every view of a few hundred random layouts, element by element, against ``Layout.offset``.

For each seeded random layout (the conformance suite's generator), every convention, every
readable field and ``kv``, layer 0 and the last layer: the array ``Layout.as_view`` returns
and an array built here with ``numpy.lib.stride_tricks.as_strided`` from the ``View``'s
numbers both read, at every index, the bytes that ``layout.offset`` names for the coordinate
the index stands for in that convention. The index-to-coordinate maps are written out here
from the conventions' definitions, not taken from the views. Buffers hold random bytes, so
reading the wrong element shows.
"""

import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

import kvlayout
from kvlayout import _arrays, errors
from kvlayout._native import random_layout

SEEDS = range(300)
CONVENTIONS = ["standard", "vllm-paged-v1", "flash-attn", "flashinfer", "flashinfer-hnd"]


def coords(convention, target, idx, itemsize):
    """``(field index 0 = K / 1 = V, block, head, slot, dim)`` arrays for view indices ``idx``
    (one row per axis); ``None`` where the convention has no such view."""
    if target == "kv":
        kv_axis, rest = {
            "flash-attn": (0, "BNHD"),
            "flashinfer": (1, "BNHD"),
            "flashinfer-hnd": (1, "BHND"),
        }.get(convention, (None, None))
        if kv_axis is None:
            return None
        others = [i for i in range(5) if i != kv_axis]
        named = dict(zip(rest, (idx[i] for i in others)))
        return idx[kv_axis], named["B"], named["H"], named["N"], named["D"]
    zero = np.zeros_like(idx[0])
    if convention in ("standard", "flashinfer-hnd"):  # [B, H, N, D]
        return zero, idx[0], idx[1], idx[2], idx[3]
    if convention in ("flash-attn", "flashinfer"):  # [B, N, H, D]
        return zero, idx[0], idx[2], idx[1], idx[3]
    if target == "k":  # vllm-paged-v1 key [B, H, D/x, N, x], x = 16 / element size
        x = 16 // itemsize
        return zero, idx[0], idx[1], idx[3], idx[2] * x + idx[4]
    if target == "v":  # vllm-paged-v1 value [B, H, D, N]
        return zero, idx[0], idx[1], idx[3], idx[2]
    return None


def width(layout, field):
    """The field's row width, from the range error of an offset past any width."""
    with pytest.raises(errors.OutOfRangeError) as e:
        layout.offset(field, dim=1 << 62)
    assert e.value.axis == "dim"
    return e.value.limit


class Reference:
    """``layout.offset`` of every coordinate of a field and layer, asked once each."""

    def __init__(self, layout):
        self.layout = layout
        self.tables = {}

    def table(self, field, layer):
        key = (field, layer)
        if key not in self.tables:
            lay = self.layout
            dims = (lay.num_blocks, lay.num_kv_heads, lay.num_slots, width(lay, field))
            buffers = np.empty(dims, np.int64)
            offsets = np.empty(dims, np.int64)
            for b, h, n, d in np.ndindex(*dims):
                buffers[b, h, n, d], offsets[b, h, n, d] = lay.offset(field, layer, b, h, n, d)
            self.tables[key] = (buffers, offsets)
        return self.tables[key]


def raw_bytes(arr):
    """An array's elements as rows of bytes, in index order."""
    return np.ascontiguousarray(arr).view(np.uint8).reshape(-1, arr.dtype.itemsize)


def check_view(layout, ref, bufs, convention, target, layer):
    """One view: refused alike by ``view`` and ``as_view``, or both arrays read the bytes
    ``offset`` names at every index."""
    try:
        view = layout.view(convention, target, layer)
    except errors.LayoutError as refused:
        # A refusal, or a kv view of a layout without K and V fields.
        no_kv = target == "kv" and not {"k", "v"} <= set(layout.fields)
        assert isinstance(refused, errors.ViewRefusedError) or (
            no_kv and isinstance(refused, errors.NoSuchFieldError)
        ), repr(refused)
        with pytest.raises(type(refused)) as again:
            layout.as_view(bufs, target, convention, layer)
        assert str(again.value) == str(refused)
        return "refused"
    got = layout.as_view(bufs, target, convention, layer)
    buf = bufs[view.buffer]
    assert got.shape == tuple(view.shape)
    assert got.dtype == _arrays.numpy_dtype(view.dtype)
    assert np.shares_memory(got, buf)

    size = view.itemsize
    idx = np.indices(view.shape).reshape(len(view.shape), -1)
    mapped = coords(convention, target, idx, size)
    assert mapped is not None, f"{layout}: a {convention} {target} view this test has no map for"
    kv, b, h, n, d = mapped
    fields = ["k", "v"] if target == "kv" else [target]
    buffers = np.empty(idx.shape[1], np.int64)
    offsets = np.empty(idx.shape[1], np.int64)
    domain = 0
    for i, field in enumerate(fields):
        tb, to = ref.table(field, layer)
        domain += to.size
        sel = kv == i
        assert (d[sel] < to.shape[3]).all(), f"{convention} {target}: a dim past the width"
        buffers[sel] = tb[b[sel], h[sel], n[sel], d[sel]]
        offsets[sel] = to[b[sel], h[sel], n[sel], d[sel]]
    # A bijection onto the domain: as many elements, no coordinate twice.
    assert idx.shape[1] == domain
    assert len(set(zip(kv, b, h, n, d))) == domain
    assert (buffers == view.buffer).all()
    want = buf[offsets[:, None] + np.arange(size)]
    np.testing.assert_array_equal(raw_bytes(got), want, err_msg=f"{layout}: {convention} {target} {layer}")

    # The independent view from the View's numbers, its extent checked first.
    last = view.offset + sum((e - 1) * s for e, s in zip(view.shape, view.strides))
    assert (last + 1) * size <= buf.size
    mine = as_strided(
        buf[view.offset * size :],
        shape=(*view.shape, size),
        strides=(*(s * size for s in view.strides), 1),
        writeable=False,
    )
    np.testing.assert_array_equal(mine.reshape(-1, size), want)
    return "viewed"


def test_every_view_of_random_layouts_reads_the_offsets_bytes():
    rng = np.random.default_rng(28)
    seen = {"viewed": 0, "refused": 0}
    for seed in SEEDS:
        layout = random_layout(seed)
        ref = Reference(layout)
        bufs = [rng.integers(0, 256, n, dtype=np.uint8) for n in layout.buffer_bytes]
        layers = sorted({0, layout.num_layers - 1})
        for convention in CONVENTIONS:
            for target in [*layout.fields, "kv"]:
                for layer in layers:
                    seen[check_view(layout, ref, bufs, convention, target, layer)] += 1
    # Both outcomes are exercised in numbers.
    assert seen["viewed"] > 2000 and seen["refused"] > 500, seen


def test_a_single_allocation_and_a_list_of_one_give_the_same_view():
    layout = kvlayout.Layout("kv L=2 B=3 N=16 H=4 D=8 dtype=bf16 order=HND")
    buf = np.zeros(layout.buffer_bytes[0], np.uint8)
    a = layout.as_view(buf, "v", "flashinfer-hnd", layer=1)
    b = layout.as_view([buf], "v", "flashinfer-hnd", layer=1)
    assert a.shape == b.shape == (3, 4, 16, 8)
    assert a.__array_interface__["data"] == b.__array_interface__["data"]
    a[2, 3, 15, 7] = 1.5
    assert b[2, 3, 15, 7] == 1.5
