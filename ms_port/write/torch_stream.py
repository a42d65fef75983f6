"""Write a ``torch.save`` archive one tensor at a time.

``torch.save`` pickles one object whole: an optimizer's state of a 1.1B model is 8.8 GB of
moments held at once. This writer makes the same archive (``archive/data.pkl``, one
``archive/data/<key>`` record per storage, ``byteorder``, ``version``) from an object whose
tensors are :class:`Later` placeholders: the pickle is written first (it needs only each
tensor's dtype and shape), then each tensor is made, written and let go, in order. Memory is
two tensors (the next one is made while one is written). ``torch.load(weights_only=True)``
reads the archive as it reads ``torch.save``'s: the tensors are rebuilt by
``torch._utils._rebuild_tensor_v2`` from typed storages, the only calls its weights-only
unpickler allows.

The pickle is made by the standard library's :mod:`pickle` at protocol 2, as torch's own.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, ClassVar

import numpy as np

from .._crc import crc32
from ..read.tensors import numpy_dtype

#: the storage class torch names each dtype's data by
_STORAGES = {"float32": "FloatStorage", "float64": "DoubleStorage", "float16": "HalfStorage",
             "bfloat16": "BFloat16Storage", "int64": "LongStorage", "int32": "IntStorage",
             "int8": "CharStorage", "uint8": "ByteStorage", "bool": "BoolStorage"}
#: the archive's root folder (torch.save's own)
ROOT = "archive"
#: bytes written at a time
_CHUNK = 64 << 20


@dataclass(frozen=True)
class Later:
    """A tensor to be made when its turn to be written comes: ``make()`` returns its array
    (of ``dtype`` and ``shape``, C order)."""

    dtype: str
    shape: tuple[int, ...]
    make: Callable[[], np.ndarray]


@dataclass(frozen=True)
class _Storage:
    later: Later
    key: str


@dataclass(frozen=True)
class _Global:
    """A name the pickle refers to (``torch._utils._rebuild_tensor_v2``), written as a
    GLOBAL without importing it: torch is not needed to write its format."""

    module: str
    name: str

    def __call__(self, *args: Any) -> Any:  # pickle asks a reducer's callable to be one
        raise TypeError(f"{self.module}.{self.name} is a name in a pickle, never called")


_REBUILD = _Global("torch._utils", "_rebuild_tensor_v2")
_ORDERED_DICT = _Global("collections", "OrderedDict")


class _Empty:
    """An empty ``collections.OrderedDict()`` (a tensor's backward hooks), by name."""

    def __reduce__(self) -> tuple:
        return (_ORDERED_DICT, ())


def _save_name(pickler: Any, obj: _Global) -> None:
    pickler.write(pickle.GLOBAL + f"{obj.module}\n{obj.name}\n".encode("ascii"))
    pickler.memoize(obj)


class _Pickler(pickle._Pickler):  # the Python pickler: its dispatch table can be extended
    dispatch: ClassVar[dict] = {**pickle._Pickler.dispatch, _Global: _save_name}

    def __init__(self, file: BinaryIO, storages: list[_Storage]) -> None:
        super().__init__(file, protocol=2)
        self.storages = storages

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, Later):
            storage = _Storage(obj, str(len(self.storages)))
            self.storages.append(storage)
            shape = obj.shape
            stride = tuple(int(np.prod(shape[i + 1:])) for i in range(len(shape)))
            # _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks)
            return (_REBUILD, (storage, 0, shape, stride, False, _Empty()))
        return NotImplemented

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, _Storage):
            later = obj.later
            return ("storage", _Global("torch", _STORAGES[later.dtype]), obj.key, "cpu",
                    int(np.prod(later.shape)))
        return None


def _pickled(obj: Any) -> tuple[bytes, list[_Storage]]:
    """``obj``'s pickle (protocol 2, as torch's) and its storages in pickling order."""
    import io

    storages: list[_Storage] = []
    buffer = io.BytesIO()
    _Pickler(buffer, storages).dump(obj)
    return buffer.getvalue(), storages


def save_path(obj: Any, path: Path) -> None:
    """Write ``obj`` (its tensors :class:`Later`) to ``path`` as ``torch.save`` would, and
    prove it (the caller owns atomicity).

    Four threads. The next tensor is made, and its CRC-32 computed (:mod:`ms_port._crc`),
    while one is written (:class:`~ms_port.write.stored_zip.StoredZip`: the writer's thread
    only writes); the kernel is asked to start writing to the disk behind the writer (as
    the ``.ckpt`` writer does: :class:`~ms_port.write.writers._WriteBehind`); each written
    member is read back from the file (the page cache) and its bytes held to the CRC-32 it
    was written with, while the next ones are written. Then the file is fsynced and its
    pickle read by ms-port's reader, which takes exactly what
    ``torch.load(weights_only=True)`` takes (held to it by the differential fuzzing;
    importing torch to ask it costs 600 MiB). Two tensors are alive at once.

    Raises:
        ValueError: a member read back is not what was written, or the pickle is not one
            torch's weights-only loader reads.
    """
    import os
    from concurrent.futures import ThreadPoolExecutor

    from ..read import torchzip
    from .stored_zip import StoredZip
    from .writers import _one_ahead, _WriteBehind

    pickled, storages = _pickled(obj)
    fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o600)
    try:
        with open(path, "wb") as f, ThreadPoolExecutor(1, "ms-port-prepare") as maker, \
                ThreadPoolExecutor(1, "ms-port-check") as checker, \
                ThreadPoolExecutor(1, "ms-port-fsync") as syncer:
            behind = _WriteBehind(f, syncer, None)  # the disk works while we write
            zf = StoredZip(f)
            for name, data in ((f"{ROOT}/data.pkl", pickled), (f"{ROOT}/byteorder", b"little")):
                zf.add(name, [data], len(data), crc32(data))
            checks = []
            made = ((s, _made(s.later)) for s in storages)
            for storage, (flat, crc) in _one_ahead(made, maker):
                member = zf.add(f"{ROOT}/data/{storage.key}", _chunks(flat, behind),
                                len(flat), crc)
                f.flush()
                checks.append(checker.submit(_crc_back, fd, member))
            zf.add(f"{ROOT}/version", [b"3\n"], 2, crc32(b"3\n"))
            zf.close()
            bad = [name for name, ok in (c.result() for c in checks) if not ok]
            f.flush()
            os.fsync(f.fileno())
    finally:
        os.close(fd)
    if bad:
        raise ValueError(f"{path}: {bad[0]} read back is not what was written")
    try:
        torchzip.load(path)
    except torchzip.Unsupported as exc:
        raise ValueError(f"{path}: torch's weights-only loader would refuse it ({exc})"
                         ) from None


def _chunks(flat: memoryview, behind: Callable[..., None]) -> Iterator[memoryview]:
    for start in range(0, len(flat), _CHUNK):
        yield flat[start:start + _CHUNK]
        behind("write", 0, 0)


def _crc_back(fd: int, member: Any) -> tuple[str, bool]:
    """Whether a member's bytes, read back from the file, have the CRC-32 it was written
    with. Read through a read-only map of the file, a window at a time: the page cache's
    own pages, not a copy of them (8.8 GB of moments read back: 2 s less)."""
    import mmap
    import os

    name = member.name.decode("utf-8")
    if member.data + member.size > os.fstat(fd).st_size:
        return name, False
    crc, at, end = 0, member.data, member.data + member.size
    while at < end:
        base = at - at % mmap.ALLOCATIONGRANULARITY
        length = min(end, base + _CHUNK) - base
        with mmap.mmap(fd, length, access=mmap.ACCESS_READ, offset=base) as window:
            view = memoryview(window)
            try:
                crc = crc32(view[at - base:], crc)
            finally:
                view.release()
        at = base + length
    return name, crc == member.crc


def _made(later: Later) -> tuple[memoryview, int]:
    """The tensor's bytes, made now (:func:`_flat`), and their CRC-32."""
    flat = _flat(later)
    return flat, crc32(flat)


def _flat(later: Later) -> memoryview:
    """The tensor's bytes, made now, in C order (checked against its declaration)."""
    array = np.asarray(later.make(), dtype=numpy_dtype(later.dtype))
    if not array.flags.c_contiguous:  # (ascontiguousarray would make a scalar 1-d)
        array = array.copy(order="C")
    if array.shape != later.shape:
        raise ValueError(f"a tensor made {array.shape}, {later.shape} was declared")
    return memoryview(array.reshape(-1).view(np.uint8))
