"""Tiny checkpoints in ultralytics' format, made without ultralytics.

ultralytics saves ``{"model": DetectionModel (float16), "ema": ..., "train_args": ...,
"date": ..., "version": ...}`` with ``torch.save``: whole ``nn.Module`` objects, pickled by
reference to their classes (``ultralytics.nn.tasks.DetectionModel``,
``ultralytics.nn.modules.conv.Conv``, …). The classes here are small stand-ins registered
under those module names only while a file is saved, so the file names exactly the globals
a real one does; reading it must then need none of them.
"""

from __future__ import annotations

import contextlib
import copy
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

#: the modules a real ultralytics checkpoint names, and the stand-in classes of each
MODULES = {
    "ultralytics.nn.tasks": ("DetectionModel",),
    "ultralytics.nn.modules.conv": ("Conv",),
    "ultralytics.nn.modules.block": ("C2f", "Bottleneck", "DFL"),
    "ultralytics.nn.modules.head": ("Detect",),
    "ultralytics.utils": ("IterableSimpleNamespace",),
}


class Conv(nn.Module):
    def __init__(self, c1: int, c2: int, k: int = 1, s: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, k // 2, bias=False)
        self.bn = nn.BatchNorm2d(c2, eps=1e-3, momentum=0.03)
        self.act = nn.SiLU()


class Bottleneck(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.cv1, self.cv2 = Conv(c, c, 3), Conv(c, c, 3)
        self.add = True


class C2f(nn.Module):
    def __init__(self, c1: int, c2: int) -> None:
        super().__init__()
        self.c = c2 // 2
        self.cv1, self.cv2 = Conv(c1, 2 * self.c), Conv(3 * self.c, c2)
        self.m = nn.ModuleList([Bottleneck(self.c)])


class DFL(nn.Module):
    def __init__(self, c1: int = 16) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c1, 1, 1, bias=False).requires_grad_(False)
        self.c1 = c1


class Detect(nn.Module):
    def __init__(self, nc: int, ch: tuple[int, ...]) -> None:
        super().__init__()
        self.nc, self.nl, self.reg_max = nc, len(ch), 4
        self.no = nc + 4 * self.reg_max
        self.stride = torch.zeros(self.nl)  # attributes, outside the state dict
        self.anchors, self.strides = torch.empty(0), torch.empty(0)
        self.cv2 = nn.ModuleList(nn.Sequential(Conv(x, 8, 3), nn.Conv2d(8, 4 * self.reg_max, 1))
                                 for x in ch)
        self.cv3 = nn.ModuleList(nn.Sequential(Conv(x, 8, 3), nn.Conv2d(8, nc, 1)) for x in ch)
        self.dfl = DFL(self.reg_max)
        # a non-persistent buffer: state_dict leaves it out
        self.register_buffer("scratch", torch.zeros(2), persistent=False)


class IterableSimpleNamespace(types.SimpleNamespace):
    pass


class DetectionModel(nn.Module):
    def __init__(self, nc: int = 4) -> None:
        super().__init__()
        self.model = nn.Sequential(Conv(3, 8, 3, 2), C2f(8, 8), Detect(nc, (8,)))
        self.stride = torch.tensor([8.0, 16.0, 32.0])
        self.names = {i: str(i) for i in range(nc)}
        self.yaml = {"nc": nc, "scale": "n"}
        self.args = IterableSimpleNamespace(imgsz=64, task="detect")
        self.save = [1]


_CLASSES = {c.__name__: c for c in (Conv, Bottleneck, C2f, DFL, Detect,
                                    IterableSimpleNamespace, DetectionModel)}


@contextlib.contextmanager
def registered(prefix: str = "ultralytics") -> Iterator[None]:
    """The stand-ins importable under ``prefix``'s module names while inside (pickle saves
    a class by reference and checks it can find it there); restored after."""
    saved = {name: sys.modules.get(name) for name in _all_names(prefix)}
    old = {c: (c.__module__, c.__qualname__) for c in _CLASSES.values()}
    try:
        for name in _all_names(prefix):
            sys.modules[name] = types.ModuleType(name)
        for module, classes in MODULES.items():
            module = module.replace("ultralytics", prefix, 1)
            for cls in classes:
                setattr(sys.modules[module], cls, _CLASSES[cls])
                _CLASSES[cls].__module__ = module
        yield
    finally:
        for cls, (module, qual) in old.items():
            cls.__module__, cls.__qualname__ = module, qual
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def _all_names(prefix: str) -> list[str]:
    names = set()
    for module in MODULES:
        parts = module.replace("ultralytics", prefix, 1).split(".")
        names.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return sorted(names)


def tiny_detector(seed: int = 0) -> DetectionModel:
    """A seeded stand-in with BatchNorm statistics off their initial values."""
    torch.manual_seed(seed)
    model = DetectionModel()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.num_batches_tracked.fill_(7)
    return model.eval()


def save_ultralytics(path: Path, model: nn.Module, *, form: str = "released",
                     prefix: str = "ultralytics", **extra: Any) -> Path:
    """Save as ultralytics does: ``released`` (best.pt after strip_optimizer: ``model``
    float16, ``ema`` None), ``training`` (last.pt: ``model`` None, ``ema`` float16 with a
    float16 optimizer state) or ``both`` (older releases: ``model`` and ``ema``)."""
    half = copy.deepcopy(model).half()
    ema = copy.deepcopy(model)
    with torch.no_grad():
        for p in ema.parameters():
            p.add_(0.01)
    ema = ema.half()
    with registered(prefix):
        ckpt = {"date": "2026-11-28T00:00:00", "version": "8.4.190", "license": "AGPL-3.0",
                "epoch": -1, "best_fitness": None,
                "model": None if form == "training" else half,
                "ema": None if form == "released" else ema,
                "updates": 10 if form != "released" else None,
                "optimizer": ({"state": {0: {"momentum_buffer": torch.zeros(3).half()}},
                               "param_groups": [{"lr": 0.01, "params": [0]}]}
                              if form == "training" else None),
                "train_args": {"model": "yolov8n.yaml", "imgsz": 64, "epochs": 1},
                "train_metrics": {}, **extra}
        torch.save(ckpt, path)
    return path


class Planted:
    """An object whose unpickling calls ``os.system``: what a hostile file plants."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> Any:
        import os

        return (os.system, (self.command,))

    def __deepcopy__(self, memo: Any) -> Planted:  # copy.deepcopy would call the reduce
        return self
