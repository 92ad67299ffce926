"""What an array-like object states about its memory, read without copying anything.

:func:`describe` reads, in this order, ``__cuda_array_interface__``, ``__array_interface__``
and ``__dlpack__``, and returns an :class:`ArrayDescription`: the address of element 0, the
shape, the strides in elements, the element type by its kvlayout name, the device. Nothing is
inferred from a shape; every number is checked to be an integer in range. An object exposing
none of the three interfaces, or stating something kvlayout cannot read (big-endian data, a
vector dtype, an unknown device), raises :class:`kvlayout.errors.ArrayError`.

:func:`numpy_dtype` gives the numpy dtype of a kvlayout dtype name (``ml_dtypes`` for bf16 and
fp8). ``_strided_view`` builds the zero-copy views of ``Layout.as_view``.
"""

from __future__ import annotations

import ctypes
import operator
import sys
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence, Tuple

from .errors import ArrayError

#: The interfaces :func:`describe` looks for, in order.
INTERFACES = ("__cuda_array_interface__", "__array_interface__", "__dlpack__")

#: numpy dtype names (``numpy.dtype(...).name``, ml_dtypes included) to kvlayout names.
_NUMPY_NAMES = {
    "float32": "f32",
    "float16": "f16",
    "bfloat16": "bf16",
    "float8_e4m3fn": "fp8_e4m3",
    "float8_e5m2": "fp8_e5m2",
    "int8": "int8",
    "uint8": "u8",
    "float64": "f64",
    "int16": "i16",
    "int32": "i32",
    "int64": "i64",
    "uint16": "u16",
    "uint32": "u32",
    "uint64": "u64",
}

#: DLPack ``(type code, bits)`` to kvlayout names (codes of dlpack.h's DLDataTypeCode).
_DLPACK_NAMES = {
    (2, 32): "f32",
    (2, 16): "f16",
    (4, 16): "bf16",
    (10, 8): "fp8_e4m3",  # kDLFloat8_e4m3fn
    (12, 8): "fp8_e5m2",  # kDLFloat8_e5m2
    (0, 8): "int8",
    (1, 8): "u8",
    (2, 64): "f64",
    (0, 16): "i16",
    (0, 32): "i32",
    (0, 64): "i64",
    (1, 16): "u16",
    (1, 32): "u32",
    (1, 64): "u64",
}

#: DLPack device types kvlayout reads: host memory (plain, CUDA-pinned, ROCm-pinned), CUDA
#: (device and managed) and ROCm memory.
_DLPACK_DEVICES = {1: "cpu", 3: "cpu", 11: "cpu", 2: "cuda", 13: "cuda", 10: "rocm"}

_ADDRESS_LIMIT = 1 << 64
_SIZE_LIMIT = 1 << 63


@dataclass(frozen=True)
class ArrayDescription:
    """What an object states about its memory (see :func:`describe`)."""

    #: Address of element 0 (for an empty array, what the object states).
    address: int
    #: Extents.
    shape: Tuple[int, ...]
    #: Strides in elements (negative where the object states so).
    strides: Tuple[int, ...]
    #: Bytes per element.
    itemsize: int
    #: Element type: ``f32 f16 bf16 fp8_e4m3 fp8_e5m2 int8 u8`` (the layout's dtypes) or
    #: ``f64 i16 i32 i64 u16 u32 u64``.
    dtype: str
    #: ``"cpu"``, ``"cuda:N"``, ``"rocm:N"``, or ``"cuda"`` where the ordinal is not stated.
    device: str
    #: Whether the object says its memory is read-only (legacy DLPack cannot say: False).
    readonly: bool
    #: Bytes of the extent the elements span (0 for an empty array).
    nbytes: int
    #: The interface it was read from.
    interface: str
    #: What keeps the memory alive besides the object (the DLPack capsule), or None.
    owner: Any = field(default=None, compare=False, repr=False)

    @property
    def c_contiguous(self) -> bool:
        """Whether the elements are one dense row-major run (axes of extent 1 skipped)."""
        return _is_dense(self.shape, self.strides)


def _is_dense(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Whether ``strides`` (elements) are row-major dense for ``shape`` (extent-1 axes
    skipped)."""
    if 0 in shape:
        return True
    step = 1
    for n, s in reversed(list(zip(shape, strides))):
        if n > 1 and s != step:
            return False
        step *= n
    return True


def _refuse(reason: str) -> ArrayError:
    return ArrayError(reason, reason=reason)


def _int(value: Any, what: str, low: int, high: int) -> int:
    """``value`` as an int in ``[low, high)``, else ArrayError naming it and the range."""
    if isinstance(value, bool):
        raise _refuse(f"{what} is {value!r}, not an integer")
    try:
        v = operator.index(value)
    except TypeError:
        raise _refuse(f"{what} is {value!r}, not an integer") from None
    if not low <= v < high:
        raise _refuse(f"{what} = {v} is outside [{low}, {high})")
    return v


def _numbers(values: Any, what: str, low: int, high: int) -> Tuple[int, ...]:
    if not isinstance(values, (tuple, list)):
        raise _refuse(f"{what} is {values!r}, not a tuple of integers")
    return tuple(_int(v, f"{what}[{i}]", low, high) for i, v in enumerate(values))


def _c_strides(shape: Sequence[int]) -> Tuple[int, ...]:
    out, step = [], 1
    for n in reversed(shape):
        out.append(step)
        step *= max(n, 1)
    return tuple(reversed(out))


def _make(address, shape, strides, itemsize, dtype, device, readonly, interface, owner=None):
    """The description, with the spanned bytes computed and every number range-checked."""
    shape = _numbers(shape, "shape", 0, _SIZE_LIMIT)
    strides = _c_strides(shape) if strides is None else strides
    strides = _numbers(strides, "strides", -_SIZE_LIMIT + 1, _SIZE_LIMIT)
    if len(strides) != len(shape):
        raise _refuse(f"{len(strides)} strides {strides} for {len(shape)} dims {shape}")
    address = _int(address, "the data address", 0, _ADDRESS_LIMIT)
    if 0 in shape:
        nbytes = 0
    else:
        nbytes = itemsize * (1 + sum((n - 1) * abs(s) for n, s in zip(shape, strides)))
    if nbytes >= _SIZE_LIMIT or address + nbytes > _ADDRESS_LIMIT:
        raise _refuse(f"shape {shape} with strides {strides} spans {nbytes} bytes from address {address:#x}")
    if address == 0 and nbytes > 0:
        raise _refuse(f"a null data address for {nbytes} bytes")
    return ArrayDescription(
        address, shape, strides, itemsize, dtype, device, bool(readonly), nbytes, interface, owner
    )


def _numpy_name(dt: Any, where: str) -> str:
    """The kvlayout name of a numpy dtype (native byte order only)."""
    import numpy

    dt = numpy.dtype(dt)
    if not dt.isnative:
        raise _refuse(f"{where}: dtype {dt.str} is not in the machine's byte order")
    name = _NUMPY_NAMES.get(dt.name)
    if name is None:
        known = ", ".join(sorted(_NUMPY_NAMES))
        raise _refuse(f"{where}: dtype {dt.name} ({dt.str}) is none of {known}")
    return name


def _byte_strides(strides: Any, itemsize: int, where: str):
    """Byte strides (or None) as element strides; each must be a whole number of elements."""
    if strides is None:
        return None
    strides = _numbers(strides, f"{where} strides", -_SIZE_LIMIT + 1, _SIZE_LIMIT)
    for i, s in enumerate(strides):
        if s % itemsize:
            raise _refuse(f"{where} stride[{i}] = {s} B is not a whole number of {itemsize}-byte elements")
    return tuple(s // itemsize for s in strides)


def _interface_dict(obj: Any, cuda: bool) -> ArrayDescription:
    """``__cuda_array_interface__`` (``cuda``) or ``__array_interface__`` of ``obj``."""
    import numpy

    where = INTERFACES[0] if cuda else INTERFACES[1]
    d = getattr(obj, where)
    if not isinstance(d, dict):
        raise _refuse(f"{where} is {type(d).__name__}, not a dict")
    if d.get("mask") is not None:
        raise _refuse(f"{where} has a mask; masked arrays are not read")
    data = d.get("data")
    if not (isinstance(data, tuple) and len(data) == 2):
        raise _refuse(f"{where}['data'] is {data!r}, not (address, readonly)")
    try:
        dt = obj.dtype if isinstance(obj, numpy.ndarray) else numpy.dtype(d.get("typestr"))
    except TypeError as e:
        raise _refuse(f"{where}['typestr'] = {d.get('typestr')!r} is not a dtype ({e})") from None
    name = _numpy_name(dt, where)
    strides = _byte_strides(d.get("strides"), dt.itemsize, where)
    device = _cuda_device(obj) if cuda else "cpu"
    return _make(data[0], d.get("shape"), strides, dt.itemsize, name, device, data[1], where)


def _cuda_device(obj: Any) -> str:
    """``cuda:N`` (or ``rocm:N``) from ``__dlpack_device__`` where the object has it, else
    ``cuda``: the CUDA array interface does not carry the device ordinal."""
    try:
        kind, ordinal = obj.__dlpack_device__()
        name = _DLPACK_DEVICES[int(kind)]
        # pinned host memory: the host's, whatever the ordinal
        return name if name == "cpu" else f"{name}:{int(ordinal)}"
    except Exception:
        return "cuda"


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    """The legacy capsule ``dltensor``: the tensor comes first."""

    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class _DLManagedTensorVersioned(ctypes.Structure):
    """The capsule ``dltensor_versioned`` (DLPack 1.x): version, context, deleter, flags."""

    _fields_ = [
        ("major", ctypes.c_uint32),
        ("minor", ctypes.c_uint32),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", _DLTensor),
    ]


# Own prototypes (setting argtypes on ctypes.pythonapi's would change them for everyone).
_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)
_capsule_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi)
)

_READ_ONLY = 1  # DLPACK_FLAG_BITMASK_READ_ONLY
_IS_COPIED = 2  # DLPACK_FLAG_BITMASK_IS_COPIED


def _dlpack(obj: Any) -> ArrayDescription:
    """Reads the DLManagedTensor of ``obj.__dlpack__()``: asks for a versioned capsule first
    (it carries a read-only flag), else the legacy one. The capsule is only read: neither
    renamed nor consumed, so its own destructor releases the tensor."""
    where = INTERFACES[2]
    try:
        try:
            capsule = obj.__dlpack__(max_version=(1, 0), copy=False)
        except TypeError:
            try:
                capsule = obj.__dlpack__(max_version=(1, 0))
            except TypeError:
                capsule = obj.__dlpack__()
    except Exception as e:
        raise _refuse(f"{where}() failed without a copy: {type(e).__name__}: {e}") from None
    readonly = False
    if _capsule_valid(capsule, b"dltensor_versioned"):
        managed = _DLManagedTensorVersioned.from_address(_capsule_pointer(capsule, b"dltensor_versioned"))
        if managed.major != 1:
            raise _refuse(f"{where}: a DLPack {managed.major}.{managed.minor} tensor; version 1 is read")
        if managed.flags & _IS_COPIED:
            raise _refuse(f"{where}() returned a copy of the object's memory, not the memory itself")
        readonly = bool(managed.flags & _READ_ONLY)
    elif _capsule_valid(capsule, b"dltensor"):
        managed = _DLManagedTensor.from_address(_capsule_pointer(capsule, b"dltensor"))
    else:
        raise _refuse(f"{where}() returned {capsule!r}, not an unused 'dltensor' capsule")
    t = managed.dl_tensor
    if not 0 <= t.ndim <= 64:
        raise _refuse(f"{where}: ndim = {t.ndim}")
    code, bits, lanes = t.dtype.code, t.dtype.bits, t.dtype.lanes
    name = _DLPACK_NAMES.get((code, bits))
    if lanes != 1 or name is None:
        raise _refuse(f"{where}: dtype code {code}, {bits} bits, {lanes} lanes is not a kvlayout dtype")
    kind = _DLPACK_DEVICES.get(t.device.device_type)
    if kind is None:
        raise _refuse(f"{where}: device type {t.device.device_type} is not CPU, CUDA or ROCm memory")
    device = "cpu" if kind == "cpu" else f"{kind}:{t.device.device_id}"
    if t.ndim > 0 and not t.shape:
        raise _refuse(f"{where}: a {t.ndim}-dim tensor without a shape")
    shape = tuple(t.shape[i] for i in range(t.ndim))
    strides = tuple(t.strides[i] for i in range(t.ndim)) if t.strides else None
    address = (t.data or 0) + t.byte_offset
    # The capsule owns the tensor until it is released: it goes with the description.
    return _make(address, shape, strides, bits // 8, name, device, readonly, where, capsule)


def _fields(obj: Any) -> tuple:
    """What the native side reads of :func:`describe`, in one tuple: ``(address, shape,
    strides, itemsize, dtype, device, readonly, nbytes, c_contiguous, owner)``. (The native
    side reads a plain numpy array itself, the same way.)"""
    d = describe(obj)
    return (
        d.address, d.shape, d.strides, d.itemsize, d.dtype, d.device, d.readonly, d.nbytes,
        d.c_contiguous, d.owner,
    )


def describe(obj: Any) -> ArrayDescription:
    """What ``obj`` states about its memory, read from ``__cuda_array_interface__``,
    ``__array_interface__`` or ``__dlpack__`` (the first it has).

    >>> import numpy
    >>> d = describe(numpy.zeros((3, 4), numpy.float16)[:, 1:])
    >>> d.shape, d.strides, d.dtype, d.device, d.nbytes
    ((3, 3), (4, 1), 'f16', 'cpu', 22)

    Raises :class:`~kvlayout.errors.ArrayError` for an object with none of them, or one whose
    statement kvlayout cannot read.
    """
    failed = []
    for name, read in (
        (INTERFACES[0], lambda: _interface_dict(obj, cuda=True)),
        (INTERFACES[1], lambda: _interface_dict(obj, cuda=False)),
        (INTERFACES[2], lambda: _dlpack(obj)),
    ):
        try:
            present = getattr(obj, name, None) is not None
        except Exception as e:  # e.g. torch's CUDA interface of a bf16 tensor: try the next
            failed.append(f"{name} raised {type(e).__name__}: {e}")
            continue
        if present:
            return read()
    reason = f"an object of type {type(obj).__name__} has none of {', '.join(INTERFACES)}"
    raise _refuse("; ".join([reason, *failed]))


def numpy_dtype(name: str):
    """The numpy dtype of a kvlayout dtype name (``bf16`` and ``fp8_*`` from ``ml_dtypes``).

    >>> numpy_dtype("f16").name, numpy_dtype("bf16").name
    ('float16', 'bfloat16')
    """
    import numpy

    numpy_name = {v: k for k, v in _NUMPY_NAMES.items()}.get(name)
    if numpy_name is None:
        raise _refuse(f"dtype {name!r} is none of {', '.join(_NUMPY_NAMES.values())}")
    if name in ("bf16", "fp8_e4m3", "fp8_e5m2"):
        try:
            import ml_dtypes
        except ImportError:
            raise _refuse(f"dtype {name} needs ml_dtypes (pip install ml_dtypes)") from None
        return numpy.dtype(getattr(ml_dtypes, numpy_name))
    return numpy.dtype(numpy_name)


def _extent_bytes(offset: int, shape: Sequence[int], strides: Sequence[int], itemsize: int) -> int:
    """One past the last byte a view (element offset and strides, non-negative) reads."""
    if 0 in shape:
        return offset * itemsize
    return (offset + sum((n - 1) * s for n, s in zip(shape, strides)) + 1) * itemsize


def _strided_view(buf: Any, offset: int, shape: Sequence[int], strides: Sequence[int], dtype: str):
    """The view ``(offset, shape, strides)`` in elements of ``dtype`` over the allocation
    ``buf``: a torch tensor (``torch.as_strided``) or a host array (numpy ``as_strided`` over
    its bytes). ``Layout.as_view`` has checked ``buf``'s size; the extent is checked again
    here against the very array the view is built on (``as_strided`` does not check it)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(buf, torch.Tensor):
        return _torch_view(torch, buf, offset, shape, strides, dtype)
    import numpy
    from numpy.lib.stride_tricks import as_strided

    dt = numpy_dtype(dtype)
    if isinstance(buf, numpy.ndarray):
        # a subclass (np.matrix) may reshape or slice otherwise: its plain array
        arr = numpy.asarray(buf)
    else:
        d = describe(buf)
        if d.device != "cpu":
            raise _refuse(f"an allocation on {d.device}: numpy views are of host memory (pass a torch tensor)")
        try:
            arr = numpy.asarray(buf) if d.interface == INTERFACES[1] else numpy.from_dlpack(buf)
        except Exception as e:
            raise _refuse(f"numpy cannot read the allocation: {type(e).__name__}: {e}") from None
    if not arr.flags.c_contiguous:
        raise _refuse(
            f"the allocation (shape {arr.shape}, strides {arr.strides} B) is not one contiguous run of bytes"
        )
    raw = numpy.asarray(arr.reshape(-1).view(numpy.uint8))
    if raw.ndim != 1:
        raise _refuse(f"the allocation reads as {raw.ndim} dims of bytes, not one run")
    end = _extent_bytes(offset, shape, strides, dt.itemsize)
    if end > raw.size:
        raise _refuse(f"the view reaches byte {end}; the allocation holds {raw.size}")
    start = offset * dt.itemsize
    elems = as_strided(
        raw[start:],
        shape=(*shape, dt.itemsize),
        strides=(*(s * dt.itemsize for s in strides), 1),
    )
    return elems.view(dt)[..., 0]


def _torch_view(torch: Any, buf: Any, offset: int, shape, strides, dtype: str):
    """``torch.as_strided`` over a flat typed view of the contiguous tensor ``buf``."""
    names = {
        "f32": "float32",
        "f16": "float16",
        "bf16": "bfloat16",
        "fp8_e4m3": "float8_e4m3fn",
        "fp8_e5m2": "float8_e5m2",
        "int8": "int8",
        "u8": "uint8",
    }
    tdtype = getattr(torch, names.get(dtype, ""), None)
    if tdtype is None:
        raise _refuse(f"dtype {dtype} has no torch dtype in this torch {torch.__version__}")
    if not buf.is_contiguous():
        raise _refuse(
            f"the allocation (shape {tuple(buf.shape)}, strides {buf.stride()}) is not contiguous"
        )
    raw = buf.reshape(-1).view(torch.uint8)
    itemsize = torch.empty((), dtype=tdtype).element_size()
    end = _extent_bytes(offset, shape, strides, itemsize)
    if end > raw.numel():
        raise _refuse(f"the view reaches byte {end}; the allocation holds {raw.numel()}")
    try:
        typed = raw[: raw.numel() - raw.numel() % itemsize].view(tdtype)
    except RuntimeError as e:
        raise _refuse(f"the allocation cannot be read as {dtype}: {e}") from None
    return torch.as_strided(typed, tuple(shape), tuple(strides), typed.storage_offset() + offset)
