"""Argument conversion for the backends' ops (called by the native module)."""

from __future__ import annotations

import numpy as np

from .errors import ShapeError


_TYPES = {"i64": np.dtype(np.int64), "i32": np.dtype(np.int32), "u32": np.dtype(np.uint32)}


def index_array(obj, dtype: str, what: str) -> np.ndarray:
    """``obj`` (an integer array or a list) as a C-contiguous array of ``dtype``
    (``"i64"``, ``"i32"`` or ``"u32"``): a copy only where its type differs. Values that do
    not fit and non-integer input raise ``ShapeError`` naming the argument."""
    target = _TYPES[dtype]
    if type(obj) is np.ndarray and obj.dtype == target and obj.flags.c_contiguous:
        return obj
    a = np.asarray(obj)
    if a.size == 0:
        return np.zeros(a.shape, dtype=target)
    if a.dtype.kind not in "iu":
        raise ShapeError(
            f"{what}: expected integers, got {a.dtype}",
            what=what,
            expected="integers",
            got=str(a.dtype),
        )
    info = np.iinfo(target)
    low, high = int(a.min()), int(a.max())
    if low < info.min or high > info.max:
        bad = low if low < info.min else high
        raise ShapeError(
            f"{what}: value {bad} does not fit {np.dtype(target).name} "
            f"({info.min}..={info.max})",
            what=what,
            expected=f"{np.dtype(target).name} values",
            got=str(bad),
        )
    return np.ascontiguousarray(a, dtype=target)
