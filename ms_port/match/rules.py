"""Built-in name correspondences between PyTorch and MindSpore layers, as data.

Each :class:`LayerRule` says, for one kind of MindSpore layer, which PyTorch parameter
suffix fills which MindSpore one, and which transforms go with it. Rules only
*propose*: a proposal is taken when the target really has that tensor and the owning
layer really is of the rule's kind (from the target Cell's layer types, or, for a
template checkpoint, from sibling names such as ``moving_mean``). So a Dense
``weight`` is never renamed ``gamma``, and targets that already use PyTorch names
(``mindspore.mint.nn``) are matched by exact name before any rule is asked.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .transforms import Transform


@dataclass(frozen=True)
class LayerRule:
    """One layer kind's parameter correspondence.

    Attributes:
        name: the rule's name, shown in reports (``batchnorm``).
        cells: MindSpore cell class names this rule is for.
        params: MindSpore suffix -> PyTorch suffix.
        signature: MindSpore suffixes that identify the layer in a template checkpoint
            when layer types are unknown; one of them must be a sibling of the target.
        transforms: MindSpore suffix -> transforms from the PyTorch layout.
        inner: where MindSpore keeps the parameters, below the PyTorch layer's path: a
            nested cell (``bn2d`` in ``nn.BatchNorm3d``); ``""``: at the same path.
        initialise: MindSpore suffix -> ``zeros``/``ones``: what a tensor of this layer
            holds when PyTorch has none (reported as ``initialised``, never silently).
    """

    name: str
    cells: frozenset[str]
    params: Mapping[str, str]
    signature: frozenset[str]
    transforms: Mapping[str, tuple[Transform, ...]] = field(default_factory=dict)
    inner: str = ""
    initialise: Mapping[str, str] = field(default_factory=dict)


RULES: tuple[LayerRule, ...] = (
    LayerRule(
        "batchnorm",
        frozenset({"BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm"}),
        {"gamma": "weight", "beta": "bias",
         "moving_mean": "running_mean", "moving_variance": "running_var"},
        signature=frozenset({"moving_mean", "moving_variance"}),
    ),
    LayerRule(
        # mindspore.nn.BatchNorm3d keeps its parameters in a nested BatchNorm2d
        "batchnorm3d", frozenset({"BatchNorm2d"}),
        {"gamma": "weight", "beta": "bias",
         "moving_mean": "running_mean", "moving_variance": "running_var"},
        signature=frozenset({"moving_mean", "moving_variance"}), inner="bn2d",
    ),
    LayerRule(
        "layernorm", frozenset({"LayerNorm"}), {"gamma": "weight", "beta": "bias"},
        signature=frozenset({"gamma", "beta"}),
    ),
    LayerRule(
        "groupnorm", frozenset({"GroupNorm"}), {"gamma": "weight", "beta": "bias"},
        signature=frozenset({"gamma", "beta"}),
    ),
    LayerRule(
        # MindSpore's InstanceNorm keeps moving statistics; PyTorch's has them only with
        # track_running_stats=True. Without them: the statistics of a fresh layer.
        "instancenorm", frozenset({"InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d"}),
        {"gamma": "weight", "beta": "bias",
         "moving_mean": "running_mean", "moving_variance": "running_var"},
        signature=frozenset(),
        initialise={"moving_mean": "zeros", "moving_variance": "ones"},
    ),
    LayerRule(
        "embedding", frozenset({"Embedding"}), {"embedding_table": "weight"},
        signature=frozenset({"embedding_table"}),
    ),
    LayerRule("prelu", frozenset({"PReLU"}), {"w": "weight"}, signature=frozenset({"w"})),
    LayerRule(
        # MindSpore's nn.Conv1d stores weights as (out, in, 1, k); torch as (out, in, k).
        "conv1d", frozenset({"Conv1d", "Conv1dTranspose"}),
        {"weight": "weight", "bias": "bias"},
        signature=frozenset(),
        transforms={"weight": (Transform("unsqueeze", 2),)},
    ),
)

#: PyTorch tensors MindSpore has no place for, dropped when nothing in the target wants
#: them (``mindspore.mint.nn.BatchNorm2d`` does keep ``num_batches_tracked``).
KNOWN_DROPS: Mapping[str, str] = {
    "num_batches_tracked": "BatchNorm step counter; MindSpore's BatchNorm has none",
}


@dataclass(frozen=True)
class Proposal:
    """A rule's suggestion: fill ``target`` from a PyTorch tensor with these transforms."""

    target: str
    rule: str
    transforms: tuple[Transform, ...]


def propose(name: str, layer_of: Mapping[str, tuple[str, ...] | None],
            siblings: Mapping[str, frozenset[str]]) -> list[Proposal]:
    """Target names a (mapped) PyTorch tensor name could fill under the built-in rules.

    Args:
        name: the PyTorch name, after mapping-table renames.
        layer_of: target layer path -> the MindSpore cell's class names, its own and its
            bases' (``None`` if unknown): a rule fits a subclass of its layer kind.
        siblings: target layer path -> the parameter suffixes the target has there.
    """
    prefix, _, suffix = name.rpartition(".")
    out = []
    for rule in RULES:
        where = ".".join(p for p in (prefix, rule.inner) if p)
        have = siblings.get(where, frozenset())
        kind = layer_of.get(where)
        if isinstance(kind, str):
            kind = (kind,)
        for ms_suffix, torch_suffix in rule.params.items():
            if torch_suffix != suffix or ms_suffix not in have:
                continue
            applies = bool(rule.cells.intersection(kind)) if kind else bool(rule.signature & have)
            target = f"{where}.{ms_suffix}" if where else ms_suffix
            if applies and all(p.target != target for p in out):
                out.append(Proposal(target, rule.name, rule.transforms.get(ms_suffix, ())))
    return out


def initial_value(name: str, layer_of: Mapping[str, tuple[str, ...] | None]) -> tuple[
        str, str] | None:
    """(the value, the rule) for a target tensor a rule initialises, or ``None``."""
    prefix, _, suffix = name.rpartition(".")
    kind = layer_of.get(prefix) or ()
    for rule in RULES:
        if suffix in rule.initialise and rule.cells.intersection(kind):
            return rule.initialise[suffix], rule.name
    return None


def known_drop(name: str) -> str | None:
    """Why a PyTorch tensor may be dropped without loss, or ``None``."""
    return KNOWN_DROPS.get(name.rpartition(".")[2])
