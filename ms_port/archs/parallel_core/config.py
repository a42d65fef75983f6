"""config.json to MindFormers' parallel_core configuration (Qwen3, Qwen3-MoE, DeepSeek-V3):
what the network is built with on a CPU (:mod:`ms_port.archs.parallel_core.cpu`), every
number read from the config, every setting MindFormers computes otherwise than
transformers refused in one line, and what MindFormers' config then holds checked against
what was asked."""

from __future__ import annotations

import copy
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...errors import TargetError, shown
from ..config_values import read_bool, read_float, read_int, read_layers, read_rope
from ..llama.family import contained
from .deepseek import deepseek_sizes, mindformers_settings
from .family import INTERLEAVED

#: the most decoder layers / experts a config may ask for
MAX_EXPERTS = 4096
# checked readers of config.json values
_int, _float, _bool = read_int, read_float, read_bool


def _dense_settings(config: Mapping[str, Any], *,
                    use_interleaved_weight_layout_mlp: bool = True) -> dict[str, Any]:
    """The architecture keys of MindFormers' ``Qwen3Config``, read from a Hugging Face
    config.json (either transformers' form) and checked; ``linear_fc1`` in the layout the
    checkpoint was converted with (``use_interleaved_weight_layout_mlp``)."""
    heads, hidden = _int(config, "num_attention_heads"), _int(config, "hidden_size")
    kv_heads = _int(config, "num_key_value_heads", heads)
    head_dim = _int(config, "head_dim", max(1, hidden // heads))
    if heads % kv_heads:
        raise TargetError(f"config.json: {heads} attention heads are not a multiple of "
                          f"{kv_heads} KV heads")
    layers = read_layers(config)
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise TargetError(f"config.json: hidden_act {shown(act)}; MindFormers' Qwen3 computes "
                          "SiLU")
    if _bool(config, "use_sliding_window"):
        raise TargetError("config.json: use_sliding_window is true; MindFormers' Qwen3 "
                          "ignores it, so its network would compute another function")
    if _bool(config, "attention_bias"):
        raise TargetError("config.json: attention_bias is true; MindFormers' Qwen3 would give "
                          "q/k/v biases but no o_proj bias (its add_bias_linear is false)")
    rope = read_rope(config)
    rope.require_partial(1.0, "MindFormers' Qwen3")
    if rope.kind != "default":
        raise TargetError(f"config.json: {rope.describe()}; ms-port runs MindFormers' "
                          "parallel_core networks with plain RoPE only")
    return {
        "vocab_size": _int(config, "vocab_size"), "hidden_size": hidden,
        "intermediate_size": _int(config, "intermediate_size"),
        "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "head_dim": head_dim,
        "rms_norm_eps": _float(config, "rms_norm_eps", 1e-6), "rope_theta": rope.theta,
        "attention_bias": False,
        "tie_word_embeddings": _bool(config, "tie_word_embeddings"),
        INTERLEAVED: use_interleaved_weight_layout_mlp}


def _moe_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`_dense_settings` plus the MoE keys of MindFormers' ``Qwen3MoeConfig``.
    transformers 5 writes ``num_local_experts`` where the Hub's files say ``num_experts``;
    ``Qwen3MoeConfig(**config)`` would silently take its default of 128."""
    settings = _dense_settings(config)
    key = "num_experts" if config.get("num_experts") is not None else "num_local_experts"
    experts = _int(config, key)
    if experts > MAX_EXPERTS:
        raise TargetError(f"config.json: {key} {experts} is more than {MAX_EXPERTS}")
    top_k = _int(config, "num_experts_per_tok")
    if top_k > experts:
        raise TargetError(f"config.json: num_experts_per_tok {top_k} is more than the "
                          f"{experts} experts")
    if _int(config, "decoder_sparse_step", 1) != 1 or config.get("mlp_only_layers"):
        raise TargetError("config.json: decoder_sparse_step / mlp_only_layers make some layers "
                          "dense; MindFormers' Qwen3-MoE has experts in every layer")
    return {**settings, "num_experts": experts, "num_experts_per_tok": top_k,
            "moe_intermediate_size": _int(config, "moe_intermediate_size"),
            # transformers' default; MindFormers' TransformerConfig defaults to true
            "norm_topk_prob": _bool(config, "norm_topk_prob", False)}


def _deepseek_rope(config: Mapping[str, Any]) -> tuple[float, dict[str, Any]]:
    """The rotary base, and the keys of ``DeepseekV3Config`` that give MindFormers' MLA
    the rotary embedding and softmax scale transformers computes (plain RoPE or yarn)."""
    rope = read_rope(dict(config))
    rope.require_partial(1.0, "MindFormers' MLA (over qk_rope_head_dim)")
    if rope.kind == "default":
        # MLA scales its softmax by _yarn_get_mscale(rotary_scaling_factor, mscale)**2
        # whatever the embedding; MLATransformerConfig's default factor (40) would do so
        return rope.theta, {"rotary_scaling_factor": 1.0}
    if rope.kind != "yarn" or rope.problem or rope.scaling is None:
        raise TargetError(f"config.json: {rope.describe()}; ms-port runs MindFormers' "
                          "DeepSeek-V3 with plain RoPE or yarn only")
    s = rope.scaling
    if s["factor"] > 1 and s["mscale"] != s["mscale_all_dim"]:
        # MindFormers multiplies the rotary angles by mscale/mscale_all_dim where
        # transformers multiplies cos and sin, and squares mscale for the softmax where
        # transformers squares mscale_all_dim: the same function only when they are equal
        raise TargetError(f"config.json: {rope.key}: yarn with mscale {s['mscale']:g} and "
                          f"mscale_all_dim {s['mscale_all_dim']:g} (both must be set, and "
                          "equal, as DeepSeek-V3's 1.0 and 1.0 are); MindFormers' MLA computes "
                          "another function otherwise")
    return rope.theta, {"rope_scaling": {
        "type": "yarn", "factor": s["factor"],
        "original_max_position_embeddings": s["original_max_position_embeddings"],
        "beta_fast": s["beta_fast"], "beta_slow": s["beta_slow"], "mscale": s["mscale"],
        "mscale_all_dim": s["mscale_all_dim"]}}


def _deepseek_routing(config: Mapping[str, Any], experts: int) -> dict[str, Any]:
    """The router's keys, checked where MindFormers' ``TopKRouter`` and transformers'
    ``DeepseekV3TopkRouter`` part ways."""
    for key, computed in (("topk_method", "noaux_tc"), ("scoring_func", "sigmoid")):
        value = config.get(key)
        if value is not None and value != computed:
            raise TargetError(f"config.json: {key} {shown(value)}; transformers' DeepSeek-V3 "
                              f"computes {computed} routing whatever the config says, so its "
                              "network and its config disagree")
    top_k = _int(config, "num_experts_per_tok", 8)
    groups = _int(config, "n_group", 8)
    chosen_groups = _int(config, "topk_group", 4)
    norm = _bool(config, "norm_topk_prob", True)
    if top_k > experts:
        raise TargetError(f"config.json: num_experts_per_tok {top_k} is more than the "
                          f"{experts} experts")
    if experts % groups or chosen_groups > groups:
        raise TargetError(f"config.json: n_routed_experts {experts}, n_group {groups}, "
                          f"topk_group {chosen_groups}: the experts must split into n_group "
                          "equal groups, of which topk_group are chosen")
    if groups > 1 and (experts // groups < 2 or top_k != 2 * chosen_groups):
        # transformers scores a group by its best two experts, MindFormers by its best
        # num_experts_per_tok // topk_group
        raise TargetError(f"config.json: num_experts_per_tok {top_k}, topk_group "
                          f"{chosen_groups}, {experts // groups} experts a group; MindFormers "
                          "scores a group by its best num_experts_per_tok / topk_group experts, "
                          "transformers by its best two: the same only where that is two")
    if top_k == 1 and norm:
        raise TargetError("config.json: num_experts_per_tok 1 with norm_topk_prob; "
                          "transformers normalises the one weight to 1, MindFormers keeps the "
                          "score")
    return {"topk_method": "noaux_tc", "n_group": groups, "topk_group": chosen_groups,
            "num_experts_per_tok": top_k, "norm_topk_prob": norm,
            "routed_scaling_factor": _float(config, "routed_scaling_factor", 2.5)}


def _deepseek_settings(config: Mapping[str, Any], *, mla_qkv_concat: bool = True,
                       mtp: bool | None = None,
                       use_interleaved_weight_layout_mlp: bool = True) -> dict[str, Any]:
    """The keys of MindFormers' ``DeepseekV3Config``, read from a Hugging Face config.json
    and checked, for the layout the checkpoint was converted with (``mla_qkv_concat``;
    ``mtp``: with the Multi-Token Prediction layer, default the config's)."""
    sizes = deepseek_sizes(dict(config), mtp=mtp)  # the sizes, and what the layout refuses
    kv_heads = _int(config, "num_key_value_heads", sizes.heads)
    if kv_heads != sizes.heads:
        raise TargetError(f"config.json: num_key_value_heads {kv_heads} where "
                          f"num_attention_heads is {sizes.heads}; multi-latent attention gives "
                          "every head its own key and value (transformers' repeat_kv would "
                          "then fail)")
    theta, rope = _deepseek_rope(config)
    return {
        "vocab_size": sizes.vocab, "hidden_size": sizes.hidden,
        "intermediate_size": sizes.intermediate,
        "moe_intermediate_size": sizes.expert_intermediate,
        "num_hidden_layers": sizes.layers, "num_attention_heads": sizes.heads,
        "num_key_value_heads": kv_heads, "n_shared_experts": sizes.shared,
        "n_routed_experts": sizes.experts, "q_lora_rank": sizes.q_lora,
        "kv_lora_rank": sizes.kv_lora, "qk_nope_head_dim": sizes.nope,
        "qk_rope_head_dim": sizes.rope_dim, "v_head_dim": sizes.v_dim,
        "first_k_dense_replace": sizes.dense, "moe_layer_freq": 1, "hidden_act": "silu",
        "rms_norm_eps": _float(config, "rms_norm_eps", 1e-6), "rope_theta": theta,
        "attention_bias": False,
        # MindFormers' training network keeps its own head either way (the checkpoint's
        # output_layer is then a copy of the embedding)
        "tie_word_embeddings": _bool(config, "tie_word_embeddings"),
        **_deepseek_routing(config, sizes.experts), **rope,
        # qk_layernorm, mla_qkv_concat, num_nextn_predict_layers, moe_grouped_gemm
        **mindformers_settings(
            dict(config), mla_qkv_concat=mla_qkv_concat, mtp=mtp,
            use_interleaved_weight_layout_mlp=use_interleaved_weight_layout_mlp)}


#: run settings: float32 throughout, no dropout, no token masked as padding (MindFormers
#: hides its pad id from attention, transformers does not)
RUN_SETTINGS: dict[str, Any] = {
    "compute_dtype": "float32", "params_dtype": "float32",
    "layernorm_compute_dtype": "float32", "rotary_dtype": "float32",
    "softmax_compute_dtype": "float32", "hidden_dropout": 0.0, "attention_dropout": 0.0,
    "pad_token_id": -1}

#: MoE run settings: the grouped-GEMM experts (the only ones MindFormers builds) and a
#: scaling factor of 1 (GRAPH mode cannot multiply by its default, None)
MOE_RUN_SETTINGS: dict[str, Any] = {
    "moe_grouped_gemm": True, "moe_router_topk_scaling_factor": 1.0}

#: TransformerConfig field -> the settings key whose value it must hold
_HELD = {"vocab_size": "vocab_size", "hidden_size": "hidden_size",
         "ffn_hidden_size": "intermediate_size", "num_layers": "num_hidden_layers",
         "num_attention_heads": "num_attention_heads",
         "num_query_groups": "num_key_value_heads", "kv_channels": "head_dim",
         "layernorm_epsilon": "rms_norm_eps", "rotary_base": "rope_theta",
         "add_qkv_bias": "attention_bias", "pad_token_id": "pad_token_id",
         "hidden_dropout": "hidden_dropout", "attention_dropout": "attention_dropout",
         "seq_length": "seq_length",
         INTERLEAVED: INTERLEAVED}
_MOE_HELD = {"num_moe_experts": "num_experts", "moe_router_topk": "num_experts_per_tok",
             "moe_ffn_hidden_size": "moe_intermediate_size", "norm_topk_prob": "norm_topk_prob",
             "moe_router_topk_scaling_factor": "moe_router_topk_scaling_factor"}
_DEEPSEEK_HELD = {
    **{k: v for k, v in _HELD.items() if k != "kv_channels"},
    "num_moe_experts": "n_routed_experts", "moe_router_topk": "num_experts_per_tok",
    "moe_ffn_hidden_size": "moe_intermediate_size", "norm_topk_prob": "norm_topk_prob",
    "moe_router_topk_scaling_factor": "routed_scaling_factor",
    "moe_router_num_groups": "n_group", "moe_router_group_topk": "topk_group",
    "shared_expert_num": "n_shared_experts", "first_k_dense_replace": "first_k_dense_replace",
    "q_lora_rank": "q_lora_rank", "kv_lora_rank": "kv_lora_rank",
    "qk_head_dim": "qk_nope_head_dim", "qk_pos_emb_head_dim": "qk_rope_head_dim",
    "v_head_dim": "v_head_dim", "mtp_num_layers": "num_nextn_predict_layers",
    "qk_layernorm": "qk_layernorm", "mla_qkv_concat": "mla_qkv_concat",
    "moe_grouped_gemm": "moe_grouped_gemm", "hidden_act": "hidden_act",
    INTERLEAVED: INTERLEAVED,
    "rotary_scaling_factor": "rotary_scaling_factor"}

#: TransformerConfig fields the stand-ins and this module assume, and their values
_ASSUMED = {"normalization": "RMSNorm", "gated_linear_unit": True, "add_bias_linear": False,
            "position_embedding_type": "rope", "use_flash_attention": True,
            "input_layout": "BNSD", "sparse_mode": 0, "window_size": None,
            "multi_latent_attention": False, "use_eod_reset": False,
            "use_attn_mask_compression": False, "apply_rope_fusion": False}
_MOE_ASSUMED = {"moe_permute_fusion": False, "moe_router_enable_expert_bias": False,
                "moe_router_score_function": "softmax",
                "moe_token_dispatcher_type": "alltoall",
                "moe_shared_expert_intermediate_size": None}
_DEEPSEEK_ASSUMED = {
    **_ASSUMED, **_MOE_ASSUMED, "multi_latent_attention": True,
    # sigmoid scores, the correction bias added for the choice only (noaux_tc)
    "moe_router_enable_expert_bias": True, "moe_router_score_function": "sigmoid",
    "moe_router_force_expert_balance": False, "use_shared_expert_gating": False,
    "rotary_interleaved": False, "experimental_attention_variant": None,
    "calculate_per_token_loss": False}


def _qwen3_expected(settings: Mapping[str, Any]) -> dict[str, Any]:
    """What the ``TransformerConfig`` of a Qwen3 / Qwen3-MoE network must hold."""
    moe = "num_experts" in settings
    held = {**_HELD, **(_MOE_HELD if moe else {})}
    return {**{f: settings[k] for f, k in held.items() if k in settings}, **_ASSUMED,
            **(_MOE_ASSUMED if moe else {})}


#: DeepSeek-V3.2's sparse attention (DSA): what its ``MLATransformerConfig`` must hold
_DSA_HELD = {"experimental_attention_variant": "experimental_attention_variant",
             "dsa_indexer_n_heads": "dsa_indexer_n_heads",
             "dsa_indexer_head_dim": "dsa_indexer_head_dim",
             "dsa_indexer_topk": "dsa_indexer_topk"}
#: the indexer's dense path (its scores and top-k by plain ops, BSND), which the stand-ins
#: replace; the sparse path is a fused Ascend kernel
_DSA_ASSUMED = {"dsa_indexer_use_sparse_loss": False, "dsa_index_topk_freq": 1,
                "dsa_indexer_types": None, "input_layout": "BSND"}


def _deepseek_expected(settings: Mapping[str, Any]) -> dict[str, Any]:
    """What the ``MLATransformerConfig`` of a DeepSeek-V3 (or V3.2) network must hold (its
    ``rope_scaling`` is spread over the fields it names)."""
    expected = {f: settings[k] for f, k in _DEEPSEEK_HELD.items() if k in settings}
    expected.update(_DEEPSEEK_ASSUMED)
    if settings.get("experimental_attention_variant") == "dsa":
        expected.update({f: settings[k] for f, k in _DSA_HELD.items()}, **_DSA_ASSUMED)
    expected["moe_shared_expert_intermediate_size"] = (
        settings["n_shared_experts"] * settings["moe_intermediate_size"])
    yarn = settings.get("rope_scaling")
    if yarn:
        expected.update({"position_embedding_type": "yarn",
                         "rotary_scaling_factor": yarn["factor"],
                         "max_position_embeddings": yarn["original_max_position_embeddings"],
                         **{k: yarn[k] for k in ("beta_fast", "beta_slow", "mscale",
                                                 "mscale_all_dim")}})
    return expected


@dataclass(frozen=True)
class Family:
    """A model type MindFormers builds as a parallel_core training network.

    Attributes:
        model_type: config.json's ``model_type``.
        config_class, network_class: MindFormers' classes, ``module:name``.
        settings: config.json (and ``options``) -> the config class's keys, checked.
        run_settings: the keys that make it a float32 CPU inference run.
        expected: settings -> what the converted ``TransformerConfig`` must hold.
        model_config_keys: settings the network reads from the config class itself.
        options: the options a checkpoint of this family was converted with, and their
            types (the ``--ms-option`` keys the network's layout depends on).
    """

    model_type: str
    config_class: str
    network_class: str
    settings: Callable[..., dict[str, Any]]
    run_settings: Mapping[str, Any]
    expected: Callable[[Mapping[str, Any]], dict[str, Any]]
    model_config_keys: tuple[str, ...] = ()
    options: Mapping[str, type] = field(default_factory=dict)


FAMILIES: dict[str, Family] = {f.model_type: f for f in (
    # TrainingQwen3ForCausalLM: rotary_base=config.rope_theta,
    # share_embeddings_and_output_weights=config.tie_word_embeddings
    Family("qwen3", "mindformers.models.qwen3.configuration_qwen3:Qwen3Config",
           "mindformers.models.qwen3.modeling_qwen3_train:TrainingQwen3ForCausalLM",
           _dense_settings, RUN_SETTINGS, _qwen3_expected,
           ("rope_theta", "tie_word_embeddings"),
           options={INTERLEAVED: bool}),
    Family("qwen3_moe", "mindformers.models.qwen3_moe.configuration_qwen3_moe:Qwen3MoeConfig",
           "mindformers.models.qwen3_moe.modeling_qwen3_moe_train:TrainingQwen3MoeForCausalLM",
           _moe_settings, {**RUN_SETTINGS, **MOE_RUN_SETTINGS}, _qwen3_expected,
           ("rope_theta", "tie_word_embeddings")),
    # its router scales by routed_scaling_factor itself (moe_router_topk_scaling_factor);
    # DeepSeek-V3.2 is the same network with experimental_attention_variant: dsa
    *(Family(model_type, "mindformers.models.deepseek3.configuration_deepseek_v3:"
             "DeepseekV3Config",
             "mindformers.models.deepseek3.modeling_deepseek_v3_train:"
             "TrainingDeepseekV3ForCausalLM",
             _deepseek_settings, {**RUN_SETTINGS, "moe_grouped_gemm": True},
             _deepseek_expected,
             options={"mla_qkv_concat": bool, "mtp": bool, INTERLEAVED: bool})
      for model_type in ("deepseek_v3", "deepseek_v32")),
)}


def family_of(config: Mapping[str, Any]) -> Family:
    model_type = config.get("model_type")
    family = FAMILIES.get(model_type) if isinstance(model_type, str) else None
    if family is None:
        raise TargetError(f"config.json: model_type {shown(model_type)}; MindFormers' "
                          f"parallel_core networks ms-port runs: {', '.join(FAMILIES)}")
    return family


def _options(family: Family, options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The layout options ``family`` takes, checked; ``seq_length`` (the run's length,
    given on its own) is passed over."""
    given = {k: v for k, v in (options or {}).items() if k != "seq_length"}
    for key, value in given.items():
        kind = family.options.get(key)
        if kind is None:
            raise TargetError(f"{family.model_type} takes no option {key!r}; it takes "
                              f"{', '.join(family.options) or 'none'}")
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise TargetError(f"{family.model_type} option {key}={value!r}: expected "
                              f"{kind.__name__}")
    return given


def import_spec(spec: str) -> Any:
    module, _, name = spec.partition(":")
    with contained():
        return getattr(importlib.import_module(module), name)


def _same(held: Any, want: Any) -> bool:
    if isinstance(want, float) and not isinstance(held, bool):
        return isinstance(held, (int, float)) and abs(held - want) <= 1e-12 * abs(want)
    return bool(held == want)


def _check_held(mf_config: Any, settings: Mapping[str, Any], family: Family) -> None:
    """MindFormers' model config and the ``TransformerConfig`` it converts to hold what
    ms-port set, and what the stand-ins assume."""
    import mindspore as ms

    for key in family.model_config_keys:
        held = getattr(mf_config, key, "<absent>")
        if not _same(held, settings[key]):
            raise TargetError(f"MindFormers' {type(mf_config).__name__} holds {key}="
                              f"{shown(held)} where ms-port set {shown(settings[key])}")
    with contained():
        transformer = mf_config.convert_to_transformer_config()
    expected = family.expected(settings)
    expected["compute_dtype"] = expected["params_dtype"] = ms.float32
    for name, want in expected.items():
        held = getattr(transformer, name, "<absent>")
        if not _same(held, want):
            raise TargetError(f"MindFormers' TransformerConfig holds {name}={shown(held)} where "
                              f"ms-port set {shown(want)}; its config conversion changed, "
                              "so its network would not be the checkpoint's")


def network_config(config: Mapping[str, Any], *, seq_length: int,
                   options: Mapping[str, Any] | None = None) -> Any:
    """MindFormers' config (``Qwen3Config``, ``Qwen3MoeConfig``, ``DeepseekV3Config``) for
    the model a Hugging Face config.json describes, float32 inference of ``seq_length``
    tokens on a CPU, in the layout the checkpoint was converted with (``options``: for
    DeepSeek-V3 ``mla_qkv_concat`` and ``mtp``; a ``seq_length`` there is passed over).

    Every key is mapped here, not by ``Qwen3MoeConfig(**config)`` (which misreads
    transformers 5's ``num_local_experts`` and ``rope_parameters``), and the
    ``TransformerConfig`` MindFormers converts it to is checked against what was meant.

    Raises:
        TargetError: a model type, key, value or option MindFormers' network cannot
            compute exactly; or a converted config that does not hold what was set.
    """
    family = family_of(config)
    if not isinstance(seq_length, int) or isinstance(seq_length, bool) or seq_length < 1:
        raise TargetError(f"seq_length {shown(seq_length)}: a positive integer")
    settings = family.settings(config, **_options(family, options))
    # MindFormers' rotary table is computed for the run's length; its own limit must allow it
    positions = max(seq_length, _int(config, "max_position_embeddings", seq_length))
    settings.update(family.run_settings, seq_length=seq_length,
                    max_position_embeddings=positions)
    config_class = import_spec(family.config_class)
    with contained():
        mf_config = config_class(**copy.deepcopy(settings))  # MindFormers pops rope_scaling
    _check_held(mf_config, settings, family)
    return mf_config


__all__ = ["FAMILIES", "MAX_EXPERTS", "MOE_RUN_SETTINGS", "RUN_SETTINGS", "Family",
           "network_config"]
