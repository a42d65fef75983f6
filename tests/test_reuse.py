"""Memory used again for verify by layers' casts (:mod:`ms_port.check.reuse`): no array is
ever written while anything holds it (a view, a torch or MindSpore tensor made from it),
the values are the cast's, and the slab kept stays what was in use at once. Memory handed
back (``HandedBack``): only a watched array's own pages, only while it lives."""

from __future__ import annotations

import mmap

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ms_port.check import reuse
from ms_port.check.reuse import Arena, cast_into

MIB = 1 << 20


def _source(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


def test_the_slab_is_cut_again_only_once_nothing_holds_an_array_of_it():
    torch = pytest.importorskip("torch")
    arena, src = Arena(), _source(MIB // 2)  # 4 MiB in float64
    a = arena.cast(src, np.float64)
    b = arena.cast(src, np.float64)  # the slab is full: made on its own
    assert not np.shares_memory(a, b) and arena.nbytes == 4 * MIB
    view = a[10:20]
    del a, b
    c = arena.cast(src, np.float64)  # a's memory is held by its view
    assert not np.shares_memory(c, view) and arena.reused == 0
    del c, view
    d = arena.cast(src * 2, np.float64)  # the slab made again, as large as both were
    e = arena.cast(src * 3, np.float64)
    assert arena.nbytes >= 8 * MIB and not np.shares_memory(d, e)
    del d, e
    f = arena.cast(src * 2, np.float64)
    assert arena.reused == 1 and np.array_equal(f, (src * 2).astype(np.float64))
    held = torch.from_numpy(f)
    del f
    g = arena.cast(src, np.float64)  # torch holds f's: cut after it
    assert not np.shares_memory(g, held.numpy())
    assert np.array_equal(held.numpy(), (src * 2).astype(np.float64))  # untouched


def test_a_mindspore_tensor_holds_its_array():
    ms = pytest.importorskip("mindspore")
    arena, src = Arena(), _source(MIB)
    a = arena.cast(src, np.float32)
    tensor = ms.Tensor.from_numpy(a)
    del a
    b = arena.cast(-src, np.float32)
    assert np.array_equal(tensor.asnumpy(), src)  # not written over
    assert np.array_equal(b, -src)


def test_small_arrays_are_made_on_their_own_and_the_slab_stays_bounded():
    arena = Arena()
    small = arena.cast(_source(1000), np.float64)
    assert small.base is None
    for _ in range(3):  # a block of three arrays at once, then the next block's
        held = [arena.cast(_source(MIB, k), np.float64) for k in range(3)]
        del held
    # the first block made the slab too small, the second a new one, the third reused it
    assert arena.nbytes <= 3 * 8 * MIB + 3 * reuse.ALIGN and arena.reused == 3
    for _ in range(3):  # smaller blocks fit the slab, which does not grow
        held = [arena.cast(_source(MIB // 2, k), np.float64) for k in range(2)]
        del held
    assert arena.nbytes <= 3 * 8 * MIB + 3 * reuse.ALIGN


@pytest.mark.parametrize("half", [ml_dtypes.bfloat16, np.float16])
@pytest.mark.parametrize("to", [np.float32, np.float64])
def test_a_16_bit_cast_is_numpys_to_the_bit(half, to):
    pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 1 << 16, 4096, dtype=np.uint16)  # every kind of value: NaN, Inf
    src = bits.view(half).reshape(64, 64)
    out = np.empty(src.shape, to)
    cast_into(out, src)
    with np.errstate(invalid="ignore"):
        want = src.astype(to)
        again = src[:, ::2].astype(to)
    same = (out == want) | (np.isnan(out) & np.isnan(want))
    assert same.all()
    strided = np.empty((64, 32), to)  # not contiguous: numpy's cast
    cast_into(strided, src[:, ::2])
    assert np.array_equal(strided, again, equal_nan=True)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5), st.booleans()), min_size=1, max_size=25))
def test_no_live_array_is_ever_written(steps):
    """Casts of several sizes, some kept alive, some dropped: every live output keeps its
    own values and shares memory with no other."""
    reuse_small = reuse.SMALLEST
    arena, live = Arena(), []
    try:
        reuse.SMALLEST = 0
        for k, (size, keep) in enumerate(steps):
            src = np.full(size * 1000, k, np.float32)
            out = arena.cast(src, np.float64)
            if keep:
                live.append((k, out))
            del out
            for value, array in live:
                assert (array == value).all()
            if k % 7 == 6:
                live.clear()
        for i, (_, a) in enumerate(live):
            for _, b in live[i + 1:]:
                assert not np.shares_memory(a, b)
    finally:
        reuse.SMALLEST = reuse_small


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64])
def test_nan_and_inf_are_counted_whichever_library_sums(dtype, monkeypatch):
    """verify counts a weight's NaN and Inf by its sum first (PyTorch's where imported):
    the counts are the exact ones, a sum that merely overflows included."""
    import sys

    from ms_port.check.compare import nonfinite

    pytest.importorskip("torch")
    values = np.ones(1 << 16, dtype)
    huge = np.full(1 << 16, np.finfo(dtype).max, dtype)  # overflows, finite
    bad = values.copy()
    bad[[3, 70, 900]] = np.nan
    bad[[5, 6]] = np.inf
    bad[7] = -np.inf
    for torch_imported in (True, False):
        if not torch_imported:
            monkeypatch.delitem(sys.modules, "torch")
        with np.errstate(over="ignore"):
            assert nonfinite(values) == (0, 0)
            assert nonfinite(huge) == (0, 0)
            assert nonfinite(bad) == (3, 3)
            assert nonfinite(bad[::2]) == (2, 1)  # not contiguous: numpy's sum


def test_a_released_slab_is_never_cut_again():
    arena, src = Arena(), _source(MIB)
    held = arena.cast(src, np.float32)
    arena.release()
    assert arena.nbytes == 0
    again = arena.cast(-src, np.float32)  # a new slab: the held array is untouched
    assert not np.shares_memory(held, again)
    assert np.array_equal(held, src) and np.array_equal(again, -src)


def test_a_slab_too_small_is_let_go_before_a_larger_one_is_made(monkeypatch):
    """Module after module (the float64 pass), a larger module's array is not made beside
    the free slab the smaller one before it used: what is held is never more than the
    largest module's."""
    import weakref

    made, empty = [], np.empty

    def recorded(shape, dtype=float, *args, **kwargs):
        made.append(old() is None)  # the old slab gone when the new one is made
        return empty(shape, dtype, *args, **kwargs)

    arena, little, big = Arena(), _source(MIB), _source(4 * MIB)
    small = arena.cast(little, np.float64)  # 8 MiB: the slab
    old = weakref.ref(small.base)
    del small
    monkeypatch.setattr(reuse.np, "empty", recorded)
    large = arena.cast(big, np.float64)  # 32 MiB: a new slab, the old let go first
    assert made == [True] and arena.nbytes == 32 * MIB
    del large
    again = arena.cast(little, np.float64)
    assert made == [True] and arena.reused == 1
    del again


@pytest.fixture
def smallest():
    """The least bytes of an array verify by layers hands back."""
    from ms_port.check.blocks import LARGE_ARRAY

    if reuse._MADVISE is None:
        pytest.skip("the C library's madvise is needed")
    return LARGE_ARRAY


def test_a_watched_arrays_pages_are_handed_back_and_no_one_elses(smallest):
    handed, src = reuse.HandedBack(smallest), _source(2 * MIB)  # 8 MiB
    held, beside = src.copy(), src.copy()
    handed.watch([held, held])  # two parameters sharing one array: handed back once
    assert held.nbytes >= handed.hand_back() >= held.nbytes - 2 * mmap.PAGESIZE
    # the kernel took the pages back: the array reads zeros (only where no one reads it)
    page = mmap.PAGESIZE // held.itemsize
    assert not np.count_nonzero(held[page:-page])
    assert np.array_equal(beside, src)  # an array not watched is untouched
    assert handed.hand_back() == 0  # watched once, handed back once


def test_views_maps_small_and_freed_arrays_are_never_handed_back(smallest, tmp_path):
    handed, src = reuse.HandedBack(smallest), _source(2 * MIB)
    whole = src.copy()
    view = whole[MIB:]  # a view's pages may be another's data
    small = src[:MIB // 8].copy()  # 512 KiB, whole pages, below the least worth a call
    path = tmp_path / "a.npy"
    np.save(path, src)
    file_map = np.load(path, mmap_mode="r")
    freed = src.copy()
    handed.watch([view, small, file_map, freed])
    del freed
    again = src.copy()  # may be given the freed array's pages
    assert handed.hand_back() == 0
    for array in (whole, again, file_map):
        assert np.array_equal(array, src)
    assert np.array_equal(small, src[:MIB // 8])


def test_nothing_is_handed_back_where_it_is_off():
    handed, src = reuse.HandedBack(None), _source(2 * MIB)
    held = src.copy()
    handed.watch([held])
    assert handed.hand_back() == 0 and np.array_equal(held, src)


def test_what_a_failed_pass_watched_is_forgotten_not_handed_back_later(smallest):
    handed, src = reuse.HandedBack(smallest), _source(2 * MIB)
    failed, next_pass = src.copy(), src.copy()
    handed.watch([failed])  # its pass raised: no hand back followed
    handed.watch([next_pass])
    assert handed.hand_back() > 0
    page = mmap.PAGESIZE // next_pass.itemsize
    assert np.array_equal(failed, src) and not np.count_nonzero(next_pass[page:-page])
