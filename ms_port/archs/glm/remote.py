"""GLM-4-9B's original remote-code layout as transformers' ``glm`` holds it, for verify.

transformers has no class for the remote code (``modeling_chatglm.py``, ``model_type:
chatglm``), so verify cannot build that side from its ``config.json``. The ``-hf`` repos
hold the same model in transformers' ``GlmForCausalLM``: the same weights, with
``query_key_value`` split into ``q_proj``/``k_proj``/``v_proj`` rows and the config's keys
renamed. :func:`as_hf` gives verify that view of a remote-layout source, without copying a
byte: each tensor is read from the source when it is asked for (a split one by its rows).
The derived ``rotary_pos_emb.inv_freq`` is checked against the config, as convert checks
it, and left out (transformers computes its own).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from ...errors import SourceError, shown
from ...read.tensors import Source, TensorInfo

#: remote-code names -> transformers' glm names, per decoder layer (``{i}``) and whole
_LAYER = {"input_layernorm.weight": "input_layernorm.weight",
          "post_attention_layernorm.weight": "post_attention_layernorm.weight",
          "self_attention.dense.weight": "self_attn.o_proj.weight",
          "mlp.dense_h_to_4h.weight": "mlp.gate_up_proj.weight",
          "mlp.dense_4h_to_h.weight": "mlp.down_proj.weight"}
_WHOLE = {"transformer.embedding.word_embeddings.weight": "model.embed_tokens.weight",
          "transformer.encoder.final_layernorm.weight": "model.norm.weight",
          "transformer.output_layer.weight": "lm_head.weight"}
_INV_FREQ = "transformer.rotary_pos_emb.inv_freq"
#: MindFormers' names that differ from the remote code's (all others are the same)
_REMOTE_NAMES = {"transformer.embedding.embedding_weight":
                 "transformer.embedding.word_embeddings.weight"}
_REMOTE_HEAD = "transformer.output_layer.weight"


def remote_tensors(config: dict[str, Any]) -> tuple[str, dict[str, tuple[int, ...]]]:
    """(the class, name -> shape) of the remote-code layout as its repository's files hold
    it: MindFormers' fused network (:func:`~ms_port.archs.glm.family.glm_tensors`, whose names
    are the remote code's) with the embedding's own name, without the paged-attention
    caches MindFormers declares, and without the output layer a tied config leaves out.
    The derived ``rotary_pos_emb.inv_freq`` is the remote code's to compute: not listed."""
    from .family import glm_sizes, glm_tensors

    sizes = glm_sizes(config)
    out = {}
    for t in glm_tensors(sizes, qkv_concat=True, mlp_concat=True):
        name = _REMOTE_NAMES.get(t.name, t.name)
        if "paged_attention_mgr" in name or (sizes.tied and name == _REMOTE_HEAD):
            continue
        out[name] = t.shape
    archs = config.get("architectures")
    cls = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) \
        and archs[0].isidentifier() else "ChatGLMForConditionalGeneration"
    return f"{cls} (remote code)", out


def hf_config(config: dict[str, Any]) -> dict[str, Any]:
    """The remote code's ``config.json`` in transformers' ``GlmConfig`` keys (the values
    the ``-hf`` repos give: rotary base ``10000 × rope_ratio`` over half of each head)."""
    from .family import glm_sizes

    sizes = glm_sizes(config)
    if sizes.dense_bias:
        raise SourceError("config.json: add_bias_linear is true; transformers' "
                          "GlmForCausalLM, which verify runs as the remote code's model, "
                          "has no such biases — verify with --torch-model")
    out = {"model_type": "glm", "architectures": ["GlmForCausalLM"],
           "vocab_size": sizes.vocab, "hidden_size": sizes.hidden,
           "intermediate_size": sizes.ffn, "num_hidden_layers": sizes.layers,
           "num_attention_heads": sizes.heads, "num_key_value_heads": sizes.kv_groups,
           "head_dim": sizes.head_dim, "rms_norm_eps": sizes.eps,
           "attention_bias": sizes.qkv_bias, "partial_rotary_factor": 0.5,
           "rope_theta": 10000.0 * sizes.rope_ratio,
           "tie_word_embeddings": sizes.tied,
           # the remote code's embedding has no padding row (GlmConfig's default is
           # GLM-4's vocabulary's: out of a smaller one)
           "pad_token_id": config.get("pad_token_id")}
    for key in ("eos_token_id", "torch_dtype"):
        if key in config:
            out[key] = config[key]
    length = config.get("seq_length")
    if isinstance(length, int) and not isinstance(length, bool) and length > 0:
        out["max_position_embeddings"] = length
    return out


def as_hf(src: Source) -> tuple[Source, list[str]]:
    """A remote-layout source as transformers' ``glm`` names it (``src`` itself for any
    other), and the note verify's report gives.

    Raises:
        SourceError: a tensor the remote layout has at another shape, a name it does not
            have, or an ``inv_freq`` the config does not imply.
    """
    from ...match.derived import DERIVED, agrees
    from .family import glm_sizes

    config = src.config or {}
    if config.get("model_type") != "chatglm":
        return src, []
    config_hf = hf_config(config)  # what transformers' class cannot hold, refused first
    sizes = glm_sizes(config)
    q, kv = sizes.heads * sizes.head_dim, sizes.kv_groups * sizes.head_dim
    spans = {"q_proj": (0, q), "k_proj": (q, q + kv), "v_proj": (q + kv, q + 2 * kv)}
    tensors: dict[str, TensorInfo] = {}
    for info in src:
        if info.name == _INV_FREQ:
            ok, how = agrees(DERIVED["glm_inv_freq"], np.asarray(info.load()), config)
            if not ok:
                raise SourceError(f"{src.path}: {_INV_FREQ} is not what config.json implies "
                                  f"({how}); check the config belongs to this checkpoint",
                                  path=src.path)
            continue
        name = _hf_name(info.name, src.path)
        if name in tensors or name.replace("query_key_value", "q_proj") in tensors:
            raise SourceError(f"{src.path}: {shown(info.name)} names a tensor another one "
                              "already names (a layer number written twice); check the "
                              "checkpoint", path=src.path)
        if not name.endswith(("query_key_value.weight", "query_key_value.bias")):
            tensors[name] = replace(info, name=name)
            continue
        if not info.shape or info.shape[0] != q + 2 * kv:
            raise SourceError(f"{src.path}: {shown(info.name)} has {info.shape[:1]} rows, "
                              f"config.json implies {q + 2 * kv} (q {q}, k and v {kv} each)",
                              path=src.path)
        for part, (start, stop) in spans.items():
            part_name = name.replace("query_key_value", part)
            tensors[part_name] = TensorInfo(
                part_name, (stop - start, *info.shape[1:]), info.dtype,
                lambda i=info, a=start, b=stop: i.load_rows(a, b))
    note = ("the remote-code layout (model_type chatglm) ran as transformers' "
            "GlmForCausalLM, which transformers has for it (the -hf repos): query_key_value "
            "split into q/k/v rows, the config read as GlmConfig (rope_theta 10000 × "
            f"rope_ratio = {config_hf['rope_theta']:g}, half of each head rotated)")
    return replace(src, tensors=tensors, config=config_hf), [note]


def _hf_name(name: str, path: str) -> str:
    if name in _WHOLE:
        return _WHOLE[name]
    prefix = "transformer.encoder.layers."
    if name.startswith(prefix):
        number, _, rest = name[len(prefix):].partition(".")
        if number.isdigit() and (rest in _LAYER or rest.startswith(
                "self_attention.query_key_value.")):
            hf_rest = _LAYER.get(rest) or "self_attn.query_key_value." + rest.rsplit(".", 1)[1]
            return f"model.layers.{int(number)}.{hf_rest}"
    raise SourceError(f"{path}: {shown(name)} is not a tensor of GLM-4's remote-code layout; "
                      "verify takes its checkpoint as the repository holds it", path=path)


__all__ = ["as_hf", "hf_config", "remote_tensors"]
