"""Matching and convert: rules, mapping tables, targets, strictness, dtypes, outputs."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
import torch
import yaml
from click.testing import CliRunner

import ms_port
from ms_port.cli import main
from ms_port.errors import MappingError, TargetError
from ms_port.match.mapping import parse_mapping
from ms_port.match.rules import RULES, propose
from ms_port.read.sources import read_source, torch_to_numpy
from ms_port.read.targets import from_cell
from tests import tiny_nets

REPO = Path(__file__).resolve().parents[1]


def _save(state: dict, path: Path) -> Path:
    torch.save(state, path)
    return path


@pytest.fixture
def src(tmp_path) -> Path:
    return _save(tiny_nets.torch_state(), tmp_path / "tiny.pth")


def _cli(*args: str, cwd: Path = REPO):
    old = Path.cwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(main, [str(a) for a in args])
    finally:
        os.chdir(old)


def _load_into(cell, path: Path, fmt: str = "ckpt") -> None:
    """MindSpore's own loader must fill every parameter and use every entry."""
    params = ms.load_checkpoint(str(path), format=fmt)
    not_loaded, unused = ms.load_param_into_net(cell, params)
    assert not_loaded == [] and unused == [], (not_loaded, unused)


def _GrnNet():
    """MindCV's GRN: gamma and beta of 1×1×1×C, a layer of no kind a rule names."""
    from mindspore import Parameter, Tensor, nn

    class GRN(nn.Cell):
        def __init__(self):
            super().__init__()
            self.gamma = Parameter(Tensor(np.ones((1, 1, 1, 6), np.float32)))
            self.beta = Parameter(Tensor(np.zeros((1, 1, 1, 6), np.float32)))

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.grn = GRN()

    return Net()


def test_every_rule_fires_on_a_tiny_net(src, tmp_path):
    cell = tiny_nets.build_ms()
    plan = ms_port.plan(src, ms_model=cell)
    assert plan.ok, plan.problems()
    # InstanceNorm lives in its own net: MindSpore 2.10 has no CPU kernel for it, and a
    # template target cannot tell it from a BatchNorm (see the initialised-values test)
    details = " ".join(m.detail for m in plan.matches) + " " + " ".join(
        m.detail for m in ms_port.plan(_save(_inorm_torch().state_dict(prefix="norm."),
                                             tmp_path / "in.pth"), ms_model=_InormNet).matches)
    grn = ms_port.plan(_save({"grn.weight": torch.rand(6), "grn.bias": torch.rand(6)},
                             tmp_path / "grn.pth"), ms_model=_GrnNet)
    details += " " + " ".join(m.detail for m in grn.matches)
    assert grn.ok and {m.target: [str(t) for t in m.transforms] for m in grn.matches} == {
        "grn.gamma": ["reshape([1, 1, 1, 6])"], "grn.beta": ["reshape([1, 1, 1, 6])"]}
    for rule in RULES:
        assert rule.name in details, f"rule {rule.name} never fired"
    by_target = {m.target: m for m in plan.matches}
    assert by_target["bn.moving_variance"].source == "bn.running_var"
    assert by_target["emb.embedding_table"].source == "emb.weight"
    assert by_target["act.w"].source == "act.weight"
    assert by_target["ln.gamma"].source == "ln.weight"
    assert [str(t) for t in by_target["conv1d.weight"].transforms] == ["unsqueeze(2)"]
    assert by_target["bn3d.bn2d.moving_mean"].source == "bn3d.running_mean"
    assert sorted(d.name for d in plan.dropped) == ["bn.num_batches_tracked",
                                                    "bn1d.num_batches_tracked",
                                                    "bn3d.num_batches_tracked"]

    out = tmp_path / "tiny.ckpt"
    report = ms_port.convert(src, ms_model=cell, output=out)
    assert report.ok and report.written.readback == "bit-exact"
    _load_into(tiny_nets.build_ms(), out)
    params = ms.load_checkpoint(str(out))
    state = tiny_nets.torch_state()
    np.testing.assert_array_equal(params["conv1d.weight"].asnumpy(),
                                  state["conv1d.weight"].numpy()[:, :, None, :])
    np.testing.assert_array_equal(params["bn.moving_mean"].asnumpy(),
                                  state["bn.running_mean"].numpy())


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_rules_need_the_layer_kind(rule):
    """A rule renames only inside a layer of its kind: a Dense weight never becomes gamma.
    A rule of no kind (``affine``: MindCV's GRN) fires where the layer holds exactly its
    signature, never in a layer of a kind it excludes or holding more."""
    for ms_suffix, torch_suffix in rule.params.items():
        siblings = {"x": frozenset(rule.params) | {"weight", "bias"}}
        assert propose(f"x.{torch_suffix}", {"x": "Dense"}, siblings) == []
        if not rule.cells:
            assert propose(f"x.{torch_suffix}", {"x": "GRN"}, siblings) == []  # holds more
            siblings = {"x": rule.signature}
            assert propose(f"x.{torch_suffix}", {"x": "Dense"}, siblings) == []
        kind = sorted(rule.cells)[0] if rule.cells else "GRN"
        hits = propose(f"x.{torch_suffix}", {"x": kind}, siblings)
        assert f"x.{ms_suffix}" in [p.target for p in hits]


def test_rules_follow_the_class_hierarchy(tmp_path):
    """MindCV's ConvNextLayerNorm subclasses LayerNorm: the LayerNorm rule fits it."""
    from mindspore import nn

    class ConvNextLayerNorm(nn.LayerNorm):
        pass

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.norm = ConvNextLayerNorm((3,))

    path = _save({"norm.weight": torch.rand(3), "norm.bias": torch.rand(3)}, tmp_path / "n.pth")
    plan = ms_port.plan(path, ms_model=Net)
    assert plan.ok, plan.problems()
    assert {(m.target, m.source, m.how) for m in plan.matches} == {
        ("norm.gamma", "norm.weight", "rule"), ("norm.beta", "norm.bias", "rule")}
    assert from_cell(Net()).tensors["norm.gamma"].lineage[:2] == ("ConvNextLayerNorm",
                                                                   "LayerNorm")


def test_batchnorm3d_parameters_nested_under_bn2d(tmp_path):
    """mindspore.nn.BatchNorm3d keeps gamma/beta/moving_* in a nested 'bn2d' cell."""
    from mindspore import nn

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.bn = nn.BatchNorm3d(4)

    bn = torch.nn.BatchNorm3d(4)
    path = _save(bn.state_dict(prefix="bn."), tmp_path / "bn3d.pth")
    plan = ms_port.plan(path, ms_model=Net)
    assert plan.ok, plan.problems()
    assert {(m.target, m.source) for m in plan.matches} == {
        ("bn.bn2d.gamma", "bn.weight"), ("bn.bn2d.beta", "bn.bias"),
        ("bn.bn2d.moving_mean", "bn.running_mean"),
        ("bn.bn2d.moving_variance", "bn.running_var")}


class _InormNet(ms.nn.Cell):
    def __init__(self):
        super().__init__()
        self.norm = ms.nn.InstanceNorm2d(4)


def _inorm_torch() -> torch.nn.Module:
    inorm = torch.nn.InstanceNorm2d(4, affine=True)
    with torch.no_grad():
        inorm.weight.uniform_(0.5, 1.5)
    return inorm


def test_instancenorm_statistics_are_initialised_and_reported(tmp_path):
    """MindSpore's InstanceNorm keeps moving statistics PyTorch's affine one lacks: they
    are filled with a fresh layer's values and reported as initialised, never silently."""
    Net = _InormNet
    inorm = _inorm_torch()
    path = _save(inorm.state_dict(prefix="norm."), tmp_path / "in.pth")
    plan = ms_port.plan(path, ms_model=Net)
    assert plan.ok, plan.problems()
    how = {m.target: (m.how, m.source, m.init) for m in plan.matches}
    assert how["norm.gamma"] == ("rule", "norm.weight", None)
    assert how["norm.moving_mean"] == ("initialised", "", "zeros")
    assert how["norm.moving_variance"] == ("initialised", "", "ones")
    assert plan.counts["initialised"] == 2
    out = tmp_path / "in.ckpt"
    report = ms_port.convert(path, ms_model=Net, output=out, save_map=tmp_path / "in.yaml")
    assert report.ok and report.written.readback == "bit-exact"
    params = ms.load_checkpoint(str(out))
    np.testing.assert_array_equal(params["norm.moving_variance"].asnumpy(), np.ones(4))
    saved = yaml.safe_load((tmp_path / "in.yaml").read_text())
    assert saved["tensors"]["norm.moving_variance"] == {"init": "ones"}
    # the saved plan converts the same; the way back leaves the statistics out, by name
    again = ms_port.plan(path, ms_model=Net, mapping=tmp_path / "in.yaml")
    assert {m.target: m.init for m in again.matches} == {m.target: m.init for m in plan.matches}

    class TorchNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.InstanceNorm2d(4, affine=True)

    back = ms_port.export(out, torch_model=TorchNet, ms_model=Net, output=tmp_path / "b.pth")
    assert back.ok, back.plan.problems()
    assert {d.name for d in back.plan.dropped} == {"norm.moving_mean", "norm.moving_variance"}
    assert torch.equal(torch.load(tmp_path / "b.pth")["norm.weight"], inorm.weight.detach())


def test_declared_values_fill_targets_pytorch_lacks(tmp_path):
    from mindspore import Parameter, nn

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc = nn.Dense(3, 2)
            self.temperature = Parameter(ms.Tensor(np.ones(1, np.float32)), name="temperature")

    fc = torch.nn.Linear(3, 2)
    path = _save(fc.state_dict(prefix="fc."), tmp_path / "fc.pth")
    assert not ms_port.plan(path, ms_model=Net).ok  # nothing fills it: refused
    mapping = {"tensors": {"temperature": {"init": 0.5}}}
    plan = ms_port.plan(path, ms_model=Net, mapping=mapping)
    assert plan.ok and plan.counts["initialised"] == 1
    ((_, array),) = [(m, a) for m, a in plan.arrays() if m.target == "temperature"]
    np.testing.assert_array_equal(array, np.full(1, 0.5, np.float32))
    for bad in ("x", float("nan"), float("inf")):
        with pytest.raises(MappingError, match=r"tensors.temperature.*init"):
            ms_port.plan(path, ms_model=Net, mapping={"tensors": {"temperature": {"init": bad}}})


def test_a_custom_gamma_is_not_a_norm(tmp_path):
    from mindspore import Parameter, nn

    class Scale(nn.Cell):
        def __init__(self):
            super().__init__()
            self.gamma = Parameter(ms.Tensor(np.ones(3, np.float32)), name="gamma")

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.s = Scale()

    path = _save({"s.weight": torch.ones(3)}, tmp_path / "s.pth")
    plan = ms_port.plan(path, ms_model=Net(), align=False)  # names and rules only
    assert not plan.ok
    assert [m.name for m in plan.missing] == ["s.gamma"]
    assert [u.name for u in plan.unused] == ["s.weight"]
    # the structure pairs them (each layer's lone tensor, same place, same size): flagged
    # as aligned with that evidence, never as the LayerNorm rule
    (match,) = ms_port.plan(path, ms_model=Net()).matches
    assert match.how == "aligned" and "norm" not in match.detail


def test_mint_target_matches_exactly(tmp_path):
    torch.manual_seed(0)
    module = torch.nn.ModuleDict({"bn": torch.nn.BatchNorm2d(6), "fc": torch.nn.Linear(6, 5)})
    path = _save(module.state_dict(), tmp_path / "m.pth")
    plan = ms_port.plan(path, ms_model=tiny_nets.build_mint())
    assert plan.ok and plan.counts["exact"] == len(plan.matches)
    assert "bn.num_batches_tracked" in {m.target for m in plan.matches}
    assert plan.dropped == []


def test_strict_refusal_names_the_closest_candidate(src, tmp_path):
    out = tmp_path / "out.ckpt"
    result = _cli("convert", src, "--ms-model", "tests.tiny_nets:build_ms_head", "-o", out,
                  "--no-align")
    assert result.exit_code == 1
    assert "no source tensor for 'head.weight'" in result.stdout
    assert "closest: 'fc.weight'" in result.stdout
    assert not out.exists() and not list(tmp_path.glob(".out.ckpt*"))
    data = json.loads(_cli("convert", src, "--ms-model", "tests.tiny_nets:build_ms_head",
                           "-o", out, "--json", "--no-align").stdout)
    assert data["ok"] is False and data["filled"] == data["total"] - 2
    assert {m["name"] for m in data["missing"]} == {"head.weight", "head.bias"}
    assert data["missing"][0]["candidates"][0] == "fc.weight"
    assert {u["name"] for u in data["unused"]} == {"fc.weight", "fc.bias"}


@pytest.mark.parametrize("prefix", ["", "module."], ids=["plain", "DDP-wrapped"])
def test_a_meta_tensor_is_why_nothing_fills_its_target(tmp_path, prefix):
    """inspect lists a meta tensor as skipped; convert's leftover says the same, with the
    fix, rather than "no source tensor" alone — from the skipped entry's own reason."""
    path = _save({f"{prefix}w": torch.empty(3, device="meta"), f"{prefix}b": torch.ones(2)},
                 tmp_path / "meta.pth")
    template = tmp_path / "t.ckpt"
    ms.save_checkpoint([{"name": n, "data": ms.Tensor(np.zeros(k, np.float32))}
                        for n, k in (("w", 3), ("b", 2))], str(template))
    plan = ms_port.plan(path, target=template)
    assert not plan.ok and [m.name for m in plan.missing] == ["w"]
    assert plan.missing[0].skipped == plan.source.skipped[0]
    (line,) = plan.problems()
    assert line.startswith(f"no source tensor for 'w' (3): the source holds '{prefix}w' as "
                           "tensor (meta), which was skipped: a meta tensor has a shape but "
                           "no data; re-save the checkpoint with real tensors"), line
    out = tmp_path / "o.ckpt"
    result = _cli("convert", path, "--target", template, "-o", out)
    assert result.exit_code == 1 and not out.exists()
    assert line in " ".join(result.stdout.split())  # as printed, rich's wrapping undone
    data = json.loads(_cli("convert", path, "--target", template, "-o", out, "--json").stdout)
    assert data["missing"][0]["skipped"]["kind"] == "tensor (meta)"


def test_alignment_pairs_what_names_cannot(src, tmp_path):
    """The classifier is 'fc' in PyTorch and 'head' in MindSpore: the only unpaired layer
    on each side, same kind and shapes — aligned, with the evidence, and bit-exact."""
    out = tmp_path / "out.ckpt"
    report = ms_port.convert(src, ms_model=tiny_nets.build_ms_head, output=out)
    assert report.ok, report.plan.problems()
    aligned = {m.target: m for m in report.plan.matches if m.how == "aligned"}
    assert {t: m.source for t, m in aligned.items()} == {"head.weight": "fc.weight",
                                                         "head.bias": "fc.bias"}
    assert "fc -> head" in aligned["head.weight"].detail
    assert report.plan.counts["aligned"] == 2 and report.written.readback == "bit-exact"


MAPS = {
    "segments": "rename:\n  segments:\n    fc: head\n",
    "regex": "rename:\n  regex:\n    - {from: '^fc\\.(\\w+)$', to: 'head.\\1'}\n",
    "tensors": "tensors:\n  head.weight: fc.weight\n  head.bias: fc.bias\n",
}


@pytest.mark.parametrize("kind", sorted(MAPS))
def test_mapping_file_bridges_names(src, tmp_path, kind):
    mapping = tmp_path / "m.yaml"
    mapping.write_text(MAPS[kind])
    out = tmp_path / "out.ckpt"
    result = _cli("convert", src, "--ms-model", "tests.tiny_nets:build_ms_head", "-o", out,
                  "--map", mapping, "--json")
    data = json.loads(result.stdout)
    assert result.exit_code == 0 and data["ok"], data
    head = next(t for t in data["tensors"] if t["target"] == "head.weight")
    assert head["source"] == "fc.weight" and head["how"] == "mapping"
    _load_into(tiny_nets.build_ms_head(), out)


def test_mapping_drop_and_allow_missing(src, tmp_path):
    mapping = tmp_path / "m.yaml"
    mapping.write_text("drop:\n  - 'fc\\..*'\n")
    plan = ms_port.plan(src, ms_model=tiny_nets.build_ms_head(), mapping=mapping,
                        allow_missing=True)
    assert plan.ok and [m.name for m in plan.missing] == ["head.weight", "head.bias"]
    assert {d.name for d in plan.dropped} >= {"fc.weight", "fc.bias"}


@pytest.mark.parametrize(("text", "message"), [
    ("rename: [oops", r"YAML syntax error at line 1"),
    ("renames: {}", r"invalid section 'renames'"),
    ("rename:\n  regex:\n    - {from: '(', to: x}\n", r"rename\.regex\[0\]: bad regex '\('"),
    ("rename:\n  regex:\n    - {from: 'a', to: '\\2'}\n", r"bad replacement"),
    ("tensors:\n  a: {source: b, transforms: [{rotate: 1}]}\n", r"unknown transform 'rotate'"),
    ("drop: '.*'\n", r"invalid drop: expected a list"),
])
def test_mapping_validation_names_file_and_entry(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(MappingError, match=message) as info:
        ms_port.load_mapping(path)
    assert str(path) in info.value.message


@pytest.mark.parametrize(("entry", "message"), [
    ("nope.weight: fc.weight", r"tensors entry 'nope\.weight': the target has no such tensor"),
    ("head.weight: fc.wieght", r"source 'fc\.wieght' is not in .*did you mean 'fc\.weight'"),
])
def test_tensors_entries_must_exist(src, tmp_path, entry, message):
    mapping = tmp_path / "m.yaml"
    mapping.write_text(f"tensors:\n  {entry}\n")
    with pytest.raises(MappingError, match=message):
        ms_port.plan(src, ms_model=tiny_nets.build_ms_head(), mapping=mapping)
    result = _cli("convert", src, "--ms-model", "tests.tiny_nets:build_ms_head", "-o",
                  tmp_path / "o.ckpt", "--map", mapping)
    assert result.exit_code == 2 and "m.yaml" in result.stderr


def test_template_target(src, tmp_path):
    template = tmp_path / "zoo.ckpt"
    ms.save_checkpoint(tiny_nets.build_ms(), str(template))
    result = _cli("convert", src, "--target", template, "-o", tmp_path / "a.ckpt")
    assert result.exit_code == 1  # a template has no layer types: Conv1d's layout is unknown
    assert "conv1d.weight" in result.stdout and "declare a transform" in result.stdout
    mapping = tmp_path / "conv1d.yaml"
    mapping.write_text("transforms:\n  - {match: 'conv1d\\.weight', ops: [{unsqueeze: 2}]}\n")
    out = tmp_path / "b.ckpt"
    result = _cli("convert", src, "--target", template, "-o", out, "--map", mapping, "--json")
    data = json.loads(result.stdout)
    assert result.exit_code == 0, data
    hows = {t["target"]: t["how"] for t in data["tensors"]}
    assert hows["bn.gamma"] == "rule" and hows["ln.beta"] == "rule"
    _load_into(tiny_nets.build_ms(), out)


@pytest.mark.parametrize(("spec", "message"), [
    ("tests.tiny_nets:not_a_cell", "not a mindspore.nn.Cell"),
    ("tests.no_such_module:build", "cannot import 'tests.no_such_module'"),
    ("tests.tiny_nets:missing", "has no 'missing'"),
    ("no_colon", "expected 'package.module:callable'"),
])
def test_bad_ms_model(src, tmp_path, spec, message):
    result = _cli("convert", src, "--ms-model", spec, "-o", tmp_path / "o.ckpt")
    assert result.exit_code == 2 and message in result.stderr
    assert not (tmp_path / "o.ckpt").exists()
    with pytest.raises(TargetError):
        ms_port.plan(src, ms_model=spec)


def test_wrapped_checkpoint(tmp_path):
    state = tiny_nets.torch_state()
    path = _save({"state_dict": {f"module.{k}": v for k, v in state.items()}, "epoch": 9},
                 tmp_path / "wrapped.pth")
    report = ms_port.convert(path, ms_model=tiny_nets.build_ms(), output=tmp_path / "o.ckpt")
    assert report.ok
    info = report.to_dict()["source_info"]
    assert info["unwrapped"] == ["state_dict"] and info["stripped"] == ["module."]
    assert [s["name"] for s in info["skipped"]] == ["epoch"]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_kept_bit_exactly(tmp_path, dtype):
    state = tiny_nets.torch_state(dtype=dtype)
    path = _save(state, tmp_path / "half.pth")
    out = tmp_path / "half.ckpt"
    report = ms_port.convert(path, ms_model=tiny_nets.build_ms(), output=out)
    assert report.ok and not report.plan.lossy_casts
    written = read_source(out)
    name = {torch.float16: "float16", torch.bfloat16: "bfloat16"}[dtype]
    assert written["bn.gamma"].dtype == name
    assert written["bn.gamma"].load().tobytes() == torch_to_numpy(state["bn.weight"]).tobytes()
    _load_into(tiny_nets.build_ms(), out)


def test_dtype_cast_lists_lossy_casts(src, tmp_path):
    report = ms_port.convert(src, ms_model=tiny_nets.build_ms(), output=tmp_path / "c.ckpt",
                             dtype="bfloat16")
    assert report.ok and len(report.plan.lossy_casts) == len(report.plan.matches)
    assert read_source(tmp_path / "c.ckpt")["fc.weight"].dtype == "bfloat16"
    up = ms_port.plan(_save(tiny_nets.torch_state(dtype=torch.float16), tmp_path / "h.pth"),
                      ms_model=tiny_nets.build_ms(), dtype="float32")
    assert up.ok and up.lossy_casts == []  # float16 -> float32 widens exactly


def test_claim_and_fan_out_conflicts(tmp_path):
    state = {"bn.weight": torch.ones(6), "bn.gamma": torch.ones(6)}
    template = ms_port.read.targets.from_infos(
        [ms_port.read.tensors.TensorInfo(n, (6,), "float32")
         for n in ("bn.gamma", "bn.beta", "bn.moving_mean", "bn.moving_variance")], "t")
    plan = ms_port.plan(_save(state, tmp_path / "c.pth"), target=template)
    claim = [c for c in plan.conflicts if c.kind == "claim"]
    assert claim and claim[0].targets == ("bn.gamma",) and not plan.ok
    fan = ms_port.read.targets.from_infos(
        [ms_port.read.tensors.TensorInfo(n, (6,), "float32") for n in ("x.gamma", "x.w")], "t")
    plan = ms_port.plan(_save({"x.weight": torch.ones(6)}, tmp_path / "f.pth"), target=fan)
    assert [c.kind for c in plan.conflicts] == ["fan-out"]
    assert "add a tensors: entry" in plan.conflicts[0].message


def test_shape_match_fallback_is_flagged(src, tmp_path):
    result = _cli("convert", src, "--ms-model", "tests.tiny_nets:build_ms_head", "-o",
                  tmp_path / "o.ckpt", "--allow-shape-match", "--json", "--no-align")
    data = json.loads(result.stdout)
    assert result.exit_code == 0, data
    fallback = {t["target"]: t["source"] for t in data["tensors"] if t["how"] == "fallback"}
    assert fallback == {"head.weight": "fc.weight", "head.bias": "fc.bias"}
    assert data["counts"]["fallback"] == 2


def test_save_map_edit_map_round_trip(src, tmp_path):
    saved = tmp_path / "plan.yaml"
    result = _cli("convert", src, "--ms-model", "tests.tiny_nets:build_ms_head",
                  "--save-map", saved, "--dry-run", "--no-align")
    assert result.exit_code == 1 and saved.exists()
    text = saved.read_text()
    assert "# MISSING  no source tensor for 'head.weight'" in text
    data = yaml.safe_load(text)
    data["tensors"]["head.weight"] = "fc.weight"  # the one-line fix
    data["tensors"]["head.bias"] = "fc.bias"
    saved.write_text(yaml.safe_dump(data))
    out = tmp_path / "fixed.ckpt"
    result = _cli("convert", src, "--ms-model", "tests.tiny_nets:build_ms_head", "-o", out,
                  "--map", saved, "--no-align")
    assert result.exit_code == 0, result.stdout
    _load_into(tiny_nets.build_ms_head(), out)
    assert parse_mapping(saved.read_text()).tensors["head.weight"].source == "fc.weight"


def test_existing_output_needs_force_even_read_only(src, tmp_path):
    out = tmp_path / "o.ckpt"
    out.write_bytes(b"old")
    out.chmod(stat.S_IRUSR)  # as mindspore.save_checkpoint leaves its files
    result = _cli("convert", src, "--ms-model", "tests.tiny_nets:build_ms", "-o", out)
    assert result.exit_code == 2 and "--force" in result.stderr
    assert out.read_bytes() == b"old"
    result = _cli("convert", src, "--ms-model", "tests.tiny_nets:build_ms", "-o", out,
                  "--force")
    assert result.exit_code == 0 and "replaced" in result.stdout
    _load_into(tiny_nets.build_ms(), out)


def test_safetensors_output_loads_in_mindspore(src, tmp_path):
    out = tmp_path / "o.safetensors"
    report = ms_port.convert(src, ms_model=tiny_nets.build_ms(), output=out,
                             format="safetensors")
    assert report.ok and report.written.format == "safetensors"
    _load_into(tiny_nets.build_ms(), out, fmt="safetensors")


def test_convert_json_fields(src, tmp_path):
    data = json.loads(_cli("convert", src, "--ms-model", "tests.tiny_nets:build_ms", "-o",
                           tmp_path / "o.ckpt", "--json").stdout)
    for key in ("ok", "output", "filled", "total", "missing", "unused", "tensors"):
        assert key in data
    assert data["filled"] == data["total"] == len(from_cell(tiny_nets.build_ms()))
    assert all({"source", "how", "target"} <= set(t) for t in data["tensors"])


def test_resnet50_end_to_end(tmp_path):
    from ms_port.testing import save_reference_checkpoint

    pth = save_reference_checkpoint("resnet50", tmp_path / "r50.pth")
    out = tmp_path / "r50.ckpt"
    report = ms_port.convert(pth, arch="resnet50", output=out)
    plan = report.plan
    assert report.ok and len(plan.matches) == 267 and plan.counts["fallback"] == 0
    assert len(plan.dropped) == 53 and all("num_batches_tracked" in d.name for d in plan.dropped)
    _load_into(ms_port.get_arch("resnet50").build_mindspore(), out)
