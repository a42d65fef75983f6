"""``mindformers:qwen3_moe``: MindFormers 2.1's parallel_core Qwen3-MoE as a target (see
:mod:`ms_port.archs.parallel_core.family`)."""

from __future__ import annotations

from .family import NO_FORWARD, QWEN3_MOE, RANK_FORMAT, qwen3_moe_target

OPTIONS = {"seq_length": int}
VARIANTS = ({},)
FAMILY = QWEN3_MOE
target = qwen3_moe_target
build = None
#: the blocks, for verify one block at a time (imported only then: they import MindSpore)
BLOCKS = "ms_port.archs.parallel_core.blocks:qwen3_moe_blocks"
#: where the CPU forward lives: MindFormers' network in GRAPH mode with stand-ins for the
#: kernels it lacks on a CPU (verify runs it; NO_FORWARD says why where it cannot run)
FORWARD = "ms_port.archs.parallel_core.cpu"

__all__ = ["FAMILY", "NO_FORWARD", "OPTIONS", "RANK_FORMAT", "VARIANTS"]
