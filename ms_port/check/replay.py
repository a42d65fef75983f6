"""Each layer's own error: PyTorch run again, fed MindSpore's outputs of the layers before.

A layer's error against PyTorch holds two things: what the layer itself (and the operations
between it and the layers before it) computes differently, and its input's error, carried
through. Most layers carry their input's error at about its size, and the bound
(:mod:`.verdict`) follows it. Some amplify it: a softmax of logits in the thousands is
nearly an argmax, and where two logits nearly tie, a rounding-sized change of them moves
the result by a whole bin. A YOLOv10-L's DFL layer, converted exactly, compared 15× over
PyTorch's own float32 noise on one input (its inputs 1.8×): the relative error was that of
a single anchor, whose two largest box logits (near 2,900) tied to within rounding;
PyTorch's own float32 result without oneDNN differed from its oneDNN one by as much
(1.4e-4 against MindSpore's 1.5e-4), and MindSpore's DFL fed MindSpore's input gave
PyTorch's float64 result on that input to 3.9e-10.

So where a layer is above its bound, PyTorch runs once more (:class:`Replay`): each paired
layer's output is first measured against MindSpore's output of that call, then *replaced*
by it, so that every later layer computes from the values MindSpore's layers produced. The
first measure is the layer's **own** error — what it, and what runs between it and the
layers before it, adds. A layer above its bound whose own error is within it computed what
PyTorch computes on that input: it is ``amplified``, not failed, as long as no layer before
it failed. A layer that differs (another weight, a swapped statistic, an epsilon, another
activation between the layers) shows its difference in its own error, and fails as before.

Only a layer whose output is one floating-point tensor of PyTorch's shape (after the
comparison's relayout) is replaced; the others are measured and left as they are, so
what follows them is judged with their error included — never more leniently.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .compare import comparable, relative_error, torch_outputs
from .layers import Pair, _float_arrays, with_hooks


def _replacements(pairs: list[Pair]) -> dict[tuple[str, int], list[np.ndarray]]:
    """(PyTorch path, call) -> MindSpore's outputs of that call in PyTorch's shapes, for
    the pairs whose outputs are the same quantity on both sides."""
    found: dict[tuple[str, int], list[np.ndarray]] = {}
    for pair in pairs:
        if pair.unlike is not None or len(pair.ms.arrays) != len(pair.torch.arrays):
            continue
        shaped = [comparable(m, t) for m, t in zip(pair.ms.arrays, pair.torch.arrays)]
        if any(isinstance(s, str) for s in shaped):
            continue
        found[(pair.torch.path, pair.torch.call)] = shaped
    return found


class Replay:
    """Hooks for a PyTorch pass in which each paired layer call is measured against
    MindSpore's output of the same call, then continues with MindSpore's output in place
    of its own (module docstring). ``own[(path, call)]``: the relative L2 error of
    MindSpore's output against PyTorch's, given MindSpore's values before it."""

    def __init__(self, pairs: list[Pair]):
        self.ms = _replacements(pairs)
        self.calls: dict[str, int] = {}
        self.own: dict[tuple[str, int], float] = {}

    def hook(self, path: str) -> Callable[..., Any]:
        def replay(_layer: Any, _args: Any, output: Any) -> Any:
            call = self.calls.get(path, 0)
            self.calls[path] = call + 1
            ms = self.ms.get((path, call))
            if ms is None:
                return None
            arrays = _float_arrays(torch_outputs(output))
            if [a.shape for a in arrays] != [a.shape for a in ms]:
                return None
            self.own[(path, call)] = max(
                (relative_error(m, a)[0] for m, a in zip(ms, arrays)), default=0.0)
            return _replaced(output, ms)
        return replay

    def run(self, model: Any, run: Callable[[], Any]) -> tuple[Any, dict[tuple[str, int], float]]:
        return with_hooks(model, self.hook, run), self.own


def _replaced(output: Any, ms: list[np.ndarray]) -> Any:
    """MindSpore's values in place of a single floating-point tensor output; ``None`` (keep
    PyTorch's) for anything else."""
    import torch

    if not isinstance(output, torch.Tensor) or not output.is_floating_point() or len(ms) != 1:
        return None
    value = ms[0]
    if tuple(value.shape) != tuple(output.shape):
        return None
    # a copy: what runs after may change it in place (ReLU(inplace=True)), and the
    # recorded MindSpore output must stay as it was
    return torch.from_numpy(np.array(value, copy=True)).to(dtype=output.dtype,
                                                           device=output.device)
