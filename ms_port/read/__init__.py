"""Reading checkpoints (PyTorch zip/legacy, safetensors, MindSpore .ckpt) and targets."""
