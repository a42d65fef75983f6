"""The whole path on a torchvision ResNet50: make a checkpoint, inspect, convert, verify.

    python examples/convert_resnet50.py [WORKDIR]

Writes into WORKDIR (default: a temporary directory, removed afterwards). Nothing is
downloaded: the weights are torchvision's seeded random initialisation, with BatchNorm
statistics moved away from 0/1 so that a wrong mapping would show in verify.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import rich

import ms_port
from ms_port.testing import save_reference_checkpoint


def main(workdir: Path) -> int:
    pth = save_reference_checkpoint("resnet50", workdir / "resnet50.pth", seed=0)

    # 1. what the checkpoint holds (a few of its 320 tensors; no data is loaded)
    rich.print(ms_port.inspect(pth, filter=r"^(conv1|bn1|fc)\."))

    # 2. match every tensor, write the .ckpt, read it back bit for bit
    report = ms_port.convert(pth, arch="resnet50", output=workdir / "resnet50.ckpt",
                             force=True)  # force: rerunning into the same WORKDIR
    rich.print(report)
    if not report.ok:
        return 1

    # 3. run both networks on the same seeded input and compare their outputs
    parity = ms_port.verify(pth, report.output, arch="resnet50")
    rich.print(parity)
    return 0 if parity.ok else 1


if __name__ == "__main__":
    if len(sys.argv) > 1:
        Path(sys.argv[1]).mkdir(parents=True, exist_ok=True)
        sys.exit(main(Path(sys.argv[1])))
    with tempfile.TemporaryDirectory(prefix="ms-port-example-") as tmp:
        sys.exit(main(Path(tmp)))
