"""export: pth -> ckpt -> pth is bit-identical, through the one rule set inverted."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import ms_port
from ms_port.cli import main
from ms_port.testing import seeded_torch_model
from tests import tiny_nets
from tests.arch_lists import round_trip_archs

REPO = Path(__file__).resolve().parents[1]
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _raw(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _cast(state: dict, dtype: torch.dtype) -> dict:
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}


def _assert_identical(before: dict, after: dict) -> None:
    assert list(after) == list(before)
    for name, tensor in before.items():
        back = after[name]
        if name.endswith("num_batches_tracked"):
            assert back.dtype == torch.int64 and back.shape == tensor.shape
            continue  # MindSpore keeps no step count; restored as 0
        assert back.dtype == tensor.dtype and back.shape == tensor.shape, name
        assert _raw(back) == _raw(tensor), name


def _round_trip_arch(arch: str, dtype: str, tmp_path: Path) -> None:
    state = _cast(seeded_torch_model(arch, seed=2).state_dict(), DTYPES[dtype])
    pth, ckpt, back = tmp_path / "a.pth", tmp_path / "a.ckpt", tmp_path / "back.pth"
    torch.save(state, pth)
    assert ms_port.convert(pth, arch=arch, output=ckpt).ok
    report = ms_port.export(ckpt, arch=arch, output=back)
    assert report.ok and report.written.readback == "bit-exact"
    assert report.plan.counts["restored"] == sum("num_batches" in k for k in state)
    after = torch.load(back, weights_only=True)
    _assert_identical(state, after)
    model = ms_port.get_arch(arch).build_torch().to(DTYPES[dtype])
    model.load_state_dict(after, strict=True)


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_resnet18_round_trip(tmp_path, dtype):
    _round_trip_arch("resnet18", dtype, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("arch", [a for a in round_trip_archs() if a != "resnet18"])
def test_every_architecture_round_trips(tmp_path, arch):
    _round_trip_arch(arch, "float32", tmp_path)


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_custom_network_with_mapping_round_trips(tmp_path, dtype):
    """Different names (fc -> head), Conv1d's layout transform, BatchNorm, LayerNorm…"""
    state = tiny_nets.torch_state(dtype=DTYPES[dtype])
    mapping = tmp_path / "m.yaml"
    mapping.write_text("rename:\n  segments:\n    fc: head\n")
    pth, ckpt, back = tmp_path / "c.pth", tmp_path / "c.ckpt", tmp_path / "back.safetensors"
    torch.save(state, pth)
    assert ms_port.convert(pth, ms_model=tiny_nets.build_ms_head(), mapping=mapping,
                           output=ckpt).ok
    # the checkpoint alone cannot tell a Conv1d from anything else: say what went wrong...
    blind = ms_port.export(ckpt, torch_model=tiny_nets.TorchNet, mapping=mapping, dry_run=True)
    assert not blind.ok and "conv1d.weight" in blind.plan.conflicts[0].message
    # ...and with the MindSpore network's layer types, Conv1d's layout is undone
    report = ms_port.export(ckpt, torch_model=tiny_nets.TorchNet, mapping=mapping,
                            ms_model=tiny_nets.build_ms_head, output=back)
    assert report.ok and report.written.format == "safetensors"
    conv1d = next(m for m in report.plan.matches if m.target == "conv1d.weight")
    assert [str(t) for t in conv1d.transforms] == ["squeeze(2)"]
    from safetensors.torch import load_file

    after = load_file(back)
    _assert_identical(state, {k: after[k] for k in state})
    tiny_nets.TorchNet().to(DTYPES[dtype]).load_state_dict(after, strict=True)


def _cli(*args):
    old = Path.cwd()
    os.chdir(REPO)
    try:
        return CliRunner().invoke(main, [str(a) for a in args])
    finally:
        os.chdir(old)


@pytest.fixture(scope="module")
def resnet18_ckpt(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("export")
    pth = root / "r18.pth"
    torch.save(seeded_torch_model("resnet18", seed=5).state_dict(), pth)
    ckpt = root / "r18.ckpt"
    assert ms_port.convert(pth, arch="resnet18", output=ckpt).ok
    return pth, ckpt


def test_cli_export_json_and_verify_both_directions(resnet18_ckpt, tmp_path):
    _, ckpt = resnet18_ckpt
    back = tmp_path / "back.pth"
    result = _cli("export", ckpt, "--arch", "resnet18", "-o", back, "--json")
    data = json.loads(result.stdout)
    assert result.exit_code == 0 and data["ok"] and data["output"] == str(back)
    assert data["filled"] == data["total"] == 122 and data["counts"]["restored"] == 20
    for first, second in ((back, ckpt), (ckpt, back)):
        result = _cli("verify", first, second, "--arch", "resnet18", "--input-shape",
                      "3,64,64", "--json", "--no-noise-floor")
        assert result.exit_code == 0, result.stdout
        assert json.loads(result.stdout)["ok"] is True


def test_strict_refusal_and_force(resnet18_ckpt, tmp_path):
    _, ckpt = resnet18_ckpt
    out = tmp_path / "wrong.pth"
    result = _cli("export", ckpt, "--arch", "resnet34", "-o", out)
    assert result.exit_code == 1 and "NOT EXPORTED" in result.stdout
    assert not out.exists()
    out.write_bytes(b"old")
    result = _cli("export", ckpt, "--arch", "resnet18", "-o", out)
    assert result.exit_code == 2 and "--force" in result.stderr and out.read_bytes() == b"old"
    result = _cli("export", ckpt, "--arch", "resnet18", "-o", out, "--force")
    assert result.exit_code == 0 and torch.load(out, weights_only=True)


def test_needs_exactly_one_torch_side(resnet18_ckpt, tmp_path):
    _, ckpt = resnet18_ckpt
    result = _cli("export", ckpt, "-o", tmp_path / "x.pth")
    assert result.exit_code == 2 and "exactly one PyTorch side" in result.stderr
