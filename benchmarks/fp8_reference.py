"""DeepSeek-V3's own float8 → bfloat16 conversion, on the CPU (the baseline of
``fp8-dequant``).

    python benchmarks/fp8_reference.py FP8_DIR BF16_DIR

DeepSeek's ``inference/fp8_cast_bf16.py`` is where users of its float8 checkpoints are
sent for bfloat16 weights: for each shard in name order, ``load_file`` it whole, replace
every 1-byte weight that has a ``_scale_inv`` (found through the index, in a cache of the
two most recent shards) by ``weight_dequant(weight, scale_inv)``, keep every other tensor,
``save_file`` the shard under its own name, and at the end write the index without the
scales. ``weight_dequant`` (``inference/kernel.py``) is a Triton kernel, GPU only: one
program per 128×128 block, ``x.to(float32) * s[block]`` stored into a bfloat16 tensor
(``torch.get_default_dtype()``, which the script sets to bfloat16), i.e. rounded to
nearest, ties to even. Its block size is the default 128, never read from the config.

This is that script with ``device="cuda"`` made ``"cpu"`` (and no ``empty_cache`` or
progress bar) and the kernel written with torch operations: one row of blocks at a time
(the kernel's ``pid_m``), every column multiplied in float32 by its block's scale (its
``pid_n``), stored into the bfloat16 output. The same formula, the same rounding.
"""

from __future__ import annotations

import json
import os
import sys
from glob import glob

import torch
from safetensors.torch import load_file, save_file


def weight_dequant(x: torch.Tensor, s: torch.Tensor, block_size: int = 128) -> torch.Tensor:
    """``kernel.py``'s ``weight_dequant`` on the CPU: per block, float32 weight × its
    scale, stored as the default dtype (bfloat16)."""
    assert x.is_contiguous() and s.is_contiguous(), "Input tensors must be contiguous"
    assert x.dim() == 2 and s.dim() == 2, "Input tensors must have 2 dimensions"
    _, n = x.size()
    y = torch.empty_like(x, dtype=torch.get_default_dtype())
    for pid_m in range(s.size(0)):
        rows = slice(pid_m * block_size, (pid_m + 1) * block_size)
        scale = s[pid_m].repeat_interleave(block_size)[:n]  # s[pid_m, offs_n // BLOCK_SIZE]
        y[rows] = x[rows].to(torch.float32) * scale
    return y


def main(fp8_path: str, bf16_path: str) -> None:
    """``fp8_cast_bf16.main``, its device the CPU."""
    torch.set_default_dtype(torch.bfloat16)
    os.makedirs(bf16_path, exist_ok=True)
    with open(os.path.join(fp8_path, "model.safetensors.index.json")) as f:
        weight_map = json.load(f)["weight_map"]
    loaded_files: dict[str, dict[str, torch.Tensor]] = {}
    fp8_weight_names = []

    def get_tensor(tensor_name: str) -> torch.Tensor:
        file_name = weight_map[tensor_name]
        if file_name not in loaded_files:
            loaded_files[file_name] = load_file(os.path.join(fp8_path, file_name), device="cpu")
        return loaded_files[file_name][tensor_name]

    for safetensor_file in sorted(glob(os.path.join(fp8_path, "*.safetensors"))):
        file_name = os.path.basename(safetensor_file)
        current_state_dict = load_file(safetensor_file, device="cpu")
        loaded_files[file_name] = current_state_dict
        new_state_dict = {}
        for weight_name, weight in current_state_dict.items():
            if weight_name.endswith("_scale_inv"):
                continue
            if weight.element_size() == 1:  # FP8 weight
                scale_inv_name = f"{weight_name}_scale_inv"
                try:
                    scale_inv = get_tensor(scale_inv_name)
                    fp8_weight_names.append(weight_name)
                    new_state_dict[weight_name] = weight_dequant(weight, scale_inv)
                except KeyError:
                    print(f"Warning: Missing scale_inv tensor for {weight_name}, "
                          "skipping conversion")
                    new_state_dict[weight_name] = weight
            else:
                new_state_dict[weight_name] = weight
        save_file(new_state_dict, os.path.join(bf16_path, file_name))
        if len(loaded_files) > 2:  # keep only the 2 most recently used files
            del loaded_files[next(iter(loaded_files))]
    for weight_name in fp8_weight_names:
        weight_map.pop(f"{weight_name}_scale_inv", None)
    with open(os.path.join(bf16_path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=2)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__.split("\n\n")[1])
    main(*sys.argv[1:])
