"""Seeded reference checkpoints, for the demo, the tests and the benchmarks (no downloads)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def seeded_torch_model(arch: str, *, seed: int = 0, perturb_bn: bool = True,
                       **kwargs: Any) -> Any:
    """A registered architecture's PyTorch reference network with seeded random weights.

    Args:
        arch: a registered architecture name.
        seed: torch seed for the initialisation.
        perturb_bn: move BatchNorm statistics and affine parameters away from 0/1, so a
            swapped mean/variance or weight/bias changes the outputs.
    """
    import torch

    from .archs import get_arch

    torch.manual_seed(seed)
    model = get_arch(arch).build_torch(**kwargs)
    if perturb_bn:
        perturb_batchnorm(model, seed=seed + 1)
    return model.eval()


def perturb_batchnorm(model: Any, *, seed: int = 1) -> None:
    """Move BatchNorm statistics and affine parameters off 0/1, seeded, in place."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                n = module.num_features
                module.running_mean.copy_(torch.randn(n, generator=gen) * 0.1)
                module.running_var.copy_(torch.rand(n, generator=gen) + 0.5)
                module.weight.copy_(torch.rand(n, generator=gen) + 0.5)
                module.bias.copy_(torch.randn(n, generator=gen) * 0.1)


def save_reference_checkpoint(arch: str, path: str | Path, *, seed: int = 0,
                              **kwargs: Any) -> Path:
    """Save :func:`seeded_torch_model`'s state dict as a ``.pth`` and return the path."""
    import torch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(seeded_torch_model(arch, seed=seed, **kwargs).state_dict(), path)
    return path
