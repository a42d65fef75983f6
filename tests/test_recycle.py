"""The writer's group buffers used again (ms_port/write/recycle.py): a buffer is handed
out again only once nothing holds any view of it."""

from __future__ import annotations

import numpy as np

from ms_port.read.ckpt import tensor_bytes
from ms_port.write.recycle import Recycled


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def test_a_buffer_is_handed_out_again_once_nothing_holds_it():
    pool = Recycled()
    first = pool.empty((4, 8), np.float32)
    first[...] = 1
    at = _address(first)
    second = pool.empty((4, 8), np.float32)
    assert _address(second) != at  # the first is held
    del first
    again = pool.empty((2, 8), np.float32)  # smaller: the same buffer serves it
    assert _address(again) == at and pool.made == 2
    assert again.shape == (2, 8) and again.dtype == np.float32 and again.flags.c_contiguous


def test_no_view_of_a_held_buffer_lets_it_be_handed_out():
    pool = Recycled()
    for hold in (lambda a: a.T, lambda a: memoryview(a), lambda a: tensor_bytes(a)[2],
                 lambda a: a.reshape(-1)[3:], lambda a: a.view(np.uint8)):
        group = pool.empty((4, 8), np.uint16)
        group[...] = 7
        held = hold(group)
        was = bytes(memoryview(np.ascontiguousarray(held)).cast("B"))
        assert was and set(was) <= {7, 0}
        del group
        others = [pool.empty((4, 8), np.uint16) for _ in range(3)]
        for other in others:
            other[...] = 0  # would overwrite the held bytes if it were the same buffer
        assert bytes(memoryview(np.ascontiguousarray(held)).cast("B")) == was
        del held, others


def test_a_too_small_buffer_is_replaced_not_kept_beside_the_larger():
    pool = Recycled()
    small = pool.empty((16,), np.uint8)
    del small
    large = pool.empty((1024,), np.uint8)
    assert pool.nbytes == 1024 and pool.made == 2
    del large
    pool.empty((512,), np.uint8)
    assert pool.nbytes == 1024 and pool.made == 2
