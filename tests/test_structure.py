"""The structure the engine learned for the MindCV zoo, on small synthetic networks: each
mechanism where it must pair, and where it must refuse (a guess among equals, a network
that really differs)."""

from __future__ import annotations

import numpy as np
import pytest

from ms_port.match.plan import PlanOptions, make_plan
from tests.test_align import _source, _target


def _data(plan, name: str) -> np.ndarray:
    m = next(m for m in plan.matches if m.target == name)
    return plan.expected(m)


# -- a 1x1 convolution and a Dense ----------------------------------------------------------


def test_a_1x1_convolution_fills_a_dense_by_its_kind(tmp_path):
    """DPN's classifier: 1000×2688×1×1 in timm, 1000×2688 in MindCV, the same name."""
    src = _source(tmp_path, {"classifier.weight": (5, 8, 1, 1), "classifier.bias": (5,)})
    tgt = _target({"classifier.weight": (5, 8), "classifier.bias": (5,)},
                  {"classifier": ("Dense",)})
    plan = make_plan(src, tgt)
    assert plan.ok, plan.problems()
    m = next(m for m in plan.matches if m.target == "classifier.weight")
    assert [str(t) for t in m.transforms] == ["reshape([5, 8])"]
    np.testing.assert_array_equal(_data(plan, "classifier.weight"),
                                  src.tensors["classifier.weight"].load().reshape(5, 8))


def test_a_kernel_over_the_whole_input_fills_a_dense_and_nothing_else_does(tmp_path):
    """timm's VGG head is a 7×7 convolution over a 7×7 map: MindCV's Dense over the
    flattened map holds the same numbers. A Dense weight never takes a convolution of
    another output size, and a template (no layer kinds) never reshapes a weight."""
    src = _source(tmp_path, {"fc.weight": (6, 4, 3, 3)})
    plan = make_plan(src, _target({"fc.weight": (6, 36)}, {"fc": ("Dense",)}))
    assert plan.ok and _data(plan, "fc.weight").shape == (6, 36)
    refused = make_plan(src, _target({"fc.weight": (4, 54)}, {"fc": ("Dense",)}))
    assert not refused.ok and refused.conflicts
    template = make_plan(src, _target({"fc.weight": (6, 36)}, {}))
    assert not template.ok


def test_a_per_channel_vector_fills_whatever_its_size_1_axes(tmp_path):
    """MindCV's GRN holds 1×1×1×C, timm's C."""
    src = _source(tmp_path, {"grn.weight": (8,), "grn.bias": (8,)})
    tgt = _target({"grn.gamma": (1, 1, 1, 8), "grn.beta": (1, 1, 1, 8)}, {"grn": ("GRN",)})
    plan = make_plan(src, tgt)
    assert plan.ok, plan.problems()
    np.testing.assert_array_equal(_data(plan, "grn.gamma").reshape(-1),
                                  src.tensors["grn.weight"].load())


# -- fused and split projections --------------------------------------------------------------


def test_a_fused_projection_is_split_by_alignment_in_order(tmp_path):
    """timm's CoaT: one qkv (3D×D) where MindCV has q, k, v, each filled from its rows."""
    src = _source(tmp_path, {"attn.qkv.weight": (12, 4), "attn.qkv.bias": (12,),
                             "attn.proj.weight": (4, 4), "attn.proj.bias": (4,)})
    tgt = _target({f"attn.{p}.{s}": shape for p in "qkv" for s, shape in
                   (("weight", (4, 4)), ("bias", (4,)))} |
                  {"attn.proj.weight": (4, 4), "attn.proj.bias": (4,)},
                  {f"attn.{p}": ("Dense",) for p in ("q", "k", "v", "proj")})
    plan = make_plan(src, tgt)
    assert plan.ok, plan.problems()
    whole = src.tensors["attn.qkv.weight"].load()
    for k, part in enumerate("qkv"):
        np.testing.assert_array_equal(_data(plan, f"attn.{part}.weight"),
                                      whole[4 * k:4 * (k + 1)])
    assert "a fused layer split" in next(m.detail for m in plan.matches
                                         if m.target == "attn.k.weight")


def test_separate_projections_are_fused_into_one_by_alignment(tmp_path):
    """XCiT's class attention: q, k, v in timm, one qkv in MindCV."""
    src = _source(tmp_path, {f"attn.{p}.weight": (4, 4) for p in "qkv"})
    tgt = _target({"attn.qkv.weight": (12, 4)}, {"attn.qkv": ("Dense",)})
    plan = make_plan(src, tgt)
    assert plan.ok, plan.problems()
    expected = np.concatenate([src.tensors[f"attn.{p}.weight"].load() for p in "qkv"])
    np.testing.assert_array_equal(_data(plan, "attn.qkv.weight"), expected)


def test_a_split_needs_sibling_projections(tmp_path):
    """Rows of a norm's vector are never split among norms, and parts must be siblings."""
    src = _source(tmp_path, {"n.weight": (8,), "n.bias": (8,)})
    tgt = _target({"a.n.gamma": (4,), "a.n.beta": (4,), "b.n.gamma": (4,), "b.n.beta": (4,)},
                  {"a.n": ("LayerNorm",), "b.n": ("LayerNorm",)})
    assert not make_plan(src, tgt).matches
    src = _source(tmp_path, {"qk.weight": (8, 4)})
    tgt = _target({"a.q.weight": (4, 4), "b.k.weight": (4, 4)},
                  {"a.q": ("Dense",), "b.k": ("Dense",)})
    assert not make_plan(src, tgt).matches


# -- another order -------------------------------------------------------------------------------


def _regnet_like(tmp_path, shortcut: str = "downsample"):
    """A residual block: MindCV defines the shortcut first (proj, bn), timm last
    (downsample), with a 1×1 conv of the same shape in the branch: only the names of the
    shortcut can tell the two 1×1 convs apart."""
    src, tgt, kinds = {}, {}, {}
    for i in range(2):
        for name, shape in (("conv1.conv", (6, 4, 1, 1)), ("conv1.bn", 6),
                            ("conv2.conv", (6, 6, 3, 3)), ("conv2.bn", 6),
                            (f"{shortcut}.conv", (6, 4, 1, 1)), (f"{shortcut}.bn", 6)):
            if isinstance(shape, int):
                src.update({f"s.b{i}.{name}.{p}": (shape,) for p in
                            ("weight", "bias", "running_mean", "running_var")})
            else:
                src[f"s.b{i}.{name}.weight"] = shape
        for name, shape in (("proj", (6, 4, 1, 1)), ("bn", 6), ("f.a", (6, 4, 1, 1)),
                            ("f.a_bn", 6), ("f.b", (6, 6, 3, 3)), ("f.b_bn", 6)):
            path = f"blocks.{i}.{name}"
            if isinstance(shape, int):
                tgt.update({f"{path}.{p}": (shape,) for p in
                            ("gamma", "beta", "moving_mean", "moving_variance")})
                kinds[path] = ("BatchNorm2d",)
            else:
                tgt[f"{path}.weight"] = shape
                kinds[path] = ("Conv2d",)
    return _source(tmp_path, src), _target(tgt, kinds)


def test_a_shortcut_defined_first_on_one_side_pairs_inside_its_block(tmp_path):
    src, tgt = _regnet_like(tmp_path)
    plan = make_plan(src, tgt)
    assert plan.ok, plan.problems()
    got = {m.target: m.source for m in plan.matches}
    for i in range(2):
        assert got[f"blocks.{i}.proj.weight"] == f"s.b{i}.downsample.conv.weight"
        assert got[f"blocks.{i}.bn.gamma"] == f"s.b{i}.downsample.bn.weight"
        assert got[f"blocks.{i}.f.a.weight"] == f"s.b{i}.conv1.conv.weight"
        assert got[f"blocks.{i}.f.a_bn.moving_variance"] == f"s.b{i}.conv1.bn.running_var"
    assert any("reordered" in m.detail for m in plan.matches)


def test_two_of_a_kind_in_another_order_are_never_guessed_without_names(tmp_path):
    """The same block, but nothing in the names tells the two 1×1 convs apart: they stay
    leftovers, each with its candidates."""
    src, tgt = _regnet_like(tmp_path, shortcut="extra")
    plan = make_plan(src, tgt)
    assert not plan.ok
    assert {"blocks.0.proj.weight", "blocks.0.f.a.weight"} <= {m.name for m in plan.missing}


def test_a_permuted_block_never_pairs_across_blocks(tmp_path):
    """PoolFormer: MindCV holds its layer scales as the block's own parameters (listed
    first), timm in modules of their own (listed where they run). Order alone pairs a
    block's scale with the next block's; the blocks' contents say which block is which."""
    src, tgt, kinds = {}, {}, {}
    for i in range(3):
        src.update({f"stages.blocks.{i}.norm1.weight": (8,), f"stages.blocks.{i}.norm1.bias": (8,),
                    f"stages.blocks.{i}.layer_scale1.scale": (8,),
                    f"stages.blocks.{i}.norm2.weight": (8,), f"stages.blocks.{i}.norm2.bias": (8,),
                    f"stages.blocks.{i}.mlp.fc1.weight": (16, 8),
                    f"stages.blocks.{i}.mlp.fc2.weight": (8, 16),
                    f"stages.blocks.{i}.layer_scale2.scale": (8,)})
        tgt.update({f"net.{i}.layer_scale_1": (8,), f"net.{i}.layer_scale_2": (8,),
                    f"net.{i}.norm1.gamma": (8,), f"net.{i}.norm1.beta": (8,),
                    f"net.{i}.norm2.gamma": (8,), f"net.{i}.norm2.beta": (8,),
                    f"net.{i}.mlp.fc1.weight": (16, 8), f"net.{i}.mlp.fc2.weight": (8, 16)})
        kinds.update({f"net.{i}.norm1": ("GroupNorm",), f"net.{i}.norm2": ("GroupNorm",),
                      f"net.{i}.mlp.fc1": ("Dense",), f"net.{i}.mlp.fc2": ("Dense",)})
    plan = make_plan(_source(tmp_path, src), _target(tgt, kinds))
    assert plan.ok, plan.problems()
    got = {m.target: m.source for m in plan.matches}
    for i in range(3):
        assert got[f"net.{i}.layer_scale_1"] == f"stages.blocks.{i}.layer_scale1.scale"
        assert got[f"net.{i}.layer_scale_2"] == f"stages.blocks.{i}.layer_scale2.scale"
        assert got[f"net.{i}.norm2.gamma"] == f"stages.blocks.{i}.norm2.weight"


# -- loose tensors and parameter lists -------------------------------------------------------


def test_an_item_of_a_parameter_list_pairs_with_its_loose_twin(tmp_path):
    """CrossViT: timm's pos_embed_0 / pos_embed_1, MindCV's ParameterList pos_embed.0 / .1."""
    src = _source(tmp_path, {"pos_embed_0": (1, 5, 4), "pos_embed_1": (1, 3, 8),
                             "head.weight": (2, 4)})
    tgt = _target({"pos_embed.0": (1, 5, 4), "pos_embed.1": (1, 3, 8), "head.weight": (2, 4)},
                  {"head": ("Dense",)})
    plan = make_plan(src, tgt)
    assert plan.ok, plan.problems()
    got = {m.target: m.source for m in plan.matches}
    assert got["pos_embed.0"] == "pos_embed_0" and got["pos_embed.1"] == "pos_embed_1"


# -- one tensor under two names, and what the network computes itself -----------------------------


def test_a_module_reached_by_two_paths_is_dropped_as_tied(tmp_path):
    """timm's CoaT: the shared position encoding under its own name and every block's."""
    from safetensors.numpy import save_file

    from ms_port.read.sources import read_source

    w = np.random.default_rng(0).standard_normal((4, 1, 3, 3)).astype(np.float32)
    path = tmp_path / "s.safetensors"
    save_file({"crpe.conv.weight": w, "blocks.0.crpe.conv.weight": w,
               "blocks.1.crpe.conv.weight": w.copy()}, str(path))
    src = read_source(path)
    src.tensors = {n: src.tensors[n] for n in ("crpe.conv.weight", "blocks.0.crpe.conv.weight",
                                               "blocks.1.crpe.conv.weight")}
    tgt = _target({"blocks.0.crpe.conv.weight": (4, 1, 3, 3)}, {"blocks.0.crpe.conv": ("Conv2d",)})
    plan = make_plan(src, tgt)
    assert plan.ok, plan.problems()
    reasons = {d.name: d.reason for d in plan.dropped}
    assert set(reasons) == {"crpe.conv.weight", "blocks.1.crpe.conv.weight"}
    assert all(r.startswith("tied: holds exactly what blocks.0.crpe.conv.weight")
               for r in reasons.values())


def test_equal_constants_are_never_taken_for_one_tensor(tmp_path):
    from safetensors.numpy import save_file

    from ms_port.read.sources import read_source

    path = tmp_path / "s.safetensors"
    save_file({"a.conv.bias": np.zeros(4, np.float32), "b.conv.bias": np.zeros(4, np.float32)},
              str(path))
    plan = make_plan(read_source(path), _target({"a.conv.bias": (4,)}, {}))
    assert [u.name for u in plan.unused] == ["b.conv.bias"]


def test_an_integer_buffer_nothing_takes_is_dropped_as_one(tmp_path):
    """torchvision's Swin keeps its relative position index (int64): an index the network
    computes, never a weight."""
    from safetensors.numpy import save_file

    from ms_port.read.sources import read_source

    path = tmp_path / "s.safetensors"
    save_file({"attn.table": np.ones((9, 2), np.float32),
               "attn.index": np.arange(16, dtype=np.int64)}, str(path))
    plan = make_plan(read_source(path), _target({"attn.table": (9, 2)}, {}))
    assert plan.ok, plan.problems()
    assert "an integer buffer" in {d.name: d.reason for d in plan.dropped}["attn.index"]


def test_a_constant_the_network_computes_is_filled_with_its_own_value(tmp_path):
    """MindCV's Swin: a one-hot relative position index and an attention mask, built from
    the window size as non-trainable parameters. BatchNorm statistics are never taken for
    such constants, even where the network was built with its weights."""
    import ms_port

    def net():
        from mindspore import Parameter, Tensor, nn

        class Net(nn.Cell):
            def __init__(self):
                super().__init__()
                self.index = Parameter(Tensor(np.eye(3, dtype=np.float32)),
                                       requires_grad=False)
                self.fc = nn.Dense(3, 2)
                self.bn = nn.BatchNorm1d(2)

        return Net()

    path = tmp_path / "s.pth"
    import torch

    torch.save({"fc.weight": torch.ones(2, 3), "fc.bias": torch.zeros(2),
                "bn.weight": torch.ones(2), "bn.bias": torch.zeros(2)}, path)
    plan = ms_port.plan(path, ms_model=net, allow_missing=True)
    m = next(m for m in plan.matches if m.target == "index")
    assert (m.how, m.init) == ("initialised", "network")
    np.testing.assert_array_equal(plan.expected(m), np.eye(3, dtype=np.float32))
    assert {x.name for x in plan.missing} == {"bn.moving_mean", "bn.moving_variance"}


# -- networks that differ ---------------------------------------------------------------------


def test_a_bias_the_target_lacks_is_one_line_naming_the_difference(tmp_path):
    """timm's VGG: every convolution holds a bias, MindCV's none. The refusal names the
    difference once and never invites dropping trained tensors."""
    src = _source(tmp_path, {f"features.{i}.{p}": s for i in range(3)
                             for p, s in (("weight", (4, 4, 3, 3)), ("bias", (4,)))})
    tgt = _target({f"features.{i}.weight": (4, 4, 3, 3) for i in range(3)},
                  {f"features.{i}": ("Conv2d",) for i in range(3)})
    plan = make_plan(src, tgt)
    assert not plan.ok
    (line,) = plan.problems()
    assert line.startswith("the networks differ: PyTorch's features.0 has a bias, "
                           "MindSpore's features.0 has none, and so have 2 more layers")
    assert "drop:" not in line and "no conversion computes the same network" in line
    assert [d.kind for d in plan.differences] == ["bias"]


def test_a_zero_bias_is_no_difference(tmp_path):
    from safetensors.numpy import save_file

    from ms_port.read.sources import read_source

    path = tmp_path / "s.safetensors"
    save_file({"c.weight": np.ones((2, 2, 1, 1), np.float32), "c.bias": np.zeros(2, np.float32)},
              str(path))
    plan = make_plan(read_source(path), _target({"c.weight": (2, 2, 1, 1)}, {"c": ("Conv2d",)}))
    assert plan.ok and not plan.differences


def test_layers_one_side_lacks_are_named_as_a_difference(tmp_path):
    """MindCV's ResNetV2 normalises after its stem; timm's does not: a BatchNorm with no
    counterpart of its shape on the other side."""
    src = _source(tmp_path, {"stem.weight": (4, 3, 3, 3), "head.weight": (2, 4)})
    tgt = _target({"conv1.weight": (4, 3, 3, 3), "bn1.gamma": (6,), "bn1.beta": (6,),
                   "fc.weight": (2, 4)},
                  {"conv1": ("Conv2d",), "bn1": ("BatchNorm2d",), "fc": ("Dense",)})
    plan = make_plan(src, tgt)
    (line,) = plan.problems()
    assert line.startswith("the networks differ: MindSpore's network holds 1 layer (bn1: 6) "
                           "PyTorch's has no counterpart of")


def test_a_leftover_with_a_counterpart_is_no_difference(tmp_path):
    """Two leftovers of one shape that the engine could not place: candidates, not a
    difference of the networks."""
    src = _source(tmp_path, {"x.weight": (4, 4), "y.weight": (3, 3)})
    tgt = _target({"b.weight": (3, 3), "a.weight": (4, 4)}, {"a": ("Dense",), "b": ("Dense",)})
    plan = make_plan(src, tgt)
    assert not plan.differences and all("no source tensor" in line or "not used" in line
                                        for line in plan.problems())


@pytest.mark.parametrize("renames", [0, 1])
def test_colliding_renames_are_never_suggested(tmp_path, renames):
    """XCiT's separate q, k, v against a fused qkv (no alignment): 'q: qkv', 'k: qkv' would
    collide; only a rename one segment to one other is offered."""
    from ms_port.match.suggest import leftover_groups

    src = _source(tmp_path, {f"b{i}.attn.{p}.weight": (4, 4) for i in range(2) for p in "qkv"}
                  | ({f"b{i}.old.w.weight": (5,) for i in range(2)} if renames else {}))
    tgt = _target({f"b{i}.attn.qkv.weight": (4, 4) for i in range(2)}
                  | ({f"b{i}.new.w.weight": (5,) for i in range(2)} if renames else {}))
    plan = make_plan(src, tgt, options=PlanOptions(align=False))
    groups = leftover_groups(plan.unused)
    assert all(new != "qkv" for _, _, new in groups)
    assert [(old, new) for _, old, new in groups] == ([("old", "new")] if renames else [])
