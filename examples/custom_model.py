"""Your own network: a PyTorch module and a MindSpore cell that name things differently.

    python examples/custom_model.py [WORKDIR]

Writes into WORKDIR (default: a temporary directory, removed afterwards).

The two sides of a tiny vision transformer-ish network:

    PyTorch (TinyTorch)          MindSpore (TinyMs)
    features.0   Conv2d          stem.conv   nn.Conv2d
    features.1   BatchNorm2d     stem.bn     nn.BatchNorm2d   gamma/beta/moving_*
    pos          Embedding       pos         nn.Embedding     embedding_table
    norm         LayerNorm       norm        nn.LayerNorm     gamma/beta
    classifier   Linear          head        nn.Dense

The built-in rules already know each layer kind's tensor names (BatchNorm ``weight`` is
MindSpore's ``gamma``, Embedding ``weight`` its ``embedding_table``, …). What no rule can
guess is that ``features.0`` became ``stem.conv`` and ``classifier`` became ``head``:
that goes into a small YAML mapping file. Then convert and verify through the Python
API. The command-line equivalent, after ``python examples/custom_model.py out`` and with
this folder importable (``export PYTHONPATH=$PWD/examples; cd out``)::

    ms-port convert tiny.pth --ms-model custom_model:TinyMs --map tiny.yaml -o tiny.ckpt --force
    ms-port verify tiny.pth tiny.ckpt --torch-model custom_model:TinyTorch \\
        --ms-model custom_model:TinyMs --map tiny.yaml --input-shape 3,8,8
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import mindspore
import rich
import torch
from mindspore import nn, ops

import ms_port

# Names run PyTorch -> MindSpore. Regex renames are full matches on the PyTorch name;
# a segment rename replaces one whole dotted segment wherever it appears.
MAPPING = r"""
version: 1
description: TinyTorch -> TinyMs
rename:
  regex:
    - {from: 'features\.0\.(\w+)', to: 'stem.conv.\1'}
    - {from: 'features\.1\.(\w+)', to: 'stem.bn.\1'}
  segments:
    classifier: head
"""

CHANNELS, CLASSES, SIZE = 8, 4, 8  # input 3×SIZE×SIZE; one token per pixel


class TinyTorch(torch.nn.Module):
    """Conv stem, a learned position embedding per pixel, LayerNorm, mean-pool, Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, CHANNELS, 3, padding=1, bias=False),
            torch.nn.BatchNorm2d(CHANNELS),
            torch.nn.ReLU(),
        )
        self.pos = torch.nn.Embedding(SIZE * SIZE, CHANNELS)
        self.norm = torch.nn.LayerNorm(CHANNELS)
        self.classifier = torch.nn.Linear(CHANNELS, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.features(x).flatten(2).transpose(1, 2)  # B × H·W × C
        tokens = tokens + self.pos(torch.arange(tokens.shape[1]))
        return self.classifier(self.norm(tokens).mean(dim=1))


class Stem(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, CHANNELS, 3, pad_mode="pad", padding=1)
        self.bn = nn.BatchNorm2d(CHANNELS)
        self.relu = nn.ReLU()

    def construct(self, x):
        return self.relu(self.bn(self.conv(x)))


class TinyMs(nn.Cell):
    """The MindSpore twin of :class:`TinyTorch`, with MindSpore's names."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = Stem()
        self.pos = nn.Embedding(SIZE * SIZE, CHANNELS)
        # MindSpore's LayerNorm defaults to epsilon=1e-7, PyTorch's to eps=1e-5: a model
        # ported layer by layer must say so, or its outputs drift (verify would show it)
        self.norm = nn.LayerNorm((CHANNELS,), epsilon=1e-5)
        self.head = nn.Dense(CHANNELS, CLASSES)

    def construct(self, x):
        tokens = self.stem(x).flatten(start_dim=2).transpose(0, 2, 1)  # B × H·W × C
        tokens = tokens + self.pos(ops.arange(tokens.shape[1], dtype=mindspore.int32))
        return self.head(self.norm(tokens).mean(axis=1))


def trained_checkpoint(path: Path) -> Path:
    """Stand-in for your trained weights: seeded, BatchNorm statistics away from 0/1."""
    torch.manual_seed(0)
    net = TinyTorch()
    with torch.no_grad():
        bn = net.features[1]
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 1.5)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
    torch.save(net.state_dict(), path)
    return path


def main(workdir: Path) -> int:
    pth = trained_checkpoint(workdir / "tiny.pth")
    mapping = workdir / "tiny.yaml"
    mapping.write_text(MAPPING)

    # the target is a live Cell: its parameter names and shapes are what must be filled
    report = ms_port.convert(pth, ms_model=TinyMs(), mapping=mapping,
                             output=workdir / "tiny.ckpt", force=True)
    rich.print(report)
    print("how each MindSpore tensor was filled:")
    for m in report.plan.matches:
        print(f"  {m.target:<22} <- {m.source:<22} {m.how} ({m.detail})")
    if not report.ok:
        return 1

    # both networks built from their classes (or factories), each loads its own file
    parity = ms_port.verify(pth, report.output, torch_model=TinyTorch, ms_model=TinyMs,
                            mapping=mapping, input_shape=(3, SIZE, SIZE), batch=2)
    rich.print(parity)
    return 0 if parity.ok else 1


if __name__ == "__main__":
    if len(sys.argv) > 1:
        Path(sys.argv[1]).mkdir(parents=True, exist_ok=True)
        sys.exit(main(Path(sys.argv[1])))
    with tempfile.TemporaryDirectory(prefix="ms-port-example-") as tmp:
        sys.exit(main(Path(tmp)))
