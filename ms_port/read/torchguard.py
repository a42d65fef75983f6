"""Guards in front of ``torch.load(weights_only=True)``, for the files the fast reader hands over.

``weights_only`` never runs a pickle's code, but it still lets a file make torch allocate
memory the file does not fill: ``torch.Tensor(n)`` or ``UntypedStorage(n)`` through
REDUCE/NEWOBJ (uninitialised memory, which a conversion would then write out), a legacy
file whose pickle declares storages that its data section never fills, or sizes far
beyond the file (an allocation bomb). Before torch sees a file, :func:`prescan` reads its
pickles as data — every global resolves to an inert placeholder, so nothing outside this
module can run — and refuses:

- globals that create tensors or storages without data, or bytes from a count
  (:data:`DENIED`);
- storages whose declared size exceeds what the file holds for them;
- legacy files whose data section does not fill every declared storage.

Whatever passes is then loaded by torch, whose own allow-list decides the rest.
"""

from __future__ import annotations

import io
import pickle
import zipfile
from pathlib import Path
from typing import Any

from ..errors import SourceError
from .tensors import numpy_dtype
from .torchzip import MAX_PICKLE_BYTES, STORAGE_DTYPES

#: (module, name) pairs refused outright: they make torch allocate memory from a count
DENIED_NAMES = {
    ("builtins", "bytearray"), ("__builtin__", "bytearray"),
    ("torch", "UntypedStorage"), ("torch", "TypedStorage"),
    ("torch.storage", "UntypedStorage"), ("torch.storage", "TypedStorage"),
    ("torch._utils", "_rebuild_wrapper_subclass"),
    ("torch._utils", "_rebuild_device_tensor_from_numpy"),
    ("torch._utils", "_rebuild_nested_tensor"),
}


class _Placeholder:
    """What every global becomes while scanning: accepts any call or state, does nothing."""

    def __init__(self, module: str = "", name: str = "", *args: Any, **kwargs: Any):
        self.module, self.name = module, name

    def __call__(self, *args: Any, **kwargs: Any) -> _Placeholder:
        return _Placeholder(self.module, self.name)

    def __setstate__(self, state: Any) -> None:
        pass


def _denied(module: str, name: str) -> bool:
    if (module, name) in DENIED_NAMES:
        return True
    # torch.Tensor, torch.FloatTensor, torch.cuda.HalfTensor...: called with a count they
    # return uninitialised memory
    return module.split(".")[0] == "torch" and name.endswith("Tensor") and "." not in name


class _Scanner(pickle.Unpickler):
    def __init__(self, file: Any, path: Path):
        super().__init__(file, encoding="ASCII")
        self.path = path
        self.storages: list[tuple[str, str, int]] = []  # (key, dtype, nbytes)

    def find_class(self, module: str, name: str) -> Any:
        if _denied(module, name):
            raise SourceError(
                f"{self.path}: refused — the pickle asks for {module}.{name}, which makes "
                "torch allocate memory the file does not fill (uninitialised data or an "
                "allocation bomb). Nothing was executed. Re-save the checkpoint from "
                "model.state_dict()", path=self.path, detail=f"{module}.{name}")
        return _Placeholder(module, name)

    def persistent_load(self, pid: Any) -> Any:
        if isinstance(pid, tuple) and len(pid) >= 5 and isinstance(pid[1], _Placeholder):
            key, numel, stype = pid[2], pid[4], pid[1].name
            dtype = STORAGE_DTYPES.get(stype, "uint8")
            if isinstance(numel, int) and not isinstance(numel, bool) and numel >= 0:
                self.storages.append((str(key), dtype, numel * numpy_dtype(dtype).itemsize))
        return _Placeholder()


def _scan(data: Any, path: Path) -> _Scanner:
    scanner = _Scanner(data if hasattr(data, "read") else io.BytesIO(data), path)
    try:
        scanner.load()
    except SourceError:
        raise
    except RecursionError:
        raise SourceError(f"{path}: refused — the pickle nests too deeply; re-save the "
                          "checkpoint", path=path) from None
    except Exception:
        pass
    return scanner


def prescan(path: Path, fmt: str) -> None:
    """Refuse a torch file that would make torch allocate memory the file does not fill.

    Raises:
        SourceError: a denied global, a storage larger than its record, or (legacy
            files) a declared storage that the data section does not fill.
    """
    if fmt == "torch-zip":
        _prescan_zip(path)
    else:
        _prescan_legacy(path)


def _prescan_zip(path: Path) -> None:
    with zipfile.ZipFile(path) as zf:
        infos = zf.infolist()
        if not infos:
            return
        root = infos[0].filename.split("/", 1)[0] + "/"
        members = {i.filename: i for i in infos}
        pkl = members.get(f"{root}data.pkl")
        if pkl is None:
            return  # torch refuses it
        if pkl.file_size > MAX_PICKLE_BYTES:
            raise SourceError(f"{path}: data.pkl is {pkl.file_size} bytes, more than any "
                              "state dict needs; refused", path=path)
        scanner = _scan(zf.read(pkl), path)
    seen: set[str] = set()
    for key, _dtype, nbytes in scanner.storages:
        if key in seen:  # torch reuses the storage first loaded under a key
            continue
        seen.add(key)
        info = members.get(f"{root}data/{key}")
        if info is not None and nbytes != info.file_size:
            raise SourceError(f"{path}: storage {key!r} declares {nbytes} bytes but its "
                              f"record holds {info.file_size}; the file is corrupt",
                              path=path, tensor=key)


def _prescan_legacy(path: Path) -> None:
    size = path.stat().st_size
    with open(path, "rb") as f:
        for _ in range(3):  # magic number, protocol version, sys_info: plain data
            _scan(f, path)
        main = _scan(f, path)
        keys = _read_keys(f, path)
    if keys is None:
        return  # unreadable key list: torch.load names the damage
    declared = {key: nbytes for key, _, nbytes in main.storages}
    total = sum(declared.values())
    if total > size:
        raise SourceError(f"{path}: refused — its pickle declares {total} bytes of storage, "
                          f"more than the whole file ({size} bytes)", path=path)
    filled = set(keys)
    unfilled = [k for k in declared if k not in filled]
    if unfilled:
        raise SourceError(
            f"{path}: refused — storage {unfilled[0]!r} is declared but never filled (torch "
            "would hand out uninitialised memory); the file is corrupt or crafted",
            path=path, tensor=unfilled[0])


def _read_keys(f: Any, path: Path) -> list[str] | None:
    """The legacy format's list of storage keys whose data follows, or None if unreadable."""

    class _Keys(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            raise pickle.UnpicklingError(f"{module}.{name} in the storage key list")

    try:
        keys = _Keys(f).load()
    except Exception:
        return None
    return [str(k) for k in keys] if isinstance(keys, list) else None
