"""Arrays used again for verify by layers' casts (:mod:`ms_port.check.reuse`): an array is
never handed out while anything holds it (a view, a torch or MindSpore tensor made from
it), the values are the cast's, and what is kept stays bounded by what was in use."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ms_port.check import reuse
from ms_port.check.reuse import Buffers

MIB = 1 << 20


def _source(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


def test_an_array_is_taken_again_only_once_nothing_holds_it():
    torch = pytest.importorskip("torch")
    buffers, src = Buffers(), _source(MIB // 2)  # 4 MiB in float64
    a = buffers.cast(src, np.float64)
    b = buffers.cast(src, np.float64)
    assert not np.shares_memory(a, b) and buffers.reused == 0
    view = a[10:20]
    del a
    c = buffers.cast(src, np.float64)  # a's memory is held by its view
    assert not np.shares_memory(c, view) and buffers.reused == 0
    del b, view
    d = buffers.cast(src * 2, np.float64)
    assert buffers.reused == 1 and np.array_equal(d, (src * 2).astype(np.float64))
    held = torch.from_numpy(d)
    del d
    e = buffers.cast(src, np.float64)  # torch holds d's
    assert not np.shares_memory(e, held.numpy())
    assert np.array_equal(held.numpy(), (src * 2).astype(np.float64))  # untouched


def test_a_mindspore_tensor_holds_its_array():
    ms = pytest.importorskip("mindspore")
    buffers, src = Buffers(), _source(MIB)
    a = buffers.cast(src, np.float32)
    tensor = ms.Tensor.from_numpy(a)
    del a
    b = buffers.cast(-src, np.float32)
    assert np.array_equal(tensor.asnumpy(), src)  # not written over
    assert np.array_equal(b, -src)


def test_small_arrays_are_made_fresh_and_kept_arrays_stay_bounded():
    buffers = Buffers()
    small = buffers.cast(_source(1000), np.float64)
    assert small.base is None or small.base.nbytes < reuse.SMALLEST
    big = buffers.cast(_source(MIB), np.float64)  # 8 MiB
    del big
    bigger = buffers.cast(_source(2 * MIB), np.float64)  # 16 MiB: the free 8 MiB let go
    assert [k.nbytes for k in buffers._kept] == [16 * MIB]
    del bigger
    for _ in range(3):  # smaller ones fit the kept one, one at a time
        out = buffers.cast(_source(MIB), np.float64)
        del out
    assert [k.nbytes for k in buffers._kept] == [16 * MIB] and buffers.reused == 3
    held = [buffers.cast(_source(MIB), np.float64) for _ in range(reuse.MOST + 2)]
    assert len(buffers._kept) == reuse.MOST  # the rest made fresh, not kept
    assert len({h.__array_interface__["data"][0] for h in held}) == len(held)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5), st.booleans()), min_size=1, max_size=25))
def test_no_live_array_is_ever_written(steps):
    """Casts of several sizes, some kept alive, some dropped: every live output keeps its
    own values and shares memory with no other."""
    reuse_small = reuse.SMALLEST
    buffers, live = Buffers(), []
    try:
        reuse.SMALLEST = 0
        for k, (size, keep) in enumerate(steps):
            src = np.full(size * 1000, k, np.float32)
            out = buffers.cast(src, np.float64)
            if keep:
                live.append((k, out))
            del out
            for value, array in live:
                assert (array == value).all()
        for i, (_, a) in enumerate(live):
            for _, b in live[i + 1:]:
                assert not np.shares_memory(a, b)
    finally:
        reuse.SMALLEST = reuse_small
