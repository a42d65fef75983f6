"""The tensors a Hugging Face decoder saves, computed from its ``config.json`` alone.

``export --config`` needs the PyTorch side's names and shapes. transformers knows them,
but building its model costs seconds and hundreds of MiB before the first byte is written
(importing torch, transformers and what transformers pulls in). For the dense decoders
whose layout is plain — LLaMA, Mistral, Qwen2, Qwen3 — the names and shapes follow from
a few numbers, listed here as data; ``tests/test_hf_layout.py`` holds them equal to
transformers' own model, family by family, option by option. GLM-4's original remote-code
layout, which transformers has no class for, is computed by
:func:`~ms_port.archs.glm.remote.remote_tensors`. Any other model type (or a config this
does not describe: a missing ``architectures``) is built with transformers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .config_values import read_bool, read_int, read_layers


@dataclass(frozen=True)
class Decoder:
    """A family's per-layer switches: which biases and norms its layers hold."""

    #: q/k/v biases: always, never, or as ``attention_bias`` says (None)
    qkv_bias: bool | None = None
    #: the output projection's bias follows ``attention_bias``
    o_bias_follows: bool = True
    #: the MLP's biases follow ``mlp_bias``
    mlp_bias_key: bool = False
    #: per-head RMSNorm on q and k (``q_norm``, ``k_norm``)
    qk_norm: bool = False
    #: config keys whose family default is not what the numbers above imply
    needs: tuple[str, ...] = ()


#: model_type -> its decoder's layout
DECODERS: dict[str, Decoder] = {
    "llama": Decoder(mlp_bias_key=True),
    "mistral": Decoder(qkv_bias=False, o_bias_follows=False, needs=("num_key_value_heads",)),
    "qwen2": Decoder(qkv_bias=True, o_bias_follows=False, needs=("num_key_value_heads",)),
    "qwen3": Decoder(qk_norm=True, needs=("num_key_value_heads", "head_dim")),
}


def hf_tensors(config: dict[str, Any]) -> tuple[str, dict[str, tuple[int, ...]]] | None:
    """(the model's class, name -> shape as transformers saves them), or ``None`` where
    this table does not describe the config (then build it with transformers)."""
    if config.get("model_type") == "chatglm":  # GLM-4's remote code: no transformers class
        from .glm.remote import remote_tensors

        return remote_tensors(config)
    decoder = DECODERS.get(config.get("model_type"))
    archs = config.get("architectures")
    if decoder is None or not (isinstance(archs, list) and len(archs) == 1
                               and isinstance(archs[0], str)
                               and archs[0].endswith("ForCausalLM")):
        return None
    # where a config leaves a size to the family's default (which differ: Qwen2's and
    # Qwen3's 32 KV heads, Qwen3's head_dim 128), transformers decides
    given = set(config)
    if not given >= {"hidden_size", "intermediate_size", "num_attention_heads", "vocab_size",
                     "num_hidden_layers", *decoder.needs}:
        return None
    hidden, inter = read_int(config, "hidden_size"), read_int(config, "intermediate_size")
    heads = read_int(config, "num_attention_heads")
    kv = read_int(config, "num_key_value_heads", heads)
    head = read_int(config, "head_dim", hidden // heads) if config.get("head_dim") \
        else hidden // heads
    vocab, layers = read_int(config, "vocab_size"), read_layers(config)
    attention_bias = read_bool(config, "attention_bias", False)
    qkv_bias = attention_bias if decoder.qkv_bias is None else decoder.qkv_bias
    o_bias = attention_bias and decoder.o_bias_follows
    mlp_bias = decoder.mlp_bias_key and read_bool(config, "mlp_bias", False)
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes = {"self_attn.q_proj": (heads * head, hidden),
                  "self_attn.k_proj": (kv * head, hidden),
                  "self_attn.v_proj": (kv * head, hidden),
                  "self_attn.o_proj": (hidden, heads * head)}
        for name, shape in shapes.items():
            out[f"{p}{name}.weight"] = shape
            if (qkv_bias and not name.endswith("o_proj")) or (o_bias and
                                                              name.endswith("o_proj")):
                out[f"{p}{name}.bias"] = shape[:1]
        if decoder.qk_norm:
            out[f"{p}self_attn.q_norm.weight"] = (head,)
            out[f"{p}self_attn.k_norm.weight"] = (head,)
        for name, shape in (("gate_proj", (inter, hidden)), ("up_proj", (inter, hidden)),
                            ("down_proj", (hidden, inter))):
            out[f"{p}mlp.{name}.weight"] = shape
            if mlp_bias:
                out[f"{p}mlp.{name}.bias"] = shape[:1]
        out[f"{p}input_layernorm.weight"] = (hidden,)
        out[f"{p}post_attention_layernorm.weight"] = (hidden,)
    out["model.norm.weight"] = (hidden,)
    if not read_bool(config, "tie_word_embeddings", False):
        out["lm_head.weight"] = (vocab, hidden)
    return archs[0], out


__all__ = ["DECODERS", "Decoder", "hf_tensors"]
