"""A distributed training output read as one checkpoint of whole tensors.

Training on N devices writes one checkpoint per rank, each holding only its slices
(MindFormers: ``output/checkpoint/rank_{i}/{prefix}_rank_{i}-{epoch}_{step}.ckpt`` or
``.safetensors``), and the strategy that says which slice each rank holds
(``output/strategy/``; :mod:`ms_port.read.strategy`). :func:`read_distributed` gives a
:class:`~ms_port.read.sources.Source` whose tensors are the whole ones, each assembled on
demand from the slices that hold it, one tensor at a time (memory: the tensor and one
slice). Every check runs on the headers first, before any data is read:

- each rank's slice has the shape its layout gives, and all slices one dtype;
- every slice of every tensor is held by some rank file (a replica set needs one);
  a rank missing that held a unique slice is one line naming the rank and the file
  expected; a missing pure replica is a note;
- several saves per rank: the latest by (epoch, step) as numbers, named in the report
  (never the lexically last: ``-1_9`` is older than ``-1_10``), or the one asked for.

Training state (optimizer moments, step counters, loss scale) is recognised by name
(:data:`TRAINING_STATE_PREFIXES`, :data:`TRAINING_STATE_NAMES`) and kept apart from the
weights: ``Source.training_state``.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..errors import SourceError, shown
from ..text import size_text
from .strategy import ParamLayout, Strategy, read_strategy, strategy_paths
from .tensors import Source, TensorInfo, numpy_dtype

#: a file's tensors, names as saved (given by :func:`ms_port.read.sources.read_source`)
FileReader = Callable[[Path], dict[str, TensorInfo]]

#: the optimizer's per-parameter state, named ``{prefix}{parameter}``: laid out as its
#: parameter where the strategy does not name it
TRAINING_STATE_PREFIXES = ("adam_m.", "adam_v.", "exp_avg.", "exp_avg_sq.", "moment1.",
                           "moment2.", "accu_grads.", "accumulate_grads.", "momentum.",
                           "lamb_m.", "lamb_v.", "max_exp_avg_sq.")
#: the training loop's counters and scales
TRAINING_STATE_NAMES = frozenset({
    "global_step", "scale_sense", "loss_scale", "epoch_num", "step_num",
    "current_iterator_step", "last_overflow_iterator_step", "learning_rate",
    "beta1_power", "beta2_power", "global_batch_size"})

#: a rank folder
_RANK = re.compile(r"^rank_([0-9]{1,6})$")
#: a save's (epoch, step) at the end of its file name
_SAVE = re.compile(r"-([0-9]{1,12})_([0-9]{1,15})\.(ckpt|safetensors)$")
CHECKPOINT_SUFFIXES = (".ckpt", ".safetensors")


def is_training_state(name: str) -> bool:
    return name in TRAINING_STATE_NAMES or name.startswith(TRAINING_STATE_PREFIXES)


@dataclass
class ClusterLayout:
    """What the training output holds, for ``inspect`` and the reports."""

    folder: str
    strategy: list[str]
    devices: int
    stages: int
    #: the grids of the parameters, most common first: (grid, how many parameters)
    grids: list[tuple[tuple[int, ...], int]]
    #: the saves found, newest first, and the one read
    saves: list[str]
    save: str
    ranks_read: int
    missing_ranks: list[int] = field(default_factory=list)
    #: tensors saved on one rank only (remove_redundancy) rather than on every replica
    single_copies: int = 0
    replicas: int = 0
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"folder": self.folder, "strategy": self.strategy, "devices": self.devices,
                "stages": self.stages,
                "grids": [{"grid": list(g), "parameters": n} for g, n in self.grids],
                "saves": self.saves, "save": self.save, "ranks_read": self.ranks_read,
                "missing_ranks": self.missing_ranks, "single_copies": self.single_copies,
                "notes": self.notes}


def cluster_notes(ckpt: Any) -> list[str]:
    """What a distributed training output's reading did: the save, the ranks joined, the
    training state left out."""
    c = ckpt.cluster
    if c is None:
        state = getattr(ckpt, "training_state", [])
        return [f"left out {len(state)} training-state tensors ("
                f"{size_text(sum(t.nbytes for t in state))}: optimizer moments, step "
                f"counters), e.g. {state[0].name}"] if state else []
    notes = [f"a training output of {c.devices} devices ({c.stages} stage"
             f"{'s' * (c.stages > 1)}): slices of {c.ranks_read} ranks joined, {c.save}"]
    state = ckpt.training_state
    if state:
        held = size_text(sum(t.nbytes for t in state))
        notes.append(f"left out {len(state)} training-state tensors ({held}: optimizer "
                     f"moments, step counters, loss scale), e.g. {state[0].name}")
    return notes + list(c.notes)


def find_training_output(path: Path) -> Path | None:
    """The folder of rank folders ``path`` names (itself, or its ``checkpoint/``), or its
    checkpoint-2.0 root (:mod:`ms_port.read.iteration`), if any."""
    from .iteration import find_iterations

    if not path.is_dir():
        return None
    for folder in (path, path / "checkpoint"):
        if folder.is_dir() and any(_RANK.match(p.name) and p.is_dir()
                                   for p in folder.iterdir()):
            return folder
    found = find_iterations(path)
    return found[0] if found else None


def read_distributed(path: str | Path, read_file: FileReader, *,
                     strategy: str | Path | None = None, step: str | None = None) -> Any:
    """The training output at ``path`` as one :class:`~ms_port.read.sources.Source`.

    Args:
        path: the training output folder, its ``checkpoint/`` folder (of ``rank_{i}/``).
        read_file: one rank's (or one piece's) file -> its tensors, names kept as saved
            (:func:`ms_port.read.sources.read_source` gives it: this module reads no file
            format itself).
        strategy: the strategy file or folder (per-rank, per-stage or merged files);
            default: ``strategy/`` beside ``checkpoint/``.
        step: the save to read, ``STEP`` or ``EPOCH_STEP``; default the latest.

    Raises:
        SourceError: no rank folders, no strategy where ranks differ, a slice missing,
            a slice of another shape than its layout gives, or an impossible strategy.
    """
    from .iteration import find_iterations

    path = Path(path)
    if find_iterations(path) is not None:
        if strategy is not None:
            raise SourceError(f"{path}: a checkpoint-2.0 save (iteration_* folders) carries "
                              "its layout in metadata.json; --strategy is for rank_N/ folders "
                              "— drop it", path=path)
        return _read_iterations(path, step, read_file)
    folder = find_training_output(path)
    if folder is None:
        raise SourceError(f"{path}: no rank_N/ folders here or in {path / 'checkpoint'}; "
                          "pass the training output folder or its checkpoint/ folder",
                          path=path)
    ranks: dict[int, Path] = {}
    for found in sorted(folder.iterdir()):
        m = _RANK.match(found.name)
        if m is None or not found.is_dir():
            continue
        rank = int(m.group(1))
        if rank in ranks:
            raise SourceError(f"{folder}: {ranks[rank].name}/ and {found.name}/ are both rank "
                              f"{rank}; keep one", path=folder)
        ranks[rank] = found
    files, saves, chosen = _pick_save(ranks, step, folder)
    plan = _strategy_for(folder, strategy, ranks)
    if plan is None and len(files) > 1:
        raise SourceError(f"{folder}: {len(files)} ranks and no strategy (none in "
                          f"{folder.parent / 'strategy'}): which slice each rank holds is "
                          "not known; pass the strategy training wrote with --strategy, or, "
                          "where training was data parallel only (every rank holds whole "
                          f"tensors), read one rank's file: {files[min(files)]}",
                          path=folder)
    readers = {r: read_file(f) for r, f in files.items()}
    tensors, state, layout = _assemble(folder, plan, readers, files)
    layout.saves, layout.save = saves, chosen
    source = Source(str(folder), "mindspore-distributed", tensors)
    source.training_state = state
    source.cluster = layout
    return source


def _read_iterations(path: Path, step: str | None, read_file: FileReader) -> Any:
    """A checkpoint-2.0 save (:mod:`ms_port.read.iteration`) as one Source."""
    from .iteration import find_iterations, pick_iteration, read_iteration

    root, found = find_iterations(path)
    folder, labels = pick_iteration(root, found, step)
    tensors, common, left = read_iteration(folder, read_file)
    weights_left = [n for n in left if not is_training_state(n)]
    if weights_left:
        raise SourceError(f"{folder}: the files hold {shown(weights_left[0])}"
                          + (f" and {len(weights_left) - 1} more weight(s)"
                             if len(weights_left) > 1 else "")
                          + ", which metadata.json does not describe: the save is incomplete "
                          "or the metadata is another save's; save again", path=folder)
    weights = {n: i for n, i in tensors.items() if not is_training_state(n)}
    files = sorted(p.name for p in folder.glob("*.safetensors"))
    totals = {int(m.group(1)) for m in (re.search(r"-([0-9]{7})\.safetensors$", f)
                                        for f in files) if m}
    layout = ClusterLayout(str(folder), [], max(totals, default=1), 1, [], labels,
                           f"iteration {int(_ITERATION_NUMBER.search(folder.name).group(1))}",
                           sum("model-" in f for f in files) or len(files))
    if common:
        layout.notes.append("common.json: " + ", ".join(f"{k}={v}" for k, v in
                                                         list(common.items())[:6]))
    if left:  # a plain save's learning_rate, in every optimizer file
        layout.notes.append(f"{len(left)} training-state name(s) in the files that "
                            "metadata.json does not describe, left out: "
                            + ", ".join(shown(n) for n in left[:3]))
    source = Source(str(folder), "mindspore-distributed", weights)
    source.training_state = [i for n, i in tensors.items() if is_training_state(n)]
    source.cluster = layout
    return source


_ITERATION_NUMBER = re.compile(r"([0-9]+)$")


def _pick_save(ranks: dict[int, Path], step: str | None,
               folder: Path) -> tuple[dict[int, Path], list[str], str]:
    """Each rank's file of the chosen save, the saves found (newest first), the chosen."""
    per_rank: dict[int, dict[Any, Path]] = {}
    for rank, where in ranks.items():
        found: dict[Any, Path] = {}
        for f in sorted(where.iterdir()):
            if not f.is_file() or f.suffix not in CHECKPOINT_SUFFIXES:
                continue
            m = _SAVE.search(f.name)
            key = (int(m.group(1)), int(m.group(2))) if m else f.name
            if key in found and found[key].suffix == ".safetensors":
                continue  # the same save in both formats: MindFormers' safetensors
            found[key] = f
        per_rank[rank] = found
    keys = {k for found in per_rank.values() for k in found}
    if not keys:
        raise SourceError(f"{folder}: the rank folders hold no .ckpt or .safetensors file",
                          path=folder)
    named = sorted((k for k in keys if isinstance(k, tuple)), reverse=True)
    loose = sorted(k for k in keys if not isinstance(k, tuple))
    if loose and (named or any(len(f) > 1 for f in per_rank.values())):
        raise SourceError(f"{folder}: several checkpoints in a rank folder, and "
                          f"{shown(loose[0])} is not named {{prefix}}_rank_N-EPOCH_STEP; "
                          "move the others away or pass one rank's files", path=folder)
    labels = [f"epoch {e}, step {s}" for e, s in named] or ["(one file per rank)"]
    if not named:
        return {r: next(iter(f.values())) for r, f in per_rank.items() if f}, labels, labels[0]
    key = named[0] if step is None else _asked(step, named, folder)
    files = {r: f[key] for r, f in per_rank.items() if key in f}
    return files, labels, f"epoch {key[0]}, step {key[1]}"


def _asked(step: str, named: list[tuple[int, int]], folder: Path) -> tuple[int, int]:
    m = re.fullmatch(r"(?:([0-9]{1,12})_)?([0-9]{1,15})", step.strip(), re.ASCII)
    hits = [] if m is None else [k for k in named if k[1] == int(m.group(2))
                                 and (m.group(1) is None or k[0] == int(m.group(1)))]
    if len(hits) != 1:
        found = ", ".join(f"{e}_{s}" for e, s in named[:8])
        raise SourceError(f"{folder}: --step {shown(step)} names "
                          f"{'no save' if not hits else 'several saves'}; the saves are "
                          f"(EPOCH_STEP) {found}", path=folder)
    return hits[0]


def _strategy_for(folder: Path, given: str | Path | None,
                  ranks: dict[int, Path]) -> Strategy | None:
    """The strategy given, else ``strategy/`` beside ``checkpoint/`` (or inside it)."""
    where = given if given is not None else next(
        (c for c in (folder.parent / "strategy", folder / "strategy") if c.is_dir()), None)
    return None if where is None else read_strategy(strategy_paths(where))


@dataclass
class _Holder:
    rank: int
    info: TensorInfo


def _assemble(folder: Path, plan: Strategy | None, readers: dict[int, dict[str, TensorInfo]],
              files: dict[int, Path]) -> tuple[dict[str, TensorInfo], list[TensorInfo],
                                               ClusterLayout]:
    """Every tensor's whole form, checked against its layout; the training state apart."""
    expected = plan.devices if plan is not None else max(readers, default=-1) + 1
    missing = sorted(set(range(expected)) - set(readers))
    holders: dict[str, list[_Holder]] = defaultdict(list)
    for rank in sorted(readers):
        for name, info in readers[rank].items():
            holders[name].append(_Holder(rank, info))
    layout = ClusterLayout(str(folder), plan.files if plan else [], expected,
                           plan.stages if plan else 1, _grids(plan), [], "",
                           len(readers), missing)
    tensors: dict[str, TensorInfo] = {}
    state: list[TensorInfo] = []
    lost: list[str] = []
    try:
        for name, held in holders.items():
            lay = _layout_of(plan, name, held, holders)
            info = (_replicated(folder, name, held) if lay is None
                    else _sliced(folder, name, lay, held, plan, files, lost, layout))
            if info is None:
                continue
            if is_training_state(name):
                state.append(info)
            else:
                tensors[name] = info
    finally:  # the boxes of one read's layouts: never kept past it
        _cells.cache_clear()
    if lost:
        raise SourceError(f"{folder}: {lost[0]}" + (f" (and {len(lost) - 1} more slices "
                                                    "lost)" if len(lost) > 1 else ""),
                          path=folder)
    if missing:
        layout.notes.append(f"rank(s) {_ranks(missing)} missing: every slice they held is "
                            "held by a replica")
    return tensors, state, layout


def _grids(plan: Strategy | None) -> list[tuple[tuple[int, ...], int]]:
    if plan is None:
        return []
    count: dict[tuple[int, ...], int] = defaultdict(int)
    for lay in plan.layouts.values():
        count[lay.dev_matrix] += 1
    return sorted(count.items(), key=lambda kv: -kv[1])


def _layout_of(plan: Strategy | None, name: str, held: list[_Holder],
               holders: dict[str, list[_Holder]]) -> ParamLayout | None:
    """The strategy's layout of ``name``; for an optimizer moment the strategy does not
    name, its parameter's, where each rank holds it at its parameter's slice shape (a
    moment held whole on every rank is replicated)."""
    if plan is None:
        return None
    if name in plan.layouts:
        return plan.layouts[name]
    for prefix in TRAINING_STATE_PREFIXES:
        param = name[len(prefix):] if name.startswith(prefix) else None
        if param in plan.layouts:
            slices = {h.rank: h.info.shape for h in holders.get(param, [])}
            if all(slices.get(h.rank) == h.info.shape for h in held):
                return plan.layouts[param]
    return None


def _replicated(folder: Path, name: str, held: list[_Holder]) -> TensorInfo:
    """A tensor the strategy does not split: every rank holding it holds all of it."""
    first = held[0].info
    for h in held[1:]:
        if h.info.shape != first.shape or h.info.dtype != first.dtype:
            raise SourceError(
                f"{folder}: {shown(name)} is {_fmt(first)} on rank {held[0].rank} and "
                f"{_fmt(h.info)} on rank {h.rank}, and the strategy does not split it; pass "
                "the strategy training wrote (--strategy)", path=folder)
    return replace(first, name=name)


def _sliced(folder: Path, name: str, lay: ParamLayout, held: list[_Holder],
            plan: Strategy, files: dict[int, Path], lost: list[str],
            layout: ClusterLayout) -> TensorInfo | None:
    """The whole tensor from its slices: shapes checked, every slice held."""
    first_rank = plan.first_rank(lay.stage)
    local = [h for h in held if first_rank <= h.rank < first_rank + lay.devices]
    if not local:
        raise SourceError(f"{folder}: {shown(name)} belongs to pipeline stage {lay.stage} "
                          f"(ranks {first_rank}-{first_rank + lay.devices - 1}), but only "
                          f"rank(s) {_ranks([h.rank for h in held])} hold it; pass the "
                          "strategy of this training run", path=folder)
    first = local[0].info
    if len(first.shape) != len(lay.tensor_map):
        raise SourceError(f"{folder}: {shown(name)} has {len(first.shape)} dimensions on rank "
                          f"{local[0].rank}, its layout {len(lay.tensor_map)} "
                          f"({lay.describe()}); the strategy is not this checkpoint's",
                          path=folder)
    shape = lay.global_shape(first.shape)
    local_cells = _cells(lay.grid(), shape)
    if sum(math.prod(b - a for a, b in box) for box in local_cells) != math.prod(shape):
        raise SourceError(f"{folder}: the slices {lay.describe()} gives {shown(name)} do not "
                          f"tile its {_fmt_shape(shape)} exactly (they overlap or leave holes); "
                          "the strategy is not this checkpoint's", path=folder)
    cells = {box: [first_rank + k for k in ranks] for box, ranks in local_cells.items()}
    by_rank = {h.rank: h.info for h in local}
    chosen: list[tuple[tuple[tuple[int, int], ...], TensorInfo]] = []
    for box, ranks in cells.items():
        want = tuple(b - a for a, b in box)
        for r in ranks:
            info = by_rank.get(r)
            if info is not None and (info.shape != want or info.dtype != first.dtype):
                raise SourceError(
                    f"{folder}: rank {r} holds {shown(name)} as {_fmt(info)}, its layout "
                    f"({lay.describe()}) gives {_fmt_shape(want)} {first.dtype} of the whole "
                    f"{_fmt_shape(shape)}; the strategy is not this checkpoint's, or the "
                    "file is damaged", path=folder)
        holder = next((r for r in ranks if r in by_rank), None)
        if holder is None:
            absent = [r for r in ranks if r not in files]
            where = (f"rank {absent[0]}'s file (rank_{absent[0]}/…) is missing" if absent
                     else f"ranks {_ranks(ranks)} hold no copy")
            lost.append(f"the slice {_fmt_box(box)} of {shown(name)} is held by rank(s) "
                        f"{_ranks(ranks)} only, and {where}; copy it back")
            return None
        layout.replicas = max(layout.replicas, len(ranks))
        if len(ranks) > 1 and sum(r in by_rank for r in ranks) == 1:
            layout.single_copies += 1
        chosen.append((box, by_rank[holder]))
    return TensorInfo(name, shape, first.dtype, _joiner(shape, first.dtype, chosen))


#: layouts and shapes whose boxes are kept while one output is read: a model holds a few
#: dozen distinct ones, and one entry at 65,536 devices is ~20 MB
@lru_cache(maxsize=32)
def _cells(grid: ParamLayout, shape: tuple[int, ...]) -> dict[tuple[tuple[int, int], ...],
                                                            tuple[int, ...]]:
    """Each distinct box of the whole tensor, and the stage-local ranks holding it (one
    computation per layout and shape, however many tensors share them)."""
    cells: dict[tuple[tuple[int, int], ...], list[int]] = defaultdict(list)
    for k in range(grid.devices):
        cells[grid.box(k, shape)].append(k)
    return {box: tuple(ranks) for box, ranks in cells.items()}


def _joiner(shape: tuple[int, ...], dtype: str,
            chosen: list[tuple[tuple[tuple[int, int], ...], TensorInfo]]) -> Any:
    def load() -> np.ndarray:
        out = np.empty(shape, dtype=numpy_dtype(dtype))
        for box, info in chosen:
            out[tuple(slice(a, b) for a, b in box)] = info.load()
        return out

    return load


def _fmt_shape(shape: tuple[int, ...]) -> str:
    return "×".join(map(str, shape)) or "scalar"


def _fmt(info: TensorInfo) -> str:
    return f"{_fmt_shape(info.shape)} {info.dtype}"


def _fmt_box(box: tuple[tuple[int, int], ...]) -> str:
    return "[" + ", ".join(f"{a}:{b}" for a, b in box) + "]"


def _ranks(ranks: list[int]) -> str:
    shown_ = ", ".join(map(str, ranks[:8]))
    return shown_ + (f", … ({len(ranks)})" if len(ranks) > 8 else "")


__all__ = [
    "TRAINING_STATE_NAMES",
    "TRAINING_STATE_PREFIXES",
    "ClusterLayout",
    "cluster_notes",
    "find_training_output",
    "is_training_state",
    "read_distributed",
]
