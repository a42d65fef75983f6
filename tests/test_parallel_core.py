"""MindFormers 2.1's parallel_core networks as targets (``mindformers:qwen3``), with no
mapping file: the computed names and shapes equal the real network's, every tensor equals
what MindFormers' own ``weight_converters`` make of the Hugging Face tensors, and the way
back is bit-exact. Skipped where transformers / mindformers (the test extra) are absent.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")

import ms_port  # noqa: E402
from ms_port.archs.parallel_core.family import qwen3_target  # noqa: E402
from ms_port.errors import TargetError  # noqa: E402
from ms_port.read.sources import read_source  # noqa: E402

needs_mindformers = pytest.mark.skipif(importlib.util.find_spec("mindformers") is None,
                                       reason="mindformers not installed (test extra)")

QWEN3 = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=8, num_key_value_heads=2, head_dim=16,
             max_position_embeddings=64, rms_norm_eps=1e-6)


def tiny_qwen3(path, *, tied=False, dtype="float32", seed=0):
    """A seeded tiny Qwen3 (head_dim 16: q rows 128, twice the hidden size), its norms off
    1 so that a swapped norm shows."""
    import torch

    config = transformers.Qwen3Config(**QWEN3, tie_word_embeddings=tied)
    torch.manual_seed(seed)
    model = transformers.Qwen3ForCausalLM(config)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1 + 0.2 * torch.randn(param.shape, generator=gen))
    model.to(getattr(torch, dtype)).save_pretrained(path)
    return path


_REAL = r"""
import json, os, sys
os.environ.setdefault("LOCAL_DEFAULT_PATH", sys.argv[2])
from mindspore.nn.utils import no_init_parameters
from mindformers.core.context import build_context
build_context({'use_legacy': False, 'context': {'device_target': 'CPU', 'mode': 0},
               'parallel': {}})
from mindformers.models.qwen3.configuration_qwen3 import Qwen3Config
from mindformers.models.qwen3.modeling_qwen3_train import TrainingQwen3ForCausalLM
hf = json.loads(sys.argv[1])
keep = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "head_dim", "tie_word_embeddings",
        "rms_norm_eps", "max_position_embeddings")
with no_init_parameters():
    net = TrainingQwen3ForCausalLM(Qwen3Config(**{k: hf[k] for k in keep if k in hf}))
print("NAMES" + json.dumps([[p.name, list(p.shape)] for _, p in net.parameters_and_names()]))
"""


def _real_names(config, tmp_path):
    """The real network's parameters, built in a process of its own (parallel_core needs
    MindFormers' global context set for it, which the legacy LLaMA tests must not see)."""
    run = subprocess.run([sys.executable, "-c", _REAL, json.dumps(config), str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    line = next((x for x in run.stdout.splitlines() if x.startswith("NAMES")), None)
    assert line is not None, run.stderr[-2000:]
    return [(n, tuple(s)) for n, s in json.loads(line[len("NAMES"):])]


@needs_mindformers
@pytest.mark.parametrize("tied", [False, True])
def test_computed_target_equals_the_real_network(tmp_path, tied):
    config = {**QWEN3, "model_type": "qwen3", "tie_word_embeddings": tied}
    computed = [(t.name, t.shape) for t in qwen3_target(config).tensors.values()]
    assert computed == _real_names(config, tmp_path)


def _mindformers_converted(source_dir):
    """MindFormers' own Qwen3 weight_converters applied to the Hugging Face tensors, with
    the sizes a single-device job gives them (outside a parallel job they read
    optimizer_parallel_size -1, and their reshapes raise)."""
    from mindformers.models.qwen3.utils import Qwen3PreTrainedModel

    config = json.loads((source_dir / "config.json").read_text())
    hf = {i.name: np.asarray(i.load()) for i in read_source(source_dir)}
    sizes = dict(num_attention_heads=config["num_attention_heads"],
                 num_query_groups=config["num_key_value_heads"], kv_channels=config["head_dim"],
                 hidden_size=config["hidden_size"], tensor_model_parallel_size=1,
                 optimizer_parallel_size=1, interleaved=True)
    out = {}
    for shared in Qwen3PreTrainedModel.weight_converters:
        op = copy.copy(shared)  # class-level and shared: never changed in place here
        for key, value in sizes.items():
            if hasattr(op, key):
                setattr(op, key, value)
        layers = range(config["num_hidden_layers"]) if "{}" in op.hf_names[0] else [None]
        for i in layers:
            names = [n.format(i) for n in op.hf_names]
            if not all(n in hf for n in names):
                continue  # a tied head
            made = op._hf_to_mf([hf[n] for n in names])
            out.update(zip([n.format(i) for n in op.mf_names], made))
    return out


@needs_mindformers
@pytest.mark.parametrize("tied,dtype", [(False, "float32"), (True, "bfloat16")])
def test_every_tensor_equals_mindformers_converters(tmp_path, tied, dtype):
    src = tiny_qwen3(tmp_path / "q3", tied=tied, dtype=dtype)
    out = tmp_path / "q3.ckpt"
    report = ms_port.convert(src, ms_model="mindformers:qwen3", output=out)
    assert report.ok and report.plan.mapping.origin.endswith("hf_qwen3_mindformers.yaml")
    ours = {i.name: np.asarray(i.load()) for i in read_source(out)}
    theirs = _mindformers_converted(src)
    assert set(ours) == set(theirs)
    for name in ours:
        assert ours[name].tobytes() == theirs[name].tobytes(), name


@needs_mindformers
def test_the_grouped_and_interleaved_layouts_are_not_plain_concatenations(tmp_path):
    """A plain [q; k; v] or [gate; up] is a different tensor: the oracle would see it."""
    src = tiny_qwen3(tmp_path / "q3")
    hf = {i.name: np.asarray(i.load()) for i in read_source(src)}
    theirs = _mindformers_converted(src)
    p = "model.layers.0."
    plain_qkv = np.concatenate([hf[p + f"self_attn.{x}_proj.weight"] for x in "qkv"])
    plain_fc1 = np.concatenate([hf[p + "mlp.gate_proj.weight"], hf[p + "mlp.up_proj.weight"]])
    assert not np.array_equal(plain_qkv,
                              theirs["decoder.layers.0.self_attention.linear_qkv.weight"])
    assert not np.array_equal(plain_fc1, theirs["decoder.layers.0.mlp.linear_fc1.weight"])


def test_the_plan_says_which_mlp_layout_it_writes(tmp_path):
    """linear_fc1 is written interleaved, MindFormers' default, and the plan says how to
    write it for a network built with use_interleaved_weight_layout_mlp false. A mixture
    of experts with no dense MLP has nothing to say."""
    dense = ms_port.convert(tiny_qwen3(tmp_path / "q3"), ms_model="mindformers:qwen3",
                            output=tmp_path / "q3.ckpt")
    assert [n for n in dense.plan.notes
            if "interleaved" in n and "use_interleaved_weight_layout_mlp: true" in n
            and "--ms-option use_interleaved_weight_layout_mlp=false" in n]
    moe = ms_port.convert(tiny_qwen3_moe(tmp_path / "moe"), ms_model="mindformers:qwen3_moe",
                          output=tmp_path / "moe.ckpt")
    assert not [n for n in moe.plan.notes if "use_interleaved_weight_layout_mlp" in n]


HALVES = {"use_interleaved_weight_layout_mlp": False}


@needs_mindformers
@pytest.mark.parametrize("mode", ["whole", "layers"])
def test_contiguous_mlp_halves_for_a_network_built_so(tmp_path, mode):
    """--ms-option use_interleaved_weight_layout_mlp=false writes linear_fc1 as [gate; up]
    halves; MindFormers' network built with that setting computes transformers' logits
    from it, whole and by layers; each layout given to the other network FAILs there,
    naming linear_fc1; export with the option gives the Hub's tensors back bit-exact."""
    src = tiny_qwen3(tmp_path / "q3")
    halves, inter = tmp_path / "halves.ckpt", tmp_path / "inter.ckpt"
    made = ms_port.convert(src, ms_model="mindformers:qwen3", output=halves, ms_options=HALVES)
    assert made.ok and [n for n in made.plan.notes if "two contiguous halves" in n]
    assert ms_port.convert(src, ms_model="mindformers:qwen3", output=inter).ok
    hub = {i.name: np.asarray(i.load()) for i in read_source(src)}
    fc1 = {i.name: np.asarray(i.load()) for i in read_source(halves)}[
        "decoder.layers.1.mlp.linear_fc1.weight"]
    assert np.array_equal(fc1, np.concatenate([hub["model.layers.1.mlp.gate_proj.weight"],
                                               hub["model.layers.1.mlp.up_proj.weight"]]))
    args = dict(ms_model="mindformers:qwen3", mode=mode)
    assert ms_port.verify(src, halves, ms_options=HALVES, **args).verdict == "PASS"
    for ckpt, options in [(inter, HALVES), (halves, None)]:
        wrong = ms_port.verify(src, ckpt, ms_options=options, **args)
        assert wrong.verdict == "FAIL" and "linear_fc1" in " ".join(wrong.reasons)
    if mode == "whole":
        back = ms_port.export(halves, ms_model="mindformers:qwen3", config=src / "config.json",
                              output=tmp_path / "back", ms_options=HALVES)
        again = {i.name: np.asarray(i.load()) for i in read_source(tmp_path / "back")}
        assert back.ok and set(again) == set(hub)
        assert all(again[k].tobytes() == hub[k].tobytes() for k in hub)
        # the family recognised by its names (no --ms-model), the option still applied
        flat = ms_port.export(halves, target=src / "model.safetensors",
                              output=tmp_path / "t.safetensors", ms_options=HALVES)
        again = {i.name: np.asarray(i.load()) for i in read_source(tmp_path / "t.safetensors")}
        assert flat.ok and all(again[k].tobytes() == hub[k].tobytes() for k in hub)


@pytest.mark.parametrize("tied", [False, True])
def test_export_round_trip_is_bit_identical(tmp_path, tied):
    src = tiny_qwen3(tmp_path / "q3", tied=tied, dtype="bfloat16")
    out = tmp_path / "q3.ckpt"
    assert ms_port.convert(src, ms_model="mindformers:qwen3", output=out).ok
    back = ms_port.export(out, ms_model="mindformers:qwen3", config=src / "config.json",
                          output=tmp_path / "back")
    assert back.ok
    original = {i.name: np.asarray(i.load()) for i in read_source(src)}
    again = {i.name: np.asarray(i.load()) for i in read_source(tmp_path / "back")}
    assert set(again) == set(original)
    for name in original:
        assert again[name].tobytes() == original[name].tobytes(), name


def test_what_mindformers_qwen3_cannot_hold_is_one_line(tmp_path):
    with pytest.raises(TargetError, match="attention_bias is set"):
        qwen3_target({**QWEN3, "model_type": "qwen3", "attention_bias": True})
    with pytest.raises(TargetError, match="model_type 'llama' is not one mindformers:qwen3"):
        qwen3_target({**QWEN3, "model_type": "llama"})
    with pytest.raises(TargetError, match="hidden_act 'gelu'"):
        qwen3_target({**QWEN3, "model_type": "qwen3", "hidden_act": "gelu"})


QWEN3_MOE = dict(QWEN3, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2)


def state_dict_folder(src, folder):
    """``folder`` holding what ``torch.save(model.state_dict())`` holds of the Qwen3-MoE at
    ``src`` (transformers 5's in-memory stacked ``experts.gate_up_proj``), as safetensors,
    with its config.json."""
    from safetensors.torch import save_file

    model = transformers.Qwen3MoeForCausalLM.from_pretrained(src)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    assert "model.layers.1.mlp.experts.gate_up_proj" in state
    folder.mkdir()
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    shutil.copy(src / "config.json", folder / "config.json")
    return folder


def tiny_qwen3_moe(path, *, dtype="float32", seed=0):
    """A seeded tiny Qwen3-MoE saved as transformers writes it: per-expert keys
    (``experts.{e}.gate_proj``), ``num_local_experts`` in config.json."""
    import torch

    config = transformers.Qwen3MoeConfig(**QWEN3_MOE)
    torch.manual_seed(seed)
    model = transformers.Qwen3MoeForCausalLM(config)
    model.to(getattr(torch, dtype)).save_pretrained(path)
    return path


@needs_mindformers
def test_moe_target_equals_the_real_network(tmp_path):
    from ms_port.archs.parallel_core.moe import target

    config = {**QWEN3_MOE, "model_type": "qwen3_moe"}
    computed = [(t.name, t.shape) for t in target(config).tensors.values()]
    config["moe_grouped_gemm"] = True  # MindFormers builds MoE only with it
    script = _REAL.replace("qwen3.configuration_qwen3 import Qwen3Config",
                           "qwen3_moe.configuration_qwen3_moe import Qwen3MoeConfig as Qwen3Config")
    script = script.replace("qwen3.modeling_qwen3_train import TrainingQwen3ForCausalLM",
                            "qwen3_moe.modeling_qwen3_moe_train import "
                            "TrainingQwen3MoeForCausalLM as TrainingQwen3ForCausalLM")
    script = script.replace('"max_position_embeddings")',
                            '"max_position_embeddings", "num_experts", "moe_intermediate_size",'
                            ' "num_experts_per_tok", "moe_grouped_gemm")')
    run = subprocess.run([sys.executable, "-c", script, json.dumps(config), str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    line = next((x for x in run.stdout.splitlines() if x.startswith("NAMES")), None)
    assert line is not None, run.stderr[-2000:]
    assert computed == [(n, tuple(s)) for n, s in json.loads(line[len("NAMES"):])]


@needs_mindformers
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_moe_experts_equal_mindformers_experts_converter_given_stacked_experts(tmp_path, dtype):
    """ExpertsConvertOp takes the experts stacked ([E*F, H]); given the Hub's per-expert
    keys it would make wrong shapes (the issue), so the test stacks them for it."""
    from mindformers.models.qwen3_moe.utils import Qwen3MoePreTrainedModel

    src = tiny_qwen3_moe(tmp_path / "moe", dtype=dtype)
    out = tmp_path / "moe.ckpt"
    report = ms_port.convert(src, ms_model="mindformers:qwen3_moe", output=out)
    assert report.ok
    assert [m.target for m in report.plan.matches if m.how == "initialised"] == [
        f"decoder.layers.{i}.mlp.router.fi_accu" for i in range(2)]
    ours = {i.name: np.asarray(i.load()) for i in read_source(out)}
    hf = {i.name: np.asarray(i.load()) for i in read_source(src)}
    ops = [op for op in Qwen3MoePreTrainedModel.weight_converters
           if type(op).__name__ == "ExpertsConvertOp"]
    assert len(ops) == 2
    for shared in ops:
        op = copy.copy(shared)
        op.num_moe_experts, op.hidden_size, op.moe_ffn_hidden_size = 4, 64, 32
        op.expert_parallel_size = op.optimizer_parallel_size = 1
        for i in range(2):
            stacked = [np.concatenate([hf[n.format(i, e)] for e in range(4)])
                       for n in op.hf_names]
            (theirs,) = op._hf_to_mf(stacked)
            name = op.mf_names[0].format(i)
            assert ours[name].tobytes() == theirs.tobytes(), name
    for i in range(2):
        assert not ours[f"decoder.layers.{i}.mlp.router.fi_accu"].any()
        assert ours[f"decoder.layers.{i}.mlp.router.weight"].tobytes() == hf[
            f"model.layers.{i}.mlp.gate.weight"].tobytes()


def test_moe_expert_order_and_halves_are_the_layout_not_a_guess(tmp_path):
    """weight1 holds, per expert, [gate_eᵀ | up_eᵀ] (two contiguous halves) and the experts
    in order: checked against the formula, and against the wrong layouts it must not be."""
    src = tiny_qwen3_moe(tmp_path / "moe")
    out = tmp_path / "moe.ckpt"
    assert ms_port.convert(src, ms_model="mindformers:qwen3_moe", output=out).ok
    ours = {i.name: np.asarray(i.load()) for i in read_source(out)}
    hf = {i.name: np.asarray(i.load()) for i in read_source(src)}
    e = "model.layers.1.mlp.experts.{}.{}_proj.weight"
    right = np.concatenate([np.concatenate([hf[e.format(k, "gate")].T, hf[e.format(k, "up")].T],
                                           axis=1) for k in range(4)])
    w1 = ours["decoder.layers.1.mlp.experts.weight1"]
    assert np.array_equal(w1, right)
    interleaved = np.concatenate([np.stack([hf[e.format(k, "gate")].T, hf[e.format(k, "up")].T],
                                           axis=2).reshape(64, 64) for k in range(4)])
    reversed_order = np.concatenate([right[k * 64:(k + 1) * 64] for k in reversed(range(4))])
    assert not np.array_equal(w1, interleaved) and not np.array_equal(w1, reversed_order)
    down = np.concatenate([hf[e.format(k, "down")].T for k in range(4)])
    assert np.array_equal(ours["decoder.layers.1.mlp.experts.weight2"], down)


def test_moe_configs_mindformers_cannot_hold_are_one_line():
    from ms_port.archs.parallel_core.moe import target

    with pytest.raises(TargetError, match="mlp_only_layers"):
        target({**QWEN3_MOE, "model_type": "qwen3_moe", "mlp_only_layers": [0]})
    with pytest.raises(TargetError, match="num_local_experts"):
        target({**{k: v for k, v in QWEN3_MOE.items() if k != "num_experts"},
                "model_type": "qwen3_moe"})


FAMILY_MAKERS = [("mindformers:qwen3", "tiny_qwen3"), ("mindformers:qwen3_moe", "tiny_qwen3_moe")]


@needs_mindformers
@pytest.mark.parametrize("family,make", FAMILY_MAKERS)
def test_verify_runs_mindformers_network_with_cpu_standins(tmp_path, family, make):
    """MindFormers' own parallel_core network computes transformers' logits on this CPU
    (GRAPH mode, stand-ins named in the report); a wrong tensor FAILs, named."""
    from ms_port.testing import with_reversed

    src = globals()[make](tmp_path / "m")
    out = tmp_path / "m.ckpt"
    assert ms_port.convert(src, ms_model=family, output=out).ok
    report = ms_port.verify(src, out, ms_model=family)
    assert report.verdict == "PASS", report.message
    assert report.outputs[0].error < 1e-5 and report.tensors.counts["identical"] > 10
    ran = next(n for n in report.notes if "CPU stand-ins" in n)
    assert "rms-norm" in ran and "attention" in ran
    assert ("experts-grouped-matmul" in ran) == (family.endswith("moe"))
    name = "decoder.layers.1.self_attention.linear_proj.weight"
    wrong = with_reversed(out, tmp_path / "w.ckpt", name)
    failed = ms_port.verify(src, wrong, ms_model=family)
    assert failed.verdict == "FAIL" and name in " ".join(failed.reasons)
    assert not failed.outputs[0].ok  # the forward sees it too


@needs_mindformers
def test_the_forward_alone_fails_a_plainly_fused_qkv(tmp_path):
    """A table that fuses q/k/v plainly ([q; k; v]) agrees with itself tensor by tensor;
    MindFormers' network reads the grouped layout, so its logits FAIL."""
    src = tiny_qwen3(tmp_path / "m")
    table = tmp_path / "plain.yaml"
    table.write_text(
        "fuse:\n"
        "  - target: 'decoder.layers.{i}.self_attention.linear_qkv.weight'\n"
        "    sources: ['model.layers.{i}.self_attn.q_proj.weight',\n"
        "              'model.layers.{i}.self_attn.k_proj.weight',\n"
        "              'model.layers.{i}.self_attn.v_proj.weight']\n"
        "    layout: concat\n")
    out = tmp_path / "plain.ckpt"
    assert ms_port.convert(src, ms_model="mindformers:qwen3", mapping=[table], output=out).ok
    report = ms_port.verify(src, out, ms_model="mindformers:qwen3", mapping=[table])
    assert report.tensors.counts["identical"] == len(report.tensors.deltas)
    assert report.verdict == "FAIL" and report.outputs[0].error > 1e-2


@needs_mindformers
@pytest.mark.parametrize("family,make", FAMILY_MAKERS)
def test_verify_without_a_forward_is_inconclusive_never_pass(tmp_path, monkeypatch, family,
                                                             make):
    """Where MindFormers' network cannot run here, the verdict is the tensors' proof and
    INCONCLUSIVE for the forward, with the reason; a wrong tensor still FAILs, named."""
    from click.testing import CliRunner

    from ms_port.archs.parallel_core import cpu as parallel_core_cpu
    from ms_port.cli import main
    from ms_port.testing import with_reversed

    def no_kernel(*_a, **_k):
        raise RuntimeError("Unsupported op [SomeKernel] on CPU")

    monkeypatch.setattr(parallel_core_cpu, "build_network", no_kernel)
    src = globals()[make](tmp_path / "m")
    out = tmp_path / "m.ckpt"
    assert ms_port.convert(src, ms_model=family, output=out).ok
    run = CliRunner().invoke(main, ["verify", str(src), str(out), "--ms-model", family,
                                    "--json"])
    data = json.loads(run.output)
    assert run.exit_code == 3 and data["verdict"] == "INCONCLUSIVE"
    assert "no forward ran" in data["reasons"][0] and "SomeKernel" in data["reasons"][0]
    assert data["mode"] == "tensors"
    name = "decoder.layers.1.self_attention.linear_proj.weight"
    wrong = with_reversed(out, tmp_path / "w.ckpt", name)
    failed = ms_port.verify(src, wrong, ms_model=family)
    assert failed.verdict == "FAIL" and name in failed.reasons[0]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_moe_export_round_trip_writes_the_hubs_per_expert_keys(tmp_path, dtype):
    """export lists what transformers saves (one tensor per expert, not the stacked
    in-memory experts) and undoes the experts' transposes and reshapes: bit-exact."""
    src = tiny_qwen3_moe(tmp_path / "moe", dtype=dtype)
    out = tmp_path / "moe.ckpt"
    assert ms_port.convert(src, ms_model="mindformers:qwen3_moe", output=out).ok
    back = ms_port.export(out, ms_model="mindformers:qwen3_moe", config=src / "config.json",
                          output=tmp_path / "back")
    assert back.ok, back.plan.problems()
    original = {i.name: np.asarray(i.load()) for i in read_source(src)}
    again = {i.name: np.asarray(i.load()) for i in read_source(tmp_path / "back")}
    assert "model.layers.1.mlp.experts.3.up_proj.weight" in again
    assert set(again) == set(original)
    for name in original:
        assert again[name].tobytes() == original[name].tobytes(), name
    # each expert's tensors come from its own rows of the stacked ones, read alone
    parts = {m.target: m for m in back.plan.matches}
    hidden, inner = QWEN3_MOE["hidden_size"], QWEN3_MOE["moe_intermediate_size"]
    assert parts["model.layers.1.mlp.experts.3.up_proj.weight"].rows == (3 * hidden,
                                                                         4 * hidden)
    assert parts["model.layers.1.mlp.experts.3.down_proj.weight"].rows == (3 * inner,
                                                                           4 * inner)


def test_moe_state_dict_with_transformers_5_fused_experts_converts_the_same(tmp_path,
                                                                           monkeypatch):
    """A state dict saved from transformers 5's model holds the experts as it does in
    memory (``experts.gate_up_proj [E, 2F, H]``, ``experts.down_proj [E, H, F]``): it
    converts to the same bytes as the Hub's per-expert keys, and exports back to those.
    The stacks are transformed an expert at a time (as any stack from 64 MiB is: here
    every size), written and read back from one expert's rows."""
    from ms_port.match import many

    monkeypatch.setattr(many, "ROWS_FROM_BYTES", 0)
    monkeypatch.setattr(many, "ROW_GROUP_BYTES", 1)  # a group per expert, however small

    src = tiny_qwen3_moe(tmp_path / "hub")
    fused = state_dict_folder(src, tmp_path / "fused")
    family = "mindformers:qwen3_moe"
    assert ms_port.convert(src, ms_model=family, output=tmp_path / "hub.ckpt").ok
    report = ms_port.convert(fused, ms_model=family, output=tmp_path / "fused.ckpt")
    assert report.ok, report.plan.problems()
    stacks = [m for m in report.plan.matches if m.source.endswith(("experts.gate_up_proj",
                                                                    "experts.down_proj"))]
    assert stacks and all(m.groups == m.source_shape[0] == 4 for m in stacks), stacks
    hub = {i.name: np.asarray(i.load()) for i in read_source(tmp_path / "hub.ckpt")}
    ours = {i.name: np.asarray(i.load()) for i in read_source(tmp_path / "fused.ckpt")}
    assert set(ours) == set(hub)
    for name in hub:
        assert ours[name].tobytes() == hub[name].tobytes(), name
    back = ms_port.export(tmp_path / "fused.ckpt", ms_model=family,
                          config=fused / "config.json", output=tmp_path / "back")
    assert back.ok
    again = {i.name: np.asarray(i.load()) for i in read_source(tmp_path / "back")}
    original = {i.name: np.asarray(i.load()) for i in read_source(src)}
    assert set(again) == set(original)
    assert all(again[n].tobytes() == original[n].tobytes() for n in original)


def test_stacked_experts_are_made_into_buffers_used_again(tmp_path, monkeypatch):
    """The writer makes each expert's transposed rows into a few buffers it fills again
    (write/recycle.py), fewer than the groups it makes, and the file is the same bytes
    and read back against the groups' digests: a buffer filled while the writer still
    held it would show as a group that differs."""
    from ms_port.match import many
    from ms_port.write import writers
    from ms_port.write.recycle import Recycled

    monkeypatch.setattr(many, "ROWS_FROM_BYTES", 0)
    monkeypatch.setattr(many, "ROW_GROUP_BYTES", 1)
    pools: list[Recycled] = []
    asked = []

    class Counted(Recycled):
        def __init__(self) -> None:
            super().__init__()
            pools.append(self)

        def empty(self, shape, dtype):
            asked.append(shape)
            return super().empty(shape, dtype)

    monkeypatch.setattr(writers, "Recycled", Counted)
    src = tiny_qwen3_moe(tmp_path / "hub", dtype="bfloat16")
    fused = state_dict_folder(src, tmp_path / "fused")
    family = "mindformers:qwen3_moe"
    assert ms_port.convert(src, ms_model=family, output=tmp_path / "hub.ckpt").ok
    asked.clear()
    pools.clear()
    assert ms_port.convert(fused, ms_model=family, output=tmp_path / "fused.ckpt").ok
    groups = 2 * 2 * QWEN3_MOE["num_experts"]  # two stacks a layer, an expert a group
    assert len(asked) == groups, asked
    assert sum(p.made for p in pools) < groups
    hub = {i.name: np.asarray(i.load()) for i in read_source(tmp_path / "hub.ckpt")}
    ours = {i.name: np.asarray(i.load()) for i in read_source(tmp_path / "fused.ckpt")}
    assert set(ours) == set(hub)
    assert all(ours[n].tobytes() == hub[n].tobytes() for n in hub)


def test_stacked_experts_are_written_one_expert_at_a_time_only_where_that_is_exact():
    """The experts' transforms are computed per expert (the writer and the read-back hold
    one expert, not the whole stacked tensor) only where numbering every element of two
    experts shows the per-expert result, expert after expert, is the whole one."""
    from ms_port.match.many import separable
    from ms_port.match.transforms import Transform

    gate_up = ((6, 4), (6, 4), (6, 4), (6, 4))  # two experts: gate_e, up_e of [F=6, H=4]
    stacked = (Transform("reshape", [2, 12, 4]), Transform("transpose", [0, 2, 1]),
               Transform("reshape", [-1, 12]))
    one = (Transform("reshape", [1, 12, 4]), Transform("transpose", [0, 2, 1]),
           Transform("reshape", [-1, 12]))
    assert separable(0, gate_up, 2, stacked, one)
    # a transpose of the whole stack puts both experts in every row: not per expert
    mixed = (Transform("transpose", [1, 0]),)
    assert not separable(0, gate_up, 2, mixed, mixed)
    # per-expert transforms that fit the shapes but put the rows elsewhere
    assert not separable(0, gate_up, 2, stacked, (Transform("reshape", [-1, 12]),))
    down = ((4, 6), (4, 6))  # down_e [H, F], joined on axis 1, transposed: down_eᵀ stacked
    assert separable(1, down, 1, (Transform("transpose", [1, 0]),),
                      (Transform("transpose", [1, 0]),))


def test_moe_plan_groups_the_experts_and_their_groups_are_the_whole(tmp_path):
    src = tiny_qwen3_moe(tmp_path / "moe")
    plan = ms_port.plan(src, ms_model="mindformers:qwen3_moe")
    grouped = [m for m in plan.matches if m.groups]
    assert sorted(m.target for m in grouped) == sorted(
        f"decoder.layers.{i}.mlp.experts.weight{w}" for i in range(2) for w in (1, 2))
    for m in grouped:
        assert m.groups == 4
        whole = plan.expected(m)
        assert np.array_equal(np.concatenate(list(plan.grouped(m))), whole), m.target


@needs_mindformers
@pytest.mark.parametrize("mode", ["whole", "layers"])
def test_a_declared_accumulator_left_out_is_taken_as_declared(tmp_path, mode):
    """MindFormers' own converters leave the MoE router's zero accumulator (fi_accu) out;
    its loader initialises it, and the table declares it as zeros: verify takes it as
    declared, says so, and runs. A tensor the table does not declare is still refused."""
    from ms_port.testing import rewrite_checkpoint

    src = tiny_qwen3_moe(tmp_path / "m")
    out = tmp_path / "m.ckpt"
    assert ms_port.convert(src, ms_model="mindformers:qwen3_moe", output=out).ok

    def without_accumulators(arrays):
        for name in [n for n in arrays if n.endswith("router.fi_accu")]:
            del arrays[name]

    lean = rewrite_checkpoint(out, tmp_path / "lean.ckpt", without_accumulators)
    report = ms_port.verify(src, lean, ms_model="mindformers:qwen3_moe", mode=mode)
    assert report.verdict == "PASS", report.message
    note = next(n for n in report.notes if "taken as declared" in n)
    assert note.startswith("2 tensors the target declares are not in ")
    assert "decoder.layers.0.mlp.router.fi_accu (zeros)" in note

    def without_a_weight(arrays):
        del arrays["decoder.layers.0.input_layernorm.weight"]

    holed = rewrite_checkpoint(out, tmp_path / "holed.ckpt", without_a_weight)
    failed = ms_port.verify(src, holed, ms_model="mindformers:qwen3_moe", mode=mode)
    assert failed.verdict == "FAIL" and "decoder.layers.0.input_layernorm.weight" in \
        failed.message


def test_strategy_output_is_safetensors_per_rank_as_its_training_loads(tmp_path):
    """MindFormers' parallel_core networks train from safetensors: convert --strategy writes
    each rank's slices as MindSpore safetensors, which MindSpore's own loader and its merge
    of the rank files read back to the whole conversion."""
    import mindspore as ms

    from ms_port.read.sources import read_source

    hf = tiny_qwen3(tmp_path / "qwen3")
    whole = tmp_path / "whole.ckpt"
    assert ms_port.convert(hf, ms_model="mindformers:qwen3", output=whole).ok
    tensors = read_source(whole, strip_prefixes=False)
    split = [n for n, t in tensors.tensors.items() if len(t.shape) == 2][:3]
    (tmp_path / "strategy").mkdir()
    layout = {"dev_matrix": [2], "tensor_map": [0, -1], "field": 0,
              "opt_weight_shard_step": 0, "opt_weight_shard_size": 0}
    (tmp_path / "strategy" / "strategy.json").write_text(json.dumps(
        {"parallel_layout_item": {n: layout for n in split}}))
    ranks = tmp_path / "ranks"
    report = ms_port.convert(hf, ms_model="mindformers:qwen3", output=ranks,
                             strategy=tmp_path / "strategy")
    assert report.written.kind == "safetensors"
    assert report.written.format == "2 rank files, safetensors, with the strategy"
    files = sorted(ranks.glob("rank_*/*"))
    assert [f.name for f in files] == ["checkpoint_rank_0.safetensors",
                                       "checkpoint_rank_1.safetensors"]
    own = ms.load_checkpoint(str(files[1]), format="safetensors")  # MindSpore's loader
    row = tensors[split[0]].load()
    assert np.array_equal(own[split[0]].asnumpy(), row[row.shape[0] // 2:])
    back = read_source(ranks)
    assert set(back.tensors) == set(tensors.tensors)
    for info in tensors:
        assert np.array_equal(back[info.name].load(), info.load()), info.name
    ms.transform_checkpoints(str(ranks), str(tmp_path / "merged"), "m",
                             str(ranks / "strategy" / "strategy.json"), None)
    merged = read_source(next((tmp_path / "merged" / "rank_0").iterdir()),
                         strip_prefixes=False)
    assert all(np.array_equal(merged[n].load(), tensors[n].load()) for n in tensors.tensors)
