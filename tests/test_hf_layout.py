"""The Hugging Face tensors computed from a config (ms_port.archs.hf_layout) are
transformers' own: names, order, shapes, the tied head left out, for each family and
each switch that adds or removes a tensor. Where a config leaves a size to a family
default, transformers decides (the computed table declines)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from ms_port.archs import hf_layout
from ms_port.match import inversion

BASE = {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 8,
        "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 128}
CASES = [
    ("llama", "LlamaForCausalLM", {}),
    ("llama", "LlamaForCausalLM", {"attention_bias": True, "mlp_bias": True}),
    ("llama", "LlamaForCausalLM", {"tie_word_embeddings": True, "head_dim": 16}),
    ("llama", "LlamaForCausalLM", {"num_key_value_heads": None}),  # MHA: kv = heads
    ("mistral", "MistralForCausalLM", {"head_dim": 16}),
    ("qwen2", "Qwen2ForCausalLM", {}),
    ("qwen2", "Qwen2ForCausalLM", {"tie_word_embeddings": True, "attention_bias": False}),
    ("qwen3", "Qwen3ForCausalLM", {"head_dim": 16}),
    ("qwen3", "Qwen3ForCausalLM", {"head_dim": 8, "attention_bias": True,
                                   "tie_word_embeddings": True}),
]


def _config(model_type: str, cls: str, extra: dict) -> dict:
    config = {**BASE, "model_type": model_type, "architectures": [cls], **extra}
    return {k: v for k, v in config.items() if v is not None}


@pytest.mark.parametrize(("model_type", "cls", "extra"), CASES)
def test_the_computed_tensors_are_transformers_own(model_type, cls, extra, monkeypatch):
    config = _config(model_type, cls, extra)
    computed, what = inversion._from_config(config, "config.json")
    assert what == f"transformers {cls} (config.json)"
    monkeypatch.setattr(hf_layout, "hf_tensors", lambda _config: None)
    built, built_what = inversion._from_config(config, "config.json")
    assert built_what == what
    assert [(i.name, i.shape, i.dtype) for i in computed] == [
        (i.name, i.shape, i.dtype) for i in built]


@pytest.mark.parametrize(("model_type", "missing"), [
    ("qwen2", "num_key_value_heads"), ("qwen3", "head_dim"), ("mistral", "num_key_value_heads")])
def test_a_family_default_is_left_to_transformers(model_type, missing):
    cls = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
           "mistral": "MistralForCausalLM"}[model_type]
    config = {k: v for k, v in _config(model_type, cls, {"head_dim": 8}).items()
              if k != missing}
    assert hf_layout.hf_tensors(config) is None
    assert hf_layout.hf_tensors({**config, "model_type": "gemma"}) is None
