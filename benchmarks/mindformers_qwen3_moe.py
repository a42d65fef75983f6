"""MindFormers 2.1's own Hugging Face loader for Qwen3-MoE (a baseline of
``qwen3-moe-layers``), run the way its trainer runs it for a Hugging Face directory.

    python benchmarks/mindformers_qwen3_moe.py HF_DIR OUT.ckpt

MindFormers' trainer, given ``checkpoint.load_path`` of a Hugging Face directory
(``is_hf_checkpoint``), calls ``mindformers.checkpoint.checkpoint.load_hf_checkpoint(dir,
network)``: it lists the safetensors, maps names through the network's weight template
(``Qwen3MoePreTrainedModel.weight_converters``: ``QKVConvertOp``, ``ExpertsConvertOp``...),
reads and converts each tensor, and loads the result into the network. This does that
on the CPU: MindFormers' context for the parallel_core models
(``build_context({'use_legacy': False, ...})``), ``TrainingQwen3MoeForCausalLM`` built
from the directory's ``config.json`` under ``no_init_parameters`` (nothing allocated until
loaded), ``load_hf_checkpoint``, then ``mindspore.save_checkpoint`` of the network: the
``.ckpt`` ms-port writes. MindFormers builds a mixture of experts only with
``moe_grouped_gemm``, which is set, as the repository's tests set it.

MindFormers writes its logs under ``$LOCAL_DEFAULT_PATH`` (``./output`` when unset); the
harness sets it to a /tmp folder.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

#: config.json keys Qwen3MoeConfig takes (the rest are its defaults)
KEEP = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "head_dim", "tie_word_embeddings",
        "rms_norm_eps", "max_position_embeddings", "rope_theta", "num_experts",
        "moe_intermediate_size", "num_experts_per_tok", "norm_topk_prob")


def main() -> None:
    if len(sys.argv) != 3:
        raise SystemExit(__doc__.split("\n\n")[1])
    src, out = sys.argv[1:]
    config = json.loads((Path(src) / "config.json").read_text())
    import mindspore as ms
    from mindformers.checkpoint.checkpoint import load_hf_checkpoint
    from mindformers.core.context import build_context
    from mindspore.nn.utils import no_init_parameters

    build_context({"use_legacy": False, "context": {"device_target": "CPU", "mode": 0},
                   "parallel": {}})
    from mindformers.models.qwen3_moe import Qwen3MoeConfig, TrainingQwen3MoeForCausalLM

    with no_init_parameters():
        net = TrainingQwen3MoeForCausalLM(Qwen3MoeConfig(
            **{k: config[k] for k in KEEP if k in config}, moe_grouped_gemm=True))
    load_hf_checkpoint(src, net)
    ms.save_checkpoint(net, out)


if __name__ == "__main__":
    main()
