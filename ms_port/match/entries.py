"""What a plan is made of: one :class:`Match` per filled target tensor, the leftovers on
either side (:class:`Missing`, :class:`Unused`), deliberate drops and conflicts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..read.sources import Skipped, Source
from ..read.targets import Target, TargetTensor
from ..read.tensors import FLOAT_DTYPES, format_shape, itemsize
from .layouts import Layout
from .rules import reshape_rule
from .transforms import Transform, shape_after

#: how a target was filled; "initialised": a declared value where PyTorch has no
#: counterpart; "restored": export only
#: "tied": filled from the tensor a tied one is the same as (a tied LM head);
#: "state": training state (a weight's optimizer moments, made as the weight is; counters)
HOW = ("exact", "rule", "mapping", "aligned", "fallback", "initialised", "tied", "restored",
       "state")


@dataclass(frozen=True)
class Match:
    """One target tensor and the source tensor that fills it.

    Attributes:
        how: ``exact``, ``rule``, ``mapping``, ``fallback`` (shape/order only) or
            ``initialised`` (a declared value: PyTorch has no such tensor).
        detail: which rule or mapping entry (``batchnorm``, ``segment fc->end_point``).
        transforms: applied to the source data, in order.
        dtype: the source dtype; ``out_dtype`` what is written (differs under a cast).
    """

    target: str
    source: str
    how: str
    detail: str
    source_shape: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: str
    out_dtype: str
    transforms: tuple[Transform, ...] = ()
    #: for ``how == "initialised"``: the declared value (``zeros``, ``ones``, a number)
    init: str | float | None = None
    #: a fused target: every source it is made of, joined by ``layout`` (``source`` is
    #: the first); ``source_shape`` is then the joined shape
    parts: tuple[str, ...] = ()
    layout: Layout | None = None
    #: a split source: this target is part ``part`` of ``source`` laid out by ``layout``
    part: int | None = None
    #: for a part: transforms that bring the source back to its layout first (export of a
    #: target fused and then transformed: the experts' transpose and reshapes undone)
    before: tuple[Transform, ...] = ()
    #: a fused target computed group by group (its ``over:`` groups, an expert each):
    #: ``parts`` come in ``groups`` equal runs, and the target's rows are, group after
    #: group, ``group_transforms`` of that group's parts joined. Set only where the plan
    #: checked this equals the whole computation (:func:`separable`); 0 otherwise
    groups: int = 0
    group_transforms: tuple[Transform, ...] = ()
    #: for a part of a grouped fuse (export): the rows ``start, stop`` of ``source`` that
    #: hold its group, which alone are read and brought back (``before``), not the whole
    rows: tuple[int, int] | None = None

    @property
    def sources(self) -> tuple[str, ...]:
        """Every source tensor this target is made from."""
        return self.parts or ((self.source,) if self.source else ())

    @property
    def nbytes(self) -> int:
        """The bytes the target holds once written (its shape in ``out_dtype``)."""
        return numel(self.shape) * itemsize(self.out_dtype)

    @property
    def lossy(self) -> bool:
        """Whether the cast to ``out_dtype`` can lose information."""
        return (self.dtype != self.out_dtype and not widens(self.dtype, self.out_dtype)
                and self.dtype not in INT_DTYPES)  # integers: checked exact when written

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "source": self.source, "how": self.how,
                "detail": self.detail, "shape": list(self.shape),
                "source_shape": list(self.source_shape), "dtype": self.dtype,
                "out_dtype": self.out_dtype,
                "transforms": [t.to_data() for t in self.transforms],
                **({"parts": list(self.parts)} if self.parts else {}),
                **({"layout": str(self.layout)} if self.layout else {}),
                **({"part": self.part} if self.part is not None else {})}


@dataclass(frozen=True)
class Candidate:
    """A near miss offered as "did you mean"."""

    name: str
    shape: tuple[int, ...]

    def __str__(self) -> str:
        return f"{self.name!r} ({format_shape(self.shape)})"


@dataclass(frozen=True)
class Leftover:
    """A tensor on one side that nothing on the other side takes, with near misses."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    candidates: tuple[Candidate, ...] = ()
    #: for a source tensor a mapping renamed: the name it produced, and by which entry
    renamed: str | None = None
    renamed_by: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype,
                "candidates": [c.name for c in self.candidates], "renamed": self.renamed,
                "renamed_by": self.renamed_by}


@dataclass(frozen=True)
class Missing(Leftover):
    """A target tensor nothing fills."""

    #: the source entry under this name that was skipped as unusable (a meta tensor, a
    #: sparse one): why the source has no tensor for it
    skipped: Skipped | None = None

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(),
                **({"skipped": self.skipped.to_dict()} if self.skipped else {})}


class Unused(Leftover):
    """A source tensor nothing uses."""


@dataclass(frozen=True)
class Dropped:
    """A source tensor left out on purpose, and why."""

    name: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "reason": self.reason}


@dataclass(frozen=True)
class Conflict:
    """Something that cannot be resolved by relaxing strictness.

    Attributes:
        kind: ``shape`` (a proposal whose shape does not fit), ``claim`` (several
            sources for one target) or ``fan-out`` (one source for several targets).
    """

    kind: str
    targets: tuple[str, ...]
    sources: tuple[str, ...]
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "targets": list(self.targets),
                "sources": list(self.sources), "message": self.message}


@dataclass
class Planning:
    """What the stages of :func:`~ms_port.match.matching.make_plan` build up in turn: the
    filled targets, the source tensors used, the conflicts, the dropped tensors, the
    notes; ``proposals`` are the name stages' claims (target -> source candidates)."""

    source: Source
    target: Target
    mapping: Any
    dtype: str | None
    proposals: dict[str, Any] = field(default_factory=dict)
    matches: dict[str, Match] = field(default_factory=dict)
    used: set[str] = field(default_factory=set)
    conflicts: list[Conflict] = field(default_factory=list)
    dropped: list[Dropped] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def conflicted(self) -> set[str]:
        """The targets a conflict names."""
        return {t for c in self.conflicts for t in c.targets}


def numel(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape, dtype=np.int64))


_FLOAT_BITS = {"float16": (5, 10), "bfloat16": (8, 7), "float32": (8, 23), "float64": (11, 52)}


def widens(src: str, dst: str) -> bool:
    """Whether every ``src`` value is exactly representable in ``dst``."""
    if src in _FLOAT_BITS and dst in _FLOAT_BITS:
        (e1, m1), (e2, m2) = _FLOAT_BITS[src], _FLOAT_BITS[dst]
        return e2 >= e1 and m2 >= m1
    return src == dst


#: integer dtypes a target may state for an integer source (checked exact when written)
INT_DTYPES = frozenset({"int8", "int16", "int32", "int64", "uint8"})


def cast_dtype(dtype: str, wanted: str | None, target: str | None = None) -> str:
    """What a source tensor of ``dtype`` is written as: ``wanted`` (``--dtype``) for a
    floating-point one; for an integer one, the integer dtype its target states
    (MindFormers' DeepSeek-V4 ``tid2eid`` is int32 where transformers saves int64), each
    value checked to fit when it is written (:func:`~ms_port.match.result.exact_cast`)."""
    if target in INT_DTYPES and dtype in INT_DTYPES:
        return target
    return wanted if wanted and dtype in FLOAT_DTYPES else dtype


def shape_or_none(transforms: tuple[Transform, ...],
                   shape: tuple[int, ...]) -> tuple[int, ...] | None:
    try:
        return shape_after(transforms, shape)
    except ValueError:
        return None


def transforms_made(transforms: tuple[Transform, ...], shape: tuple[int, ...]) -> str:
    """What ``transforms`` make of ``shape``, for a message: ``then 8×4``, or why they
    cannot apply (``its transforms cannot apply: cannot reorder …``)."""
    try:
        return f"then {format_shape(shape_after(transforms, shape))}"
    except ValueError as exc:
        return f"its transforms cannot apply: {exc}"


def fit(shape: tuple[int, ...], tt: TargetTensor,
        transforms: tuple[Transform, ...]) -> tuple[Transform, ...] | None:
    """The transforms that make ``shape`` fit the target, or ``None`` if nothing does: a
    rule's own, else a reshape the target layer's kind allows
    (:data:`~ms_port.match.rules.RESHAPES`: a 1×1 convolution's weight as a Dense's)."""
    if shape == tt.shape:
        return ()
    if transforms:
        try:
            if shape_after(transforms, shape) == tt.shape:
                return transforms
        except ValueError:
            pass
    if reshape_rule(shape, tt.shape, tt.name, tt.lineage or
                    ((tt.layer,) if tt.layer else None)) is not None:
        return (Transform("reshape", list(tt.shape)),)
    return None


__all__ = [
    "HOW",
    "INT_DTYPES",
    "Candidate",
    "Conflict",
    "Dropped",
    "Leftover",
    "Match",
    "Missing",
    "Unused",
    "cast_dtype",
    "fit",
    "numel",
    "shape_or_none",
    "widens",
]
