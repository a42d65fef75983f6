"""Report dataclasses the library returns. They never print; the CLI and notebooks
render them (``rich`` via ``__rich__``, Jupyter via ``_repr_html_``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .display import Renderable
from .match.plan import Plan
from .read.hub import HubRef
from .read.sources import Skipped
from .read.tensors import TensorInfo
from .write.writers import WriteResult

__all__ = ["ConversionReport", "InspectReport", "Renderable"]


@dataclass
class InspectReport(Renderable):
    """What a checkpoint holds, or what an architecture expects.

    Attributes:
        path: the file, or ``arch:NAME`` for an architecture.
        format: the checkpoint format, or ``architecture``.
        tensors: the (filtered) tensors listed.
        total_tensors: how many the file holds before ``filter``.
        unwrapped / stripped / skipped / metadata / hub: see
            :class:`~ms_port.read.sources.Source`.
    """

    path: str
    format: str
    tensors: list[TensorInfo]
    total_tensors: int
    unwrapped: list[str] = field(default_factory=list)
    stripped: list[str] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)
    filter: str | None = None
    #: a Hugging Face model's config.json: its path and the keys a conversion uses
    config: dict[str, Any] = field(default_factory=dict)
    hub: HubRef | None = None
    #: a distributed training output's parallel layout
    #: (:class:`~ms_port.read.distributed.ClusterLayout`), and its training state
    #: (optimizer moments, counters) at their whole shapes, listed apart
    cluster: Any = None
    training_state: list[TensorInfo] = field(default_factory=list)
    #: how the reader read the file (:attr:`~ms_port.read.tensors.Source.notes`)
    notes: list[str] = field(default_factory=list)
    #: a Trainer ``checkpoint-N/`` folder's optimizer state (:class:`~ms_port.read.
    #: training_state.TrainingState`, its moments named by position)
    optimizer: Any = None

    @property
    def parameters(self) -> int:
        return sum(t.numel for t in self.tensors)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def dtypes(self) -> dict[str, int]:
        return dict(Counter(t.dtype for t in self.tensors))

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path, "format": self.format,
            "tensors": [t.to_dict() for t in self.tensors],
            "count": len(self.tensors), "total_tensors": self.total_tensors,
            "parameters": self.parameters, "bytes": self.nbytes, "dtypes": self.dtypes,
            "unwrapped": self.unwrapped, "stripped": self.stripped,
            "skipped": [s.to_dict() for s in self.skipped], "metadata": self.metadata,
            "filter": self.filter, "config": self.config,
            "hub": self.hub.to_dict() if self.hub else None,
            "cluster": self.cluster.to_dict() if self.cluster is not None else None,
            "training_state": [t.to_dict() for t in self.training_state],
            "optimizer": None if self.optimizer is None else self.optimizer.to_dict(),
            "notes": self.notes,
        }

    def __repr__(self) -> str:
        return (f"InspectReport({self.path!r}, format={self.format!r}, "
                f"tensors={len(self.tensors)}, parameters={self.parameters:,})")


@dataclass
class ConversionReport(Renderable):
    """The outcome of a conversion.

    Attributes:
        ok: the plan was complete (or its leftovers allowed) and the output was
            written and read back bit-exactly (or ``dry_run``).
        plan: the :class:`~ms_port.match.plan.Plan`: every tensor, how it was matched.
        output: the output path (``None`` for a dry run without output).
        written: what the writer did; ``None`` when nothing was written.
        dry_run: stopped after the plan.
        saved_map: where the plan was saved as a mapping, if asked.
        nonfinite: tensors holding NaN/Inf, with counts.
        model_config: the MindFormers YAML written beside it (``--model-config``), a
            :class:`~ms_port.write.model_config.ModelConfigFile`; ``None`` if none was.
    """

    ok: bool
    plan: Plan
    output: str | None
    written: WriteResult | None = None
    dry_run: bool = False
    saved_map: str | None = None
    nonfinite: dict[str, int] = field(default_factory=dict)
    model_config: Any = None

    @property
    def message(self) -> str:
        if not self.plan.ok:
            n = len(self.plan.problems())
            return f"not converted: {n} problem{'s' * (n != 1)} in the plan"
        if self.dry_run:
            return "dry run: plan complete, nothing written"
        return f"converted {len(self.plan.matches)} tensors to {self.output}"

    def to_dict(self) -> dict[str, Any]:
        plan = self.plan.to_dict()
        return {
            "ok": self.ok, "message": self.message, "output": self.output,
            "source": plan["source"], "target": plan["target"],
            "filled": plan["filled"], "total": plan["total"], "counts": plan["counts"],
            "missing": plan["missing"], "unused": plan["unused"],
            "dropped": plan["dropped"], "conflicts": plan["conflicts"],
            "lossy_casts": plan["lossy_casts"], "notes": plan["notes"],
            "mapping": plan["mapping"], "params": plan["params"],
            "config": getattr(self.plan.source, "config_path", None),
            "tensors": plan["matches"], "dry_run": self.dry_run,
            "saved_map": self.saved_map,
            "written": self.written.to_dict() if self.written else None,
            "nonfinite": self.nonfinite,
            "model_config": self.model_config.to_dict() if self.model_config else None,
            "source_info": {"format": self.plan.source.format,
                            "unwrapped": self.plan.source.unwrapped,
                            "stripped": self.plan.source.stripped,
                            "skipped": [s.to_dict() for s in self.plan.source.skipped],
                            "hub": _hub(self.plan.source)},
        }

    def __repr__(self) -> str:
        return (f"ConversionReport(ok={self.ok}, filled={len(self.plan.matches)}/"
                f"{len(self.plan.target)}, output={self.output!r})")


def _hub(source: Any) -> dict[str, Any] | None:
    hub = getattr(source, "hub", None)  # a plan's source may be any Source-like object
    return hub.to_dict() if hub is not None else None
