"""Verify by layers with a mixture of experts' routed experts run a group at a time
(``ms_port.check.routed``): the same report as the whole layer's, every expert proven on
every token (one no token is routed to among them), a wrong one named.

Skipped where transformers / mindformers (the test extra) are absent.
"""

from __future__ import annotations

import importlib.util
import shutil

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("torch")
if importlib.util.find_spec("mindformers") is None:
    pytest.skip("mindformers not installed (test extra)", allow_module_level=True)

import handed_back  # noqa: E402
from test_parallel_core import state_dict_folder, tiny_qwen3_moe  # noqa: E402
from test_parallel_core_deepseek import tiny_deepseek  # noqa: E402

import ms_port  # noqa: E402
from ms_port.check import blocks, routed  # noqa: E402
from ms_port.testing import rewrite_checkpoint  # noqa: E402

QWEN3_MOE, DEEPSEEK = "mindformers:qwen3_moe", "mindformers:deepseek3"
H, E, F = 64, 4, 32  # both fixtures' hidden size, experts, expert intermediate size


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    """The tiny Qwen3-MoE (2 MoE layers of 4 experts, top 2), its conversion, and verify by
    layers of it with each layer's experts whole."""
    root = tmp_path_factory.mktemp("moe")
    src = tiny_qwen3_moe(root / "hf")
    out = root / "m.ckpt"
    assert ms_port.convert(src, ms_model=QWEN3_MOE, output=out).ok
    whole = ms_port.verify(src, out, ms_model=QWEN3_MOE, mode="layers")
    assert whole.verdict == "PASS" and not _experts(whole), whole.reasons
    return src, out, whole


def _experts(report):
    return [c for c in report.layers if c.paired_by == "expert"]


def _others(report):
    return [c for c in report.layers if c.paired_by != "expert"]


@pytest.mark.parametrize("size", [1, 2])
def test_experts_a_group_at_a_time_give_the_whole_layers_report(moe, monkeypatch, size):
    """Every row of the whole layers' report, to float32 rounding (the routed sum adds
    the groups' shares in turn), and one row per group: its worst expert, every expert
    run on every token of PyTorch's input on both sides, within its own bound."""
    src, out, whole = moe
    monkeypatch.setattr(routed, "EXPERTS_PER_GROUP", size)
    report = ms_port.verify(src, out, ms_model=QWEN3_MOE, mode="layers")
    assert report.verdict == "PASS", report.reasons
    mine, theirs = _others(report), _others(whole)
    assert [(c.ms, c.torch, c.paired_by) for c in mine] == [
        (c.ms, c.torch, c.paired_by) for c in theirs]
    for a, b in zip(mine, theirs):
        assert a.status == b.status == "ok"
        assert a.error == pytest.approx(b.error, rel=0.3, abs=1e-7), a.name
        assert a.noise == pytest.approx(b.noise, rel=0.3, abs=1e-7), a.name
        assert a.sensitivity == pytest.approx(b.sensitivity, rel=0.1), a.name
    assert report.outputs[0].error == pytest.approx(whole.outputs[0].error, rel=0.3, abs=1e-7)
    experts = _experts(report)
    assert len(experts) == 2 * E // size  # per layer, one row per group
    for layer in (0, 1):
        rows = [c for c in experts if c.ms == f"decoder.layers.{layer}.mlp.experts"]
        assert len(rows) == E // size
        for g, c in enumerate(rows):
            expert = int(c.torch.rpartition(".")[2])
            assert c.torch == f"model.layers.{layer}.mlp.experts.{expert}"
            assert g * size <= expert < (g + 1) * size
            assert f"the worst of experts {g * size}-{(g + 1) * size - 1}" in c.note
            assert c.status == "ok" and c.shape == (16, H)
            assert c.error < 1e-6 and 0 < c.noise < 1e-6 and c.sensitivity > 0.1
    if size == 1:  # every expert has a row of its own
        assert sorted(c.torch for c in experts) == sorted(
            f"model.layers.{i}.mlp.experts.{e}" for i in (0, 1) for e in range(E))


def test_what_mindspore_keeps_after_its_passes_is_never_read_again(tmp_path, monkeypatch):
    """A GRAPH-compiled network keeps the arrays its parameters were given until it runs
    again: verify hands their pages back once the block's passes are done (a DeepSeek-
    V3.2 layer's 2.3 GB). Filled with NaN there instead, every block's and every group's
    (attention, router, routed experts): the same report, to the bit; a wrong expert
    still FAILs, named alone. Filled before MindSpore computes: the report changes.
    (bfloat16, as such models are saved: each side's float32 arrays are then verify's own
    casts.)"""
    src = tiny_qwen3_moe(tmp_path / "hf", dtype="bfloat16")
    out = tmp_path / "m.ckpt"
    assert ms_port.convert(src, ms_model=QWEN3_MOE, output=out).ok
    monkeypatch.setattr(routed, "EXPERTS_PER_GROUP", 1)
    clean = ms_port.verify(src, out, ms_model=QWEN3_MOE, mode="layers")
    poisoning, filled = handed_back.poisoning()
    monkeypatch.setattr(blocks, "HandedBack", poisoning)
    poisoned = ms_port.verify(src, out, ms_model=QWEN3_MOE, mode="layers")
    assert poisoned.verdict == clean.verdict == "PASS", poisoned.reasons
    assert handed_back.report_fields(poisoned) == handed_back.report_fields(clean)
    # the attention's (q_proj: 64 -> heads), the router's and each group's experts were
    # handed back, one expert's rows at a time
    shapes = set(filled)
    assert len(filled) > 2 * E and (E, H) in shapes, shapes
    assert any(len(s) == 2 and s[0] == 2 * F for s in shapes), shapes

    name = "decoder.layers.1.mlp.experts.weight1"

    def edit(t):
        w = t[name].reshape(E, H, 2 * F).copy()
        w[2] *= 1.05  # (a bfloat16 step is 2**-8 of the value)
        t[name] = w.reshape(E * H, 2 * F)

    wrong = rewrite_checkpoint(out, tmp_path / "wrong.ckpt", edit)
    filled.clear()
    failed = ms_port.verify(src, wrong, ms_model=QWEN3_MOE, mode="layers")
    assert failed.verdict == "FAIL" and filled
    bad = [c for c in _experts(failed) if c.status != "ok"]
    assert [c.torch for c in bad] == ["model.layers.1.mlp.experts.2"], bad

    early, _ = handed_back.poisoning(early=True)  # the control: the harness can fail
    monkeypatch.setattr(blocks, "HandedBack", early)
    assert ms_port.verify(src, out, ms_model=QWEN3_MOE, mode="layers").verdict != "PASS"


def test_a_wrong_expert_fails_in_its_group_naming_it(moe, tmp_path, monkeypatch):
    """Expert 2 of layer 1 off by 1e-3 in MindSpore's checkpoint: FAIL, its group's row
    names it and is above its bound; the other group's is within."""
    src, out, _ = moe
    name = "decoder.layers.1.mlp.experts.weight1"

    def edit(t):
        w = t[name].reshape(E, H, 2 * F).copy()
        w[2] *= 1.001
        t[name] = w.reshape(E * H, 2 * F)

    wrong = rewrite_checkpoint(out, tmp_path / "wrong.ckpt", edit)
    monkeypatch.setattr(routed, "EXPERTS_PER_GROUP", 2)
    report = ms_port.verify(src, wrong, ms_model=QWEN3_MOE, mode="layers")
    assert report.verdict == "FAIL"
    rows = [c for c in _experts(report) if c.ms == "decoder.layers.1.mlp.experts"]
    assert [c.status for c in rows] == ["ok", "fail"]
    assert rows[1].torch == "model.layers.1.mlp.experts.2" and "expert 2," in rows[1].note
    assert rows[1].error > 100 * rows[1].bound
    assert all(c.status == "ok" for c in _experts(report) if c.ms.startswith("decoder.layers.0"))


@pytest.fixture(scope="module")
def unrouted(tmp_path_factory):
    """The tiny DeepSeek-V3 (a dense layer, two of 4 routed experts in 2 groups, top 2
    within 1 group, a shared expert) whose correction bias keeps every token out of
    experts 2 and 3 (their group's score is -1000), and its conversion."""
    from safetensors.numpy import load_file, save_file

    root = tmp_path_factory.mktemp("unrouted")
    src = tiny_deepseek(root / "made")
    hf = root / "hf"
    hf.mkdir()
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, hf / f.name)
    tensors = {}
    for f in sorted(src.glob("*.safetensors")):
        tensors.update(load_file(f))
    for layer in (1, 2):
        bias = tensors[f"model.layers.{layer}.mlp.gate.e_score_correction_bias"].copy()
        bias[2:] = -1000.0
        tensors[f"model.layers.{layer}.mlp.gate.e_score_correction_bias"] = bias
    save_file(tensors, hf / "model.safetensors", metadata={"format": "pt"})
    index = hf / "model.safetensors.index.json"
    if index.exists():
        index.unlink()
    out = root / "m.ckpt"
    assert ms_port.convert(hf, ms_model=DEEPSEEK, output=out).ok
    return hf, out


def test_an_expert_no_token_is_routed_to_is_proven_all_the_same(unrouted, tmp_path,
                                                                 monkeypatch):
    """DeepSeek-V3's layers a group at a time give the whole layers' verdict; and expert 3,
    which no token reaches, wrong in MindSpore's checkpoint: every layer's output is right
    (the whole layers' forward passes it), the expert's own row FAILs, naming it."""
    src, out = unrouted
    whole = ms_port.verify(src, out, ms_model=DEEPSEEK, mode="layers")
    assert whole.verdict == "PASS", whole.reasons
    monkeypatch.setattr(routed, "EXPERTS_PER_GROUP", 2)
    grouped = ms_port.verify(src, out, ms_model=DEEPSEEK, mode="layers")
    assert grouped.verdict == "PASS", grouped.reasons
    assert [c.ms for c in _others(grouped)] == [c.ms for c in _others(whole)]
    assert len(_experts(grouped)) == 4  # layers 1 and 2, two groups each

    name = "decoder.layers.2.mlp.experts.weight2"

    def edit(t):
        w = t[name].reshape(E, F, H).copy()
        w[3] = w[3][::-1]  # expert 3's down projection, its rows reversed
        t[name] = w.reshape(E * F, H)

    wrong = rewrite_checkpoint(out, tmp_path / "wrong.ckpt", edit)
    monkeypatch.setattr(routed, "EXPERTS_PER_GROUP", None)
    unseen = ms_port.verify(src, wrong, ms_model=DEEPSEEK, mode="layers")
    # no token reaches expert 3: the whole layers' forward cannot see it; the tensor check
    # before it does, naming the stack's first source, not the expert
    assert all(c.status == "ok" for c in unseen.layers) and unseen.outputs[0].status == "ok"
    assert unseen.verdict == "FAIL" and "experts.weight2 differs" in unseen.reasons[0]
    monkeypatch.setattr(routed, "EXPERTS_PER_GROUP", 2)
    report = ms_port.verify(src, wrong, ms_model=DEEPSEEK, mode="layers")
    assert report.verdict == "FAIL"
    assert all(c.status == "ok" for c in _others(report))
    bad = [c for c in _experts(report) if c.status != "ok"]
    assert [(c.ms, c.torch) for c in bad] == [("decoder.layers.2.mlp.experts",
                                               "model.layers.2.mlp.experts.3")]


def test_groups_are_planned_from_the_layer_and_divide_the_experts(monkeypatch):
    """By default a group holds at most :data:`routed.GROUP_NUMEL` parameters (at least
    one expert), a divisor of the experts; experts no larger run whole."""
    from ms_port.archs.experts import RoutedExperts

    class Info:
        def __init__(self, numel):
            self.numel = numel

    class Blocks:
        def routed_of(self, piece, names):
            return RoutedExperts(256, {"x.gate_up_proj": ("gu",), "x.down_proj": ("d",)},
                                 {"x.weight1": "w1", "x.weight2": "w2"}, "model.layers.3",
                                 "decoder.layers.3")

    class Piece:
        def __init__(self):
            self.torch = {"a": "attention", "x.gate_up_proj": "gu", "x.down_proj": "d"}

    class Source:
        def __init__(self, attention, gate_up, down):
            self.tensors = {"attention": Info(attention), "gu": Info(gate_up),
                            "d": Info(down)}

    deepseek = Source(233_000_000, 256 * 29_360_128, 256 * 14_680_064)
    groups = routed.plan_groups(Blocks(), Piece(), deepseek)
    assert groups is not None and groups.size == 1  # DeepSeek-V3: 1.5 experts fit
    assert routed.group_numel(groups, deepseek) == 44_040_192
    assert list(groups.starts)[:3] == [0, 1, 2] and len(groups.starts) == 256
    qwen = Source(19_000_000, 256 * 3_145_728, 256 * 1_572_864)  # 256 experts of 4.7M
    assert routed.plan_groups(Blocks(), Piece(), qwen).size == 8  # 14 fit, 8 divide 256
    small = Source(10_000, 256 * 100, 256 * 50)
    assert routed.plan_groups(Blocks(), Piece(), small) is None
    monkeypatch.setattr(routed, "EXPERTS_PER_GROUP", 3)
    assert routed.plan_groups(Blocks(), Piece(), small).size == 2  # divides 256


def test_a_layer_refused_for_memory_counts_one_group_of_experts():
    """The memory check before a routed layer is read counts its other tensors and one
    group, not every expert."""
    from ms_port.check.blocks import _check_fits
    from ms_port.errors import ForwardUnavailable

    class Info:
        def __init__(self, numel):
            self.numel, self.shape = numel, (numel,)

    class Piece:
        def __init__(self):
            self.name, self.torch, self.rows, self.exact = "model.layers.3", {"a": "attention"}, \
                (), False

    class Source:
        def __init__(self):
            self.tensors = {"attention": Info(1_000)}

    gib = 2**30
    _check_fits(Piece(), Source(), True, available=2 * gib, extra=100_000_000)  # 0.8 GB
    with pytest.raises(ForwardUnavailable, match=r"block model\.layers\.3 needs ~2\.9 GiB"):
        _check_fits(Piece(), Source(), True, available=2 * gib, extra=250_000_000)


def test_the_tensor_check_reads_stacked_experts_a_group_at_a_time(moe, tmp_path, monkeypatch):
    """The tensor check before the forward compares a stack the plan computes an expert
    at a time (``weight1`` / ``weight2``) an expert's rows at a time: the whole expected
    stack is never made where every group is identical; a wrong expert is still named."""
    from ms_port.check.tensors import compare_through_plan
    from ms_port.match.result import Plan
    from ms_port.read.sources import read_source

    src, out, _ = moe
    plan = ms_port.plan(src, ms_model=QWEN3_MOE)
    assert {m.groups for m in plan.matches if m.target.endswith("experts.weight1")} == {E}
    whole = Plan.expected

    def never_whole(self, m):
        assert not m.target.endswith(("experts.weight1", "experts.weight2")), m.target
        return whole(self, m)

    def check(path):
        ckpt = read_source(path)
        return compare_through_plan(plan, {i.name: i.load for i in ckpt}, a="hf", b="ms",
                                    infos=ckpt.tensors)

    monkeypatch.setattr(Plan, "expected", never_whole)
    found = check(out)
    assert found.ok
    stacks = [d for d in found.deltas if d.target.endswith(("experts.weight1", "weight2"))]
    assert len(stacks) == 4 and all(d.status == "identical" for d in stacks)
    assert {d.shape for d in stacks} == {(E * H, 2 * F), (E * F, H)}
    monkeypatch.setattr(Plan, "expected", whole)
    name = "decoder.layers.0.mlp.experts.weight2"
    wrong = rewrite_checkpoint(out, tmp_path / "wrong.ckpt", lambda t: t.update(
        {name: t[name].reshape(E, F, H)[[0, 1, 3, 2]].reshape(E * F, H)}))
    failed = check(wrong)
    assert [d.target for d in failed.deltas if d.status == "differs"] == [name]


def test_stacked_experts_in_the_file_run_a_group_of_rows_at_a_time(moe, tmp_path, monkeypatch):
    """A state dict saved from transformers 5 (its stacked ``experts.gate_up_proj``
    [E, 2F, H]) gives each group its rows of the stack: the same verdict and expert rows."""
    src, out, _ = moe
    fused = state_dict_folder(src, tmp_path / "fused")
    monkeypatch.setattr(routed, "EXPERTS_PER_GROUP", 2)
    report = ms_port.verify(fused, out, ms_model=QWEN3_MOE, mode="layers")
    assert report.verdict == "PASS", report.reasons
    rows = _experts(report)
    assert len(rows) == 4 and all(c.status == "ok" and c.error < 1e-6 for c in rows)


def test_an_expert_layers_tensors_are_checked_as_it_starts_not_beside_the_block_before(
        moe, monkeypatch):
    """Each block's tensors are checked on a thread while the block before it runs, but a
    mixture's experts' (their check holds a group's rows and copies): after the block
    before it is done, as its own starts."""
    from test_blocks import assert_heavy_checks_alone, record_checks

    src, out, _ = moe
    seen = record_checks(monkeypatch)
    report = ms_port.verify(src, out, ms_model=QWEN3_MOE, mode="layers")
    assert report.verdict == "PASS"
    assert_heavy_checks_alone(seen, blocks=2)  # the fixture's 2 layers of experts
