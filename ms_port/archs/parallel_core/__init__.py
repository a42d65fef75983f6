"""Qwen3, Qwen3-MoE and DeepSeek-V3 into MindFormers' parallel_core."""
