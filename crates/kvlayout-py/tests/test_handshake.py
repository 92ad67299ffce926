"""The connector's handshake from Python: round trips of a TP rank's group over real numpy
allocations; the wire format read and written by hand (header with ``struct``, body with
``json``, compatibility hash with ``hashlib``), so that bytes agree with the Rust encoding
independently of it; compatibility; region bounds; every refusal as its own typed
exception with its values; and seeded garbage that only ever raises such an exception."""

import doctest
import hashlib
import json
import random
import struct

import numpy as np
import pytest

import kvlayout
import kvlayout.handshake
from kvlayout import errors
from kvlayout.handshake import CacheGroup, MemRegion, PeerMetadata, check_compatible

#: Rank 0 or 1 of TP 2 of Llama-3-8B: 4 of its 8 KV heads, 4 blocks.
RANK_SPEC = "llama-3-8b B=4 H=4"
#: Separate K and V allocations: two buffers.
SEPARATE = "kv L=2 B=3 N=4 H=4 D=16 dtype=f16 tensor=separate-hnd"


def allocate(layout):
    """One zeroed numpy allocation per buffer of ``layout``, and its regions."""
    arrays = [np.zeros(n, dtype=np.uint8) for n in layout.buffer_bytes]
    regions = [MemRegion(a.__array_interface__["data"][0], a.nbytes) for a in arrays]
    return arrays, regions


def group_of(spec, total, tp_size, tp_rank, name="attn"):
    """A group of the layout ``spec`` with regions over fresh numpy allocations."""
    layout = kvlayout.Layout(spec)
    arrays, regions = allocate(layout)
    return CacheGroup(name, layout, total, tp_size, tp_rank, regions), arrays


def frame(body, version=1, reserved=0, length=None):
    """The 12-byte header (magic, version, reserved, body length; little-endian) + body."""
    n = len(body) if length is None else length
    return struct.pack("<4sHHI", b"KVLH", version, reserved, n) + body


def body_of(data):
    """The JSON body of an encoding, parsed."""
    return json.loads(data[12:])


def reframed(peer, edit):
    """``peer``'s encoding with its body edited by ``edit`` (a function of the dict)."""
    body = body_of(peer.encode())
    edit(body)
    return frame(json.dumps(body).encode())


def f32_bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def compat_text_of(doc, total_kv_heads):
    """The canonical compatibility text, built from a layout's JSON document as the Rust
    module docs (kvlayout-connector handshake/compat.rs) describe it."""
    content, geometry = doc["content"], doc["geometry"]
    lines = ["kvlayout-compat v1", f"content={content['kind']}"]
    lines += [f"{k}={v}" for k, v in content.items() if k != "kind"]
    lines += [
        f"dtype={doc['dtype']}",
        f"k_scale={f32_bits(doc['scales']['k_scale']):08x}",
        f"v_scale={f32_bits(doc['scales']['v_scale']):08x}",
        f"num_layers={geometry['num_layers']}",
        f"total_kv_heads={total_kv_heads}",
        f"tokens_per_state={geometry['tokens_per_state']}",
    ]
    return "".join(line + "\n" for line in lines)


def raises(cls, data, **limits):
    """Decodes ``data`` expecting exactly ``cls``; returns the exception."""
    with pytest.raises(cls) as e:
        PeerMetadata.decode(data, **limits)
    assert type(e.value) is cls
    assert isinstance(e.value, errors.HandshakeError)
    return e.value


def test_module_docstring_example_runs():
    result = doctest.testmod(kvlayout.handshake, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 8
    assert result.failed == 0


def test_constants_are_the_rust_ones():
    assert kvlayout.handshake.MAGIC == b"KVLH"
    assert kvlayout.handshake.VERSION == 1
    assert kvlayout.handshake.HEADER_BYTES == 12
    assert kvlayout.handshake.DEFAULT_LIMITS == {
        "max_body_bytes": 1 << 20,
        "max_groups": 64,
        "max_tp": 1024,
        "max_name_bytes": 256,
    }


def test_tp2_ranks_round_trip_with_numpy_regions():
    layout = kvlayout.Layout(RANK_SPEC)
    assert layout.num_kv_heads == 4
    # 32 layers x 4 blocks x 16 tokens x 4 heads x (K 128 + V 128) bf16
    assert layout.buffer_bytes == [32 * 4 * 16 * 4 * 256 * 2]
    # `keep` holds the allocations alive while their addresses are in use.
    groups, keep = [], []
    for rank in (0, 1):
        g, arrays = group_of(RANK_SPEC, 8, 2, rank, name=f"attn{rank}")
        keep.append(arrays)
        groups.append(g)
        assert (g.name, g.total_kv_heads, g.tp_size, g.tp_rank) == (f"attn{rank}", 8, 2, rank)
        assert g.layout == layout
        assert g.head_range() == (4 * rank, 4 * rank + 4)
        region = g.regions[0]
        assert region.base == arrays[0].__array_interface__["data"][0]
        assert region.len == arrays[0].nbytes == 4194304
    peer = PeerMetadata("prefill-0", groups)
    peer.validate()
    data = peer.encode()
    assert isinstance(data, bytes)
    back = PeerMetadata.decode(data)
    assert back == peer
    assert back.engine_id == "prefill-0"
    assert back.groups == groups
    assert back.encode() == data
    assert PeerMetadata.decode(bytearray(data)) == peer
    assert repr(back).startswith('PeerMetadata(engine_id="prefill-0", groups=[CacheGroup(')
    assert MemRegion(16, 32) == MemRegion(16, 32)
    assert len({MemRegion(16, 32), MemRegion(16, 32), MemRegion(16, 33)}) == 2


def test_rust_encoding_read_by_hand():
    """What a Python connector without kvlayout reads from bytes the Rust encoder wrote."""
    g, arrays = group_of(RANK_SPEC, 8, 2, 1)
    data = PeerMetadata("prefill-0", [g]).encode()
    magic, version, reserved, length = struct.unpack_from("<4sHHI", data)
    assert (magic, version, reserved, length) == (b"KVLH", 1, 0, len(data) - 12)
    body = json.loads(data[12:].decode("utf-8"))
    assert list(body) == ["engine_id", "groups"]
    assert body["engine_id"] == "prefill-0"
    (wire,) = body["groups"]
    assert sorted(wire) == sorted(
        ["name", "layout", "total_kv_heads", "tp_size", "tp_rank", "regions", "compat_hash"]
    )
    assert (wire["name"], wire["total_kv_heads"], wire["tp_size"], wire["tp_rank"]) == (
        "attn",
        8,
        2,
        1,
    )
    assert wire["regions"] == [
        {"base": arrays[0].__array_interface__["data"][0], "len": arrays[0].nbytes}
    ]
    doc = json.loads(wire["layout"])
    assert doc["version"] == 2
    assert doc["geometry"] == {
        "num_layers": 32,
        "num_blocks": 4,
        "block_size": 16,
        "num_kv_heads": 4,
        "tokens_per_state": 1,
    }
    assert doc["content"] == {"kind": "kv", "head_size": 128, "head_size_v": 128}
    assert doc["dtype"] == "bf16"
    assert kvlayout.Layout.from_json(wire["layout"]) == g.layout
    text = compat_text_of(doc, 8)
    assert text == (
        "kvlayout-compat v1\ncontent=kv\nhead_size=128\nhead_size_v=128\ndtype=bf16\n"
        "k_scale=3f800000\nv_scale=3f800000\nnum_layers=32\ntotal_kv_heads=8\n"
        "tokens_per_state=1\n"
    )
    assert g.compat_text() == text
    assert wire["compat_hash"] == g.compat_hash() == hashlib.sha256(text.encode()).hexdigest()


def hand_layout_doc():
    """A layout's JSON document written by hand: 2 of 4 heads, f16, k_scale 0.5."""
    return {
        "version": 1,
        "geometry": {
            "num_layers": 2,
            "num_blocks": 3,
            "block_size": 16,
            "num_kv_heads": 2,
            "tokens_per_state": 1,
        },
        "content": {"kind": "kv", "head_size": 8, "head_size_v": 8},
        "dtype": "f16",
        "scales": {"k_scale": 0.5, "v_scale": 1.0},
        "placement": {"kind": "paged", "order": "LBNHC", "base_offset": 0, "alignment": 1},
    }


def test_bytes_written_by_hand_decode():
    """Bytes a Python connector builds without kvlayout (struct, json, hashlib) decode."""
    doc = hand_layout_doc()
    cache = np.zeros(2 * 3 * 16 * 2 * (8 + 8) * 2, dtype=np.uint8)
    base = cache.__array_interface__["data"][0]
    text = compat_text_of(doc, 4)
    group = {
        "compat_hash": hashlib.sha256(text.encode()).hexdigest(),
        "tp_rank": 1,
        "tp_size": 2,
        "total_kv_heads": 4,
        "regions": [{"len": cache.nbytes, "base": base}],
        "layout": json.dumps(doc),
        "name": "attn",
    }
    body = json.dumps({"groups": [group], "engine_id": "py-decode-3"}, indent=1).encode()
    peer = PeerMetadata.decode(frame(body))
    layout = kvlayout.Layout("kv L=2 B=3 N=16 H=2 D=8 dtype=f16 order=NHD k_scale=0.5")
    assert layout.buffer_bytes == [cache.nbytes]
    expected = CacheGroup("attn", layout, 4, 2, 1, [MemRegion(base, cache.nbytes)])
    assert peer == PeerMetadata("py-decode-3", [expected])
    (g,) = peer.groups
    assert g.compat_text() == text
    assert g.head_range() == (2, 4)
    assert g.check_region(0, 100, 28) == base + 100
    # The same group with a hash of other covered fields (v_scale) is refused.
    group["compat_hash"] = hashlib.sha256(text.replace("v_scale=3f800000", "v_scale=0").encode())
    group["compat_hash"] = group["compat_hash"].hexdigest()
    body = json.dumps({"engine_id": "py-decode-3", "groups": [group]}).encode()
    e = raises(errors.HandshakeHashMismatchError, frame(body))
    assert (e.group, e.carried) == (0, group["compat_hash"])
    assert e.computed == hashlib.sha256(text.encode()).hexdigest()


def test_check_compatible_agrees_and_names_the_dtype():
    rank, _ = group_of(RANK_SPEC, 8, 2, 1)
    # The whole model at TP 1 with other blocks and order: the planner reconciles those.
    full, _ = group_of("llama-3-8b B=2 N=32 order=HND", 8, 1, 0)
    assert check_compatible(rank, full) is None
    assert rank.compat_hash() == full.compat_hash()
    fp8, _ = group_of(RANK_SPEC + " dtype=fp8_e4m3", 8, 2, 1)
    with pytest.raises(errors.HandshakeIncompatibleError) as e:
        check_compatible(rank, fp8)
    assert (e.value.field, e.value.local, e.value.remote) == ("dtype", "bf16", "fp8_e4m3")
    assert "dtype: bf16 vs fp8_e4m3" in str(e.value)
    assert e.value.kind == "HandshakeError::Incompatible"
    assert isinstance(e.value, errors.KvLayoutError) and isinstance(e.value, ValueError)
    assert rank.compat_hash() != fp8.compat_hash()


def test_check_region_bounds_a_transfer():
    g, arrays = group_of(SEPARATE, 4, 1, 0)
    k, v = (a.__array_interface__["data"][0] for a in arrays)
    n = arrays[1].nbytes
    assert g.layout.num_buffers == 2
    assert g.check_region(1, 0, n) == v
    assert g.check_region(0, 100, 28) == k + 100
    assert g.check_region(1, n, 0) == v + n
    with pytest.raises(errors.HandshakeOutsideRegionError) as e:
        g.check_region(1, n - 1, 2)
    assert (e.value.buffer, e.value.offset, e.value.len, e.value.region_len) == (1, n - 1, 2, n)
    with pytest.raises(errors.HandshakeOutsideRegionError) as e:
        g.check_region(0, 2**64 - 1, 2)
    assert (e.value.offset, e.value.len) == (2**64 - 1, 2)
    with pytest.raises(errors.HandshakeNoSuchBufferError) as e:
        g.check_region(2, 0, 1)
    assert (e.value.buffer, e.value.buffers) == (2, 2)


def test_header_refusals():
    g, _ = group_of(RANK_SPEC, 8, 2, 0)
    good = PeerMetadata("prefill-0", [g]).encode()
    actual = len(good) - 12
    for n in (0, 3, 5, 8, 11):
        e = raises(errors.HandshakeTooShortError, good[:n])
        assert (e.len, e.needed) == (n, 12)
    e = raises(errors.HandshakeBadMagicError, b"X" + good[1:])
    assert (e.got, e.expected) == (b"XVLH", b"KVLH")
    e = raises(errors.HandshakeUnsupportedVersionError, frame(good[12:], version=2))
    assert (e.got, e.supported) == (2, 1)
    e = raises(errors.HandshakeReservedNonZeroError, frame(good[12:], reserved=7))
    assert e.got == 7
    e = raises(errors.HandshakeBodyTooLargeError, frame(b"", length=2**32 - 1))
    assert (e.len, e.limit) == (2**32 - 1, 1 << 20)
    e = raises(errors.HandshakeBodyTooLargeError, good, max_body_bytes=100)
    assert (e.len, e.limit) == (actual, 100)
    e = raises(errors.HandshakeLengthMismatchError, good + b" ")
    assert (e.declared, e.actual) == (actual, actual + 1)
    e = raises(errors.HandshakeLengthMismatchError, good[:-1])
    assert (e.declared, e.actual) == (actual, actual - 1)


def test_body_and_count_refusals():
    g, _ = group_of(RANK_SPEC, 8, 2, 0)
    peer = PeerMetadata("prefill-0", [g])
    for body in (b"{not json", b"", b"[]", b'{"engine_id": 5, "groups": []}', b"\xff\xfe"):
        e = raises(errors.HandshakeJsonError, frame(body))
        assert e.message and str(e) == f"handshake body: {e.message}"
    e = raises(errors.HandshakeJsonError, reframed(peer, lambda b: b["groups"][0].update(x=1)))
    assert "unknown field `x`" in e.message
    raises(errors.HandshakeNoGroupsError, PeerMetadata("prefill-0", []).encode())
    many = [CacheGroup(f"g{i}", g.layout, 8, 2, 0, g.regions) for i in range(65)]
    e = raises(errors.HandshakeTooManyGroupsError, PeerMetadata("p", many).encode())
    assert (e.count, e.limit) == (65, 64)
    assert len(PeerMetadata.decode(PeerMetadata("p", many[:64]).encode()).groups) == 64
    three = PeerMetadata("p", many[:3]).encode()
    e = raises(errors.HandshakeTooManyGroupsError, three, max_groups=2)
    assert (e.count, e.limit) == (3, 2)
    e = raises(errors.HandshakeEmptyNameError, PeerMetadata("", [g]).encode())
    assert e.what == "engine id"
    e = raises(errors.HandshakeNameTooLongError, PeerMetadata("e" * 257, [g]).encode())
    assert (e.what, e.len, e.limit) == ("engine id", 257, 256)
    e = raises(errors.HandshakeNameTooLongError, peer.encode(), max_name_bytes=4)
    assert (e.what, e.len, e.limit) == ("engine id", 9, 4)
    unnamed = CacheGroup("", g.layout, 8, 2, 0, g.regions)
    e = raises(errors.HandshakeEmptyNameError, PeerMetadata("é" * 128, [unnamed]).encode())
    assert e.what == "group 0 name"
    e = raises(errors.HandshakeDuplicateGroupError, PeerMetadata("p", [g, g]).encode())
    assert (e.name, e.first, e.second) == ("attn", 0, 1)
    bare = CacheGroup("attn", g.layout, 8, 2, 0)
    assert bare.regions == []
    e = raises(errors.HandshakeRegionCountError, PeerMetadata("p", [bare]).encode())
    assert (e.group, e.count, e.buffers) == (0, 0, 1)


def edit_layout(key, field, value):
    """An edit of group 0's layout document: ``doc[key][field] = value``."""

    def edit(body):
        doc = json.loads(body["groups"][0]["layout"])
        doc[key][field] = value
        body["groups"][0]["layout"] = json.dumps(doc)

    return edit


def test_layout_tp_and_head_refusals():
    g, _ = group_of(RANK_SPEC, 8, 2, 0)
    peer = PeerMetadata("p", [g])
    no_heads = reframed(peer, edit_layout("geometry", "num_kv_heads", 0))
    e = raises(errors.HandshakeLayoutError, no_heads)
    assert (e.group, e.source) == (0, "num_kv_heads must be at least 1, got 0")
    assert type(e.__cause__) is errors.ZeroSizeError and e.__cause__.what == "num_kv_heads"

    def rank(total, tp_size, tp_rank, spec=RANK_SPEC):
        group, _ = group_of(spec, total, tp_size, tp_rank)
        return PeerMetadata("p", [group])

    e = raises(errors.HandshakeTpSizeError, rank(8, 0, 0).encode())
    assert (e.group, e.tp_size, e.limit) == (0, 0, 1024)
    e = raises(errors.HandshakeTpSizeError, rank(8, 2048, 0).encode())
    assert (e.tp_size, e.limit) == (2048, 1024)
    e = raises(errors.HandshakeTpSizeError, rank(8, 2, 0).encode(), max_tp=1)
    assert (e.tp_size, e.limit) == (2, 1)
    e = raises(errors.HandshakeTpRankError, rank(8, 2, 2).encode())
    assert (e.group, e.tp_rank, e.tp_size) == (0, 2, 2)
    e = raises(errors.HandshakeZeroTotalHeadsError, rank(0, 2, 0).encode())
    assert e.group == 0
    e = raises(errors.HandshakeTpSplitRefusedError, rank(8, 3, 0).encode())
    assert (e.group, e.total_kv_heads, e.tp_size) == (0, 8, 3) and e.reason
    # The whole model's 8 heads presented as one rank of two.
    whole = rank(8, 2, 1, spec="llama-3-8b B=4")
    e = raises(errors.HandshakeHeadsMismatchError, whole.encode())
    assert (e.group, e.held, e.expected, e.total_kv_heads, e.tp_size, e.tp_rank) == (
        0, 8, 4, 8, 2, 1,
    )
    # validate() refuses what decode refuses, with the same class and values.
    with pytest.raises(errors.HandshakeHeadsMismatchError) as v:
        whole.validate()
    assert v.value.fields == e.fields
    with pytest.raises(errors.HandshakeTpSizeError) as v:
        rank(8, 2, 0).validate(max_tp=1)
    assert (v.value.tp_size, v.value.limit) == (2, 1)


def test_region_refusals():
    (span,) = kvlayout.Layout(RANK_SPEC).buffer_bytes

    def rank0(*regions):
        group = CacheGroup("attn", kvlayout.Layout(RANK_SPEC), 8, 2, 0, list(regions))
        return PeerMetadata("p", [group])

    def separate(*regions):
        group = CacheGroup("kv", kvlayout.Layout(SEPARATE), 4, 1, 0, list(regions))
        return PeerMetadata("p", [group])

    e = raises(errors.HandshakeRegionTooSmallError, rank0(MemRegion(1 << 40, span - 2)).encode())
    assert (e.group, e.buffer, e.len, e.needed) == (0, 0, span - 2, span)
    e = raises(errors.HandshakeRegionOverflowError, rank0(MemRegion(2**64 - 1, span)).encode())
    assert (e.group, e.buffer, e.base, e.len) == (0, 0, 2**64 - 1, span)
    # V's region starts one byte before K's ends.
    n = kvlayout.Layout(SEPARATE).buffer_bytes[0]
    k, v = MemRegion(1 << 40, n), MemRegion((1 << 40) + n - 1, n)
    e = raises(errors.HandshakeRegionsOverlapError, separate(k, v).encode())
    assert (e.group, e.first, e.first_base, e.first_len) == (0, 0, 1 << 40, n)
    assert (e.second, e.second_base, e.second_len) == (1, (1 << 40) + n - 1, n)
    adjacent = separate(k, MemRegion((1 << 40) + n, n))
    assert PeerMetadata.decode(adjacent.encode()) == adjacent
    # A carried hash that is not the group's.
    good = rank0(MemRegion(1 << 40, span))
    e = raises(
        errors.HandshakeHashMismatchError,
        reframed(good, lambda b: b["groups"][0].update(compat_hash="00")),
    )
    assert (e.group, e.carried, e.computed) == (0, "00", good.groups[0].compat_hash())


def test_every_variant_has_its_own_class():
    base = errors.HandshakeError
    kinds = {
        name: cls.kind
        for name, cls in vars(errors).items()
        if isinstance(cls, type) and issubclass(cls, base) and cls is not base
    }
    assert len(kinds) == 27
    assert len(set(kinds.values())) == 27
    for name, kind in kinds.items():
        assert kind == "HandshakeError::" + name[len("Handshake"):-len("Error")]
        assert name in errors.__all__


NUMBERS = [b"18446744073709551615", b"18446744073709551616", b"0", b"-1", b"1e308", b"3.5"]


def mutate(rng, data):
    """One random change to ``data``: a bit flip, an insert, a delete, a cut, a number."""
    data = bytearray(data)
    choice = rng.randrange(5)
    at = rng.randrange(len(data) + 1)
    if choice == 0 and data:
        data[at % len(data)] ^= 1 << rng.randrange(8)
    elif choice == 1:
        data.insert(at, rng.randrange(256))
    elif choice == 2 and data:
        del data[at % len(data)]
    elif choice == 3:
        del data[at:]
    else:
        runs = [i for i in range(12, len(data)) if chr(data[i]).isdigit()]
        if runs:
            i = rng.choice(runs)
            data[i : i + 1] = rng.choice(NUMBERS)
    return bytes(data)


def test_garbage_never_crashes_and_is_always_typed():
    rng = random.Random(20240528)
    g, _ = group_of(SEPARATE, 4, 1, 0)
    seeds = [PeerMetadata("p", [g]).encode(), frame(b"{}"), b"KVLH\x01\x00\x00\x00"]
    seen, accepted = set(), 0
    for i in range(3000):
        if i % 3 == 0:
            data = bytes(rng.randrange(256) for _ in range(rng.randrange(40)))
            if rng.random() < 0.5:
                data = b"KVLH\x01\x00\x00\x00" + data
        else:
            data = rng.choice(seeds)
            for _ in range(rng.randrange(1, 4)):
                data = mutate(rng, data)
            if i % 3 == 1 and len(data) >= 12:
                # The body changed and the header's length kept true: the body's checks run.
                data = frame(data[12:])
        try:
            peer = PeerMetadata.decode(data)
        except errors.HandshakeError as e:
            assert type(e) is not errors.HandshakeError
            assert e.kind.startswith("HandshakeError::")
            seen.add(type(e).__name__)
        else:
            accepted += 1
            assert PeerMetadata.decode(peer.encode()) == peer
    assert accepted > 0
    assert len(seen) >= 10, seen
