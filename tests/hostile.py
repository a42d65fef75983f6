"""Generators of hostile and malformed checkpoints (no opaque blobs: every byte is built here).

``pickle_state`` writes a protocol-2 pickle the way ``torch.save`` does, from a list of
tensor descriptions whose every field (storage class, key, numel, offset, size, stride,
extra opcodes) a test may set to anything; ``zip_checkpoint`` wraps it in a torch-style
archive whose members a test may also corrupt.
"""

from __future__ import annotations

import struct
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


def _int(v: int) -> bytes:
    if 0 <= v < 256:
        return b"K" + bytes([v])
    if 0 <= v < 65536:
        return b"M" + struct.pack("<H", v)
    if -(2**31) <= v < 2**31:
        return b"J" + struct.pack("<i", v)
    raw = v.to_bytes((v.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(raw)]) + raw


def _str(s: str) -> bytes:
    raw = s.encode("utf-8", "surrogatepass")
    return b"X" + struct.pack("<I", len(raw)) + raw


def _tuple(items: list[bytes]) -> bytes:
    if not items:
        return b")"
    return b"(" + b"".join(items) + b"t"


def value(v: Any) -> bytes:
    """Opcodes that push a plain Python value."""
    if v is None:
        return b"N"
    if v is True:
        return b"\x88"
    if v is False:
        return b"\x89"
    if isinstance(v, int):
        return _int(v)
    if isinstance(v, float):
        return b"G" + struct.pack(">d", v)
    if isinstance(v, str):
        return _str(v)
    if isinstance(v, tuple):
        return _tuple([value(x) for x in v])
    if isinstance(v, list):
        return b"]" + (b"(" + b"".join(value(x) for x in v) + b"e" if v else b"")
    if isinstance(v, dict):
        return b"}" + (b"(" + b"".join(value(k) + value(x) for k, x in v.items()) + b"u"
                       if v else b"")
    raise TypeError(type(v))


@dataclass
class T:
    """One tensor entry of a generated state dict."""

    name: str
    storage: str = "FloatStorage"
    key: Any = "0"
    numel: Any = 4
    offset: Any = 0
    size: Any = (4,)
    stride: Any = (1,)
    requires_grad: Any = False
    location: Any = "cpu"
    parameter: bool = False
    after: bytes = b""  # opcodes appended right after the tensor is rebuilt
    rebuild: str = "_rebuild_tensor_v2"


def _global(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def tensor_ops(t: T) -> bytes:
    storage = (b"(" + _str("storage") + _global("torch", t.storage) + value(t.key)
               + value(t.location) + value(t.numel) + b"tQ")
    hooks = _global("collections", "OrderedDict") + b")R"
    ops = (_global("torch._utils", t.rebuild) + b"(" + storage + value(t.offset)
           + value(t.size) + value(t.stride) + value(t.requires_grad) + hooks + b"tR")
    if t.parameter:
        ops = (_global("torch._utils", "_rebuild_parameter") + b"(" + ops
               + value(t.requires_grad) + hooks + b"tR")
    return ops + t.after


def pickle_state(tensors: list[T], *, extra: dict | None = None, after_dict: bytes = b"",
                 proto: int = 2) -> bytes:
    """A pickle of an OrderedDict of the given tensors (plus plain extra values)."""
    body = b"".join(value(t.name) + tensor_ops(t) for t in tensors)
    body += b"".join(value(k) + value(v) for k, v in (extra or {}).items())
    return (b"\x80" + bytes([proto]) + _global("collections", "OrderedDict") + b")R"
            + (b"(" + body + b"u" if body else b"") + after_dict + b".")


@dataclass
class Archive:
    """A torch.save-style zip; every member may be replaced before writing."""

    pickle: bytes
    storages: dict[str, bytes] = field(default_factory=dict)
    root: str = "archive"
    members: dict[str, bytes] = field(default_factory=dict)
    compress: int = zipfile.ZIP_STORED

    def write(self, path: Path) -> Path:
        with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
            zf.writestr(f"{self.root}/data.pkl", self.pickle)
            zf.writestr(f"{self.root}/byteorder", b"little")
            for key, data in self.storages.items():
                zf.writestr(zipfile.ZipInfo(f"{self.root}/data/{key}"), data,
                            compress_type=self.compress)
            zf.writestr(f"{self.root}/version", b"3\n")
            for name, data in self.members.items():
                zf.writestr(name, data)
        return path


def floats(n: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32).tobytes()


def zip_checkpoint(path: Path, tensors: list[T], storages: dict[str, bytes] | None = None,
                   *, extra: dict | None = None, after_dict: bytes = b"",
                   compress: int = zipfile.ZIP_STORED) -> Path:
    """Write a zip checkpoint; storages default to the declared numel of float32 values."""
    if storages is None:
        storages = {}
        for t in tensors:
            if isinstance(t.key, str) and isinstance(t.numel, int) and t.key not in storages:
                storages[t.key] = floats(max(t.numel, 0))
    return Archive(pickle_state(tensors, extra=extra, after_dict=after_dict), storages,
                   compress=compress).write(path)
