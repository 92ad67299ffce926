"""Regression tests for other people's kernels, on the conformance suite's random layouts.

kvlayout's conformance suite holds every backend to one scalar reference over random valid
layouts of every kind. This module lends the same machinery to a kernel written outside
kvlayout: :func:`random_layouts` and :func:`workload` are the suite's generators (seeded, so
one seed reproduces a layout and its inputs), :func:`reference_decode` and
:func:`compare_decode` the f64 reference and the contract's tolerance, and the harnesses
:func:`check_decode`, :func:`check_write` and :func:`check_move` run a function written
against one consumer's tensor convention (vLLM's paged v1 by default) on every generated
layout that has views in it, raising :class:`HarnessFailure` with the spec string and the
seed of the first layout it gets wrong::

    import numpy as np
    import kvlayout.testing as kt

    def my_decode(query, key_cache, value_cache, block_table, seq_lens, scale,
                  num_q_heads, *, sliding_window, soft_cap, k_scale, v_scale):
        ...  # key_cache [B, H, D/x, N, x], value_cache [B, H, D, N]
        return out  # [seqs, num_q_heads, head_size_v]

    kt.check_decode(my_decode, convention="vllm-paged-v1", count=50)
    # on failure: the seed in the message reproduces it alone
    kt.check_decode(my_decode, convention="vllm-paged-v1", count=1, seed=1234)

bf16 and fp8 caches and activations are ml_dtypes arrays (``pip install kvlayout[dtypes]``).
"""

from __future__ import annotations

from ._checks import HarnessFailure, check_decode, check_move, check_write
from ._native import random_layout
from ._workloads import (
    MAX_DRAWS_PER_LAYOUT,
    Comparison,
    DecodeParams,
    DecodeStep,
    Reference,
    Workload,
    compare_decode,
    compare_write,
    decode_tolerance,
    has_views,
    is_decodable,
    random_layouts,
    reference_cache,
    reference_decode,
    workload,
)

__all__ = [
    "Comparison",
    "DecodeParams",
    "DecodeStep",
    "HarnessFailure",
    "MAX_DRAWS_PER_LAYOUT",
    "Reference",
    "Workload",
    "check_decode",
    "check_move",
    "check_write",
    "compare_decode",
    "compare_write",
    "decode_tolerance",
    "has_views",
    "is_decodable",
    "random_layout",
    "random_layouts",
    "reference_cache",
    "reference_decode",
    "workload",
]
