"""What each built-in architecture and MindCV model expects, recorded so that converting
needs no MindSpore.

Building a MindSpore network means importing MindSpore (seconds, hundreds of MiB) to
learn a few hundred names and shapes. For the built-in architectures at their default
options those are recorded in ``manifests/<name>.json`` (names, shapes, dtypes, owning
layer types) and a test checks every manifest against the live network. Regenerate
after changing an architecture::

    python -m ms_port.archs.manifest

MindCV's models (``--ms-model mindcv:NAME``) are recorded in one archive,
``manifests/mindcv-<version>.zip``, a JSON member per model (a conversion reads only its
own: the whole record parsed took 0.8 s): for each model built by MindCV's own
``create_model`` (no weights drawn), its class and, per tensor, the name, shape, dtype,
the owning cell's class and its bases, and the path the network holds it under where that
differs from its name: what the plan's alignment reads of a live network. A model whose
network computes a constant when it is built (Swin's masks: its value is part of the
target) or that cannot be built on a CPU is not recorded, and is built as before.
Regenerate with MindCV installed (a test holds one model of each MindCV module to its live
network)::

    python -m ms_port.archs.manifest --mindcv
"""

from __future__ import annotations

import json
import sys
from typing import Any

from ..read.targets import MANIFESTS, Target, load_manifest  # noqa: F401 (load_manifest: where it lived)


def manifest_of(target: Target) -> dict[str, Any]:
    return {"name": target.description,
            "tensors": [[t.name, list(t.shape), t.dtype, t.layer]
                        for t in target.tensors.values()]}


def write_manifests(names: list[str] | None = None) -> list[str]:
    """Build each architecture's MindSpore network and record its manifest."""
    from pathlib import Path

    from ..read.targets import from_cell
    from .registry import get_arch, list_archs

    out = Path(__file__).with_name(MANIFESTS)
    out.mkdir(exist_ok=True)
    written = []
    for name in names or list_archs():
        target = from_cell(get_arch(name).build_mindspore(), name)
        path = out / f"{name}.json"
        path.write_text(json.dumps(manifest_of(target), separators=(",", ":")) + "\n")
        written.append(str(path))
    return written


def mindcv_record(names: list[str] | None = None) -> tuple[dict[str, Any], list[str]]:
    """MindCV's models as recorded (module docstring), and those left out with why."""
    from importlib.metadata import version

    import mindcv.models as zoo

    from ..read.targets import from_factory, zoo_tensor_row

    models: dict[str, Any] = {}
    left = []
    for name in names or zoo.list_models():
        try:  # as --ms-model builds it: without its weights, else the ordinary way
            target = from_factory(f"mindcv:{name}", recorded=False)
        except Exception as exc:  # MindCV's own code: built as before, at conversion
            left.append(f"{name}: cannot be built ({type(exc).__name__})")
            continue
        if any(t.constant is not None for t in target.tensors.values()):
            left.append(f"{name}: computes constants when it is built")
            continue
        models[name] = {"cls": target.cls,
                        "tensors": [zoo_tensor_row(t) for t in target.tensors.values()]}
    return {"mindcv": version("mindcv"), "models": models}, left


def write_mindcv() -> tuple[str, list[str]]:
    """Record MindCV's models (:func:`mindcv_record`) beside the manifests: one archive,
    a member per model, written the same way each time (sorted, no timestamps)."""
    import zipfile
    from pathlib import Path

    record, left = mindcv_record()
    path = Path(__file__).with_name(MANIFESTS) / f"mindcv-{record['mindcv']}.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        for name in sorted(record["models"]):
            info = zipfile.ZipInfo(f"{name}.json", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, json.dumps(record["models"][name], separators=(",", ":")))
    return str(path), left


if __name__ == "__main__":
    if sys.argv[1:] == ["--mindcv"]:
        written, skipped = write_mindcv()
        print(f"wrote {written}; not recorded (built at conversion):")
        for line in skipped:
            print(f"  {line}")
    else:
        for path in write_manifests(sys.argv[1:] or None):
            print(f"wrote {path}")
