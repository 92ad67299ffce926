"""The conformance suite's random layouts and workloads, the scalar reference's decode and the
suite's comparisons, for :mod:`kvlayout.testing` (which re-exports every public name)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Collection, Iterator, Optional, Sequence

import numpy as np

from . import _native
from ._native import Layout
from .cache import Cache
from .errors import (
    IncompatibleError,
    LayoutError,
    ShapeError,
    UnknownNameError,
    UnsupportedError,
)

#: Most seeds ``random_layouts`` draws per layout asked for before it gives up.
MAX_DRAWS_PER_LAYOUT = 200


def _numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype of an activation dtype name (``f32``, ``f16``, ``bf16``)."""
    if name == "bf16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype({"f32": np.float32, "f16": np.float16}[name])


def _array(tensor: Optional[tuple]) -> Optional[np.ndarray]:
    """A writable numpy array of a ``(bytes, dtype, shape)`` triple from the native module."""
    if tensor is None:
        return None
    data, dtype, shape = tensor
    return np.frombuffer(data, dtype=_numpy_dtype(dtype)).reshape(shape).copy()


def is_decodable(layout: Layout) -> bool:
    """Whether ``write_kv`` and ``paged_decode`` accept ``layout`` (asked of the contract's
    own checks): K/V or MLA content, one token per state."""
    try:
        _native.kv_ops_widths(layout)
    except UnsupportedError:
        return False
    return True


def has_views(layout: Layout, convention: str, fields: Sequence[str] = ("k", "v")) -> bool:
    """Whether every field of ``fields`` has a zero-copy view of every layer in
    ``convention``."""
    try:
        for layer in range(layout.num_layers):
            for field in fields:
                layout.view(convention, field, layer)
    except LayoutError:
        return False
    return True


def random_layouts(
    count: int,
    seed: int = 0,
    *,
    decodable: bool = False,
    convention: Optional[str] = None,
    dtypes: Optional[Collection[str]] = None,
    inline_scales: bool = True,
) -> Iterator[tuple[int, Layout]]:
    """Yields ``count`` pairs ``(seed_i, layout)`` of the conformance suite's random valid
    layouts: seeds ``seed, seed + 1, ...`` in order, keeping those that pass the filters.
    ``layout`` is always ``kvlayout.testing.random_layout(seed_i)``, so ``seed_i`` alone
    reproduces it.

    Filters: ``decodable`` keeps layouts ``write_kv`` and ``paged_decode`` accept (K/V or
    MLA content, one token per state: :func:`is_decodable`); ``convention`` keeps layouts
    whose ``k`` and ``v`` fields have a view of every layer in that convention
    (``kvlayout.conventions()``; MLA's K and V are views of its latent); ``dtypes`` keeps
    those whose cache dtype is listed (``"f16"``, ``"bf16"``, ``"fp8_e4m3"``, ...);
    ``inline_scales=False`` drops content with inline per-row scales (``kv_scaled``).
    Raises (when iterated) ``UnknownNameError`` for an unknown convention, ``ValueError``
    for a negative ``count`` or ``seed``, and ``ValueError`` when ``count`` layouts are not
    found within ``MAX_DRAWS_PER_LAYOUT * count`` seeds (filters nothing passes)."""
    if count < 0 or seed < 0:
        raise ValueError(f"count {count} and seed {seed} must be non-negative")
    if convention is not None and convention not in _native.conventions():
        known = ", ".join(_native.conventions())
        raise UnknownNameError(
            f"unknown convention {convention!r} (known: {known})",
            what="convention",
            name=convention,
            known=known,
        )
    found, limit = 0, MAX_DRAWS_PER_LAYOUT * max(count, 1)
    for s in itertools.count(seed):
        if found == count:
            return
        if s - seed >= limit:
            raise ValueError(
                f"only {found} of {count} layouts from seeds {seed}..{s} pass the filters "
                f"(decodable={decodable}, convention={convention!r}, dtypes={dtypes!r}, "
                f"inline_scales={inline_scales})"
            )
        layout = _native.random_layout(s)
        if decodable and not is_decodable(layout):
            continue
        if dtypes is not None and layout.dtype not in dtypes:
            continue
        if not inline_scales and "k_scale" in layout.fields:
            continue
        if convention is not None and not has_views(layout, convention):
            continue
        found += 1
        yield s, layout


@dataclass(frozen=True)
class DecodeParams:
    """The parameters of one decode step."""

    #: Multiplier of ``q . k`` (``1 / sqrt(head_size)``, or twice it).
    scale: float
    #: Query heads; query head ``qh`` reads KV head ``qh // (num_q_heads // num_kv_heads)``.
    num_q_heads: int
    #: Attend only the last ``sliding_window`` tokens of each sequence (``None``: all).
    sliding_window: Optional[int]
    #: Logits become ``soft_cap * tanh(logit / soft_cap)`` (``None``: unchanged).
    soft_cap: Optional[float]


@dataclass(frozen=True)
class DecodeStep:
    """One decode step of a workload: one query token per sequence."""

    #: ``mha``, ``gqa4+window``, ``gqa2+softcap``, ``gqa8+window1+softcap``.
    name: str
    #: ``[seqs, num_q_heads, head_size]``, the workload's activation dtype.
    query: np.ndarray
    #: Scale, query heads, window, soft-cap.
    params: DecodeParams


@dataclass(frozen=True)
class Workload:
    """The conformance suite's write and decode inputs for one layout and seed.

    Three sequences over shuffled blocks: one ending in a partial block, one of whole
    blocks, one empty; their tokens shuffled, with padding tokens (negative slots) between
    them. Four decode steps: MHA, GQA with a window, GQA with a soft-cap, and GQA with
    window 1 and a soft-cap."""

    #: The seed it was made from (``workload(layout, seed)`` makes it again).
    seed: int
    #: The suite's case name (its generator is seeded by it).
    name: str
    #: The layer written and read (the last one, so layer strides matter).
    layer: int
    #: ``[tokens, num_kv_heads, head_size]`` (MLA: the latent ``[tokens, 1, width]``).
    key: np.ndarray
    #: ``[tokens, num_kv_heads, head_size_v]``; ``None`` for MLA.
    value: Optional[np.ndarray]
    #: int64 ``[tokens]``: ``block * block_size + offset`` per token; negative = padding.
    slot_mapping: np.ndarray
    #: int32 ``[seqs, blocks_per_seq]``; entries past a sequence's blocks are -1 or
    #: ``2**31 - 1`` and must never be read.
    block_table: np.ndarray
    #: uint32 ``[seqs]``: tokens per sequence (0 for the empty one).
    seq_lens: np.ndarray
    #: The decode steps.
    steps: tuple[DecodeStep, ...]

    @property
    def query(self) -> np.ndarray:
        """Step 0's query."""
        return self.steps[0].query

    @property
    def params(self) -> DecodeParams:
        """Step 0's parameters."""
        return self.steps[0].params


def workload(layout: Layout, seed: int, *, activations: Optional[str] = None) -> Workload:
    """The conformance suite's workload of ``layout`` (``kvlayout_conformance::cases::
    workload``), seeded by ``seed``: the same arrays for the same layout and seed.
    ``activations`` (``"f32"``, ``"f16"``, ``"bf16"``) is the dtype of the keys, values
    and queries; ``None`` picks it from the cache's dtype and the seed as the suite's table
    does. Raises ``UnsupportedError`` for a layout ``write_kv`` or ``paged_decode``
    refuses."""
    d = _native.workload(layout, seed, activations)
    seqs = len(d["seq_lens"]) // 4
    steps = tuple(
        DecodeStep(
            name=s["name"],
            query=_array(s["query"]),
            params=DecodeParams(s["scale"], s["num_q_heads"], s["sliding_window"], s["soft_cap"]),
        )
        for s in d["steps"]
    )
    return Workload(
        seed=seed,
        name=d["name"],
        layer=d["layer"],
        key=_array(d["key"]),
        value=_array(d["value"]),
        slot_mapping=np.frombuffer(d["slot_mapping"], dtype=np.int64).copy(),
        block_table=np.frombuffer(d["block_table"], dtype=np.int32).reshape(seqs, -1).copy(),
        seq_lens=np.frombuffer(d["seq_lens"], dtype=np.uint32).copy(),
        steps=steps,
    )


def reference_cache(
    layout: Layout, work: Workload, buffers: Optional[Sequence[Any]] = None
) -> Cache:
    """A cache of ``layout`` holding ``work``'s tokens written by the scalar reference
    (``kvlayout.open("reference").write_kv``) at ``work.layer``: into ``buffers`` when given,
    else into zeroed buffers."""
    cache = Cache(layout, list(buffers)) if buffers is not None else Cache.zeros(layout)
    _reference().write_kv(cache, work.key, work.value, work.slot_mapping, layer=work.layer)
    return cache


_REFERENCE = None


def _reference():
    global _REFERENCE
    if _REFERENCE is None:
        _REFERENCE = _native.open("reference")
    return _REFERENCE


def decode_tolerance(dtype: str) -> tuple[float, float]:
    """``(relative, per_logit)``: the decode tolerance the backend contract allows for a
    cache of ``dtype`` (``kvlayout_cpu::Tolerance::contract``). An output element whose row
    has magnitudes ``(values, logits)`` may differ from the reference by
    ``values * (relative + per_logit * logits)``."""
    return _native.decode_tolerance(dtype)


@dataclass(frozen=True)
class Reference:
    """The scalar reference's decode output and what a kernel's output is compared within."""

    #: f32 ``[seqs, num_q_heads, head_size_v]``, accumulated in f64.
    out: np.ndarray
    #: f64 ``[seqs, num_q_heads, 2]``: per output row, the largest ``|v|`` attended and the
    #: largest ``scale * sum_i |q_i k_i|`` (scales included).
    magnitudes: np.ndarray
    #: The cache's dtype, which sets the tolerance.
    dtype: str

    @property
    def tolerance(self) -> tuple[float, float]:
        """``(relative, per_logit)`` of :func:`decode_tolerance` for this cache."""
        return decode_tolerance(self.dtype)

    def bound(self) -> np.ndarray:
        """The bound on each output element, broadcast to ``out``'s shape."""
        rel, per_logit = self.tolerance
        m = self.magnitudes
        b = m[..., 0] * (rel + per_logit * m[..., 1])
        return np.broadcast_to(b[..., None], self.out.shape)


def reference_decode(layout: Layout, cache: Cache, work: Workload, step: int = 0) -> Reference:
    """The scalar reference's decode (``kvlayout.open("reference")``'s ``paged_decode``:
    every element read through the layout's address function, accumulated in f64) of step
    ``step`` of ``work`` on ``cache`` (written by :func:`reference_cache`), with the
    magnitudes the tolerance scales with."""
    if cache.layout != layout:
        reason = f"the cache holds {cache.layout}, not {layout}"
        raise IncompatibleError(reason, reason=reason)
    s = work.steps[step]
    p = s.params
    out, mags = _native.reference_decode(
        cache,
        s.query,
        work.block_table,
        work.seq_lens,
        p.num_q_heads,
        p.scale,
        layer=work.layer,
        sliding_window=p.sliding_window,
        soft_cap=p.soft_cap,
    )
    seqs = len(work.seq_lens)
    out = np.frombuffer(out, dtype=np.float32).reshape(seqs, p.num_q_heads, -1).copy()
    mags = np.array(mags, dtype=np.float64).reshape(seqs, p.num_q_heads, 2)
    return Reference(out=out, magnitudes=mags, dtype=layout.dtype)


@dataclass(frozen=True)
class Comparison:
    """How a decode output compares with the reference's (the suite's ``decode_error``)."""

    #: Whether every element lies within its bound.
    passed: bool
    #: The worst ``|got - want| / bound`` (infinite for a non-finite output).
    ratio: float
    #: The worst ``|got - want|`` relative to its row's values' magnitude.
    relative: float
    #: Index of the worst element in ``out``'s shape (``None`` when nothing was compared).
    index: Optional[tuple[int, ...]]
    #: The output's value there.
    got: Optional[float]
    #: The reference's value there.
    want: Optional[float]
    #: The bound there.
    bound: Optional[float]


def compare_decode(got: Any, reference: Reference) -> Comparison:
    """Compares a decode output with the reference's as the conformance suite does
    (``kvlayout_cpu::tolerance::decode_error``, the contract's tolerance for the cache's
    dtype). ``got`` must have the reference's shape; raises ``ShapeError`` otherwise."""
    g = np.asarray(got)
    if g.shape != reference.out.shape:
        raise ShapeError(
            f"decode output: shape {g.shape}, expected {reference.out.shape}",
            what="decode output",
            expected=str(reference.out.shape),
            got=str(g.shape),
        )
    g = np.ascontiguousarray(g, dtype=np.float32)
    mags = [tuple(m) for m in reference.magnitudes.reshape(-1, 2)]
    e = _native.decode_error(g.tobytes(), reference.out.tobytes(), mags, reference.dtype)
    index = got_v = want_v = None
    if e["worst"] is not None:
        flat, got_v, want_v = e["worst"]
        index = tuple(int(i) for i in np.unravel_index(flat, reference.out.shape))
    return Comparison(e["passed"], e["ratio"], e["relative"], index, got_v, want_v, e["bound"])


def compare_write(got: Cache, want: Cache, work: Workload) -> Optional[str]:
    """Checks a write of ``work``'s tokens into cache ``got`` against the reference's into
    cache ``want`` (same layout, the same bytes before the writes), as the conformance suite
    does: no byte outside the elements the write stores may differ, and every stored value
    (with its scales) must lie within one quantization step of the reference's. Returns
    ``None``, or the first disagreement in words."""
    return _native.write_error(got, want, work.slot_mapping, layer=work.layer)


__all__ = [
    "Comparison",
    "DecodeParams",
    "DecodeStep",
    "MAX_DRAWS_PER_LAYOUT",
    "Reference",
    "Workload",
    "compare_decode",
    "compare_write",
    "decode_tolerance",
    "has_views",
    "is_decodable",
    "random_layouts",
    "reference_cache",
    "reference_decode",
    "workload",
]
