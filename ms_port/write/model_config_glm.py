"""MindFormers' YAML for GLM-4-9B converted into ``ChatGLM2ForConditionalGeneration``
(``convert --ms-model mindformers:glm4 --model-config FILE.yaml``).

``model.model_config`` is written as MindFormers 2.1's ``configs/glm4/finetune_glm4_9b.yaml``
has it, with every value that makes the checkpoint's network computed from
``config.json`` (either Hugging Face layout): sizes, KV groups, epsilon, rotary ratio,
biases, the layout switches the checkpoint was converted with (``qkv_concat``,
``mlp_concat``, ``use_rearrange_rope``) and ``apply_query_key_layer_scaling`` (true unless
``--ms-option`` says otherwise), without which MindFormers' core attention applies no 1/√d
at all. Device and run settings stay the user's, commented, with the values ms-port tests
the file with on a CPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .model_config import (
    MindFormersYaml,
    _comment,
    _dump,
    _Section,
    _token_id,
    checkpoint_lines,
    finished,
    model_document,
)

#: run settings: the user's (commented), with ms-port's tested CPU values
_RUN = {"use_flash_attention": (False, "true on Ascend (FlashAttentionScore); no CPU kernel"),
        "compute_dtype": ("float32", "bfloat16 on Ascend"),
        "param_init_type": ("float32", "the dtype the weights load in"),
        "layernorm_compute_type": ("float32", None), "rotary_dtype": ("float32", None),
        "use_past": (False, "true: incremental decoding for generation"),
        "seq_length": (2048, "your input length")}


def glm4_yaml(config: dict[str, Any], *, qkv_concat: bool = True, mlp_concat: bool = True,
              use_rearrange_rope: bool = False, apply_query_key_layer_scaling: bool = True,
              checkpoint: str | Path | None = None,
              checkpoint_format: str = "ckpt",
              origin: str = "config.json") -> MindFormersYaml:
    """The YAML for the ``ChatGLM2ForConditionalGeneration`` the config describes.

    Raises:
        TargetError: the config is not GLM-4-9B's (either layout), or a token id is not an
            integer.
    """
    from ..archs.glm.family import glm_sizes

    sizes = glm_sizes(config)
    sizes.require_plain_rope()
    section = _Section({"type": "ChatGLM2Config"})
    section.comment("computed by ms-port from config.json: the checkpoint's network. Change "
                    "these and the checkpoint no longer loads, or computes another function.")
    for key, value in (("num_layers", sizes.layers), ("padded_vocab_size", sizes.vocab),
                       ("hidden_size", sizes.hidden), ("ffn_hidden_size", sizes.ffn),
                       ("kv_channels", sizes.head_dim),
                       ("num_attention_heads", sizes.heads), ("multi_query_attention", True),
                       ("multi_query_group_num", sizes.kv_groups),
                       ("layernorm_epsilon", sizes.eps), ("rope_ratio", sizes.rope_ratio),
                       ("rmsnorm", True), ("post_layer_norm", True),
                       ("apply_residual_connection_post_layernorm", False),
                       ("add_qkv_bias", sizes.qkv_bias), ("add_bias_linear", sizes.dense_bias)):
        section.put(key, value)
    section.put("apply_query_key_layer_scaling", apply_query_key_layer_scaling,
                note="without it MindFormers' core attention (flash attention off) applies "
                "no 1/sqrt(head_dim)")
    section.put("qkv_concat", qkv_concat, note="the checkpoint's layout")
    section.put("mlp_concat", mlp_concat, note="the checkpoint's layout")
    section.put("use_rearrange_rope", use_rearrange_rope, note="the checkpoint's layout: "
                + ("each head's q/k rows as rotary halves" if use_rearrange_rope else
                   "q/k rows in Hugging Face's order"))
    eos = _token_id(config, "eos_token_id", many=True)
    pad = _token_id(config, "pad_token_id")
    if eos is not None:
        section.put("eos_token_id", eos)
    if pad is not None:
        section.put("pad_token_id", pad)
    return finished(
        section, lambda lines, where: _document(config, lines, where, checkpoint_format, origin),
        arch="ChatGLM2ForConditionalGeneration", run=_RUN, checkpoint=checkpoint,
        said="run settings: yours (MindFormers' defaults apply to those left commented). "
             "ms-port tests this file on a CPU in float32 with:")


def _document(config: dict[str, Any], model_lines: list[str], where: Path | None,
              checkpoint_format: str, origin: str) -> list[str]:
    from .. import __version__

    top = [*_comment(f"MindFormers configuration written by ms-port {__version__} from "
                     f"{origin}" + (f" for {where}" if where else "") + "."),
           *_comment("model.model_config and model.arch are computed: they make MindFormers' "
                     "ChatGLM2ForConditionalGeneration (configs/glm4/finetune_glm4_9b.yaml's "
                     "network) the converted checkpoint's network. Everything commented out "
                     "is yours to set (device, dtypes, lengths, parallelism, tokenizer)."),
           "", *_dump("seed", 0), *_dump("run_mode", "finetune"),
           *_dump("use_legacy", True, note="ChatGLM2 is MindFormers' legacy model")]
    return [
        *top,
        *checkpoint_lines(where, checkpoint_format),
        "",
        *model_document("glm4_9b", "ChatGLM2Config", "ChatGLM2ForConditionalGeneration",
                        model_lines),
        *_comment("yours: the tokenizer, e.g."),
        "# processor:",
        "#   tokenizer:",
        "#     type: ChatGLM4Tokenizer",
        "#     vocab_file: /path/to/tokenizer.model",
    ]


__all__ = ["glm4_yaml"]
