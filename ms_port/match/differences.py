"""When the two networks differ, say so, in one line each, instead of a line per tensor.

A plan's leftovers mean one of two things. Either the engine could not tell which tensor
goes where (names and structure leave a choice: the refusal names the candidates), or the
two networks are not the same network, and no mapping can make them one: timm's VGG holds
a bias in every convolution MindCV's lacks; MindCV's ResNetV2 normalises after its stem
and in its shortcuts, timm's does not. Suggesting ``drop:`` for the second would invite a
user to throw away trained weights and get another network.

:func:`find` names the second kind from the leftovers alone:

- **a bias the other side lacks**: a source layer's weight filled a target layer that
  has no bias, and its bias is left, holding values (a zero one is dropped on the way:
  the layer computes the same without it);
- **layers with no counterpart**: leftover tensors of a shape (its rows and their size,
  :func:`~ms_port.match.align.rows`) that no leftover on the other side has. A tensor
  with such a counterpart is not a difference: the engine could not place it, and its
  own line names the candidates.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from ..read.sources import MINDSPORE_FORMATS
from ..read.tensors import format_shape
from .align import rows, unit_of


@dataclass(frozen=True)
class Difference:
    """One way the two networks differ.

    Attributes:
        kind: ``absent`` (a part of the target the checkpoint lacks altogether, which the
            target declares optional), ``bias`` (layers with a bias on one side only),
            ``layers`` (tensors with no counterpart of their shape on the other side) or
            ``constant`` (a buffer holding other values than the constant the target
            network builds: :mod:`.constants`).
        text: the one line a refusal leads with.
        tensors: the leftover tensors it accounts for (their own lines are not repeated).
    """

    kind: str
    text: str
    tensors: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "text": self.text, "tensors": list(self.tensors)}


#: layers named per line, at most
SHOWN = 3


def _sides(plan: Any) -> tuple[str, str]:
    """What to call the source's and the target's framework."""
    if plan.source.format in MINDSPORE_FORMATS:  # export: MindSpore to PyTorch
        return "MindSpore", "PyTorch"
    return "PyTorch", "MindSpore"


def find(plan: Any, known: list[Difference] = ()) -> list[Difference]:
    """The differences between the two networks the plan's leftovers show (module
    docstring), after those already ``known`` (a constant holding other values:
    :mod:`.constants`); empty where every leftover could still have a counterpart."""
    found = [*known, *_absent(plan)]
    bias = _biases(plan)
    if bias is not None:
        found.append(bias)
    explained = {n for d in found for n in d.tensors}
    layers = _layers(plan, explained)
    if layers is not None:
        found.append(layers)
    return found


def _absent(plan: Any) -> list[Difference]:
    """A part of the target network the checkpoint lacks altogether, where the target says
    it may (:attr:`~ms_port.read.targets.Target.optional`): one line, with its remedy."""
    found = []
    for prefix, says in getattr(plan.target, "optional", {}).items():
        lacking = [m.name for m in plan.missing if m.name.startswith(prefix)]
        held = [m for m in plan.matches if m.target.startswith(prefix) and m.source]
        if lacking and not held:
            found.append(Difference("absent", says, tuple(lacking)))
    return found


def _biases(plan: Any) -> Difference | None:
    # a weight filled a layer, alone or as one part of a fused one (Qwen2's q/k/v into a
    # LLaMA's w_qkv)
    layer_of = {s.rpartition(".")[0]: m.target.rpartition(".")[0]
                for m in plan.matches if m.part is None
                for s in m.sources if s.rpartition(".")[2] == "weight"}
    found = []
    for u in plan.unused:
        path, _, leaf = u.name.rpartition(".")
        layer = layer_of.get(path)
        if leaf == "bias" and layer is not None and not any(
                f"{layer}.{b}" in plan.target for b in ("bias", "beta")):
            found.append((u.name, path, layer))
    if not found:
        return None
    src, tgt = _sides(plan)
    (_, path, layer), more = found[0], len(found) - 1
    others = ", ".join(p for _, p, _ in found[1:1 + SHOWN])
    text = (f"the networks differ: {src}'s {path} has a bias, {tgt}'s {layer} has none"
            + (f", and so have {more} more layers ({others}{', …' if more > SHOWN else ''})"
               if more else "")
            + ": no conversion computes the same network (the biases hold trained values) "
            f"— the {tgt} layers must have a bias (has_bias=True) to convert")
    return Difference("bias", text, tuple(n for n, _, _ in found))


def _key(shape: tuple[int, ...]) -> tuple[int, int]:
    return rows(shape)


def _layers(plan: Any, explained: set[str]) -> Difference | None:
    missing = [m for m in plan.missing if m.name not in explained and m.skipped is None]
    unused = [u for u in plan.unused if u.name not in explained]
    if not missing and not unused:
        return None
    have_s = Counter(_key(u.shape) for u in unused)
    have_t = Counter(_key(m.shape) for m in missing)
    alone_t = [m for m in missing if _key(m.shape) not in have_s]
    alone_s = [u for u in unused if _key(u.shape) not in have_t]
    fused = _rows_of_siblings(alone_s, alone_t, plan)
    alone_t = [m for m in alone_t if m.name not in fused]
    alone_s = [u for u in alone_s if u.name not in fused]
    if not alone_t and not alone_s:
        return None
    src, tgt = _sides(plan)
    parts = []
    if alone_t:
        parts.append(f"{tgt}'s network holds {_layer_list(alone_t, plan, True)} "
                     f"{src}'s has no counterpart of")
    if alone_s:
        parts.append(f"{src}'s holds {_layer_list(alone_s, plan, False)} "
                     f"{tgt}'s has no counterpart of")
    text = ("the networks differ: " + "; ".join(parts) + " (no tensor of their shape is "
            "left on the other side): no conversion computes the same network")
    return Difference("layers", text, tuple(x.name for x in (*alone_t, *alone_s)))


def _rows_of_siblings(alone_s: list[Any], alone_t: list[Any], plan: Any) -> set[str]:
    """Leftovers that may be one layer's rows on one side and sibling layers on the
    other (timm's SwinV2 ``qkv`` against MindCV's ``q``, ``k``, ``v``, defined in another
    order than the layers around them, so alignment leaves them): no difference, the
    engine could not place them, and their own lines say so."""
    def siblings(tensors: list[Any], target: bool) -> dict[tuple[str, int], list[Any]]:
        found: dict[tuple[str, int], list[Any]] = {}
        for x in tensors:
            if len(x.shape) < 2:
                continue
            where = (plan.target.tensors[x.name].path or x.name) if target else x.name
            parent = unit_of(where).rpartition(".")[0]
            found.setdefault((parent, rows(x.shape)[1]), []).append(x)
        return found

    kept: set[str] = set()
    for wholes, parts_side in ((alone_s, siblings(alone_t, True)),
                               (alone_t, siblings(alone_s, False))):
        for whole in wholes:
            if len(whole.shape) < 2:
                continue
            n, per_row = rows(whole.shape)
            for (_, size), parts in parts_side.items():
                if size == per_row and len(parts) > 1 and \
                        sum(rows(p.shape)[0] for p in parts) == n:
                    kept.update([whole.name, *(p.name for p in parts)])
    return kept


def _layer_list(tensors: list[Any], plan: Any, target: bool) -> str:
    """``N layers (a: 64; b: 256×3×3×3; …)``: each tensor's layer, with its first
    tensor's shape."""
    layers: dict[str, tuple[int, ...]] = {}
    for x in tensors:
        where = (plan.target.tensors[x.name].path or x.name) if target else x.name
        layers.setdefault(unit_of(where), x.shape)
    named = "; ".join(f"{path}: {format_shape(shape)}"
                      for path, shape in list(layers.items())[:SHOWN])
    more = ", …" if len(layers) > SHOWN else ""
    return (f"{len(layers)} layer{'s' * (len(layers) != 1)} ({named}{more})")


__all__ = ["Difference", "find"]
