"""Memory used again, and memory handed back: the arrays verify by layers casts its weights
into, block after block (:class:`Arena`), and those MindSpore keeps after it is done with
them (:class:`HandedBack`).

Each block casts its weights into new arrays: a Mistral-7B layer's 218M parameters in
float32 (which both sides compute on), and in float64 for the noise pass (each module's
weights as it runs, :mod:`ms_port.check.lazy`). A new array's pages are handed over by the
kernel, zeroed, as they are first written: on this project's machines that costs more
than the cast itself (58.7M bfloat16 parameters to float32: 110 ms into a new array,
38 ms into one used before, 17 ms with PyTorch's two-thread copy). :class:`Arena` keeps
one slab of memory, cuts each block's arrays from it, and cuts them again from its start
once none of them is held any more: the float32 arrays of one layer, then the float64
arrays of each module in turn, then the next layer's.

Nothing still in use is ever written: the slab is cut again from its start only where its
reference count shows that no array cut from it is held (by the caller, a view, a tensor
made from it: ``torch.from_numpy`` and MindSpore's ``Tensor.from_numpy`` hold the array).
While any is held, new arrays are cut after the last one, and where the slab is full
they are made on their own; the next slab is made as large as the most that was cut
between two times it was free (what a block's float32 arrays take: verify cuts only
those, and each module's float64 ones, from it).
"""

from __future__ import annotations

import ctypes
import mmap
import sys
import warnings
import weakref
from collections.abc import Iterable
from typing import Any, Callable

import numpy as np

from .._libc import libc_function

#: arrays smaller than this are made on their own (a bias, a norm's weight)
SMALLEST = 1 << 20
#: each array's start in the slab is a multiple of this (a cache line)
ALIGN = 64

#: 16-bit floating dtypes PyTorch casts from on two threads, by the name numpy gives them
_HALF = {"bfloat16": "bfloat16", "float16": "float16"}


def cast_into(out: np.ndarray, array: np.ndarray) -> None:
    """``out[...] = array`` cast (``out``'s dtype). A 16-bit float array is cast by
    PyTorch where it is already imported (two threads: 2.2x numpy's here), else by numpy;
    the values are the same, each cast being exact into float32 and float64."""
    torch = sys.modules.get("torch")
    half = _HALF.get(array.dtype.name)
    if (torch is not None and half is not None and out.dtype in (np.float32, np.float64)
            and array.dtype.isnative and out.dtype.isnative
            and array.flags.c_contiguous and out.flags.c_contiguous
            and out.shape == array.shape):
        with warnings.catch_warnings():  # a file's map is read-only: it is only read here
            warnings.filterwarnings("ignore", "The given NumPy array is not writable")
            source = torch.from_numpy(array.view(np.int16)).view(getattr(torch, half))
        torch.from_numpy(out).copy_(source)
        return
    with np.errstate(invalid="ignore"):  # a NaN weight is counted, not warned of
        np.copyto(out, array, casting="unsafe")


class Arena:
    """A slab of memory cut into arrays, and cut again from its start once none of them is
    held (module docstring)."""

    def __init__(self) -> None:
        self._slab: np.ndarray | None = None
        #: where the next array is cut (past the slab's end: arrays made on their own)
        self._at = 0
        #: the most bytes cut since the slab was last free: the size of the next slab
        self._wanted = 0
        #: arrays cut from a slab used before (for tests and measures)
        self.reused = 0
        self._new = True  # the slab was made since it was last cut from its start
        # the references a slab nothing else holds has, counted as _free counts them
        self._probe = np.empty(0)
        self._unheld = sys.getrefcount(self._probe)

    def cast(self, array: np.ndarray, dtype: Any) -> np.ndarray:
        """``array.astype(dtype)``, cut from the slab where it can be."""
        dtype = np.dtype(dtype)
        need = array.size * dtype.itemsize
        if need < SMALLEST:
            return array.astype(dtype)
        raw = self._cut(need)
        out = (np.empty(array.shape, dtype) if raw is None
               else raw.view(dtype).reshape(array.shape))
        cast_into(out, array)
        return out

    def _cut(self, need: int) -> np.ndarray | None:
        """``need`` bytes of the slab, or None (they are made on their own)."""
        # counted as the probe was, through the attribute (a local name's reference is
        # not counted alike by every Python: 3.14 borrows it)
        free = self._slab is not None and sys.getrefcount(self._slab) <= self._unheld
        slab, grow = self._slab, 0
        if slab is not None and free:
            self._at = 0  # nothing cut from it is held: cut again from its start
            if slab.nbytes < max(self._wanted, need):
                # too small for what was held at once, or for this array: let go before
                # the larger one is made, never beside it
                grow, self._slab = max(self._wanted, need), None
            self._wanted = 0
        del slab
        start = -(-self._at // ALIGN) * ALIGN
        end = start + need
        self._at, self._wanted = end, max(self._wanted, end)
        if self._slab is None and start == 0:
            self._slab, self._new = np.empty(max(grow, end), np.uint8), True
        elif start == 0:
            self._new = False
        if self._slab is not None and end <= self._slab.nbytes:
            self.reused += not self._new
            return self._slab[start:end]
        return None

    def release(self) -> None:
        """Let the slab go where nothing cut from it is held (before work that does not cut
        from it: a mixture's experts, read a group at a time); else it goes once the last
        array cut from it does."""
        self._slab, self._at, self._wanted = None, 0, 0

    @property
    def nbytes(self) -> int:
        """The bytes the slab holds (0: none made yet)."""
        return 0 if self._slab is None else self._slab.nbytes


_MADVISE = libc_function("madvise", ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t,
                         ctypes.c_int)


class HandedBack:
    """Arrays whose pages are handed back to the kernel once they are done with, while
    something that will never read them again still holds them.

    MindSpore in GRAPH mode keeps the arrays a network's parameters share
    (``Tensor.from_numpy``) until the compiled graph runs again, even once each parameter
    has a placeholder (:func:`~ms_port.archs.llama.blocks.release` lets go of the data
    MindSpore copied; measured with ``tracemalloc``): a decoder layer's float32 weights at
    DeepSeek-V3.2's widths (2.3 GB) so stayed resident through the float64 pass of the
    same layer and the whole of the next, where nothing reads them. :meth:`watch` notes a
    pass's arrays before they are handed to MindSpore; :meth:`hand_back`, once its passes
    are done, gives back the pages of those still alive (``madvise(MADV_DONTNEED)``).

    Only whole pages inside the data of an array that owns it (no view, no file's map) and
    is still alive are handed back: whatever the allocator, such pages belong to that
    array alone while it lives (an allocator keeps its own records outside a block in
    use). An array already freed is skipped (its weak reference is dead), so no page that
    is now another's is touched. Were the array read again, it would read zeros: hand
    back only what no one will compute on (the tests give these arrays NaN instead and
    get the same report).
    """

    def __init__(self, smallest: int | None, give: Callable[[np.ndarray], int] | None = None
                 ) -> None:
        """``smallest``: the least bytes of an array worth a call (None: nothing is ever
        handed back); ``give``: what is done to each array (the tests'; else its pages
        are handed back), returning the bytes given back."""
        self._from = None if smallest is None or (give is None and _MADVISE is None) \
            else smallest
        self._give = give or _pages_back
        self._arrays: list[weakref.ref[np.ndarray]] = []

    def watch(self, arrays: Iterable[np.ndarray]) -> None:
        """Note ``arrays`` (one pass's) to be handed back by the next :meth:`hand_back`;
        what an earlier call noted and no hand back followed (its pass failed) is
        forgotten, never handed back later."""
        unique = {id(a): a for a in arrays}  # one array may stand for two parameters
        self._arrays = [] if self._from is None else [
            weakref.ref(a) for a in unique.values()
            if a.base is None and a.flags.owndata and a.nbytes >= self._from]

    def hand_back(self) -> int:
        """The pages of every watched array still alive handed back; the bytes handed
        back."""
        watched, self._arrays = self._arrays, []
        runtime = getattr(sys.modules.get("mindspore"), "runtime", None)
        sync = getattr(runtime, "synchronize", None)
        if watched and sync is not None:
            sync()  # a call may return before its work on them is done
        done = 0
        for ref in watched:
            array = ref()
            if array is not None:
                done += self._give(array)
            del array
        return done


def _pages_back(array: np.ndarray) -> int:
    """The whole pages inside ``array``'s data handed back to the kernel: their bytes."""
    address, _ = array.__array_interface__["data"]
    start = -(-address // mmap.PAGESIZE) * mmap.PAGESIZE
    end = (address + array.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
    if end > start and _MADVISE(start, end - start, mmap.MADV_DONTNEED) == 0:
        return end - start
    return 0


__all__ = ["ALIGN", "SMALLEST", "Arena", "HandedBack", "cast_into"]
