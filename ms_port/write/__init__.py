"""Writing outputs: .ckpt / safetensors / .pth writers, atomic publish, read-back."""
