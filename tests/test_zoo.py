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

import numpy as np  # noqa: E402
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


def _tiny_vits():
    """torchvision's and MindCV's ViT at one small size, MindCV's built as torchvision
    computes (LayerNorm eps 1e-6, exact GELU); the zero-initialised head made random."""
    import functools

    from mindcv.models.vit import VisionTransformer
    from torchvision.models.vision_transformer import VisionTransformer as TorchViT

    torch.manual_seed(0)
    tv = TorchViT(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=64,
                  mlp_dim=256, num_classes=10)
    with torch.no_grad():
        for name, param in tv.named_parameters():
            if name.startswith("heads"):
                param.normal_(0, 0.2)
            elif ".ln" in name and name.endswith("weight"):
                param.copy_(1 + 0.2 * torch.randn(param.shape))

    def mindcv_vit():
        return VisionTransformer(
            image_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, mlp_ratio=4.0,
            num_classes=10, norm_layer=functools.partial(nn.LayerNorm, epsilon=1e-6),
            act_layer=functools.partial(nn.GELU, approximate=False))

    return tv, mindcv_vit


def test_torchvision_vit_packed_in_proj_aligns_with_mindcv_qkv(tmp_path):
    from ms_port.testing import rewrite_checkpoint

    tv, mindcv_vit = _tiny_vits()
    pth, ckpt = tmp_path / "vit.pth", tmp_path / "vit.ckpt"
    torch.save(tv.state_dict(), pth)
    report = ms_port.convert(pth, ms_model=mindcv_vit, output=ckpt)  # no mapping file
    assert report.ok, report.plan.problems()[:4]
    got = {m.target: m for m in report.plan.matches}
    # loose tensors (no layer holds them): the only leftovers of their shapes, a shared word
    assert got["cls_token"].source == "class_token" and got["cls_token"].how == "aligned"
    assert got["pos_embed"].source == "encoder.pos_embedding"
    assert got["patch_embed.proj.weight"].source == "conv_proj.weight"
    qkv = next(m for m in report.plan.matches if m.target == "blocks.0.attn.qkv.weight")
    assert qkv.how == "aligned"  # MultiheadAttention's in_proj_weight: a Linear by another name
    assert qkv.source == "encoder.layers.encoder_layer_0.self_attention.in_proj_weight"
    parity = ms_port.verify(pth, ckpt, torch_model=lambda: tv, ms_model=mindcv_vit,
                            input_shape=(3, 32, 32))
    assert parity.verdict == "PASS", parity.message

    def swap_q_k(tensors):  # the packed rows taken in the wrong order
        w = tensors["blocks.0.attn.qkv.weight"]
        tensors["blocks.0.attn.qkv.weight"] = np.concatenate([w[64:128], w[:64], w[128:]])
        return tensors

    wrong = rewrite_checkpoint(ckpt, tmp_path / "wrong.ckpt", swap_q_k)
    parity = ms_port.verify(pth, wrong, torch_model=lambda: tv, ms_model=mindcv_vit,
                            input_shape=(3, 32, 32))
    assert parity.verdict == "FAIL" and parity.first_divergence.ms_name.startswith("blocks.0")


def _convnext_gelu_exact():
    """MindCV's ConvNeXt-T with torchvision's exact GELU (MindCV uses the tanh one)."""
    net = mindcv.models.create_model("convnext_tiny", pretrained=False)
    for _, cell in net.cells_and_names():
        if hasattr(cell, "act") and isinstance(cell.act, nn.GELU):
            cell.act = nn.GELU(approximate=False)
    return net


def test_convnext_block_scales_align_by_size_and_verify(tmp_path):
    """torchvision's ``layer_scale`` (C×1×1) and MindCV's ``gamma_`` (C) are each a block's
    lone tensor: paired by order and size, reshaped over size-1 axes only."""
    torch.manual_seed(0)
    tv = torchvision.models.convnext_tiny()
    with torch.no_grad():  # torchvision starts them at 1e-6: every block would be a no-op
        for name, param in tv.named_parameters():
            if name.endswith("layer_scale"):
                param.copy_(0.5 + 0.1 * torch.randn(param.shape))
    pth, ckpt = tmp_path / "cn.pth", tmp_path / "cn.ckpt"
    torch.save(tv.state_dict(), pth)
    report = ms_port.convert(pth, ms_model=_mindcv("convnext_tiny"), output=ckpt)
    assert report.ok, report.plan.problems()[:4]  # was 164/182 by names and alignment
    scale = next(m for m in report.plan.matches if m.target == "feature.1.0.gamma_")
    assert scale.source == "features.1.0.layer_scale" and scale.how == "aligned"
    assert [t.to_data() for t in scale.transforms] == [{"reshape": [96]}]
    parity = ms_port.verify(pth, ckpt, torch_model=lambda: tv, ms_model=_convnext_gelu_exact,
                            input_shape=SHAPE)
    assert parity.verdict == "PASS", parity.message

    def swap_scales(tensors):  # two blocks' scales exchanged
        tensors["feature.1.0.gamma_"], tensors["feature.1.1.gamma_"] = (
            tensors["feature.1.1.gamma_"], tensors["feature.1.0.gamma_"])
        return tensors

    from ms_port.testing import rewrite_checkpoint

    wrong = rewrite_checkpoint(ckpt, tmp_path / "wrong.ckpt", swap_scales)
    parity = ms_port.verify(pth, wrong, torch_model=lambda: tv, ms_model=_convnext_gelu_exact,
                            input_shape=SHAPE)
    assert parity.verdict == "FAIL"


def test_vgg_zero_conv_biases_are_dropped_as_zero_and_nonzero_ones_refused(tmp_path):
    """MindCV's VGG convs have no bias. torchvision's start at zero: dropping a zero bias
    loses nothing (proven by verify); a trained, nonzero one cannot be dropped."""
    torch.manual_seed(0)
    tv = torchvision.models.vgg11()
    pth, ckpt = tmp_path / "vgg.pth", tmp_path / "vgg.ckpt"
    torch.save(tv.state_dict(), pth)
    report = ms_port.convert(pth, ms_model=_mindcv("vgg11"), output=ckpt)
    assert report.ok, report.plan.problems()[:3]
    zero = [d for d in report.plan.dropped if d.reason.startswith("zero bias")]
    assert len(zero) == 8 and zero[0].name == "features.0.bias"
    parity = ms_port.verify(pth, ckpt, torch_model=lambda: tv, ms_model=_mindcv("vgg11"),
                            input_shape=(3, 224, 224))
    assert parity.verdict == "PASS", parity.message

    trained = {k: v + 0.1 if k == "features.3.bias" else v for k, v in tv.state_dict().items()}
    torch.save(trained, tmp_path / "trained.pth")
    plan = ms_port.plan(tmp_path / "trained.pth", ms_model=_mindcv("vgg11"))
    assert not plan.ok and [u.name for u in plan.unused] == ["features.3.bias"]
    assert plan.problems() == [
        "the networks differ: PyTorch's features.3 has a bias, MindSpore's features.3 has "
        "none: no conversion computes the same network (the biases hold trained values) — "
        "the MindSpore layers must have a bias (has_bias=True) to convert"]


def test_timm_vit_matches_mindcv_by_names_and_verifies(tmp_path):
    """timm's ViT and MindCV's share every name: no rules beyond LayerNorm's, no alignment."""
    import functools

    timm = pytest.importorskip("timm")
    from mindcv.models.vit import VisionTransformer

    torch.manual_seed(0)
    tm = timm.models.vision_transformer.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=10)
    with torch.no_grad():  # timm starts its head at zero: the output would ignore the input
        tm.head.weight.normal_(0, 0.2)
    pth, ckpt = tmp_path / "timm.pth", tmp_path / "timm.ckpt"
    torch.save(tm.state_dict(), pth)

    def mindcv_vit():
        return VisionTransformer(
            image_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, mlp_ratio=4.0,
            num_classes=10, norm_layer=functools.partial(nn.LayerNorm, epsilon=1e-6),
            act_layer=functools.partial(nn.GELU, approximate=False))

    report = ms_port.convert(pth, ms_model=mindcv_vit, output=ckpt)
    assert report.ok and "aligned" not in report.plan.counts, report.plan.counts
    parity = ms_port.verify(pth, ckpt, torch_model=lambda: tm, ms_model=mindcv_vit,
                            input_shape=(3, 32, 32))
    assert parity.verdict == "PASS", parity.message


def _efficientnet_padded_like_torch(eps_at: int | None = None):
    """MindCV's EfficientNet-B0 with its stride-2 'same' convs padded as torchvision pads
    them; optionally one BatchNorm's epsilon changed (1e-5 -> 1e-4): a network difference
    too small to jump, which must not pass as rounding."""
    from mindspore import ops

    def build():
        net = mindcv.models.create_model("efficientnet_b0", pretrained=False)
        cells = dict(net.cells_and_names())
        for name, cell in list(cells.items()):
            if isinstance(cell, nn.Conv2d) and cell.pad_mode == "same" and cell.stride[0] == 2:
                k = cell.kernel_size[0]
                parent, _, leaf = name.rpartition(".")
                owner = cells[parent]
                new = nn.Conv2d(cell.in_channels, cell.out_channels, k, cell.stride,
                                pad_mode="pad", padding=k // 2, group=cell.group,
                                has_bias=cell.has_bias)
                if leaf.isdigit():
                    owner[int(leaf)] = new
                else:
                    setattr(owner, leaf, new)
        if eps_at is not None:
            norms = [c for _, c in net.cells_and_names() if isinstance(c, nn.BatchNorm2d)]
            norms[eps_at].bn_infer = ops.BatchNorm(is_training=False, epsilon=1e-4)
        return net
    return build


def test_efficientnet_passes_as_mindspore_rounding_compounds_and_a_small_difference_fails(
        tmp_path):
    """MindSpore's float32 sigmoid is biased (~1e-7 per call), so a correct EfficientNet's
    error climbs gradually to ~12× PyTorch's float32 noise: PASS, saying so. One BatchNorm
    epsilon changed deep in the network is a step off that climb: FAIL, at that layer."""
    pth, ckpt, plan = _convert(tmp_path, "efficientnet_b0", _efficientnet_padded_like_torch())
    assert not plan.missing and not plan.unused
    right = ms_port.verify(pth, ckpt, torch_model=torchvision.models.efficientnet_b0,
                           ms_model=_efficientnet_padded_like_torch(), input_shape=SHAPE,
                           tol=1e-5)
    assert right.verdict == "PASS", right.message
    assert right.drift > 4 and "compounds through the depth" in right.message
    worst = max(right.outputs, key=lambda o: o.error / o.noise)
    assert worst.error > 4 * worst.noise  # what the fixed bound failed
    wrong = ms_port.verify(pth, ckpt, torch_model=torchvision.models.efficientnet_b0,
                           ms_model=_efficientnet_padded_like_torch(eps_at=30),
                           input_shape=SHAPE, tol=1e-5)
    assert wrong.verdict == "FAIL" and wrong.tensors.ok
    # the changed BatchNorm itself is the first divergence: the drift, relaxed to the
    # trunk's level since the peak in an earlier squeeze-and-excitation, does not cover it
    assert "first divergence at features.7.2.block.1 (PyTorch: features.5.2.block.0.1" \
        in wrong.message


def test_saved_map_of_an_aligned_zoo_model_is_small_and_reproduces_it(tmp_path):
    """MobileNetV2 into MindCV: 260 aligned tensors become a few renumbering regexes (no
    per-tensor line), and the map alone, names only, gives the same plan."""
    import yaml

    pth, _ckpt, plan = _convert(tmp_path, "mobilenet_v2", _mindcv("mobilenet_v2_100"))
    saved = yaml.safe_load(plan.to_yaml())
    assert saved["tensors"] == {} and 0 < len(saved["rename"]["regex"]) <= 24
    again = ms_port.plan(pth, ms_model=_mindcv("mobilenet_v2_100"), mapping=saved,
                         align=False)
    assert again.ok and not again.counts.get("aligned")
    assert {(m.target, m.source) for m in again.matches} == \
        {(m.target, m.source) for m in plan.matches}


def test_regnet_whose_parameter_names_are_not_its_cell_paths_is_checked_tensor_by_tensor(
        tmp_path):
    """MindCV's RegNet names its parameters '0.blocks.0.proj.weight' while the cell sits at
    'stages.0.blocks.0.proj': verify's tensor check used the paths, found 324 of 331 tensors
    'missing', and a gamma scaled by 1.00003 passed. Keyed by Parameter.name, every tensor
    is compared, layers pair by name, and the scaled gamma FAILs, named."""
    from ms_port.testing import rewrite_checkpoint

    pth, ckpt, plan = _convert(tmp_path, "regnet_y_400mf", _mindcv("regnet_y_400mf"))
    assert not plan.missing and not plan.unused
    kwargs = {"torch_model": torchvision.models.regnet_y_400mf,
              "ms_model": _mindcv("regnet_y_400mf"), "input_shape": SHAPE, "tol": 1e-5}
    right = ms_port.verify(pth, ckpt, **kwargs)
    assert right.verdict == "PASS", right.message
    assert right.tensors.ok and right.tensors.counts["identical"] == len(plan.matches) == 331
    assert sum(c.paired_by == "name" for c in right.layers) > 150  # was 4: by cell paths
    name = [m.target for m in plan.matches if m.target.endswith("c_bn.gamma")][-3]

    def scale(arrays):
        arrays[name] = arrays[name] * np.float32(1.00003)

    wrong = rewrite_checkpoint(ckpt, tmp_path / "wrong.ckpt", scale)
    report = ms_port.verify(pth, wrong, **kwargs)
    assert report.verdict == "FAIL" and not report.tensors.ok
    assert [d.target for d in report.tensors.problems] == [name]
