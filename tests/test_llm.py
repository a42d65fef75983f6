"""Hugging Face LLaMA / Mistral / Qwen2 -> MindFormers LlamaForCausalLM, with no mapping file.

Seeded tiny models (GQA, norms and biases off their defaults), float32 and bf16, tied and
untied, single file and sharded. Every converted tensor must equal what MindFormers' own
``LlamaForCausalLM.convert_weight_dict`` produces, the computed target must equal the real
network's parameters, and verify must PASS the right conversion and FAIL each classic
wrong one. Skipped where transformers / mindformers (the test extra) are absent.
"""

from __future__ import annotations

import importlib.util
import json
import multiprocessing
import os
import shutil

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")

import ms_port  # noqa: E402
from ms_port.archs.llama.family import llama_target  # noqa: E402
from ms_port.errors import MappingError, TargetError  # noqa: E402
from ms_port.read.sources import read_source  # noqa: E402
from ms_port.testing import rewrite_checkpoint, tiny_hf_lm  # noqa: E402

needs_mindformers = pytest.mark.skipif(importlib.util.find_spec("mindformers") is None,
                                       reason="mindformers not installed (test extra)")

#: (model_type, tied, dtype, shard size)
VARIANTS = {
    "llama-f32": ("llama", False, "float32", None),
    "llama-tied-bf16-sharded": ("llama", True, "bfloat16", "40KB"),
    "mistral-bf16": ("mistral", False, "bfloat16", None),
    "qwen2-tied-f32-sharded": ("qwen2", True, "float32", "40KB"),
    "qwen2-bf16": ("qwen2", False, "bfloat16", None),
    "llama-f16": ("llama", False, "float16", None),
    "mistral-tied-f32": ("mistral", True, "float32", None),
    "llama-bf16-sharded": ("llama", False, "bfloat16", "40KB"),
}


@pytest.fixture
def cli():
    from click.testing import CliRunner

    from ms_port.cli import main

    return lambda args: CliRunner().invoke(main, args, env={"COLUMNS": "250"})


def _one_error(result) -> str:
    """The CLI's refusal: exit 2, one line saying what failed, and the --debug hint."""
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 2 and lines[0].startswith("error: "), result.output
    assert lines[1] == "(run with --debug for the traceback)"
    return lines[0]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    made = {}

    def get(name: str):
        if name not in made:
            kind, tied, dtype, shard = VARIANTS[name]
            made[name] = tiny_hf_lm(kind, root / name, tied=tied, dtype=dtype, shard=shard)
        return made[name]

    return get


def _convert(models, tmp_path, name, qkv, **kw):
    out = tmp_path / f"{name}-{qkv}.ckpt"
    report = ms_port.convert(models(name), ms_model="mindformers:llama",
                             ms_options={"qkv_concat": qkv}, output=out, **kw)
    assert report.ok, report.plan.problems()[:5]
    return out, report.plan


@pytest.mark.parametrize("qkv", [False, True], ids=["separate", "fused"])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_convert_without_mapping_chooses_the_table(models, tmp_path, name, qkv):
    out, plan = _convert(models, tmp_path, name, qkv)
    kind, tied, dtype, shard = VARIANTS[name]
    source = read_source(models(name))
    assert source.format == ("safetensors-sharded" if shard else "safetensors")
    assert plan.mapping.origin == "mappings/hf_llama_mindformers.yaml"
    assert plan.params["kv_heads"][0] == {"llama": 2, "mistral": 4, "qwen2": 2}[kind]
    assert ("lm_head.weight" in plan.target) is (not tied)
    written = read_source(out)
    assert {i.dtype for i in written} == {dtype}  # bf16 kept bit for bit
    fused = [m for m in plan.matches if m.parts]
    assert len(fused) == (2 * (3 if kind == "qwen2" else 2) if qkv else 0)


@needs_mindformers
@pytest.mark.parametrize("qkv", [False, True], ids=["separate", "fused"])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_every_tensor_equals_mindformers_converter(models, tmp_path, name, qkv):
    from ms_port.archs.llama.family import contained, llama_config

    out, _ = _convert(models, tmp_path, name, qkv)
    source = read_source(models(name))
    hf = {i.name: np.asarray(i.load()) for i in source}
    with contained():
        from mindformers.models.llama import LlamaForCausalLM
    cfg = llama_config(source.config, qkv_concat=qkv)
    with multiprocessing.Manager() as manager:
        theirs = LlamaForCausalLM.convert_weight_dict(
            hf, model_config=cfg, qkv_dict=manager.dict(), condition=multiprocessing.Condition())
    ours = read_source(out)
    assert sorted(ours.tensors) == sorted(theirs)
    for name_, info in ours.tensors.items():
        mine, ref = info.load(), np.asarray(theirs[name_])
        assert mine.dtype == ref.dtype and mine.shape == ref.shape, name_
        assert mine.tobytes() == ref.tobytes(), name_


@needs_mindformers
@pytest.mark.parametrize("qkv", [False, True], ids=["separate", "fused"])
@pytest.mark.parametrize("kind,tied", [("llama", False), ("qwen2", True), ("mistral", True)])
def test_computed_target_equals_the_real_network(kind, tied, qkv):
    from ms_port.archs.llama.family import build_llama
    from ms_port.read.targets import from_cell

    config = {"model_type": kind, "vocab_size": 128, "hidden_size": 64,
              "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 8,
              "num_key_value_heads": 2, "tie_word_embeddings": tied}
    computed = llama_target(config, qkv_concat=qkv)
    real = from_cell(build_llama(config, qkv_concat=qkv, seq_length=8))
    assert [(t.name, t.shape) for t in computed.tensors.values()] == \
        [(t.name, t.shape) for t in real.tensors.values()]
    assert [t.layer for t in computed.tensors.values()] == \
        [t.layer for t in real.tensors.values()]


@needs_mindformers
@pytest.mark.parametrize("name,qkv", [("llama-f32", True), ("qwen2-bf16", True),
                                      ("llama-f16", True),
                                      ("qwen2-tied-f32-sharded", False),
                                      ("mistral-bf16", False), ("mistral-tied-f32", True),
                                      ("llama-tied-bf16-sharded", True)])
def test_verify_passes_on_token_inputs(models, tmp_path, name, qkv):
    out, _ = _convert(models, tmp_path, name, qkv)
    report = ms_port.verify(models(name), out, ms_model="mindformers:llama",
                            ms_options={"qkv_concat": qkv})
    assert report.verdict == "PASS", report.message
    assert report.outputs[0].name == "logits"  # found in HF's CausalLMOutputWithPast
    assert report.layers_checked >= 10
    assert report.inputs[0]["dtype"] == "int64"


def _rope_permuted(w, heads):  # the classic Meta <-> HF q/k row permutation
    rows, cols = w.shape
    return w.reshape(heads, 2, rows // heads // 2, cols).transpose(0, 2, 1, 3).reshape(rows, cols)


def _plain_fused(parts_of, suffix):
    """Undo MindFormers' per-KV-group layout into a plain [q; k; v] concatenation, in the
    tensors whose names end with ``suffix`` alone (the weight, or the bias as MindFormers'
    ``convert_weight.py`` fuses it while its weight is right)."""
    def edit(tensors):
        for name in [n for n in tensors if n.endswith(suffix)]:
            w = tensors[name]
            q, k, v = parts_of(w)
            tensors[name] = np.concatenate([q, k, v])
        return tensors
    return edit


def _groups(w, kv=2, q_rows=32, d=8):
    blocks = w.reshape(kv, q_rows + 2 * d, *w.shape[1:])
    return (blocks[:, :q_rows].reshape(-1, *w.shape[1:]),
            blocks[:, q_rows:q_rows + d].reshape(-1, *w.shape[1:]),
            blocks[:, q_rows + d:].reshape(-1, *w.shape[1:]))


def _swap_gate_up(tensors):
    for name in [n for n in tensors if n.endswith("w_gate_hidden.weight")]:
        w = tensors[name]
        tensors[name] = w.reshape(-1, 2, w.shape[1])[:, ::-1].reshape(w.shape).copy()
    return tensors


def _swap_kv_bias(tensors):
    for name in [n for n in tensors if n.endswith("attention.wk.bias")]:
        other = name.replace("wk.bias", "wv.bias")
        tensors[name], tensors[other] = tensors[other], tensors[name]
    return tensors


def _rope_wk(tensors):
    for name in [n for n in tensors if n.endswith("attention.wk.weight")]:
        tensors[name] = _rope_permuted(tensors[name], 2)
    return tensors


WRONG = {  # case: (model, fused, edit, the tensor it must name)
    "rope-permuted-wk": ("llama-f32", False, _rope_wk, "model.layers.0.attention.wk.weight"),
    "plain-qkv-fusion": ("llama-f32", True, _plain_fused(_groups, "w_qkv.weight"),
                         "model.layers.0.attention.w_qkv.weight"),
    "gate-up-swapped": ("llama-f32", True, _swap_gate_up,
                        "model.layers.0.feed_forward.w_gate_hidden.weight"),
    "kv-biases-swapped": ("qwen2-bf16", False, _swap_kv_bias, "model.layers.0.attention.wk.bias"),
    "plain-fused-bias": ("qwen2-bf16", True, _plain_fused(_groups, "w_qkv.bias"),
                         "model.layers.0.attention.w_qkv.bias"),
}


@needs_mindformers
@pytest.mark.parametrize("case", list(WRONG))
def test_wrong_conversions_fail_naming_layer_and_tensor(models, tmp_path, case):
    name, qkv, edit, tensor = WRONG[case]
    out, _ = _convert(models, tmp_path, name, qkv)
    wrong = rewrite_checkpoint(out, tmp_path / "wrong.ckpt", edit)
    report = ms_port.verify(models(name), wrong, ms_model="mindformers:llama",
                            ms_options={"qkv_concat": qkv})
    assert report.verdict == "FAIL"
    differing = {d.target for d in report.tensors.deltas if d.status == "differs"}
    assert tensor in differing
    # exactly the tensors the edit changed are blamed (the bias alone, not its weight)
    right, edited = read_source(out).tensors, read_source(wrong).tensors
    assert differing == {n for n in right
                         if right[n].load().tobytes() != edited[n].load().tobytes()}
    assert report.first_divergence is not None  # the forward names the first layer
    assert report.first_divergence.ms_name.startswith("model.layers.0")


@needs_mindformers
@pytest.mark.parametrize("case,layer", [("gate-up-swapped", "feed_forward"),
                                        ("plain-fused-bias", "attention")])
def test_wrong_conversion_fails_in_the_forward_alone(models, tmp_path, case, layer):
    """The same edit judged by the layers alone (the tensor check knows the plan, so a
    mapping table with the mistake built in would pass it): the layer is still named."""
    from ms_port.archs.llama.family import build_llama
    from ms_port.check.language import torch_from_config
    from ms_port.check.networks import load_ms_weights, load_torch_weights
    from ms_port.check.pairing import correspondence_from_pairs
    from ms_port.check.parity import run_parity

    name, qkv, edit, _ = WRONG[case]
    out, plan = _convert(models, tmp_path, name, qkv)
    wrong = rewrite_checkpoint(out, tmp_path / "wrong.ckpt", edit)
    source = read_source(models(name))
    tnet = torch_from_config(source.config, "config.json")
    load_torch_weights(tnet, source)
    mnet = build_llama(source.config, qkv_concat=qkv, seq_length=16)
    load_ms_weights(mnet, wrong)
    ids = np.random.default_rng(0).integers(0, 128, (1, 16))
    pairs = correspondence_from_pairs((m.target, m.source) for m in plan.matches
                                      if not m.parts)
    report = run_parity(tnet, mnet, inputs=[ids], tol=1e-5, correspondence=pairs)
    assert report.verdict == "FAIL"
    assert report.first_divergence.ms_name.startswith("model.layers.0")
    assert layer in report.first_divergence.ms_name
    load_ms_weights(mnet, out)  # the right checkpoint, the same forward: PASS
    assert run_parity(tnet, mnet, inputs=[ids], tol=1e-5,
                      correspondence=pairs).verdict == "PASS"


def test_tied_head_in_a_bin_is_dropped_as_tied(tmp_path):
    import torch

    src = tiny_hf_lm("qwen2", tmp_path / "m", tied=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(src)
    state = model.state_dict()
    assert "lm_head.weight" in state  # torch.save keeps both names of a tied weight
    torch.save(state, tmp_path / "m" / "pytorch_model.bin")
    (tmp_path / "m" / "model.safetensors").unlink()
    plan = ms_port.plan(tmp_path / "m", ms_model="mindformers:llama")
    assert plan.ok, plan.problems()
    assert any(d.name == "lm_head.weight" and "tied" in d.reason for d in plan.dropped)


def test_tied_head_is_reported_as_tied_in_text_and_json(models, tmp_path, cli):
    """What the user reads: the head is neither missing nor unused, but tied, and says by
    which table entry and config key."""
    args = ["convert", str(models("mistral-tied-f32")), "--ms-model", "mindformers:llama",
            "-o"]
    result = cli([*args, str(tmp_path / "a.ckpt")])
    assert result.exit_code == 0, result.output
    assert "lm_head.weight is model.embed_tokens.weight: tied (tie_word_embeddings" in \
        result.output
    data = json.loads(cli([*args, str(tmp_path / "b.ckpt"), "--json"]).output)
    assert data["ok"] and data["missing"] == [] and data["unused"] == []
    assert any("lm_head.weight" in n and "tied" in n for n in data["notes"])
    assert "lm_head.weight" not in read_source(tmp_path / "b.ckpt").tensors


def test_untied_target_of_a_tied_model_fills_the_head_from_the_embedding(tmp_path):
    src = tiny_hf_lm("llama", tmp_path / "m", tied=True)
    config = json.loads((src / "config.json").read_text())
    from ms_port.resolve import resolve_target

    untied = resolve_target(ms_model="mindformers:llama",
                            config={**config, "tie_word_embeddings": False})
    plan = ms_port.plan(src, target=untied, mapping="hf_llama_mindformers")
    assert plan.ok, plan.problems()
    head = next(m for m in plan.matches if m.target == "lm_head.weight")
    assert head.how == "tied" and head.source == "model.embed_tokens.weight"


def test_config_that_does_not_fit_the_tensors_is_one_line_exit_2(tmp_path, cli):
    src = tiny_hf_lm("llama", tmp_path / "m")
    config = json.loads((src / "config.json").read_text())
    config["num_key_value_heads"] = 4  # the tensors were made with 2
    (src / "config.json").write_text(json.dumps(config))
    with pytest.raises((MappingError, TargetError)):
        ms_port.plan(src, ms_model="mindformers:llama", ms_options={"qkv_concat": True})
    line = _one_error(cli(["convert", str(src), "--ms-model", "mindformers:llama",
                           "--ms-option", "qkv_concat=true", "-o", str(tmp_path / "o.ckpt")]))
    assert "num_key_value_heads" in line or "kv_heads" in line
    assert not (tmp_path / "o.ckpt").exists()
    line = _one_error(cli(["convert", str(src), "--ms-model", "mindformers:llama",  # separate
                           "-o", str(tmp_path / "o.ckpt")]))
    assert "does not fit the checkpoint" in line


def test_family_without_config_says_where_to_put_it(tmp_path, cli):
    src = tiny_hf_lm("llama", tmp_path / "m")
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(src / "model.safetensors", alone / "model.safetensors")
    result = cli(["convert", str(alone / "model.safetensors"), "--ms-model",
                  "mindformers:llama", "-o", str(tmp_path / "o.ckpt")])
    assert result.exit_code == 2 and "config.json" in result.output
    result = cli(["convert", str(alone / "model.safetensors"), "--ms-model",
                  "mindformers:llama", "--config", str(src / "config.json"),
                  "-o", str(tmp_path / "o.ckpt")])
    assert result.exit_code == 0, result.output


def test_unknown_family_option_is_refused(tmp_path, cli):
    src = tiny_hf_lm("llama", tmp_path / "m")
    result = cli(["convert", str(src), "--ms-model", "mindformers:llama", "--ms-option",
                  "qkv=true", "-o", str(tmp_path / "o.ckpt")])
    assert result.exit_code == 2 and "qkv_concat" in result.output


@pytest.mark.parametrize("name,qkv,shard", [
    ("llama-tied-bf16-sharded", True, None), ("qwen2-bf16", True, "60KB"),
    ("mistral-bf16", False, None), ("qwen2-tied-f32-sharded", False, "60KB")])
def test_export_round_trip_is_bit_identical_and_loads_in_transformers(models, tmp_path, name,
                                                                      qkv, shard):
    out, _ = _convert(models, tmp_path, name, qkv)
    back = tmp_path / "back"
    report = ms_port.export(out, ms_model="mindformers:llama",
                            config=models(name) / "config.json", output=back,
                            max_shard_size=shard)
    assert report.ok, report.plan.problems()[:5]
    files = sorted(p.name for p in back.iterdir())
    assert "config.json" in files
    assert ("model.safetensors.index.json" in files) is (shard is not None)
    original, again = read_source(models(name)), read_source(back)
    assert sorted(original.tensors) == sorted(again.tensors)  # a tied head stays tied
    for key, info in original.tensors.items():
        mine = again.tensors[key]
        assert (mine.dtype, mine.shape) == (info.dtype, info.shape), key
        assert mine.load().tobytes() == info.load().tobytes(), key
    _, loading = transformers.AutoModelForCausalLM.from_pretrained(
        back, output_loading_info=True)
    assert not loading["missing_keys"] and not loading["unexpected_keys"]
    assert not loading["mismatched_keys"]


def test_export_refuses_a_non_empty_directory_without_force(models, tmp_path):
    out, _ = _convert(models, tmp_path, "llama-f32", True)
    back = tmp_path / "back"
    back.mkdir()
    (back / "notes.txt").write_text("mine")
    with pytest.raises(ms_port.errors.OutputExistsError):
        ms_port.export(out, ms_model="mindformers:llama",
                       config=models("llama-f32") / "config.json", output=back)
    assert (back / "notes.txt").read_text() == "mine"


@needs_mindformers
def test_sharded_output_loads_in_mindspore(models, tmp_path):
    import mindspore as ms
    from mindspore.parallel import load_distributed_checkpoint

    from ms_port.archs.llama.family import build_llama

    shards = tmp_path / "shards"
    report = ms_port.convert(models("qwen2-bf16"), ms_model="mindformers:llama",
                             ms_options={"qkv_concat": True}, output=shards,
                             max_shard_size="60KB")
    assert report.ok and len(report.written.shards) > 2
    index = json.loads((shards / "param_name_map.json").read_text())["weight_map"]
    assert set(index) == {m.target for m in report.plan.matches}
    source = read_source(models("qwen2-bf16"))
    net = build_llama(source.config, qkv_concat=True, seq_length=8)
    loaded = load_distributed_checkpoint(net, format="safetensors",
                                         unified_safetensors_dir=str(shards),
                                         return_param_dict=True)
    assert set(loaded) == set(index)
    for m in report.plan.matches:  # MindSpore reads back what the plan says, bit for bit
        want = report.plan.expected(m)
        got = loaded[m.target]
        got = got.float().asnumpy() if got.dtype == ms.bfloat16 else got.asnumpy()
        assert np.array_equal(got, want.astype(np.float32)), m.target
    assert read_source(shards).format == "safetensors-sharded"  # ms-port reads it too


@needs_mindformers
@pytest.mark.parametrize("qkv", [False, True], ids=["separate", "fused"])
def test_sharded_output_loads_through_mindformers_own_loader(models, tmp_path, qkv):
    """MindFormers 2.1.0's single-device load of a safetensors directory (what its
    load_checkpoint_with_safetensors runs without parallelism: every *.safetensors read with
    ms.load_checkpoint, HF names converted only where it sees them, load_param_into_net)
    fills every parameter of the network with what the plan says, bit for bit."""
    import glob

    from ms_port.archs.llama.family import build_llama, contained

    with contained():
        from mindformers.tools.register import MindFormerConfig
        from mindformers.utils.load_checkpoint_utils import (
            _get_checkpoint_mode,
            load_safetensors_checkpoint,
        )
    shards = tmp_path / "shards"
    report = ms_port.convert(models("qwen2-bf16"), ms_model="mindformers:llama",
                             ms_options={"qkv_concat": qkv}, output=shards,
                             max_shard_size="60KB")
    assert report.ok and len(report.written.shards) > 2
    config = MindFormerConfig(use_parallel=False, auto_trans_ckpt=False,
                              load_ckpt_format="safetensors", remove_redundancy=False,
                              resume_training=False, checkpoint={"load_path": str(shards)},
                              model={"model_config": {"qkv_concat": qkv}})
    assert _get_checkpoint_mode(config) == "multi_checkpoint_file"
    net = build_llama(read_source(models("qwen2-bf16")).config, qkv_concat=qkv, seq_length=8)
    params = dict(net.parameters_and_names())
    wanted = {m.target: report.plan.expected(m).astype(np.float32)
              for m in report.plan.matches}
    assert set(wanted) == set(params)
    assert not all(np.array_equal(params[n].asnumpy(), w) for n, w in wanted.items())
    with contained():
        load_safetensors_checkpoint(config, sorted(glob.glob(str(shards / "*.safetensors"))),
                                    net, None, str(shards), None)
    for name, want in wanted.items():
        assert np.array_equal(params[name].asnumpy(), want), name


def test_output_directory_holding_the_source_is_refused(models, tmp_path):
    src = tmp_path / "m"
    shutil.copytree(models("llama-f32"), src)
    with pytest.raises(ms_port.errors.WriteError, match="holds an input"):
        ms_port.convert(src, ms_model="mindformers:llama", output=src, max_shard_size="60KB",
                        force=True)


@needs_mindformers
def test_mindformers_is_contained_json_parses_and_nothing_lands_in_cwd(models, tmp_path):
    import subprocess
    import sys

    out, _ = _convert(models, tmp_path, "llama-f32", False)
    work, temp = tmp_path / "cwd", tmp_path / "tmp"
    work.mkdir()
    temp.mkdir()
    run = subprocess.run([sys.executable, "-m", "ms_port.cli", "verify",
                          str(models("llama-f32")), str(out), "--ms-model",
                          "mindformers:llama", "--json"],
                         cwd=work, capture_output=True, text=True, timeout=300,
                         env={**{k: v for k, v in os.environ.items()
                                 if k != "LOCAL_DEFAULT_PATH"},  # the suite's own (conftest)
                              "TMPDIR": str(temp)})
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout)["verdict"] == "PASS"
    assert list(work.iterdir()) == []  # no ./output/log
    # its log folder was temporary: removed at exit, the interpreter's teardown skipped
    assert not list(temp.glob("ms-port-mindformers-*"))
    assert " - INFO - " not in run.stderr


def _gpt2(tmp_path):
    import torch
    from gpt2_ms import SIZES

    config = transformers.GPT2Config(
        vocab_size=SIZES["vocab"], n_positions=SIZES["positions"], n_embd=SIZES["hidden"],
        n_head=SIZES["heads"], n_layer=SIZES["layers"], activation_function="gelu_new")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                param.copy_(1 + 0.2 * torch.randn(param.shape, generator=gen))
            elif name.endswith(".bias"):
                param.copy_(0.1 * torch.randn(param.shape, generator=gen))
    model.save_pretrained(tmp_path / "gpt2")
    return tmp_path / "gpt2"


def test_gpt2_c_attn_splits_into_separate_qkv_and_verifies(tmp_path):
    from gpt2_ms import MAPPING, build

    from ms_port.match.mapping import parse_mapping

    src = _gpt2(tmp_path)
    table = parse_mapping(MAPPING, origin="gpt2.yaml")
    report = ms_port.convert(src, ms_model=build, mapping=table, output=tmp_path / "g.ckpt")
    assert report.ok, report.plan.problems()[:5]
    split = [m for m in report.plan.matches if m.part is not None]
    assert len(split) == 2 * 3 * 2  # weight and bias, q/k/v, 2 layers
    q = next(m for m in split if m.target == "h.0.attn.q.weight")
    c_attn = read_source(src)["transformer.h.0.attn.c_attn.weight"].load()
    assert np.array_equal(report.plan.expected(q), c_attn[:, :48].T)
    parity = ms_port.verify(src, tmp_path / "g.ckpt", ms_model=build, mapping=table)
    assert parity.verdict == "PASS", parity.message

    def swap_qk(tensors):  # the classic slip: q and k taken from the wrong thirds
        tensors["h.0.attn.q.weight"], tensors["h.0.attn.k.weight"] = (
            tensors["h.0.attn.k.weight"], tensors["h.0.attn.q.weight"])
        return tensors

    wrong = rewrite_checkpoint(tmp_path / "g.ckpt", tmp_path / "w.ckpt", swap_qk)
    parity = ms_port.verify(src, wrong, ms_model=build, mapping=table)
    assert parity.verdict == "FAIL"
    assert parity.first_divergence.ms_name.startswith("h.0.attn")


def test_saved_map_states_fused_entries_and_reproduces_the_plan(models, tmp_path):
    """--save-map writes each fused target as a fuse: entry (never as a one-source line),
    and that file alone, against a template of the output, fills every target again."""
    import yaml

    out, plan = _convert(models, tmp_path, "qwen2-bf16", True)
    saved = yaml.safe_load(plan.to_yaml())
    assert not any("w_qkv" in t or "w_gate_hidden" in t for t in saved["tensors"])
    fused = {e["target"]: e for e in saved["fuse"]}
    qkv = fused["model.layers.0.attention.w_qkv.bias"]
    assert qkv["layout"] == {"grouped": 2, "sizes": [32, 8, 8], "axis": 0}
    (tmp_path / "saved.yaml").write_text(plan.to_yaml())
    again = ms_port.plan(models("qwen2-bf16"), target=out, mapping=tmp_path / "saved.yaml")
    assert again.ok, again.problems()[:3]
    for m in again.matches:
        assert again.expected(m).tobytes() == plan.expected(
            next(x for x in plan.matches if x.target == m.target)).tobytes()


def test_json_report_names_the_table_and_config_values(models, tmp_path, cli):
    result = cli(["convert", str(models("mistral-bf16")), "--ms-model", "mindformers:llama",
                  "--ms-option", "qkv_concat=true", "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["mapping"] == "mappings/hf_llama_mindformers.yaml"
    assert data["params"]["kv_heads"] == {"value": 4, "from": "num_key_value_heads"}
    assert data["config"].endswith("config.json")


@needs_mindformers  # where it is absent, it could not be imported anyway: nothing shown
def test_convert_to_a_family_never_imports_mindformers(models, tmp_path):
    """The target's names come from the config: MindFormers (5-11 s, 1.2 GB) stays out."""
    import subprocess
    import sys

    code = ("import sys, ms_port\n"
            f"r = ms_port.convert({str(models('llama-f32'))!r}, ms_model='mindformers:llama', "
            f"ms_options={{'qkv_concat': True}}, output={str(tmp_path / 'o.ckpt')!r})\n"
            "assert r.ok\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'mindformers'))\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "[]"


def test_inspect_a_model_directory_shows_its_config(models, cli):
    result = cli(["inspect", str(models("qwen2-bf16")), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["config"]["model_type"] == "qwen2" and data["config"]["num_key_value_heads"] == 2
    assert data["total_tensors"] == 2 * 12 + 3  # q/k/v biases; embedding, norm, untied head
    shown = cli(["inspect", str(models("qwen2-bf16"))]).output
    assert "model_type=qwen2" in shown


# -- hostile inputs and outputs (found by attacking the change) --------------------------


def test_a_failed_forced_write_leaves_the_old_directory_whole(models, tmp_path):
    import torch

    out = tmp_path / "shards"
    first = ms_port.convert(models("llama-f32"), ms_model="mindformers:llama", output=out,
                            max_shard_size="20KB")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    broken = tmp_path / "broken"
    shutil.copytree(models("llama-f32"), broken)
    state = {i.name: torch.from_numpy(np.array(i.load())) + 1 for i in read_source(broken)}
    state["model.norm.weight"][0] = float("nan")  # the last shard's tensor
    from safetensors.torch import save_file

    save_file(state, broken / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ms_port.errors.NonFiniteError):
        ms_port.convert(broken, ms_model="mindformers:llama", output=out,
                        max_shard_size="20KB", force=True, check_finite=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # not one shard mixed
    assert first.ok and not [p for p in tmp_path.iterdir() if p.name.startswith(".ms-port")]


def test_force_replaces_a_model_directory_whole_and_nothing_else(models, tmp_path):
    out, _ = _convert(models, tmp_path, "qwen2-bf16", True)
    back = tmp_path / "back"
    config = models("qwen2-bf16") / "config.json"
    ms_port.export(out, ms_model="mindformers:llama", config=config, output=back)
    ms_port.export(out, ms_model="mindformers:llama", config=config, output=back,
                   max_shard_size="40KB", force=True)
    names = {p.name for p in back.iterdir()}
    assert "model.safetensors" not in names  # no stale file for transformers to prefer
    assert "model.safetensors.index.json" in names
    assert oct(back.stat().st_mode & 0o777) == oct(0o777 & ~_umask())
    (back / "notes.txt").write_text("mine")
    with pytest.raises(ms_port.errors.OutputExistsError, match="not a model's"):
        ms_port.export(out, ms_model="mindformers:llama", config=config, output=back,
                       force=True)
    assert (back / "notes.txt").read_text() == "mine"


def _umask():
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("change,words", [
    ({"rms_norm_eps": "abc"}, "rms_norm_eps"),
    ({"tie_word_embeddings": "false"}, "tie_word_embeddings"),
    ({"rope_scaling": "linear"}, "rope"),
    ({"vocab_size": 10**40}, "vocab_size"),
    ({"num_hidden_layers": 10**9}, "num_hidden_layers"),
    ({"model_type": "x" * 100_000}, "model_type 'xxx"),
    ({"model_type": ["llama"]}, "model_type ['llama']"),
    ({"head_dim": "a\nb"}, "head_dim is 'a\\nb'"),
    ({"head_dim": 16.0}, "head_dim is 16.0"),
    ({"hidden_act": "x" * 300}, "hidden_act 'xxx"),
    ({"hidden_size": 4, "head_dim": None},  # unset: not "head_dim is 0"
     "8 heads of 1 with 2 KV heads and hidden_size 4"),
])
def test_hostile_config_values_are_one_line_exit_2(tmp_path, cli, change, words):
    src = tiny_hf_lm("llama", tmp_path / "m")
    config = {**json.loads((src / "config.json").read_text()), **change}
    (src / "config.json").write_text(json.dumps(config))
    line = _one_error(cli(["convert", str(src), "--ms-model", "mindformers:llama",
                           "--dry-run"]))
    assert words in line and len(line) < 600  # the value cut, whatever its length


def test_a_config_that_is_no_regular_file_is_refused(tmp_path, cli):
    src = tiny_hf_lm("llama", tmp_path / "m")
    result = cli(["convert", str(src), "--ms-model", "mindformers:llama", "--config",
                  "/dev/zero", "--dry-run"])
    assert result.exit_code == 2 and "not a regular file" in result.output


def test_params_that_explode_are_refused(tmp_path):
    from ms_port.match.mapping import parse_mapping

    src = tiny_hf_lm("llama", tmp_path / "m")
    square = "*".join(["hidden_size"] * 12)
    table = parse_mapping(f"params:\n  a: '{square}'\n", origin="bomb.yaml")
    plan = ms_port.plan(src, ms_model="mindformers:llama", mapping=table)
    assert "a" not in plan.params  # never computed past the bound; nothing used it
    with pytest.raises(MappingError, match="2\\*\\*40"):
        ms_port.plan(src, ms_model="mindformers:llama", mapping=parse_mapping(
            f"params:\n  a: '{square}'\nfuse:\n  - target: 'model.layers.{{i}}.feed_forward."
            "w1.weight'\n    sources: "
            "['model.layers.{i}.mlp.gate_proj.weight', 'model.layers.{i}.mlp.up_proj.weight']"
            "\n    layout: {grouped: a}\n", origin="bomb.yaml"))


@needs_mindformers
def test_verify_refuses_a_config_far_larger_than_its_checkpoint(models, tmp_path):
    out, _ = _convert(models, tmp_path, "llama-f32", False)
    big = tmp_path / "big"
    shutil.copytree(models("llama-f32"), big)
    config = json.loads((big / "config.json").read_text())
    (big / "config.json").write_text(json.dumps({**config, "hidden_size": 8192,
                                                 "head_dim": 1024,
                                                 "intermediate_size": 28672}))
    with pytest.raises(TargetError, match=r"does not fit|parameters"):
        ms_port.verify(big, out, ms_model="mindformers:llama")


def test_export_recognises_the_family_from_the_checkpoint_names(models, tmp_path):
    """No --ms-model: the config's computed MindFormers names equal the checkpoint's."""
    for qkv in (False, True):
        out, _ = _convert(models, tmp_path, "mistral-bf16", qkv)
        report = ms_port.export(out, config=models("mistral-bf16") / "config.json",
                                output=tmp_path / f"back-{qkv}")
        assert report.ok and report.plan.mapping.origin == "mappings/hf_llama_mindformers.yaml"


def test_token_defaults_name_the_config_file_when_vocab_size_is_unusable():
    from ms_port.check.language import token_defaults

    assert token_defaults({"vocab_size": 128}, "m/config.json")[2] == [(0, 128)]
    for bad in (0, True, "128", 2**40, None):
        with pytest.raises(TargetError, match=r"^m/config\.json: vocab_size"):
            token_defaults({"vocab_size": bad}, "m/config.json")


def test_a_family_of_llamas_structure_is_a_table(tmp_path, cli, monkeypatch):
    """A model type no shipped table takes is refused by name; a table that selects it,
    saying what the type implies (q/k/v biases), is all it takes to convert it: no code."""
    from importlib import resources

    import yaml

    import ms_port.match.mapping as mapping

    src = tiny_hf_lm("qwen2", tmp_path / "m")  # q/k/v biases, which no config key states
    reference = tmp_path / "qwen2.ckpt"
    assert cli(["convert", str(src), "--ms-model", "mindformers:llama", "--ms-option",
                "qkv_concat=true", "-o", str(reference)]).exit_code == 0
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "model_type": "mylm"}))
    out = tmp_path / "o.ckpt"
    args = ["convert", str(src), "--ms-model", "mindformers:llama", "--ms-option",
            "qkv_concat=true", "-o", str(out)]
    refused = _one_error(cli(args))
    assert "'mylm'" in refused and "llama, mistral, qwen2" in refused
    assert "Adding a family" in refused and not out.exists()

    shipped = yaml.safe_load(resources.files("ms_port.mappings").joinpath(
        "hf_llama_mindformers.yaml").read_text())
    table = {**shipped, "select": {"model_type": ["mylm"], "target": ["mindformers:llama"]}}
    shipped_tables = mapping.shipped_tables()
    without = {k: v for k, v in table.items() if k != "implies"}
    monkeypatch.setattr(mapping, "_SHIPPED", (
        *shipped_tables, mapping.mapping_from_data(without, origin="mylm.yaml")))
    unsaid = cli(args)  # the table does not say the type has q/k/v biases: they are left over
    assert unsaid.exit_code == 1 and not out.exists()
    assert ("the networks differ: PyTorch's model.layers.0.self_attn.k_proj has a bias, "
            "MindSpore's model.layers.0.attention.w_qkv has none" in unsaid.output)

    monkeypatch.setattr(mapping, "_SHIPPED", (*shipped_tables, mapping.mapping_from_data(
        {**table, "implies": {"mylm": {"qkv_bias": True}}}, origin="mylm.yaml")))
    result = cli(args)
    assert result.exit_code == 0, result.output
    assert "mylm.yaml" in result.output  # the report names the table it used
    mine, theirs = read_source(out), read_source(reference)
    assert list(mine.tensors) == list(theirs.tensors)
    assert "model.layers.0.attention.w_qkv.bias" in mine.tensors
    for name, info in mine.tensors.items():
        assert info.load().tobytes() == theirs.tensors[name].load().tobytes(), name


def test_implies_in_a_users_table_must_agree_with_the_network_computed(tmp_path, cli):
    """``implies:`` decides the network the family computes, from mappings/; a --map table
    saying otherwise is refused by name instead of dropped; one that agrees is fine."""
    src = tiny_hf_lm("qwen2", tmp_path / "m")
    for value in ("false", "true"):
        table = tmp_path / f"mine-{value}.yaml"
        table.write_text("select: {model_type: qwen2}\n"
                         f"implies:\n  qwen2: {{qkv_bias: {value}}}\n")
        result = cli(["convert", str(src), "--ms-model", "mindformers:llama", "--map",
                      str(table), "--dry-run"])
        if value == "true":
            assert result.exit_code == 0, result.output
            continue
        line = _one_error(result)
        assert "implies.'qwen2'" in line and "mine-false.yaml" in line and "mappings/" in line


def test_what_a_type_implies_is_not_changed_by_its_config(tmp_path, cli, monkeypatch):
    """transformers' Qwen2 has q/k/v biases whatever its config says, and LLaMA none
    unless attention_bias: a stray qkv_bias key in config.json changes neither; a table's
    implies: that the family cannot use is refused in one line, naming the entry."""
    import ms_port.match.mapping as mapping

    for kind, stray in (("qwen2", False), ("qwen2", None), ("llama", True)):
        src = tiny_hf_lm(kind, tmp_path / f"{kind}-{stray}")
        config = json.loads((src / "config.json").read_text())
        (src / "config.json").write_text(json.dumps({**config, "qkv_bias": stray}))
        plan = ms_port.plan(src, ms_model="mindformers:llama")
        assert plan.ok, plan.problems()[:3]
        assert ("model.layers.0.attention.wq.bias" in plan.target) is (kind == "qwen2")
    shipped = mapping.shipped_tables()
    odd = [mapping.mapping_from_data({"select": {"model_type": "qwen2",
                                                 "target": "mindformers:llama"},
                                      "implies": {"qwen2": implied}}, origin="odd.yaml")
           for implied in ({"sliding": True}, {"qkv_bias": True, "o_bias": False})]
    for table in odd:  # the parser takes any name; the family says which it uses
        monkeypatch.setattr(mapping, "_SHIPPED", (table, *shipped))
        line = _one_error(cli(["convert", str(tmp_path / "qwen2-False"), "--ms-model",
                               "mindformers:llama", "--dry-run"]))
        assert "odd.yaml: implies.'qwen2'." in line and "takes only qkv_bias" in line


def test_a_hostile_implies_entry_is_one_short_line(tmp_path, cli):
    src = tiny_hf_lm("llama", tmp_path / "m")
    table = tmp_path / "t.yaml"
    table.write_text('select: {model_type: llama}\nimplies:\n  ? "a\\nb' + "x" * 10_000
                     + '"\n  : {qkv_bias: true}\n')  # an explicit key: YAML's are long
    line = _one_error(cli(["convert", str(src), "--ms-model", "mindformers:llama", "--map",
                           str(table), "--dry-run"]))
    # a 10,000-character key is shown to NAME_LIMIT (head and tail), the line bounded
    assert "implies.'a\\nb" in line and "xxx'" in line and len(line) < 600
