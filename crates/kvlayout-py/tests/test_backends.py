"""The backends on arrays the caller owns: write_kv, paged_decode and the block movers,
checked against an f64 attention computed in numpy from the inputs alone (no layout)."""

import time

import numpy as np
import pytest

import kvlayout
from kvlayout import errors

SPECS = [
    "kv L=2 B=6 N=16 H=4 D=8 dtype=f16 order=NHD",
    "kv L=2 B=6 N=16 H=4 D=8 dtype=f16 order=HND",
    "kv L=2 B=6 N=16 H=4 D=8 dtype=f32 order=BLHNC",
]
HOST = ["cpu", "reference"]
ALL = HOST + ["cuda-emu", "hip-emu"]

# Two sequences of 20 and 33 tokens over distinct blocks (the table's rows padded with 0).
TABLE = np.array([[4, 1, 0], [0, 5, 2]], dtype=np.int32)
LENS = np.array([20, 33], dtype=np.uint32)


def workload(layout, seed=0):
    rng = np.random.default_rng(seed)
    n, h, d = layout.block_size, layout.num_kv_heads, layout.kv_widths[0]
    slots = []
    for s, length in enumerate(LENS):
        slots += [TABLE[s][t // n] * n + t % n for t in range(length)]
    slots = np.array(slots, dtype=np.int64)
    key = rng.standard_normal((len(slots), h, d)).astype(np.float32)
    value = rng.standard_normal((len(slots), h, d)).astype(np.float32)
    query = rng.standard_normal((len(LENS), 2 * h, d)).astype(np.float32)
    return slots, key, value, query


def expected_decode(layout, key, value, query):
    """Attention over each sequence's tokens in f64, keys and values rounded to the cache's
    dtype as the write stores them."""
    store = np.float16 if layout.dtype == "f16" else np.float32
    k = key.astype(store).astype(np.float64)
    v = value.astype(store).astype(np.float64)
    scale = 1.0 / np.sqrt(k.shape[-1])
    out = np.zeros((len(LENS), query.shape[1], v.shape[-1]))
    first = 0
    for s, length in enumerate(LENS):
        ks, vs = k[first : first + length], v[first : first + length]
        for qh in range(query.shape[1]):
            kv = qh // (query.shape[1] // k.shape[1])
            logits = ks[:, kv, :] @ query[s, qh].astype(np.float64) * scale
            p = np.exp(logits - logits.max())
            out[s, qh] = (p / p.sum()) @ vs[:, kv, :]
        first += length
    return out


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("name", ALL)
def test_write_then_decode_matches_numpy(spec, name):
    be = kvlayout.open(name, threads=2)
    layout = kvlayout.Layout(spec)
    cache = kvlayout.Cache.zeros(layout)
    slots, key, value, query = workload(layout)
    be.write_kv(cache, key, value, slots, layer=1)
    out = be.paged_decode(cache, query, TABLE, LENS, layer=1)
    assert out.shape == (2, 8, 8) and out.dtype == np.float32
    np.testing.assert_allclose(out, expected_decode(layout, key, value, query), atol=2e-3)


@pytest.mark.parametrize("name", ALL)
def test_write_is_in_place_at_the_layout_offsets(name):
    layout = kvlayout.Layout(SPECS[1])
    cache = kvlayout.Cache.zeros(layout)
    slots, key, value, _ = workload(layout)
    buffer = cache.buffers[0]
    address = buffer.__array_interface__["data"][0]
    kvlayout.open(name).write_kv(cache, key, value, slots, layer=0)
    assert cache.buffers[0].__array_interface__["data"][0] == address
    # token 21 is sequence 1's token 1: block 0, slot 1
    t, head = 21, 3
    _, at = layout.offset("v", layer=0, block=0, head=head, slot=1, dim=0)
    stored = buffer[at : at + 16].view(np.float16).astype(np.float32)
    np.testing.assert_array_equal(stored, value[t, head].astype(np.float16).astype(np.float32))
    _, other_layer = layout.offset("v", layer=1, block=0, head=head, slot=1, dim=0)
    assert not buffer[other_layer : other_layer + 16].any()


@pytest.mark.parametrize("name", ALL)
def test_movers_move_whole_blocks(name):
    be = kvlayout.open(name)
    nhd, hnd = kvlayout.Layout(SPECS[0]), kvlayout.Layout(SPECS[1])
    a = kvlayout.Cache.zeros(nhd)
    slots, key, value, query = workload(nhd)
    be.write_kv(a, key, value, slots, layer=1)
    # convert to head-major pages: the same decode
    b = kvlayout.Cache.zeros(hnd)
    be.convert(a, b)
    want = be.paged_decode(a, query, TABLE, LENS, layer=1)
    np.testing.assert_array_equal(be.paged_decode(b, query, TABLE, LENS, layer=1), want)
    # copy blocks 4 and 1 (sequence 0) to 3 and 0 is seen by a table naming 3 and 0
    c = kvlayout.Cache.zeros(nhd)
    be.swap_blocks(a, c, [(4, 3), (1, 0)])
    table = np.array([[3, 0, 0]], dtype=np.int32)
    got = be.paged_decode(c, query[:1], table, LENS[:1], layer=1)
    np.testing.assert_array_equal(got, want[:1])
    be.copy_blocks(c, np.array([[3, 5]]))
    got = be.paged_decode(c, query[:1], [[5, 0, 0]], LENS[:1], layer=1)
    np.testing.assert_array_equal(got, want[:1])
    # gather heads 2..4 of blocks 5, 2 into a staging cache of two blocks and two heads,
    # scatter them back into a zeroed cache: those heads, those blocks, nothing else
    staging = kvlayout.Cache.zeros(kvlayout.Layout("kv L=2 B=2 N=16 H=2 D=8 dtype=f16 order=HND"))
    be.gather_blocks(a, [5, 2], (2, 4), staging)
    back = kvlayout.Cache.zeros(nhd)
    be.scatter_blocks(staging, [5, 2], (2, 4), back)
    for block in range(6):
        for head in range(4):
            _, at = nhd.offset("k", layer=1, block=block, head=head, slot=3)
            same = block in (5, 2) and head >= 2
            want_bytes = a.buffers[0][at : at + 16] if same else np.zeros(16, np.uint8)
            np.testing.assert_array_equal(back.buffers[0][at : at + 16], want_bytes)


def test_bad_indices_are_typed_and_write_nothing():
    be = kvlayout.open("cpu")
    layout = kvlayout.Layout(SPECS[0])
    cache = kvlayout.Cache.zeros(layout)
    slots, key, value, query = workload(layout)
    bad = slots.copy()
    bad[7] = 6 * 16
    with pytest.raises(errors.SlotOutOfRangeError) as e:
        be.write_kv(cache, key, value, bad)
    assert (e.value.token, e.value.slot, e.value.limit) == (7, 96, 96)
    assert not cache.buffers[0].any()
    bad[7] = bad[3]
    with pytest.raises(errors.DuplicateSlotError):
        be.write_kv(cache, key, value, bad)
    with pytest.raises(errors.ShapeError):
        be.write_kv(cache, key[:-1], value, slots)
    with pytest.raises(errors.ShapeError):
        be.write_kv(cache, key, value, slots.astype(np.float64))
    with pytest.raises(errors.BlockOutOfRangeError) as e:
        be.paged_decode(cache, query, [[4, 1, 0], [0, 5, 6]], LENS)
    assert (e.value.seq, e.value.position, e.value.block, e.value.limit) == (1, 2, 6, 6)
    with pytest.raises(errors.SequenceTooLongError):
        be.paged_decode(cache, query, TABLE, [20, 49])
    with pytest.raises(errors.OutOfRangeError):
        be.write_kv(cache, key, value, slots, layer=2)
    with pytest.raises(errors.BadPairError):
        be.copy_blocks(cache, [(0, -1)])
    assert not cache.buffers[0].any()


def test_memory_the_op_cannot_use_is_refused():
    be = kvlayout.open("cpu")
    layout = kvlayout.Layout(SPECS[0])
    cache = kvlayout.Cache.zeros(layout)
    slots, key, value, _ = workload(layout)
    short = kvlayout.Cache(layout, [cache.buffers[0][:-1]])
    with pytest.raises(errors.BufferTooShortError):
        be.write_kv(short, key, value, slots)
    readonly = cache.buffers[0].copy()
    readonly.flags.writeable = False
    with pytest.raises(errors.ArrayError, match="read-only"):
        be.write_kv(kvlayout.Cache(layout, [readonly]), key, value, slots)
    # a key that is the cache's own memory
    inside = cache.buffers[0][: key.nbytes].view(np.float32).reshape(key.shape)
    with pytest.raises(errors.ArrayError, match="overlaps"):
        be.write_kv(cache, inside, value, slots)
    with pytest.raises(errors.ArrayError, match="contiguous"):
        be.write_kv(cache, np.asfortranarray(key), value, slots)
    with pytest.raises((errors.ShapeError, errors.ArrayError), match="float64|f64"):
        be.write_kv(cache, key.astype(np.float64), value, slots)
    assert not cache.buffers[0].any()


def test_open_names_and_refusals():
    assert "reference" in kvlayout.backend_names()
    assert kvlayout.open("reference").memory == "host"
    assert kvlayout.open("cuda-emu").memory == "device"
    assert kvlayout.open("cpu", threads=1).kernels["threads"] == 1
    with pytest.raises(errors.UnknownBackendError) as e:
        kvlayout.open("gpu")
    assert e.value.name == "gpu"
    try:
        kvlayout.open("cuda:0")
    except errors.BackendUnavailableError as e:
        assert e.name == "cuda:0" and e.reason
        pytest.skip(f"skipped: no CUDA device: {e.reason}")


def test_empty_calls_run_and_check_what_they_can():
    be = kvlayout.open("cpu")
    layout = kvlayout.Layout(SPECS[0])
    cache = kvlayout.Cache.zeros(layout)
    empty = np.zeros((0, 4, 8), np.float32)
    be.write_kv(cache, empty, empty, np.zeros(0, np.int64))
    out = be.paged_decode(cache, np.zeros((0, 8, 8), np.float32), np.zeros((0, 3), np.int32), [])
    assert out.shape == (0, 8, 8)
    assert not cache.buffers[0].any()


def test_arguments_that_are_no_cache_or_index_are_typed():
    be = kvlayout.open("cpu")
    layout = kvlayout.Layout(SPECS[0])
    cache = kvlayout.Cache.zeros(layout)
    slots, key, value, query = workload(layout)
    with pytest.raises(errors.ArrayError, match="kvlayout.Cache"):
        be.write_kv(object(), key, value, slots)
    with pytest.raises(errors.OutOfRangeError) as e:
        be.write_kv(cache, key, value, slots, layer=-1)
    assert (e.value.axis, e.value.value, e.value.limit) == ("layer", -1, 2)
    with pytest.raises(errors.ShapeError, match="query"):
        be.paged_decode(cache, query, TABLE, LENS, num_q_heads=2**40)
    with pytest.raises(errors.OutOfRangeError):
        be.paged_decode(cache, query, TABLE, LENS, layer=-3)


def test_a_call_on_memory_another_call_writes_is_refused_reads_share():
    import threading

    layout = kvlayout.Layout("kv L=1 B=512 N=16 H=8 D=128 dtype=f16 order=NHD")
    cache = kvlayout.Cache.zeros(layout)
    table = np.arange(512, dtype=np.int32).reshape(8, 64)
    lens = np.full(8, 1024, np.uint32)
    query = np.ones((8, 32, 128), np.float32)
    slots = np.arange(16, dtype=np.int64)
    key = np.ones((16, 8, 128), np.float32)
    reference, cpu = kvlayout.open("reference"), kvlayout.open("cpu")
    # the reference fills the whole cache (a second or so) while this thread decodes
    long_slots = np.arange(512 * 16, dtype=np.int64)
    long_key = np.ones((512 * 16, 8, 128), np.float32)
    outcome = {}

    def write_all():
        reference.write_kv(cache, long_key, long_key, long_slots)
        outcome["done"] = True

    refused = read = 0
    t = threading.Thread(target=write_all)
    t.start()
    while t.is_alive():
        try:
            cpu.paged_decode(cache, query, table, lens)
            read += 1
        except errors.ArrayError as e:
            assert "another call running now writes" in str(e)
            refused += 1
        time.sleep(0.001)
    t.join()
    assert outcome.get("done") and refused > 0
    # two reads of one cache at once are fine
    out = {}
    readers = [
        threading.Thread(
            target=lambda i=i: out.setdefault(
                i, reference.paged_decode(cache, query[:2], table[:2], lens[:2])
            )
        )
        for i in range(2)
    ]
    for r in readers:
        r.start()
    for r in readers:
        r.join()
    np.testing.assert_array_equal(out[0], out[1])
    cpu.write_kv(cache, key, key, slots)  # free again once the calls are done


def test_dlpack_memory_lives_through_the_call():
    class Wrapper:
        """Exports a temporary copy of its array through DLPack: the capsule owns it."""

        def __init__(self, a):
            self.a = a

        def __dlpack__(self, **kw):
            return np.array(self.a).__dlpack__(**kw)

    layout = kvlayout.Layout("kv L=1 B=2 N=16 H=8 D=128 dtype=f16 order=NHD")
    big = np.zeros(64 << 20, np.uint8)
    big[: layout.buffer_bytes[0]] = 1
    # the copy the wrapper exports stays alive while the op reads and writes it
    kvlayout.open("cpu").copy_blocks(kvlayout.Cache(layout, [Wrapper(big)]), [(0, 1)])
