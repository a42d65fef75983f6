"""The torch-free zip reader agrees with torch.load, and never runs a pickle's code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from ms_port.errors import UnsafePickleError
from ms_port.read import torchzip
from ms_port.read.sources import read_source, torch_to_numpy


def _bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).tobytes()


def test_matches_torch_load_bit_for_bit(tmp_path):
    base = torch.randn(6, 4)
    state = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3)).state_dict()
    state.update({
        "half": torch.randn(5).half(), "bf16": torch.randn(2, 3).bfloat16(),
        "f64": torch.randn(3).double(), "i8": torch.arange(-4, 4, dtype=torch.int8),
        "u8": torch.arange(8, dtype=torch.uint8), "bool": torch.tensor([True, False]),
        "scalar": torch.tensor(2.5), "transposed": base.t(), "view": base[2:4, 1:3],
        "same_storage": base, "param": torch.nn.Parameter(torch.ones(3)),
    })
    path = tmp_path / "s.pth"
    torch.save(state, path)
    lazy = torchzip.load(path)
    assert isinstance(lazy, type(state)) and list(lazy) == list(state)
    for name, tensor in state.items():
        got = lazy[name].load()
        want = torch_to_numpy(tensor.detach().contiguous())
        assert got.shape == want.shape and got.dtype == want.dtype, name
        assert _bits(got) == _bits(want), name


def test_lists_without_importing_torch(tmp_path):
    path = tmp_path / "s.pth"
    torch.save({"model": {"w": torch.ones(2, 2)}, "epoch": 4}, path)
    code = ("import sys, ms_port; r = ms_port.inspect(sys.argv[1]); "
            "assert [t.name for t in r.tensors] == ['w'], r; "
            "assert 'torch' not in sys.modules and 'mindspore' not in sys.modules")
    subprocess.run([sys.executable, "-c", code, str(path)], check=True)


class _Evil:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
def test_code_in_a_pickle_never_runs(tmp_path, legacy):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pth"
    torch.save({"w": torch.ones(2), "payload": _Evil(marker)}, path,
               _use_new_zipfile_serialization=not legacy)
    with pytest.raises(UnsafePickleError, match=r"evil\.pth.*--unsafe-pickle"):
        read_source(path)
    assert not marker.exists()


def test_unknown_globals_fall_back_to_weights_only_torch_load(tmp_path):
    """A global outside our list but inside torch's (a torch.Size) still reads."""
    path = tmp_path / "s.pth"
    torch.save({"w": torch.ones(2), "shape": torch.Size([2])}, path)
    with pytest.raises(torchzip.Unsupported):
        torchzip.load(path)
    source = read_source(path)
    assert list(source.tensors) == ["w"]
    assert [s.name for s in source.skipped] == ["shape"]


def test_rows_are_read_alone_and_equal_the_whole_tensors_rows(tmp_path):
    """A span of rows (verify's vocabulary in spans, convert's stacked experts) is read
    from its own bytes, for contiguous, transposed and offset views alike."""
    import torch

    from ms_port.read.sources import read_source

    base = torch.arange(6 * 10, dtype=torch.float32).reshape(6, 10)
    tensors = {"plain": base, "transposed": base.t(), "offset": base[2:5, 1:9],
               "stacked": torch.arange(4 * 3 * 2, dtype=torch.int64).reshape(4, 3, 2)}
    torch.save(tensors, tmp_path / "t.pt")
    src = read_source(tmp_path / "t.pt")
    for name, tensor in tensors.items():
        info = src.tensors[name]
        assert info.rows_loader is not None
        whole = tensor.numpy()
        for a, b in ((0, 1), (1, 3), (0, whole.shape[0]), (2, 2)):
            assert np.array_equal(info.load_rows(a, b), whole[a:b]), (name, a, b)
    with pytest.raises(ValueError):
        src.tensors["plain"].load_rows(3, 7)
