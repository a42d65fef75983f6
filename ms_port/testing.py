"""Seeded reference checkpoints, for the demo, the tests and the benchmarks (no downloads)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any


def seeded_torch_model(arch: str, *, seed: int = 0, perturb_bn: bool = True,
                       bn_from_data: bool = False, bn_input_shape: tuple[int, ...] | None = None,
                       **kwargs: Any) -> Any:
    """A registered architecture's PyTorch reference network with seeded random weights.

    Args:
        arch: a registered architecture name.
        seed: torch seed for the initialisation.
        perturb_bn: move BatchNorm statistics and affine parameters away from 0/1, so a
            swapped mean/variance or weight/bias changes the outputs.
        bn_from_data: then estimate the BatchNorm statistics on a few seeded batches, as
            training does (:func:`estimate_batchnorm`): what a trained network's rounding
            looks like; on ``bn_input_shape`` samples (default: the architecture's).
    """
    import torch

    from .archs import get_arch

    torch.manual_seed(seed)
    entry = get_arch(arch)
    model = entry.build_torch(**kwargs)
    if perturb_bn:
        perturb_batchnorm(model, seed=seed + 1)
    if bn_from_data:
        estimate_batchnorm(model, bn_input_shape or entry.input_shape, batches=2, batch=4,
                           seed=seed + 2)
    return model.eval()


def estimate_batchnorm(model: Any, input_shape: tuple[int, ...], *, batches: int = 4,
                       batch: int = 8, seed: int = 2) -> Any:
    """Set every BatchNorm's running statistics from seeded batches, in place.

    The model runs in train mode with a cumulative average (``momentum=None``) over
    ``batches`` standard-normal batches, then returns to eval mode. Perturbed statistics
    give tiny rounding errors (~5e-7 on a ResNet50); statistics from data give what a
    trained network gives (~2e-5), which is what verify must judge right.
    """
    import torch

    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    saved = [m.momentum for m in norms]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None
    gen = torch.Generator().manual_seed(seed)
    model.train()
    with torch.no_grad():
        for _ in range(batches):
            model(torch.randn(batch, *input_shape, generator=gen))
    for m, momentum in zip(norms, saved):
        m.momentum = momentum
    return model.eval()


def as_trained(model: Any, *, seed: int = 1) -> Any:
    """Move every parameter an initialiser left constant (zero biases, unit norms, a
    zero-initialised head, 1e-5 layer scales) off its constant, as training does, in
    place: a trained network holds no such tensor, and a zero bias hides a layer the
    target lacks (torchvision's VGG initialises its convolution biases to zero)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            if param.is_floating_point() and param.numel() and bool(
                    (param == param.flatten()[0]).all()):
                scale = 0.1 * float(param.abs().mean()) + 0.02
                param.add_(torch.randn(param.shape, generator=gen) * scale)
    return model


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


def with_reversed(src: str | Path, dst: str | Path, name: str) -> Path:
    """A copy of the ``.ckpt`` ``src`` at ``dst`` with tensor ``name``'s rows reversed (the
    same shape and values, in another order): a wrong conversion no shape check sees."""
    return rewrite_checkpoint(src, dst, lambda t: t.update({name: t[name][::-1].copy()}) or t)


def rewrite_checkpoint(src: str | Path, dst: str | Path, edit: Any) -> Path:
    """Copy a MindSpore ``.ckpt`` through ``edit(dict name -> array)``, which may change,
    swap or delete entries: how the tests make a wrong conversion on purpose."""
    import numpy as np

    from .read.ckpt import CkptReader, CkptWriter

    with CkptReader(src) as reader:
        arrays = {e.name: np.array(reader.load(e.name)) for e in reader.entries}
    edit(arrays)
    with open(dst, "wb") as f, CkptWriter(f) as writer:
        for name, array in arrays.items():
            writer.write(name, array)
    return Path(dst)


#: tiny Hugging Face causal LMs for tests: model_type -> (config class, model class, sizes)
TINY_LMS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {"num_key_value_heads": 2}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"num_key_value_heads": 4}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"num_key_value_heads": 2}),
}


def tiny_hf_lm(kind: str, path: str | Path, *, tied: bool = False, dtype: str = "float32",
               shard: str | None = None, seed: int = 0, layers: int = 2,
               config: dict[str, Any] | None = None) -> Path:
    """Save a seeded tiny Hugging Face causal LM directory (``save_pretrained``).

    GQA (8 heads, fewer KV heads), hidden 64, vocab 128. Every RMSNorm weight is moved off
    1 and every bias off 0, so a swapped norm or bias changes the logits.

    Args:
        kind: ``llama``, ``mistral`` or ``qwen2`` (q/k/v biases).
        tied: tie the LM head to the embedding.
        dtype: ``float32`` or ``bfloat16`` on disk.
        shard: a ``max_shard_size`` (``"40KB"``) for a sharded set with an index.
        config: more config values (``rope_scaling``, ``max_position_embeddings``).
    """
    import torch
    import transformers

    config_cls, model_cls, extra = TINY_LMS[kind]
    config = getattr(transformers, config_cls)(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
        **{"num_attention_heads": 8, "max_position_embeddings": 64, "tie_word_embeddings": tied,
           "rms_norm_eps": 1e-6, **extra, **copy.deepcopy(config or {})})  # it edits them
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1 + 0.2 * torch.randn(param.shape, generator=gen))
            elif name.endswith(".bias"):
                param.copy_(0.1 * torch.randn(param.shape, generator=gen))
    model = model.to(getattr(torch, dtype))
    path = Path(path)
    kwargs = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(path, **kwargs)
    return path
