"""MindFormers 2.1's current networks (``mindformers/parallel_core``) as targets, computed
from a Hugging Face ``config.json`` without importing MindFormers.

``--ms-model mindformers:qwen3`` names the tensors of MindFormers' ``Qwen3ForCausalLM``
training network as its checkpoints store them: ``Parameter.name`` (``decoder.layers.0…``;
``parameters_and_names()`` adds a ``model.`` prefix, the checkpoint does not). A test
builds the real networks under ``no_init_parameters`` and holds these lists against them.

Qwen3:

- ``embedding.word_embeddings.weight``; ``output_layer.weight`` unless the head is tied;
- per layer ``input_layernorm``, ``self_attention.linear_qkv`` (q, k, v grouped per KV
  head: the query heads of group g, then k_g, then v_g), ``linear_proj``,
  ``q_layernorm`` / ``k_layernorm`` (one head's width), ``pre_mlp_layernorm``,
  ``mlp.linear_fc1`` (gate and up, rows interleaved: ``use_interleaved_weight_layout_mlp``,
  MindFormers' default; a network built with it false reads two contiguous halves, which
  this target does not describe yet) and ``mlp.linear_fc2``; ``decoder.final_layernorm``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...errors import TargetError, shown
from ...match.mapping import elsewhere, select_table, selected_model_types
from ...read.targets import Target, TargetTensor
from ..config_values import Rope, read_layers, read_rope
from ..config_values import read_bool as _bool
from ..config_values import read_float as _float
from ..config_values import read_int as _int

QWEN3 = "mindformers:qwen3"
QWEN3_MOE = "mindformers:qwen3_moe"


@dataclass(frozen=True)
class Qwen3Sizes:
    """What MindFormers' Qwen3 network needs, read from a Hugging Face config."""

    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    eps: float
    rope: Rope
    qkv_bias: bool
    tied: bool
    #: a mixture of experts: how many, and each one's intermediate size (0: dense)
    experts: int = 0
    expert_intermediate: int = 0

    @property
    def qkv_rows(self) -> int:
        return (self.heads + 2 * self.kv_heads) * self.head_dim


def _table(config: dict[str, Any], family: str) -> Any:
    table = select_table(config, (family,))
    if table is None:
        raise TargetError(f"config.json: model_type {shown(config.get('model_type'))} is not "
                          f"one {family} holds: the mapping tables in mappings/ take "
                          f"{', '.join(selected_model_types(family)) or 'none'}"
                          + elsewhere(config.get("model_type"), family))
    return table


def qwen3_sizes(config: dict[str, Any], family: str = QWEN3) -> Qwen3Sizes:
    """Read the sizes; refuse what MindFormers' Qwen3 network cannot hold."""
    _table(config, family)
    heads = _int(config, "num_attention_heads")
    kv_heads = _int(config, "num_key_value_heads", heads)
    hidden = _int(config, "hidden_size")
    head_dim = _int(config, "head_dim", max(1, hidden // heads))  # Qwen3 states it
    if heads % kv_heads:
        raise TargetError(f"config.json: {heads} heads and {kv_heads} KV heads: MindFormers' "
                          "grouped linear_qkv needs heads divisible by KV heads")
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise TargetError(f"config.json: hidden_act {shown(act)}; MindFormers' Qwen3 computes "
                          "SiLU")
    if _bool(config, "attention_bias"):
        raise TargetError("config.json: attention_bias is set; MindFormers' Qwen3 takes q/k/v "
                          "biases but has no o_proj bias (add_bias_linear), so it cannot hold "
                          "this model")
    layers = read_layers(config)
    experts = expert_intermediate = 0
    if family == QWEN3_MOE:
        # transformers 5 writes num_local_experts; the Hub's files num_experts
        key = "num_experts" if config.get("num_experts") is not None else "num_local_experts"
        experts = _int(config, key)
        expert_intermediate = _int(config, "moe_intermediate_size")
        dense = config.get("mlp_only_layers") or []
        step = config.get("decoder_sparse_step", 1)
        if dense or step not in (1, None):
            raise TargetError(f"config.json: mlp_only_layers {shown(dense)} / "
                              f"decoder_sparse_step {shown(step)}: MindFormers' Qwen3-MoE makes "
                              "every layer a mixture of experts, so it cannot hold this model")
    return Qwen3Sizes(
        vocab=_int(config, "vocab_size"), hidden=hidden, layers=layers, heads=heads,
        kv_heads=kv_heads, head_dim=head_dim,
        intermediate=_int(config, "intermediate_size", 1) if experts else
        _int(config, "intermediate_size"),
        eps=_float(config, "rms_norm_eps", 1e-6), rope=_whole_head(read_rope(config)),
        qkv_bias=False,
        tied=_bool(config, "tie_word_embeddings"), experts=experts,
        expert_intermediate=expert_intermediate)


def _whole_head(rope: Rope) -> Rope:
    rope.require_partial(1.0, "MindFormers' Qwen3")
    return rope


def qwen3_tensors(sizes: Qwen3Sizes) -> list[TargetTensor]:
    """The network's parameters in its own order, by ``Parameter.name``."""
    h = sizes.hidden
    out: list[TargetTensor] = []

    def add(name: str, shape: tuple[int, ...], layer: str) -> None:
        out.append(TargetTensor(name, shape, "float32", layer, (layer,)))

    add("embedding.word_embeddings.weight", (sizes.vocab, h), "VocabEmbedding")
    for i in range(sizes.layers):
        p = f"decoder.layers.{i}"
        add(f"{p}.input_layernorm.weight", (h,), "RMSNorm")
        add(f"{p}.self_attention.linear_proj.weight", (h, sizes.heads * sizes.head_dim),
            "RowParallelLinear")
        add(f"{p}.self_attention.linear_qkv.weight", (sizes.qkv_rows, h), "ColumnParallelLinear")
        if sizes.qkv_bias:
            add(f"{p}.self_attention.linear_qkv.bias", (sizes.qkv_rows,), "ColumnParallelLinear")
        add(f"{p}.self_attention.q_layernorm.weight", (sizes.head_dim,), "RMSNorm")
        add(f"{p}.self_attention.k_layernorm.weight", (sizes.head_dim,), "RMSNorm")
        add(f"{p}.pre_mlp_layernorm.weight", (h,), "RMSNorm")
        if sizes.experts:
            e, f = sizes.experts, sizes.expert_intermediate
            add(f"{p}.mlp.router.weight", (e, h), "TopKRouter")
            add(f"{p}.mlp.router.fi_accu", (e,), "TopKRouter")
            # per expert [gate_e^T | up_e^T] (H x 2F), experts stacked; down_e^T stacked
            add(f"{p}.mlp.experts.weight1", (e * h, 2 * f), "GroupedMLP")
            add(f"{p}.mlp.experts.weight2", (e * f, h), "GroupedMLP")
        else:
            add(f"{p}.mlp.linear_fc1.weight", (2 * sizes.intermediate, h),
                "ColumnParallelLinear")
            add(f"{p}.mlp.linear_fc2.weight", (h, sizes.intermediate), "RowParallelLinear")
    add("decoder.final_layernorm.weight", (h,), "RMSNorm")
    if not sizes.tied:
        add("output_layer.weight", (sizes.vocab, h), "ColumnParallelLinear")
    return out


#: MindFormers' model_config key that lays out a dense ``linear_fc1``: gate and up rows
#: interleaved (``MLPInterleaved``, its default) or two contiguous halves (``MLP``)
INTERLEAVED = "use_interleaved_weight_layout_mlp"


def mlp_note(interleaved: bool) -> str:
    """The plan's note wherever a target holds a dense ``linear_fc1``."""
    if interleaved:
        return (f"linear_fc1 holds gate and up rows interleaved, as MindFormers builds its MLPs "
                f"by default ({INTERLEAVED}: true); for a network built with it false, "
                f"convert with --ms-option {INTERLEAVED}=false")
    return (f"linear_fc1 holds gate then up, two contiguous halves ({INTERLEAVED}: false): "
            "build MindFormers' network with that setting, or it reads other rows")


#: options ``mindformers:qwen3`` takes (``--ms-option KEY=VALUE``)
OPTIONS = {"seq_length": int, INTERLEAVED: bool}
#: the layouts a checkpoint of this family may have, to recognise one by its names
VARIANTS = ({},)


def qwen3_target(config: dict[str, Any], family: str = QWEN3, *,
                 use_interleaved_weight_layout_mlp: bool = True) -> Target:
    """The target's names and shapes from a Hugging Face config, without MindFormers;
    its ``linear_fc1`` laid out as ``use_interleaved_weight_layout_mlp`` says (the
    mapping table reads it from the target's settings)."""
    sizes = qwen3_sizes(config, family)
    tensors = qwen3_tensors(sizes)
    notes = []
    if any(t.name.endswith("linear_fc1.weight") for t in tensors):
        notes.append(mlp_note(use_interleaved_weight_layout_mlp))
    if sizes.rope.kind != "default":
        notes.append(f"{sizes.rope.describe()} (the weights do not depend on it)")
    return Target("family", family, {t.name: t for t in tensors}, family=family, notes=notes,
                  settings={INTERLEAVED: use_interleaved_weight_layout_mlp})


def qwen3_moe_target(config: dict[str, Any]) -> Target:
    """``mindformers:qwen3_moe``: Qwen3's attention; per layer a router (``router.weight``
    and its zero ``fi_accu`` statistics) and stacked experts (``experts.weight1``: per
    expert ``[gate_eᵀ | up_eᵀ]``, two contiguous halves; ``experts.weight2``: ``down_eᵀ``)."""
    return qwen3_target(config, QWEN3_MOE)


target = qwen3_target
build = None
#: the blocks, for verify one block at a time (imported only then: they import MindSpore)
BLOCKS = "ms_port.archs.parallel_core.blocks:qwen3_blocks"
#: where the CPU forward lives: MindFormers' network in GRAPH mode with stand-ins for the
#: kernels it lacks on a CPU (verify runs it; NO_FORWARD says why where it cannot run)
FORWARD = "ms_port.archs.parallel_core.cpu"
#: why verify runs no forward for this family (its verdict is then the tensors' and
#: INCONCLUSIVE)
#: the per-rank format the family's training loads (convert --strategy writes it):
#: MindFormers forces safetensors for its parallel_core networks
RANK_FORMAT = "safetensors"
NO_FORWARD = ("MindFormers' parallel_core networks have no CPU kernels for RmsNorm and "
              "FlashAttentionScore, and run only in GRAPH mode")

__all__ = [
    "OPTIONS",
    "QWEN3",
    "RANK_FORMAT",
    "VARIANTS",
    "Qwen3Sizes",
    "qwen3_sizes",
    "qwen3_target",
    "qwen3_tensors",
]
