"""A conversion that strict matching refuses, and the fix: one edit to the saved plan.

    python examples/fix_a_mapping.py [WORKDIR]

Writes into WORKDIR (default: a temporary directory, removed afterwards).

The PyTorch checkpoint calls its classifier ``fc`` and registers it first; the MindSpore
network calls it ``logits`` and defines it last. No rule can know the names, and the
networks' order disagrees, so structural alignment will not guess either: the first
conversion writes nothing, ``report.ok`` is False and the plan names every tensor it could
not place, with the closest candidates. ``save_map=`` wrote the plan as a mapping file;
we add the missing pairs to its ``tensors:`` section (by hand you would edit the YAML: the
``# MISSING`` comments at its top say what to add), convert again with ``mapping=``, and
verify.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import rich
import torch
import yaml
from mindspore import nn

import ms_port


class TorchNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 3)  # registered first: its state dict lists it first
        self.body = torch.nn.Linear(16, 16)
        self.norm = torch.nn.LayerNorm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.norm(torch.relu(self.body(x))))


class MsNet(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Dense(16, 16)
        self.norm = nn.LayerNorm((16,), epsilon=1e-5)  # PyTorch's default eps
        self.logits = nn.Dense(16, 3)
        self.relu = nn.ReLU()

    def construct(self, x):
        return self.logits(self.norm(self.relu(self.body(x))))


def main(workdir: Path) -> int:
    torch.manual_seed(0)
    pth = workdir / "net.pth"
    torch.save(TorchNet().state_dict(), pth)
    ckpt = workdir / "net.ckpt"
    ckpt.unlink(missing_ok=True)  # from an earlier run into the same WORKDIR
    plan_file = workdir / "plan.yaml"

    first = ms_port.convert(pth, ms_model=MsNet(), output=ckpt, save_map=plan_file)
    print(f"first attempt ok: {first.ok}; written: {ckpt.exists()}")
    for problem in first.plan.problems():  # each names the closest candidates
        print(f"  - {problem}")
    print(f"\nplan saved as {plan_file.name}; its first lines:")
    print("\n".join(plan_file.read_text().splitlines()[:4]))

    # the fix: the MindSpore name on the left, the PyTorch name on the right
    mapping = yaml.safe_load(plan_file.read_text())
    mapping["tensors"]["logits.weight"] = "fc.weight"
    mapping["tensors"]["logits.bias"] = "fc.bias"
    plan_file.write_text(yaml.safe_dump(mapping, sort_keys=False))

    second = ms_port.convert(pth, ms_model=MsNet(), mapping=plan_file, output=ckpt)
    rich.print(second)
    if not second.ok:
        return 1
    parity = ms_port.verify(pth, ckpt, torch_model=TorchNet, ms_model=MsNet,
                            mapping=plan_file, input_shape=(16,), batch=4)
    rich.print(parity)
    return 0 if (not first.ok and parity.ok) else 1


if __name__ == "__main__":
    if len(sys.argv) > 1:
        Path(sys.argv[1]).mkdir(parents=True, exist_ok=True)
        sys.exit(main(Path(sys.argv[1])))
    with tempfile.TemporaryDirectory(prefix="ms-port-example-") as tmp:
        sys.exit(main(Path(tmp)))
