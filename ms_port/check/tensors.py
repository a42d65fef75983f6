"""Tensor-level comparison: what each MindSpore tensor holds, against what it should.

Before any forward pass, every tensor the MindSpore side holds is compared with its
PyTorch source through the :class:`~ms_port.match.plan.Plan` (after its transforms and
casts): ``identical`` (same bytes in the held dtype), ``differs`` (max |Δ| and cosine,
in float64), ``shape``, ``missing`` or ``unplanned``. A tensor that is not what it should
be is then identified by what it holds: the source tensor with the same content hash
(raw, through the same transforms, or transposed), else the closest by cosine among
same-shape tensors named like its source. Tensors are loaded one at a time and only
digests are kept, so a 100,000-tensor checkpoint is compared in bounded memory.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Union

import numpy as np

from ..display import Renderable
from ..match.transforms import Transform, apply_all, shape_after
from ..read.tensors import FLOAT_DTYPES, TensorInfo, dtype_name, format_shape, same_bits

STATUSES = ("identical", "differs", "shape", "missing", "unplanned")
#: same-shape tensors scored by cosine per differing tensor, best named first
CANDIDATES = 64
#: closeness searches stop after this many elements scored (an exact hash always runs)
CLOSE_ELEMENTS = 1 << 30
#: a tensor "holds" another's values when their cosine exceeds this
CLOSE_COSINE = 0.999
_CHUNK = 1 << 20  # elements per float64 chunk: statistics in bounded memory
_HITS_KEPT = 8
_POSTING = 4096  # names read per shared token when ranking candidates

Value = Union[np.ndarray, Callable[[], np.ndarray]]


@dataclass
class TensorDelta:
    """One compared tensor.

    Attributes:
        target: the MindSpore name (in name mode: the name in B).
        source: its planned source (in name mode: the same name in A), if any.
        status: ``identical``, ``differs``, ``shape`` (shapes differ), ``missing``
            (planned but not held / not in B) or ``unplanned`` (held, but the plan has
            no source / only in B).
        max_abs / cosine: computed in float64 for ``differs`` (``None`` when undefined).
        holds: the source tensor whose values it really holds, when found.
        holds_how: ``exact`` (content hash; ``exact (transposed)`` etc.) or
            ``close (cosine 0.9999)``.
    """

    target: str
    source: str | None
    status: str
    max_abs: float | None = None
    cosine: float | None = None
    holds: str | None = None
    holds_how: str | None = None
    shape: tuple[int, ...] | None = None
    expected_shape: tuple[int, ...] | None = None

    def describe(self, mode: str = "plan") -> str:
        """One line: ``bn.moving_mean  differs  max|Δ| 0.93  cos 0.4100  holds …``."""
        src = f" (source {self.source})" if self.source and self.source != self.target else ""
        if self.status == "missing":
            what = f"missing in B{src}"
        elif self.status == "unplanned":
            what = "only in B" if mode == "names" else "unplanned: no source in the plan"
        elif self.status == "shape":
            what = f"shape {_shape(self.shape)} ≠ {_shape(self.expected_shape)}{src}"
        elif self.status == "differs":
            what = f"differs{src}  max|Δ| {_num(self.max_abs, '.3g')}  cos {_num(self.cosine)}"
        else:
            what = f"identical{src}"
        how = (self.holds_how or "").replace(" (", ", ", 1).rstrip(")")
        held = f"  holds {self.holds} ({how})" if self.holds else ""
        return f"{self.target}  {what}{held}"

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "source": self.source, "status": self.status,
                "max_abs": _json(self.max_abs), "cosine": _json(self.cosine),
                "holds": self.holds, "holds_how": self.holds_how,
                "shape": None if self.shape is None else list(self.shape),
                "expected_shape": (None if self.expected_shape is None
                                   else list(self.expected_shape))}


@dataclass(repr=False)
class TensorDiff(Renderable):
    """Every compared tensor of B against A, in plan (or A's) order.

    Attributes:
        a / b: the two files (in plan mode: the PyTorch one, then the MindSpore one).
        mode: ``plan`` (through a conversion plan) or ``names`` (same names paired).
        deltas: one per tensor; renderers show the problems first.
        notes: plan conflicts and other things worth knowing.
    """

    a: str
    b: str
    mode: str
    deltas: list[TensorDelta]
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every tensor identical: none differs, none missing, none unexplained."""
        return all(d.status == "identical" for d in self.deltas)

    @property
    def counts(self) -> dict[str, int]:
        n = Counter(d.status for d in self.deltas)
        return {s: n[s] for s in STATUSES}

    @property
    def problems(self) -> list[TensorDelta]:
        return [d for d in self.deltas if d.status != "identical"]

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "a": self.a, "b": self.b, "mode": self.mode,
                "counts": self.counts, "deltas": [d.to_dict() for d in self.deltas],
                "notes": self.notes}

    def __repr__(self) -> str:
        counts = ", ".join(f"{k}={v}" for k, v in self.counts.items() if v)
        return f"TensorDiff(ok={self.ok}, mode={self.mode!r}, {counts or 'empty'})"


def compare_through_plan(plan: Any, values: Mapping[str, Value], *, a: str,
                         b: str, infos: Mapping[str, TensorInfo] | None = None) -> TensorDiff:
    """Compare what the MindSpore side holds with what ``plan`` says it should hold.

    Args:
        plan: a :class:`~ms_port.match.plan.Plan` whose source carries data.
        values: MindSpore name -> array, or a zero-argument loader (called when needed,
            so one tensor is in memory at a time).
        a / b: names of the two sides, for the report.
        infos: the MindSpore side's tensors where they read rows alone: a target the plan
            computes a group at a time (stacked experts) is compared a group of rows at a
            time, and loaded whole only where a group differs (to say how).

    Returns:
        A :class:`TensorDiff` in target order; tensors held but not in the target follow.

    Example:
        >>> d = compare_through_plan(plan, {i.name: i.load for i in ckpt}, a="x.pth",
        ...                          b="x.ckpt")
        >>> [x.describe() for x in d.problems]
        ['bn.moving_mean  differs (source bn.running_mean)  … holds bn.running_var (exact)']
    """
    return PlanCheck(plan, values, a=a, b=b, infos=infos).result()


class PlanCheck:
    """:func:`compare_through_plan` a group of tensors at a time, in any order: verify by
    layers checks each block's tensors before the block runs (on a thread, while the
    block before it computes), so that each file is read from the disk once (the block
    then reads them from the page cache). The result is the one
    :func:`compare_through_plan` gives, whatever the order the groups came in. The groups
    may be checked on one thread while another reads what is found (:meth:`unchanged`)."""

    def __init__(self, plan: Any, values: Mapping[str, Value], *, a: str, b: str,
                 infos: Mapping[str, TensorInfo] | None = None) -> None:
        """(as :func:`compare_through_plan`)"""
        self.plan, self.values, self.a, self.b, self.infos = plan, values, a, b, infos or {}
        self.matches = {m.target: m for m in plan.matches}
        order = list(plan.target.tensors) + [n for n in values if n not in plan.target]
        self.position = {name: k for k, name in enumerate(order)}
        self.found: dict[str, TensorDelta] = {}
        self.checks: list[_Check] = []

    def check(self, names: Iterable[str]) -> None:
        """Compare ``names`` (MindSpore names; those done already, or neither planned nor
        held, are passed over)."""
        for name in names:
            if name in self.found or name not in self.position:
                continue
            m = self.matches.get(name)
            if name not in self.values or m is None:
                delta = TensorDelta(name, m and m.source,
                                    "missing" if name not in self.values else "unplanned")
            elif (_grouped_identical(self.plan, m, self.infos.get(name))
                  or _rows_identical(self.plan, m, self.infos.get(name))):
                delta = TensorDelta(name, m.source or f"({m.detail})", "identical", 0.0,
                                    1.0, shape=tuple(m.shape))
            else:
                delta = _compare(self.checks, name, m.source or f"({m.detail})",
                                 self.plan.expected(m), _loader(self.values[name]),
                                 m.transforms)
            self.found[name] = delta

    def heavy(self, names: Iterable[str]) -> bool:
        """Whether comparing ``names`` holds more than :data:`ROWS_BYTES` a side at once:
        a target the plan makes a group at a time (a mixture's experts: a group's expected
        and written rows, and its transforms' copies), or a large one it does not compare
        a span of rows at a time (a joined q/k/v or gate/up, compared whole). Verify by
        layers checks such a block as it starts, not beside the block before it."""
        for n in names:
            m = self.matches.get(n)
            if m is not None and (m.groups or (not _renamed(m) and m.nbytes > ROWS_BYTES)):
                return True
        return False

    def unchanged(self, name: str) -> str | None:
        """The source tensor whose bytes the checked MindSpore tensor ``name`` holds
        unchanged: found identical, and planned as the source's own bytes under another
        name (no transform, part, join or cast), and held in the planned dtype; else None.
        Its values in any dtype are then the source's in that dtype, to the bit."""
        delta, m, info = self.found.get(name), self.matches.get(name), self.infos.get(name)
        if (delta is None or delta.status != "identical" or m is None or not m.source
                or info is None or info.dtype != m.out_dtype):
            return None
        renamed = (not m.transforms and not m.parts and m.part is None and m.layout is None
                   and not m.groups and m.how not in ("initialised", "state")
                   and m.dtype == m.out_dtype and tuple(m.shape) == tuple(m.source_shape))
        return m.source if renamed else None

    def result(self) -> TensorDiff:
        """Every tensor compared (the rest now), in target order, and what the ones that
        are not what they should be hold."""
        self.check(self.position)
        plan, at = self.plan, self.position
        deltas = sorted(self.found.values(), key=lambda d: at[d.target])
        checks = sorted(self.checks, key=lambda c: at[c.delta.target])
        notes = [c.message for c in plan.conflicts] + _Holds(plan.source.tensors).resolve(checks)
        if plan.unused:
            notes.append(f"{len(plan.unused)} source tensors not in the plan: "
                         + ", ".join(u.name for u in plan.unused[:5])
                         + (", …" if len(plan.unused) > 5 else ""))
        return TensorDiff(self.a, self.b, "plan", deltas, notes)


def _grouped_identical(plan: Any, m: Any, info: TensorInfo | None) -> bool:
    """Whether a target the plan computes a group at a time (``m.groups``: an expert's
    rows each) holds every group's rows byte for byte, read a group at a time (at
    DeepSeek-V3's widths 64 experts' ``weight1`` is 7 GiB in float32 whole). False where it
    cannot say so (no rows of their own, another shape, a group that differs)."""
    if (not getattr(m, "groups", 0) or info is None or info.rows_loader is None
            or tuple(info.shape) != tuple(m.shape) or m.shape[0] % m.groups):
        return False
    rows = m.shape[0] // m.groups
    return _all_same((expected, info.load_rows(g * rows, (g + 1) * rows))
                     for g, expected in enumerate(plan.grouped(m)))


def _all_same(pairs: Iterable[tuple[Any, Any]]) -> bool:
    """Whether each (expected, actual) span holds the same bytes in the same dtype and
    shape; stops at the first that does not (each span read only when reached)."""
    for expected, actual in pairs:
        actual = np.asarray(actual)
        expected = _align(np.asarray(expected), actual.dtype)
        if (expected.shape != actual.shape or expected.dtype != actual.dtype
                or not same_bits(expected, actual)):
            return False
    return True


#: bytes of each span of rows :func:`_rows_identical` reads on each side
ROWS_BYTES = 16 << 20


def _renamed(m: Any) -> bool:
    """Whether a match plans its source's bytes under another name: no transform, part,
    join, declared value or cast."""
    return not (m.parts or m.part is not None or m.init is not None or m.transforms
                or m.out_dtype != m.dtype or not m.source)


def _rows_identical(plan: Any, m: Any, info: TensorInfo | None) -> bool:
    """Whether a target that is its source's bytes unchanged (renamed: no transform, no
    cast, one source) holds them, read a span of :data:`ROWS_BYTES` of rows at a time on
    both sides: verify by layers checks a vocabulary-sized embedding or head beside both
    frameworks (the block before it running), where whole (Llama-3-70B's: 2 GiB of bfloat16 a side)
    it would set the run's peak. False where it cannot say so (no rows of their own, a
    small tensor, a span that differs): the whole comparison then says how."""
    if (info is None or info.rows_loader is None or not _renamed(m)
            or info.nbytes <= ROWS_BYTES or not info.shape):
        return False
    source = plan.source.tensors.get(m.source)
    if (source is None or source.rows_loader is None or tuple(source.shape) != tuple(info.shape)
            or source.dtype != info.dtype or tuple(m.shape) != tuple(info.shape)):
        return False
    rows = info.shape[0]
    step = max(1, ROWS_BYTES // max(1, info.nbytes // rows))
    spans = ((a, min(rows, a + step)) for a in range(0, rows, step))
    return _all_same((source.load_rows(a, b), info.load_rows(a, b)) for a, b in spans)


def compare_by_name(a_source: Any, b_source: Any) -> TensorDiff:
    """Compare two checkpoints of one framework tensor by tensor, pairing equal names.

    Args:
        a_source / b_source: :class:`~ms_port.read.sources.Source` objects (with data).

    Returns:
        A :class:`TensorDiff` (mode ``names``) in A's order, then names only in B;
        a differing tensor of B is identified among A's tensors.

    Example:
        >>> d = compare_by_name(read_source("a.pth"), read_source("b.pth"))
        >>> d.ok, d.counts["differs"]
        (False, 2)
    """
    deltas: list[TensorDelta] = []
    checks: list[_Check] = []
    for info in a_source:
        if info.name not in b_source:
            deltas.append(TensorDelta(info.name, info.name, "missing"))
        else:
            deltas.append(_compare(checks, info.name, info.name, info.load(),
                                   b_source[info.name].load, ()))
    deltas += [TensorDelta(i.name, None, "unplanned") for i in b_source
               if i.name not in a_source]
    notes = _Holds(a_source.tensors).resolve(checks)
    return TensorDiff(a_source.path, b_source.path, "names", deltas, notes)


# -- one comparison -------------------------------------------------------------------


@dataclass
class _Check:
    """A tensor that is not what it should be, waiting to be identified."""

    delta: TensorDelta
    chain: tuple[Transform, ...]
    key: tuple[tuple[int, ...], str, str]  # (shape, dtype, sha256)
    dtype: np.dtype
    actual: Callable[[], np.ndarray]


def _loader(value: Value) -> Callable[[], np.ndarray]:
    return (lambda: np.asarray(value())) if callable(value) else (lambda: np.asarray(value))


def _compare(checks: list[_Check], target: str, source: str, expected: np.ndarray,
             actual_fn: Callable[[], np.ndarray], chain: tuple[Transform, ...]) -> TensorDelta:
    """The delta; a check appended when the tensor is not what it should be."""
    actual = np.asarray(actual_fn())
    expected = _align(np.asarray(expected), actual.dtype)
    shape, want = tuple(actual.shape), tuple(expected.shape)
    if shape != want:
        delta = TensorDelta(target, source, "shape", shape=shape, expected_shape=want)
    elif expected.dtype == actual.dtype and same_bits(expected, actual):  # one byte order
        return TensorDelta(target, source, "identical", 0.0, 1.0, shape=shape)
    else:
        delta = TensorDelta(target, source, "differs", *_stats(expected, actual), shape=shape)
    checks.append(_Check(delta, chain, _key(actual), actual.dtype, actual_fn))
    return delta


def _name(dtype: np.dtype) -> str:
    try:
        return dtype_name(dtype)
    except (KeyError, TypeError):
        return str(dtype)


def _kind(dtype: np.dtype) -> str:
    name = _name(dtype)
    return "float" if name in FLOAT_DTYPES else "int" if name.startswith(("int", "uint")) \
        else name


def _align(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``array`` in ``dtype`` where the cast stays within one kind (float↔float, int↔int)."""
    if array.dtype == dtype or _kind(array.dtype) != _kind(dtype):
        return array
    return array.astype(dtype)


def _raw(array: np.ndarray) -> np.ndarray:
    """The little-endian bytes of ``array``, as a flat uint8 view where possible."""
    little = array.dtype.newbyteorder("<")
    return np.ascontiguousarray(array, dtype=little).reshape(-1).view(np.uint8)


def _key(array: np.ndarray) -> tuple[tuple[int, ...], str, str]:
    return tuple(array.shape), _name(array.dtype), hashlib.sha256(_raw(array)).hexdigest()


def _stats(a: np.ndarray, b: np.ndarray) -> tuple[float | None, float | None]:
    """(max |a - b|, cosine), in float64 chunk by chunk; inf when NaN/Inf disagree."""
    wide = np.complex128 if np.iscomplexobj(a) or np.iscomplexobj(b) else np.float64
    fa, fb = a.reshape(-1), b.reshape(-1)
    max_abs, dot, na, nb = 0.0, 0.0, 0.0, 0.0
    for i in range(0, fa.size, _CHUNK):
        x, y = fa[i:i + _CHUNK].astype(wide), fb[i:i + _CHUNK].astype(wide)
        same = (x == y) | (np.isnan(x) & np.isnan(y))
        d = np.where(same, 0.0, np.abs(x - y))
        d[np.isnan(d)] = np.inf
        max_abs = max(max_abs, float(d.max()) if d.size else 0.0)
        if wide is np.float64:
            dot, na, nb = dot + float(x @ y), na + float(x @ x), nb + float(y @ y)
    cosine = None
    if wide is np.float64 and na > 0 and nb > 0 and np.isfinite([dot, na, nb]).all():
        cosine = max(-1.0, min(1.0, dot / float(np.sqrt(na) * np.sqrt(nb))))
    return max_abs, cosine


# -- what does it hold? ---------------------------------------------------------------


_TOKENS = re.compile(r"[A-Za-z]+|\d+")


def _tokens(name: str) -> frozenset[str]:
    name = name[:1024]
    return frozenset(_TOKENS.findall(name)) | frozenset(name.split("."))


def _chain_key(chain: tuple[Transform, ...]) -> str:
    return ";".join(map(str, chain))


class _Holds:
    """Finds, for each check, the pool tensor whose values it holds."""

    def __init__(self, pool: Mapping[str, TensorInfo]):
        self.pool = pool
        self._by_shape: dict[str, dict[tuple[int, ...], list[str]]] = {}
        self._postings: dict[tuple[str, tuple[int, ...]], dict[str, list[str]]] = {}
        self.budget = CLOSE_ELEMENTS

    def resolve(self, checks: list[_Check]) -> list[str]:
        """Fill in ``holds``; returns notes (a search cut short says so)."""
        if not checks:
            return []
        index, unsearched = self._exact_index(checks), 0
        for c in checks:
            hits, count = index.get(c.key, ([], 0))
            if hits:
                self._name_exact(c, hits, count)
            elif c.key[1] in FLOAT_DTYPES:
                if self.budget > 0:
                    self._closest(c)
                else:
                    unsearched += 1
        return [f"{unsearched} differing tensors were not searched for near copies (over "
                f"{CLOSE_ELEMENTS:,} elements scored already)"] if unsearched else []

    def _variants(self, chains: dict[str, tuple[Transform, ...]],
                  shape: tuple[int, ...]) -> list[tuple[str, tuple[int, ...]]]:
        """(variant key, resulting shape) for raw, each chain, and transposed (2-D)."""
        out = [("", shape)] + [(k, s) for k, chain in chains.items()
                               if (s := _after(chain, shape)) is not None]
        return [*out, ("T", shape[::-1])] if len(shape) == 2 else out

    def _exact_index(self, checks: list[_Check]) -> dict[tuple, tuple[list, int]]:
        """(shape, dtype, sha256) -> ([(name, variant)...], count), streaming the pool."""
        wanted: dict[tuple[int, ...], set[np.dtype]] = defaultdict(set)
        for c in checks:
            wanted[c.key[0]].add(c.dtype)
        chains = {_chain_key(c.chain): c.chain for c in checks if c.chain}
        index: dict[tuple, tuple[list, int]] = {}
        for name, info in self.pool.items():
            variants = [(k, s) for k, s in self._variants(chains, info.shape) if s in wanted]
            if not variants or info.loader is None:
                continue
            data = np.asarray(info.load())
            for key, shape in variants:
                array = (np.ascontiguousarray(data.T) if key == "T"
                         else apply_all(chains[key], data) if key else data)
                for dtype in wanted[shape]:
                    cast = _align(array, dtype)
                    if cast.dtype != dtype:
                        continue
                    k = _key(cast)
                    hits, count = index.get(k, ([], 0))
                    if len(hits) < _HITS_KEPT:
                        hits.append((name, key))
                    index[k] = (hits, count + 1)
            del data
        return index

    def _name_exact(self, c: _Check, hits: list[tuple[str, str]], count: int) -> None:
        ref, own = c.delta.source or c.delta.target, _chain_key(c.chain)
        mine = _tokens(ref)

        def rank(hit: tuple[str, str]) -> tuple:
            name, variant = hit
            order = 0 if variant == own else 1 if variant == "" else 2
            return order, -len(_tokens(name) & mine), abs(len(name) - len(ref))

        name, variant = min(hits, key=rank)
        notes = []
        if variant == "T":
            notes.append("transposed")
        elif variant != own:
            notes.append(f"after {variant.replace(';', ', ')}" if variant
                         else "without the planned transforms")
        if count > 1:
            notes.append(f"1 of {count} equal tensors")
        c.delta.holds = name
        c.delta.holds_how = "exact" + (f" ({'; '.join(notes)})" if notes else "")

    def _named_like(self, key: str, chain: tuple[Transform, ...], shape: tuple[int, ...],
                    ref: str) -> list[str]:
        """Up to :data:`CANDIDATES` pool names of ``shape`` after ``chain``, most like ``ref``.

        Names of one shape and their tokens are indexed once; a query scores the names
        sharing its tokens, rare tokens weighing most, reading at most :data:`_POSTING`
        names per token, so 100,000 names stay fast.
        """
        if key not in self._by_shape:
            table: dict[tuple[int, ...], list[str]] = defaultdict(list)
            for name, info in self.pool.items():
                table[_after(chain, info.shape)].append(name)
            self._by_shape[key] = table
        if (key, shape) not in self._postings:
            postings: dict[str, list[str]] = defaultdict(list)
            for name in self._by_shape[key].get(shape, ()):
                for token in _tokens(name):
                    postings[token].append(name)
            self._postings[key, shape] = postings
        postings, score = self._postings[key, shape], Counter()
        for token in _tokens(ref) & postings.keys():
            weight = 1.0 / len(postings[token])  # a rare token ("4321") says the most
            for name in postings[token][:_POSTING]:
                score[name] += weight
        picked = [n for n, _ in score.most_common(CANDIDATES)]
        seen = set(picked)
        rest = (n for n in self._by_shape[key].get(shape, ())[:2 * CANDIDATES] if n not in seen)
        return picked + list(itertools.islice(rest, CANDIDATES - len(picked)))

    def _closest(self, c: _Check) -> None:
        """The best cosine among :data:`CANDIDATES` same-shape tensors named like the source."""
        ref, shape = c.delta.source or c.delta.target, c.key[0]
        chains = {_chain_key(c.chain): c.chain, "": ()}
        found = [(name, chain) for key, chain in chains.items()
                 for name in self._named_like(key, chain, shape, ref)]
        actual, best = np.asarray(c.actual()), (CLOSE_COSINE, None)
        for name, chain in found[:CANDIDATES]:
            info = self.pool[name]
            if info.loader is None or info.dtype not in FLOAT_DTYPES:
                continue
            self.budget -= info.numel
            _, cosine = _stats(apply_all(chain, np.asarray(info.load())), actual)
            if cosine is not None and cosine > best[0]:
                best = (cosine, name)
        if best[1] is not None:
            c.delta.holds, c.delta.holds_how = best[1], f"close (cosine {best[0]:.4f})"


def _after(chain: tuple[Transform, ...], shape: tuple[int, ...]) -> tuple[int, ...] | None:
    try:
        return shape_after(chain, shape)
    except ValueError:
        return None


def _shape(shape: tuple[int, ...] | None) -> str:
    return "?" if shape is None else format_shape(shape)


def _num(x: float | None, spec: str = ".4f") -> str:
    return "n/a" if x is None else f"{x:{spec}}"


def _json(x: float | None) -> float | None:
    return x if x is not None and np.isfinite(x) else None


__all__ = ["STATUSES", "PlanCheck", "TensorDelta", "TensorDiff", "compare_by_name",
           "compare_through_plan"]
