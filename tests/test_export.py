"""export, beyond tests/test_inversion.py: every transform op undone, half and bf16 for
every architecture, a MindSpore training checkpoint, the leftover switches, casts, and the
CLI with a user's own networks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from torch import nn as tnn

import ms_port
from ms_port.cli import main
from ms_port.testing import seeded_torch_model
from tests import tiny_nets
from tests.arch_lists import round_trip_archs

REPO = Path(__file__).resolve().parents[1]
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

# Every kind of renaming and every transform op, written PyTorch -> MindSpore as for convert.
SMALL_MAP = r"""
rename:
  segments:
    norm: bn
  regex:
    - {from: 'stem\.(weight|bias)', to: 'encoder.conv.\1'}
tensors:
  proj_t: {source: proj.weight, transforms: [{transpose: [1, 0]}]}
  proj_b: proj.bias
  flat_table: {source: table, transforms: [{reshape: [24]}]}
"""


class TorchSmall(tnn.Module):
    """Conv1d (rule: unsqueeze), BatchNorm (rules: gamma/beta/moving_*), a transposed
    Linear and a flattened free parameter (mapping entries)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = tnn.Conv1d(3, 4, 3)
        self.norm = tnn.BatchNorm1d(4)
        self.proj = tnn.Linear(4, 6)
        self.table = tnn.Parameter(torch.zeros(2, 3, 4))


def small_state(dtype: torch.dtype = torch.float32) -> dict:
    torch.manual_seed(3)
    net = TorchSmall()
    with torch.no_grad():
        net.table.normal_()
        net.norm.running_mean.uniform_(-1, 1)
        net.norm.running_var.uniform_(0.5, 1.5)
        net.norm.num_batches_tracked.fill_(7)  # a real count, which MindSpore cannot keep
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in net.state_dict().items()}


def build_ms_small():
    """The MindSpore twin, every name different from the PyTorch one."""
    import mindspore as ms
    from mindspore import nn

    class Encoder(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv1d(3, 4, 3, has_bias=True, pad_mode="valid")

    class MsSmall(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = Encoder()
            self.bn = nn.BatchNorm1d(4)
            self.proj_t = ms.Parameter(ms.Tensor(np.zeros((4, 6), np.float32)))
            self.proj_b = ms.Parameter(ms.Tensor(np.zeros(6, np.float32)))
            self.flat_table = ms.Parameter(ms.Tensor(np.zeros(24, np.float32)))

    return MsSmall()


def _raw(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _assert_identical(before: dict, after: dict) -> None:
    """Same names in the same order, same dtypes and bytes; num_batches_tracked is 0."""
    assert list(after) == list(before)
    for name, tensor in before.items():
        back = after[name]
        assert back.dtype == tensor.dtype and back.shape == tensor.shape, name
        if name.endswith("num_batches_tracked"):
            assert back.item() == 0, name  # MindSpore keeps no step count: the honest 0
        else:
            assert _raw(back) == _raw(tensor), name


def _cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _small_ckpt(tmp_path: Path, dtype: torch.dtype = torch.float32) -> tuple[dict, Path, Path]:
    """A TorchSmall state dict, its MindSpore checkpoint and the mapping file."""
    state = small_state(dtype)
    pth, ckpt, mapping = tmp_path / "s.pth", tmp_path / "s.ckpt", tmp_path / "m.yaml"
    mapping.write_text(SMALL_MAP)
    torch.save(state, pth)
    assert ms_port.convert(pth, ms_model=build_ms_small(), mapping=mapping, output=ckpt).ok
    return state, ckpt, mapping


@pytest.fixture
def small(tmp_path) -> tuple[dict, Path, Path]:
    return _small_ckpt(tmp_path)


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_every_transform_op_is_undone(tmp_path, dtype):
    state, ckpt, mapping = _small_ckpt(tmp_path, DTYPES[dtype])
    report = ms_port.export(ckpt, torch_model=TorchSmall, ms_model=build_ms_small,
                            mapping=mapping, output=tmp_path / "back.pth")
    assert report.ok and report.written.readback == "bit-exact"
    undone = {m.target: [str(t) for t in m.transforms] for m in report.plan.matches}
    assert undone["stem.weight"] == ["squeeze(2)"]
    assert undone["proj.weight"] == ["transpose([1, 0])"]
    assert undone["table"] == ["reshape([2, 3, 4])"]
    assert report.plan.counts["restored"] == 1
    after = torch.load(tmp_path / "back.pth", weights_only=True)
    _assert_identical(state, after)
    TorchSmall().to(DTYPES[dtype]).load_state_dict(after, strict=True)


def test_ms_options_need_a_known_family(tmp_path, small):
    """--ms-option names a layout of a known --ms-model family; with a user's own network
    there is no family to read it, and export says so rather than ignore it."""
    from ms_port.errors import TargetError

    _, ckpt, mapping = small
    with pytest.raises(TargetError, match=r"--ms-option is for a known --ms-model family .* "
                                          r"no family was named or recognised"):
        ms_port.export(ckpt, torch_model=TorchSmall, ms_model=build_ms_small, mapping=mapping,
                       output=tmp_path / "back.pth",
                       ms_options={"use_interleaved_weight_layout_mlp": False})
    assert not (tmp_path / "back.pth").exists()


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("arch", [a for a in round_trip_archs() if a != "resnet18"])
def test_every_architecture_round_trips_in_half_precision(tmp_path, arch, dtype):
    state = {k: v.to(DTYPES[dtype]) if v.is_floating_point() else v
             for k, v in seeded_torch_model(arch, seed=4).state_dict().items()}
    pth, ckpt, back = tmp_path / "a.pth", tmp_path / "a.ckpt", tmp_path / "back.pth"
    torch.save(state, pth)
    assert ms_port.convert(pth, arch=arch, output=ckpt).ok
    assert ms_port.export(ckpt, arch=arch, output=back).ok
    after = torch.load(back, weights_only=True)
    _assert_identical(state, after)
    ms_port.get_arch(arch).build_torch().to(DTYPES[dtype]).load_state_dict(after, strict=True)
    for path in (pth, ckpt, back):  # pytest keeps three runs' tmp dirs: gigabytes otherwise
        path.unlink()


def test_mapping_transforms_stand_in_for_the_missing_network(tmp_path):
    """From a template alone a checkpoint cannot tell a Conv1d; a transforms: entry says
    so instead, and export undoes it."""
    state = tiny_nets.torch_state()
    mapping = tmp_path / "m.yaml"
    mapping.write_text("rename:\n  segments:\n    fc: head\n")
    pth, ckpt = tmp_path / "c.pth", tmp_path / "c.ckpt"
    torch.save(state, pth)
    assert ms_port.convert(pth, ms_model=tiny_nets.build_ms_head(), mapping=mapping,
                           output=ckpt).ok
    conv1d = tmp_path / "conv1d.yaml"
    conv1d.write_text("transforms:\n  - {match: 'conv1d\\.weight', ops: [{unsqueeze: 2}]}\n")
    report = ms_port.export(ckpt, target=pth, mapping=[mapping, conv1d],
                            output=tmp_path / "back.pth")
    assert report.ok, report.plan.problems()
    _assert_identical(state, torch.load(tmp_path / "back.pth", weights_only=True))


def test_training_checkpoint_needs_allow_unused(tmp_path, small):
    """A checkpoint saved from a MindSpore training cell carries the optimizer's state."""
    import mindspore as ms
    from mindspore import nn

    state, ckpt, mapping = small
    net = build_ms_small()
    assert ms.load_param_into_net(net, ms.load_checkpoint(str(ckpt))) == ([], [])
    train = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()),
                                nn.Momentum(net.trainable_params(), 0.01, 0.9))
    trained = tmp_path / "trained.ckpt"
    ms.save_checkpoint(train, str(trained))
    out = tmp_path / "back.pth"
    kwargs = {"torch_model": TorchSmall, "ms_model": build_ms_small, "mapping": mapping}

    refused = ms_port.export(trained, output=out, **kwargs)
    unused = {u.name for u in refused.plan.unused}
    assert not refused.ok and not out.exists() and not refused.plan.missing
    assert {"global_step", "learning_rate", "momentum", "moments.proj_t"} <= unused
    assert all(n in ("global_step", "learning_rate", "momentum") or n.startswith("moments.")
               for n in unused)

    report = ms_port.export(trained, output=out, allow_unused=True, **kwargs)
    assert report.ok
    _assert_identical(state, torch.load(out, weights_only=True))


def test_allow_missing(tmp_path, small, monkeypatch):
    """A PyTorch side wanting more than the checkpoint holds: refused, then allowed."""
    state, ckpt, mapping = small
    template = tmp_path / "template.pth"
    torch.save({**state, "extra.weight": torch.zeros(2, 2)}, template)
    out = tmp_path / "back.pth"
    args = ("export", ckpt, "--target", template, "--ms-model", f"{__name__}:build_ms_small",
            "--map", mapping, "-o", out, "--json")
    monkeypatch.chdir(REPO)

    refused = _cli(*args)
    data = json.loads(refused.stdout)
    assert refused.exit_code == 1 and not out.exists() and not data["ok"]
    assert [m["name"] for m in data["missing"]] == ["extra.weight"]

    allowed = _cli(*args, "--allow-missing")
    data = json.loads(allowed.stdout)
    assert allowed.exit_code == 0 and data["ok"] and data["filled"] == data["total"] - 1
    after = torch.load(out, weights_only=True)
    assert "extra.weight" not in after
    _assert_identical(state, after)


def test_cli_user_networks_to_safetensors(tmp_path, small, monkeypatch):
    """--torch-model, --ms-model, --map and an explicit --format, as a user types them."""
    from safetensors.torch import load_file

    state, ckpt, mapping = small
    out = tmp_path / "back.st"
    monkeypatch.chdir(REPO)
    result = _cli("export", ckpt, "--torch-model", f"{__name__}:TorchSmall",
                  "--ms-model", f"{__name__}:build_ms_small", "--map", mapping,
                  "-o", out, "--format", "safetensors", "--json")
    assert result.exit_code == 0, result.stdout + result.stderr
    data = json.loads(result.stdout)
    assert data["written"]["format"] == "safetensors"
    assert data["written"]["readback"] == "bit-exact"
    assert data["counts"]["restored"] == 1 and data["output"] == str(out)
    after = load_file(out)
    _assert_identical(state, {k: after[k] for k in state})
    TorchSmall().load_state_dict(after, strict=True)


def test_json_keys(tmp_path, small):
    _, ckpt, mapping = small
    report = ms_port.export(ckpt, torch_model=TorchSmall, ms_model=build_ms_small,
                            mapping=mapping, output=tmp_path / "back.pth")
    data = json.loads(json.dumps(report.to_dict()))
    assert {"ok", "message", "output", "source", "target", "filled", "total", "counts",
            "missing", "unused", "dropped", "conflicts", "lossy_casts", "tensors",
            "dry_run", "written", "nonfinite"} <= set(data)
    assert data["message"].startswith("exported 10 tensors")
    restored = next(t for t in data["tensors"] if t["target"] == "norm.num_batches_tracked")
    assert restored["how"] == "restored" and "restored as 0" in restored["detail"]


def test_dtype_cast_and_dry_run(tmp_path, monkeypatch):
    state, ckpt, mapping = _small_ckpt(tmp_path, torch.bfloat16)
    monkeypatch.chdir(REPO)
    common = ("export", ckpt, "--torch-model", f"{__name__}:TorchSmall", "--ms-model",
              f"{__name__}:build_ms_small", "--map", mapping)

    dry = _cli(*common, "--dry-run", "--json")
    assert dry.exit_code == 0 and json.loads(dry.stdout)["dry_run"]
    assert not list(tmp_path.glob("*back*"))

    out = tmp_path / "back32.pth"
    cast = _cli(*common, "-o", out, "--dtype", "float32", "-q")
    assert cast.exit_code == 0, cast.stdout + cast.stderr
    after = torch.load(out, weights_only=True)
    for name, tensor in state.items():
        want = tensor.float() if tensor.is_floating_point() else tensor
        if name.endswith("num_batches_tracked"):
            want = torch.zeros_like(tensor)
        assert after[name].dtype == want.dtype and torch.equal(after[name], want), name


def test_bad_invocations(tmp_path, small):
    _, ckpt, _ = small
    both = _cli("export", ckpt, "--arch", "resnet18", "--target", ckpt, "-o", tmp_path / "x")
    assert both.exit_code == 2 and "exactly one PyTorch side" in both.stderr
    no_out = _cli("export", ckpt, "--arch", "resnet18")
    assert no_out.exit_code == 2 and "--output" in no_out.stderr
    bad_format = _cli("export", ckpt, "--arch", "resnet18", "-o", tmp_path / "x",
                      "--format", "onnx")
    assert bad_format.exit_code == 2 and "onnx" in bad_format.stderr
    with pytest.raises(ms_port.MsPortError, match="unknown export format 'onnx'"):
        ms_port.export(ckpt, arch="resnet18", output=tmp_path / "x", format="onnx")
    with pytest.raises(ms_port.MsPortError, match="exactly one PyTorch target"):
        ms_port.export(ckpt, arch="resnet18", torch_model=TorchSmall, output=tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_report_renders_and_library_stays_quiet(tmp_path, small, capsys):
    _, ckpt, mapping = small
    capsys.readouterr()
    report = ms_port.export(ckpt, torch_model=TorchSmall, ms_model=build_ms_small,
                            mapping=mapping, output=tmp_path / "back.pth")
    assert capsys.readouterr() == ("", "")
    assert repr(report).startswith("ExportReport(ok=True, filled=10/10")
    html = report._repr_html_()
    assert "EXPORTED" in html and "restored 1" in html
