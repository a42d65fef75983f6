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

import collections
import hashlib
import pickle
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

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


class _Tensor:
    """Pickles as torch's ``_rebuild_tensor_v2(storage, 0, shape, stride, False, {})``."""

    def __init__(self, storage: _Storage) -> None:
        self.storage = storage

    def __reduce_ex__(self, protocol: Any) -> tuple:
        import torch

        shape = self.storage.later.shape
        stride = tuple(int(np.prod(shape[i + 1:])) for i in range(len(shape)))
        return (torch._utils._rebuild_tensor_v2,
                (self.storage, 0, shape, stride, False, collections.OrderedDict()))


class _Pickler(pickle.Pickler):
    def __init__(self, file: BinaryIO, storages: list[_Storage]) -> None:
        super().__init__(file, protocol=2)
        self.storages = storages

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, Later):
            storage = _Storage(obj, str(len(self.storages)))
            self.storages.append(storage)
            return _Tensor(storage).__reduce_ex__(2)
        return NotImplemented

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, _Storage):
            import torch

            later = obj.later
            return ("storage", getattr(torch, _STORAGES[later.dtype]), obj.key, "cpu",
                    int(np.prod(later.shape)))
        return None


def save_streamed(obj: Any, f: BinaryIO) -> dict[str, str]:
    """Write ``obj`` (its tensors :class:`Later`) as ``torch.save`` would, to ``f``;
    returns each storage's digest by key (:func:`check_streamed` reads them back)."""
    import io

    storages: list[_Storage] = []
    buffer = io.BytesIO()
    _Pickler(buffer, storages).dump(obj)
    with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        zf.writestr(f"{ROOT}/data.pkl", buffer.getvalue())
        zf.writestr(f"{ROOT}/byteorder", "little")
        digests = {}
        for storage in storages:
            digest = hashlib.blake2b(digest_size=16)
            with zf.open(f"{ROOT}/data/{storage.key}", "w", force_zip64=True) as out:
                for chunk in _bytes(storage.later):
                    digest.update(chunk)
                    out.write(chunk)
            digests[storage.key] = digest.hexdigest()
        zf.writestr(f"{ROOT}/version", "3\n")
    return digests


def check_streamed(path: Path, digests: dict[str, str]) -> None:
    """Read ``path`` back as torch does (``weights_only``, memory-mapped: no tensor held)
    and each storage's bytes against its digest, one at a time.

    Raises:
        ValueError: a storage's bytes are not what was written, or torch refuses the file.
    """
    import torch

    torch.load(path, weights_only=True, mmap=True)
    with zipfile.ZipFile(path) as zf:
        for key, want in digests.items():
            digest = hashlib.blake2b(digest_size=16)
            with zf.open(f"{ROOT}/data/{key}") as record:
                while chunk := record.read(_CHUNK):
                    digest.update(chunk)
            if digest.hexdigest() != want:
                raise ValueError(f"{path}: storage {key} read back is not what was written")


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
        digests = save_streamed(obj, f)
        f.flush()
        os.fsync(f.fileno())
    check_streamed(path, digests)
