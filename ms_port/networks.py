"""Build both networks for verify, load each side's file, then hand over to :mod:`.parity`.

Loading is checked before any forward pass: a tensor the MindSpore network needs but
the checkpoint lacks is named, and the run fails without computing anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from .errors import MsPortError, ParityError
from .parity import ParityReport, correspondence_from_pairs, run_parity
from .sources import read_source


def _build(spec: Any, option: str, arch: Any, side: str) -> Any:
    """A network from the architecture, a ``module:callable`` string, a factory, or as given."""
    from .targets import instantiate

    if spec is None:
        return arch.build_torch() if side == "torch" else arch.build_mindspore()
    return instantiate(spec, option)


def load_torch_weights(model: Any, source: str | Path, **read: Any) -> None:
    """Load a checkpoint into a torch module strictly; a mismatch names the tensors."""
    import torch


    src = read_source(source, **read)
    state = {}
    for info in src:
        array = info.load()
        if info.dtype == "bfloat16":
            state[info.name] = torch.from_numpy(array.view("int16").copy()).view(torch.bfloat16)
        else:
            state[info.name] = torch.from_numpy(array.copy())
    result = model.load_state_dict(state, strict=False)
    missing = list(result.missing_keys)
    unexpected = list(result.unexpected_keys)
    if missing or unexpected:
        raise ParityError(
            f"{source} does not fit the PyTorch reference network: "
            f"{len(missing)} missing ({', '.join(missing[:3])}), {len(unexpected)} unexpected "
            f"({', '.join(unexpected[:3])}); check --arch / --torch-model", path=source)


def load_ms_weights(net: Any, checkpoint: str | Path) -> tuple[list[str], list[str]]:
    """Load a MindSpore checkpoint into ``net`` with MindSpore's ``load_param_into_net``.

    The file is read by ms-port's own reader, tensor by tensor. ``mindspore.load_checkpoint``
    refuses a file larger than the *free* memory (``SC_AVPHYS_PAGES``), which on a machine
    whose memory is mostly reclaimable page cache fails for a 300 MB ResNet.

    Returns:
        (network parameters the checkpoint did not fill, checkpoint entries not used).
    """
    import mindspore as ms

    path = Path(checkpoint)
    params = {}
    for info in read_source(path, strip_prefixes=False):
        array = info.load()
        tensor = (ms.Tensor(array.astype(np.float32), dtype=ms.bfloat16)
                  if info.dtype == "bfloat16" else ms.Tensor(np.array(array)))  # keeps 0-d shape
        params[info.name] = ms.Parameter(tensor, name=info.name)
    try:
        not_loaded, unused = ms.load_param_into_net(net, params)
    except (RuntimeError, ValueError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ParityError(f"{path}: MindSpore cannot load it into the network ({first}); "
                          "convert it again against this architecture", path=path) from None
    return list(not_loaded), list(unused)


def run_verify(
    source: str | Path,
    checkpoint: str | Path,
    *,
    arch: str | None = None,
    torch_model: Any = None,
    ms_model: Any = None,
    mapping: Any = None,
    tol: float = 1e-5,
    seed: int = 0,
    batch: int = 1,
    input_shape: tuple[int, ...] | None = None,
    dtype: str = "float32",
    torch_device: str = "cpu",
    ms_device: str = "cpu",
    noise_floor: bool = True,
    key: str | None = None,
    unsafe_pickle: bool = False,
    progress: Callable[[str], None] | None = None,
) -> ParityReport:
    """See :func:`ms_port.api.verify`."""
    from .api import resolve_mapping
    from .matching import make_plan
    from .targets import from_cell

    entry = None
    if arch is not None:
        from .archs import get_arch

        entry = get_arch(arch)
    elif torch_model is None or ms_model is None:
        raise MsPortError("give arch=..., or both torch_model and ms_model")
    shape = input_shape or (entry.input_shape if entry else None)
    if shape is None:
        raise MsPortError("no input shape: pass --input-shape C,H,W (input_shape=...) for "
                          "custom networks")
    step = progress or (lambda _msg: None)

    # read and validate both files before building anything heavy
    src = read_source(source, key=key, unsafe_pickle=unsafe_pickle)
    ckpt = read_source(checkpoint, strip_prefixes=False)
    swapped = src.format == "mindspore-ckpt" and ckpt.format != "mindspore-ckpt"
    if swapped:  # given MindSpore first (e.g. after an export): both directions work
        source, checkpoint = checkpoint, source
        src = read_source(source, key=key, unsafe_pickle=unsafe_pickle)

    step("building the PyTorch network")
    tnet = _build(torch_model, "--torch-model", entry, "torch")
    load_torch_weights(tnet, source, key=key, unsafe_pickle=unsafe_pickle)
    step("building the MindSpore network")
    mnet = _build(ms_model, "--ms-model", entry, "mindspore")
    step(f"loading {checkpoint}")
    not_loaded, unused = load_ms_weights(mnet, checkpoint)

    plan = make_plan(src, from_cell(mnet), resolve_mapping(mapping, arch=arch),
                     allow_missing=True, allow_unused=True)
    correspondence = correspondence_from_pairs((m.target, m.source) for m in plan.matches)
    if not_loaded:
        return _not_loaded_report(checkpoint, not_loaded, unused, tol=tol, shape=shape,
                                  batch=batch, seed=seed, dtype=dtype,
                                  torch_device=torch_device, ms_device=ms_device)
    report = run_parity(tnet, mnet, input_shape=tuple(shape), batch=batch, seed=seed,
                        tol=tol, dtype=dtype, torch_device=torch_device,
                        ms_device=ms_device, correspondence=correspondence,
                        noise_floor=noise_floor, progress=progress)
    if swapped:
        report.notes.append(f"{checkpoint} is the MindSpore side, {source} the PyTorch side")
    if unused:
        report.notes.append(f"{len(unused)} checkpoint entries unused by the network: "
                            f"{', '.join(unused[:3])}")
    return report


def _not_loaded_report(checkpoint: Any, not_loaded: list[str], unused: list[str], *,
                       tol: float, shape: tuple[int, ...], batch: int, seed: int,
                       dtype: str, torch_device: str, ms_device: str) -> ParityReport:
    names = ", ".join(not_loaded[:5]) + (" …" if len(not_loaded) > 5 else "")
    message = (f"{checkpoint} lacks {len(not_loaded)} tensor"
               f"{'s' * (len(not_loaded) != 1)} the MindSpore network needs: {names} — "
               "nothing was run; convert again")
    notes = [f"not in the checkpoint: {n}" for n in not_loaded]
    notes += [f"in the checkpoint but unused: {n}" for n in unused]
    return ParityReport(
        ok=False, tol=tol, error=float("inf"), max_abs=float("inf"), outputs=[],
        noise_floor=None, first_divergence=None, input_shape=tuple(shape), batch=batch,
        seed=seed, dtype=dtype, torch_device=torch_device, ms_device=ms_device,
        message=message, notes=notes)
