"""Write a ``torch.save`` archive one tensor at a time.

``torch.save`` pickles one object whole: an optimizer's state of a 1.1B model is 8.8 GB of
moments held at once. This writer makes the same archive (``archive/data.pkl``, one
``archive/data/<key>`` record per storage, ``byteorder``, ``version``) from an object whose
tensors are :class:`Later` placeholders: the pickle is written first (it needs only each
tensor's dtype and shape), then each tensor is made, written and let go, in order. Memory is
one tensor. ``torch.load(weights_only=True)`` reads the archive as it reads ``torch.save``'s:
the tensors are rebuilt by ``torch._utils._rebuild_tensor_v2`` from typed storages, the
only calls its weights-only unpickler allows.

The pickle is made by the standard library's :mod:`pickle` at protocol 2, as torch's own.
"""

from __future__ import annotations

import pickle
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, ClassVar

import numpy as np

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


def save_streamed(obj: Any, f: BinaryIO) -> int:
    """Write ``obj`` (its tensors :class:`Later`) as ``torch.save`` would, to ``f``;
    returns the tensors written. The zip records each member's CRC-32 of the bytes handed
    to it (:func:`check_streamed` reads them back against it)."""
    import io

    storages: list[_Storage] = []
    buffer = io.BytesIO()
    _Pickler(buffer, storages).dump(obj)
    with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        zf.writestr(f"{ROOT}/data.pkl", buffer.getvalue())
        zf.writestr(f"{ROOT}/byteorder", "little")
        for storage in storages:
            with zf.open(f"{ROOT}/data/{storage.key}", "w", force_zip64=True) as out:
                for chunk in _bytes(storage.later):
                    out.write(chunk)
        zf.writestr(f"{ROOT}/version", "3\n")
    return len(storages)


def check_streamed(path: Path) -> None:
    """Read ``path`` back: its pickle by ms-port's reader, which takes exactly what
    ``torch.load(weights_only=True)`` takes (held to it by the differential fuzzing; torch
    itself costs 600 MiB to import), and every member's bytes, as stored, against the
    CRC-32 computed while they were written, a chunk at a time.

    Raises:
        ValueError: a member's bytes are not what was written, or the pickle is not one
            torch's weights-only loader reads.
    """
    import os

    from ..read import torchzip
    from ..read.torchzip import _data_offset

    try:
        torchzip.load(path)
    except torchzip.Unsupported as exc:
        raise ValueError(f"{path}: torch's weights-only loader would refuse it ({exc})"
                         ) from None
    buf = bytearray(_CHUNK)
    with zipfile.ZipFile(path) as zf, open(path, "rb") as f:
        for info in zf.infolist():
            start, left, crc = _data_offset(f, info), info.file_size, 0
            while left:
                view = memoryview(buf)[:min(left, _CHUNK)]
                got = os.preadv(f.fileno(), [view], start + info.file_size - left)
                if got != len(view):
                    raise ValueError(f"{path}: {info.filename} ends early on reading back")
                crc = zlib.crc32(view, crc)
                left -= got
            if crc != info.CRC:
                raise ValueError(f"{path}: {info.filename} read back is not what was "
                                 "written")


def _bytes(later: Later) -> Iterator[memoryview]:
    array = np.asarray(later.make(), dtype=numpy_dtype(later.dtype))
    if not array.flags.c_contiguous:  # (ascontiguousarray would make a scalar 1-d)
        array = array.copy(order="C")
    if array.shape != later.shape:
        raise ValueError(f"a tensor made {array.shape}, {later.shape} was declared")
    flat = memoryview(array.reshape(-1).view(np.uint8))
    for start in range(0, len(flat), _CHUNK):
        yield flat[start:start + _CHUNK]


def save_path(obj: Any, path: Path) -> None:
    """:func:`save_streamed` to ``path``, fsynced, then :func:`check_streamed` (the caller
    owns atomicity)."""
    import os

    with open(path, "wb") as f:
        save_streamed(obj, f)
        f.flush()
        os.fsync(f.fileno())
    check_streamed(path)
