"""Recorded architecture manifests match the live MindSpore networks they stand for."""

from __future__ import annotations

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
