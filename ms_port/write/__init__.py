"""Writing outputs: .ckpt / safetensors / .pth writers and atomic publish (writers),
the read-back that proves them (proof)."""
