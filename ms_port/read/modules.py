"""Modules pickled whole, read as data: the names ``state_dict()`` would give, from the
module tree that :func:`ms_port.read.torchzip.load` (``modules=True``) kept as plain dicts.

``torch.save(model)``, ultralytics' ``best.pt``/``last.pt`` (``model``, ``ema``), YOLOv5's
and YOLOv7's checkpoints pickle an ``nn.Module`` tree, not a state dict. Each module's state
(what unpickling would set as its ``__dict__``) holds ``_parameters``, ``_buffers`` (less
``_non_persistent_buffers_set``) and ``_modules``; ``Module.state_dict`` walks exactly these,
depth first, parameters then buffers then children, skipping ``None``. Nothing here imports
or runs the module's code, so a class's own ``state_dict`` hooks and ``get_extra_state``
are not run: the report says so where a module has hooks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import SourceError, shown
from .torchzip import Instance

#: the container keys a whole-module checkpoint keeps its modules under, in the order
#: taken: ultralytics validates and exports with ``ema`` where it holds one (its own
#: loader takes ``ckpt.get("ema") or ckpt["model"]``)
MODULE_KEYS = ("ema", "model")
#: module trees nest a handful deep; anything past this is not a network
MAX_DEPTH = 64
#: names one module tree may give (shared children repeat theirs, as ``state_dict`` does:
#: a tree sharing at every level would otherwise give 2^depth names)
MAX_NAMES = 1 << 20
_HOOKS = ("_state_dict_hooks", "_state_dict_pre_hooks")


def is_module(value: Any) -> bool:
    """An object kept as data whose state is an ``nn.Module``'s."""
    return (isinstance(value, Instance) and isinstance(value.state, dict)
            and all(isinstance(value.state.get(k), Mapping)
                    for k in ("_parameters", "_buffers", "_modules")))


@dataclass
class ModuleRead:
    """What a whole-module checkpoint gave: its tree turned into state dicts."""

    tree: Any
    #: the key to read where the caller gave none (``ema`` over ``model``), else None
    preferred: str | None = None
    notes: list[str] = field(default_factory=list)
    #: each module's own description of itself, by key (``None``: the file is the module):
    #: its class and its plain-data ``yaml`` attribute (ultralytics' architecture), where
    #: it holds one
    described: dict[str | None, Description] = field(default_factory=dict)


@dataclass(frozen=True)
class Description:
    """What a pickled module says of itself, as data: its class (``module.Class``, never
    imported) and its ``yaml`` attribute where that is plain data (ultralytics keeps the
    architecture it was built from there: layer table, scale, ``nc``)."""

    cls: str
    architecture: dict[str, Any] | None = None
    #: the live module, where the file was unpickled with its code (``--unsafe-pickle``):
    #: verify's PyTorch side when the user names none
    module: Any = field(default=None, compare=False, repr=False)


def holds_modules(tree: Any) -> bool:
    """Whether the loaded object is a module, or a dict with one at its top level."""
    if is_module(tree):
        return True
    return isinstance(tree, Mapping) and any(is_module(v) for v in tree.values())


def read_modules(tree: Any, where: str) -> ModuleRead:
    """Each module at the top (or the top of a dict) as its state dict, and which to take.

    Raises:
        SourceError: a module tree with a cycle, deeper than :data:`MAX_DEPTH` or giving
            more than :data:`MAX_NAMES` names (``where`` names the file).
    """
    read = _read(tree, is_module, lambda m: _state_dict(m, where), _data_note)
    modules = {None: tree} if is_module(tree) else {
        str(k): v for k, v in tree.items() if is_module(v)}
    read.described = {k: Description(str(m.cls), _plain_dict(m.state.get("yaml")))
                      for k, m in modules.items()}
    return read


def _plain_dict(value: Any, depth: int = 0) -> Any:
    """``value`` where it is plain data (dicts with string keys, lists, strings, numbers,
    booleans, None) at most 32 deep, else ``None``."""
    if depth > 32:
        return None
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            inner = _plain_dict(v, depth + 1)
            if not isinstance(k, str) or (inner is None and v is not None):
                return None
            out[k] = inner
        return out if depth else out or None
    if isinstance(value, (list, tuple)):
        items = [_plain_dict(v, depth + 1) for v in value]
        if any(i is None and v is not None for i, v in zip(items, value)):
            return None
        return items
    if value is None or type(value) in (str, int, float, bool):
        return value
    return None


def live_modules(tree: Any) -> ModuleRead | None:
    """The same for a file unpickled with ``--unsafe-pickle``, whose modules are live
    ``torch.nn.Module`` objects (their own ``state_dict()``); ``None`` where it holds none."""
    import torch

    def live(value: Any) -> bool:
        return isinstance(value, torch.nn.Module)

    if not (live(tree) or (isinstance(tree, Mapping) and any(map(live, tree.values())))):
        return None
    read = _read(tree, live, lambda m: (dict(m.state_dict()), []), _live_note)
    modules = {None: tree} if live(tree) else {str(k): v for k, v in tree.items() if live(v)}
    read.described = {
        k: Description(f"{type(m).__module__}.{type(m).__qualname__}",
                       _plain_dict(getattr(m, "yaml", None)), module=m)
        for k, m in modules.items()}
    return read


def _read(tree: Any, module: Callable[[Any], bool],
          state: Callable[[Any], tuple[dict[str, Any], list[str]]],
          note: Callable[[Any, str | None], str]) -> ModuleRead:
    if module(tree):
        tensors, more = state(tree)
        return ModuleRead(tensors, None, [note(tree, None), *more])
    out: dict[Any, Any] = {}
    notes: list[str] = []
    found: list[str] = []
    for key, value in tree.items():
        if module(value):
            out[key], more = state(value)
            notes += [note(value, str(key)), *more]
            found.append(str(key))
        else:
            out[key] = value
    preferred = next((k for k in MODULE_KEYS if k in found), found[0] if found else None)
    others = [k for k in found if k != preferred]
    if preferred == "ema" and others:
        notes.append("read 'ema', the exponential moving average of the weights ultralytics "
                     "validates and exports with; --key " + others[0] + " reads the other")
    elif others:
        notes.append(f"read {shown(preferred)}; --key {others[0]} reads the other")
    return ModuleRead(out, preferred, notes)


def _data_note(module: Instance, key: str | None) -> str:
    at = f" under {shown(key)}" if key is not None else ""
    return (f"a whole pickled {shown(str(module.cls))}{at}: its tensors read as data, as "
            "state_dict() names them; its code was neither imported nor run")


def _live_note(module: Any, key: str | None) -> str:
    at = f" under {shown(key)}" if key is not None else ""
    cls = type(module)
    return (f"a whole pickled {shown(f'{cls.__module__}.{cls.__qualname__}')}{at}, unpickled "
            "with its code (--unsafe-pickle): its state_dict() read")


def _what(module: Instance, key: str | None) -> str:
    at = f" under {shown(key)}" if key is not None else ""
    return (f"a whole pickled {shown(str(module.cls))}{at}: its tensors read as data, as "
            "state_dict() names them; its code was neither imported nor run")


def _state_dict(root: Instance, where: str) -> tuple[dict[str, Any], list[str]]:
    out: dict[str, Any] = {}
    hooked: list[str] = []
    for name, value in _walk(root, "", (), where, hooked):
        out[name] = value
        if len(out) > MAX_NAMES:
            raise SourceError(f"{where}: its module tree gives more than {MAX_NAMES} tensor "
                              "names (submodules shared many times over?); not a network "
                              "ms-port can read")
    notes = []
    if hooked:
        notes.append(f"{len(hooked)} module(s) carry state_dict hooks (first: "
                     f"{shown(hooked[0] or '(the root)')}), which were not run: the names are "
                     "the module tree's")
    return out, notes


def _walk(module: Instance, prefix: str, path: tuple[int, ...], where: str,
          hooked: list[str]) -> Iterator[tuple[str, Any]]:
    if id(module) in path:
        raise SourceError(f"{where}: its module tree contains itself (at "
                          f"{shown(prefix or '(the root)')}); not a network ms-port can read")
    if len(path) >= MAX_DEPTH:
        raise SourceError(f"{where}: modules nested more than {MAX_DEPTH} deep (at "
                          f"{shown(prefix)}); not a network ms-port can read")
    state = module.state
    if any(isinstance(state.get(k), Mapping) and state.get(k) for k in _HOOKS):
        hooked.append(prefix.rstrip("."))
    skip = state.get("_non_persistent_buffers_set") or set()
    if not isinstance(skip, (set, frozenset)):
        raise SourceError(f"{where}: module {shown(prefix or '(the root)')} has a "
                          f"_non_persistent_buffers_set that is a {type(skip).__name__}")
    for name, value in state["_parameters"].items():
        if value is not None:
            yield f"{prefix}{name}", value
    for name, value in state["_buffers"].items():
        if value is not None and name not in skip:
            yield f"{prefix}{name}", value
    for name, child in state["_modules"].items():
        if child is None:
            continue
        if not is_module(child):
            raise SourceError(f"{where}: submodule {shown(prefix + str(name))} is a "
                              f"{shown(str(getattr(child, 'cls', type(child).__name__)))} "
                              "without a module's state; not a network ms-port can read")
        yield from _walk(child, f"{prefix}{name}.", (*path, id(module)), where, hooked)


__all__ = ["MAX_DEPTH", "MAX_NAMES", "MODULE_KEYS", "Description", "ModuleRead",
           "holds_modules", "is_module", "live_modules", "read_modules"]
