"""The harnesses of :mod:`kvlayout.testing`: a user's decode, write or block-copy function
run on the conformance suite's random layouts, each compared with the scalar reference."""

from __future__ import annotations

from typing import Any, Callable, Collection, Optional

import numpy as np

from . import _native
from ._native import Layout
from ._workloads import (
    Workload,
    compare_decode,
    compare_write,
    random_layouts,
    reference_cache,
    reference_decode,
    workload,
    _reference,
)
from .cache import Cache, aligned_zeros
from .errors import ShapeError


class HarnessFailure(AssertionError):
    """A kernel that disagrees with the reference on a generated layout. The message names
    the layout's spec string, the seed that reproduces it (``count=1, seed=seed``) and the
    worst disagreement.

    Attributes: ``op`` (``check_decode``, ``check_write``, ``check_move``), ``spec`` (the
    layout's spec string), ``seed`` (``kvlayout._native.random_layout(seed)`` is the layout,
    ``kvlayout.testing.workload(layout, seed)`` its inputs), ``step`` (the decode step's
    name, or ``None``), ``detail`` (the disagreement in words)."""

    def __init__(
        self,
        message: str,
        *,
        op: str,
        spec: str,
        seed: int,
        detail: str,
        step: Optional[str] = None,
    ) -> None:
        super().__init__(message)
        #: The harness that failed.
        self.op = op
        #: The layout's canonical spec string.
        self.spec = spec
        #: The seed of the layout and of its workload.
        self.seed = seed
        #: The decode step's name, or ``None``.
        self.step = step
        #: The disagreement in words.
        self.detail = detail


HarnessFailure.__module__ = "kvlayout.testing"


def _name(fn: Callable) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


def _failure(
    op: str,
    fn: Callable,
    convention: str,
    layout: Layout,
    seed: int,
    detail: str,
    inputs: str = "",
    step: Optional[str] = None,
    options: str = "",
) -> HarnessFailure:
    lines = [
        f"{op}: {_name(fn)} disagrees with the reference on random layout seed {seed}",
        f"  spec: {layout}",
    ]
    if inputs:
        lines.append(f"  inputs: {inputs}")
    lines.append(f"  {detail}")
    lines.append(
        f"  reproduce: kvlayout.testing.{op}(fn, convention={convention!r}, count=1, "
        f"seed={seed}{options})"
    )
    return HarnessFailure(
        "\n".join(lines), op=op, spec=str(layout), seed=seed, detail=detail, step=step
    )


def _readonly(a: np.ndarray) -> np.ndarray:
    a = a.view()
    a.flags.writeable = False
    return a


def _filled(layout: Layout, seed: int) -> list[np.ndarray]:
    """One aligned buffer per layout buffer, filled with bytes drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    out = []
    for n in layout.buffer_bytes:
        b = aligned_zeros(n)
        b[:] = rng.integers(0, 256, size=n, dtype=np.uint8)
        out.append(b)
    return out


def _layouts(count: int, seed: int, convention: str, dtypes: Optional[Collection[str]]):
    return random_layouts(
        count, seed, decodable=True, convention=convention, dtypes=dtypes, inline_scales=False
    )


def _describe(work: Workload, step_index: Optional[int] = None) -> str:
    text = (
        f"workload seed {work.seed}, layer {work.layer}, "
        f"seq_lens {work.seq_lens.tolist()}, block_table {work.block_table.tolist()}"
    )
    if step_index is not None:
        s = work.steps[step_index]
        p = s.params
        text += (
            f", step {s.name!r} (query {s.query.dtype} {list(s.query.shape)}, "
            f"num_q_heads={p.num_q_heads}, scale={p.scale:.6g}, "
            f"sliding_window={p.sliding_window}, soft_cap={p.soft_cap})"
        )
    return text


def check_decode(
    fn: Callable[..., Any],
    *,
    convention: str = "vllm-paged-v1",
    count: int = 50,
    seed: int = 0,
    dtypes: Optional[Collection[str]] = None,
    steps: Optional[Collection[str]] = None,
) -> list[tuple[int, str]]:
    """Runs a paged-decode function on ``count`` random layouts and compares each output
    with the scalar reference's, within the tolerance the backend contract allows for the
    cache's dtype. Raises :class:`HarnessFailure` at the first disagreement; returns the
    ``(seed, spec)`` of every layout checked.

    The layouts are ``random_layouts(count, seed, decodable=True, convention=convention,
    dtypes=dtypes, inline_scales=False)``: K/V content of every placement whose K and V have
    views in ``convention``. For each, the cache is written by the reference's ``write_kv``
    with ``workload(layout, seed_i)``, and every decode step (or those named in ``steps``)
    calls::

        fn(query, key_cache, value_cache, block_table, seq_lens, scale, num_q_heads,
           sliding_window=..., soft_cap=..., k_scale=..., v_scale=...)

    - ``query``: ``[seqs, num_q_heads, head_size]``, f32, f16 or bf16 (ml_dtypes), a copy.
    - ``key_cache``, ``value_cache``: read-only zero-copy views of the written layer in
      ``convention`` (``cache.view("k", convention, layer)``); for ``vllm-paged-v1`` key
      ``[num_blocks, num_kv_heads, head_size / x, block_size, x]`` and value
      ``[num_blocks, num_kv_heads, head_size_v, block_size]``. Their dtype is the cache's:
      float32, float16, int8, or ml_dtypes bfloat16, float8_e4m3fn, float8_e5m2. A stored
      element's value is ``float(element) * k_scale`` (``v_scale`` for V). For MLA content
      (its K and V have views in every convention) both view the one latent: K all of it,
      V its first ``kv_lora_rank`` elements.
    - ``block_table``: int32 ``[seqs, blocks_per_seq]``; token ``t`` of sequence ``s`` is
      at block ``block_table[s, t // block_size]``, offset ``t % block_size``. Entries past a
      sequence's ``ceil(len / block_size)`` blocks are -1 or ``2**31 - 1``: never read them.
    - ``seq_lens``: uint32 ``[seqs]``; one sequence is empty (its output is zeros).
    - ``scale``: the logit scale; ``num_q_heads``: query heads (query head ``qh`` reads KV
      head ``qh // (num_q_heads // num_kv_heads)``).
    - ``sliding_window``: ``None``, or attend only the last ``sliding_window`` tokens.
    - ``soft_cap``: ``None``, or logits become ``soft_cap * tanh(logit / soft_cap)``.
    - ``k_scale``, ``v_scale``: the per-tensor scales (floats, usually 1.0).

    It returns the attention output ``[seqs, num_q_heads, head_size_v]`` (anything
    ``numpy.asarray`` takes; compared as f32): ``softmax(scale * q . K) @ V`` over each
    sequence's attended tokens. An exception it raises is a failure too."""
    checked = []
    for s, layout in _layouts(count, seed, convention, dtypes):
        work = workload(layout, s)
        cache = reference_cache(layout, work)
        k_scale, v_scale = _native.tensor_scales(layout)
        key = _readonly(cache.view("k", convention, work.layer))
        value = _readonly(cache.view("v", convention, work.layer))
        for i, step in enumerate(work.steps):
            if steps is not None and step.name not in steps:
                continue
            want = reference_decode(layout, cache, work, i)
            p = step.params

            def fail(detail: str) -> HarnessFailure:
                return _failure(
                    "check_decode",
                    fn,
                    convention,
                    layout,
                    s,
                    detail,
                    _describe(work, i),
                    step.name,
                    "" if steps is None else f", steps={sorted(steps)!r}",
                )

            try:
                got = fn(
                    step.query.copy(),
                    key,
                    value,
                    work.block_table.copy(),
                    work.seq_lens.copy(),
                    p.scale,
                    p.num_q_heads,
                    sliding_window=p.sliding_window,
                    soft_cap=p.soft_cap,
                    k_scale=k_scale,
                    v_scale=v_scale,
                )
            except Exception as e:
                raise fail(f"raised {type(e).__name__}: {e}") from e
            try:
                c = compare_decode(got, want)
            except (ShapeError, TypeError, ValueError) as e:
                raise fail(f"returned an unusable output: {e}") from e
            if not c.passed:
                rel, per_logit = want.tolerance
                values, logits = want.magnitudes[c.index[:2]]
                raise fail(
                    f"worst element out{list(c.index)} = {c.got!r}, reference {c.want!r}: "
                    f"{c.ratio:.3g} x its bound {c.bound:.3g} (contract tolerance for "
                    f"{layout.dtype}: relative {rel:.3g}, per_logit {per_logit:.3g}; row "
                    f"magnitudes: values {values:.3g}, logits {logits:.3g})"
                )
        checked.append((s, str(layout)))
    return checked


def check_write(
    fn: Callable[..., Any],
    *,
    convention: str = "vllm-paged-v1",
    count: int = 50,
    seed: int = 0,
    dtypes: Optional[Collection[str]] = None,
) -> list[tuple[int, str]]:
    """Runs a cache-write function (vLLM's ``reshape_and_cache``) on ``count`` random
    layouts and compares the cache it leaves with the reference's ``write_kv`` as the
    conformance suite does: no byte outside the elements the write stores may change, and
    every stored value must lie within one quantization step of the reference's. Raises
    :class:`HarnessFailure` at the first disagreement; returns the ``(seed, spec)`` of every
    layout checked.

    The layouts are those of :func:`check_decode`. Both caches start from the same random
    bytes; then::

        fn(key, value, key_cache, value_cache, slot_mapping, k_scale=..., v_scale=...)

    - ``key``: ``[tokens, num_kv_heads, head_size]``, ``value``: ``[tokens, num_kv_heads,
      head_size_v]``, f32, f16 or bf16 (ml_dtypes), copies. For MLA content ``key`` is the
      latent ``[tokens, 1, kv_lora_rank + rope_dim]`` and ``value`` is ``None``.
    - ``key_cache``, ``value_cache``: writable zero-copy views of layer ``workload.layer``
      in ``convention`` (see :func:`check_decode`); for MLA both view the one latent
      (``value_cache`` its first ``kv_lora_rank`` elements): write ``key`` into
      ``key_cache``.
    - ``slot_mapping``: int64 ``[tokens]``; token ``t`` goes to block ``slot // block_size``,
      offset ``slot % block_size``; a negative slot is padding (skip it).
    - ``k_scale``, ``v_scale``: store ``key / k_scale`` and ``value / v_scale`` in the
      cache's dtype (round to nearest; int8 rounds half away from zero and saturates at
      +-127).

    Its return value is ignored; an exception it raises is a failure."""
    checked = []
    for s, layout in _layouts(count, seed, convention, dtypes):
        work = workload(layout, s)
        want = reference_cache(layout, work, _filled(layout, s))
        got = Cache(layout, _filled(layout, s))
        k_scale, v_scale = _native.tensor_scales(layout)

        def fail(detail: str) -> HarnessFailure:
            return _failure("check_write", fn, convention, layout, s, detail, _describe(work))

        try:
            fn(
                work.key.copy(),
                None if work.value is None else work.value.copy(),
                got.view("k", convention, work.layer),
                got.view("v", convention, work.layer),
                work.slot_mapping.copy(),
                k_scale=k_scale,
                v_scale=v_scale,
            )
        except Exception as e:
            raise fail(f"raised {type(e).__name__}: {e}") from e
        detail = compare_write(got, want, work)
        if detail is not None:
            raise fail(detail)
        checked.append((s, str(layout)))
    return checked


def _copy_pairs(layout: Layout, seed: int) -> np.ndarray:
    """Block pairs ``(src, dst)`` drawn from ``seed``: distinct destinations, none of them a
    source (so the order of the copies does not matter)."""
    blocks = np.random.default_rng(seed).permutation(layout.num_blocks)
    n = max(1, len(blocks) // 2)
    src, dst = blocks[:n], blocks[n : 2 * n]
    if len(dst) == 0:
        return np.zeros((0, 2), dtype=np.int64)
    return np.stack([src[: len(dst)], dst], axis=1).astype(np.int64)


def check_move(
    fn: Callable[..., Any],
    *,
    convention: str = "vllm-paged-v1",
    count: int = 50,
    seed: int = 0,
    dtypes: Optional[Collection[str]] = None,
) -> list[tuple[int, str]]:
    """Runs a block-copy function (vLLM's ``copy_blocks``) on ``count`` random layouts and
    compares the cache it leaves, byte for byte, with the reference's ``copy_blocks``.
    Raises :class:`HarnessFailure` at the first disagreement; returns the ``(seed, spec)``
    of every layout checked.

    The layouts are those of :func:`check_decode`. Both caches start from the same random
    bytes; then::

        fn(key_caches, value_caches, block_mapping)

    - ``key_caches``, ``value_caches``: lists over layers of writable zero-copy views in
      ``convention`` (see :func:`check_decode`).
    - ``block_mapping``: int64 ``[pairs, 2]`` of ``(src, dst)`` block ids: copy every K and
      V element of block ``src`` to block ``dst``, every layer. No destination is a source.

    Its return value is ignored; an exception it raises is a failure."""
    checked = []
    for s, layout in _layouts(count, seed, convention, dtypes):
        pairs = _copy_pairs(layout, s)
        want = Cache(layout, _filled(layout, s))
        _reference().copy_blocks(want, pairs)
        got = Cache(layout, _filled(layout, s))
        layers = range(layout.num_layers)

        def fail(detail: str) -> HarnessFailure:
            return _failure(
                "check_move", fn, convention, layout, s, detail, f"block_mapping {pairs.tolist()}"
            )

        try:
            fn(
                [got.view("k", convention, layer) for layer in layers],
                [got.view("v", convention, layer) for layer in layers],
                pairs.copy(),
            )
        except Exception as e:
            raise fail(f"raised {type(e).__name__}: {e}") from e
        for b, (g, w) in enumerate(zip(got.buffers, want.buffers)):
            diff = np.flatnonzero(g != w)
            if len(diff):
                o = int(diff[0])
                at = _native.element_at(layout, b, o)
                where = "no element's"
                if at is not None:
                    where = "{} layer {} block {} head {} slot {} [{}]".format(*at)
                raise fail(
                    f"buffer {b} byte {o} ({where}) = {int(g[o]):#04x}, the reference's "
                    f"{int(w[o]):#04x} ({len(diff)} bytes differ)"
                )
        checked.append((s, str(layout)))
    return checked


__all__ = ["HarnessFailure", "check_decode", "check_move", "check_write"]
