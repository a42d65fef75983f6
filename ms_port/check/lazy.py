"""A block's PyTorch network whose weights are read as each module runs, and let go after.

The float64 pass of verify by layers (the float32 noise) held a whole decoder layer in
float64: at Llama-3-70B's widths 855.7M parameters, 6.4 GiB, more than anything else the
run holds. The network is the same computation with each module's own weights put in just
before it runs (a forward pre-hook reads them from the source, in the pass's dtype) and
taken out again when it returns (a forward hook puts the meta tensors back): memory is the
largest module's weights, a 70B layer's ``gate_proj`` (1.75 GiB in float64), not the
layer's. The forward, every recorded output and every measure are those of the whole
network: nothing is split, only when the weights are in memory.

Only where every tensor of the block is one module's own parameter or buffer, under its
own name: a tensor the network builds from several of the file's (transformers 5's stacked
experts) or shares (a tied head) is loaded whole, as before (``on_demand`` returns None).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..read.sources import Source
from .reuse import Arena


def on_demand(model: Any, names: dict[str, str], source: Source, dtype: Any,
              arena: Arena | None = None) -> Any | None:
    """``model`` (built on the meta device) with each module's own tensors read from
    ``source`` as it runs, in ``dtype``, and let go after; None where a tensor of
    ``names`` (the network's name -> the source's) is not one module's own. ``arena``:
    where the casts are cut from (:mod:`ms_port.check.reuse`; a new one where None)."""
    import torch

    wanted = dict(names)
    as_torch = torch.from_numpy(np.empty(0, dtype)).dtype
    held: dict[Any, list[tuple[str, bool, str, Any]]] = {}
    for path, module in model.named_modules():
        for is_buffer, table in ((False, module._parameters), (True, module._buffers)):
            for attr, tensor in table.items():
                full = f"{path}.{attr}" if path else attr
                if tensor is None or full not in wanted:
                    continue
                if tensor.device.type != "meta":
                    return None
                held.setdefault(module, []).append((attr, is_buffer, wanted.pop(full), tensor))
    if wanted:
        return None
    # the placeholders say the dtype their tensors will have: a module may read another's
    # weight dtype before that one runs (DeepSeek-V3.2's indexer casts its input to
    # weights_proj's before calling it)
    for module, entries in held.items():
        for k, (attr, is_buffer, name, meta) in enumerate(entries):
            if meta.is_floating_point() and meta.dtype != as_torch:
                meta = meta.to(as_torch) if is_buffer else torch.nn.Parameter(
                    meta.to(as_torch), requires_grad=False)
                (module._buffers if is_buffer else module._parameters)[attr] = meta
                entries[k] = (attr, is_buffer, name, meta)

    # a module's weights are cast into the memory the modules before it were (its pages
    # already handed over by the kernel), once nothing holds those any more
    buffers = Arena() if arena is None else arena

    def put_in(module: Any, _args: Any) -> None:
        for attr, is_buffer, name, _meta in held[module]:
            array = np.asarray(source.tensors[name].load())
            if array.dtype != dtype:
                array = buffers.cast(array, dtype)
            tensor = torch.from_numpy(array)
            if is_buffer:
                module._buffers[attr] = tensor
            else:
                module._parameters[attr] = torch.nn.Parameter(tensor, requires_grad=False)

    def take_out(module: Any, _args: Any, _output: Any) -> None:
        for attr, is_buffer, _name, meta in held[module]:
            (module._buffers if is_buffer else module._parameters)[attr] = meta

    for module in held:
        module.register_forward_pre_hook(put_in)
        module.register_forward_hook(take_out)
    return model


__all__ = ["on_demand"]
