"""Real model zoos, no mapping file: torchvision -> MindCV 0.3.0, by rules and alignment.

Seeded weights with BatchNorm statistics estimated on data; every target tensor must be
filled with the right source — proven by verify where the networks compute the same
thing, and where MindCV computes differently (its stride-2 'same' padding), verify must
say so. Skipped where the test extra (mindcv, timm) is not installed.
"""

from __future__ import annotations

import pytest

mindcv = pytest.importorskip("mindcv")
torchvision = pytest.importorskip("torchvision")

import torch  # noqa: E402
from mindspore import nn  # noqa: E402

import ms_port  # noqa: E402
from ms_port.testing import estimate_batchnorm  # noqa: E402

SHAPE = (3, 64, 64)


def _torch(name: str):
    torch.manual_seed(0)
    return estimate_batchnorm(getattr(torchvision.models, name)(), SHAPE, batches=2, batch=4)


def _convert(tmp_path, tv: str, factory):
    pth, ckpt = tmp_path / f"{tv}.pth", tmp_path / f"{tv}.ckpt"
    torch.save(_torch(tv).state_dict(), pth)
    report = ms_port.convert(pth, ms_model=factory, output=ckpt)
    assert report.ok, report.plan.problems()[:5]
    return pth, ckpt, report.plan


def _mindcv(name: str):
    return lambda: mindcv.models.create_model(name, pretrained=False)


@pytest.mark.parametrize(("tv", "mc", "aligned"), [
    ("mobilenet_v2", "mobilenet_v2_100", 260),  # was 2/262 by names alone
    ("densenet121", "densenet121", 595),        # was 11/606
])
def test_no_mapping_and_verify_passes(tmp_path, tv, mc, aligned):
    pth, ckpt, plan = _convert(tmp_path, tv, _mindcv(mc))
    assert plan.counts["aligned"] == aligned and not plan.missing and not plan.unused
    report = ms_port.verify(pth, ckpt, torch_model=getattr(torchvision.models, tv),
                            ms_model=_mindcv(mc), input_shape=SHAPE, tol=1e-5)
    assert report.verdict == "PASS", report.message
    assert report.tensors.ok and report.layers_checked > 100


def _resnet50_padded_like_torch():
    """MindCV's ResNet50 with its max-pool padded as torchvision pads it (the one layer
    where the two compute differently)."""
    net = mindcv.models.create_model("resnet50", pretrained=False)
    net.max_pool = nn.MaxPool2d(3, 2, pad_mode="pad", padding=1)
    return net


def test_resnet50_into_mindcv_names_the_padding_then_passes_padded_alike(tmp_path):
    pth, ckpt, plan = _convert(tmp_path, "resnet50", _mindcv("resnet50"))
    assert plan.counts["aligned"] == 22  # the downsample layers: names differ
    as_is = ms_port.verify(pth, ckpt, torch_model=torchvision.models.resnet50,
                           ms_model=_mindcv("resnet50"), input_shape=SHAPE)
    assert as_is.verdict == "FAIL" and as_is.first_divergence.ms_name == "max_pool"
    assert "pad_mode='pad'" in as_is.message and as_is.tensors.ok
    alike = ms_port.verify(pth, ckpt, torch_model=torchvision.models.resnet50,
                           ms_model=_resnet50_padded_like_torch, input_shape=SHAPE)
    assert alike.verdict == "PASS", alike.message


def test_mindcv_is_a_known_target_by_name(tmp_path):
    from click.testing import CliRunner

    from ms_port.cli import main

    pth = tmp_path / "m.pth"
    torch.save(_torch("mobilenet_v2").state_dict(), pth)
    result = CliRunner().invoke(main, ["convert", str(pth), "--ms-model",
                                       "mindcv:mobilenet_v2_100", "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(main, ["convert", str(pth), "--ms-model",
                                       "mindcv:mobilenet_v2_1OO", "--dry-run"])
    assert result.exit_code == 2 and "mobilenet_v2_100" in result.stderr.split("did you mean")[1]
