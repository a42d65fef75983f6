"""Writing outputs: .ckpt / safetensors / .pth writers, atomic publish (writers), read-back (proof)."""
