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

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from .transforms import Transform

#: a rule's ``cells`` for a rule of no particular layer kind: it applies wherever the
#: target layer holds the rule's signature and nothing else
ANY_KIND: frozenset[str] = frozenset()


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
    #: for a rule of no particular kind: the layer kinds it never applies to
    excludes: frozenset[str] = frozenset()

    def fits_kind(self, kinds: tuple[str, ...] | None, have: set[str] | frozenset[str]) -> bool:
        """Whether the rule applies to a target layer of ``kinds`` holding ``have``: by its
        kind (a subclass too), or without a kind by its signature; a rule of no kind
        where the layer holds exactly its signature and is none of ``excludes``."""
        if not self.cells:
            return set(have) == self.signature and not self.excludes.intersection(kinds or ())
        if kinds:
            return bool(self.cells.intersection(kinds))
        return bool(self.signature) and self.signature <= set(have)


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
    LayerRule(
        # any other layer holding exactly a scale and a shift named as MindSpore's norms
        # name them (MindCV's GRN, its custom norms): PyTorch's weight and bias
        "affine", ANY_KIND, {"gamma": "weight", "beta": "bias"},
        signature=frozenset({"gamma", "beta"}),
        excludes=frozenset({"Dense", "Conv1d", "Conv2d", "Conv3d", "Conv1dTranspose",
                            "Conv2dTranspose", "Conv3dTranspose", "Embedding"}),
    ),
)

@dataclass(frozen=True)
class ReshapeRule:
    """One tensor that a layer of one kind holds in another shape than the other framework's
    layer computing the same thing: the same numbers, in the same order, reshaped.

    Attributes:
        cells: the MindSpore layer kinds it applies to (from the target's layer types;
            never to a template, whose layer kinds are unknown).
        suffix: the tensor (``weight``).
        source_ndim / target_ndim: the PyTorch and the MindSpore tensor's dimensions.
        why: said in the match's evidence.
    """

    name: str
    cells: frozenset[str]
    suffix: str
    source_ndim: int
    target_ndim: int
    why: str


RESHAPES: tuple[ReshapeRule, ...] = (
    # timm's ConvMlp heads, DPN's and ResNetV2's 1x1 classifier, SE blocks' 1x1 convs
    ReshapeRule("conv-as-dense", frozenset({"Dense"}), "weight", 4, 2,
                "a convolution whose kernel covers its whole input is a Dense: "
                "(out, in, kh, kw) flattened to (out, in·kh·kw)"),
    ReshapeRule("dense-as-conv", frozenset({"Conv2d"}), "weight", 2, 4,
                "a Linear is a 1×1 convolution: (out, in) as (out, in, 1, 1)"),
)


#: a per-channel vector (a scale, a shift, a layer scale) held with other size-1 axes
#: (MindCV's GRN: 1×1×1×C; timm's: C): any kind of layer, templates too
VECTOR = ReshapeRule("vector", ANY_KIND, "", 1, 1,
                     "a per-channel vector held with size-1 axes around it: the same values")


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def reshape_rule(shape: tuple[int, ...], target: tuple[int, ...], name: str,
                 kinds: tuple[str, ...] | None) -> ReshapeRule | None:
    """The rule under which ``shape`` is the target tensor ``name`` (of shape ``target``,
    in a layer of ``kinds``) reshaped, or ``None``: a per-channel vector whatever its
    size-1 axes (:data:`VECTOR`); else the same output size, the same number of
    elements, and for a 1×1 convolution a kernel of one."""
    if (_squeezed(shape) == _squeezed(target) and len(_squeezed(shape)) <= 1
            and math.prod(shape) > 0):
        return VECTOR  # a per-channel vector's values in the same order, either way
    suffix = name.rpartition(".")[2]
    for rule in RESHAPES:
        if (suffix != rule.suffix or not kinds or not rule.cells.intersection(kinds)
                or len(shape) != rule.source_ndim or len(target) != rule.target_ndim
                or not shape or shape[0] != target[0]
                or math.prod(shape) != math.prod(target)):
            continue
        if rule.target_ndim == 4 and target[2:] != (1, 1):
            continue
        return rule
    return None


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
            applies = (rule.fits_kind(kind, have) if not rule.cells
                       else bool(rule.cells.intersection(kind)) if kind
                       else bool(rule.signature & have))
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


#: a ``Match.init`` meaning "the target network's own value" (:attr:`TargetTensor.constant`)
#: where a fused weight with no bias keeps each part's bias apart, beside it: ``{part}``
#: is the split layer's own name (timm's SwinV2 and BEiT: ``attn.q_bias`` and
#: ``attn.v_bias`` beside ``attn.qkv.weight``, for MindCV's ``attn.q`` and ``attn.v``)
PART_BIAS = ("{part}_bias",)

NETWORK = "network"


def is_layer_param(name: str) -> bool:
    """Whether ``name`` ends as a layer rule names its tensors (``gamma``,
    ``moving_mean``, …): such a tensor is a weight or a statistic, never a constant the
    network computes."""
    suffix = name.rpartition(".")[2]
    return any(suffix in rule.params or suffix in rule.params.values() for rule in RULES)


def known_drop(name: str) -> str | None:
    """Why a PyTorch tensor may be dropped without loss, or ``None``."""
    return KNOWN_DROPS.get(name.rpartition(".")[2])
