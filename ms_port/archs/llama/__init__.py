"""LLaMA, Mistral and Qwen2 into MindFormers' LlamaForCausalLM."""
