"""The PyTorch side of :mod:`ms_port.check.optimizer`: torch's own AdamW, loaded from the
Trainer folder's ``optimizer.pt`` by torch's own ``load_state_dict``, one step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..errors import MsPortError


def torch_step(folder: Path, source: Any, state: Any, grads: dict[str, np.ndarray]
               ) -> dict[str, np.ndarray]:
    """The weights after one step of torch's AdamW from ``folder``'s state with ``grads``
    (by weight name; a weight without one takes no step, as in torch)."""
    import torch

    params = {n: torch.nn.Parameter(torch.from_numpy(
        np.array(source.tensors[n].load(), dtype=np.float32)))
        for g in state.groups for n in g.names}
    opt = torch.optim.AdamW([{"params": [params[n] for n in g.names],
                              "weight_decay": g.weight_decay} for g in state.groups])
    try:
        saved = torch.load(folder / "optimizer.pt", weights_only=True)
        opt.load_state_dict(saved)
    except (RuntimeError, ValueError, KeyError) as exc:
        raise MsPortError(f"{folder / 'optimizer.pt'}: torch's AdamW does not load it "
                          f"({exc})", path=folder) from None
    for name, grad in grads.items():
        params[name].grad = torch.from_numpy(grad)
    opt.step()
    return {n: params[n].detach().numpy().copy() for n in grads}
