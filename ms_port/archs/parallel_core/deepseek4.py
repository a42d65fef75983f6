"""``mindformers:deepseek4``: MindFormers 2.1's DeepSeek-V4 network
(``models/deepseek4``, the PyNative ``DeepseekV4ForCausalLM``) as a target, computed from a
Hugging Face ``config.json`` (``model_type`` ``deepseek_v4``) in either layout, without
importing MindFormers; names are ``Parameter.name``, as its checkpoints store them.

What is new against DeepSeek-V3: one shared K=V head (``linear_kv_proj``) instead of MLA's
``kv_b``, an unweighted RMSNorm per query head (``q_rms_gamma``, ones), per-head attention
sinks, a grouped low-rank output projection (``linear_o_group_proj``, then
``linear_proj``), compressed branches per layer (``compress_ratios``: 0 a sliding window
only, 4 a compressor of overlapping windows and a lightning indexer, 128 a compressor),
hyper-connections (``attn_hc`` and ``ffn_hc`` per layer: ``hc_mult`` residual streams, the
Hub's ``scale[3]`` split into ``alpha_pre``, ``alpha_post``, ``alpha_res``; an
``hc_head``), hash routing in the first ``num_hash_layers`` layers (``router.tid2eid``,
int32, and no expert bias) and the Multi-Token Prediction layer as ``mtp.layers.0``.

A config gives the layers' kinds in one of two layouts, both read here:

- the Hub's (and MindFormers'): ``compress_ratios`` (one per layer, then the MTP layer's),
  ``num_hash_layers``, ``qk_rope_head_dim``;
- transformers 5's: ``layer_types`` (``sliding_attention``,
  ``compressed_sparse_attention``, ``heavily_compressed_attention``) with
  ``compress_rates``, ``mlp_layer_types`` (``hash_moe``, ``moe``) and
  ``partial_rotary_factor`` (at the top, or in ``rope_parameters.main``).

A test builds MindFormers' network (with a stand-in ``hyper_parallel``) under
``no_init_parameters`` and holds these lists against its parameters, and holds a
conversion to MindFormers' own ``weight_converters`` applied to the Hub-named copy, bit for
bit. The network holds routed experts 3-D (``[E, H, 2F]``: per expert ``[gate_eᵀ | up_eᵀ]``;
``[E, F, H]``), where ``ExpertsConvertOp`` writes the same bytes 2-D.

verify proves the tensors through the plan; no forward runs (:data:`NO_FORWARD`):
MindFormers' network imports ``hyper_parallel``, which is not on the package index.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, replace
from typing import Any

from ...errors import TargetError, shown
from ...read.targets import Target, TargetTensor
from ..config_values import read_bool, read_int, read_layers, read_rope
from .deepseek import refuse_other_family
from .family import RANK_FORMAT

FAMILY = "mindformers:deepseek4"
#: a layer's attention kind in transformers 5's ``layer_types`` -> its key in
#: ``compress_rates`` (None: no compressor)
LAYER_TYPES = {"sliding_attention": None,
               "compressed_sparse_attention": "compressed_sparse_attention",
               "heavily_compressed_attention": "heavily_compressed_attention"}
#: transformers' DeepseekV4Config defaults where its config.json is silent
COMPRESS_RATES = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
#: the ratio whose compressor reads overlapping windows and carries a lightning indexer
#: (DeepSeek-V4's CSA); any other nonzero ratio is a plain compressor (HCA)
OVERLAP_RATIO = 4
#: the ratios MindFormers' TransformerConfig accepts (0: no compressor)
BUILT_RATIOS = (0, 4, 128)
#: what DeepSeek-V4's and MindFormers' configs both assume where config.json is silent
DEFAULTS = {"num_key_value_heads": 1, "n_shared_experts": 1, "hc_mult": 4,
            "index_n_heads": 64, "index_head_dim": 128, "num_nextn_predict_layers": 1}


@dataclass(frozen=True)
class Deepseek4Sizes:
    """What MindFormers' DeepSeek-V4 network needs, read from a Hugging Face config."""

    vocab: int
    hidden: int
    layers: int
    heads: int
    head_dim: int
    rope_dim: int
    q_lora: int
    o_groups: int
    o_lora: int
    experts: int
    expert_intermediate: int
    shared: int
    hc: int
    index_heads: int
    index_dim: int
    #: per decoder layer, then per MTP layer: 0 (sliding window only), 4 (CSA), 128 (HCA)
    ratios: tuple[int, ...]
    #: the first layers routed by token id (``tid2eid``)
    hash_layers: int
    mtp: int
    #: the experts each token is routed to (``tid2eid``'s columns)
    topk: int = 6

    @property
    def mix(self) -> int:
        """A hyper-connection's mixing outputs: pre and post weights, and the res matrix."""
        return (2 + self.hc) * self.hc


def _int(config: dict[str, Any], key: str) -> int:
    return read_int(config, key, DEFAULTS.get(key))


def _count(config: dict[str, Any], key: str, default: int) -> int:
    """A count that may be 0 (MTP layers, hash layers)."""
    return read_int(config, key, default, least=0, most=1024)


def _rope_dim(config: dict[str, Any], head_dim: int) -> int:
    """The rotary dimensions of a head: transformers 5's ``partial_rotary_factor`` (read by
    :func:`read_rope`, which knows V4's ``rope_parameters.main``), else the Hub's
    ``qk_rope_head_dim`` (transformers takes them in that order)."""
    factor = read_rope(config).partial  # transformers takes it over qk_rope_head_dim
    if factor is None and config.get("qk_rope_head_dim") is not None:
        return read_int(config, "qk_rope_head_dim")
    if factor is None:
        factor = 64 / 512  # transformers' and DeepSeek-V4's default
    dim = int(head_dim * factor)
    if dim < 2 or dim % 2:
        raise TargetError(f"config.json: partial_rotary_factor {factor:g} of head_dim "
                          f"{head_dim} gives {dim} rotary dimensions; MindFormers rotates an "
                          "even number of them")
    return dim


def _ratios(config: dict[str, Any], layers: int, mtp: int, stated: int
            ) -> tuple[int, ...]:
    """Each layer's compression ratio, then each MTP layer's (the Hub's ``compress_ratios``,
    or transformers 5's ``layer_types`` with ``compress_rates``; an MTP layer it does not
    describe has none, as the Hub's DeepSeek-V4 gives it). ``stated``: the MTP layers the
    config counts (the list holds theirs even where ``mtp`` leaves them out)."""
    given = config.get("compress_ratios")
    if given is not None and config.get("layer_types") is None:  # transformers: layer_types
        most = layers + max(mtp, stated, 1)  # an MTP layer's ratio, counted or not
        if not isinstance(given, list) or not layers <= len(given) <= most or any(
                not isinstance(r, int) or isinstance(r, bool) or not 0 <= r <= 1 << 20
                for r in given):
            raise TargetError(f"config.json: compress_ratios is {shown(given)}; expected "
                              f"{layers} (or {most}, with the MTP layer's) non-negative "
                              "integers")
        padded = tuple(given) + (0,) * (most - len(given))
        return _built(padded[:layers + mtp], "compress_ratios")
    types = config.get("layer_types")
    rates = config.get("compress_rates") or COMPRESS_RATES
    if types is None:  # transformers' default: two HCA layers, then CSA and HCA in turn
        types = ["heavily_compressed_attention"] * min(layers, 2) + [
            "compressed_sparse_attention" if i % 2 else "heavily_compressed_attention"
            for i in range(max(layers - 2, 0))]
    if not isinstance(types, list) or len(types) != layers or any(
            t not in LAYER_TYPES for t in types):
        raise TargetError(f"config.json: layer_types is {shown(types)}; expected {layers} of "
                          f"{', '.join(LAYER_TYPES)}")
    if not isinstance(rates, dict):
        raise TargetError(f"config.json: compress_rates is {shown(rates)}; expected "
                          f"{shown(COMPRESS_RATES)}")
    out = []
    for t in types:
        key = LAYER_TYPES[t]
        if key is None:
            out.append(0)
            continue
        rate = rates.get(key, COMPRESS_RATES[key])
        if not isinstance(rate, int) or isinstance(rate, bool) or not 1 <= rate <= 1 << 20:
            raise TargetError(f"config.json: compress_rates[{key}] is {shown(rate)}; expected "
                              "a positive integer")
        out.append(rate)
    return _built(tuple(out) + (0,) * mtp, "compress_rates")


def _built(ratios: tuple[int, ...], key: str) -> tuple[int, ...]:
    """``ratios``, refused where MindFormers' network builds no such compressor."""
    odd = sorted({r for r in ratios if r not in BUILT_RATIOS})
    if odd:
        raise TargetError(f"config.json: {key} gives compression ratio(s) "
                          f"{', '.join(map(str, odd))}; MindFormers' DeepSeek-V4 builds "
                          f"{', '.join(map(str, BUILT_RATIOS))} only")
    return ratios


def _hash_layers(config: dict[str, Any], layers: int) -> int:
    """How many first layers route by token id: ``num_hash_layers``, or transformers 5's
    ``mlp_layer_types`` (which MindFormers can hold only as a prefix)."""
    types = config.get("mlp_layer_types")
    if types is None:
        return min(layers, _count(config, "num_hash_layers", 3))
    if not isinstance(types, list) or len(types) != layers or any(
            t not in ("hash_moe", "moe") for t in types):
        raise TargetError(f"config.json: mlp_layer_types is {shown(types)}; expected "
                          f"{layers} of hash_moe, moe")
    n = sum(t == "hash_moe" for t in types)
    if types[:n] != ["hash_moe"] * n:
        raise TargetError(f"config.json: mlp_layer_types {shown(types)}: MindFormers routes by "
                          "token id the first num_hash_layers layers only, so it cannot hold "
                          "hash-routed layers after others")
    return n


def deepseek4_sizes(config: dict[str, Any], *, mtp: bool | None = None) -> Deepseek4Sizes:
    """Read the sizes; refuse, in one line, what MindFormers' network cannot hold."""
    refuse_other_family(config, FAMILY)
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise TargetError(f"config.json: hidden_act {shown(act)}; DeepSeek-V4 computes SiLU")
    for key in ("attention_bias", "mlp_bias"):
        if read_bool(config, key):
            raise TargetError(f"config.json: {key} is set; MindFormers' DeepSeek-V4 has no "
                              "such biases, so it cannot hold this model")
    if _int(config, "num_key_value_heads") != 1:
        raise TargetError(f"config.json: num_key_value_heads {config['num_key_value_heads']}; "
                          "DeepSeek-V4 shares one K=V head, and MindFormers builds only that")
    layers = read_layers(config)
    head_dim, heads = _int(config, "head_dim"), _int(config, "num_attention_heads")
    o_groups = _int(config, "o_groups")
    if heads % o_groups:
        raise TargetError(f"config.json: o_groups {o_groups} does not divide "
                          f"num_attention_heads {heads}")
    stated_mtp = _count(config, "num_nextn_predict_layers", 1)
    wanted = stated_mtp if mtp is None else int(mtp)
    if wanted > 1:
        raise TargetError(f"config.json: num_nextn_predict_layers {stated_mtp}; MindFormers "
                          "2.1 builds one Multi-Token Prediction layer at most")
    sizes = Deepseek4Sizes(
        vocab=_int(config, "vocab_size"), hidden=_int(config, "hidden_size"), layers=layers,
        heads=heads, head_dim=head_dim, rope_dim=_rope_dim(config, head_dim),
        q_lora=_int(config, "q_lora_rank"), o_groups=o_groups, o_lora=_int(config, "o_lora_rank"),
        experts=_int(config, "n_routed_experts"),
        expert_intermediate=_int(config, "moe_intermediate_size"),
        shared=_int(config, "n_shared_experts"), hc=_int(config, "hc_mult"),
        index_heads=_int(config, "index_n_heads"), index_dim=_int(config, "index_head_dim"),
        ratios=_ratios(config, layers, wanted, stated_mtp),
        hash_layers=_hash_layers(config, layers),
        mtp=wanted)
    sizes = replace(sizes, topk=read_int(config, "num_experts_per_tok", 6))
    if sizes.topk > sizes.experts:
        raise TargetError(f"config.json: num_experts_per_tok {sizes.topk} is more than the "
                          f"{sizes.experts} experts")
    if sizes.rope_dim > head_dim:
        raise TargetError(f"config.json: {sizes.rope_dim} rotary dimensions exceed head_dim "
                          f"{head_dim}")
    return sizes


def deepseek4_tensors(sizes: Deepseek4Sizes) -> list[TargetTensor]:
    """The network's parameters in its own order, by ``Parameter.name``."""
    s, h = sizes, sizes.hidden
    out: list[TargetTensor] = []

    def add(name: str, shape: tuple[int, ...], layer: str, dtype: str = "float32") -> None:
        out.append(TargetTensor(name, shape, dtype, layer, (layer,)))

    def compressor(p: str, ratio: int, dim: int) -> None:
        width = dim * (2 if ratio == OVERLAP_RATIO else 1)  # overlapping windows: two
        add(f"{p}.ape", (ratio, width), "Compressor")
        add(f"{p}.linear_wkv.weight", (width, h), "Compressor")
        add(f"{p}.linear_wgate.weight", (width, h), "Compressor")
        add(f"{p}.norm.weight", (dim,), "Compressor")

    def hyper(p: str) -> None:
        for alpha in ("alpha_pre", "alpha_post", "alpha_res"):
            add(f"{p}.{alpha}", (1,), "HyperConnection")
        add(f"{p}.bias", (s.mix,), "HyperConnection")
        add(f"{p}.rms_weight", (s.hc * h,), "HyperConnection")
        add(f"{p}.mapping_proj.weight", (s.mix, s.hc * h), "HyperConnection")

    def head(p: str) -> None:
        add(f"{p}.hc_base", (s.hc,), "HyperConnectionHead")
        add(f"{p}.hc_scale", (1,), "HyperConnectionHead")
        add(f"{p}.hc_fn.weight", (s.hc, s.hc * h), "HyperConnectionHead")

    def layer(p: str, ratio: int, hashed: bool) -> None:
        a, per_group = f"{p}.self_attention", s.heads * s.head_dim // s.o_groups
        add(f"{p}.input_layernorm.weight", (h,), "RMSNorm")
        add(f"{a}.linear_o_group_proj", (s.o_groups * s.o_lora, per_group), "Attention")
        add(f"{a}.q_rms_gamma", (s.head_dim,), "Attention")
        add(f"{a}.core_attention.attn_sink", (s.heads,), "CoreAttention")
        if ratio:
            compressor(f"{a}.core_attention.compressor", ratio, s.head_dim)
        if ratio == OVERLAP_RATIO:
            x = f"{a}.core_attention.indexer"
            add(f"{x}.linear_wq_b.weight", (s.index_heads * s.index_dim, s.q_lora), "Indexer")
            compressor(f"{x}.compressor", ratio, s.index_dim)
            add(f"{x}.linear_weights_proj.weight", (s.index_heads, h), "Indexer")
        add(f"{a}.linear_proj.weight", (h, s.o_groups * s.o_lora), "RowParallelLinear")
        add(f"{a}.linear_q_down_proj.weight", (s.q_lora, h), "Linear")
        add(f"{a}.q_layernorm.weight", (s.q_lora,), "RMSNorm")
        add(f"{a}.linear_q_up_proj.weight", (s.heads * s.head_dim, s.q_lora), "Linear")
        add(f"{a}.linear_kv_proj.weight", (s.head_dim, h), "Linear")
        add(f"{a}.kv_layernorm.weight", (s.head_dim,), "RMSNorm")
        add(f"{p}.pre_mlp_layernorm.weight", (h,), "RMSNorm")
        m, e, f = f"{p}.mlp", s.experts, s.expert_intermediate
        if not hashed:
            add(f"{m}.expert_bias", (e,), "MoELayer")
        add(f"{m}.tokens_per_expert", (e,), "MoELayer")
        add(f"{m}.router.weight", (e, h), "Router")
        if hashed:
            add(f"{m}.router.tid2eid", (s.vocab, s.topk), "Router", "int32")
        add(f"{m}.experts.weight1", (e, h, 2 * f), "GroupedMLP")
        add(f"{m}.experts.weight2", (e, f, h), "GroupedMLP")
        add(f"{m}.shared_experts.linear_fc1.weight", (2 * f * s.shared, h), "SharedExpertMLP")
        add(f"{m}.shared_experts.linear_fc2.weight", (h, f * s.shared), "SharedExpertMLP")
        hyper(f"{p}.attn_hc")
        hyper(f"{p}.ffn_hc")

    add("embedding.word_embeddings.weight", (s.vocab, h), "VocabParallelEmbedding")
    head("decoder.hc_head")
    for i in range(s.layers):
        layer(f"decoder.layers.{i}", s.ratios[i], i < s.hash_layers)
    add("decoder.final_layernorm.weight", (h,), "RMSNorm")
    add("output_layer.weight", (s.vocab, h), "ColumnParallelLinear")
    for k in range(s.mtp):
        p = f"mtp.layers.{k}"
        add(f"{p}.enorm.weight", (h,), "RMSNorm")
        add(f"{p}.hnorm.weight", (h,), "RMSNorm")
        add(f"{p}.eh_proj.weight", (h, 2 * h), "Linear")
        layer(f"{p}.transformer_layer", s.ratios[s.layers + k], False)
        add(f"{p}.final_layernorm.weight", (h,), "RMSNorm")
        head(f"{p}.hc_head")
    return out


def hyper_parallel_missing() -> bool:
    """Whether ``hyper_parallel``, which MindFormers' DeepSeek-V4 imports, is absent."""
    return importlib.util.find_spec("hyper_parallel") is None


def mindformers_settings(config: dict[str, Any], *, mtp: bool | None = None
                         ) -> dict[str, Any]:
    """What MindFormers' ``DeepseekV4Config`` needs beside ``config.json``'s sizes to build
    the network this target describes: its config converter sets no ``qk_layernorm`` (then
    the network has no q/kv norms), and it reads the layers' kinds only in the Hub's
    layout (``compress_ratios`` with the MTP layer's, ``num_hash_layers``,
    ``qk_rope_head_dim``), where its defaults are DeepSeek-V4-Pro's."""
    sizes = deepseek4_sizes(config, mtp=mtp)
    return {"qk_layernorm": True, "moe_grouped_gemm": True,
            "compress_ratios": list(sizes.ratios), "num_hash_layers": sizes.hash_layers,
            "qk_rope_head_dim": sizes.rope_dim, "num_nextn_predict_layers": sizes.mtp}


#: options ``mindformers:deepseek4`` takes (``--ms-option KEY=VALUE``)
OPTIONS = {"mtp": bool, "seq_length": int}
#: the layouts a checkpoint of this family may have, to recognise one by its names
VARIANTS = ({}, {"mtp": False})


def deepseek4_target(config: dict[str, Any], *, mtp: bool | None = None) -> Target:
    """The target's names and shapes from a Hugging Face config, without MindFormers.

    Args:
        config: the model's ``config.json`` (the Hub's layout or transformers 5's).
        mtp: include the Multi-Token Prediction layer (default: ``num_nextn_predict_layers``);
            a folder saved by transformers has none (``mtp=False``).

    Example:
        >>> t = deepseek4_target(json.load(open("DeepSeek-V4-Flash/config.json")))  # doctest: +SKIP
        >>> t["decoder.layers.0.mlp.router.tid2eid"].dtype  # doctest: +SKIP
        'int32'
    """
    sizes = deepseek4_sizes(config, mtp=mtp)
    tensors = deepseek4_tensors(sizes)
    settings = mindformers_settings(config, mtp=mtp)
    stated = ", ".join(f"{k}: {v}" for k, v in settings.items())
    notes = [f"MindFormers builds this network with {stated} in its model_config (its config "
             "converter sets no qk_layernorm, and reads the layers' kinds only as "
             "compress_ratios and num_hash_layers)",
             "shared_experts.linear_fc1 holds w1 and w3 rows interleaved, the one layout "
             "MindFormers' PyNative MLP reads (it pairs rows whatever "
             "use_interleaved_weight_layout_mlp says)",
             "declared: each layer's q_rms_gamma and hyper-connection rms_weight (ones) and "
             "tokens_per_expert (zeros) have no source"]
    if sizes.hash_layers:
        notes.append(f"the first {sizes.hash_layers} layers route by token id: their "
                     "router.tid2eid is written as int32, each value checked to fit")
    optional = {"mtp.": (
        f"the checkpoint holds no Multi-Token Prediction layer (mtp.0), though config.json "
        f"counts {sizes.mtp} (num_nextn_predict_layers): transformers neither loads nor saves "
        "it — convert without it with --ms-option mtp=false (MindFormers' model_config then "
        "needs num_nextn_predict_layers: 0)")} if sizes.mtp else {}
    return Target("family", f"{FAMILY}{' (MTP)' if sizes.mtp else ''}",
                  {t.name: t for t in tensors}, family=FAMILY, notes=notes,
                  optional=optional)


def _no_forward() -> str:
    need = ("hyper_parallel (not on the package index; MindFormers 2.1's DeepseekV4ForCausalLM "
            "imports it) and MindSpore ~2.11")
    if hyper_parallel_missing():
        return f"MindFormers' DeepSeek-V4 network cannot be built here: it needs {need}"
    return ("ms-port runs no forward of MindFormers' DeepSeek-V4 yet (its PyNative network "
            "needs CPU stand-ins for its Ascend kernels, which ms-port does not ship)")


target = deepseek4_target
build = None
#: why verify runs no forward (its verdict is then the tensors' and INCONCLUSIVE)
NO_FORWARD = _no_forward()
#: no forward, so no blocks
BLOCKS = None

__all__ = [
    "FAMILY",
    "NO_FORWARD",
    "OPTIONS",
    "RANK_FORMAT",
    "VARIANTS",
    "Deepseek4Sizes",
    "deepseek4_sizes",
    "deepseek4_target",
    "deepseek4_tensors",
    "mindformers_settings",
]
