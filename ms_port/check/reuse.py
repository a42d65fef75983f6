"""Memory used again: the arrays verify by layers casts its weights into, block after block.

Each block casts its weights into fresh arrays: a Mistral-7B layer's 218M parameters in
float32 on each side, and in float64 twice for the noise passes (each module's weights as
it runs, :mod:`ms_port.check.lazy`). A fresh array's pages are handed over by the kernel,
zeroed, as they are first written: on this project's machines that cost as much as the
cast itself (470 MB of float64: 0.165 s cast into a fresh array, 0.084 s into one used
before). :class:`Buffers` keeps the large arrays it made and casts into one again once
nothing else holds it.

Nothing still in use is ever written: an array is taken again only where its reference
count shows that no view of it, no tensor made from it (``torch.from_numpy`` and
MindSpore's ``Tensor.from_numpy`` hold the array) and no caller holds it any more.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

#: arrays smaller than this are made fresh (a bias, a norm's weight: nothing to gain)
SMALLEST = 1 << 20
#: the most arrays kept (a module's weight and bias at once, a block's few shapes)
MOST = 8


class Buffers:
    """Large arrays made once and used again for casts (module docstring).

    Where no free array is large enough, the free ones are let go before a new one is
    made: what is kept is never more than what was in use at once, plus the arrays in
    use being larger than needed."""

    def __init__(self) -> None:
        self._kept: list[np.ndarray] = []
        #: casts into an array used before (for tests and measures)
        self.reused = 0
        # the references an array nothing else holds has, counted as _free counts them
        # (the list's, and getrefcount's argument): any holder adds one of its own
        probe = [np.empty(0)]
        self._unheld = sys.getrefcount(probe[0])

    def cast(self, array: np.ndarray, dtype: Any) -> np.ndarray:
        """``array.astype(dtype)``, in an array used before where one is free."""
        dtype = np.dtype(dtype)
        need = array.size * dtype.itemsize
        if need < SMALLEST:
            return array.astype(dtype)
        raw = self._free(need)
        if raw is None:
            raw = np.empty(need, np.uint8)
            if len(self._kept) < MOST:
                self._kept.append(raw)
        else:
            self.reused += 1
        out = raw[:need].view(dtype).reshape(array.shape)
        np.copyto(out, array, casting="unsafe")
        return out

    def _free(self, need: int) -> np.ndarray | None:
        """The smallest kept array of at least ``need`` bytes that nothing holds; where
        none, the free ones are let go (a larger one is about to be made) and None."""
        free = [k for k in range(len(self._kept))
                if sys.getrefcount(self._kept[k]) <= self._unheld]
        fits = [k for k in free if self._kept[k].nbytes >= need]
        if fits:
            return self._kept[min(fits, key=lambda k: self._kept[k].nbytes)]
        for k in reversed(free):
            del self._kept[k]
        return None


__all__ = ["Buffers"]
