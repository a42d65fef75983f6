"""Buffers a writer's group makers fill again once nothing holds them.

A mixture's experts are made a group at a time (each transposed into a new array), and
the writer's pipeline holds a few groups at once: two in the making, one digested and
scanned, one being written. Each new array of a group (16-32 MiB) took fresh pages from
the kernel, and a fresh page is zeroed before it is filled: ``clear_page`` was 9.8 % of a
DeepSeek-V4 conversion's CPU (20.7 s in all, one run sampled by ``perf``), its page faults
more. :class:`Recycled` hands the same few buffers out again instead.

A buffer is handed out again only when its reference count says nothing but the pool
holds it: every view of it (a group's array, its bytes, the writer's chunk of them)
holds a reference to it, through numpy's ``base``. Nothing else can take a new one
without the pool, so a buffer seen unheld stays unheld until the pool hands it out.

Verify's :class:`~ms_port.check.reuse.Arena` guards one slab the same way, and cuts it
again only once nothing cut from it is held; a writer's pipeline always holds some group,
so here each buffer is guarded on its own.
"""

from __future__ import annotations

import math
import sys
import threading
from typing import Any

import numpy as np


class Recycled:
    """``empty(shape, dtype)`` from a few buffers used again (thread-safe); at most as
    many buffers as were held at once, each the size of the largest array asked of it."""

    def __init__(self) -> None:
        self._buffers: list[np.ndarray] = []
        self._lock = threading.Lock()
        self.made = 0  # buffers made, let go or not: at most what was held at once
        # the references an unheld buffer has, counted as _unheld counts them (through
        # the list: a local name's reference is not counted alike by every Python)
        self._probe = [np.empty(0, np.uint8)]
        self._unheld = sys.getrefcount(self._probe[0])

    def empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """An uninitialised C-contiguous array of ``shape`` and ``dtype``."""
        dtype = np.dtype(dtype)
        need = math.prod(shape) * dtype.itemsize
        with self._lock:
            at = self._unheld_one(need)
            if at is None:
                self._buffers.append(np.empty(need, np.uint8))
                self.made += 1
                at = len(self._buffers) - 1
            return self._buffers[at][:need].view(dtype).reshape(shape)

    def _unheld_one(self, need: int) -> int | None:
        """The smallest unheld buffer of at least ``need`` bytes; else None, the largest
        unheld one let go first (the new one replaces it, never beside it)."""
        best = smaller = None
        for i in range(len(self._buffers)):
            if sys.getrefcount(self._buffers[i]) > self._unheld:
                continue
            size = self._buffers[i].nbytes
            if size >= need and (best is None or size < self._buffers[best].nbytes):
                best = i
            elif size < need and (smaller is None or size > self._buffers[smaller].nbytes):
                smaller = i
        if best is None and smaller is not None:
            del self._buffers[smaller]
        return best

    @property
    def nbytes(self) -> int:
        """The bytes the pool holds."""
        return sum(b.nbytes for b in self._buffers)


__all__ = ["Recycled"]
