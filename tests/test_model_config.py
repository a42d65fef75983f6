"""``convert --model-config``: MindFormers' YAML for a converted Hugging Face LM.

The written file must load, and MindFormers' ``LlamaForCausalLM`` built from its
``model_config`` (only the commented run settings filled in: a CPU, float32) with the
converted checkpoint must compute transformers' logits — for a LLaMA 3 RoPE scaling fed
past its original length, and for a tied Qwen2 in the fused layout whose config names a pad
id. Each comparison has a twin that must not match (the scaling left out, LlamaConfig's
default pad id, transformers without the pad mask), so a pass is not a constant.
Skipped where transformers / mindformers (the test extra) are absent.
"""

from __future__ import annotations

import importlib.util
import json
import re

import numpy as np
import pytest
import yaml

transformers = pytest.importorskip("transformers")

import ms_port  # noqa: E402
from ms_port.archs.llama.family import CPU_SETTINGS, NO_PAD  # noqa: E402
from ms_port.testing import tiny_hf_lm  # noqa: E402

needs_mindformers = pytest.mark.skipif(importlib.util.find_spec("mindformers") is None,
                                       reason="mindformers not installed (test extra)")

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
#: the bound for MindFormers vs transformers, both float32 (measured: ~2e-7)
TOL = 1e-5
#: what a wrong network gives at least on the same inputs (measured: 8e-3 and more)
WRONG = 1e-3
#: 80 tokens: five times the length the LLaMA 3 scaling extends from
LENGTH = 80


@pytest.fixture
def cli():
    from click.testing import CliRunner

    from ms_port.cli import main

    return lambda args: CliRunner().invoke(main, args, env={"COLUMNS": "250"})


def _one_error(result) -> str:
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 2 and lines[0].startswith("error: "), result.output
    return lines[0]


def _convert(cli, src, tmp_path, *extra):
    out, yml = tmp_path / "m.ckpt", tmp_path / "m.yaml"
    result = cli(["convert", str(src), "--ms-model", "mindformers:llama", "-o", str(out),
                  "--model-config", str(yml), "--json", *extra])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["model_config"]["path"] == str(yml)
    assert report["model_config"]["readback"] == "identical"
    return out, yml, report


def _run_settings(text: str) -> dict:
    """The commented run settings, uncommented: what the file says ms-port tests with."""
    block = text[text.index("# run settings: yours"):text.index("  arch:")]
    lines = [m.group(1) for m in re.finditer(r"^ {4}# (\w+: .*)$", block, re.M)]
    return yaml.safe_load("\n".join(lines))


def _ids(*extra: int) -> np.ndarray:
    """LENGTH token ids below 128 holding 0 and ``extra`` (never first: a query needs one
    unmasked key)."""
    ids = (np.arange(LENGTH) * 37 + 5) % 128
    for i, token in enumerate((0, *extra)):
        ids[10 + 17 * i] = token
        ids[11 + 17 * i] = token
    return ids[None].astype(np.int64)


def _relative(a, b) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _transformers(src, ids, mask=None) -> np.ndarray:
    import torch

    model = transformers.AutoModelForCausalLM.from_pretrained(
        src, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        kw = {} if mask is None else {"attention_mask": torch.tensor(mask)}
        return model(torch.tensor(ids), **kw).logits[0].numpy()


def _mindformers(settings: dict, ckpt, ids) -> np.ndarray:
    """LlamaForCausalLM(LlamaConfig(**settings)) with ``ckpt`` loaded, on ``ids``."""
    from ms_port.archs.llama.family import contained
    from ms_port.check.networks import load_ms_weights

    with contained():
        import mindspore as ms
        from mindformers.models.llama import LlamaConfig, LlamaForCausalLM

        net = LlamaForCausalLM(LlamaConfig(**settings))
    net.set_train(False)
    assert load_ms_weights(net, ckpt) == ([], [])
    return net(ms.Tensor(ids, ms.int32))[0].asnumpy().reshape(ids.shape[1], -1)


@needs_mindformers
def test_llama3_scaling_computes_transformers_logits_past_the_original_length(tmp_path,
                                                                               cli):
    src = tiny_hf_lm("llama", tmp_path / "m", config={"rope_scaling": LLAMA3,
                                                      "max_position_embeddings": 256})
    out, yml, report = _convert(cli, src, tmp_path)
    text = yml.read_text()
    doc = yaml.safe_load(text)
    mc = doc["model"]["model_config"]
    assert doc["model"]["arch"] == {"type": "LlamaForCausalLM"} and mc["type"] == "LlamaConfig"
    assert doc["load_checkpoint"] == str(out.absolute()) and doc["load_ckpt_format"] == "ckpt"
    assert mc["extend_method"] == "LLAMA3" and mc["max_position_embedding"] == 256
    assert mc["scaling_factor"] == {k: v for k, v in LLAMA3.items() if k != "rope_type"}
    assert (mc["pad_token_id"], mc["bos_token_id"], mc["eos_token_id"]) == (NO_PAD, 1, 2)
    assert report["model_config"]["model_config"] == mc
    run = _run_settings(text)
    assert run == {"batch_size": 1, "seq_length": 256, **CPU_SETTINGS}
    assert not any(k in mc for k in run)  # the run settings are the user's: all commented

    settings = {k: v for k, v in mc.items() if k != "type"}
    settings.update(run, seq_length=LENGTH)
    ids = _ids()
    theirs = _transformers(src, ids)
    error = _relative(_mindformers(settings, out, ids), theirs)
    assert error < TOL, error
    # twins on the same inputs: without the scaling, and with LlamaConfig's pad id (0)
    plain = {**settings, "extend_method": "None", "scaling_factor": 1.0}
    assert _relative(_mindformers(plain, out, ids), theirs) > WRONG
    default_pad = {k: v for k, v in settings.items() if k != "pad_token_id"}
    assert _relative(_mindformers(default_pad, out, ids), theirs) > WRONG


@needs_mindformers
def test_tied_qwen2_fused_loads_through_mindformers_config_and_masks_the_pad_id(tmp_path,
                                                                                 cli):
    pad = 7
    src = tiny_hf_lm("qwen2", tmp_path / "m", tied=True, config={
        "pad_token_id": pad, "bos_token_id": 1, "eos_token_id": [2, 3],
        "max_position_embeddings": 128})
    out, yml, report = _convert(cli, src, tmp_path, "--ms-option", "qkv_concat=true")
    text = yml.read_text()
    mc = yaml.safe_load(text)["model"]["model_config"]
    assert mc["qkv_concat"] and mc["qkv_has_bias"] and mc["tie_word_embeddings"]
    assert (mc["pad_token_id"], mc["eos_token_id"]) == (pad, [2, 3])
    assert "MindFormers masks every token equal to pad_token_id" in text
    assert any("pad_token_id 7" in n for n in report["model_config"]["notes"])

    from ms_port.archs.llama.family import contained
    from ms_port.check.networks import load_ms_weights

    with contained():  # as run_mindformer.py reads it: MindFormerConfig, the registry
        import mindspore as ms
        from mindformers.models.build_model import build_network
        from mindformers.tools.register import MindFormerConfig

        config = MindFormerConfig(str(yml))
        config.model.model_config.update({**_run_settings(text), "seq_length": LENGTH})
        net = build_network(config.model)
    assert type(net).__name__ == "LlamaForCausalLM"
    assert (net.config.pad_token_id, net.config.qkv_concat) == (pad, True)
    net.set_train(False)
    assert load_ms_weights(net, out) == ([], [])
    ids = _ids(pad)
    ours = net(ms.Tensor(ids, ms.int32))[0].asnumpy().reshape(LENGTH, -1)
    error = _relative(ours, _transformers(src, ids, mask=(ids != pad).astype(np.int64)))
    assert error < TOL, error
    # MindFormers masks the pad id: transformers without that mask computes otherwise
    assert _relative(ours, _transformers(src, ids)) > WRONG


@needs_mindformers
def test_a_padless_config_writes_no_pad_because_llamaconfig_would_mask_token_0(tmp_path,
                                                                                 cli):
    from ms_port.archs.llama.family import contained

    src = tiny_hf_lm("qwen2", tmp_path / "m")  # transformers' Qwen2Config: no token ids
    assert "pad_token_id" not in {k for k, v in json.loads(
        (src / "config.json").read_text()).items() if v is not None}
    _, yml, _ = _convert(cli, src, tmp_path)
    text = yml.read_text()
    mc = yaml.safe_load(text)["model"]["model_config"]
    assert mc["pad_token_id"] == NO_PAD == -1
    assert "LlamaConfig's default 0 would mask token 0" in text.replace("\n    # ", " ")
    # absent ids are written, never left to LlamaConfig's defaults (bos 1, eos 2, pad 0)
    assert (mc["bos_token_id"], mc["eos_token_id"]) == (None, [])
    with contained():
        from mindformers.models.llama import LlamaConfig
    default = LlamaConfig()
    assert (default.pad_token_id, default.bos_token_id, default.eos_token_id) == (0, 1, 2)


def test_a_target_other_than_the_family_is_refused_in_one_line(tmp_path, cli):
    src = tiny_hf_lm("llama", tmp_path / "m")
    template = tmp_path / "template.ckpt"
    assert ms_port.convert(src, ms_model="mindformers:llama", output=template).ok
    yml, out = tmp_path / "m.yaml", tmp_path / "other.ckpt"
    line = _one_error(cli(["convert", str(src), "--target", str(template), "-o", str(out),
                           "--model-config", str(yml)]))
    assert "--ms-model mindformers:llama or mindformers:glm4 or mindformers:deepseek4 only" \
        in line
    assert str(template) in line
    assert not yml.exists() and not out.exists()
    # the same command with the family as its target writes both
    result = cli(["convert", str(src), "--ms-model", "mindformers:llama", "-o", str(out),
                  "--model-config", str(yml)])
    assert result.exit_code == 0 and yml.exists() and out.exists(), result.output
    with pytest.raises(ms_port.TargetError,
                       match="mindformers:llama or mindformers:glm4 or mindformers:deepseek4 "
                             "only"):
        ms_port.convert(src, arch="resnet18", output=tmp_path / "r.ckpt", model_config=yml)


def test_an_existing_file_is_refused_untouched_and_replaced_only_with_force(tmp_path, cli):
    src = tiny_hf_lm("llama", tmp_path / "m")
    yml, out = tmp_path / "m.yaml", tmp_path / "m.ckpt"
    yml.write_text("mine: true\n")
    args = ["convert", str(src), "--ms-model", "mindformers:llama", "-o", str(out),
            "--model-config", str(yml)]
    line = _one_error(cli(args))
    assert f"{yml} exists; pass --force" in line
    assert yml.read_text() == "mine: true\n" and not out.exists()  # refused before any work
    # never over an input: the config.json found in the model directory
    line = _one_error(cli([*args[:-1], str(src / "config.json"), "--force"]))
    assert "is an input of this run" in line
    assert json.loads((src / "config.json").read_text())["model_type"] == "llama"
    result = cli([*args, "--force"])
    assert result.exit_code == 0, result.output
    assert "model config: " in result.output and "replaced" in result.output
    assert yaml.safe_load(yml.read_text())["model"]["arch"]["type"] == "LlamaForCausalLM"


def test_dry_run_checks_and_writes_nothing(tmp_path):
    src = tiny_hf_lm("llama", tmp_path / "m")
    yml = tmp_path / "m.yaml"
    report = ms_port.convert(src, ms_model="mindformers:llama", dry_run=True,
                             model_config=yml)
    assert report.ok and report.model_config is None and not yml.exists()
    bad = json.loads((src / "config.json").read_text())
    bad["pad_token_id"] = "<pad>"  # a token, not its id: refused in the dry run already
    with pytest.raises(ms_port.TargetError, match="pad_token_id is '<pad>'"):
        ms_port.convert(src, ms_model="mindformers:llama", dry_run=True, config=bad,
                        model_config=yml)


def test_a_scaling_mindformers_cannot_compute_is_written_as_none_with_a_warning(tmp_path,
                                                                                 cli):
    from rich.console import Console

    from ms_port.render import render

    src = tiny_hf_lm("llama", tmp_path / "m",
                     config={"rope_scaling": {"rope_type": "linear", "factor": 2.0}})
    out, yml = tmp_path / "m.ckpt", tmp_path / "m.yaml"
    report = ms_port.convert(src, ms_model="mindformers:llama", output=out, model_config=yml)
    assert report.ok and report.model_config.path == str(yml)
    text = yml.read_text()
    mc = yaml.safe_load(text)["model"]["model_config"]
    assert (mc["extend_method"], mc["scaling_factor"]) == ("None", 1.0)
    assert "WARNING — NOT COMPUTED: config.json's RoPE scaling 'linear'" in text
    assert any("'linear'" in n and "extend_method None" in n
               for n in report.model_config.notes)
    console = Console(width=200, color_system=None, record=True)
    console.print(render(report))
    shown = console.export_text()
    assert f"model config: {yml}" in shown and "written as extend_method None" in shown
    # a scaling MindFormers computes carries no warning
    src3 = tiny_hf_lm("llama", tmp_path / "l3", config={"rope_scaling": LLAMA3,
                                                        "max_position_embeddings": 256})
    ok = ms_port.convert(src3, ms_model="mindformers:llama", output=tmp_path / "l3.ckpt",
                         model_config=tmp_path / "l3.yaml")
    assert ok.model_config.notes == [] and "WARNING" not in (tmp_path / "l3.yaml").read_text()


def test_max_position_embedding_is_raised_above_the_original_length(tmp_path):
    from ms_port.write.model_config import mindformers_yaml

    config = json.loads((tiny_hf_lm("llama", tmp_path / "m") / "config.json").read_text())
    config["rope_parameters"] = {"rope_theta": 10000.0, **LLAMA3,
                                 "original_max_position_embeddings": 64}
    built = mindformers_yaml(config)  # max_position_embeddings 64: MindFormers wants more
    assert config["max_position_embeddings"] == 64
    assert built.model_config["max_position_embedding"] == 65
    assert "65, not config.json's max_position_embeddings (64)" in built.text.replace(
        "\n    # ", " ")
