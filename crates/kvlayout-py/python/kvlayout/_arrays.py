"""What an object exposes about its memory (stopgap: numpy's __array_interface__ only)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import ArrayError

_NAMES = {
    "float32": "f32",
    "float16": "f16",
    "bfloat16": "bf16",
    "float8_e4m3fn": "fp8_e4m3",
    "float8_e5m2": "fp8_e5m2",
    "int8": "int8",
    "uint8": "u8",
    "int32": "i32",
    "int64": "i64",
    "uint32": "u32",
}


@dataclass(frozen=True)
class ArrayInfo:
    address: int
    shape: tuple
    strides: tuple
    itemsize: int
    dtype: str
    device: str
    readonly: bool


def describe(obj) -> ArrayInfo:
    if not hasattr(obj, "__array_interface__"):
        raise ArrayError("no __array_interface__", reason="no __array_interface__")
    a = np.asarray(obj)
    name = _NAMES.get(a.dtype.name)
    if name is None:
        raise ArrayError(f"dtype {a.dtype.name}", reason=f"dtype {a.dtype.name}")
    return ArrayInfo(
        address=a.__array_interface__["data"][0],
        shape=tuple(a.shape),
        strides=tuple(s // a.itemsize for s in a.strides),
        itemsize=a.itemsize,
        dtype=name,
        device="cpu",
        readonly=not a.flags.writeable,
    )
