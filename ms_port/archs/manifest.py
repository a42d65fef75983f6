"""What each built-in architecture expects, recorded so that converting needs no MindSpore.

Building a MindSpore network means importing MindSpore (seconds, hundreds of MiB) to
learn a few hundred names and shapes. For the built-in architectures at their default
options those are recorded in ``manifests/<name>.json`` (names, shapes, dtypes, owning
layer types) and a test checks every manifest against the live network. Regenerate
after changing an architecture::

    python -m ms_port.archs.manifest
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


if __name__ == "__main__":
    for path in write_manifests(sys.argv[1:] or None):
        print(f"wrote {path}")
