"""``mindformers:deepseek3``: MindFormers 2.1's parallel_core DeepSeek-V3 training network
(``TrainingDeepseekV3ForCausalLM``) as a target, computed from a Hugging Face ``config.json``
without importing MindFormers; names are ``Parameter.name``, as its checkpoints store them.

A test builds the real network under ``no_init_parameters`` in every layout below and holds
these lists against it. Per decoder layer ``i`` (``decoder.layers.i``):

- ``input_layernorm``, ``pre_mlp_layernorm``; ``self_attention.linear_proj`` (``o_proj``);
- Multi-head Latent Attention, in one of two layouts (``mla_qkv_concat``):

  - ``true`` (MindFormers' default, ``MLASelfAttentionConcatenated``): ``linear_qkv`` =
    ``[q_a_proj; kv_a_proj_with_mqa]`` rows, a plain concatenation (the network splits its
    output into ``q_lora_rank``, ``kv_lora_rank`` and ``qk_rope_head_dim`` rows, in that
    order, as Hugging Face splits ``kv_a_proj_with_mqa``'s), ``linear_qb`` (``q_b_proj``),
    ``linear_kvb`` (``kv_b_proj``), ``q_layernorm`` (``q_a_layernorm``), ``k_layernorm``
    (``kv_a_layernorm``);
  - ``false`` (``MLASelfAttention``, MindFormers' own DeepSeek-V3 recipes): one tensor each,
    ``linear_q_down_proj``, ``linear_q_up_proj``, ``linear_kv_down_proj``,
    ``linear_kv_up_proj``, ``q_layernorm``, ``kv_layernorm``;

- the first ``first_k_dense_replace`` layers: ``mlp.linear_fc1`` (gate and up rows
  interleaved, ``MLPInterleaved``) and ``mlp.linear_fc2``; the others a mixture of experts:
  ``mlp.router.weight`` (``mlp.gate.weight``), ``router.expert_bias``
  (``gate.e_score_correction_bias``), the buffers ``router.expert_load`` and
  ``router.fi_accu`` (zeros, as a fresh router holds them), ``experts.weight1`` (per expert
  ``[gate_eᵀ | up_eᵀ]``, experts stacked) and ``experts.weight2`` (``down_eᵀ`` stacked),
  ``shared_experts.linear_fc1`` (gate and up interleaved, ``SharedExpertMLPInterleaved``) and
  ``shared_experts.linear_fc2``;

then ``decoder.final_layernorm``; with Multi-Token Prediction (``mtp``: the config's
``num_nextn_predict_layers``), ``mtp.layers.0``: ``enorm``, ``hnorm``, ``eh_proj``, a
``transformer_layer`` laid out as the last decoder layer, and ``final_layernorm`` (the Hub
stores it as ``model.layers.{num_hidden_layers}``, with ``shared_head.norm`` and copies of
the embedding and the head, which MindFormers shares); ``output_layer`` last.

MindFormers' config converter sets no ``qk_layernorm`` from a Hugging Face config: built from
``config.json`` alone, its network has no q/kv norms and computes another function. This
target is the network built with ``qk_layernorm: True``, as MindFormers' own DeepSeek-V3
recipes build it (:func:`mindformers_settings` lists what the network needs).

verify runs that network on a CPU (``FORWARD``: :mod:`ms_port.archs.parallel_core.cpu`,
GRAPH mode with stand-ins for the kernels a CPU lacks), in the layout the checkpoint was
converted with (``--ms-option mla_qkv_concat=…``, ``mtp=…``), and holds its logits to
transformers' ``DeepseekV3ForCausalLM``'s: 6e-7 relative on tiny models. The MTP layer is
loaded, not run (it gives only a training loss); its tensors are proven one by one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ...errors import TargetError, shown
from ...match.mapping import elsewhere, families_for, select_table, selected_model_types
from ...read.targets import Target, TargetTensor
from ..config_values import Rope, read_bool, read_int, read_layers, read_rope
from .family import INTERLEAVED, NO_FORWARD, RANK_FORMAT, mlp_note

FAMILY = "mindformers:deepseek3"
#: DeepSeek-V3.2: DeepSeek-V3 with DeepSeek Sparse Attention (a lightning indexer in every
#: layer), which MindFormers 2.1 trains as the same network with
#: ``experimental_attention_variant: dsa``
DSA_FAMILY = "mindformers:deepseek32"
#: what transformers' and MindFormers' DeepseekV3Config both assume where config.json is
#: silent (DeepSeek-V3's own sizes); the general ones (hidden_size, ...) must be stated
DEFAULTS = {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 256,
            "moe_intermediate_size": 2048, "n_shared_experts": 1, "first_k_dense_replace": 3,
            "num_nextn_predict_layers": 1}
#: the largest size a config may state (a sanity bound, far above any published model)
MAX_SIZE = 1 << 24


@dataclass(frozen=True)
class IndexerSizes:
    """DeepSeek-V3.2's lightning indexer (DSA), read from a Hugging Face config."""

    heads: int
    head_dim: int
    topk: int


#: transformers' DeepseekV32Config defaults, which a config.json may leave out
INDEXER_DEFAULTS = {"index_n_heads": 64, "index_head_dim": 128, "index_topk": 2048}
#: what MindFormers 2.1's DSA builds (its MLATransformerConfig refuses anything else)
DSA_SIZES = {"kv_lora_rank": 512, "qk_rope_head_dim": 64, "index_n_heads": 64,
             "index_head_dim": 128}


@dataclass(frozen=True)
class DeepseekSizes:
    """What MindFormers' DeepSeek-V3 network needs, read from a Hugging Face config."""

    vocab: int
    hidden: int
    layers: int
    heads: int
    q_lora: int
    kv_lora: int
    nope: int
    rope_dim: int
    v_dim: int
    intermediate: int
    experts: int
    expert_intermediate: int
    shared: int
    dense: int
    mtp: int
    rope: Rope
    family: str = FAMILY
    #: DeepSeek-V3.2's indexer (None: DeepSeek-V3)
    indexer: IndexerSizes | None = None

    @property
    def q_head(self) -> int:
        return self.nope + self.rope_dim


def _size(config: dict[str, Any], key: str, *, least: int = 1,
          defaults: dict[str, int] = DEFAULTS) -> int:
    """``key``'s integer through the one config reader, DeepSeek-V3's own default where
    config.json is silent (what transformers' and MindFormers' configs both assume)."""
    return read_int(config, key, defaults.get(key), least=least, most=MAX_SIZE)


def family_of_config(config: dict[str, Any]) -> str:
    """The DeepSeek target a config's ``model_type`` converts into, as the shipped table
    pairs them (DeepSeek-V3's where it is neither)."""
    found = families_for(config.get("model_type"))
    return next((f for f in (DSA_FAMILY, FAMILY) if f in found), FAMILY)


def _indexer(config: dict[str, Any]) -> IndexerSizes:
    """DeepSeek-V3.2's indexer sizes, refused where MindFormers' DSA cannot build them."""
    sizes = {k: _size(config, k, defaults={**DEFAULTS, **INDEXER_DEFAULTS})
             for k in (*INDEXER_DEFAULTS, "kv_lora_rank", "qk_rope_head_dim")}
    off = {k: sizes[k] for k, v in DSA_SIZES.items() if sizes[k] != v}
    if off:
        raise TargetError(
            "config.json: " + ", ".join(f"{k} {v}" for k, v in off.items())
            + "; MindFormers 2.1's DeepSeek Sparse Attention builds only "
            + ", ".join(f"{k} {v}" for k, v in DSA_SIZES.items())
            + " (its MLATransformerConfig refuses other sizes)")
    return IndexerSizes(sizes["index_n_heads"], sizes["index_head_dim"], sizes["index_topk"])


def refuse_other_family(config: dict[str, Any], family: str) -> None:
    """Refuse, in one line, a config whose model_type no shipped table takes into
    ``family``, naming the target that takes it."""
    model_type = config.get("model_type")
    if select_table(config, (family,)) is None:
        raise TargetError(f"config.json: model_type {shown(model_type)} is not one {family} "
                          f"holds: the mapping tables in mappings/ take "
                          f"{', '.join(selected_model_types(family)) or 'none'}"
                          + elsewhere(model_type, family))


def deepseek_sizes(config: dict[str, Any], *, mtp: bool | None = None,
                   family: str | None = None) -> DeepseekSizes:
    """Read the sizes for ``family`` (default: the one the config's ``model_type`` names);
    refuse, in one line, what MindFormers' network cannot hold."""
    family = family or family_of_config(config)
    refuse_other_family(config, family)
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise TargetError(f"config.json: hidden_act {shown(act)}; MindFormers' DeepSeek-V3 "
                          "computes SiLU")
    if config.get("attention_bias"):
        raise TargetError("config.json: attention_bias is set; Hugging Face then gives "
                          "q_a_proj, kv_a_proj_with_mqa and o_proj biases, MindFormers' "
                          "add_qkv_bias gives linear_qkv, linear_qb and linear_kvb ones: it "
                          "cannot hold this model")
    if not read_bool(config, "rope_interleave", True):
        raise TargetError("config.json: rope_interleave is false; MindFormers' MLA always "
                          "de-interleaves the rotary dimensions (as Hugging Face does with "
                          "rope_interleave true), so it computes another function")
    freq = config.get("moe_layer_freq", 1)
    if freq != 1:
        raise TargetError(f"config.json: moe_layer_freq {shown(freq)}; transformers and "
                          "MindFormers (with first_k_dense_replace) make every layer after "
                          "the first dense ones a mixture of experts")
    layers = read_layers(config)
    if "q_lora_rank" in config and config["q_lora_rank"] is None:
        raise TargetError("config.json: q_lora_rank is null (one q_proj, as DeepSeek-V2-Lite and "
                          "Moonlight have); mindformers:deepseek3 takes the low-rank query of "
                          "DeepSeek-V3 (q_a_proj, q_b_proj) only, for now")
    sizes = DeepseekSizes(
        vocab=_size(config, "vocab_size"), hidden=_size(config, "hidden_size"), layers=layers,
        heads=_size(config, "num_attention_heads"),
        q_lora=_size(config, "q_lora_rank"),
        kv_lora=_size(config, "kv_lora_rank"), nope=_size(config, "qk_nope_head_dim"),
        rope_dim=_size(config, "qk_rope_head_dim"), v_dim=_size(config, "v_head_dim"),
        intermediate=_size(config, "intermediate_size"),
        experts=_size(config, "n_routed_experts"),
        expert_intermediate=_size(config, "moe_intermediate_size"),
        shared=_size(config, "n_shared_experts"),
        dense=_size(config, "first_k_dense_replace", least=0),
        # transformers' DeepseekV32Config has no MTP count, and its files no MTP layer
        mtp=_size(config, "num_nextn_predict_layers", least=0,
                  defaults={**DEFAULTS, "num_nextn_predict_layers": 0}
                  if family == DSA_FAMILY else DEFAULTS),
        rope=read_rope(config), family=family,
        indexer=_indexer(config) if family == DSA_FAMILY else None)
    sizes.rope.require_partial(1.0, "MindFormers' MLA (over qk_rope_head_dim)")
    if sizes.dense > layers:
        raise TargetError(f"config.json: first_k_dense_replace {sizes.dense} is more than "
                          f"num_hidden_layers {layers}")
    if sizes.v_dim > sizes.q_head:
        raise TargetError(f"config.json: v_head_dim {sizes.v_dim} is more than "
                          f"qk_nope_head_dim + qk_rope_head_dim ({sizes.q_head}); MindFormers' "
                          "MLA refuses that")
    wanted = sizes.mtp if mtp is None else int(mtp)
    if wanted > 1:
        raise TargetError(f"config.json: num_nextn_predict_layers {sizes.mtp}; MindFormers 2.1 "
                          "builds one Multi-Token Prediction layer at most")
    if wanted and sizes.dense >= layers:
        raise TargetError(f"config.json: first_k_dense_replace {sizes.dense} makes every "
                          f"decoder layer dense; MindFormers' MTP layer copies the last one "
                          f"(dense), the Hugging Face checkpoint's layer {layers} is a "
                          "mixture of experts")
    return replace(sizes, mtp=wanted)


def deepseek_tensors(sizes: DeepseekSizes, *, mla_qkv_concat: bool = True
                     ) -> list[TargetTensor]:
    """The network's parameters in its own order, by ``Parameter.name``."""
    h, s = sizes.hidden, sizes
    out: list[TargetTensor] = []

    def add(name: str, shape: tuple[int, ...], layer: str) -> None:
        out.append(TargetTensor(name, shape, "float32", layer, (layer,)))

    def layer(p: str, moe: bool) -> None:
        a = f"{p}.self_attention"
        add(f"{p}.input_layernorm.weight", (h,), "FusedRMSNorm")
        if s.indexer is not None:  # DSA: built first, in core_attention
            x, rows = f"{a}.core_attention.indexer", s.indexer.heads * s.indexer.head_dim
            add(f"{x}.linear_wq_b.weight", (rows, s.q_lora), "ColumnParallelLinear")
            add(f"{x}.linear_wk.weight", (s.indexer.head_dim, h), "ColumnParallelLinear")
            add(f"{x}.k_norm.gamma", (s.indexer.head_dim,), "LayerNorm")
            add(f"{x}.k_norm.beta", (s.indexer.head_dim,), "LayerNorm")
            add(f"{x}.linear_weights_proj.weight", (s.indexer.heads, h), "ColumnParallelLinear")
        add(f"{a}.linear_proj.weight", (h, s.heads * s.v_dim), "RowParallelLinear")
        kvb = (s.heads * (s.nope + s.v_dim), s.kv_lora)
        q_up = (s.heads * s.q_head, s.q_lora)
        if mla_qkv_concat:
            add(f"{a}.q_layernorm.weight", (s.q_lora,), "FusedRMSNorm")
            add(f"{a}.linear_qb.weight", q_up, "ColumnParallelLinear")
            add(f"{a}.linear_qkv.weight", (s.q_lora + s.kv_lora + s.rope_dim, h),
                "SequenceParallelLinear")
            add(f"{a}.k_layernorm.weight", (s.kv_lora,), "FusedRMSNorm")
            add(f"{a}.linear_kvb.weight", kvb, "ColumnParallelLinear")
        else:
            add(f"{a}.linear_q_down_proj.weight", (s.q_lora, h), "SequenceParallelLinear")
            add(f"{a}.linear_q_up_proj.weight", q_up, "ColumnParallelLinear")
            add(f"{a}.linear_kv_down_proj.weight", (s.kv_lora + s.rope_dim, h),
                "SequenceParallelLinear")
            add(f"{a}.linear_kv_up_proj.weight", kvb, "ColumnParallelLinear")
            add(f"{a}.q_layernorm.weight", (s.q_lora,), "FusedRMSNorm")
            add(f"{a}.kv_layernorm.weight", (s.kv_lora,), "FusedRMSNorm")
        add(f"{p}.pre_mlp_layernorm.weight", (h,), "FusedRMSNorm")
        if not moe:
            add(f"{p}.mlp.linear_fc1.weight", (2 * s.intermediate, h), "ColumnParallelLinear")
            add(f"{p}.mlp.linear_fc2.weight", (h, s.intermediate), "RowParallelLinear")
            return
        e, f, shared = s.experts, s.expert_intermediate, s.expert_intermediate * s.shared
        for buffer in ("weight", "expert_bias", "expert_load", "fi_accu"):
            add(f"{p}.mlp.router.{buffer}", (e, h) if buffer == "weight" else (e,),
                "TopKRouter")
        add(f"{p}.mlp.experts.weight1", (e * h, 2 * f), "FFNGroupedGEMM")
        add(f"{p}.mlp.experts.weight2", (e * f, h), "FFNGroupedGEMM")
        add(f"{p}.mlp.shared_experts.linear_fc1.weight", (2 * shared, h),
            "SequenceParallelLinear")
        add(f"{p}.mlp.shared_experts.linear_fc2.weight", (h, shared), "SequenceParallelLinear")

    add("embedding.word_embeddings.weight", (s.vocab, h), "VocabParallelEmbedding")
    for i in range(s.layers):
        layer(f"decoder.layers.{i}", moe=i >= s.dense)
    add("decoder.final_layernorm.weight", (h,), "FusedRMSNorm")
    for k in range(s.mtp):
        p = f"mtp.layers.{k}"
        add(f"{p}.enorm.weight", (h,), "FusedRMSNorm")
        add(f"{p}.hnorm.weight", (h,), "FusedRMSNorm")
        add(f"{p}.eh_proj.weight", (h, 2 * h), "SequenceParallelLinear")
        layer(f"{p}.transformer_layer", moe=s.dense < s.layers)
        add(f"{p}.final_layernorm.weight", (h,), "FusedRMSNorm")
    # MindFormers' DeepSeek-V3 keeps its own head even where Hugging Face ties it
    add("output_layer.weight", (s.vocab, h), "ColumnParallelLinear")
    return out


def mindformers_settings(config: dict[str, Any], *, mla_qkv_concat: bool = True,
                         mtp: bool | None = None,
                         use_interleaved_weight_layout_mlp: bool = True) -> dict[str, Any]:
    """What MindFormers' ``DeepseekV3Config`` needs beside ``config.json`` to build the
    network this target describes (its config converter leaves ``qk_layernorm`` false)."""
    sizes = deepseek_sizes(config, mtp=mtp)
    dsa = {} if sizes.indexer is None else {
        # DeepseekV3Config reads none of config.json's index_* keys
        "experimental_attention_variant": "dsa", "use_flash_attention": True,
        "dsa_indexer_n_heads": sizes.indexer.heads,
        "dsa_indexer_head_dim": sizes.indexer.head_dim,
        "dsa_indexer_topk": sizes.indexer.topk}
    return {"qk_layernorm": True, "mla_qkv_concat": mla_qkv_concat,
            "num_nextn_predict_layers": sizes.mtp, "moe_grouped_gemm": True,
            INTERLEAVED: use_interleaved_weight_layout_mlp, **dsa}


#: options ``mindformers:deepseek3`` takes (``--ms-option KEY=VALUE``)
OPTIONS = {"mla_qkv_concat": bool, "mtp": bool, "seq_length": int, INTERLEAVED: bool}
#: the layouts a checkpoint of this family may have, to recognise one by its names
VARIANTS = ({}, {"mla_qkv_concat": False}, {"mtp": False},
            {"mla_qkv_concat": False, "mtp": False})


def deepseek_target(config: dict[str, Any], *, mla_qkv_concat: bool = True,
                    mtp: bool | None = None,
                    use_interleaved_weight_layout_mlp: bool = True,
                    family: str = FAMILY) -> Target:
    """The target's names and shapes from a Hugging Face config, without MindFormers.

    Args:
        config: the model's ``config.json``.
        mla_qkv_concat: the fused ``linear_qkv`` layout (MindFormers' default); false for
            one tensor per projection, as MindFormers' DeepSeek-V3 recipes build it.
        mtp: include the Multi-Token Prediction layer (default: ``num_nextn_predict_layers``).
        use_interleaved_weight_layout_mlp: the dense and shared experts' ``linear_fc1`` with
            gate and up rows interleaved (MindFormers' default); false for two halves.
        family: :data:`FAMILY`, or :data:`DSA_FAMILY` for DeepSeek-V3.2 (the indexer's
            tensors in every layer).

    Example:
        >>> t = deepseek_target(json.load(open("DeepSeek-V3/config.json")))  # doctest: +SKIP
        >>> t["mtp.layers.0.eh_proj.weight"].shape  # doctest: +SKIP
        (7168, 14336)
    """
    sizes = deepseek_sizes(config, mtp=mtp, family=family)
    tensors = deepseek_tensors(sizes, mla_qkv_concat=mla_qkv_concat)
    interleaved = use_interleaved_weight_layout_mlp
    settings = mindformers_settings(config, mla_qkv_concat=mla_qkv_concat, mtp=mtp,
                                    use_interleaved_weight_layout_mlp=interleaved)
    stated = ", ".join(f"{k}: {v}" for k, v in settings.items())
    notes = [f"MindFormers builds this network with {stated} in its model_config (its config "
             "converter sets no qk_layernorm: without it the network has no q/kv norms)",
             mlp_note(interleaved)]
    if sizes.mtp:
        notes.append(f"Multi-Token Prediction (num_nextn_predict_layers {sizes.mtp}): "
                     f"mtp.layers.0 from the checkpoint's model.layers.{sizes.layers}, which "
                     "transformers neither loads nor saves; a checkpoint without it converts "
                     "with --ms-option mtp=false (then num_nextn_predict_layers: 0)")
    if sizes.rope.kind != "default":
        notes.append(f"{sizes.rope.describe()} (the weights do not depend on it)")
    variant = "fused linear_qkv" if mla_qkv_concat else "separate MLA projections"
    optional = {"mtp.": (
        f"the checkpoint holds no Multi-Token Prediction layer (model.layers.{sizes.layers}), "
        f"though config.json counts {sizes.mtp} (num_nextn_predict_layers): transformers "
        "neither loads nor saves it — convert without it with --ms-option mtp=false "
        "(MindFormers' model_config then needs num_nextn_predict_layers: 0)")} \
        if sizes.mtp else {}
    if sizes.indexer is not None:
        notes.append(
            "DeepSeek Sparse Attention: each layer's lightning indexer (wq_b per head, wk, "
            "k_norm) takes its rows reordered, [64..127; 0, 32, 1, 33, ...] per 128: "
            "transformers rotates a head's first 64 dimensions as two halves, MindFormers' "
            "DSAIndexer its last 64 as pairs")
    return Target("family", f"{family} ({variant}{', MTP' if sizes.mtp else ''})",
                  {t.name: t for t in tensors}, family=family, notes=notes,
                  settings={INTERLEAVED: interleaved}, optional=optional)


target = deepseek_target
build = None
#: where the CPU forward lives: MindFormers' network in GRAPH mode with stand-ins for the
#: kernels it lacks on a CPU (verify runs it, in the layout the options give)
FORWARD = "ms_port.archs.parallel_core.cpu"
#: the blocks, for verify one block at a time (imported only then: they import MindSpore)
BLOCKS = "ms_port.archs.parallel_core.blocks:deepseek_blocks"

__all__ = [
    "DSA_FAMILY",
    "FAMILY",
    "FORWARD",
    "NO_FORWARD",
    "OPTIONS",
    "RANK_FORMAT",
    "VARIANTS",
    "DeepseekSizes",
    "IndexerSizes",
    "deepseek_sizes",
    "deepseek_target",
    "deepseek_tensors",
    "family_of_config",
    "mindformers_settings",
]
