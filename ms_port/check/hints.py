"""Known ways a MindSpore network computes differently from its PyTorch twin.

When verify fails at a layer, the two layers' settings are read (never their weights):
a difference listed here is a *network* difference, not a conversion error, and the
report says so with the fix. Each entry is data: the layer kinds it applies to, how to
read the setting on each side, and the sentence to say. MindCV, for one, pads stride-2
convolutions and pools ``same`` (extra bottom/right), keeps MindSpore's LayerNorm epsilon
(1e-7, PyTorch 1e-5) and uses the tanh-approximate GELU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class KnownDifference:
    kinds: frozenset[str]  # MindSpore cell class names it applies to
    differs: Callable[[Any, Any], bool]  # (torch module, MindSpore cell) -> differs?
    says: Callable[[Any, Any], str]


def _stride(x: Any) -> int:
    value = x[-1] if isinstance(x, (tuple, list)) else x
    return int(value or 1)


def _pads_same_at_stride(t: Any, m: Any) -> bool:
    mode = str(getattr(m, "pad_mode", "")).lower()
    return mode == "same" and _stride(getattr(m, "stride", 1)) > 1


def _eps(t: Any, m: Any) -> tuple[float, float] | None:
    te, me = getattr(t, "eps", None), getattr(m, "epsilon", getattr(m, "eps", None))
    if te is None or me is None:
        return None
    return float(te), float(me)


def _gelu(t: Any, m: Any) -> tuple[str, str]:
    return str(getattr(t, "approximate", "none")), str(getattr(m, "approximate", "none"))


def _ceil(t: Any, m: Any) -> tuple[bool, bool]:
    return bool(getattr(t, "ceil_mode", False)), bool(getattr(m, "ceil_mode", False))


def _ceil_says(t: Any, m: Any) -> str:
    torch_up, ms_up = _ceil(t, m)
    return (f"PyTorch rounds this pool's output size {'up' if torch_up else 'down'} "
            f"(ceil_mode={torch_up}), MindSpore {'up' if ms_up else 'down'}: a network "
            "difference, not a conversion error — build the MindSpore pool with "
            f"pad_mode='pad' and ceil_mode={torch_up}")


#: the same activation under each framework's name
_SAME_ACTIVATION = {"SiLU": "Swish", "Hardswish": "HSwish", "Hardsigmoid": "HSigmoid",
                    "HardSwish": "HSwish", "HardSigmoid": "HSigmoid"}
_ACTIVATIONS = frozenset({"ReLU", "ReLU6", "SiLU", "Swish", "Sigmoid", "HSwish", "HSigmoid",
                          "Tanh", "GELU", "LeakyReLU", "ELU", "Mish", "Softplus", "PReLU"})


def _activations_differ(t: Any, m: Any) -> bool:
    kinds = [type(x).__name__ for x in (t, m)]
    same = [_SAME_ACTIVATION.get(k, k) for k in kinds]
    return same[0] in _ACTIVATIONS and same[0] != same[1]


KNOWN: tuple[KnownDifference, ...] = (
    KnownDifference(
        _ACTIVATIONS,
        _activations_differ,
        lambda t, m: (f"the activation differs: PyTorch {type(t).__name__}, MindSpore "
                      f"{type(m).__name__}: a network difference, not a conversion error")),
    KnownDifference(
        frozenset({"Conv2d", "MaxPool2d", "AvgPool2d", "Conv1d", "Conv3d"}),
        _pads_same_at_stride,
        lambda t, m: ("MindSpore pads this stride-2 layer 'same' (the extra row and column "
                      "at the bottom/right); PyTorch pads both sides: a network difference, "
                      "not a conversion error — build the MindSpore side with "
                      "pad_mode='pad' and PyTorch's padding to compare")),
    KnownDifference(
        frozenset({"LayerNorm", "BatchNorm1d", "BatchNorm2d", "GroupNorm"}),
        lambda t, m: (e := _eps(t, m)) is not None and abs(e[0] - e[1]) > 1e-12,
        lambda t, m: (f"epsilon differs: PyTorch {_eps(t, m)[0]:g}, MindSpore "
                      f"{_eps(t, m)[1]:g} (MindSpore's LayerNorm defaults to 1e-7) — set "
                      "the same epsilon on the MindSpore side")),
    KnownDifference(
        frozenset({"GELU"}),
        lambda t, m: _gelu(t, m)[1] not in (_gelu(t, m)[0], "False", "none"),
        lambda t, m: (f"GELU approximation differs: PyTorch {_gelu(t, m)[0]!r}, MindSpore "
                      f"{_gelu(t, m)[1]!r} — use the exact GELU (approximate=False) on the "
                      "MindSpore side")),
    KnownDifference(
        frozenset({"MaxPool2d", "AvgPool2d", "MaxPool1d", "AvgPool1d"}),
        lambda t, m: _ceil(t, m)[0] != _ceil(t, m)[1],
        _ceil_says),
    KnownDifference(
        frozenset({"Conv2d", "Dense", "Conv1d"}),
        lambda t, m: getattr(t, "bias", None) is not None and not getattr(m, "has_bias", True),
        lambda t, m: ("the PyTorch layer has a bias the MindSpore layer lacks (has_bias=False)"
                      " — its bias is left out of the conversion")),
)


def explain(torch_layer: Any, ms_layer: Any) -> list[str]:
    """The known differences between two paired layers, one sentence each."""
    if torch_layer is None or ms_layer is None:
        return []
    kinds = {cls.__name__ for cls in type(ms_layer).__mro__}
    found = []
    for known in KNOWN:
        try:
            if known.kinds & kinds and known.differs(torch_layer, ms_layer):
                found.append(known.says(torch_layer, ms_layer))
        except (TypeError, ValueError, AttributeError):  # a layer without such settings
            continue
    return found
