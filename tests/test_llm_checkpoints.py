"""Language-model checkpoints as people download them: RoPE scaling (llama3, yarn) in both
config forms, every token id of the vocabulary, and the inv_freq buffers of old files.

Each verdict is tested where it must say no: a network built without the scaling, a pad
id masked on one side only, a wrong conversion fed the same inputs, a buffer that
disagrees with its config. Skipped where transformers / mindformers are absent.
"""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")

import ms_port  # noqa: E402
from ms_port.errors import MappingError  # noqa: E402
from ms_port.match.rope import Rope, inv_freq, read_rope  # noqa: E402
from ms_port.testing import rewrite_checkpoint, tiny_hf_lm  # noqa: E402

needs_mindformers = pytest.mark.skipif(importlib.util.find_spec("mindformers") is None,
                                       reason="mindformers not installed (test extra)")

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}


@pytest.fixture
def cli():
    from click.testing import CliRunner

    from ms_port.cli import main

    return lambda args: CliRunner().invoke(main, args, env={"COLUMNS": "250"})


def _hub_form(path, scaling, theta=10000.0):
    """Rewrite a config.json as the Hub's files have it: rope_scaling beside a top-level
    rope_theta (transformers 5 writes rope_parameters with the theta inside)."""
    config = json.loads((path / "config.json").read_text())
    config.pop("rope_parameters", None)
    config["rope_scaling"] = {("type" if k == "rope_type" else k): v for k, v in scaling.items()}
    config["rope_theta"] = theta
    (path / "config.json").write_text(json.dumps(config))
    return path


def test_both_config_forms_read_the_same_scaling():
    base = {"max_position_embeddings": 256, "hidden_size": 64, "num_attention_heads": 8}
    for scaling in (LLAMA3, YARN):
        hub = read_rope({**base, "rope_scaling": scaling, "rope_theta": 500000.0})
        five = read_rope({**base, "rope_parameters": {**scaling, "rope_theta": 500000.0}})
        assert (hub.kind, hub.theta, hub.extend_method, hub.scaling_factor) == (
            five.kind, five.theta, five.extend_method, five.scaling_factor)
        assert hub.theta == 500000.0 and hub.problem is None
    yarn = read_rope({**base, "rope_scaling": YARN})
    # Hugging Face's defaults, in MindFormers' words (its attention factor: mscale 1, all_dim 0)
    assert yarn.scaling_factor == {"factor": 4.0, "original_max_position_embeddings": 16,
                                   "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0,
                                   "mscale_all_dim": 0.0}
    llama3 = read_rope({**base, "rope_scaling": {**LLAMA3, "factor": 8}})
    assert isinstance(llama3.scaling_factor["factor"], float)  # MindFormers refuses int 8
    assert read_rope(base) == Rope("default", None, 10000.0)


@pytest.mark.parametrize("scaling,why", [
    ({"rope_type": "linear", "factor": 2.0}, "inverted"),
    ({"rope_type": "dynamic", "factor": 2.0}, "run time"),
    ({"rope_type": "longrope", "short_factor": [1.0]}, "no 'longrope'"),
    ({**YARN, "attention_factor": 0.5}, "attention_factor"),
    ({**YARN, "truncate": False}, "truncate"),
])
def test_scalings_mindformers_cannot_compute_are_named(scaling, why):
    rope = read_rope({"max_position_embeddings": 256, "rope_scaling": scaling})
    assert why in rope.problem
    assert rope.extend_method == "None" and rope.scaling_factor == 1.0


def test_inv_freq_follows_transformers():
    """The buffer a config implies is what transformers computes for it (plain, llama3,
    yarn), so an old checkpoint's buffer can be checked against its config."""
    import torch
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    for scaling in (None, LLAMA3, YARN):
        config = transformers.LlamaConfig(hidden_size=64, num_attention_heads=4,
                                          max_position_embeddings=256, rope_theta=500000.0,
                                          rope_scaling=scaling)
        kind = (scaling or {}).get("rope_type", "default")
        if kind == "default":
            expected = 1.0 / (500000.0 ** (torch.arange(0, 16, 2).float() / 16))
        else:
            expected, _ = ROPE_INIT_FUNCTIONS[kind](config, "cpu")
        ours = inv_freq(read_rope(config.to_dict()), 16)
        np.testing.assert_allclose(ours, expected.numpy(), rtol=2e-6)
        plain = inv_freq(Rope("default", None, 500000.0), 16)
        assert kind == "default" or not np.allclose(plain, expected.numpy(), rtol=1e-3)


@needs_mindformers
@pytest.mark.parametrize("kind,scaling,hub", [("llama", LLAMA3, True), ("qwen2", YARN, False)],
                         ids=["llama3-hub-form", "yarn-transformers5-form"])
def test_scaled_rope_converts_and_verifies_past_the_original_length(tmp_path, monkeypatch,
                                                                    kind, scaling, hub):
    src = tiny_hf_lm(kind, tmp_path / "m", config={"rope_scaling": scaling,
                                                   "max_position_embeddings": 256})
    if hub:
        _hub_form(src, scaling, theta=50000.0)
    out = tmp_path / "m.ckpt"
    report = ms_port.convert(src, ms_model="mindformers:llama", output=out)
    assert report.ok
    assert any(scaling["rope_type"] in n and "extend_method" in n for n in report.plan.notes)
    # 48 tokens, three times the length the scaling extends from
    long = dict(input_shape=[(48,)], ms_model="mindformers:llama")
    assert ms_port.verify(src, out, **long).verdict == "PASS"
    # the same checkpoint in a network built without the scaling computes another function
    from ms_port.archs.llama import family as mindformers

    plain = Rope("default", None, read_rope(json.loads(
        (src / "config.json").read_text())).theta)
    monkeypatch.setattr(mindformers, "read_rope", lambda config: plain)
    wrong = ms_port.verify(src, out, **long)
    assert wrong.verdict == "FAIL"
    assert wrong.first_divergence.ms_name.startswith("model.layers.0.attention")


@needs_mindformers
def test_a_scaling_mindformers_cannot_compute_converts_with_a_note_and_verify_refuses(
        tmp_path, cli):
    src = tiny_hf_lm("llama", tmp_path / "m",
                     config={"rope_scaling": {"rope_type": "linear", "factor": 2.0}})
    out = tmp_path / "m.ckpt"
    report = ms_port.convert(src, ms_model="mindformers:llama", output=out)
    assert report.ok and any("cannot compute it exactly" in n for n in report.plan.notes)
    result = cli(["verify", str(src), str(out), "--ms-model", "mindformers:llama"])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and lines[0].startswith("error: ")
    assert "'linear'" in lines[0] and "cannot compute it exactly" in lines[0]
    assert len(lines) == 2


def _every_id(vocab=128):
    """Every id of the vocabulary, 0 first, then again backwards: 256 tokens."""
    ids = np.arange(vocab, dtype=np.int64)
    return np.concatenate([ids, ids[::-1]])[None]


@needs_mindformers
def test_every_token_id_passes_and_a_wrong_conversion_still_fails(tmp_path, monkeypatch):
    src = tiny_hf_lm("qwen2", tmp_path / "m", config={"pad_token_id": 5, "bos_token_id": 1,
                                                      "eos_token_id": 2})
    out = tmp_path / "m.ckpt"
    ms_port.convert(src, ms_model="mindformers:llama", output=out)
    np.save(tmp_path / "ids.npy", _every_id())
    args = dict(ms_model="mindformers:llama", inputs=tmp_path / "ids.npy")
    report = ms_port.verify(src, out, **args)
    assert report.verdict == "PASS", report.message
    assert report.inputs[0]["shape"] == [1, 256]

    def swap_kv(tensors):  # layer 1's k and v projections swapped
        k, v = "model.layers.1.attention.wk.weight", "model.layers.1.attention.wv.weight"
        tensors[k], tensors[v] = tensors[v], tensors[k]
        return tensors

    wrong = rewrite_checkpoint(out, tmp_path / "wrong.ckpt", swap_kv)
    failed = ms_port.verify(src, wrong, **args)
    assert failed.verdict == "FAIL"
    assert failed.first_divergence.ms_name.startswith("model.layers.1.attention")
    # the check can see pad masking: MindFormers masking id 0 (its default) fails the right
    # conversion on these same inputs
    from ms_port.archs.llama import family as mindformers

    monkeypatch.setattr(mindformers, "NO_PAD", 0)
    assert ms_port.verify(src, out, **args).verdict == "FAIL"


def _old_checkpoint(tmp_path, theta):
    """A Llama-2-era pytorch_model.bin: every layer's rotary inv_freq saved beside the
    weights, computed with ``theta``."""
    import torch
    from safetensors.torch import load_file

    src = tiny_hf_lm("llama", tmp_path / "old")
    state = load_file(str(src / "model.safetensors"))
    for i in range(2):
        state[f"model.layers.{i}.self_attn.rotary_emb.inv_freq"] = 1.0 / (
            theta ** (torch.arange(0, 8, 2).float() / 8))
    (src / "model.safetensors").unlink()
    torch.save(state, src / "pytorch_model.bin")
    return src


def test_inv_freq_buffers_are_checked_and_dropped(tmp_path, cli):
    src = _old_checkpoint(tmp_path, 10000.0)
    report = ms_port.convert(src, ms_model="mindformers:llama", output=tmp_path / "o.ckpt")
    assert report.ok
    derived = [d for d in report.plan.dropped if "derived from config.json" in d.reason]
    assert sorted(d.name for d in derived) == [
        f"model.layers.{i}.self_attn.rotary_emb.inv_freq" for i in range(2)]
    result = cli(["convert", str(src), "--ms-model", "mindformers:llama", "-o",
                  str(tmp_path / "cli.ckpt")])
    assert result.exit_code == 0
    # one line for all of them, not one per layer
    assert sum("derived from config.json" in line for line in result.output.splitlines()) == 1


def test_an_inv_freq_that_disagrees_with_its_config_is_refused(tmp_path, cli):
    src = _old_checkpoint(tmp_path, 500000.0)  # config.json says rope_theta 10000
    with pytest.raises(MappingError, match=r"model\.layers\.0\.self_attn\.rotary_emb\.inv_freq"
                                           r"' is not what config\.json implies \(rope_theta"):
        ms_port.convert(src, ms_model="mindformers:llama", output=tmp_path / "o.ckpt")
    assert not (tmp_path / "o.ckpt").exists()
    result = cli(["convert", str(src), "--ms-model", "mindformers:llama", "-o",
                  str(tmp_path / "o.ckpt")])
    assert result.exit_code == 2 and "rope_theta" in result.output
    # the same file with the config it was saved with converts
    config = json.loads((src / "config.json").read_text())
    config.pop("rope_parameters", None)
    (src / "config.json").write_text(json.dumps({**config, "rope_theta": 500000.0}))
    assert ms_port.convert(src, ms_model="mindformers:llama", output=tmp_path / "o.ckpt").ok


def test_a_derived_entry_naming_an_unknown_value_is_refused(tmp_path):
    from ms_port.match.mapping import load_mapping

    path = tmp_path / "t.yaml"
    path.write_text("derived:\n  - {source: 'a.{i}.inv_freq', value: [x]}\n")
    with pytest.raises(MappingError, match=r"derived\[0\].*rope_inv_freq"):
        load_mapping(path)



@pytest.mark.parametrize("shard", [None, "40KB"])
def test_an_output_naming_a_file_inside_the_source_folder_is_refused_even_with_force(
        tmp_path, shard):
    """The folder is the input given, its weights are the files read: neither is written
    over, whatever --force says (a safetensors output named like the source's file)."""
    from ms_port.errors import WriteError

    src = tiny_hf_lm("llama", tmp_path / "m", shard=shard)
    weights = sorted(p for p in src.iterdir() if p.suffix == ".safetensors")
    before = [p.read_bytes() for p in weights]
    for target in weights:
        with pytest.raises(WriteError, match="is an input of this run"):
            ms_port.convert(src, ms_model="mindformers:llama", output=target,
                            format="safetensors", force=True)
    assert [p.read_bytes() for p in weights] == before
