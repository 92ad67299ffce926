"""kvlayout.testing: the suite's generators reproduce from their seeds, the reference agrees
with attention computed in numpy from the inputs alone, and the harnesses pass kernels
written here in plain numpy against vLLM's paged v1 layout and catch their broken twins,
naming the spec and the seed that reproduces the failure."""

import numpy as np
import pytest

import kvlayout
import kvlayout.testing as kt
from kvlayout import errors


def f64(a):
    return np.asarray(a).astype(np.float32).astype(np.float64)


def attend(q, k, v, group, scale, soft_cap):
    """Attention of query heads ``q`` [qh, d] over tokens ``k`` [t, kvh, d], ``v`` [t, kvh,
    dv], query head ``qh`` reading KV head ``qh // group``."""
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    logits = np.einsum("hd,thd->ht", q, k) * scale
    if soft_cap is not None:
        logits = soft_cap * np.tanh(logits / soft_cap)
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    return np.einsum("ht,thd->hd", p / p.sum(axis=1, keepdims=True), v)


def paged_decode(tokens, query, block_table, seq_lens, scale, num_q_heads, heads, bs,
                 sliding_window, soft_cap):
    """Decode of each sequence over ``tokens(blocks)``: its K [t, H, D] and V [t, H, Dv]."""
    out = None
    for s, n in enumerate(seq_lens.tolist()):
        start = n - min(n, sliding_window) if sliding_window is not None else 0
        k, v = tokens(block_table[s, : -(-n // bs)])
        if out is None:
            out = np.zeros((len(seq_lens), num_q_heads, v.shape[2]), np.float32)
        if start < n:
            q = f64(query[s])
            out[s] = attend(q, k[start:n], v[start:n], num_q_heads // heads, scale, soft_cap)
    return out


def vllm_decode(query, key_cache, value_cache, block_table, seq_lens, scale, num_q_heads,
                *, sliding_window, soft_cap, k_scale, v_scale, swap_v=False):
    """Paged decode over vLLM's v1 layout: key [B, H, D/x, N, x], value [B, H, Dv, N]."""
    _, heads, _, bs, _ = key_cache.shape
    dv = value_cache.shape[2]

    def tokens(blocks):
        k = f64(key_cache[blocks]) * k_scale  # [nb, H, D/x, N, x]
        k = k.transpose(0, 3, 1, 2, 4).reshape(-1, heads, k.shape[2] * k.shape[4])
        v = f64(value_cache[blocks]) * v_scale  # [nb, H, Dv, N]
        if swap_v:
            # The bug: each block's value read as if it were [block_size, head_size].
            v = v.reshape(len(blocks), heads, bs, dv).transpose(0, 2, 1, 3)
        else:
            v = v.transpose(0, 3, 1, 2)
        return k, v.reshape(-1, heads, dv)

    return paged_decode(tokens, query, block_table, seq_lens, scale, num_q_heads, heads, bs,
                        sliding_window, soft_cap)


def standard_decode(query, key_cache, value_cache, block_table, seq_lens, scale, num_q_heads,
                    *, sliding_window, soft_cap, k_scale, v_scale):
    """Paged decode over the standard per-layer views: key [B, H, N, D], value [B, H, N, Dv]."""
    _, heads, bs, _ = key_cache.shape

    def tokens(blocks):
        k = f64(key_cache[blocks]).transpose(0, 2, 1, 3) * k_scale
        v = f64(value_cache[blocks]).transpose(0, 2, 1, 3) * v_scale
        return k.reshape(-1, heads, k.shape[3]), v.reshape(-1, heads, v.shape[3])

    return paged_decode(tokens, query, block_table, seq_lens, scale, num_q_heads, heads, bs,
                        sliding_window, soft_cap)


def vllm_decode_swapped_v(*args, **kw):
    """``vllm_decode`` reading V's [head_size, block_size] as [block_size, head_size]."""
    return vllm_decode(*args, **kw, swap_v=True)


def store(x, dtype):
    """f32 ``x`` in the cache's dtype: nearest; int8 half away from zero, saturating."""
    if dtype == np.int8:
        return np.clip(np.sign(x) * np.floor(np.abs(x) + 0.5), -127, 127).astype(np.int8)
    return x.astype(dtype)


def vllm_write(key, value, key_cache, value_cache, slot_mapping, *, k_scale, v_scale,
               chunks_swapped=False):
    """vLLM's reshape_and_cache into the v1 layout."""
    _, heads, dx, bs, x = key_cache.shape
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    b, n = slots // bs, slots % bs
    k = key[keep].astype(np.float32) / np.float32(k_scale)
    if chunks_swapped:
        # The bug: the head's D/x chunks of x taken x-major.
        k = k.reshape(len(slots), heads, x, dx).transpose(0, 1, 3, 2)
    key_cache[b, :, :, n, :] = store(k.reshape(len(slots), heads, dx, x), key_cache.dtype)
    if value is not None:  # None for MLA: the latent is the key
        v = value[keep].astype(np.float32) / np.float32(v_scale)
        value_cache[b, :, :, n] = store(v, value_cache.dtype)


def vllm_copy(key_caches, value_caches, block_mapping, layers=None):
    """vLLM's copy_blocks: every layer's K and V of block src to block dst."""
    src, dst = block_mapping[:, 0], block_mapping[:, 1]
    for k, v in list(zip(key_caches, value_caches))[:layers]:
        k[dst] = k[src]
        v[dst] = v[src]


def test_random_layouts_reproduce_from_their_seeds():
    first = list(kt.random_layouts(30, seed=5))
    assert [s for s, _ in first] == list(range(5, 35))
    assert first == list(kt.random_layouts(30, seed=5))
    for s, layout in first:
        assert layout == kvlayout._native.random_layout(s)
    # unfiltered draws include content write_kv refuses (Mamba states, opaque rows)
    assert not all(kt.is_decodable(l) for _, l in kt.random_layouts(60))


def test_random_layouts_filters():
    picked = list(kt.random_layouts(40, decodable=True, convention="vllm-paged-v1",
                                    inline_scales=False))
    seeds = [s for s, _ in picked]
    assert seeds == sorted(set(seeds)) and len(seeds) == 40
    for _, layout in picked:
        assert kvlayout._native.kv_ops_widths(layout) == layout.kv_widths
        assert "k_scale" not in layout.fields
        for layer in range(layout.num_layers):
            key = layout.view("vllm-paged-v1", "k", layer)
            assert len(key.shape) == 5 and len(layout.view("vllm-paged-v1", "v", layer).shape) == 4
    # the skipped seeds are the ones that fail a filter
    skipped = set(range(seeds[0], seeds[-1])) - set(seeds)
    for s in list(skipped)[:20]:
        l = kvlayout._native.random_layout(s)
        assert not (kt.is_decodable(l) and "k_scale" not in l.fields
                    and kt.has_views(l, "vllm-paged-v1"))
    assert {l.dtype for _, l in kt.random_layouts(10, dtypes={"f16"})} == {"f16"}
    with pytest.raises(ValueError, match="pass the filters"):
        next(kt.random_layouts(1, dtypes={"no-such-dtype"}))
    with pytest.raises(errors.UnknownNameError) as e:
        kt.check_decode(vllm_decode, convention="vllm")
    assert e.value.name == "vllm" and "vllm-paged-v1" in e.value.known


def token_slots(work, block_size):
    """The slot of each token of each sequence, from the block table alone."""
    return {
        (s, t): int(work.block_table[s, t // block_size]) * block_size + t % block_size
        for s, n in enumerate(work.seq_lens.tolist())
        for t in range(n)
    }


def test_workload_is_the_same_for_the_same_seed_and_consistent():
    for s, layout in kt.random_layouts(15, seed=100, decodable=True):
        a, b = kt.workload(layout, s), kt.workload(layout, s)
        for x, y in [(a.key, b.key), (a.value, b.value), (a.slot_mapping, b.slot_mapping),
                     (a.block_table, b.block_table), (a.seq_lens, b.seq_lens),
                     (a.query, b.query)]:
            if x is None:
                assert y is None
                continue
            assert x.dtype == y.dtype and np.array_equal(f64(x), f64(y))
        other = kt.workload(layout, s + 1)
        assert not (other.key.shape == a.key.shape and np.array_equal(f64(other.key), f64(a.key)))
        kw, vw = layout.kv_widths
        tokens, heads = len(a.slot_mapping), layout.num_kv_heads
        assert a.key.shape == (tokens, heads, kw)
        mla = layout.content == "mla"
        assert (a.value is None) if mla else (a.value.shape == (tokens, heads, vw))
        assert a.slot_mapping.dtype == np.int64 and a.block_table.dtype == np.int32
        assert a.seq_lens.dtype == np.uint32 and a.layer == layout.num_layers - 1
        # the real slots are exactly the sequences' tokens through the block table
        real = sorted(int(x) for x in a.slot_mapping if x >= 0)
        assert real == sorted(token_slots(a, layout.block_size).values())
        assert len(set(real)) == len(real) and real[-1] < layout.num_blocks * layout.block_size
        # groups 12 and 20 (above the GPU kernels' tile of 8) on layouts of one or two KV heads
        above_tile = ["gqa12", "gqa20+softcap"] if heads <= 2 else []
        assert [st.name for st in a.steps] == ["mha", "gqa4+window", "gqa2+softcap",
                                               "gqa8+window1+softcap"] + above_tile
        for st in a.steps:
            assert st.query.shape == (len(a.seq_lens), st.params.num_q_heads, kw)
            assert st.query.dtype == a.key.dtype


def test_workload_refusals_are_typed():
    mamba = next(l for _, l in kt.random_layouts(80) if not kt.is_decodable(l))
    with pytest.raises(errors.UnsupportedError):
        kt.workload(mamba, 0)
    layout = kvlayout.Layout("kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=NHD")
    with pytest.raises(errors.UnknownNameError) as e:
        kt.workload(layout, 0, activations="f64")
    assert e.value.name == "f64"
    assert kt.workload(layout, 0, activations="bf16").key.dtype.name == "bfloat16"


def numpy_decode(layout, work, step):
    """Attention in f64 from the workload's keys and values (rounded to the cache's dtype as
    the write stores them), found through the block table and slot mapping: no layout."""
    dtype = {"f32": np.float32, "f16": np.float16}.get(layout.dtype)
    if dtype is None:
        import ml_dtypes

        dtype = ml_dtypes.bfloat16
    k_scale, v_scale = kvlayout._native.tensor_scales(layout)
    token_of = {int(slot): i for i, slot in enumerate(work.slot_mapping) if slot >= 0}
    slots = token_slots(work, layout.block_size)
    st = work.steps[step]
    p = st.params
    out = np.zeros((len(work.seq_lens), p.num_q_heads, work.value.shape[2]))
    for s, n in enumerate(work.seq_lens.tolist()):
        start = n - min(n, p.sliding_window) if p.sliding_window is not None else 0
        if start == n:
            continue
        rows = [token_of[slots[s, t]] for t in range(start, n)]
        k = f64((work.key[rows].astype(np.float32) / np.float32(k_scale)).astype(dtype)) * k_scale
        v = f64((work.value[rows].astype(np.float32) / np.float32(v_scale)).astype(dtype)) * v_scale
        out[s] = attend(f64(st.query[s]), k, v, p.num_q_heads // layout.num_kv_heads, p.scale,
                        p.soft_cap)
    return out


def test_reference_decode_is_the_reference_backend_and_agrees_with_numpy():
    be = kvlayout.open("reference")
    done = 0
    for s, layout in kt.random_layouts(12, seed=7, decodable=True, inline_scales=False,
                                       dtypes={"f32", "f16", "bf16"}):
        if layout.content == "mla":
            continue
        work = kt.workload(layout, s)
        cache = kt.reference_cache(layout, work)
        for i, st in enumerate(work.steps):
            ref = kt.reference_decode(layout, cache, work, i)
            p = st.params
            out = be.paged_decode(cache, st.query, work.block_table, work.seq_lens,
                                  layer=work.layer, num_q_heads=p.num_q_heads, scale=p.scale,
                                  sliding_window=p.sliding_window, soft_cap=p.soft_cap)
            np.testing.assert_array_equal(ref.out, out)
            c = kt.compare_decode(numpy_decode(layout, work, i), ref)
            assert c.passed, (str(layout), st.name, c)
            # values lie in [-2, 2) times the scales
            largest = 2.0 * max(kvlayout._native.tensor_scales(layout))
            assert (ref.magnitudes[..., 0] <= largest).all()
            done += 1
    assert done >= 20


def test_compare_decode_flags_nan_far_values_and_shapes():
    layout = kvlayout.Layout("kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=NHD")
    work = kt.workload(layout, 3)
    ref = kt.reference_decode(layout, kt.reference_cache(layout, work), work, 0)
    assert kt.compare_decode(ref.out, ref).ratio == 0.0
    rel, per_logit = kt.decode_tolerance("f16")
    assert (rel, per_logit) == ref.tolerance and rel == pytest.approx(2 / 256 + 1e-5)
    got = ref.out.copy()
    got[1, 2, 3] += 3 * ref.bound()[1, 2, 3]
    c = kt.compare_decode(got, ref)
    assert not c.passed and c.index == (1, 2, 3) and c.ratio == pytest.approx(3, rel=1e-3)
    got[0, 0, 0] = np.nan
    c = kt.compare_decode(got, ref)
    assert not c.passed and c.ratio == np.inf and c.index == (0, 0, 0)
    with pytest.raises(errors.ShapeError):
        kt.compare_decode(ref.out[:, :2], ref)


def test_a_correct_vllm_decode_passes():
    checked = kt.check_decode(vllm_decode, count=50)
    assert len(checked) == 50
    specs = [spec for _, spec in checked]
    assert len({kvlayout.Layout(x).dtype for x in specs}) >= 4
    # vLLM's own legacy layout (x-split key) is among them, and so are other placements
    assert any("vllm-paged-v1" in x for x in specs) and not all("vllm-paged-v1" in x for x in specs)


def test_the_convention_picks_the_views_the_kernel_gets():
    checked = kt.check_decode(standard_decode, convention="standard", count=30, seed=500)
    assert len(checked) == 30
    # vLLM's x-split key has no standard view: those layouts are left out, not failed
    assert not any("tensor=vllm-paged-v1" in spec for _, spec in checked)
    seeds = range(checked[0][0], checked[-1][0])
    assert any("tensor=vllm-paged-v1" in str(kvlayout._native.random_layout(s)) for s in seeds)
    with pytest.raises(kt.HarnessFailure, match="raised ValueError"):
        kt.check_decode(vllm_decode, convention="standard", count=5)


def test_swapped_value_strides_are_caught_with_spec_and_seed():
    with pytest.raises(kt.HarnessFailure) as e:
        kt.check_decode(vllm_decode_swapped_v, count=50)
    f = e.value
    message = str(f)
    assert isinstance(f, AssertionError) and f.op == "check_decode"
    assert f"random layout seed {f.seed}" in message and f"spec: {f.spec}" in message
    assert "worst element out[" in message and f"count=1, seed={f.seed}" in message
    assert kvlayout.Layout(f.spec) == kvlayout._native.random_layout(f.seed)
    # the seed alone reproduces the same failure; the correct kernel passes there
    with pytest.raises(kt.HarnessFailure) as again:
        kt.check_decode(vllm_decode_swapped_v, count=1, seed=f.seed)
    assert (again.value.spec, again.value.seed, again.value.step, again.value.detail) == (
        f.spec, f.seed, f.step, f.detail)
    assert kt.check_decode(vllm_decode, count=1, seed=f.seed) == [(f.seed, f.spec)]


def test_kernel_exceptions_and_bad_outputs_are_failures():
    def raises(*args, **kw):
        raise IndexError("index 7 is out of bounds")

    with pytest.raises(kt.HarnessFailure, match="raised IndexError: index 7") as e:
        kt.check_decode(raises, count=1, seed=3)
    assert isinstance(e.value.__cause__, IndexError)
    with pytest.raises(kt.HarnessFailure, match="unusable output"):
        kt.check_decode(lambda q, *a, **kw: np.zeros((1, 1)), count=1)

    def writes_the_cache(q, key_cache, *args, **kw):
        key_cache[0] = 0

    with pytest.raises(kt.HarnessFailure, match="read-only"):
        kt.check_decode(writes_the_cache, count=1)


def test_write_harness_passes_vllm_write_and_catches_swapped_chunks():
    assert len(kt.check_write(vllm_write, count=50)) == 50
    with pytest.raises(kt.HarnessFailure) as e:
        kt.check_write(lambda *a, **kw: vllm_write(*a, **kw, chunks_swapped=True), count=50)
    f = e.value
    assert f.op == "check_write" and "reference" in f.detail and f"seed {f.seed}" in str(f)
    with pytest.raises(kt.HarnessFailure) as again:
        kt.check_write(lambda *a, **kw: vllm_write(*a, **kw, chunks_swapped=True), count=1,
                       seed=f.seed)
    assert (again.value.spec, again.value.detail) == (f.spec, f.detail)

    def writes_padding_too(key, value, key_cache, value_cache, slot_mapping, **kw):
        vllm_write(key, value, key_cache, value_cache, slot_mapping, **kw)
        key_cache[0, 0, 0, 0, 0] = key_cache.dtype.type(0) if key_cache.dtype != np.int8 else 0
        key_cache[-1, -1, -1, -1, -1] = store(np.float32([5.0]), key_cache.dtype)[0]

    with pytest.raises(kt.HarnessFailure):
        kt.check_write(writes_padding_too, count=20)


def test_move_harness_passes_vllm_copy_and_catches_a_missed_layer():
    assert len(kt.check_move(vllm_copy, count=30)) == 30
    where = r"buffer \d+ byte \d+ \([kv] layer [12] block \d+ head \d+ slot \d+ \[\d+\]\)"
    with pytest.raises(kt.HarnessFailure, match=where) as e:
        kt.check_move(lambda k, v, m: vllm_copy(k, v, m, layers=1), count=30)
    assert kvlayout.Layout(e.value.spec).num_layers > 1


def test_bad_arguments_are_typed():
    layout = kvlayout.Layout("kv L=2 B=3 N=16 H=4 D=8 dtype=f16 order=HND")
    work = kt.workload(layout, 1)
    cache = kt.reference_cache(layout, work)
    other = kvlayout.Cache.zeros(kvlayout.Layout("kv L=2 B=3 N=16 H=4 D=8 dtype=f16 order=NHD"))
    with pytest.raises(errors.IncompatibleError):
        kt.reference_decode(other.layout, cache, work)
    with pytest.raises(errors.IncompatibleError):
        kt.compare_write(other, cache, work)
    with pytest.raises(errors.ShapeError) as e:
        kvlayout._native.reference_decode(cache, work.query[:, :2].copy(), work.block_table,
                                          work.seq_lens, 4, 0.5, layer=1)
    assert e.value.what == "query" and "3 x 4 x 8" in e.value.expected
    with pytest.raises(errors.ShapeError):
        kvlayout._native.reference_decode(cache, work.query, work.block_table, work.seq_lens,
                                          3, 0.5, layer=1)
    with pytest.raises(errors.OutOfRangeError):
        kvlayout._native.reference_decode(cache, work.query, work.block_table, work.seq_lens,
                                          4, 0.5, layer=2)
    short = kvlayout.Cache(layout, [cache.buffers[0][:-1]])
    with pytest.raises(errors.BufferTooShortError):
        kt.compare_write(short, cache, work)
    with pytest.raises(errors.SlotOutOfRangeError):
        kvlayout._native.write_error(cache, cache, [3 * 16], layer=1)
    assert kt.compare_write(cache, cache, work) is None
    assert kvlayout._native.element_at(layout, 0, 10**9) is None
    with pytest.raises(errors.UnknownNameError):
        kt.decode_tolerance("f64")
