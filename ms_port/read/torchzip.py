"""Read PyTorch's zip checkpoints without importing torch, and without running any pickle.

``torch.save`` writes a zip: ``<root>/data.pkl`` (a pickle of the state dict whose
tensors point at storages) and ``<root>/data/<key>`` (each storage's raw bytes, stored
uncompressed). Importing torch costs seconds and hundreds of MiB, more than the whole
conversion of a ResNet, so this module unpickles ``data.pkl`` with an allow-list of the
handful of globals a plain state dict uses (the tensor and parameter rebuild functions,
the typed storage classes, ``OrderedDict``), mapped to local stand-ins: nothing outside
the list is ever imported or called. Tensor data is read on demand with ``pread``, so
listing a file reads only its pickle, and converting holds one tensor at a time.

Anything outside the allow-list raises :class:`Unsupported`; the caller then falls back
to ``torch.load(weights_only=True)``, whose own allow-list decides. The fallback is never
wider than ``weights_only``.
"""

from __future__ import annotations

import collections
import math
import os
import pickle
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .tensors import numpy_dtype

#: torch storage class name -> canonical dtype
STORAGE_DTYPES = {
    "DoubleStorage": "float64", "FloatStorage": "float32", "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16", "LongStorage": "int64", "IntStorage": "int32",
    "ShortStorage": "int16", "CharStorage": "int8", "ByteStorage": "uint8",
    "BoolStorage": "bool", "ComplexFloatStorage": "complex64",
    "ComplexDoubleStorage": "complex128",
}


class Unsupported(Exception):
    """The file uses something this reader does not handle; use torch.load instead."""


@dataclass(frozen=True)
class _Storage:
    path: str
    dtype: str
    offset: int  # of the storage's bytes in the file
    nbytes: int


@dataclass(frozen=True)
class LazyTensor:
    """A tensor of a torch zip file: where its bytes are, not the bytes."""

    storage: _Storage
    storage_offset: int  # in elements
    shape: tuple[int, ...]
    stride: tuple[int, ...]

    @property
    def dtype(self) -> str:
        return self.storage.dtype

    def load(self) -> np.ndarray:
        """Read just the span of the storage this tensor covers (one copy, no mmap)."""
        dt = numpy_dtype(self.dtype)
        if math.prod(self.shape) == 0:
            return np.zeros(self.shape, dt)
        span = 1 + sum((n - 1) * s for n, s in zip(self.shape, self.stride))
        start = self.storage.offset + self.storage_offset * dt.itemsize
        nbytes = span * dt.itemsize
        if self.storage_offset * dt.itemsize + nbytes > self.storage.nbytes:
            raise ValueError(f"tensor extends past its storage ({nbytes} bytes at "
                             f"{self.storage_offset})")
        flat = np.empty(span, dt)
        with open(self.storage.path, "rb") as f:
            f.seek(start)
            got = f.readinto(memoryview(flat.view(np.uint8)))
        if got != nbytes:
            raise ValueError(f"file ends inside a tensor (read {got} of {nbytes} bytes)")
        strides = tuple(s * dt.itemsize for s in self.stride)
        view = np.lib.stride_tricks.as_strided(flat, self.shape, strides, writeable=False)
        return view if view.flags.c_contiguous else np.ascontiguousarray(view)


def _rebuild_tensor(storage: _Storage, storage_offset: int, size: Any, stride: Any,
                    *_ignored: Any) -> LazyTensor:
    if not isinstance(storage, _Storage):
        raise Unsupported("tensor without a plain storage")
    return LazyTensor(storage, int(storage_offset), tuple(map(int, size)),
                      tuple(map(int, stride)))


def _rebuild_parameter(data: Any, *_ignored: Any) -> Any:
    return data


class _StorageType:
    def __init__(self, name: str):
        self.dtype = STORAGE_DTYPES[name]


_ALLOWED = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
}


class _Unpickler(pickle.Unpickler):
    """Resolves only allow-listed globals, to local stand-ins; refuses everything else."""

    def __init__(self, file: Any, path: str, storages: dict[str, tuple[int, int]]):
        super().__init__(file)
        self._path, self._storages = path, storages

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return _ALLOWED[(module, name)]
        if module == "torch" and name in STORAGE_DTYPES:
            return _StorageType(name)
        raise Unsupported(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> _Storage:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and isinstance(pid[1], _StorageType)):
            raise Unsupported(f"persistent id {pid!r:.60}")
        _, stype, key, _location, numel = pid
        if str(key) not in self._storages:
            raise ValueError(f"storage {key!r} is missing from the archive")
        offset, nbytes = self._storages[str(key)]
        if int(numel) * numpy_dtype(stype.dtype).itemsize > nbytes:
            raise ValueError(f"storage {key!r} is shorter than it claims")
        return _Storage(self._path, stype.dtype, offset, nbytes)


def _data_offset(f: Any, info: zipfile.ZipInfo) -> int:
    """Where a stored member's bytes start: after its local header, name and extra field."""
    f.seek(info.header_offset)
    header = f.read(30)
    if len(header) != 30 or header[:4] != b"PK\x03\x04":
        raise ValueError(f"bad local header for {info.filename}")
    name_len, extra_len = struct.unpack("<HH", header[26:30])
    return info.header_offset + 30 + name_len + extra_len


def load(path: str | Path) -> Any:
    """Unpickle a torch zip checkpoint into plain containers of :class:`LazyTensor`.

    Raises:
        Unsupported: the file needs torch itself (an unknown global, compression,
            big-endian data); fall back to ``torch.load(weights_only=True)``.
        zipfile.BadZipFile, ValueError, EOFError, pickle.UnpicklingError: the file is
            damaged.
    """
    path = str(path)
    with zipfile.ZipFile(path) as zf, open(path, "rb") as f:
        infos = zf.infolist()
        pkl = next((i for i in infos if i.filename.endswith("/data.pkl")
                    or i.filename == "data.pkl"), None)
        if pkl is None:
            raise Unsupported("no data.pkl (not a torch.save archive)")
        root = pkl.filename[: -len("data.pkl")]
        order = next((i for i in infos if i.filename == f"{root}byteorder"), None)
        if order is not None and zf.read(order).strip() != b"little":
            raise Unsupported("big-endian archive")
        storages = {}
        for info in infos:
            if info.filename.startswith(f"{root}data/"):
                if info.compress_type != zipfile.ZIP_STORED:
                    raise Unsupported("compressed storage")
                storages[info.filename[len(root) + 5:]] = (_data_offset(f, info),
                                                          info.file_size)
        end = os.fstat(f.fileno()).st_size
        if any(off + n > end for off, n in storages.values()):
            raise ValueError("a storage extends past the end of the file")
        with zf.open(pkl) as pf:
            return _Unpickler(pf, path, storages).load()
