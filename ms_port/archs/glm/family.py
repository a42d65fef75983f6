"""MindFormers' ``ChatGLM2ForConditionalGeneration`` (legacy; GLM-4-9B's training network)
as a target, from either Hugging Face layout's ``config.json``.

GLM-4-9B is published in two layouts:

- the ``-hf`` repos, transformers' ``glm`` model (``GlmForCausalLM``): ``hidden_size``,
  ``num_hidden_layers``, ``num_key_value_heads``, ``head_dim``, ``intermediate_size``,
  ``vocab_size``, ``attention_bias``, ``partial_rotary_factor`` 0.5, ``rope_theta``;
- the original remote-code repo (``model_type: chatglm``): ``num_layers``,
  ``multi_query_group_num``, ``kv_channels``, ``ffn_hidden_size``, ``padded_vocab_size``,
  ``add_qkv_bias``, ``add_bias_linear``, ``rope_ratio``.

MindFormers' network (MindFormers 2.1, ``configs/glm4/finetune_glm4_9b.yaml``) names its
parameters ``transformer.embedding.embedding_weight``,
``transformer.encoder.layers.N.{input_layernorm, self_attention.query_key_value,
self_attention.dense, post_attention_layernorm, mlp.dense_h_to_4h, mlp.dense_4h_to_h}``,
``transformer.encoder.final_layernorm``, ``transformer.output_layer``.
``query_key_value`` is plain ``[q; k; v]`` and ``dense_h_to_4h`` ``[gate; up]`` halves; with
``qkv_concat: false`` the network holds ``wq``/``wk``/``wv``, with ``mlp_concat: false``
``dense_left`` (gate) and ``dense_right`` (up). It also declares each layer's paged
attention KV cache (``…infer_attention.paged_attention_mgr.{key,value}_cache``, zeros,
not trained) even with ``use_past`` off. The names and shapes are computed here without
importing MindFormers; ``tests/test_glm.py`` holds them against the real network.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...errors import TargetError, shown
from ...match.mapping import elsewhere
from ...read.targets import Target, TargetTensor
from ..config_values import read_bool, read_float, read_int, read_layers, read_rope

FAMILY = "mindformers:glm4"
#: MindFormers' defaults for the paged attention cache the network declares
NUM_BLOCKS, BLOCK_SIZE = 128, 16


@dataclass(frozen=True)
class GlmSizes:
    """What ChatGLM2Config needs, read from either layout's config."""

    layout: str  # "hf" (transformers' glm) or "remote" (model_type chatglm)
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_groups: int
    head_dim: int
    ffn: int
    eps: float
    qkv_bias: bool
    dense_bias: bool
    rope_ratio: float
    tied: bool
    #: a RoPE scaling the -hf config asks for (ChatGLM2 computes none), else ``None``
    scaling: str | None = None

    def require_plain_rope(self) -> None:
        """Refuse to build or describe a network for a scaled RoPE: MindFormers' ChatGLM2
        has no scaling, so it would compute another function (the weights are right)."""
        if self.scaling:
            raise TargetError(f"config.json: {self.scaling}; MindFormers' ChatGLM2 has no "
                              "RoPE scaling, so its network would compute another function "
                              "(the converted weights do not depend on it and are right)")


def glm_sizes(config: dict[str, Any]) -> GlmSizes:
    """Read the sizes from either layout's config; refuse what the network cannot hold."""
    model_type = config.get("model_type")
    if model_type == "glm":
        heads = read_int(config, "num_attention_heads")
        hidden = read_int(config, "hidden_size")
        rope = read_rope(config)  # top-level keys or transformers 5's rope_parameters
        rope.require_partial(0.5, "MindFormers' ChatGLM2")
        sizes = GlmSizes(
            "hf", read_int(config, "vocab_size"), hidden, read_layers(config), heads,
            read_int(config, "num_key_value_heads", heads),
            read_int(config, "head_dim", max(1, hidden // heads)),
            read_int(config, "intermediate_size"), read_float(config, "rms_norm_eps", 1e-5),
            read_bool(config, "attention_bias", True), False, rope.theta / 10000.0,
            read_bool(config, "tie_word_embeddings", False),
            None if rope.kind == "default" else rope.describe())
    elif model_type == "chatglm":
        heads = read_int(config, "num_attention_heads")
        hidden = read_int(config, "hidden_size")
        layers = read_int(config, "num_layers")
        if layers > 1024:
            raise TargetError(f"config.json: num_layers {layers} is more than any published "
                              "model; check the config")
        groups = (read_int(config, "multi_query_group_num")
                  if read_bool(config, "multi_query_attention", False) else heads)
        bias = read_bool(config, "add_bias_linear", False)
        sizes = GlmSizes(
            "remote", read_int(config, "padded_vocab_size"), hidden, layers, heads, groups,
            read_int(config, "kv_channels", max(1, hidden // heads)),
            read_int(config, "ffn_hidden_size"), read_float(config, "layernorm_epsilon", 1e-5),
            read_bool(config, "add_qkv_bias", False) or bias, bias,
            read_float(config, "rope_ratio", 1.0),
            read_bool(config, "tie_word_embeddings", False))
        if not read_bool(config, "rmsnorm", True):
            raise TargetError("config.json: rmsnorm is false; MindFormers' ChatGLM2 for GLM-4 "
                              "is built with RMSNorm")
        # switches that change the function and no tensor: GLM-4's own values, or refused
        # (the target, its YAML and transformers' glm class compute with these values)
        for key, value in (("apply_residual_connection_post_layernorm", False),
                           ("post_layer_norm", True)):
            if read_bool(config, key, value) != value:
                raise TargetError(
                    f"config.json: {key} is {str(not value).lower()}; GLM-4-9B has it "
                    f"{str(value).lower()}, and ms-port's {FAMILY} target (its YAML, and "
                    "transformers' GlmForCausalLM verify runs it as) computes with "
                    f"{str(value).lower()} — a network with it "
                    f"{str(not value).lower()} is not this family")
    else:
        raise TargetError(f"config.json: model_type {shown(model_type)}; {FAMILY} takes "
                          "GLM-4-9B's configs: 'glm' (the -hf repos) or 'chatglm' (the "
                          "original remote-code repo). GLM-4-0414 ('glm4') is another network"
                          + elsewhere(model_type, FAMILY))
    if sizes.heads % sizes.kv_groups:
        raise TargetError(f"config.json: {sizes.heads} heads in {sizes.kv_groups} KV groups; "
                          "the heads must divide into the groups")
    return sizes


def glm_tensors(sizes: GlmSizes, *, qkv_concat: bool = True,
                mlp_concat: bool = True) -> list[TargetTensor]:
    """The network's parameters in its own order (``parameters_and_names``)."""
    h = sizes.hidden
    q, kv = sizes.heads * sizes.head_dim, sizes.kv_groups * sizes.head_dim
    out: list[TargetTensor] = []

    def add(name: str, shape: tuple[int, ...], layer: str) -> None:
        out.append(TargetTensor(name, shape, "float32", layer, (layer,)))

    add("transformer.embedding.embedding_weight", (sizes.vocab, h), "VocabEmbedding")
    for i in range(sizes.layers):
        p = f"transformer.encoder.layers.{i}"
        add(f"{p}.input_layernorm.weight", (h,), "LlamaRMSNorm")
        attn = f"{p}.self_attention"
        parts = ([("query_key_value", q + 2 * kv)] if qkv_concat else
                 [("wq", q), ("wk", kv), ("wv", kv)])
        for name, rows in parts:
            add(f"{attn}.{name}.weight", (rows, h), "Linear")
            if sizes.qkv_bias:
                add(f"{attn}.{name}.bias", (rows,), "Linear")
        add(f"{attn}.dense.weight", (h, q), "Linear")
        if sizes.dense_bias:
            add(f"{attn}.dense.bias", (h,), "Linear")
        cache = (NUM_BLOCKS, BLOCK_SIZE, sizes.kv_groups, sizes.head_dim)
        for name in ("key_cache", "value_cache"):
            add(f"{attn}.infer_attention.paged_attention_mgr.{name}", cache, "PagedAttentionMgr")
        add(f"{p}.post_attention_layernorm.weight", (h,), "LlamaRMSNorm")
        if mlp_concat:
            add(f"{p}.mlp.dense_h_to_4h.weight", (2 * sizes.ffn, h), "Linear")
        else:
            add(f"{p}.mlp.dense_left.weight", (sizes.ffn, h), "Linear")
            add(f"{p}.mlp.dense_right.weight", (sizes.ffn, h), "Linear")
        if sizes.dense_bias:
            for name, rows in ((("dense_h_to_4h", 2 * sizes.ffn),) if mlp_concat else
                               (("dense_left", sizes.ffn), ("dense_right", sizes.ffn))):
                add(f"{p}.mlp.{name}.bias", (rows,), "Linear")
        add(f"{p}.mlp.dense_4h_to_h.weight", (h, sizes.ffn), "Linear")
        if sizes.dense_bias:
            add(f"{p}.mlp.dense_4h_to_h.bias", (h,), "Linear")
    add("transformer.encoder.final_layernorm.weight", (h,), "LlamaRMSNorm")
    add("transformer.output_layer.weight", (sizes.vocab, h), "Linear")
    return out


#: options ``mindformers:glm4`` takes (``--ms-option KEY=VALUE``): the network's settings
#: that change its layout (MindFormers' defaults: both concats true, use_rearrange_rope
#: false; with it true, each head's q and k rows hold the rotary pairs as halves)
OPTIONS = {"qkv_concat": bool, "mlp_concat": bool, "use_rearrange_rope": bool,
           "apply_query_key_layer_scaling": bool, "seq_length": int}
#: said where a network is built with apply_query_key_layer_scaling false
NO_SCALING = ("apply_query_key_layer_scaling=false: MindFormers' core attention, which runs "
              "where flash attention is off (as on a CPU), then applies no 1/sqrt(head_dim) "
              "at all and computes another function; FlashAttentionScore (Ascend, "
              "use_flash_attention: true) applies its own")
#: the layouts a checkpoint of this family may have, to recognise one by its names
VARIANTS = tuple({"qkv_concat": q, "mlp_concat": m} for q in (True, False)
                 for m in (True, False))


def target(config: dict[str, Any], *, qkv_concat: bool = True, mlp_concat: bool = True,
           use_rearrange_rope: bool = False,
           apply_query_key_layer_scaling: bool = True) -> Target:
    """The target's names and shapes from either layout's config, without MindFormers."""
    sizes = glm_sizes(config)
    if use_rearrange_rope and not qkv_concat and sizes.layout == "remote":
        raise TargetError(
            "mindformers:glm4 with qkv_concat=false and use_rearrange_rope=true has no route "
            "to or from the remote-code layout: its query_key_value would be split and each "
            "part's rows rearranged, which ms-port does not do yet; use qkv_concat=true "
            "(MindFormers' default, as in finetune_glm4_9b.yaml), or the -hf layout "
            "(transformers' glm names)")
    tensors = glm_tensors(sizes, qkv_concat=qkv_concat, mlp_concat=mlp_concat)
    variant = ", ".join([("fused" if qkv_concat else "separate") + " qkv",
                         ("fused" if mlp_concat else "separate") + " gate/up"]
                        + (["rearranged rope"] if use_rearrange_rope else []))
    notes = [f"the network's rotary base is 10000 × rope_ratio = {10000 * sizes.rope_ratio:g} "
             f"over head_dim / 2 = {sizes.head_dim // 2} dimensions"] if sizes.rope_ratio != 1 \
        else []
    notes.append(
        "use_rearrange_rope: each head's q and k rows hold the rotary pairs as halves (even "
        "rows, then odd ones), as MindFormers' convert_weight.py lays them out; a network "
        "built with it false needs the plain layout" if use_rearrange_rope else
        "q and k rows in Hugging Face's order (use_rearrange_rope false); a checkpoint "
        "converted with --ms-option use_rearrange_rope=true needs it here too: names cannot "
        "show that layout")
    if not apply_query_key_layer_scaling:
        notes.append(NO_SCALING)
    if sizes.scaling:
        notes.append(f"{sizes.scaling}: MindFormers' ChatGLM2 has none (the weights do not "
                     "depend on it; --model-config and verify refuse it)")
    return Target("family", f"{FAMILY} ({variant})", {t.name: t for t in tensors},
                  family=FAMILY, notes=notes,
                  settings={"qkv_concat": qkv_concat, "mlp_concat": mlp_concat,
                            "use_rearrange_rope": use_rearrange_rope,
                            "apply_query_key_layer_scaling": apply_query_key_layer_scaling})


#: the blocks, for verify one block at a time (imported only then)
BLOCKS = "ms_port.archs.glm.blocks:glm_blocks"
#: verify's view of a source transformers has no class for (the remote-code layout) as
#: transformers' glm holds it (imported only then)
REFERENCE = "ms_port.archs.glm.remote:as_hf"

#: what MindFormers' ChatGLM2 lacks on a CPU, and what stands in (said in verify's report)
STANDINS = (
    "RMSNorm: the fused RmsNorm kernel has no CPU kernel; MindFormers' own unfused path "
    "(square, mean, rsqrt) is built instead, with the Cast only the fused branch creates",
    "attention mask: uint8 mask × -10000 wraps to +240 on a CPU; the mask is cast to "
    "float32 before the multiply",
    "attention: FlashAttentionScore has no CPU kernel; built with use_flash_attention: "
    "false (MindFormers' CoreAttention, 1/√d applied by apply_query_key_layer_scaling)",
)
#: the stand-in a network built with use_rearrange_rope needs besides
REARRANGED_STANDIN = (
    "rotary embedding (use_rearrange_rope): BatchMatMul of each head by the 2-D swap mask "
    "is refused on a CPU (no broadcast); ops.matmul, which broadcasts, stands in")


def glm_config(config: dict[str, Any], *, qkv_concat: bool = True, mlp_concat: bool = True,
               use_rearrange_rope: bool = False, apply_query_key_layer_scaling: bool = True,
               seq_length: int = 128) -> Any:
    """MindFormers' ``ChatGLM2Config`` for CPU float32 inference of this model."""
    from ..llama.family import contained

    sizes = glm_sizes(config)
    sizes.require_plain_rope()
    with contained():
        try:
            from mindformers.models.glm2 import ChatGLM2Config
        except ImportError:
            raise TargetError(f"{FAMILY} needs MindFormers to build the network: pip install "
                              "--no-deps mindformers==2.1.0 (see docs/development.md)") from None
        return ChatGLM2Config(
            batch_size=1, num_layers=sizes.layers, padded_vocab_size=sizes.vocab,
            hidden_size=sizes.hidden, ffn_hidden_size=sizes.ffn, kv_channels=sizes.head_dim,
            num_attention_heads=sizes.heads, multi_query_attention=True,
            multi_query_group_num=sizes.kv_groups, seq_length=seq_length,
            layernorm_epsilon=sizes.eps, rope_ratio=sizes.rope_ratio, rmsnorm=True,
            add_qkv_bias=sizes.qkv_bias, add_bias_linear=sizes.dense_bias,
            apply_query_key_layer_scaling=apply_query_key_layer_scaling,
            qkv_concat=qkv_concat, mlp_concat=mlp_concat,
            use_rearrange_rope=use_rearrange_rope, use_past=False, use_flash_attention=False,
            param_init_type="float32",
            compute_dtype="float32", layernorm_compute_type="float32",
            rotary_dtype="float32", residual_dtype="float32", hidden_dropout=0.0,
            attention_dropout=0.0)


def build(config: dict[str, Any], **settings: Any) -> Any:
    """The real MindFormers network with the CPU stand-ins (:data:`STANDINS`), in eval
    mode (verify's MindSpore side); ``net.ms_port_notes`` lists the stand-ins.
    ``settings``: :func:`glm_config`'s (:data:`OPTIONS`)."""
    return build_from(glm_config(config, **settings))


def build_from(cfg: Any) -> Any:
    """``ChatGLM2ForConditionalGeneration(cfg)`` with the CPU stand-ins, in eval mode."""
    from ..llama.family import contained

    with contained():
        from mindformers.models.glm2 import (
            ChatGLM2ForConditionalGeneration,
            glm2_modules,
            glm2_transformer,
        )
        from mindspore import ops
        from mindspore.ops import operations as P

        fused = glm2_modules.check_rmsnorm_big_kernel_valid
        glm2_modules.check_rmsnorm_big_kernel_valid = lambda: False
        try:
            net = ChatGLM2ForConditionalGeneration(cfg)
        finally:
            glm2_modules.check_rmsnorm_big_kernel_valid = fused
    for _, cell in net.cells_and_names():
        if isinstance(cell, glm2_modules.ChatGLM2RMSNorm) and not hasattr(cell, "cast"):
            cell.cast = P.Cast()
        if isinstance(cell, glm2_transformer.CoreAttention):
            cell.mul_mask = _float_mask(P.Mul(), ops)
        if isinstance(cell, glm2_modules.ChatGLM2RotaryEmbedding):
            cell.bmm_swap = cell.k_bmm_swap = ops.matmul
    net.set_train(False)
    standins = STANDINS + ((REARRANGED_STANDIN,) if cfg.use_rearrange_rope else ())
    net.ms_port_notes = [f"MindSpore ran MindFormers' ChatGLM2 with CPU stand-ins "
                         f"({len(standins)}): " + "; ".join(standins)]
    if not cfg.apply_query_key_layer_scaling:
        net.ms_port_notes.append(NO_SCALING)
    return net


def _float_mask(mul: Any, ops: Any) -> Any:
    import mindspore as ms

    def multiply(mask: Any, value: Any) -> Any:
        return mul(ops.cast(mask, ms.float32), value)

    return multiply


__all__ = ["FAMILY", "NO_SCALING", "OPTIONS", "REARRANGED_STANDIN", "STANDINS", "VARIANTS",
           "GlmSizes", "build", "build_from", "glm_config", "glm_sizes", "glm_tensors",
           "target"]
