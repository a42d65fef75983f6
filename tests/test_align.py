"""Structural alignment: layers paired by order, kind and shape — only where unambiguous."""

from __future__ import annotations

import time

import numpy as np
import pytest
from safetensors.numpy import save_file

from ms_port.match.mapping import mapping_from_data
from ms_port.match.plan import PlanOptions, make_plan
from ms_port.read.sources import read_source
from ms_port.read.targets import TargetTensor, from_infos
from ms_port.read.tensors import TensorInfo


def _source(tmp_path, tensors: dict[str, tuple[int, ...]]):
    arrays = {n: np.random.default_rng(i).standard_normal(s).astype(np.float32)
              for i, (n, s) in enumerate(tensors.items())}
    path = tmp_path / "s.safetensors"
    save_file(arrays, str(path))
    source = read_source(path)
    # safetensors lists names sorted; keep the network's definition order as a .pth would
    source.tensors = {n: source.tensors[n] for n in tensors}
    return source


def _target(tensors: dict[str, tuple[int, ...]], kinds: dict | None = None):
    target = from_infos([TensorInfo(n, s, "float32") for n, s in tensors.items()], "t")
    kinds = kinds or {}
    target.tensors = {n: TargetTensor(n, s, "float32", (kinds.get(n.rpartition(".")[0]) or
                                                        (None,))[0],
                                      kinds.get(n.rpartition(".")[0], ()))
                      for n, s in tensors.items()}
    return target


def test_layers_pair_by_order_and_shape_with_rules_by_kind(tmp_path):
    src = _source(tmp_path, {"0.weight": (8, 3, 3, 3), "1.weight": (8,), "1.bias": (8,),
                             "1.running_mean": (8,), "1.running_var": (8,),
                             "3.weight": (4, 8), "3.bias": (4,)})
    tgt = _target({"stem.conv.weight": (8, 3, 3, 3), "stem.bn.gamma": (8,),
                   "stem.bn.beta": (8,), "stem.bn.moving_mean": (8,),
                   "stem.bn.moving_variance": (8,), "head.weight": (4, 8), "head.bias": (4,)},
                  {"stem.conv": ("Conv2d",), "stem.bn": ("BatchNorm2d",),
                   "head": ("Dense",)})
    plan = make_plan(src, tgt)
    assert plan.ok, plan.problems()
    got = {m.target: (m.source, m.how) for m in plan.matches}
    assert got["stem.bn.gamma"] == ("1.weight", "aligned")
    assert got["stem.bn.moving_variance"] == ("1.running_var", "aligned")
    assert got["head.weight"] == ("3.weight", "aligned")
    assert "only partner" in next(m.detail for m in plan.matches if m.target == "head.bias")
    for m, array in plan.arrays():  # the data really comes from the aligned source
        np.testing.assert_array_equal(array, src.tensors[m.source].load())


def test_ambiguous_layers_stay_leftovers_with_their_candidates(tmp_path):
    """Three same-shaped source layers, two targets: which one has no counterpart is
    not decided by structure — nothing is guessed."""
    src = _source(tmp_path, {f"blocks.{i}.weight": (4, 4) for i in range(3)})
    tgt = _target({"a.weight": (4, 4), "b.weight": (4, 4)}, {"a": ("Dense",), "b": ("Dense",)})
    plan = make_plan(src, tgt)
    assert not plan.ok and not plan.matches
    assert {m.name for m in plan.missing} == {"a.weight", "b.weight"}
    assert {c.name for c in plan.missing[0].candidates} >= {"blocks.0.weight",
                                                           "blocks.1.weight"}


def test_names_break_a_tie_only_when_strict(tmp_path):
    src = _source(tmp_path, {"enc.q.weight": (4, 4), "enc.k.weight": (4, 4),
                             "enc.v.weight": (4, 4)})
    tgt = _target({"attn.k.weight": (4, 4)}, {"attn.k": ("Dense",)})
    plan = make_plan(src, tgt, options=PlanOptions(allow_unused=True))
    assert [(m.target, m.source) for m in plan.matches] == [("attn.k.weight", "enc.k.weight")]
    assert "the names decide" in plan.matches[0].detail


def test_a_kind_mismatch_never_pairs(tmp_path):
    """A LayerNorm (gamma/beta) never takes a Linear's weight/bias of the same size."""
    src = _source(tmp_path, {"fc.weight": (4,), "fc.bias": (4,)})
    tgt = _target({"norm.gamma": (4,), "norm.beta": (4,)}, {"norm": ("Dense",)})
    assert not make_plan(src, tgt).matches


def _network(interleaved: bool):
    """150 layers of Linear + LayerNorm (600 tensors), every name different."""
    src_t, tgt_t, kinds = {}, {}, {}
    for i in range(150):
        w = 4 + i % 7
        src_t.update({f"features.{i}.weight": (w, w), f"features.{i}.bias": (w,)})
        if not interleaved:
            src_t.update({f"features.{i}.norm.weight": (w,), f"features.{i}.norm.bias": (w,)})
        tgt_t.update({f"blocks.{i}.dense.weight": (w, w), f"blocks.{i}.dense.bias": (w,),
                      f"blocks.{i}.ln.gamma": (w,), f"blocks.{i}.ln.beta": (w,)})
        kinds[f"blocks.{i}.dense"], kinds[f"blocks.{i}.ln"] = ("Dense",), ("LayerNorm",)
    if interleaved:  # PyTorch defines all linears first, then all norms
        for i in range(150):
            w = 4 + i % 7
            src_t.update({f"norms.{i}.weight": (w,), f"norms.{i}.bias": (w,)})
    return src_t, tgt_t, kinds


def test_a_600_tensor_network_aligns_fast_and_right(tmp_path):
    src_t, tgt_t, kinds = _network(interleaved=False)
    src, tgt = _source(tmp_path, src_t), _target(tgt_t, kinds)
    start = time.perf_counter()
    plan = make_plan(src, tgt)
    took = time.perf_counter() - start
    assert plan.ok and plan.counts["aligned"] == 600
    assert took < 2, f"{took:.2f} s"  # measured 0.07 s here; the budget is 0.5 s
    for m in plan.matches:
        assert m.source.split(".")[1] == m.target.split(".")[1], (m.target, m.source)


def test_an_order_the_networks_do_not_share_is_never_crossed(tmp_path):
    """Linears first then norms in PyTorch, interleaved in MindSpore: what is aligned is
    right, and the rest stays a leftover rather than a guess."""
    src_t, tgt_t, kinds = _network(interleaved=True)
    plan = make_plan(_source(tmp_path, src_t), _target(tgt_t, kinds),
                     options=PlanOptions(allow_missing=True, allow_unused=True))
    assert 0 < plan.counts["aligned"] < 600 and plan.missing
    for m in plan.matches:
        assert m.source.split(".")[1] == m.target.split(".")[1], (m.target, m.source)


@pytest.mark.parametrize("extra", [0, 1])
def test_repeated_identical_blocks_align_one_to_one(tmp_path, extra):
    """Identical blocks in equal number pair in order; one block more on one side leaves
    the blocks whose counterpart is undecided as leftovers."""
    n = 4
    src = _source(tmp_path, {f"layers.{i}.w.weight": (6, 6) for i in range(n + extra)})
    tgt = _target({f"h.{i}.proj.weight": (6, 6) for i in range(n)},
                  {f"h.{i}.proj": ("Dense",) for i in range(n)})
    plan = make_plan(src, tgt, options=PlanOptions(allow_unused=True, allow_missing=True))
    pairs = {(m.target.split(".")[1], m.source.split(".")[1]) for m in plan.matches}
    if extra == 0:
        assert pairs == {(str(i), str(i)) for i in range(n)}
    else:
        assert pairs and all(t == s for t, s in pairs)  # the index tokens break the tie


def test_save_map_is_the_smallest_mapping_that_reproduces_the_plan(tmp_path):
    """ResNet18 against its MindSpore names: two segment renames, no per-tensor line —
    and the saved map alone, with names only, gives the same plan."""
    import yaml

    import ms_port
    from ms_port.read.targets import from_arch
    from ms_port.testing import save_reference_checkpoint

    pth = save_reference_checkpoint("resnet18", tmp_path / "r18.pth")
    plan = ms_port.plan(pth, arch="resnet18")
    saved = yaml.safe_load(plan.to_yaml())
    assert saved["rename"] == {"segments": {"downsample": "down_sample_layer",
                                            "fc": "end_point"}}
    assert saved["tensors"] == {} and "drop" not in saved  # num_batches_tracked: known
    again = ms_port.plan(pth, target=from_arch("resnet18"), mapping=saved, align=False)
    assert again.ok
    assert {(m.target, m.source) for m in again.matches} == \
        {(m.target, m.source) for m in plan.matches}
    full = plan.to_mapping(full=True)
    assert len(full["tensors"]) == len(plan.matches)  # everything pinned, on request


def test_leftovers_are_grouped_by_the_rename_that_explains_them(tmp_path):
    """Names only, no mapping: dozens of leftover lines come down to two renames, which
    the report and --save-map put first."""
    import io

    from rich.console import Console

    import ms_port
    from ms_port.read.targets import from_arch
    from ms_port.testing import save_reference_checkpoint

    pth = save_reference_checkpoint("resnet18", tmp_path / "r18.pth")
    report = ms_port.convert(pth, target=from_arch("resnet18"), dry_run=True, align=False,
                             save_map=tmp_path / "plan.yaml")
    assert not report.ok and len(report.plan.problems()) > 10
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(report)
    text = out.getvalue()
    assert "under *.downsample.*; MindSpore has *.down_sample_layer.*" in text
    assert "'fc: end_point' under rename.segments" in text
    assert text.index("under *.downsample.*") < text.index("no source tensor")
    assert "# SUGGEST" in (tmp_path / "plan.yaml").read_text()


def test_two_layers_in_swapped_order_are_not_guessed(tmp_path):
    """x (4x4), y (3x3) against b (3x3), a (4x4): a<-x and b<-y are equally good
    alignments of one pair each; neither is in every best alignment."""
    src = _source(tmp_path, {"x.weight": (4, 4), "y.weight": (3, 3)})
    tgt = _target({"b.weight": (3, 3), "a.weight": (4, 4)}, {"a": ("Dense",), "b": ("Dense",)})
    plan = make_plan(src, tgt)
    assert not plan.matches
    assert {m.name for m in plan.missing} == {"a.weight", "b.weight"}


def test_one_anchor_out_of_order_does_not_discard_the_others(tmp_path):
    """'head' comes first in PyTorch and last in MindSpore; e1 and e2 still anchor the
    layers between them."""
    src = _source(tmp_path, {"head.weight": (2, 2), "e1.weight": (3, 3), "f0.weight": (5, 5),
                             "e2.weight": (3, 3), "f1.weight": (6, 6)})
    tgt = _target({"e1.weight": (3, 3), "g0.weight": (5, 5), "e2.weight": (3, 3),
                   "g1.weight": (6, 6), "head.weight": (2, 2)},
                  {p: ("Dense",) for p in ("e1", "g0", "e2", "g1", "head")})
    plan = make_plan(src, tgt)
    assert plan.ok, plan.problems()
    got = {m.target: m.source for m in plan.matches if m.how == "aligned"}
    assert got == {"g0.weight": "f0.weight", "g1.weight": "f1.weight"}


def test_a_declared_value_is_never_overridden_by_alignment(tmp_path):
    src = _source(tmp_path, {"x.weight": (4, 4)})
    tgt = _target({"a.weight": (4, 4)}, {"a": ("Dense",)})
    from ms_port.match.mapping import mapping_from_data

    table = mapping_from_data({"tensors": {"a.weight": {"init": "zeros"}}})
    plan = make_plan(src, tgt, table, options=PlanOptions(allow_unused=True))
    ((m,),) = [plan.matches]
    assert (m.how, m.init) == ("initialised", "zeros")


def test_saved_map_keeps_declared_transforms_and_never_renames_outside_the_plan(tmp_path):
    """Round trips the review found broken: transforms from the mapping's transforms:
    section, and a segment rename that would also rename an unused source."""
    import yaml

    from ms_port.match.mapping import mapping_from_data

    src = _source(tmp_path, {"a.weight": (3, 4), "p.old.w": (2,), "q.old.w": (2,),
                             "k.new.w": (2,), "k.old.w": (2,)})
    tgt = _target({"a.weight": (4, 3), "p.new.w": (2,), "q.new.w": (2,), "k.new.w": (2,)})
    table = mapping_from_data({"transforms": [{"match": "a\\.weight", "ops": [
        {"transpose": [1, 0]}]}], "tensors": {"p.new.w": "p.old.w", "q.new.w": "q.old.w"}})
    plan = make_plan(src, tgt, table, options=PlanOptions(allow_unused=True, align=False))
    assert plan.ok, plan.problems()
    saved = yaml.safe_load(plan.to_yaml())
    assert "rename" not in saved  # 'old: new' would also rename the unused k.old.w
    again = make_plan(src, tgt, mapping_from_data(saved),
                      options=PlanOptions(allow_unused=True, align=False))
    assert again.ok, again.problems()
    assert {(m.target, m.source, str(m.transforms)) for m in again.matches} == \
        {(m.target, m.source, str(m.transforms)) for m in plan.matches}


def _vit_like(extra_source=None, extra_target=None):
    src = {"class_token": (1, 1, 8), "conv_proj.weight": (8, 3, 4, 4), "conv_proj.bias": (8,),
           "encoder.pos_embedding": (1, 5, 8), "head.weight": (4, 8), "head.bias": (4,)}
    tgt = {"cls_token": (1, 1, 8), "pos_embed": (1, 5, 8), "patch.proj.weight": (8, 3, 4, 4),
           "patch.proj.bias": (8,), "head.weight": (4, 8), "head.bias": (4,)}
    return {**src, **(extra_source or {})}, {**tgt, **(extra_target or {})}


KINDS = {"patch.proj": ("Conv2d",), "head": ("Dense",)}


def test_loose_tensors_pair_by_a_unique_shape_and_a_shared_word(tmp_path):
    """A ViT's class token and position embedding are held by blocks, not layers: the
    patch conv crosses them in order, so no alignment segment holds both sides. Each is
    the only leftover of its shape on either side, and the names share a word."""
    src, tgt = _vit_like()
    plan = make_plan(_source(tmp_path, src), _target(tgt, KINDS))
    assert plan.ok, plan.problems()
    got = {m.target: (m.source, m.how, m.detail) for m in plan.matches}
    assert got["cls_token"][:2] == ("class_token", "aligned")
    assert got["pos_embed"][:2] == ("encoder.pos_embedding", "aligned")
    assert ("the only unpaired tensor of its shape on either side (1×5×8), the names sharing "
            "'embed', 'pos'") in got["pos_embed"][2]
    assert got["pos_embed"][2].count("'pos'") == 1  # each shared word named once


@pytest.mark.parametrize(("extra_source", "extra_target", "left"), [
    ({"encoder.pos_embedding_2": (1, 5, 8)}, None, "pos_embed"),  # two sources of one shape
    (None, {"dist_token": (1, 5, 8)}, "pos_embed"),               # two targets of one shape
])
def test_loose_tensors_are_never_guessed_among_equals(tmp_path, extra_source, extra_target,
                                                      left):
    src, tgt = _vit_like(extra_source, extra_target)
    plan = make_plan(_source(tmp_path, src), _target(tgt, KINDS))
    assert left in {t.name for t in plan.missing}
    assert {m.target: m.source for m in plan.matches}["cls_token"] == "class_token"


def test_a_layers_tensor_is_never_paired_as_a_loose_tensor(tmp_path):
    """Unique leftovers of one shape whose names share a word, but named as a layer names
    its tensors ('weight'): the alignment's to pair, by its layer, never a loose guess."""
    from ms_port.match.structure import loose_pairs

    source = _source(tmp_path, {"adapter.weight": (3, 7), "adapter_token": (1, 2, 7)})
    target = _target({"bridge.weight": (3, 7), "bridge_token": (1, 2, 7)}, {})
    left = [("bridge.weight", (3, 7)), ("bridge_token", (1, 2, 7))]
    made = loose_pairs(source, target, {}, set(), left, None)
    assert [(m.target, m.source) for m in made] == [("bridge_token", "adapter_token")]


def test_loose_tensors_with_no_word_in_common_stay_leftovers(tmp_path):
    src, tgt = _vit_like()
    tgt["register"] = tgt.pop("pos_embed")
    plan = make_plan(_source(tmp_path, src), _target(tgt, KINDS))
    assert "register" in {t.name for t in plan.missing}
    assert "encoder.pos_embedding" in {s.name for s in plan.unused}


def test_save_map_writes_renumbered_blocks_as_one_regex_that_reproduces_the_plan(tmp_path):
    """torchvision-style `features.N.conv.K` against `features.(N+2).layers.K`: aligned
    layer by layer, saved as one regex with index arithmetic instead of a line per tensor;
    loaded back with names only (no alignment), the same plan."""
    import yaml

    src, tgt, kinds = {}, {}, {}
    for n in range(1, 5):
        for k in range(2):
            src[f"features.{n}.conv.{k}.weight"] = (8 + n, 8 + n + k)
            src[f"features.{n}.conv.{k}.bias"] = (8 + n,)
            tgt[f"features.{n + 2}.layers.{k}.weight"] = (8 + n, 8 + n + k)
            tgt[f"features.{n + 2}.layers.{k}.bias"] = (8 + n,)
            kinds[f"features.{n + 2}.layers.{k}"] = ("Dense",)
    plan = make_plan(_source(tmp_path, src), _target(tgt, kinds))
    assert plan.ok and plan.counts["aligned"] == 16
    saved = yaml.safe_load(plan.to_yaml())
    assert saved["rename"]["regex"] == [{"from": r"features\.([0-9]+)\.conv\.([0-9]+)\.([^.]+)",
                                         "to": "features.{1+2}.layers.\\2.\\3"}]
    assert saved["tensors"] == {}
    again = make_plan(_source(tmp_path, src), _target(tgt, kinds),
                      mapping=mapping_from_data(saved), options=PlanOptions(align=False))
    assert again.ok and again.counts["mapping"] + again.counts["exact"] == 16
    assert {(m.target, m.source) for m in again.matches} == \
        {(m.target, m.source) for m in plan.matches}


def test_a_renumbering_regex_that_would_catch_a_tensor_outside_the_plan_is_not_written(
        tmp_path):
    import yaml

    src = {f"blocks.{n}.fc.weight": (4 + n, 3) for n in range(4)}
    tgt = {f"layers.{n + 1}.fc.weight": (4 + n, 3) for n in range(4)}
    src["blocks.9.fc.weight"] = (2, 2)  # left unused: a regex over blocks.N would claim it
    plan = make_plan(_source(tmp_path, src),
                     _target(tgt, {f"layers.{n + 1}.fc": ("Dense",) for n in range(4)}))
    assert plan.counts["aligned"] == 4
    saved = yaml.safe_load(plan.to_yaml())
    assert "rename" not in saved and len(saved["tensors"]) == 4


@pytest.mark.parametrize(("src_names", "tgt_names"), [
    (["cls_token", "pos_embed", "dist_token"],                      # no path on one side
     ["backbone.cls_token", "backbone.pos_embed", "backbone.dist_token"]),
    (["net.0.cls_token", "net.1.cls_token", "net.2.cls_token"], ["a", "b", "c"]),
    (["a.\u00b2.c.w", "a.\u00b3.c.w", "a.\u00b9.c.w"],              # superscripts: not numbers
     ["x.2.c.w", "x.3.c.w", "x.1.c.w"]),
    ([f"a.{'9' * 5000}{i}.c.w" for i in range(3)],                  # int() refuses 4,300+ digits
     [f"x.{i}.c.w" for i in range(3)]),
    ([f"a.{i}.c.w" for i in range(3)], [f"x\\9.{i + 1}.c.w" for i in range(3)]),  # group ref
    ([f"a.{i}.c.w" for i in range(3)], [f"x{{1+5}}.{i + 1}.c.w" for i in range(3)]),  # sums
])
def test_saved_map_never_drops_a_line_a_regex_does_not_reproduce(tmp_path, src_names,
                                                                  tgt_names):
    import yaml

    shapes = [(3 + i, 2) for i in range(len(src_names))]
    src = dict(zip(src_names, shapes))
    tgt = dict(zip(tgt_names, shapes))
    table = {"tensors": dict(zip(tgt_names, src_names))}
    plan = make_plan(_source(tmp_path, src), _target(tgt), mapping=mapping_from_data(table))
    assert plan.ok, plan.problems()
    saved = yaml.safe_load(plan.to_yaml())
    again = make_plan(_source(tmp_path, src), _target(tgt), mapping=mapping_from_data(saved),
                      options=PlanOptions(align=False))
    assert {(m.target, m.source) for m in again.matches} == \
        {(m.target, m.source) for m in plan.matches}
