"""Seeded reference checkpoints, for the demo, the tests and the benchmarks (no downloads)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np


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


def training_output(root: str | Path, arrays: dict[str, Any], layouts: dict[str, tuple],
                    *, stages: dict[str, int] | None = None, saves: tuple = ((1, 10),),
                    fmt: str = "ckpt", remove_redundancy: bool = False,
                    prefix: str = "llama") -> Path:
    """A distributed training output as MindFormers lays it out, sliced by MindSpore's own
    ``transform_checkpoints`` from the whole ``arrays`` (numpy, float32/float16/bfloat16):
    ``root/checkpoint/rank_{i}/{prefix}_rank_{i}-{epoch}_{step}.{fmt}`` and
    ``root/strategy/ckpt_strategy_rank_{i}.ckpt`` (MindSpore's protobuf).

    Args:
        layouts: name -> ``(dev_matrix, tensor_map)`` or ``(dev_matrix, tensor_map,
            opt_shard_size, opt_shard_step)``; a tensor map entry may be a list of axes
            (the layout form). A name without a layout is replicated.
        stages: name -> pipeline stage (default 0); every stage has the same grid.
        saves: (epoch, step) of each save; an earlier save holds other values (the arrays
            negated), so reading the wrong one shows.
        remove_redundancy: keep each slice on the first rank holding it only.

    Returns:
        ``root``.
    """
    import shutil

    import mindspore as ms
    from mindspore.train import node_strategy_pb2

    root = Path(root)
    stages = stages or {}
    count = max(stages.values(), default=0) + 1
    work = root / ".work"
    for stage in range(count):
        names = [n for n in arrays if stages.get(n, 0) == stage]
        sm = node_strategy_pb2.ParallelStrategyMap(current_stage=stage)
        devices = 1
        for name in names:
            if name not in layouts:
                continue
            dev, tmap, *opt = layouts[name]
            devices = int(np.prod(dev))
            item = sm.parallel_layout_item.add(param_name=name)
            lay = item.parallel_layouts
            lay.dev_matrix.add().dim.extend(dev)
            if any(isinstance(t, (list, tuple)) for t in tmap):
                for t in tmap:
                    lay.tensor_map.add().dim.extend(t if isinstance(t, (list, tuple)) else [t])
            else:
                lay.tensor_map.add().dim.extend(tmap)
            lay.param_split_shape.add()
            lay.indices_offset.add()
            lay.field = 0
            lay.opt_weight_shard_size, lay.opt_weight_shard_step = [*opt, 0, 0][:2]
        strategy = work / f"strategy_{stage}.ckpt"
        strategy.parent.mkdir(parents=True, exist_ok=True)
        strategy.write_bytes(sm.SerializeToString())
        for k, (epoch, step) in enumerate(saves):
            sign = 1 if k == len(saves) - 1 else -1
            full = work / f"full_{stage}_{k}" / "rank_0"
            full.mkdir(parents=True)
            ms.save_checkpoint([{"name": n, "data": _ms_tensor(arrays[n], sign)} for n in names],
                               str(full / "whole.ckpt"))
            sliced = work / f"sliced_{stage}_{k}"
            ms.transform_checkpoints(str(full.parent), str(sliced), "part", None, str(strategy))
            first = stage * devices
            for local in range(devices):
                rank = first + local
                got = next((sliced / f"rank_{local}").glob("*.ckpt"))
                dest = root / "checkpoint" / f"rank_{rank}"
                dest.mkdir(parents=True, exist_ok=True)
                name = dest / f"{prefix}_rank_{rank}-{epoch}_{step}.{fmt}"
                params = ms.load_checkpoint(str(got))
                if remove_redundancy:
                    params = {n: p for n, p in params.items()
                              if _first_holder(layouts.get(n), local)}
                ms.save_checkpoint(params, str(name), format="safetensors" if fmt ==
                                   "safetensors" else "ckpt")
                (root / "strategy").mkdir(exist_ok=True)
                shutil.copyfile(strategy, root / "strategy" / f"ckpt_strategy_rank_{rank}.ckpt")
    shutil.rmtree(work)
    return root


def _ms_tensor(array: Any, sign: int) -> Any:
    import mindspore as ms

    from .read.tensors import dtype_name

    name = dtype_name(array.dtype)
    if name not in ("float32", "float16", "bfloat16"):  # counters: as they are
        return ms.Tensor(array)
    dtype = {"bfloat16": ms.bfloat16, "float16": ms.float16}.get(name, ms.float32)
    return ms.Tensor(np.asarray(array, dtype=np.float32) * sign, dtype)


def _first_holder(layout: tuple | None, local: int) -> bool:
    """Whether stage-local rank ``local`` is the first holding its slice (for
    remove_redundancy): the same box on no lower rank."""
    if layout is None:
        return local == 0
    from .read.strategy import ParamLayout

    dev, tmap, *opt = layout
    lay = ParamLayout("", tuple(dev), tuple(tuple(a for a in (t if isinstance(t, (list, tuple))
                                                              else [t]) if a != -1)
                                            for t in tmap), *[*opt, 0, 0][:2])
    shape = tuple(8 * n for n in lay.parts) or ()
    if shape:
        shape = (shape[0] * max(lay.opt_parts, 1), *shape[1:])
    mine = lay.box(local, shape)
    return all(lay.box(k, shape) != mine for k in range(local))
