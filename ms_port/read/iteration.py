"""MindFormers' "checkpoint 2.0": ``iteration_XXXXXXXX/`` folders read as one checkpoint.

A save (``mindformers.checkpoint``) writes, under the checkpoint root::

    latest_checkpointed_iteration.txt          # the newest iteration, as text
    iteration_00000300/
        common.json                            # epoch, step, loss scale (no tensors)
        metadata.json                          # every tensor's whole shape and its chunks
        [{prefix}-]model-{idx:07d}-{total:07d}.safetensors
        [{prefix}-]opt-{idx:07d}-{total:07d}.safetensors

``metadata.json``'s ``state_dict_metadata[name]`` gives ``global_shape``,
``axis_fragmentations`` (pieces per axis; every piece ``global_shape //
axis_fragmentations``) and ``chunk``: one ``{global_offset, local_shape}`` per distinct
piece, where ``global_offset`` is ``[k]``, the piece's row-major index in the
fragmentation grid — not element offsets, whatever its docstring says (measured on saves
made by MindFormers' own code). ``storage_data["('name', (k,))"]`` names the files that hold
piece ``k`` (each under the tensor's own name). A world-size-1 save has no metadata.json:
every tensor in its files is whole.

Everything read from the folder is checked before it is used: the file's size, every
shape against :data:`~ms_port.read.tensors.MAX_DIM`, every piece index inside its grid,
every piece held exactly once per index, every file name a plain name inside the folder,
every held slice's shape and dtype what the metadata says.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..errors import SourceError, shown
from .tensors import MAX_DIM, MAX_RANK, TensorInfo, numpy_dtype

TRACKER = "latest_checkpointed_iteration.txt"
_ITERATION = re.compile(r"^iteration_([0-9]{1,12})$")
#: the largest metadata.json read
MAX_METADATA_BYTES = 256 << 20
#: the most pieces one tensor may be cut into
MAX_PIECES = 1 << 16


def find_iterations(path: Path) -> tuple[Path, list[Path]] | None:
    """(the checkpoint root, its iteration folders) where ``path`` is a checkpoint-2.0
    root, the output folder holding it as ``checkpoint/``, or one ``iteration_*`` folder."""
    if not path.is_dir():
        return None
    if _ITERATION.match(path.name) and any(path.glob("*.safetensors")):
        return path.parent, [path]
    for root in (path, path / "checkpoint"):
        if root.is_dir():
            found = sorted((p for p in root.iterdir()
                            if p.is_dir() and _ITERATION.match(p.name)),
                           key=lambda p: int(_ITERATION.match(p.name).group(1)))
            if found:
                return root, found
    return None


def pick_iteration(root: Path, found: list[Path], step: str | None) -> tuple[Path, list[str]]:
    """The iteration asked for (``--step``), else the tracker's, else the newest by number;
    and the iterations found (newest first)."""
    numbers = {int(_ITERATION.match(p.name).group(1)): p for p in found}
    labels = [f"iteration {n}" for n in sorted(numbers, reverse=True)]
    if step is not None:
        given = step.strip()
        if not re.fullmatch(r"[0-9]{1,12}", given, re.ASCII) or int(given) not in numbers:
            raise SourceError(f"{root}: --step {shown(step)} names no iteration; found "
                              f"{', '.join(labels[:8])}", path=root)
        return numbers[int(given)], labels
    tracker = root / TRACKER
    if len(found) > 1 and tracker.is_file():
        text = tracker.read_bytes()[:32].decode("ascii", "replace").strip()
        if text.isdigit() and int(text) in numbers:
            return numbers[int(text)], labels
    return numbers[max(numbers)], labels


def read_iteration(folder: Path, read_file: Callable[[Path], dict[str, TensorInfo]]
                   ) -> tuple[dict[str, TensorInfo], dict[str, Any], list[str]]:
    """Every tensor of one iteration folder, whole, what ``common.json`` says, and the
    names the files hold that ``metadata.json`` does not describe (left out: the caller
    says which may be); ``read_file`` reads one safetensors file's tensors."""
    files = {p.name: p for p in folder.iterdir()
             if p.is_file() and p.suffix == ".safetensors"}
    if not files:
        raise SourceError(f"{folder}: no .safetensors file in this iteration folder",
                          path=folder)
    held = {name: read_file(p) for name, p in sorted(files.items())}
    meta_path = folder / "metadata.json"
    if not meta_path.exists():  # one device: every tensor whole, once
        return _whole(folder, held), _common(folder), []
    meta = _json(meta_path)
    tensors = {}
    shapes = meta.get("state_dict_metadata") if isinstance(meta, dict) else None
    storage = meta.get("storage_data") if isinstance(meta, dict) else None
    if not isinstance(shapes, dict) or not isinstance(storage, dict):
        raise SourceError(f"{meta_path}: no state_dict_metadata/storage_data objects; not "
                          "MindFormers' checkpoint metadata", path=meta_path)
    where = _storage(meta_path, storage, files)
    for name, entry in shapes.items():
        tensors[name] = _tensor(meta_path, str(name), entry, where, held)
    left = sorted({n for infos in held.values() for n in infos} - set(tensors))
    return tensors, _common(folder), left


def _json(path: Path) -> Any:
    if not path.is_file():
        raise SourceError(f"{path} is not a file; a save's metadata is a JSON file",
                          path=path)
    with open(path, "rb") as f:
        raw = f.read(MAX_METADATA_BYTES + 1)
    if len(raw) > MAX_METADATA_BYTES:
        raise SourceError(f"{path}: over {MAX_METADATA_BYTES >> 20} MiB; refused", path=path)
    try:
        return json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError, UnicodeDecodeError) as exc:
        raise SourceError(f"{path}: not JSON ({str(exc)[:80]})", path=path) from None


def _common(folder: Path) -> dict[str, Any]:
    path = folder / "common.json"
    if not path.is_file():
        return {}
    data = _json(path)
    return {k: v for k, v in data.items() if isinstance(v, (int, float, str)) and
            not isinstance(v, bool)} if isinstance(data, dict) else {}


def _whole(folder: Path, held: dict[str, dict[str, TensorInfo]]) -> dict[str, TensorInfo]:
    tensors: dict[str, TensorInfo] = {}
    for file, infos in held.items():
        for name, info in infos.items():
            seen = tensors.get(name)
            if seen is not None and (seen.shape, seen.dtype) != (info.shape, info.dtype):
                raise SourceError(f"{folder}: {shown(name)} is {info.shape} {info.dtype} in "
                                  f"{file} and {seen.shape} {seen.dtype} in another file, and "
                                  "no metadata.json says how they join", path=folder)
            tensors.setdefault(name, info)
    return tensors


def _storage(path: Path, storage: dict[str, Any],
             files: dict[str, Path]) -> dict[tuple[str, int], list[str]]:
    """(name, piece) -> the files holding it, every key and file name checked."""
    out: dict[tuple[str, int], list[str]] = {}
    for key, entries in storage.items():
        try:
            if len(key) > 8192:
                raise ValueError("too long")
            name, offset = ast.literal_eval(key)
            (piece,) = offset
            if not isinstance(name, str) or not isinstance(piece, int):
                raise ValueError("not (name, (index,))")
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            raise SourceError(f"{path}: storage_data key {shown(key)} is not "
                              "('name', (index,))", path=path) from None
        names = []
        for e in entries if isinstance(entries, list) else []:
            file = e.get("file_name") if isinstance(e, dict) else None
            if not isinstance(file, str) or Path(file).name != file or file in ("", ".", ".."):
                raise SourceError(f"{path}: {shown(name)} piece {piece} names "
                                  f"{shown(file)}, not a file name in the folder", path=path)
            if file not in files:
                rank = e.get("storage_rank")
                raise SourceError(f"{path}: {shown(name)} piece {piece} is held by {file} "
                                  f"(rank {shown(rank)}), which is missing; copy it back",
                                  path=path)
            names.append(file)
        out[(name, piece)] = names
    return out


def _ints(value: Any, what: str, name: str, path: Path) -> tuple[int, ...]:
    if (not isinstance(value, list) or len(value) > MAX_RANK or not all(
            isinstance(v, int) and not isinstance(v, bool) and 0 < v <= MAX_DIM
            for v in value)):
        raise SourceError(f"{path}: {shown(name)}'s {what} {shown(value)[:80]} is not a list "
                          f"of at most {MAX_RANK} positive sizes", path=path)
    return tuple(value)


def _tensor(path: Path, name: str, entry: Any, where: dict[tuple[str, int], list[str]],
            held: dict[str, dict[str, TensorInfo]]) -> TensorInfo:
    """One tensor whole from its pieces, each checked against the metadata."""
    if not isinstance(entry, dict):
        raise SourceError(f"{path}: the entry of {shown(name)} is not an object", path=path)
    shape = _ints(entry.get("global_shape"), "global_shape", name, path) \
        if entry.get("global_shape") != [] else ()
    frags = _ints(entry.get("axis_fragmentations"), "axis_fragmentations", name, path) \
        if shape else ()
    if len(frags) != len(shape) or any(s % f for s, f in zip(shape, frags)):
        raise SourceError(f"{path}: {shown(name)}: axis_fragmentations {list(frags)} do not "
                          f"divide its global_shape {list(shape)}", path=path)
    pieces = math.prod(frags)
    if pieces > MAX_PIECES:
        raise SourceError(f"{path}: {shown(name)} is cut into {pieces:,} pieces (over "
                          f"{MAX_PIECES:,}); refused", path=path)
    local = tuple(s // f for s, f in zip(shape, frags))
    chosen = []
    dtype = None
    seen: dict[str, int] = {}
    for k in range(pieces):
        files = where.get((name, k))
        if not files:
            raise SourceError(f"{path}: piece {k} of {shown(name)} ({list(frags)} pieces) is "
                              "held by no file; the save is incomplete", path=path)
        if files[0] in seen:  # a file holds one slice of a tensor, under its name
            raise SourceError(f"{path}: {files[0]} is named for pieces {seen[files[0]]} and "
                              f"{k} of {shown(name)}; one file holds one piece of a tensor",
                              path=path)
        seen[files[0]] = k
        info = held[files[0]].get(name)
        if info is None or info.shape != local:
            got = "does not hold it" if info is None else f"holds it as {list(info.shape)}"
            raise SourceError(f"{path}: {files[0]} {got}; metadata.json gives piece {k} of "
                              f"{shown(name)} as {list(local)}", path=path)
        if dtype is not None and info.dtype != dtype:
            raise SourceError(f"{path}: {shown(name)}'s pieces have dtypes {dtype} and "
                              f"{info.dtype}", path=path)
        dtype = info.dtype
        index = np.unravel_index(k, frags) if frags else ()
        box = tuple((int(i) * n, (int(i) + 1) * n) for i, n in zip(index, local))
        chosen.append((box, info))
    if pieces == 1:
        info = chosen[0][1]
        return dataclasses.replace(info, name=name, shape=shape, dtype=dtype)

    def load() -> np.ndarray:
        out = np.empty(shape, dtype=numpy_dtype(dtype))
        for box, part in chosen:
            out[tuple(slice(a, b) for a, b in box)] = part.load()
        return out

    return TensorInfo(name, shape, dtype, load)


__all__ = ["TRACKER", "find_iterations", "pick_iteration", "read_iteration"]
