"""Layouts from Python: construction, offsets, views, regions, transforms, typed errors."""

import pytest

import kvlayout
from kvlayout import errors

SPEC = "kv L=1 B=3 N=16 H=4 D=8 dtype=f16 order=NHD"


def test_offset_matches_the_page_arithmetic():
    layout = kvlayout.Layout(SPEC)
    # token-major page: row = [K 8][V 8] f16 = 32 B, token stride = 4 heads x 32 B
    assert layout.offset("v", block=1, head=2, slot=3, dim=5) == (
        0,
        1 * (16 * 4 * 32) + 3 * (4 * 32) + 2 * 32 + 16 + 5 * 2,
    )


def test_out_of_range_is_typed_with_value_and_limit():
    layout = kvlayout.Layout(SPEC)
    with pytest.raises(errors.OutOfRangeError) as e:
        layout.offset("k", head=4)
    assert (e.value.axis, e.value.value, e.value.limit) == ("head", 4, 4)
    assert isinstance(e.value, errors.LayoutError)
    assert isinstance(e.value, ValueError)


def test_json_round_trip_and_spec_string():
    layout = kvlayout.Layout.preset("llama-3-8b")
    assert kvlayout.Layout.from_json(layout.to_json()) == layout
    assert kvlayout.Layout(str(layout)) == layout
    assert "llama-3-8b" in kvlayout.presets()


def test_random_layouts_are_reproducible():
    a = [kvlayout._native.random_layout(seed) for seed in range(20)]
    b = [kvlayout._native.random_layout(seed) for seed in range(20)]
    assert a == b
    assert len({str(x) for x in a}) > 10


def test_negative_counts_and_indices_are_typed():
    layout = kvlayout.Layout(SPEC)
    for call in (
        lambda: layout.block_regions(-1),
        lambda: layout.layer_regions((0, -1)),
        lambda: layout.tp_slice(-2, 0),
        lambda: layout.layer_range(-1, 1),
        lambda: layout.split_blocks(-4),
        lambda: layout.slot_range(0, -1),
        lambda: layout.view("standard", "k").byte_offset([0, -1, 0, 0]),
    ):
        with pytest.raises(errors.InvalidQueryError) as e:
            call()
        assert e.value.value < 0
    with pytest.raises(errors.OutOfRangeError) as e:
        layout.offset("k", slot=-1)
    assert (e.value.value, e.value.limit) == (-1, 16)
    with pytest.raises(TypeError):
        layout.split_blocks("two")
