"""Recorded architecture manifests match the live MindSpore networks they stand for."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

import ms_port
from ms_port.archs.manifest import load_manifest
from ms_port.read.targets import from_arch, from_cell

QUICK = {"resnet18"}


@pytest.mark.parametrize("arch", [
    a if a in QUICK else pytest.param(a, marks=pytest.mark.slow) for a in ms_port.list_archs()])
def test_manifest_matches_live_network(arch):
    recorded = load_manifest(arch)
    assert recorded is not None, f"no manifest for {arch}"
    live = from_cell(ms_port.get_arch(arch).build_mindspore(), arch)
    assert [t.to_dict() for t in recorded.tensors.values()] == \
        [t.to_dict() for t in live.tensors.values()], (
        f"manifests/{arch}.json is stale: run `python -m ms_port.archs.manifest {arch}`")


def test_options_build_the_live_network():
    target = from_arch("resnet18", num_classes=10)
    assert target.cell is not None and target["end_point.weight"].shape == (10, 512)
    assert from_arch("resnet18").cell is None  # the default comes from the manifest


def test_convert_with_an_arch_imports_no_framework(tmp_path):
    """A safetensors source and a recorded arch: neither torch nor MindSpore loads."""
    from safetensors.numpy import save_file

    target = load_manifest("resnet18")
    import numpy as np

    arrays = {}
    for t in target.tensors.values():
        name = t.name.replace("down_sample_layer", "downsample").replace("end_point", "fc")
        for ms_suffix, torch_suffix in (("gamma", "weight"), ("beta", "bias"),
                                        ("moving_mean", "running_mean"),
                                        ("moving_variance", "running_var")):
            if name.endswith("." + ms_suffix):
                name = name[: -len(ms_suffix)] + torch_suffix
        arrays[name] = np.zeros(t.shape, np.float32)
    src = tmp_path / "r18.safetensors"
    save_file(arrays, str(src))
    code = ("import sys, ms_port; r = ms_port.convert(sys.argv[1], arch='resnet18', "
            "output=sys.argv[2]); assert r.ok, r.plan.problems(); "
            "assert 'torch' not in sys.modules and 'mindspore' not in sys.modules, "
            "[m for m in sys.modules if m.startswith(('torch', 'mindspore'))][:5]")
    subprocess.run([sys.executable, "-c", code, str(src), str(tmp_path / "o.ckpt")], check=True)


# --- MindCV's models, recorded ---------------------------------------------------------


def _one_per_module() -> list[str]:
    """The recorded model with the fewest tensors of each MindCV module (resnet, convnext,
    vit …): each module builds its networks its own way."""
    from ms_port.read.targets import _mindcv_record, mindcv_recorded

    mindcv = pytest.importorskip("mindcv")
    smallest: dict[str, tuple[int, str]] = {}
    for name in mindcv_recorded():
        module = mindcv.models.model_entrypoint(name).__module__
        smallest[module] = min(smallest.get(module, (1 << 30, "")),
                               (len(_mindcv_record(name)["tensors"]), name))
    return sorted(name for _, name in smallest.values())


def _described(target) -> list[tuple]:
    return [(t.name, t.shape, t.dtype, t.layer, t.lineage, t.path, t.constant is None)
            for t in target.tensors.values()]


def test_the_mindcv_record_is_what_each_module_builds():
    """One model of each MindCV module held to its live network (every model:
    ``python -m ms_port.archs.manifest --mindcv`` rebuilds the record)."""
    pytest.importorskip("mindcv")
    from ms_port.read.targets import from_factory, recorded_zoo

    names = _one_per_module()
    assert len(names) > 40 and "resnet18" in names
    for name in names:
        recorded = recorded_zoo(f"mindcv:{name}")
        live = from_factory(f"mindcv:{name}", recorded=False)
        assert _described(recorded) == _described(live), (
            f"the record of mindcv:{name} is stale: python -m ms_port.archs.manifest --mindcv")
        assert recorded.cls == live.cls


def test_a_model_computing_constants_is_not_recorded_but_built():
    from ms_port.read.targets import mindcv_recorded, recorded_zoo

    records = mindcv_recorded()
    assert "resnet50" in records and "convnext_tiny" in records and len(records) > 250
    assert "swin_tiny" not in records  # its masks are part of the target
    assert recorded_zoo("mindcv:swin_tiny") is None
    assert recorded_zoo("mindcv:not_a_model") is None
    assert recorded_zoo("timm:resnet50") is None


def test_another_mindcv_than_the_recorded_one_is_built(monkeypatch):
    from importlib import metadata

    from ms_port.read import targets

    monkeypatch.setattr(metadata, "version", lambda name: "0.4.0")
    assert targets.recorded_zoo("mindcv:resnet50") is None
    monkeypatch.setattr(metadata, "version", lambda name: targets.MINDCV_RECORDED)
    assert targets.recorded_zoo("mindcv:resnet50") is not None


def test_convert_into_mindcv_imports_no_mindspore(tmp_path):
    """The recorded MindCV target: MindSpore is never imported, and the plan is the one
    the live network gives."""
    torch = pytest.importorskip("torch")
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    pth = tmp_path / "resnet18.pth"
    torch.save(torchvision.models.resnet18().state_dict(), pth)
    code = ("import sys, ms_port; r = ms_port.convert(sys.argv[1], ms_model='mindcv:resnet18',"
            " output=sys.argv[2]); assert r.ok, r.plan.problems(); "
            "print(r.plan.counts['aligned'], len(r.plan.matches)); "
            "assert 'mindspore' not in sys.modules and 'mindcv' not in sys.modules, "
            "[m for m in sys.modules if m.startswith(('mindspore', 'mindcv'))][:5]")
    done = subprocess.run([sys.executable, "-c", code, str(pth), str(tmp_path / "o.ckpt")],
                          check=True, capture_output=True, text=True)
    aligned, filled = map(int, done.stdout.split())
    if importlib.util.find_spec("mindcv") is not None:
        from ms_port.read.targets import from_factory

        live = ms_port.plan(pth, target=from_factory("mindcv:resnet18", recorded=False))
        assert (live.counts["aligned"], len(live.matches)) == (aligned, filled)
