"""The declared per-tensor transforms: each gives exactly numpy's result, byte for byte."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from ms_port.match import transforms
from ms_port.match.transforms import TRANSPOSE_BLOCK, Transform, invert

DTYPES = [ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, np.float16, np.float32, np.int64,
          np.bool_]
#: (shape, permutation): the experts' own, blocked and banded 2-D swaps, axes of one
#: element, empty and scalar arrays, and permutations that keep the innermost axis
CASES = [((2048, 768), [1, 0]), ((1, 96, 128), [0, 2, 1]), ((128, 2 * TRANSPOSE_BLOCK), [1, 0]),
         ((130, 70), [1, 0]), ((3, 5, 7, 2), [2, 0, 3, 1]), ((4, 6, 8), [1, 0, 2]),
         ((7,), [0]), ((0, 3), [1, 0]), ((), []), ((1, 1), [1, 0]), ((3, 1, 4, 1), [3, 2, 1, 0]),
         ((1, 5, 1, 3), [2, 3, 0, 1]), ((2, 0, 1), [2, 1, 0]), ((3, 64, 96), [0, 2, 1]),
         ((2, 3, 40, 24), [0, 1, 3, 2])]


@pytest.fixture(params=["opencv", "numpy"])
def kernel(request, monkeypatch):
    """Each transpose through OpenCV's kernel and through numpy's blocks (where OpenCV is
    missing): the same bytes either way."""
    if request.param == "numpy":
        monkeypatch.setattr(transforms, "_cv2", None)
    else:
        assert transforms._opencv() is not None, "opencv-python-headless is a dependency"
    return request.param


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape, perm", CASES, ids=str)
def test_transpose_is_numpys_byte_for_byte(dtype, shape, perm, kernel):
    rng = np.random.default_rng(0)
    array = np.asarray(rng.standard_normal(shape) * 3).astype(dtype)
    got = Transform("transpose", perm).apply(array)
    want = np.ascontiguousarray(np.transpose(array, perm))
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.flags.c_contiguous and got.tobytes() == want.tobytes()


@pytest.mark.parametrize("bits", [np.uint16, np.uint32, np.uint64])
def test_transpose_keeps_every_bit_of_nans(bits, kernel):
    """Elements move as bits: signalling NaNs and payloads come out as they went in (an
    8-byte element crosses OpenCV as a float64, never computed on)."""
    top = np.iinfo(bits).max
    values = np.array([top, top - 1, top // 2 + 1, top // 2 + 3, 1, 0], dtype=bits)
    floats = {2: np.float16, 4: np.float32, 8: np.float64}[values.itemsize]
    array = values.reshape(2, 3).view(floats)
    got = Transform("transpose", [1, 0]).apply(array)
    assert got.view(bits).tolist() == values.reshape(2, 3).T.tolist()


def test_transpose_of_a_strided_view_reads_its_own_elements(kernel):
    base = np.arange(4 * 256 * 2, dtype=np.uint16).reshape(4, 256, 2)
    view = base[::2, :, 1]  # neither contiguous nor starting at the base's first element
    got = Transform("transpose", [1, 0]).apply(view)
    assert got.tobytes() == np.ascontiguousarray(view.T).tobytes()


@pytest.mark.parametrize("shape", [(48, 5), (48,)])
def test_rope_halves_is_mindformers_rearrange_and_rope_pairs_undoes_it(shape):
    """rope_halves [block, rows] reorders the first rows block by block, even rows then odd
    ones (MindFormers' rearrange_w/rearrange_b written out), keeps the rest, and is undone
    by its inverse; sizes that do not fit are refused."""
    a = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    t = Transform("rope_halves", [8, 32])
    got = t.apply(a)
    order = [h * 8 + j for h in range(4) for j in [*range(0, 8, 2), *range(1, 8, 2)]]
    assert np.array_equal(got, np.concatenate([a[order], a[32:]]))
    assert t.shape(shape) == shape
    (back,) = invert((t,), shape)
    assert back == Transform("rope_pairs", [8, 32])
    assert np.array_equal(back.apply(got), a)
    named = Transform("rope_halves", ["head_dim", "q_rows + kv_rows"])
    assert named.names == ("head_dim", "q_rows + kv_rows")
    assert named.resolved(lambda x: {"head_dim": 8}.get(x, 32)) == t
    for bad in ([7, 28], [8, 36], [8, 56]):  # odd block, rows not whole blocks, too many
        with pytest.raises(ValueError, match="cannot reorder"):
            Transform("rope_halves", bad).shape(shape)
    with pytest.raises(ValueError, match="bad argument"):
        Transform("rope_halves", [8])


@pytest.mark.parametrize("shape", [(24, 3), (24,)])
def test_roll_moves_rows_within_each_block_and_a_roll_back_undoes_it(shape):
    """roll [block, shift]: row r of each block goes to (r + shift) % block (a head's two
    halves swapped with [2k, k]); its inverse rolls by block - shift; a block that does not
    divide the rows, or a shift outside the block, is refused."""
    a = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    t = Transform("roll", [8, 3])
    got = t.apply(a)
    order = [b * 8 + (r - 3) % 8 for b in range(3) for r in range(8)]
    assert np.array_equal(got, a[order]) and t.shape(shape) == shape
    (back,) = invert((t,), shape)
    assert back == Transform("roll", [8, 5]) and np.array_equal(back.apply(got), a)
    halves = Transform("roll", [8, 4]).apply(a)
    assert np.array_equal(halves[:8], np.concatenate([a[4:8], a[:4]]))
    for bad in ([7, 3], [8, 8], [8, 9]):
        with pytest.raises(ValueError, match="cannot roll"):
            Transform("roll", bad).shape(shape)
    with pytest.raises(ValueError, match="bad argument"):  # a shift of 0 moves nothing
        Transform("roll", [8, 0])
