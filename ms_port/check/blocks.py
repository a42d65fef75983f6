"""verify one block at a time: the proof at the size of the conversion.

The whole-network driver (:func:`ms_port.check.parity.run_parity`) holds both networks,
PyTorch's in float32 and float64 and MindSpore's, at once: ~29 GB per float32 copy of a 7B
model. This driver builds one block (the embedding, one decoder layer, the head) per side
at a time, reads that block's tensors from the source and from the written checkpoint,
runs it, and frees it before the next. Memory is one block per side plus activations.

Each side carries its own hidden states from block to block, exactly as the whole
networks would: PyTorch in float32, in float64 (the per-layer float32 noise) and on a
second input (the sensitivity), MindSpore in float32. Every layer inside a block is
recorded and paired as in the whole-network run, so the comparisons, the drift, the
verdict and the first divergence come from the same engine
(:func:`ms_port.check.parity.judge`). Each block is also fed PyTorch's own input on the
MindSpore side and compared with its local float32 noise (``fed``): where a block is
wrong, it fails there, whatever came before.

A family gives its blocks with five methods (``pieces``, ``torch_network``,
``torch_step``, ``ms_network``, ``ms_step``; see :mod:`ms_port.archs.llama.blocks`), and
may say three things of them: ``stacks`` (every layer computes each row of a batch on its
own, batch first: each side's two inputs then run stacked in one pass over the weights),
``lets_go`` (MindSpore holds none of a block's arrays once ``ms_done`` returned: every
block's casts are then cut from one slab used again, :mod:`ms_port.check.reuse`) or
``keeps_data`` (MindSpore keeps them until its network runs again: their pages are handed
back once its passes are done, :class:`~ms_port.check.reuse.HandedBack`).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

from .._libc import libc_function
from ..errors import ForwardUnavailable, ParityError, shown
from ..read.ahead import ReadAhead
from ..read.sources import Source
from .compare import ms_to_numpy, nonfinite, relative_error
from .devices import release_ms_pool
from .layers import (
    Event,
    Measure,
    Pair,
    distance,
    pair_events,
    record_ms,
    record_torch,
    split_stacked,
)
from .lazy import on_demand
from .parity import (
    Networks,
    Run,
    _compare_outputs,
    _layer_comparisons,
    judge,
)
from .report import LayerComparison, ParityReport
from .reuse import Arena, HandedBack
from .routed import group_numel, plan_groups, run_routed, without_experts
from .spans import (
    SPAN_FROM,
    Span,
    in_spans,
    measured,
    merge_events,
    merge_output,
    plan_spans,
    span_rows,
)
from .tensors import PlanCheck
from .verdict import Drift, bound_for, status_of

#: bytes per parameter the whole-network verify holds at its peak: PyTorch float32 and
#: float64, MindSpore float32
WHOLE_BYTES_PER_PARAMETER = 4 + 8 + 4
#: the share of the available memory the whole networks may take before verify goes
#: block by block (the frameworks, activations and the source's reads need the rest)
WHOLE_SHARE = 0.6


def available_memory() -> int | None:
    """Bytes the kernel says can be had without swapping (``MemAvailable``), or None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


#: glibc's ``mallopt`` parameter for the size from which an allocation is mapped on its own
_M_MMAP_THRESHOLD = -3
#: the size from which a block's arrays are mapped on their own (:func:`unmap_large_arrays`)
LARGE_ARRAY = 1 << 20


def unmap_large_arrays() -> bool:
    """Have the C library map every allocation of :data:`LARGE_ARRAY` bytes or more on its
    own, so that freeing it gives it back to the system at once. True where it did.

    glibc otherwise raises that threshold to the size of each mapped block it frees (up
    to 32 MiB), and later blocks of that size come from its heap, where freed memory
    stays with the process. A layer's per-expert arrays (12 MiB each in float64 at
    Qwen3-30B-A3B's widths) then stayed resident after they were stacked into the
    network's tensor: the PyTorch float64 step of one MoE layer held 9 GiB, not 4.5. The
    setting lasts for the process (glibc cannot be given back its moving threshold);
    it costs a mapping per large allocation, which a block's arrays pay anyway. (Dask
    sets glibc's related ``MALLOC_TRIM_THRESHOLD_`` for its workers: an environment
    variable, read only when a process starts, so not one a library can set.)"""
    mallopt = libc_function("mallopt", ctypes.c_int, ctypes.c_int, ctypes.c_int)
    return bool(mallopt is not None and mallopt(_M_MMAP_THRESHOLD, LARGE_ARRAY) == 1)


def choose_mode(mode: str, parameters: int, why_not: str | None,
                available: int | None = None) -> tuple[str, str]:
    """``("whole" | "layers", why)`` for ``mode`` ``auto``, ``whole`` or ``layers``.

    ``why_not`` says why this run cannot go block by block (``None``: it can).
    """
    need = parameters * WHOLE_BYTES_PER_PARAMETER
    gib = 2**30
    if mode not in ("auto", "whole", "layers"):
        raise ParityError(f"unknown mode {mode!r}; choose auto, whole or layers")
    if mode == "layers":
        if why_not:
            raise ParityError(f"--mode layers cannot run here: {why_not}")
        return "layers", "asked for (--mode layers)"
    if mode == "whole":
        return "whole", "asked for (--mode whole)"
    if why_not:
        return "whole", f"not by layers: {why_not}"
    available = available_memory() if available is None else available
    if available is not None and need > WHOLE_SHARE * available:
        return "layers", (f"the whole networks need ~{need / gib:.1f} GiB, "
                          f"{available / gib:.1f} GiB available")
    where = f" of {available / gib:.1f} GiB available" if available is not None else ""
    return "whole", f"the whole networks fit (~{need / gib:.1f} GiB{where})"


class _Found:
    """NaN/Inf in the tensors the blocks read, per side and tensor, in the order first
    seen: each tensor counted once, whole or over its spans' rows (a tied embedding read
    again for the head, a final norm read again for each span, are not counted twice)."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], list[int]] = {}
        self.done: set[tuple[str, str]] = set()
        self.rows: set[tuple[str, str, int, int]] = set()

    def add(self, side: str, name: str, array: np.ndarray,
            rows: tuple[int, int] | None = None) -> None:
        key = (side, name)
        if key in self.done or (rows is not None and (*key, *rows) in self.rows):
            return
        nan, inf = nonfinite(array)
        held = self.counts.setdefault(key, [0, 0])
        held[0] += nan
        held[1] += inf
        if rows is None:
            self.done.add(key)
        else:
            self.rows.add((*key, *rows))

    def same(self, side: str, name: str, as_side: str, as_name: str) -> None:
        """``name`` holds what ``as_name`` (counted already) holds: the same counts."""
        key = (side, name)
        if key not in self.done:
            self.counts[key] = list(self.counts.get((as_side, as_name), [0, 0]))
            self.done.add(key)

    def piece_done(self) -> None:
        """A block's tensors are all counted (its spans' rows among them)."""
        self.done.update((side, name) for side, name, _, _ in self.rows)
        self.rows.clear()

    def lines(self) -> list[str]:
        out = []
        for (side, name), (nan, inf) in self.counts.items():
            counts = [f"{n} {kind}" for n, kind in ((nan, "NaN"), (inf, "Inf")) if n]
            if counts:
                out.append(f"{side} {name}: {', '.join(counts)}")
        return out


def _arrays(source: Source, names: dict[str, str], found: _Found, side: str,
            dtype: Any = np.float32, span: tuple[Span, tuple[str, ...]] | None = None,
            arena: Arena | None = None) -> dict[str, np.ndarray]:
    """The named tensors in ``dtype`` (bf16/fp16 checkpoints compute in float32; float64
    for the noise), each cast as it is read (into ``arena``'s memory where given);
    NaN/Inf is recorded in ``found``. ``span``: a span of the vocabulary and the tensors
    (local names) read as its rows alone."""
    arrays = {}
    for local, name in names.items():
        info = source.tensors.get(name)
        if info is None:
            raise ParityError(f"{source.path}: no tensor {shown(name)}, which the block "
                              "needs; convert again", path=source.path)
        rows = (span[0].start, span[0].stop) if span is not None and local in span[1] else None
        array = np.asarray(info.load() if rows is None else info.load_rows(*rows))
        if array.dtype != dtype:
            array = array.astype(dtype) if arena is None else arena.cast(array, dtype)
        if dtype == np.float32:
            found.add(side, name, array, rows)
        arrays[local] = array
    return arrays


def _params_under(names: list[str]) -> Callable[[str], list[str]]:
    """A layer's tensors by name: its own, else (a block) every one under it."""
    def params(path: str) -> list[str]:
        own = [n for n in names if n.rpartition(".")[0] == path]
        return own or [n for n in names if n.startswith(path + ".")]
    return params


class _Timer:
    """Seconds spent per kind of work (reading, building, each framework's forwards)."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, what: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.spent[what] = self.spent.get(what, 0.0) + time.perf_counter() - t0


@dataclass
class _Streams:
    """Each side's own hidden states, carried from block to block: PyTorch float32
    (``t``), float64 (``t64``) and on the second input (``t2``); MindSpore (``m``)."""

    t: Any = None
    t64: Any = None
    t2: Any = None
    m: Any = None


@dataclass
class _BlockRun:
    """What every block of one verify shares: the family's blocks, both files, the token
    ids (and the second input's), the streams carried between blocks, the drift, the
    layer pairs, and what the run records."""

    blocks: Any
    source: Source
    checkpoint: Source
    run: Run
    ids: np.ndarray
    ids2: np.ndarray
    correspondence: list[tuple[str, str]]
    streams: _Streams = field(default_factory=_Streams)
    timer: _Timer = field(default_factory=_Timer)
    drift: Drift = field(default_factory=Drift)
    nonfinite: _Found = field(default_factory=_Found)
    #: rows per span of the vocabulary (:mod:`ms_port.check.spans`); None: no spans
    span_rows: int | None = None
    #: the rows from which a vocabulary runs in spans (more than these)
    span_from: int | None = None
    #: the tensors compared through the plan, a block at a time (what each holds)
    tensors: PlanCheck | None = None
    #: the memory every block's casts are cut from, block after block, where the family's
    #: MindSpore side holds none of a block's arrays once it is done (``lets_go``); None:
    #: each block's arrays are its own (a GRAPH-compiled network keeps the data it was
    #: given until it runs again: one array held so would hold a whole slab)
    arena: Arena | None = None
    #: the arrays given to MindSpore, their pages handed back once its passes are done,
    #: where the family's network keeps them until it runs again (``keeps_data``)
    handed: HandedBack = field(default_factory=lambda: HandedBack(None))


def run_blocks(blocks: Any, source: Source, checkpoint: Source, run: Run, *,
               correspondence: list[tuple[str, str]], tensors: PlanCheck,
               ms_names: list[str]) -> ParityReport:
    """Verify block by block (module docstring); the same verdict as :func:`run_parity`.

    Args:
        blocks: the family's blocks (:class:`~ms_port.archs.llama.blocks.LlamaBlocks`).
        source / checkpoint: the PyTorch source and the MindSpore checkpoint, read lazily.
        run: the token ids, seed, bound and what the run records (notes, progress).
        correspondence: ``(mindspore_path, torch_path)`` layer pairs from the plan.
        tensors: the tensor-level comparison through the plan, made a block at a time
            before the block runs, on a thread while the block before it computes (its
            tensors then come from the page cache: each file is read from the disk once);
            the tensors no block holds are compared last. What it finds lets MindSpore
            compute on PyTorch's arrays of a tensor proven the same (:func:`_shareable`).
        ms_names: the MindSpore tensor names, to name a failing layer's tensors.
    """
    from . import devices
    from .inputs import second_draw

    devices.set_ms_device("cpu")
    unmap_large_arrays()
    second = second_draw(run.feed, seed=run.seed)
    state = _BlockRun(blocks, source, checkpoint, run, np.asarray(run.feed[0].array),
                      np.asarray(second[0].array), correspondence, tensors=tensors)
    if getattr(blocks, "lets_go", False):
        state.arena = Arena()
    if getattr(blocks, "keeps_data", False):
        state.handed = HandedBack(LARGE_ARRAY)
    pieces = blocks.pieces(set(source.tensors), set(checkpoint.tensors))
    state.span_rows, state.span_from = _span_rows(pieces, source, blocks)
    # a family whose MindSpore side needs a setting held across its blocks (MindFormers'
    # parallel_core: GRAPH mode and its CPU stand-ins) gives it as ``session()``
    session = getattr(blocks, "session", None)
    with session() if session is not None else contextlib.nullcontext():
        compared = _run_pieces(state, pieces, tensors)
    state.arena = None  # the slab goes: nothing after the blocks cuts from it
    with state.timer("tensors"):
        tensor_diff = tensors.result()
    run.notes.extend(getattr(blocks, "notes", lambda: [])())
    for k, c in enumerate(compared):
        c.index = k
    streams = state.streams
    outputs = _compare_outputs(
        [("logits", streams.t.numpy())], [("logits", ms_to_numpy(streams.m))],
        {} if streams.t64 is None else {"logits": streams.t64.numpy()},
        {"logits": streams.t2.numpy()}, tol=run.tol, scaled=True, drift=state.drift,
        notes=run.notes)
    mine, theirs = _params_under(ms_names), _params_under(list(source.tensors))
    networks = Networks(params_of=lambda path, torch_side: (theirs if torch_side else mine)(path),
                        known=lambda c: [])
    run.timings.update(state.timer.spent)
    return judge(outputs, compared, state.drift, networks, run,
                 correspondence=correspondence, nonfinite_weights=state.nonfinite.lines(),
                 tensor_diff=tensor_diff)


#: elements per span of the vocabulary; None: :data:`~ms_port.check.spans.SPAN_SHARE` of the
#: largest decoder layer's parameters
SPAN_NUMEL: int | None = None


def _span_rows(pieces: list[Any], source: Source, blocks: Any = None
               ) -> tuple[int | None, int | None]:
    """(rows per span of the vocabulary, the rows from which it runs in spans): from
    :data:`SPAN_NUMEL` (both, in rows of the embedding's width), else
    :data:`~ms_port.check.spans.SPAN_SHARE` and :data:`~ms_port.check.spans.SPAN_FROM` of
    the largest decoder layer's parameters; (None, None) where no piece holds the
    vocabulary. A layer whose routed experts run a group at a time counts its other
    tensors and one group."""
    vocab = [source.tensors.get(p.torch[n]) for p in pieces for n in p.rows if n in p.torch]
    vocab = [info for info in vocab if info is not None and len(info.shape) == 2]
    if not vocab:
        return None, None
    width = vocab[0].shape[1]
    if SPAN_NUMEL is not None:
        return (max(1, SPAN_NUMEL // width),) * 2
    layer = max((_layer_numel(p, source, blocks) for p in pieces if p.kind == "layer"),
                default=0)
    if not layer:
        return None, None
    return span_rows(layer, width), span_rows(layer, width, SPAN_FROM)


def _layer_numel(piece: Any, source: Source, blocks: Any) -> int:
    """A decoder layer's parameters as verify by layers holds them."""
    groups = None if blocks is None else plan_groups(blocks, piece, source)
    if groups is not None:
        piece = without_experts(piece, groups)
    own = sum(source.tensors[n].numel for n in piece.torch.values() if n in source.tensors)
    return own + (0 if groups is None else group_numel(groups, source))


def _run_pieces(state: _BlockRun, pieces: list[Any], tensors: PlanCheck
                ) -> list[LayerComparison]:
    """Every block in turn (:func:`_run_piece`), its tensors compared through the plan
    first (``tensors``), collecting garbage between blocks."""
    compared: list[LayerComparison] = []
    ahead = ReadAhead()
    # each block's tensors are compared on a thread while the block before it computes,
    # but where their check holds much at once (a mixture's experts, a joined tensor
    # compared whole: at DeepSeek-V3.2's widths the experts' check beside the dense
    # layer's float64 pass set the run's peak), as their block starts; a block waits for
    # its own (the "tensors" timing is that wait)
    checking = ThreadPoolExecutor(1, "ms-port-tensors")
    checks: dict[int, Future[None]] = {}

    def check(k: int, now: bool = False) -> None:
        if k >= len(pieces) or k in checks:
            return
        names = list(pieces[k].ms.values())
        if now or not tensors.heavy(names):
            checks[k] = checking.submit(tensors.check, names)

    try:
        for n, piece in enumerate(pieces):
            state.run.step(f"block {n + 1}/{len(pieces)}: {piece.name}")
            # the next block's stretches of both files are read into the page cache on a
            # thread while this one computes (:mod:`ms_port.read.ahead`); the first
            # block's too, as the run starts
            ahead.want(_extents(state, pieces[0 if n == 0 else n + 1:n + 2]))
            check(n, now=True)
            with state.timer("tensors"):
                checks.pop(n).result()
            check(n + 1)
            groups = plan_groups(state.blocks, piece, state.source)
            if groups is None:
                _check_fits(piece, state.source, state.run.noise_floor,
                            span_rows=state.span_rows if _vocabulary(state, piece) else None)
            else:  # the routed experts count one group
                _check_fits(without_experts(piece, groups), state.source,
                            state.run.noise_floor, extra=group_numel(groups, state.source))
            compared += _run_piece(state, piece, groups)
            state.nonfinite.piece_done()
            # a block's networks hold reference cycles: collect them before the next block.
            # What the first block imported (both frameworks) is frozen out of the scan:
            # a full collection over it took 1.1 s per block
            if n == 0:
                gc.collect()
                gc.freeze()
            else:
                gc.collect()
            # the block's MindSpore tensors are freed: what MindSpore's pool keeps of them
            # goes back too (at Llama-3-70B's widths, a decoder layer's float32 weights
            # stayed resident through the next block's float64 read)
            release_ms_pool()
    finally:
        checking.shutdown(wait=True, cancel_futures=True)
        ahead.close()
        gc.unfreeze()
    return compared


def _extents(state: _BlockRun, pieces: list[Any]) -> list[tuple[str, int, int]]:
    """Where the blocks' tensors lie in both files, in the order a block reads them (its
    PyTorch tensors, then its MindSpore ones)."""
    found = []
    for piece in pieces:
        for names, where in ((piece.torch, state.source), (piece.ms, state.checkpoint)):
            for name in names.values():
                info = where.tensors.get(name)
                found += info.extents if info is not None else ()
    return found


#: what a block needs beyond its PyTorch tensors' bytes: activations, the frameworks' work
BLOCK_MARGIN = 1 << 30


def _check_fits(piece: Any, source: Source, noise_floor: bool, available: int | None = None,
                span_rows: int | None = None, extra: int = 0) -> None:
    """Refuse a block whose PyTorch step cannot fit in the memory left, before reading it:
    its tensors in float64 (the noise pass; float32 without it), beside all the run holds
    already, plus :data:`BLOCK_MARGIN`; a vocabulary tensor counts one span of
    ``span_rows`` rows; ``extra``: parameters beyond the piece's (a group of routed
    experts). The OOM killer would end the run with no word.

    Raises:
        ForwardUnavailable: it does not fit (verify then proves the tensors alone).
    """
    available = available_memory() if available is None else available
    if available is None:
        return
    numel = extra
    for local, name in piece.torch.items():
        info = source.tensors.get(name)
        if info is None:
            continue
        spanned = span_rows is not None and local in piece.rows and in_spans(info, span_rows)
        numel += info.numel // info.shape[0] * span_rows if spanned else info.numel
    wide = 8 if noise_floor and not piece.exact else 4
    need = numel * wide + BLOCK_MARGIN
    if need > available:
        gib = 2**30
        raise ForwardUnavailable(
            f"block {piece.name} needs ~{need / gib:.1f} GiB ({numel:,} parameters in "
            f"float{wide * 8}, and activations), {available / gib:.1f} GiB are available; "
            "free memory" + (", or verify with --no-noise-floor (float32 only)"
                             if wide == 8 else ""))


@dataclass
class _Recorded:
    """One block's passes: PyTorch's layers with their float32 noise and sensitivity,
    MindSpore's layers, and the block's output fed PyTorch's input, MindSpore's and
    PyTorch's float64 one (None for the first block)."""

    events: list[Event]
    sens: dict[tuple[str, int], float]
    noise: dict[tuple[str, int], float]
    m_events: list[Event]
    fed: np.ndarray | None = None
    fed64: np.ndarray | None = None


def _run_piece(state: _BlockRun, piece: Any, groups: Any = None) -> list[LayerComparison]:
    """Build, load, run and compare one block on both sides; move the streams on. A
    block holding the vocabulary runs it a span of rows at a time where it outgrows a
    decoder layer (:mod:`ms_port.check.spans`); a mixture of experts' routed experts run
    a group at a time where ``groups`` says (:mod:`ms_port.check.routed`)."""
    if groups is not None:
        recorded, experts = run_routed(state, piece, groups, _whole_piece)
        return _compare_piece(state, piece, recorded) + experts
    spans = _spans_of(state, piece)
    recorded = _whole_piece(state, piece) if spans is None else _in_spans(state, piece, spans)
    return _compare_piece(state, piece, recorded)


def _whole_piece(state: _BlockRun, piece: Any) -> _Recorded:
    """The block in one go: its PyTorch float32 passes (the second input's measured as it
    runs), MindSpore's, then PyTorch's float64 (measured as it runs).

    One block of one precision of one side in memory at a time, but for the float32
    arrays both sides compute on: a MindSpore tensor the tensor check found to be its
    PyTorch source's bytes unchanged is given PyTorch's float32 array, not cast again
    from its own (the same bytes, so the same array to the bit; 7B: half of the float32
    casts), which is why MindSpore runs before the float64 pass."""
    given = state.streams.t
    events, sens, shared = _torch_float32(state, piece)
    m_events, fed = _ms_passes(state, piece, given, shared)
    del shared
    noise, fed64 = _torch_float64(state, piece, events, given)
    return _Recorded(events, sens, noise, m_events, fed, fed64)


def _torch_float32(state: _BlockRun, piece: Any
                   ) -> tuple[list[Event], dict[tuple[str, int], float], dict[str, np.ndarray]]:
    """PyTorch's float32 passes, the main and the second input's: (the main pass's layers,
    the sensitivity, the arrays MindSpore's side may share: :func:`_shareable`)."""
    import torch

    blocks, streams, timer = state.blocks, state.streams, state.timer
    with timer("read"):
        t_arrays = _arrays(state.source, piece.torch, state.nonfinite, "PyTorch",
                           arena=state.arena)
    shared = _shareable(state, piece, t_arrays)
    with timer("build"):  # the arrays handed over: the network's loading may free them
        model = blocks.torch_network(piece, _handed_over(t_arrays))
    given, before2 = streams.t, streams.t2
    with timer("torch"):
        if _stacks(state):
            # one pass over the weights, the second input stacked after the main one
            both = None if given is None else torch.cat([given, before2])
            out, events = record_torch(model, lambda mdl=model: blocks.torch_step(
                mdl, piece, both, np.concatenate([state.ids, state.ids2])))
            sens = split_stacked(events, state.ids.shape, measure=True)
            n = state.ids.shape[0]
            streams.t, streams.t2 = out[:n].clone(), out[n:].clone()
        else:
            streams.t, events = record_torch(
                model, lambda mdl=model: blocks.torch_step(mdl, piece, given, state.ids))
            streams.t2, sens = Measure(events, "recorded").run(
                model, lambda mdl=model: blocks.torch_step(mdl, piece, before2, state.ids2))
    del model
    gc.collect()
    return events, sens, shared


def _shareable(state: _BlockRun, piece: Any, arrays: dict[str, np.ndarray]
               ) -> dict[str, np.ndarray]:
    """The block's MindSpore tensors (local names) that hold their PyTorch source's bytes
    unchanged (:meth:`~ms_port.check.tensors.PlanCheck.unchanged`), as PyTorch's float32
    arrays of them; their NaN/Inf counts are the source's."""
    if state.tensors is None:
        return {}
    local_of = {name: local for local, name in piece.torch.items()}
    shared = {}
    for local, name in piece.ms.items():
        source = state.tensors.unchanged(name)
        array = arrays.get(local_of.get(source, ""))
        if source is not None and array is not None and array.dtype == np.float32:
            shared[local] = array
            state.nonfinite.same("MindSpore", name, "PyTorch", source)
    return shared


def _ms_passes(state: _BlockRun, piece: Any, given: Any, shared: dict[str, np.ndarray]
               ) -> tuple[list[Event], np.ndarray | None]:
    """MindSpore's passes: the main one (its layers recorded) and the block fed PyTorch's
    input ``given``: (the layers, the fed output; None for the first block). ``shared``:
    arrays of the block's tensors already in memory (:func:`_shareable`)."""
    blocks, streams, timer = state.blocks, state.streams, state.timer
    with timer("read"):  # (not cut from the slab: cut after PyTorch's arrays, held by the
        # shared ones, the next slab would be made as large as both sides' together)
        read = _arrays(state.checkpoint, {k: v for k, v in piece.ms.items() if k not in shared},
                       state.nonfinite, "MindSpore")
    m_arrays = {k: shared[k] if k in shared else read.pop(k) for k in piece.ms}
    state.handed.watch(m_arrays.values())
    with timer("build"):
        net = blocks.ms_network(piece, m_arrays)  # takes the arrays out as it loads them
    del m_arrays
    with timer("mindspore"):
        streams.m, m_events, fed = _ms_forward(state, piece, net, given)
    _let_go(blocks, net)
    del net
    # PyTorch's float32 passes are done and its float64 pass reads its own weights: no
    # one computes on these arrays again (the caller drops ``shared`` next)
    state.handed.hand_back()
    return m_events, fed


def _ms_forward(state: _BlockRun, piece: Any, net: Any, given: Any
                ) -> tuple[Any, list[Event], np.ndarray | None]:
    """MindSpore's block ``net`` run on its own stream and fed PyTorch's input ``given``:
    (its output, its layers, the fed output; None for the first block). Stacked in one
    pass where the family's blocks say they may (:func:`_stacks`)."""
    import mindspore as ms

    blocks, before, ids = state.blocks, state.streams.m, state.ids
    if given is not None and piece.outputs is None and _stacks(state):
        # one pass over the weights, PyTorch's input stacked after the block's own
        both = ms.Tensor(np.concatenate([ms_to_numpy(before), given.numpy()]))
        out, events = record_ms(net, lambda: blocks.ms_step(net, piece, both,
                                                            np.concatenate([ids, ids])))
        split_stacked(events, ids.shape)
        n = ids.shape[0]
        return out[:n], events, ms_to_numpy(out[n:])
    if piece.outputs is None:
        out, events = record_ms(net, lambda: blocks.ms_step(net, piece, before, ids))
    else:  # no layer recorded (GRAPH mode): the block's output stands for it
        out, events = blocks.ms_step(net, piece, before, ids), []
    fed = (None if given is None else
           ms_to_numpy(blocks.ms_step(net, piece, ms.Tensor(given.numpy()), ids)))
    return out, events, fed


def _stacks(state: _BlockRun) -> bool:
    """Whether each side's two inputs run stacked on the batch axis in one pass: the
    family's blocks say every layer computes each row of a batch on its own, batch first
    (``stacks``), and both inputs have one shape."""
    return bool(getattr(state.blocks, "stacks", False)) and state.ids.shape == state.ids2.shape


def _torch_float64(state: _BlockRun, piece: Any, events: list[Event], given: Any
                   ) -> tuple[dict[tuple[str, int], float], np.ndarray | None]:
    """PyTorch's float64 pass (the float32 noise of each of ``events``) and the block fed
    ``given`` in float64: (the noise, the fed output; None for the first block or
    without the noise floor)."""
    blocks, source, streams, timer = state.blocks, state.source, state.streams, state.timer
    if not state.run.noise_floor:
        return {}, None
    if piece.exact:
        # a lookup rounds nothing: its float64 result is its float32 one, exactly (at
        # Llama-3-70B's widths this skips reading a 7.8 GiB float64 embedding)
        streams.t64 = streams.t.double()
        return {(e.path, e.call): 0.0 for e in events}, None
    alt = None
    if piece.kind == "layer":  # each module's float64 weights read as it runs
        with timer("build"):
            alt = on_demand(blocks.torch_network(piece, {}), piece.torch, source, np.float64,
                            state.arena)
    if alt is None:
        with timer("read"):
            w_arrays = _arrays(source, piece.torch, state.nonfinite, "PyTorch", np.float64,
                               arena=state.arena)
        with timer("build"):
            alt = blocks.torch_network(piece, _handed_over(w_arrays))
    fed64 = None
    with timer("torch"):
        before64 = streams.t64
        if given is not None and _stacks(state):
            # one pass over the weights, the fed input stacked after the block's own:
            # each module's float64 weights cast once, not once per input
            streams.t64, fed64, noise = _stacked(state, piece, alt, events, before64,
                                                 given.double())
        else:
            streams.t64, noise = Measure(events, "float64").run(
                alt, lambda mdl=alt: blocks.torch_step(mdl, piece, before64, state.ids))
            if given is not None:
                fed64 = blocks.torch_step(alt, piece, given.double(), state.ids).numpy()
    del alt
    gc.collect()
    return noise, fed64


def _stacked(state: _BlockRun, piece: Any, model: Any, events: list[Event], first: Any,
             second: Any) -> tuple[Any, np.ndarray, dict[tuple[str, int], float]]:
    """``model`` run once on ``first`` and ``second`` stacked on the batch axis, the
    layers measured on ``first``'s half against ``events`` (:class:`~ms_port.check.
    layers.Measure`, ``stacked``): (the output on ``first``, on ``second``, the measures).
    For a family whose blocks say each row of a batch is computed on its own and every
    layer's output has the batch (or its tokens, batch first) on its first axis
    (``stacks``)."""
    import torch

    ids = np.concatenate([state.ids, state.ids])
    both = torch.cat([first, second])
    out, noise = Measure(events, "float64", stacked=True).run(
        model, lambda: state.blocks.torch_step(model, piece, both, ids))
    n = first.shape[0]
    return out[:n].clone(), out[n:].clone().numpy(), noise


def _vocabulary(state: _BlockRun, piece: Any) -> int | None:
    """The rows of the vocabulary a block runs in spans, or None: it holds no vocabulary,
    one of a decoder layer's size, or the two sides' differ."""
    if not piece.rows or state.span_rows is None:
        return None
    found = [state.source.tensors.get(piece.torch[n]) for n in piece.rows if n in piece.torch]
    found += [state.checkpoint.tensors.get(piece.ms[n]) for n in piece.rows if n in piece.ms]
    # each span's rows read alone (a format that can only read the whole tensor would
    # read it again for every span and pass)
    if not found or state.span_from is None or not all(
            in_spans(info, state.span_from) and info.rows_loader is not None
                            for info in found) or len({info.shape[0] for info in found}) != 1:
        return None
    return found[0].shape[0]


def _spans_of(state: _BlockRun, piece: Any) -> list[Span] | None:
    """The spans of the vocabulary a block runs in (:func:`~ms_port.check.spans.
    plan_spans`), or None (:func:`_vocabulary`)."""
    vocab = _vocabulary(state, piece)
    if vocab is None or state.span_rows is None:
        return None
    if any(x.size and (x.min() < 0 or x.max() >= vocab) for x in (state.ids, state.ids2)):
        return None  # an id no span holds: the whole block says so, as before
    return plan_spans(vocab, state.span_rows, embedding=piece.kind == "embedding",
                      ids=[state.ids, state.ids2])


@dataclass
class _SpanRuns:
    """Each span's recorded passes (layers, output): PyTorch's main, second-input and
    float64 ones, MindSpore's; and the block fed PyTorch's input on each side."""

    main: list[tuple[list[Event], np.ndarray]] = field(default_factory=list)
    second: list[tuple[list[Event], np.ndarray]] = field(default_factory=list)
    wide: list[tuple[list[Event], np.ndarray]] = field(default_factory=list)
    mind: list[tuple[list[Event], np.ndarray]] = field(default_factory=list)
    fed: list[np.ndarray] = field(default_factory=list)
    fed64: list[np.ndarray] = field(default_factory=list)


def _in_spans(state: _BlockRun, piece: Any, spans: list[Span]) -> _Recorded:
    """The block a span of the vocabulary at a time (:mod:`ms_port.check.spans`, each
    span by :func:`_run_span`); the passes put back together and measured as
    :func:`_whole_piece` measures them as they run."""
    import mindspore as ms
    import torch

    streams, runs = state.streams, _SpanRuns()
    given = _Streams(streams.t, streams.t64, streams.t2, streams.m)
    for span in spans:
        _run_span(state, replace(piece, vocab=span.rows), span, given, runs)
    _scan_unrun(state, piece, spans)

    def together(parts: list[tuple[list[Event], np.ndarray]], ids: np.ndarray
                 ) -> tuple[list[Event], np.ndarray]:
        return (merge_events([e for e, _ in parts], spans, ids, piece.wide),
                merge_output([o for _, o in parts], spans, ids))

    events, out = together(runs.main, state.ids)
    events2, out2 = together(runs.second, state.ids2)
    streams.t, streams.t2 = torch.from_numpy(out), torch.from_numpy(out2)
    sens = measured(events, events2, "recorded")
    noise: dict[tuple[str, int], float] = {}
    if state.run.noise_floor and piece.exact:
        streams.t64 = streams.t.double()
        noise = {(e.path, e.call): 0.0 for e in events}
    elif state.run.noise_floor:
        events64, out64 = together(runs.wide, state.ids)
        streams.t64 = torch.from_numpy(out64)
        noise = measured(events, events64, "float64")
    m_events, m_out = together(runs.mind, state.ids)
    streams.m = ms.Tensor(m_out)
    return _Recorded(events, sens, noise, m_events,
                     merge_output(runs.fed, spans, state.ids) if runs.fed else None,
                     merge_output(runs.fed64, spans, state.ids) if runs.fed64 else None)


def _scan_unrun(state: _BlockRun, piece: Any, spans: list[Span]) -> None:
    """NaN/Inf in the rows of the spans no token id ran (an embedding's), counted as the
    whole block would have: a span at a time, both sides."""
    vocab = _vocabulary(state, piece)
    if vocab is None or state.span_rows is None or not spans[0].embedding:
        return
    ran, step = {s.start for s in spans}, state.span_rows
    for start in range(0, vocab, step):
        if start in ran:
            continue
        span = Span(start, min(start + step, vocab), embedding=False)
        with state.timer("read"):
            for names, where, side in ((piece.torch, state.source, "PyTorch"),
                                       (piece.ms, state.checkpoint, "MindSpore")):
                _arrays(where, {k: v for k, v in names.items() if k in piece.rows},
                        state.nonfinite, side, span=(span, piece.rows), arena=state.arena)


def _run_span(state: _BlockRun, sub: Any, span: Span, given: _Streams, runs: _SpanRuns
              ) -> None:
    """One span of a block (``sub``: the piece built for its rows) on every pass, given
    the previous block's outputs; its networks freed before the next span."""
    import mindspore as ms

    blocks, timer = state.blocks, state.timer
    ids, ids2 = span.ids(state.ids), span.ids(state.ids2)
    with timer("read"):
        t_arrays = _arrays(state.source, sub.torch, state.nonfinite, "PyTorch",
                           span=(span, sub.rows), arena=state.arena)
    with timer("build"):
        model = blocks.torch_network(sub, _handed_over(t_arrays))
    with timer("torch"):
        runs.main.append(_recorded(model, lambda m=model: blocks.torch_step(m, sub, given.t, ids)))
        runs.second.append(_recorded(model,
                                     lambda m=model: blocks.torch_step(m, sub, given.t2, ids2)))
    del model
    gc.collect()
    if state.run.noise_floor and not sub.exact:
        with timer("read"):
            w_arrays = _arrays(state.source, sub.torch, state.nonfinite, "PyTorch",
                               np.float64, span=(span, sub.rows), arena=state.arena)
        with timer("build"):
            alt = blocks.torch_network(sub, _handed_over(w_arrays))
        with timer("torch"):
            runs.wide.append(_recorded(alt,
                                       lambda m=alt: blocks.torch_step(m, sub, given.t64, ids)))
            if given.t is not None:
                runs.fed64.append(blocks.torch_step(alt, sub, given.t.double(), ids).numpy())
        del alt
        gc.collect()
    with timer("read"):
        m_arrays = _arrays(state.checkpoint, sub.ms, state.nonfinite, "MindSpore",
                           span=(span, sub.rows), arena=state.arena)
    state.handed.watch(m_arrays.values())
    with timer("build"):
        net = blocks.ms_network(sub, m_arrays)
    del m_arrays
    with timer("mindspore"):
        if sub.outputs is None:
            out, m_events = record_ms(net, lambda c=net: blocks.ms_step(c, sub, given.m, ids))
        else:  # GRAPH mode: the block's output stands for its layers
            out, m_events = blocks.ms_step(net, sub, given.m, ids), []
        runs.mind.append((m_events, ms_to_numpy(out)))
        if given.t is not None:
            runs.fed.append(ms_to_numpy(blocks.ms_step(net, sub, ms.Tensor(given.t.numpy()),
                                                       ids)))
    _let_go(blocks, net)
    del net
    state.handed.hand_back()
    gc.collect()
    release_ms_pool()


def _let_go(blocks: Any, net: Any) -> None:
    """A block's MindSpore network done with: the family hands its weights back
    (``ms_done``; MindSpore keeps a deleted network's parameters' data,
    :func:`~ms_port.archs.llama.blocks.release`), the network itself kept for the next
    block where the family builds it once. Families without ``ms_done`` let go of their
    networks' weights themselves."""
    done = getattr(blocks, "ms_done", None)
    if done is not None:
        done(net)


def _recorded(model: Any, run: Callable[[], Any]) -> tuple[list[Event], np.ndarray]:
    """A PyTorch pass recorded: (its layers, its output)."""
    out, events = record_torch(model, run)
    return events, out.numpy()


def _compare_piece(state: _BlockRun, piece: Any, recorded: _Recorded) -> list[LayerComparison]:
    """A block's layers paired and compared, and the block fed PyTorch's input."""
    streams = state.streams
    events, m_events = recorded.events, recorded.m_events
    for e in [*events, *m_events]:
        e.path = piece.rename(e.path)
    noise = {(piece.rename(p), c): v for (p, c), v in recorded.noise.items()}
    sens = {(piece.rename(p), c): v for (p, c), v in recorded.sens.items()}
    pairs = (pair_events(events, m_events, state.correspondence) if piece.outputs is None
             else _block_pair(piece, events, ms_to_numpy(streams.m)))
    found = _layer_comparisons(pairs, noise, sens, tol=state.run.tol, scaled=True,
                               drift=state.drift)
    if recorded.fed is not None:
        out = streams.t.numpy()
        found.append(_fed(piece.name, recorded.fed, out, recorded.fed64,
                          distance(out, streams.t2.numpy(), "recorded"), tol=state.run.tol))
    return found


def _handed_over(arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """``arrays`` as torch tensors, emptying ``arrays``: the returned dict holds the only
    references, so a tensor the network's loading takes out (a stacked expert's parts) is
    freed there."""
    import torch

    with warnings.catch_warnings():  # a file's float32 tensor is a read-only map: the
        # network only reads it (no_grad), and torch's warning would reach the user's stderr
        warnings.filterwarnings("ignore", "The given NumPy array is not writable")
        return {k: torch.from_numpy(arrays.pop(k)) for k in list(arrays)}


def _block_pair(piece: Any, events: list[Event], ms_out: np.ndarray) -> list[Pair]:
    """The block's output on both sides as one pair, where MindSpore recorded no layer:
    PyTorch's last call of ``piece.outputs[0]`` against MindSpore's block output, named
    ``piece.outputs[1]``."""
    torch_path, ms_path = piece.outputs
    mine = [e for e in events if e.path == torch_path]
    if not mine:
        raise ParityError(f"block {piece.name}: PyTorch recorded no layer {torch_path!r}; "
                          "the family's blocks do not fit transformers' network")
    last = mine[-1]
    ms_event = Event(path=ms_path, call=last.call, seq=0, kind="block (GRAPH mode)",
                     leaf=last.leaf, arrays=[ms_out])
    return [Pair(last, ms_event, "name")]


def _fed(name: str, ms_out: np.ndarray, torch_out: np.ndarray, torch64: np.ndarray | None,
         sensitivity: float, *, tol: float) -> LayerComparison:
    """A block given PyTorch's own input on the MindSpore side, against its local noise."""
    error, max_abs = relative_error(ms_out, torch_out)
    noise = None if torch64 is None else distance(torch_out, torch64, "float64")
    bound = bound_for(tol, noise, scaled=True)
    return LayerComparison(
        index=0, ms=f"{name} (fed PyTorch's input)", torch=name, call=0, ms_kind="block",
        torch_kind="block", paired_by="fed", shape=tuple(torch_out.shape), error=error,
        max_abs=max_abs, noise=noise, bound=bound, sensitivity=sensitivity,
        status=status_of(error, bound, sensitivity), leaf=False)


__all__ = ["available_memory", "choose_mode", "run_blocks"]
