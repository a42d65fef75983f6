"""ultralytics' networks as verify's PyTorch side: ``--torch-model ultralytics`` (the
architecture the checkpoint's own module describes) or ``--torch-model ultralytics:NAME.yaml``.

An ultralytics checkpoint pickles its whole ``DetectionModel``; ms-port reads it as data
(:mod:`ms_port.read.modules`), including the module's ``yaml`` attribute: the architecture
it was built from (layer table, scale, ``nc``). With ultralytics installed, that description
builds the same network with ultralytics' own code (its ``parse_model`` reads names and
``ast.literal_eval``s arguments: no ``eval``), and verify loads the file's tensors into it.
Nothing of the file is unpickled for this. ultralytics is AGPL-3.0: imported only here,
only when asked for.
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Callable
from typing import Any

from ...errors import TargetError, shown

PREFIX = "ultralytics"
INSTALL = ("pip install --no-deps ultralytics (AGPL-3.0; ms-port uses it only as verify's "
           "reference) with opencv-python-headless < 4.12")
#: ultralytics' task networks, by the class a checkpoint names
TASKS = ("DetectionModel", "SegmentationModel", "PoseModel", "OBBModel", "ClassificationModel")


def _tasks() -> Any:
    try:
        return importlib.import_module("ultralytics.nn.tasks")
    except ImportError as exc:
        raise TargetError(f"--torch-model ultralytics needs ultralytics ({exc}); {INSTALL}"
                          ) from None


def reference(name: str, described: Any) -> Callable[[], Any]:
    """A builder of the PyTorch network: from the checkpoint's own description (``name``
    empty) or from ultralytics' ``NAME.yaml`` (with the checkpoint's class count, where it
    holds one).

    Raises:
        TargetError: the checkpoint describes no ultralytics network and no yaml is named, or
            names a class that is not one of ultralytics' task networks.
    """
    cls_name = "DetectionModel"
    architecture = None
    if described is not None:
        module, _, cls_name = described.cls.rpartition(".")
        if module != "ultralytics.nn.tasks" or cls_name not in TASKS:
            raise TargetError(f"--torch-model ultralytics: the checkpoint's module is "
                              f"{shown(described.cls)}, not one of ultralytics' task networks "
                              f"({', '.join(TASKS)})")
        architecture = described.architecture
    if not name and architecture is None:
        raise TargetError("--torch-model ultralytics: the checkpoint holds no ultralytics "
                          "network description (a whole pickled DetectionModel with its yaml); "
                          "name one: --torch-model ultralytics:yolov8n.yaml")
    nc = architecture.get("nc") if architecture else None
    if nc is not None and (isinstance(nc, bool) or not isinstance(nc, int)
                           or not 0 < nc <= 100_000):
        raise TargetError(f"the checkpoint's architecture says nc {shown(nc)}; expected the "
                          "number of classes")

    def build() -> Any:
        tasks = _tasks()
        cfg = name or copy.deepcopy(architecture)
        kwargs = {"nc": nc} if nc is not None and cls_name != "ClassificationModel" else {}
        try:
            return getattr(tasks, cls_name)(cfg, verbose=False, **kwargs).float().eval()
        except Exception as exc:  # ultralytics' own code on the description
            raise TargetError(f"ultralytics could not build {shown(name or 'the checkpoint')}"
                              f"'s network ({type(exc).__name__}: {exc})") from exc

    return build


__all__ = ["INSTALL", "PREFIX", "TASKS", "reference"]
