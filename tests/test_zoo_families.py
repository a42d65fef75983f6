"""The MindCV zoo's families from the timm and torchvision checkpoints people hold, no
mapping file: each family's smallest model that converts by structure (fused and split
projections, 1x1 convolutions as Dense, indexed lists, loose tensors, blocks in another
order), with its verify; and the twins that compute another function, refused naming it.

Weights are seeded, every tensor an initialiser left constant moved off it, BatchNorm
statistics estimated on data (what a trained network holds). ``benchmarks/mindcv_zoo.py``
runs every pair at MindCV's own input size; here, inputs are small where the networks
take any size. Skipped where the test extra (mindcv, timm) is not installed.
"""

from __future__ import annotations

import pytest

mindcv = pytest.importorskip("mindcv")
timm = pytest.importorskip("timm")
torchvision = pytest.importorskip("torchvision")

import torch  # noqa: E402
from mindspore import nn  # noqa: E402

import ms_port  # noqa: E402
from ms_port.testing import as_trained, estimate_batchnorm  # noqa: E402

SMALL = (3, 64, 64)


def _twin(twin: str):
    lib, _, name = twin.partition(":")
    if lib == "torchvision":
        return getattr(torchvision.models, name)()
    return timm.create_model(name, pretrained=False)


def _saved(tmp_path, twin: str, shape: tuple[int, ...]):
    torch.manual_seed(0)
    model = as_trained(_twin(twin))
    if any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        estimate_batchnorm(model, shape, batches=2, batch=4)
    pth = tmp_path / "twin.pth"
    torch.save(model.state_dict(), pth)
    return pth


def _convert_and_verify(tmp_path, mc: str, twin: str, shape: tuple[int, ...]):
    pth, ckpt = _saved(tmp_path, twin, shape), tmp_path / "out.ckpt"
    report = ms_port.convert(pth, ms_model=f"mindcv:{mc}", output=ckpt)  # no mapping file
    assert report.ok, report.plan.problems()[:4]
    plan = report.plan
    assert not plan.missing and not plan.unused and len(plan.matches) == len(plan.target)
    parity = ms_port.verify(pth, ckpt, torch_model=lambda: _twin(twin),
                            ms_model=f"mindcv:{mc}", input_shape=shape, tol=1e-5)
    assert parity.tensors.ok, parity.message  # every tensor holds its source
    return plan, parity


@pytest.mark.parametrize(("mc", "twin", "shape"), [
    ("regnet_x_200mf", "timm:regnetx_002", SMALL),          # was 0/24: shortcut first vs last
    ("BiT_resnet50", "timm:resnetv2_50x1_bit", SMALL),       # was refused
    ("repvgg_a0", "timm:repvgg_a0", SMALL),                  # was a wrong FAIL: Identity vs ReLU
    ("mobilenet_v2_035_96", "timm:mobilenetv2_035", SMALL),     # was a wrong FAIL: BatchNormAct2d
    ("edgenext_xx_small", "timm:edgenext_xx_small", SMALL),  # was refused: stem '0.0'
])
def test_family_converts_and_passes(tmp_path, mc, twin, shape):
    _plan, parity = _convert_and_verify(tmp_path, mc, twin, shape)
    assert parity.verdict == "PASS", parity.message
    assert parity.layers_checked > 20


@pytest.mark.parametrize(("mc", "twin", "shape", "first", "named"), [
    # the same tensors, other functions: verify names the difference where it shows
    ("seresnet18", "timm:seresnet18", SMALL, "pool0", "'same'"),
    ("dpn92", "timm:dpn92", SMALL, "features.conv1.maxpool", "'same'"),
    ("mixnet_s", "timm:mixnet_s", SMALL, "layers.3.convs.6.act", "SiLU"),
    ("poolformer_s12", "timm:poolformer_s12", SMALL, "head", "epsilon differs"),
    ("convnextv2_atto", "timm:convnextv2_atto", SMALL, "feature.1.0.act", "GELU"),
    ("convit_tiny", "timm:convit_tiny", (3, 224, 224), "blocks.0.mlp.act", "GELU"),
    ("swin_tiny", "torchvision:swin_t", (3, 224, 224), "layers.0.blocks.0.mlp.act", "GELU"),
    ("pit_ti", "timm:pit_ti_224", (3, 224, 224), "transformers.0.blocks.0.mlp.act", "GELU"),
    ("xcit_tiny_12_p16_224", "timm:xcit_tiny_12_p16_224", (3, 224, 224),
     "patch_embed.proj.1", "GELU"),                          # was refused: qkv fused
    ("pvt_v2_b0", "timm:pvt_v2_b0", SMALL, "patch_embed_list.0.proj", "'same'"),
])
def test_family_converts_and_verify_names_the_difference(tmp_path, mc, twin, shape, first,
                                                         named):
    _plan, parity = _convert_and_verify(tmp_path, mc, twin, shape)
    assert parity.verdict == "FAIL" and parity.first_divergence.ms_name == first, \
        parity.message
    assert parity.known_differences and named in parity.known_differences[0], parity.message


def test_coat_fused_qkv_split_and_verify_locates_its_residual(tmp_path):
    """CoaT: timm's fused qkv is MindCV's q, k, v (split by alignment, 3 rows each). MindCV
    adds the residual to the input before its convolutional position encoding, timm after:
    every layer before agrees with identical weights, and verify says so."""
    plan, parity = _convert_and_verify(tmp_path, "coat_tiny", "timm:coat_tiny", (3, 224, 224))
    q = next(m for m in plan.matches if m.target == "serial_blocks1.0.factoratt_crpe.q.weight")
    assert q.source == "serial_blocks1.0.factoratt_crpe.qkv.weight" and q.how == "aligned"
    assert parity.verdict == "FAIL" and "runs between the layers" in parity.message


def test_crossvit_indexed_lists_and_verify_locates_its_rescaling(tmp_path):
    """CrossViT: timm's pos_embed_0 is MindCV's pos_embed.0 (a ParameterList item). MindCV
    rescales the image for the second branch bilinear (corners aligned), timm bicubic:
    functional, between the layers."""
    plan, parity = _convert_and_verify(tmp_path, "crossvit_9", "timm:crossvit_9_240",
                                       (3, 240, 240))
    got = {m.target: m.source for m in plan.matches}
    assert got["pos_embed.0"] == "pos_embed_0" and got["pos_embed.1"] == "pos_embed_1"
    assert parity.verdict == "FAIL" and parity.first_divergence.ms_name == "patch_embed.1.proj"
    assert "runs between the layers" in parity.message


def test_halonet_converts_every_tensor(tmp_path):
    """MindCV's HaloNet cannot run on CPU (ExtractImagePatches has no CPU kernel): the
    conversion is proven by the coverage run's tensors only."""
    pth = _saved(tmp_path, "timm:halonet50ts", (3, 256, 256))
    plan = ms_port.plan(pth, ms_model="mindcv:halonet_50t")
    assert plan.ok and len(plan.matches) == len(plan.target), plan.problems()[:4]


@pytest.mark.parametrize(("mc", "twin", "said"), [
    ("vgg11", "timm:vgg11", "PyTorch's features.0 has a bias, MindSpore's features.0 has none"),
    ("shufflenet_v2_x0_5", "torchvision:shufflenet_v2_x0_5",
     "PyTorch's fc has a bias, MindSpore's classifier has none"),
    ("mlp_mixer_s_p16", "timm:mixer_s16_224", "PyTorch's stem.proj has a bias"),
])
def test_twin_that_computes_another_function_is_refused_naming_it(tmp_path, mc, twin, said):
    pth = _saved(tmp_path, twin, (3, 224, 224))
    plan = ms_port.plan(pth, ms_model=f"mindcv:{mc}")
    problems = plan.problems()
    assert not plan.ok and problems[0].startswith("the networks differ: ")
    assert said in problems[0], problems[0]
    assert not any("drop:" in p for p in problems)


def test_mnasnet_from_torchvision_loads_and_verify_names_its_epsilon(tmp_path):
    """torchvision's MNASNet state carries ``_metadata`` versions its loader checks (the
    checkpoint failed to load into the twin); its BatchNorm epsilon is not MindCV's."""
    _plan, parity = _convert_and_verify(tmp_path, "mnasnet_050", "torchvision:mnasnet0_5",
                                        SMALL)
    assert parity.verdict == "FAIL" and parity.known_differences, parity.message
    assert "eps" in parity.known_differences[0]


def test_cli_verify_takes_a_zoo_twin_and_mindcv_input_size(tmp_path):
    from click.testing import CliRunner

    from ms_port.cli import main

    pth, ckpt = _saved(tmp_path, "timm:regnetx_002", SMALL), tmp_path / "out.ckpt"
    zoo = ["--ms-model", "mindcv:regnet_x_200mf"]
    result = CliRunner().invoke(main, ["convert", str(pth), *zoo, "-o", str(ckpt)])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(main, ["verify", str(pth), str(ckpt), *zoo,
                                       "--torch-model", "timm:regnetx_002", "--json"])
    assert result.exit_code == 0, result.output  # no --input-shape: MindCV's own size
    import json

    report = json.loads(result.stdout)
    assert report["verdict"] == "PASS" and report["input_shape"] == [3, 224, 224]
    assert any("MindCV's input size" in note for note in report["notes"])
    result = CliRunner().invoke(main, ["verify", str(pth), str(ckpt), *zoo])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "name its PyTorch twin, e.g. --torch-model timm:NAME" in result.stderr


def _swinv2_as_timm_computes():
    """MindCV's SwinV2 with timm's LayerNorm epsilon (1e-5, MindCV 1e-6) and exact GELU."""
    from mindspore import ops

    net = mindcv.models.create_model("swinv2_tiny_window8", pretrained=False)
    for _, cell in net.cells_and_names():
        if isinstance(cell, nn.LayerNorm):
            cell.layer_norm = ops.LayerNorm(begin_norm_axis=cell.begin_norm_axis,
                                            begin_params_axis=cell.begin_params_axis,
                                            epsilon=1e-5)
        if isinstance(getattr(cell, "act", None), nn.GELU):
            cell.act = nn.GELU(approximate=False)
    return net


def test_swinv2_fused_qkv_with_its_biases_apart_converts_and_verifies(tmp_path):
    """timm's SwinV2 holds qkv.weight with q_bias and v_bias apart, defined after the
    position-bias MLP; MindCV holds q, k, v (k without a bias) before it, and names its
    parameters '0.blocks.0.norm1.gamma' where the cell sits at 'layers.0.blocks.0.norm1':
    matched by path, split by a second alignment, each bias from the tensor named for its
    part. Verify names the epsilon; built as timm computes, it PASSes."""
    shape = (3, 256, 256)
    plan, parity = _convert_and_verify(tmp_path, "swinv2_tiny_window8",
                                       "timm:swinv2_tiny_window8_256", shape)
    got = {m.target: m.source for m in plan.matches}
    assert got["0.blocks.0.attn.k.weight"] == "layers.0.blocks.0.attn.qkv.weight"
    assert got["0.blocks.0.attn.v.bias"] == "layers.0.blocks.0.attn.v_bias"
    assert got["0.blocks.0.norm1.gamma"] == "layers.0.blocks.0.norm1.weight"
    assert got["head.weight"] == "head.fc.weight"
    assert parity.verdict == "FAIL" and "epsilon differs" in parity.known_differences[0]
    alike = ms_port.verify(tmp_path / "twin.pth", tmp_path / "out.ckpt",
                           torch_model=lambda: _twin("timm:swinv2_tiny_window8_256"),
                           ms_model=_swinv2_as_timm_computes, input_shape=shape, tol=1e-5)
    assert alike.verdict == "PASS", alike.message
