"""Write a plan as the per-rank slices a strategy gives: what a cluster's training reads.

``convert SRC --ms-model … --strategy STRATEGY -o OUT`` writes ``OUT/rank_{i}/
checkpoint_rank_{i}.ckpt`` for every rank of the strategy — ``.safetensors`` where the
family trains from safetensors (MindFormers' parallel_core networks: Qwen3, Qwen3-MoE,
DeepSeek-V3, whose ``RANK_FORMAT`` says so) or ``--format safetensors`` asks — each holding
exactly its slices
(:class:`~ms_port.read.strategy.ParamLayout`: the dev matrix, the tensor map, the
optimizer shard, the pipeline stage), and ``OUT/strategy/`` with the strategy files
copied, so that MindSpore's ``load_distributed_checkpoint`` and MindFormers
(``load_checkpoint: OUT``, ``auto_trans_ckpt: False``) read it as training wrote it.

Each target tensor is computed once (each source tensor read once), cut for every rank
and written at once; memory is one tensor and one slice. Every layout is checked
against its tensor before a byte is written (dimensions, divisibility). The folder is
assembled under a temporary name, read back whole through
:func:`~ms_port.read.distributed.read_distributed` and compared with what was written
(a digest per tensor), and only then renamed into place.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import OutputExistsError, WriteError, shown
from ..read.ckpt import CkptWriter
from ..read.strategy import ParamLayout, Strategy, read_strategy, strategy_paths

_OURS = re.compile(r"^(rank_\d+|strategy)$")


@dataclass
class RanksResult:
    """What :func:`write_ranks` wrote."""

    path: str
    ranks: int
    tensors: int
    nbytes: int
    readback: str
    replaced: bool
    seconds: float
    strategy: list[str]
    notes: list[str] = field(default_factory=list)
    nonfinite: dict[str, int] = field(default_factory=dict)
    crc: bool = False
    shards: Any = None
    index: Any = None
    config: Any = None

    #: the rank files' format: ``ckpt`` or ``safetensors``
    kind: str = "ckpt"

    @property
    def format(self) -> str:
        return f"{self.ranks} rank files, {self.kind}, with the strategy"

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "format": f"{self.kind} per rank", "ranks": self.ranks,
                "tensors": self.tensors, "bytes": self.nbytes, "readback": self.readback,
                "replaced": self.replaced, "seconds": round(self.seconds, 3),
                "strategy": self.strategy, "notes": self.notes}


def check_ranks_output(output: str | Path, *, force: bool) -> Path:
    """Fail early unless ``output`` can become the folder of rank folders: new, or (with
    ``force``) holding only rank folders and a strategy folder."""
    path = Path(output)
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        raise WriteError(f"{path} is not a folder; per-rank output is a folder of rank_N/",
                         path=path)
    if not path.parent.is_dir():
        raise WriteError(f"{path.parent}: no such folder for the output; create it first",
                         path=path)
    if path.is_dir():
        names = sorted(p.name for p in path.iterdir())
        foreign = [n for n in names if not _OURS.match(n)]
        if foreign:
            raise OutputExistsError(f"{path} holds other files ({', '.join(foreign[:3])}); "
                                    "write into a new or empty folder", path=path)
        if names and not force:
            raise OutputExistsError(f"{path} holds rank folders; pass --force to replace "
                                    "them", path=path)
    return path


def _layouts(plan: Any, strategy: Strategy) -> tuple[dict[str, ParamLayout | None], list[str]]:
    """Each target's layout, checked against its shape; notes on what the strategy and the
    plan do not share."""
    out: dict[str, ParamLayout | None] = {}
    problems = []
    for m in plan.matches:
        lay = strategy.layouts.get(m.target) or _state_layout(m.target, strategy)
        out[m.target] = lay
        if lay is None:
            continue
        shape = tuple(m.shape)
        parts = list(lay.parts)
        if parts:
            parts[0] *= lay.opt_parts
        if len(shape) != len(lay.tensor_map) or any(s % p for s, p in zip(shape, parts)) \
                or (lay.split_rows and lay.global_shape(
                    (lay.split_rows[0], *[s // p for s, p in zip(shape[1:], parts[1:])]))
                    != shape):
            problems.append(f"{shown(m.target)} is {'×'.join(map(str, shape))}, its layout "
                            f"({lay.describe()}) cannot cut it")
    if problems:
        raise WriteError(f"the strategy does not fit this network: {problems[0]}"
                         + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
                         + "; pass the strategy of a network of these sizes")
    notes = []
    plain = [t for t, lay in out.items() if lay is None]
    if plain:
        notes.append(f"{len(plain)} tensors the strategy does not name (replicated on every "
                     f"rank), e.g. {plain[0]}")
    absent = [n for n in strategy.layouts if n not in out]
    if absent:
        notes.append(f"the strategy names {len(absent)} parameters this checkpoint does not "
                     f"hold (optimizer state, or another network's), e.g. {absent[0]}")
    return out, notes


def _state_layout(name: str, strategy: Strategy) -> ParamLayout | None:
    """An optimizer moment the strategy does not name is laid out as its weight (as
    training saves it, and as :func:`~ms_port.read.distributed.read_distributed` reads
    it); the counters are replicated."""
    from ..read.distributed import TRAINING_STATE_PREFIXES

    for prefix in TRAINING_STATE_PREFIXES:
        if name.startswith(prefix):
            return strategy.layouts.get(name[len(prefix):])
    return None


def _open_files_for(ranks: int) -> None:
    """Every rank's file is written at once: make sure the process may hold them open
    (raising its soft limit up to the hard one), or say so in one line before writing."""
    import resource

    need = ranks + 64  # the interpreter's own descriptors
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        if hard == resource.RLIM_INFINITY or hard >= need:
            resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
        else:
            raise WriteError(f"writing {ranks:,} rank files at once needs {need:,} open files; "
                             f"this process may hold {hard:,} (ulimit -n): raise the limit")


def _ranks_of(lay: ParamLayout | None, strategy: Strategy) -> range:
    if lay is None:
        return range(strategy.devices)
    first = strategy.first_rank(lay.stage)
    return range(first, first + lay.devices)


def rank_format(plan: Any, asked: str = "ckpt") -> str:
    """The rank files' format: ``safetensors`` where asked or where the target family trains
    from it (its module's ``RANK_FORMAT``), else ``ckpt``."""
    from ..read.targets import FAMILIES, family_module

    family = getattr(plan.target, "family", None)
    trains = getattr(family_module(family), "RANK_FORMAT", "ckpt") if family in FAMILIES \
        else "ckpt"
    return "safetensors" if "safetensors" in (asked, trains) else "ckpt"


def write_ranks(plan: Any, output: str | Path, strategy: str | Path, *, force: bool = False,
                progress: Any = None, fmt: str = "ckpt") -> RanksResult:
    """Write ``plan`` as per-rank slices for ``strategy`` (module docstring), in ``fmt``
    (``ckpt`` or ``safetensors``).

    Raises:
        WriteError: the strategy does not fit the network, or the folder cannot be written;
        OutputExistsError; ReadbackError: what was read back is not what was written.
    """
    start = time.perf_counter()
    final = check_ranks_output(output, force=force)
    files = strategy_paths(strategy)
    parsed = read_strategy(files)
    _open_files_for(parsed.devices)
    layouts, notes = _layouts(plan, parsed)
    replaced = final.exists()
    work = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".ms-port-{os.getpid()}-"))
    old: Path | None = None
    try:
        digests, nbytes = _write_all(plan, work, parsed, layouts, progress, fmt)
        (work / "strategy").mkdir()
        for f in files:
            shutil.copyfile(f, work / "strategy" / f.name)
        _read_back(work, digests)
        if replaced:
            old = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".ms-port-{os.getpid()}-"))
            os.rename(final, old / "old")
        os.rename(work, final)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        if old is not None and not final.exists() and (old / "old").exists():
            os.rename(old / "old", final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return RanksResult(str(final), parsed.devices, len(plan.matches), nbytes, "bit-exact",
                       replaced, time.perf_counter() - start, [f.name for f in files], notes,
                       kind=fmt)


def _write_all(plan: Any, work: Path, strategy: Strategy,
               layouts: dict[str, ParamLayout | None], progress: Any,
               fmt: str = "ckpt") -> tuple[dict[str, str], int]:
    """Every target once, cut for every rank that holds it; a digest of each whole."""
    digests: dict[str, str] = {}
    nbytes = 0
    total = sum(m.nbytes for m in plan.matches)
    done = 0
    with ExitStack() as stack:
        writers = {}
        entries = _rank_entries(plan, strategy, layouts) if fmt == "safetensors" else {}
        for rank in range(strategy.devices):
            folder = work / f"rank_{rank}"
            folder.mkdir()
            f = stack.enter_context(open(folder / f"checkpoint_rank_{rank}.{fmt}", "wb"))
            writers[rank] = stack.enter_context(
                SafetensorsStream(f, entries[rank]) if fmt == "safetensors" else CkptWriter(f))
        for m in plan.matches:
            array = np.ascontiguousarray(plan.expected(m))
            digests[m.target] = _digest(array)
            lay = layouts[m.target]
            for rank in _ranks_of(lay, strategy):
                part = array[_box(lay, strategy, rank, array.shape)]
                writers[rank].write(m.target, np.ascontiguousarray(part))
                nbytes += part.nbytes
            del array
            done += m.nbytes
            if progress:
                progress("write", done, total)
    return digests, nbytes


def _box(lay: ParamLayout | None, strategy: Strategy, rank: int,
         shape: tuple[int, ...]) -> tuple[slice, ...]:
    """The slice of a tensor of ``shape`` that ``rank`` holds (all of it: replicated)."""
    if lay is None:
        return tuple(slice(0, n) for n in shape)
    first = _ranks_of(lay, strategy)[0]
    return tuple(slice(a, b) for a, b in lay.box(rank - first, shape))


def _rank_entries(plan: Any, strategy: Strategy, layouts: dict[str, ParamLayout | None]
                  ) -> dict[int, list[tuple[str, str, tuple[int, ...]]]]:
    """Each rank's (name, dtype, shape) in writing order: a safetensors header is written
    before its data, and every slice's shape is known from the plan and the layout."""
    entries: dict[int, list[tuple[str, str, tuple[int, ...]]]] = {
        r: [] for r in range(strategy.devices)}
    for m in plan.matches:
        lay = layouts[m.target]
        for rank in _ranks_of(lay, strategy):
            box = _box(lay, strategy, rank, tuple(m.shape))
            entries[rank].append((m.target, m.out_dtype,
                                  tuple(b.stop - b.start for b in box)))
    return entries


class SafetensorsStream:
    """Stream tensors into a MindSpore safetensors file (``{"format": "ms"}``, as
    ``save_checkpoint(format="safetensors")`` writes it) whose entries are declared first:
    the header goes out at once, then each tensor as it comes, each checked against its
    declared name, dtype and shape (a mismatch would misplace every later byte)."""

    def __init__(self, file: Any, entries: list[tuple[str, str, tuple[int, ...]]]) -> None:
        from ..read.tensors import numpy_dtype
        from .writers import SAFETENSORS_CODES

        self._file, self._entries, self._next = file, entries, 0
        header: dict[str, Any] = {"__metadata__": {"format": "ms"}}
        offset = 0
        for name, dtype, shape in entries:
            if dtype not in SAFETENSORS_CODES:
                raise WriteError(f"tensor {shown(name)} has dtype {dtype}, which MindSpore's "
                                 "safetensors cannot hold", tensor=name)
            size = int(np.prod(shape, dtype=np.int64)) * numpy_dtype(dtype).itemsize
            header[name] = {"dtype": SAFETENSORS_CODES[dtype], "shape": list(shape),
                            "data_offsets": [offset, offset + size]}
            offset += size
        blob = json.dumps(header, separators=(",", ":")).encode()
        blob += b" " * (-len(blob) % 8)
        file.write(len(blob).to_bytes(8, "little") + blob)

    def __enter__(self) -> SafetensorsStream:
        return self

    def __exit__(self, kind: Any, *_: Any) -> None:
        if kind is None and self._next != len(self._entries):
            raise WriteError(f"{getattr(self._file, 'name', 'a rank file')}: "
                             f"{len(self._entries) - self._next} declared tensor(s) never "
                             "written")

    def write(self, name: str, array: np.ndarray) -> None:
        from ..read.tensors import dtype_name

        if self._next >= len(self._entries):
            raise WriteError(f"tensor {shown(name)} was not declared for this rank file")
        want = self._entries[self._next]
        got = (name, dtype_name(array.dtype), tuple(array.shape))
        if got != want:
            raise WriteError(f"rank file entry {self._next}: {shown(name)} "
                             f"{got[1]} {list(got[2])} where {shown(want[0])} {want[1]} "
                             f"{list(want[2])} was declared", tensor=name)
        self._file.write(np.ascontiguousarray(array).reshape(-1).view(np.uint8).data)
        self._next += 1


def _digest(array: np.ndarray) -> str:
    return hashlib.blake2b(array.reshape(-1).view(np.uint8), digest_size=16).hexdigest()


def _read_back(work: Path, digests: dict[str, str]) -> None:
    from ..errors import ReadbackError
    from ..read.sources import read_source

    back = read_source(work, strip_prefixes=False, strategy=work / "strategy")
    for name, digest in digests.items():
        info = back.tensors.get(name) or next(
            (t for t in back.training_state if t.name == name), None)
        if info is None or _digest(np.ascontiguousarray(info.load())) != digest:
            raise ReadbackError(f"{work}: {shown(name)} read back from the rank files is not "
                                "what was written; nothing was put in place", path=work)


__all__ = ["RanksResult", "check_ranks_output", "write_ranks"]
