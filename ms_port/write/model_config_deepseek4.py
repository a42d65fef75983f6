"""MindFormers' YAML for DeepSeek-V4 converted into its ``DeepseekV4ForCausalLM``
(``convert --ms-model mindformers:deepseek4 --model-config FILE.yaml``).

``model.model_config`` (``type: DeepseekV4Config``) holds every value of the checkpoint's
network computed from ``config.json`` in either layout, under the names MindFormers'
``DeepseekV4Config`` takes, where its own defaults are DeepSeek-V4-Pro's (61 layers, 384
experts, ``routed_scaling_factor`` 2.5, ``index_topk`` 1024, ``compress_ratios`` all 128)
and would build another network from a file that leaves them out. It also sets what
MindFormers' config converter does not: ``qk_layernorm: true`` (without it the network has
no q/kv norms), ``v_head_dim`` (its ``TransformerConfig`` requires it equal to ``head_dim``,
and defaults otherwise), ``moe_grouped_gemm: true`` and ``hidden_act: fusedswiglu`` (MindFormers
clamps the SwiGLU by ``swiglu_limit`` only with that activation; transformers always
clamps). The layers' kinds are written as MindFormers reads them: ``compress_ratios``
(each layer's, then the MTP layer's) and ``num_hash_layers``.

No forward of this network runs here (it needs ``hyper_parallel``): the file is checked to
load back to exactly the values computed, and a test builds MindFormers'
``DeepseekV4Config`` and its ``TransformerConfig`` from it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..archs.config_values import read_bool, read_float, read_int, read_rope
from ..errors import TargetError, shown
from .model_config import (
    MindFormersYaml,
    _comment,
    _dump,
    _positions,
    _Section,
    _token_id,
    checkpoint_lines,
    finished,
    model_document,
)

#: the router's score functions transformers' DeepSeek-V4 computes, which MindFormers names
#: the same
SCORES = ("sqrtsoftplus", "sigmoid", "softmax")
#: the only sliding window MindFormers' fused compressed-attention kernels take
FUSED_WINDOW = 128
#: run settings: the user's (commented)
_RUN = {"compute_dtype": ("bfloat16", None), "params_dtype": ("bfloat16", None),
        "seq_length": (4096, "your input length")}


def _routing(config: dict[str, Any]) -> list[tuple[str, Any]]:
    score = config.get("scoring_func", "sqrtsoftplus")
    if score not in SCORES:
        raise TargetError(f"config.json: scoring_func {shown(score)}; expected one of "
                          f"{', '.join(SCORES)}")
    return [("scoring_func", score),
            ("routed_scaling_factor", read_float(config, "routed_scaling_factor", 1.5)),
            ("norm_topk_prob", read_bool(config, "norm_topk_prob", True)),
            ("index_topk", read_int(config, "index_topk", 512))]


def _compress_scaling(config: dict[str, Any]) -> dict[str, Any] | None:
    """The compressed branches' yarn (MindFormers' ``rope_scaling``), or None."""
    rope = read_rope(config, "compress")
    if rope.kind == "default":
        return None
    if rope.kind != "yarn" or rope.scaling is None:
        raise TargetError(f"config.json: the compressed attention's {rope.describe()}; "
                          "DeepSeek-V4 scales it by yarn only")
    keep = ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow")
    return {"type": "yarn", **{k: rope.scaling[k] for k in keep}}


def deepseek4_yaml(config: dict[str, Any], *, mtp: bool | None = None,
                   checkpoint: str | Path | None = None, checkpoint_format: str = "safetensors",
                   origin: str = "config.json") -> MindFormersYaml:
    """The YAML for the ``DeepseekV4ForCausalLM`` the config describes.

    Raises:
        TargetError: the config is not one MindFormers' DeepSeek-V4 holds, or a value is
            malformed.
    """
    from ..archs.parallel_core.deepseek4 import deepseek4_sizes, mindformers_settings

    sizes = deepseek4_sizes(config, mtp=mtp)
    built = mindformers_settings(config, mtp=mtp)
    section = _Section({"type": "DeepseekV4Config"})
    section.comment("computed by ms-port from config.json: the checkpoint's network "
                    "(MindFormers' defaults are DeepSeek-V4-Pro's). Change these and the "
                    "checkpoint no longer loads, or computes another function.")
    for key, value in (
            ("vocab_size", sizes.vocab), ("hidden_size", sizes.hidden),
            ("num_hidden_layers", sizes.layers),
            ("num_nextn_predict_layers", built["num_nextn_predict_layers"]),
            ("num_attention_heads", sizes.heads), ("num_key_value_heads", 1),
            ("head_dim", sizes.head_dim), ("v_head_dim", sizes.head_dim),
            ("qk_rope_head_dim", built["qk_rope_head_dim"]),
            ("q_lora_rank", sizes.q_lora), ("o_lora_rank", sizes.o_lora),
            ("o_groups", sizes.o_groups), ("moe_intermediate_size", sizes.expert_intermediate),
            ("n_routed_experts", sizes.experts), ("n_shared_experts", sizes.shared),
            ("num_experts_per_tok", sizes.topk), *_routing(config),
            ("index_n_heads", sizes.index_heads), ("index_head_dim", sizes.index_dim),
            ("compress_ratios", built["compress_ratios"]),
            ("num_hash_layers", built["num_hash_layers"]),
            ("sliding_window", read_int(config, "sliding_window", 128)),
            ("hc_mult", sizes.hc), ("hc_sinkhorn_iters", read_int(config, "hc_sinkhorn_iters", 20)),
            ("hc_eps", read_float(config, "hc_eps", 1e-6)),
            ("rms_norm_eps", read_float(config, "rms_norm_eps", 1e-6)),
            ("rope_theta", read_rope(config).theta),
            ("compress_rope_theta", read_rope(config, "compress").theta),
            ("swiglu_limit", read_float(config, "swiglu_limit", 10.0)),
            ("tie_word_embeddings", False)):
        section.put(key, value)
    scaling = _compress_scaling(config)
    if scaling is not None:
        section.put("rope_scaling", scaling)
        # MindFormers' TransformerConfig moves rope_scaling's original length into
        # max_position_embeddings; its compressed attention's yarn reads this one
        section.put("original_max_position_embeddings",
                    scaling["original_max_position_embeddings"],
                    note="read by the compressed attention's yarn")
    positions = _positions(config)
    if positions is not None:
        section.put("max_position_embeddings", positions)
    if section.values["sliding_window"] != FUSED_WINDOW:
        section.put("apply_dsa_kernel_fusion", False, note="MindFormers' fused sparse "
                    f"attention takes a window of {FUSED_WINDOW} only")
    section.put("hidden_act", "fusedswiglu", note="MindFormers clamps by swiglu_limit only "
                "with it, as transformers always does")
    section.put("qk_layernorm", True, note="MindFormers' converter leaves it false: no q/kv "
                "norms")
    section.put("moe_grouped_gemm", True, note="the experts as the checkpoint holds them, 3-D")
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = _token_id(config, key, many=key == "eos_token_id")
        if value is not None:
            section.put(key, value)
    return finished(
        section, lambda lines, where: _document(config, lines, where, checkpoint_format, origin),
        arch="DeepseekV4ForCausalLM", run=_RUN, checkpoint=checkpoint,
        said="run settings: yours (MindFormers' defaults apply to those left commented), e.g.")


def _document(config: dict[str, Any], model_lines: list[str], where: Path | None,
              checkpoint_format: str, origin: str) -> list[str]:
    from .. import __version__

    top = [*_comment(f"MindFormers configuration written by ms-port {__version__} from "
                     f"{origin}" + (f" for {where}" if where else "") + "."),
           *_comment("model.model_config and model.arch are computed: they make MindFormers' "
                     "DeepseekV4ForCausalLM (PyNative; it imports hyper_parallel) the "
                     "converted checkpoint's network. Everything commented out is yours to "
                     "set (device, dtypes, lengths, parallelism, tokenizer)."),
           "", *_dump("seed", 0), *_dump("run_mode", "finetune"),
           *_dump("use_legacy", False, note="DeepSeek-V4 is one of MindFormers' current "
                                            "models")]
    return [
        *top,
        *checkpoint_lines(where, checkpoint_format),
        "",
        *model_document(config.get("model_type"), "DeepseekV4Config", "DeepseekV4ForCausalLM",
                        model_lines),
        *_comment("yours: the tokenizer, e.g."),
        "# processor:",
        "#   tokenizer:",
        "#     type: LlamaTokenizerFast",
        "#     tokenizer_file: /path/to/tokenizer.json",
    ]


__all__ = ["deepseek4_yaml"]
