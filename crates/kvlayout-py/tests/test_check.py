"""``Layout.check`` on tensors a framework hands over: right ones pass (numpy, DLPack, the CUDA
array interface), and each bug class it can see is refused with the exception class and words
a user can act on. Wrong tensors are built here with ``as_strided`` over a real allocation,
exactly as the mistaken framework would see the memory."""

import warnings

import ml_dtypes
import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

import kvlayout
from kvlayout import errors

F16 = np.dtype(np.float16)
BF16 = np.dtype(ml_dtypes.bfloat16)


def alloc(layout, buffer=0):
    """A zeroed allocation of one of the layout's buffers."""
    return np.zeros(layout.buffer_bytes[buffer], np.uint8)


def strided(buf, dtype, offset, shape, strides):
    """A framework's tensor over ``buf``: ``dtype`` elements from element ``offset``, strides
    in elements; its extent is checked to lie in ``buf`` first."""
    dtype = np.dtype(dtype)
    last = offset + sum((n - 1) * s for n, s in zip(shape, strides))
    assert 0 <= offset and (last + 1) * dtype.itemsize <= buf.size, "test tensor out of bounds"
    raw = as_strided(
        buf[offset * dtype.itemsize :],
        shape=(*shape, dtype.itemsize),
        strides=(*(s * dtype.itemsize for s in strides), 1),
    )
    return raw.view(dtype)[..., 0]


def refused(cls, call):
    """The message of the ``cls`` exception ``call()`` raises."""
    with pytest.raises(cls) as e:
        call()
    return str(e.value)


class DLPackOnly:
    """Exposes an array through ``__dlpack__`` alone (``legacy``: no ``max_version``)."""

    def __init__(self, arr, legacy=False):
        self.arr, self.legacy = arr, legacy

    def __dlpack__(self, **kwargs):
        return self.arr.__dlpack__() if self.legacy else self.arr.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.arr.__dlpack_device__()


class CudaArray:
    """A stand-in for a GPU tensor: only ``__cuda_array_interface__`` (numbers of a host
    array), and a DLPack device where ``ordinal`` is given."""

    def __init__(self, arr, ordinal=None, **overrides):
        ai = arr.__array_interface__
        self.__cuda_array_interface__ = {
            "shape": arr.shape,
            "strides": arr.strides,
            "typestr": ai["typestr"],
            "data": (ai["data"][0], False),
            "version": 3,
            **overrides,
        }
        if ordinal is not None:
            self.__dlpack_device__ = lambda: (2, ordinal)


LAYOUT = "kv L=2 B=3 N=16 H=4 D=8 dtype=f16 order=NHD"


def test_right_tensors_pass_from_numpy_dlpack_and_the_cuda_interface():
    layout = kvlayout.Layout(LAYOUT)
    buf = alloc(layout)
    k = layout.as_view(buf, "k", "flash-attn", layer=1)
    assert layout.check(k, "k", "flash-attn", layer=1) is None
    layout.check(k, "k", "flash-attn", layer=1, base=buf, device="cpu")
    layout.check(k, "k", "flash-attn", layer=1, base=buf.ctypes.data)
    for legacy in (False, True):
        layout.check(DLPackOnly(k, legacy), "k", "flash-attn", layer=1, base=buf.ctypes.data)
    gpu = CudaArray(k)
    layout.check(gpu, "k", "flash-attn", layer=1, base=buf.ctypes.data, device="cuda")
    layout.check(gpu, "k", "flash-attn", layer=1, device="cuda:0")  # ordinal not stated
    m = refused(errors.TensorMismatchError, lambda: layout.check(gpu, "k", "flash-attn", 1, device="cpu"))
    assert "the tensor is on cuda, expected cpu" in m
    m = refused(
        errors.TensorMismatchError,
        lambda: layout.check(CudaArray(k, ordinal=1), "k", "flash-attn", 1, device="cuda:0"),
    )
    assert "on cuda:1, expected cuda:0" in m
    # The same tensor claimed for layer 0 starts 3072 elements (6144 B) too far.
    m = refused(errors.TensorMismatchError, lambda: layout.check(k, "k", "flash-attn", 0, base=buf))
    assert "storage offset 3072 elements (6144 bytes), expected 0 elements (0 bytes)" in m


def test_bug1_swapped_v_strides():
    # vLLM's value is [B, H, D, N]: dim stride N, token stride 1.
    layout = kvlayout.Layout("kv B=3 N=16 H=4 D=16 dtype=f16 tensor=vllm-paged-v1")
    v = layout.view("vllm-paged-v1", "v")
    assert (v.shape, v.strides) == ([3, 4, 16, 16], [1024, 256, 16, 1])
    buf = alloc(layout)
    layout.check(layout.as_view(buf, "v", "vllm-paged-v1"), "v", "vllm-paged-v1", base=buf)
    wrong = strided(buf, F16, v.offset, v.shape, [1024, 256, 1, 16])
    m = refused(errors.TensorMismatchError, lambda: layout.check(wrong, "v", "vllm-paged-v1", base=buf))
    assert "vllm-paged-v1 v: axis 2 (dim): stride 1, expected 16" in m
    assert "axes 2 (dim) and 3 (slot) look swapped" in m


def test_bug2_block_size_read_from_the_wrong_axis():
    # Head-major pages: the standard [B, H, N, D] tensor claimed as flash-attn [B, N, H, D]
    # (its block size read from shape[1], which is H).
    layout = kvlayout.Layout("kv B=3 N=16 H=4 D=8 dtype=f16 order=HND")
    buf = alloc(layout)
    k = layout.as_view(buf, "k", "standard")
    layout.check(k, "k", "standard", base=buf)
    m = refused(errors.TensorMismatchError, lambda: layout.check(k, "k", "flash-attn"))
    assert "flash-attn k: axis 1 (slot): size 4, expected 16" in m
    assert "axes 1 (slot) and 2 (head) look swapped" in m


def vllm_flash_attention_cache(num_blocks):
    """vLLM's FlashAttention cache ``(num_blocks, 2, block_size, num_kv_heads, head_size)``
    bf16: FlashInfer NHD's stacked view ``(B, 2, N, H, D)``, spec ``tensor=flashinfer-nhd``."""
    layout = kvlayout.Layout(f"kv B={num_blocks} N=16 H=2 D=64 dtype=bf16 tensor=flashinfer-nhd")
    cache = np.zeros((num_blocks, 2, 16, 2, 64), BF16)
    return layout, cache


@pytest.mark.parametrize("num_blocks", [5, 2])
def test_bug3_kv_axis_outside_or_inside_the_block_axis(num_blocks):
    layout, cache = vllm_flash_attention_cache(num_blocks)
    assert layout.view("flashinfer", "kv").shape == list(cache.shape)
    layout.check(cache, "kv", "flashinfer", base=cache)
    # The same data reshaped as (2, num_blocks, ...) and claimed as flash-attn's kv tensor.
    claimed = cache.reshape(2, num_blocks, 16, 2, 64)
    m = refused(errors.TensorMismatchError, lambda: layout.check(claimed, "kv", "flash-attn", base=cache))
    page = 16 * 2 * 64
    assert f"flash-attn kv: axis 0 (kv): stride {num_blocks * page}, expected {page}" in m
    if num_blocks == 2:  # identical shapes, the strides exchanged
        assert claimed.shape == cache.shape
        assert "axes 0 (kv) and 1 (block) look swapped" in m
        assert "(kv, block, slot, head, dim), the tensor reads as (block, kv, slot, head, dim)" in m
    else:
        assert "the tensor puts K and V outside the blocks ((2, B, ...): all K, then all V)" in m
    # The transposed array is the flash-attn view of the same memory: accepted.
    layout.check(cache.transpose(1, 0, 2, 3, 4), "kv", "flash-attn", base=cache)


def test_bug4_block_stride_ignoring_the_page_padding():
    # Pages of 4096 B data padded to 4160 B.
    layout = kvlayout.Layout("kv L=2 B=3 N=16 H=8 D=8 dtype=f16 order=NHD page=4160")
    buf = alloc(layout)
    right = layout.view("flash-attn", "k")
    assert right.strides == [2080, 128, 16, 1]
    wrong = strided(buf, F16, 0, right.shape, [2048, 128, 16, 1])
    m = refused(errors.TensorMismatchError, lambda: layout.check(wrong, "k", "flash-attn", base=buf))
    assert "axis 0 (block): stride 2048, expected 2080" in m
    assert "the block stride ignores the page padding: 4096 B is the dense page" in m


def test_bug5_registered_span_too_small():
    layout = kvlayout.Layout(LAYOUT)
    buf = alloc(layout)
    needed = layout.buffer_bytes[0]
    k = layout.as_view(buf, "k", "flash-attn")
    short = buf[: needed - 64]
    with pytest.raises(errors.BufferTooShortError) as e:
        layout.check(k, "k", "flash-attn", base=short)
    assert (e.value.buffer, e.value.len, e.value.needed) == (0, needed - 64, needed)
    assert f"buffer 0 holds {needed - 64} bytes; the layout needs {needed}" in str(e.value)
    with pytest.raises(errors.BufferTooShortError):
        layout.as_view(short, "k", "flash-attn")


def test_bug7_a_single_head_axis_carries_any_stride():
    layout = kvlayout.Layout("kv B=3 N=16 H=1 D=8 dtype=f16 order=NHD")
    buf = alloc(layout)
    t = strided(buf, F16, 0, [3, 16, 1, 8], [256, 16, 12345, 1])
    layout.check(t, "k", "flash-attn", base=buf)
    wrong = strided(buf, F16, 0, [3, 16, 1, 8], [256, 8, 12345, 1])
    m = refused(errors.TensorMismatchError, lambda: layout.check(wrong, "k", "flash-attn"))
    assert "axis 1 (slot): stride 8, expected 16" in m


def test_bug10_strided_scales_read_as_dense():
    # Each K row carries its f32 scale inline: the scales are strided, not a dense array.
    layout = kvlayout.Layout("kv-scaled B=3 N=16 H=4 D=8 dtype=int8 order=NHD")
    buf = alloc(layout)
    s = layout.as_view(buf, "k_scale", "standard")
    assert s.dtype == np.float32 and s.shape == (3, 4, 16, 1)
    layout.check(s, "k_scale", "standard", base=buf)
    v = layout.view("standard", "k_scale")
    dense = strided(buf, np.float32, v.offset, [3, 4, 16, 1], [64, 16, 1, 1])
    m = refused(errors.TensorMismatchError, lambda: layout.check(dense, "k_scale", "standard", base=buf))
    assert f"standard k_scale: axis 0 (block): stride 64, expected {v.strides[0]}" in m
    assert "dense (C-contiguous)" in m


def test_bug12_x_from_the_block_size():
    # vLLM's key [B, H, D/x, N, x] with x = 16 B / 2 B = 8 for f16, not the block size 16.
    layout = kvlayout.Layout("kv B=3 N=16 H=2 D=32 dtype=f16 tensor=vllm-paged-v1")
    buf = alloc(layout)
    k = layout.as_view(buf, "k", "vllm-paged-v1")
    assert k.shape == (3, 2, 4, 16, 8)
    layout.check(k, "k", "vllm-paged-v1", base=buf)
    wrong = buf[: k.size * 2].view(np.float16).reshape(3, 2, 2, 16, 16)
    m = refused(errors.TensorMismatchError, lambda: layout.check(wrong, "k", "vllm-paged-v1"))
    assert "axis 2 (dim / x): size 2, expected 4" in m
    assert "x is 16 bytes / 2-byte f16 elements = 8, not the block size 16" in m


def test_bug17_k_and_v_packed_in_the_trailing_dim_with_two_heads():
    # Per token and head a row [K 8 | V 8]: K is [..., :8] of a [B, N, H, 16] array, not the
    # first half of a [B, N, 2, H * 8] one (the same bytes when H = 1, not with 2 heads).
    layout = kvlayout.Layout("kv B=3 N=16 H=2 D=8 dtype=f16 order=NHD")
    cache = np.zeros((3, 16, 2, 16), np.float16)
    layout.check(cache[..., :8], "k", "flash-attn", base=cache)
    layout.check(cache[..., 8:], "v", "flash-attn", base=cache)
    wrong = cache.reshape(3, 16, 2, 2, 8)[:, :, 0]
    m = refused(errors.TensorMismatchError, lambda: layout.check(wrong, "k", "flash-attn", base=cache))
    assert "flash-attn k: axis 2 (head): stride 8, expected 16" in m


def test_bad_input_raises_typed_exceptions():
    layout = kvlayout.Layout(LAYOUT)
    buf = alloc(layout)
    k = layout.as_view(buf, "k", "flash-attn")
    m = refused(errors.ArrayError, lambda: layout.check([1, 2], "k"))
    assert "none of __cuda_array_interface__, __array_interface__, __dlpack__" in m
    m = refused(errors.TensorMismatchError, lambda: layout.check(k.astype(np.float32), "k", "flash-attn"))
    assert "dtype f32, the layout stores f16" in m
    m = refused(errors.TensorMismatchError, lambda: layout.check(np.zeros(3, np.int32), "k"))
    assert "dtype i32, the layout stores f16" in m
    assert refused(errors.UnknownNameError, lambda: layout.check(k, "q")).startswith("unknown field 'q'")
    refused(errors.UnknownNameError, lambda: layout.check(k, "k", "flash"))
    refused(errors.UnknownNameError, lambda: layout.check(k, "k", "flash-attn", device="gpu"))
    with pytest.raises(errors.OutOfRangeError) as e:
        layout.check(k, "k", "flash-attn", layer=-1)
    assert (e.value.axis, e.value.value, e.value.limit) == ("layer", -1, 2)
    with pytest.raises(errors.OutOfRangeError):
        layout.as_view(buf, "k", "flash-attn", layer=2**70)
    with pytest.raises(OverflowError):  # past 128 bits: refused by the argument conversion
        layout.check(k, "k", "flash-attn", layer=2**200)
    address = k.__array_interface__["data"][0]
    m = refused(errors.TensorMismatchError, lambda: layout.check(k, "k", "flash-attn", base=address + 64))
    assert "lies 64 B before the base" in m
    m = refused(errors.TensorMismatchError, lambda: layout.check(k, "k", "flash-attn", base=address - 1))
    assert "1 B past the base, not a whole number of 2-byte elements" in m
    for base in (-1, 2**64, 2**80):
        m = refused(errors.ArrayError, lambda: layout.check(k, "k", "flash-attn", base=base))
        assert "outside [0, 2**64)" in m
    strided_alloc = np.zeros((2, layout.buffer_bytes[0]), np.uint8)[:, ::2]
    refused(errors.ArrayError, lambda: layout.check(k, "k", "flash-attn", base=strided_alloc))
    # Numbers out of range in an interface: named, never read.
    for bad, words in [
        ({"shape": (2**70,)}, "shape[0] = 1180591620717411303424 is outside"),
        ({"data": (2**65, False)}, "the data address"),
        ({"data": (0, False)}, "a null data address"),
        ({"strides": (2, 2)}, "strides"),
        ({"strides": (3, 2, 2, 2)}, "not a whole number of 2-byte elements"),
        ({"typestr": "<q9"}, "typestr"),
        ({"typestr": ">f2"}, "byte order"),
        ({"mask": object()}, "mask"),
        ({"shape": "3, 16"}, "not a tuple of integers"),
    ]:
        m = refused(errors.ArrayError, lambda: layout.check(CudaArray(k, **bad), "k", "flash-attn"))
        assert words in m, (bad, m)


def test_as_view_refusals_and_allocations():
    # vLLM's key is x-split: no standard view of it without a copy.
    layout = kvlayout.Layout("kv B=3 N=16 H=2 D=16 dtype=f16 tensor=vllm-paged-v1")
    buf = alloc(layout)
    with pytest.raises(errors.ViewRefusedError) as e:
        layout.as_view(buf, "k", "standard")
    assert "x-split" in e.value.reason
    layout2 = kvlayout.Layout("kv B=3 N=16 H=2 D=8 dtype=f16 tensor=separate-nhd")
    assert layout2.num_buffers == 2
    bufs = [alloc(layout2, 0), alloc(layout2, 1)]
    v = layout2.as_view(bufs, "v", "flash-attn")
    assert np.shares_memory(v, bufs[1]) and not np.shares_memory(v, bufs[0])
    m = refused(errors.ArrayError, lambda: layout2.as_view(bufs[0], "v", "flash-attn"))
    assert "pass a list of 2" in m
    m = refused(errors.ArrayError, lambda: layout2.as_view(bufs[:1], "v"))
    assert "1 allocations for a layout of 2" in m
    noncontiguous = np.zeros((2, buf.size), np.uint8)[:, ::2]
    assert "contiguous" in refused(errors.ArrayError, lambda: layout.as_view(noncontiguous, "v"))
    readonly = buf.copy()
    readonly.flags.writeable = False
    assert not layout.as_view(readonly, "v").flags.writeable


def test_torch_tensors_are_checked_and_viewed():
    torch = pytest.importorskip("torch")
    layout = kvlayout.Layout("kv L=2 B=3 N=16 H=4 D=8 dtype=bf16 order=NHD")
    buf = torch.zeros(layout.buffer_bytes[0], dtype=torch.uint8)
    k = layout.as_view(buf, "k", "flash-attn", layer=1)
    assert isinstance(k, torch.Tensor) and k.dtype == torch.bfloat16
    assert k.untyped_storage().data_ptr() == buf.untyped_storage().data_ptr()
    k[1, 2, 3, 4] = 1.0
    _, at = layout.offset("k", 1, 1, 3, 2, 4)
    assert buf[at + 1] == 0x3F  # bf16 1.0 = 0x3f80, little-endian
    layout.check(k, "k", "flash-attn", layer=1, base=buf.data_ptr(), device="cpu")
    m = refused(
        errors.TensorMismatchError,
        lambda: layout.check(k, "k", "flash-attn", layer=0, base=buf.data_ptr()),
    )
    assert "storage offset 3072 elements (6144 bytes), expected 0 elements (0 bytes)" in m


def test_the_native_numpy_reading_says_what_describe_says():
    from kvlayout import _arrays, _native

    base = np.arange(4 * 6 * 8, dtype=np.float16).reshape(4, 6, 8)
    arrays = [
        base,
        base[:, 1:5],
        base[::2, :, ::-1],
        base.transpose(2, 0, 1),
        base[:, :1, :],
        np.zeros(0),
        np.zeros((3, 0, 2), np.int32),
        np.zeros((1, 5), ml_dtypes.bfloat16),
        np.zeros((2, 3), ml_dtypes.float8_e4m3fn)[:, ::2],
        np.zeros(7, np.uint8)[1:].view(np.int8),
        np.ones((), np.float32),
    ]
    readonly = base.copy()
    readonly.flags.writeable = False
    arrays.append(readonly)
    for a in arrays:
        native = tuple(tuple(x) if isinstance(x, list) else x for x in _native._read_ndarray(a))
        assert native == _arrays._fields(a), (a.shape, a.strides)
    # left to describe: strides that are not whole elements, a foreign byte order, a type
    # kvlayout does not name, a subclass
    odd = np.zeros(9, np.uint8)[1:].view(np.float16)[:3]
    assert _native._read_ndarray(np.lib.stride_tricks.as_strided(odd, (2,), (3,))) is None
    assert _native._read_ndarray(np.zeros(3, ">f4")) is None
    assert _native._read_ndarray(np.zeros(3, np.complex64)) is None
    assert _native._read_ndarray(np.ma.zeros(3)) is None


def test_as_view_of_an_ndarray_subclass_stays_in_its_allocation():
    layout = kvlayout.Layout("kv B=2 N=4 H=1 D=4 dtype=f16 order=NHD")
    buf = np.zeros(layout.buffer_bytes[0], np.uint8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PendingDeprecationWarning)
        matrix = buf.view(np.matrix)  # (1, n): its reshape and slices stay 2-D
    v = layout.as_view(matrix, "v")
    v[...] = 7
    assert np.shares_memory(v, buf) and buf.view(np.float16).max() == 7
    start = buf.__array_interface__["data"][0]
    assert start <= v.__array_interface__["data"][0] < start + buf.nbytes


def test_the_native_reader_leaves_huge_spans_to_describe():
    from kvlayout import _native

    huge = np.lib.stride_tricks.as_strided(np.zeros(1), shape=(4,), strides=(2**62,))
    assert _native._read_ndarray(huge) is None
    with pytest.raises(errors.ArrayError):
        kvlayout.describe(huge)


def test_cuda_interface_over_pinned_host_memory_is_host_memory():
    host = np.zeros(8, np.float32)

    class Pinned:
        __cuda_array_interface__ = {
            "data": (host.__array_interface__["data"][0], False),
            "shape": (8,),
            "typestr": "<f4",
            "version": 3,
        }

        def __dlpack_device__(self):
            return (3, 0)  # kDLCUDAHost

    assert kvlayout.describe(Pinned()).device == "cpu"
