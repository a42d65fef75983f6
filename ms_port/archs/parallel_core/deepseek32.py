"""``mindformers:deepseek32``: MindFormers 2.1's parallel_core DeepSeek-V3.2 training network
(``TrainingDeepseekV3ForCausalLM`` with ``experimental_attention_variant: dsa``: DeepSeek
Sparse Attention), computed from a Hugging Face ``config.json`` (``model_type``
``deepseek_v32``) without importing MindFormers.

It is :mod:`ms_port.archs.parallel_core.deepseek`'s network with a lightning indexer in
every layer (the MTP layer's too), under ``self_attention.core_attention.indexer``:
``linear_wq_b`` (``wq_b``), ``linear_wk`` (``wk``), ``k_norm.gamma``/``beta``
(``k_norm.weight``/``bias``, a LayerNorm) and ``linear_weights_proj`` (``weights_proj``).
transformers rotates each indexer head's first ``qk_rope_head_dim`` (64) dimensions as two
halves; MindFormers' ``DSAIndexer`` rotates the last 64, read as pairs: ``wq_b`` (each head's
128 rows), ``wk``, ``k_norm.gamma`` and ``beta`` take rows ``[64..127; 0, 32, 1, 33, ...]``
(the shipped table's transforms). A plain rename loads and runs, and picks other tokens.

MindFormers' DSA builds only ``kv_lora_rank`` 512, ``qk_rope_head_dim`` 64 and an indexer of
64 heads of 128 (its ``MLATransformerConfig`` refuses others); ``DeepseekV3Config`` reads
none of ``config.json``'s ``index_*`` keys, so the target states ``dsa_indexer_n_heads``,
``dsa_indexer_head_dim``, ``dsa_indexer_topk``, ``experimental_attention_variant: dsa`` and
``use_flash_attention`` beside ``qk_layernorm``.

verify runs MindFormers' network on a CPU (GRAPH mode, the DSA stand-ins of
:mod:`ms_port.archs.parallel_core.cpu` beside DeepSeek-V3's) with the indexer keeping at
most half the run's tokens on both sides (:func:`run_config`): with ``index_topk`` 2048
and 16 tokens, every token would be kept and the indexer would never reach the logits.

Measured (tiny seeded model: hidden 64, 2 MLA heads, q rank 24, 2 layers, the first dense;
4 experts; the indexer 64 × 128 keeping 6 of 16 tokens): MindFormers' network computes
transformers' logits to 4.6e-7 relative; with the indexer's rows renamed, not reordered,
0.35.
"""

from __future__ import annotations

from typing import Any

from .deepseek import (
    DSA_FAMILY,
    FORWARD,
    NO_FORWARD,
    OPTIONS,
    RANK_FORMAT,
    VARIANTS,
    deepseek_sizes,
    deepseek_target,
)

FAMILY = DSA_FAMILY
#: the blocks, for verify one block at a time (imported only then: they import MindSpore)
BLOCKS = "ms_port.archs.parallel_core.blocks:deepseek_blocks"
build = None


def target(config: dict[str, Any], **options: Any) -> Any:
    """:func:`~ms_port.archs.parallel_core.deepseek.deepseek_target` for DeepSeek-V3.2."""
    return deepseek_target(config, family=FAMILY, **options)


def run_config(config: dict[str, Any], seq_length: int) -> tuple[dict[str, Any], list[str]]:
    """The config both sides of a verify are built with for ``seq_length`` tokens, and
    what the report says of it: the indexer keeps at most half the tokens (at least one),
    so that which tokens it keeps reaches the logits. The weights do not depend on
    ``index_topk``; a wrong indexer is then a wrong choice of tokens."""
    sizes = deepseek_sizes(config, family=FAMILY)
    keep = max(1, min(sizes.indexer.topk, seq_length // 2))
    if keep == sizes.indexer.topk:
        return config, []
    return {**config, "index_topk": keep}, [
        f"the indexer keeps {keep} of the run's {seq_length} tokens on both sides "
        f"(config.json's index_topk {sizes.indexer.topk} would keep every token, and the "
        "indexer would not reach the logits); the weights do not depend on index_topk"]


__all__ = ["BLOCKS", "FAMILY", "FORWARD", "NO_FORWARD", "OPTIONS", "RANK_FORMAT", "VARIANTS",
           "build", "run_config", "target"]
