"""MindYOLO targets recorded once per config, so that a conversion never imports MindSpore.

``--ms-model mindyolo:CONFIG.yaml`` builds MindYOLO's network to learn what alignment reads
of it: names, shapes, dtypes, layer kinds and their bases, and the constants the network
computes (YOLOv5's anchors). Building it imports MindSpore and MindYOLO (seconds, hundreds
of MiB). The first conversion of a config records that in the user's cache folder, under
the digest of what MindYOLO builds the network from (the config's merged ``network``
section and ``nc``) and of the MindYOLO, MindSpore and ms-port versions; every later
conversion of the same network (the same file, a copy, or another file merging to the
same network) reads the record and builds nothing.

A record is data read from disk: it is used only when it parses as a record of this
format for this key (every name a string, every shape a list of small non-negative
integers, every constant no larger than :data:`MAX_CONSTANT` values), and is otherwise
ignored and built again. It is written whole (a temporary file renamed into place) or not
at all; a cache folder that cannot be written costs only the build. The folder is
``$MS_PORT_CACHE`` when set (empty: no cache), else the platform's user cache folder
(``platformdirs``: ``~/.cache/ms-port`` on Linux).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from ... import __version__
from ...read.targets import Target, TargetTensor, zoo_tensor_row
from ...read.tensors import NUMPY_DTYPES, numpy_dtype
from .mindyolo import network_of, read_config

#: the record's layout; a record of another is ignored
FORMAT = 1
#: the most values a recorded constant holds (anchors: 18; an unbounded one is built)
MAX_CONSTANT = 1 << 16
#: the largest record read (yolov8x's: ~90 KiB)
MAX_RECORD_BYTES = 16 << 20
#: a recorded tensor's rank and elements at most (yolov8x's largest: 3.7M elements)
MAX_RANK = 8
MAX_NUMEL = 1 << 28


def cache_folder() -> Path | None:
    """Where records live: ``$MS_PORT_CACHE`` (empty: nowhere), else the user cache."""
    env = os.environ.get("MS_PORT_CACHE")
    if env is not None:
        return Path(env).expanduser() / "mindyolo" if env else None
    import platformdirs

    return Path(platformdirs.user_cache_dir("ms-port")) / "mindyolo"


def _key(config: str) -> str | None:
    """The digest of what MindYOLO builds the network from, or None: MindYOLO absent."""
    try:
        versions = {name: metadata.version(name) for name in ("mindyolo", "mindspore")}
    except metadata.PackageNotFoundError:
        return None
    network, nc = network_of(read_config(config), config)
    text = json.dumps({"format": FORMAT, **versions, "ms-port": __version__,
                       "network": network, "nc": nc}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _path(config: str) -> Path | None:
    folder, key = cache_folder(), _key(config)
    return None if folder is None or key is None else folder / f"{key}.json"


def recorded(spec: str) -> Target | None:
    """``mindyolo:CONFIG.yaml`` as recorded, or None: not recorded (or not readable as a
    record of this network, or no cache)."""
    config = spec.partition(":")[2]
    path = _path(os.path.expanduser(config))
    if path is None:
        return None
    try:
        if path.stat().st_size > MAX_RECORD_BYTES:
            return None
        record = json.loads(path.read_text())
        tensors = _tensors(record)
    except (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError,
            RecursionError, OverflowError, MemoryError):
        return None  # unreadable or not a record: built again, and recorded over
    if tensors is None:
        return None
    return Target("cell", spec, tensors, cls=record["cls"], notes=[
        f"{spec}: names, shapes, layer kinds and constants as MindYOLO built them before, "
        f"recorded in {path} (MindSpore not imported)"])


def _tensors(record: dict[str, Any]) -> dict[str, TargetTensor] | None:
    if (record.get("format") != FORMAT or not isinstance(record.get("cls"), str)
            or not isinstance(record.get("constants"), dict)
            or not isinstance(record.get("tensors"), list) or not record["tensors"]):
        return None
    constants = record["constants"]
    tensors = {}
    for name, shape, dtype, layer, lineage, path in record["tensors"]:
        if not (isinstance(name, str) and isinstance(dtype, str) and dtype in NUMPY_DTYPES
                and isinstance(shape, list) and len(shape) <= MAX_RANK
                and all(type(d) is int and 0 <= d <= MAX_NUMEL for d in shape)
                and math.prod(shape) <= MAX_NUMEL
                and isinstance(layer, (str, type(None))) and isinstance(path, (str, type(None)))
                and all(isinstance(c, str) for c in lineage)):
            return None
        value = None
        if name in constants:
            array = np.asarray(constants[name], dtype=numpy_dtype(dtype))
            if array.size > MAX_CONSTANT or array.shape != tuple(shape):
                return None
            value = array.copy
        tensors[name] = TargetTensor(name, tuple(shape), dtype, layer, tuple(lineage), value,
                                     path)
    return tensors


def remember(spec: str, target: Target) -> str | None:
    """Record a target MindYOLO built (:func:`recorded` reads it back): the note saying
    where, or None where it is not recorded (no cache, a constant too large, a folder that
    cannot be written)."""
    from ...match.rules import is_layer_param

    config = os.path.expanduser(spec.partition(":")[2])
    path = _path(config)
    if path is None:
        return None
    constants = {}
    for t in target.tensors.values():
        # a layer's own statistic is never taken as the network's constant (matching):
        # only the others' values are recorded
        if t.constant is not None and not is_layer_param(t.name):
            value = np.asarray(t.constant())
            if value.size > MAX_CONSTANT:
                return None
            constants[t.name] = value.tolist()
    record = {"format": FORMAT, "cls": target.cls,
              "tensors": [zoo_tensor_row(t) for t in target.tensors.values()],
              "constants": constants}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".record-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(record, f, separators=(",", ":"))
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError:
        return None
    return f"{spec}: recorded in {path}; its next conversion builds nothing"


__all__ = ["cache_folder", "recorded", "remember"]
