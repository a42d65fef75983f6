"""Build both networks for verify and load each side's file into its network.

Loading is checked before any forward pass: a tensor the MindSpore network needs but
the checkpoint lacks is named, and the run fails without computing anything.
"""

from __future__ import annotations

import collections
import re
from pathlib import Path
from typing import Any

import numpy as np

from ..archs.experts import stack_experts
from ..errors import ParityError
from ..read.sources import Source, read_source
from .report import FAIL, ParityReport


def build_network(spec: Any, option: str, arch: Any, side: str) -> Any:
    """A network from the architecture, a ``module:callable`` string, a factory, or as given.

    The MindSpore side is built under ``no_init_parameters`` (MindSpore >= 2.5): its
    weights come from the checkpoint, so drawing random ones first only costs time
    (ResNet50: 0.6 s of 0.7 s). A parameter the checkpoint does not fill is named before
    anything runs (:func:`load_ms_weights`).
    """

    from ..read.targets import instantiate

    if side == "torch":
        return arch.build_torch() if spec is None else instantiate(spec, option)
    from ..read.targets import without_weights

    # a factory that reads its parameters while building (MindCV's ConvNeXt) is built the
    # ordinary way
    return without_weights(
        lambda: arch.build_mindspore() if spec is None else instantiate(spec, option))


def load_torch_weights(model: Any, src: Source) -> None:
    """Load an already-read checkpoint into a torch module; a mismatch names the tensors.
    A transformers 5 mixture of experts gets its stacked experts from the file's
    per-expert tensors (:data:`~ms_port.archs.experts.STACKED_IN_MEMORY`)."""
    import torch

    source = src.path
    state = {}
    for info in src:
        array = info.load()
        if info.dtype == "bfloat16":
            state[info.name] = torch.from_numpy(array.view("int16").copy()).view(torch.bfloat16)
        else:
            state[info.name] = torch.from_numpy(array.copy())
    stack_experts(state, dict(model.named_parameters()))
    # a module's _load_from_state_dict may read its version from the state dict's
    # _metadata (torchvision's MNASNet refuses a state without it), which the safe reader
    # does not keep: the reference network's own, as load_state_dict(state_dict()) has it
    state = collections.OrderedDict(state)
    state._metadata = getattr(model.state_dict(), "_metadata", None)  # type: ignore[attr-defined]
    result = model.load_state_dict(state, strict=False)
    tied = tied_names(model)
    # a tied parameter (an LM head that is the embedding) is filled through its twin
    missing = [k for k in result.missing_keys if not (tied.get(k, set()) & set(state))]
    # what transformers' model declares it does not hold (DeepSeek-V3: the Hub's MTP layer,
    # model.layers.61), as its from_pretrained leaves it out
    ignored = [re.compile(p) for p in getattr(model, "_keys_to_ignore_on_load_unexpected",
                                              None) or ()]
    # the Multi-Token Prediction layers a config counts after the last layer (DeepSeek-V3's
    # model.layers.{num_hidden_layers}), which transformers' network does not hold
    config = getattr(model, "config", None)
    extra, layers = (getattr(config, "num_nextn_predict_layers", 0) or 0,
                     getattr(config, "num_hidden_layers", None))
    if isinstance(extra, int) and isinstance(layers, int) and 0 < extra <= 16:
        numbers = "|".join(str(layers + k) for k in range(extra))
        ignored.append(re.compile(rf"^model\.layers\.({numbers})\."))
    unexpected = [k for k in result.unexpected_keys if not any(p.search(k) for p in ignored)]
    if missing or unexpected:
        raise ParityError(
            f"{source} does not fit the PyTorch reference network: "
            f"{len(missing)} missing ({', '.join(missing[:3])}), {len(unexpected)} unexpected "
            f"({', '.join(unexpected[:3])}); check --arch / --torch-model", path=source)


def tied_names(model: Any) -> dict[str, set[str]]:
    """Parameter name -> the other names of the very same parameter (tied weights)."""
    by_id: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(param), []).append(name)
    return {n: set(names) - {n} for names in by_id.values() if len(names) > 1 for n in names}


def load_ms_weights(net: Any, checkpoint: str | Path | Source) -> tuple[list[str], list[str]]:
    """Load a MindSpore checkpoint into ``net`` with MindSpore's ``load_param_into_net``.

    The file is read by ms-port's own reader, tensor by tensor. ``mindspore.load_checkpoint``
    refuses a file larger than the *free* memory (``SC_AVPHYS_PAGES``), which on a machine
    whose memory is mostly reclaimable page cache fails for a 300 MB ResNet.

    Returns:
        (network parameters the checkpoint did not fill, checkpoint entries not used).
    """
    import mindspore as ms

    read = (checkpoint if isinstance(checkpoint, Source)
            else read_source(checkpoint, strip_prefixes=False))
    path = Path(read.path)
    # a narrower float held where the network computes in float32 (ultralytics' float16
    # weights) is widened here, exactly, rather than by MindSpore with a warning per tensor
    wide = {p.name for p in net.get_parameters() if p.dtype == ms.float32}
    params = {}
    for info in read:
        array = info.load()
        if info.name in wide and info.dtype in ("float16", "bfloat16"):
            tensor = ms.Tensor(np.asarray(array, dtype=np.float32))
        elif info.dtype == "bfloat16":
            tensor = ms.Tensor(array.astype(np.float32), dtype=ms.bfloat16)
        else:
            tensor = ms.Tensor(np.asarray(array))  # copies; 0-d kept
        params[info.name] = ms.Parameter(tensor, name=info.name)
    try:
        not_loaded, unused = ms.load_param_into_net(net, params)
    except (RuntimeError, ValueError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ParityError(f"{path}: MindSpore cannot load it into the network ({first}); "
                          "convert it again against this architecture", path=path) from None
    return list(not_loaded), list(unused)


def not_loaded_report(checkpoint: Any, not_loaded: list[str], unused: list[str],
                      run: Any) -> ParityReport:
    """The FAIL of a checkpoint that lacks tensors the network needs, before any forward;
    ``run`` (a :class:`~ms_port.check.parity.Run`) is how the forward would have run."""
    names = ", ".join(not_loaded[:5]) + (" …" if len(not_loaded) > 5 else "")
    message = (f"FAIL: {checkpoint} lacks {len(not_loaded)} tensor"
               f"{'s' * (len(not_loaded) != 1)} the MindSpore network needs: {names} — "
               "nothing was run; convert again")
    notes = [f"not in the checkpoint: {n}" for n in not_loaded]
    notes += [f"in the checkpoint but unused: {n}" for n in unused]
    feed = run.feed
    first = np.asarray(feed[0].array) if feed else np.zeros((1,))
    return ParityReport(
        ok=False, tol=run.tol, error=float("inf"), max_abs=float("inf"), outputs=[],
        noise_floor=None, first_divergence=None, input_shape=tuple(first.shape[1:]),
        batch=int(first.shape[0]), seed=run.seed, dtype=run.dtype,
        torch_device=run.torch_device, ms_device=run.ms_device, message=message, notes=notes,
        verdict=FAIL,
        reasons=[message[len("FAIL: "):]], inputs=[i.to_dict() for i in feed])
