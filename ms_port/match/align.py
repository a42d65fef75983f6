"""Structural alignment: what names cannot pair, the networks' order and shapes can.

After exact names, mapping tables and rules, the tensors left on both sides are grouped
into layers (a layer: the tensors under one path, ``features.3.conv.0``), in the order the
networks define them (a state dict's order is module registration order; a Cell's
parameter order the same on MindSpore's side). Layers already paired by the earlier
stages are anchors; between two anchors, the remaining layers are aligned as sequences
(dynamic programming, as for an edit distance). Two layers can pair when their tensors
correspond one to one — through the built-in rule of the MindSpore layer's kind
(``gamma`` ↔ ``weight``) or by suffix — with equal element counts; shapes are then checked
exactly, with the rule's transforms.

Only **unambiguous** pairs fill: a pair that is part of every best alignment (for each of
the two layers, the only partner any best alignment gives it). Where the order leaves a
choice (two same-shaped layers, one of them without a counterpart), name-token similarity
breaks the tie if it is strict; otherwise the layers stay leftovers, their candidates
named. Aligned tensors are reported as ``aligned`` with the evidence.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .closest import _tokens
from .rules import RULES, LayerRule, known_drop

#: the largest segment aligned (layers × layers): beyond it, leftovers stay leftovers.
#: EfficientNetV2-L from torchvision, 557 × 557 unpaired layers (310k), aligns in 2.4 s;
#: the cap bounds time and the table's memory on a file naming a million layers
MAX_CELLS = 2_000_000
#: the signature suffix of a layer's lone tensor (paired by size and order, not by name)
LONE = "<lone tensor>"


@dataclass
class Layer:
    path: str
    index: int  # position among this side's layers
    params: dict[str, tuple[int, ...]] = field(default_factory=dict)  # suffix -> shape
    names: dict[str, str] = field(default_factory=dict)  # suffix -> full tensor name
    kind: tuple[str, ...] | None = None
    rule: LayerRule | None = None

    def signature(self, target: bool) -> frozenset[tuple[str, int, int]]:
        """(PyTorch suffix, rows, elements per row) per tensor (:func:`rows`): equal on
        both sides when the layers can pair (they survive the rules' unsqueeze and a 1×1
        convolution's weight as a Dense's; a 256×1024 weight is no 1024×256 one). A lone
        tensor with no rule (a block's own scale: torchvision's ``layer_scale``, MindCV's
        ``gamma_``) pairs by its size alone: its name is the module's attribute name."""
        if len(self.params) == 1 and not (target and self.rule):
            return frozenset({(LONE, *rows(next(iter(self.params.values()))))})
        if not target:
            return frozenset((s, *rows(shape)) for s, shape in self.params.items())
        params = self.rule.params if self.rule else {}
        return frozenset((params.get(s, s), *rows(shape)) for s, shape in self.params.items())


def rows(shape: tuple[int, ...]) -> tuple[int, int]:
    """(rows, elements per row) of a tensor, its size-1 axes aside: a weight's outputs and
    what each holds, a vector's length and 1."""
    kept = [d for d in shape if d != 1] or [1]
    return kept[0], math.prod(kept[1:])


@dataclass(frozen=True)
class AlignedPair:
    """Layers paired by structure: one to one (``source``, ``target``), or one layer
    and the consecutive layers of the other side its rows are split into (``sources`` /
    ``targets``, in order; the first is ``source`` / ``target``)."""

    source: Layer
    target: Layer
    evidence: str
    sources: tuple[Layer, ...] = ()
    targets: tuple[Layer, ...] = ()


@dataclass
class Alignment:
    pairs: list[AlignedPair]
    #: target tensor name -> source layer paths an ambiguous alignment could pair it with
    ambiguous: dict[str, tuple[str, ...]]
    notes: list[str]
    #: the layers no pair took: (source layers, target layers), in order
    left: tuple[list[Layer], list[Layer]] = ([], [])
    #: every block's contents, each side (:func:`contents`): which blocks can correspond
    blocks: tuple[dict[str, Counter], dict[str, Counter]] = ({}, {})


#: PyTorch parameters that are a Linear's under another name: MultiheadAttention keeps its
#: packed q/k/v input projection as ``in_proj_weight``/``in_proj_bias`` (the same rows as
#: a fused ``qkv`` Dense on the MindSpore side)
SOURCE_ALIASES = {"in_proj_weight": "weight", "in_proj_bias": "bias"}


def layer_params() -> frozenset[str]:
    """What layers call their tensors, on either side: every name the layer rules and the
    source aliases know, and ``weight``/``bias``. A tensor named otherwise is a loose one
    (a block's class token, layer scale, relative position table), a unit of its own."""
    return frozenset({n for rule in RULES for pair in rule.params.items() for n in pair}
                     | set(SOURCE_ALIASES) | {"weight", "bias"})


_LAYER_PARAMS = layer_params()


def unit_of(name: str) -> str:
    """The path of the unit a tensor aligns with: its layer (``features.3.conv``), or, for a
    loose tensor, itself (``network.0.0.layer_scale_1``)."""
    path, _, suffix = name.rpartition(".")
    return path if suffix in _LAYER_PARAMS or suffix in SOURCE_ALIASES else name


def _group(items: list[tuple[str, tuple[int, ...]]], first_index: dict[str, int],
           aliases: dict[str, str] | None = None) -> list[Layer]:
    layers: dict[str, Layer] = {}
    for name, shape in items:
        suffix = name.rpartition(".")[2]
        path = unit_of(name)
        suffix = (aliases or {}).get(suffix, suffix)
        layer = layers.setdefault(path, Layer(path, first_index[path]))
        layer.params[suffix] = shape
        layer.names[suffix] = name
    return sorted(layers.values(), key=lambda x: x.index)


def _rule_for(layer: Layer) -> LayerRule | None:
    have = set(layer.params)
    for rule in RULES:
        if rule.inner or not rule.params:
            continue
        if rule.fits_kind(layer.kind, have) and have <= set(rule.params):
            return rule
    return None


def _jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a | b else 0.0


def _similarity(a: Layer, b: Layer) -> tuple[float, bool]:
    """How alike two layers' names are: their own names (``norm1``), then whether the
    numbers of their innermost numbered blocks agree (``h.3.proj`` and ``layers.3.w``).
    Not the whole paths: the numbers further out each network counts its own way
    (``network.2.0`` against ``stages.1.blocks.0``), which made a tie-break of chance."""
    return _jaccard(_own(a), _own(b)), _index(a) is not None and _index(a) == _index(b)


def _index(layer: Layer) -> str | None:
    """The number of the innermost numbered block around a unit, or of the unit itself
    (``features.3``)."""
    numbers = [s for s in layer.path.split(".") if s.isdigit()]
    return numbers[-1] if numbers else None


def _own(layer: Layer) -> set[str]:
    """A unit's own name tokens: its last segment; for a loose tensor held by a module of
    its own (timm's ``layer_scale2.scale``), that module's name too."""
    segments = layer.path.split(".")
    own = set(_tokens(segments[-1]))
    if len(layer.params) == 1 and layer.path == next(iter(layer.names.values())) \
            and len(segments) > 1 and not segments[-2].isdigit():
        own |= _tokens(segments[-2])
    return own


def align(pending_source: list[tuple[str, tuple[int, ...]]],
          pending_target: list[tuple[str, tuple[int, ...]]],
          everything: tuple[list[tuple[str, tuple[int, ...]]], list[tuple[str, tuple[int, ...]]]],
          matched: list[tuple[str, str]],
          kinds: dict[str, Any], *, splits: bool = True) -> Alignment:
    """Align the leftover layers of both sides (see the module docstring).

    Args:
        pending_source / pending_target: (tensor name, shape) not yet paired, in order.
        everything: every (tensor name, shape) of each side, in order: (source, target).
        matched: (target name, source name) pairs the earlier stages made.
        kinds: target layer path -> its class names (``Target.layers()``).
        splits: also pair a layer with consecutive layers its rows are split into (a fused
            projection), as concatenated; off where a mapping table declares its own fused
            layouts (an interleaved or grouped one is no concatenation).

    Returns:
        The unambiguous layer pairs, the ambiguous targets with their candidates, notes,
        the layers left, and every block's contents.
    """
    s_first = _first_indices([n for n, _ in everything[0]])
    t_first = _first_indices([n for n, _ in everything[1]])
    pending_source = [(n, s) for n, s in pending_source if not known_drop(n)]
    sources = _group(pending_source, s_first, SOURCE_ALIASES)
    targets = _group(pending_target, t_first)
    for t in targets:
        t.kind = kinds.get(t.path)
        t.rule = _rule_for(t)
    anchors = _anchors(matched, s_first, t_first)
    result = Alignment([], {}, [])
    bounds = [(-1, -1), *anchors, (math.inf, math.inf)]
    for (s0, t0), (s1, t1) in zip(bounds, bounds[1:]):
        seg_s = [x for x in sources if s0 < x.index < s1]
        seg_t = [x for x in targets if t0 < x.index < t1]
        if not seg_s or not seg_t:
            continue
        if len(seg_s) * len(seg_t) > MAX_CELLS:
            result.notes.append(f"alignment skipped between {len(seg_s)} and {len(seg_t)} "
                                f"unpaired layers (more than {MAX_CELLS:,} pairs to weigh)")
            continue
        _align_segment(seg_s, seg_t, result, splits)
        _align_rest(seg_s, seg_t, result, splits)
    taken = {id(x) for p in result.pairs
             for x in (*(p.sources or (p.source,)), *(p.targets or (p.target,)))}
    result.left = ([x for x in sources if id(x) not in taken],
                   [x for x in targets if id(x) not in taken])
    result.blocks = (contents(_group([x for x in everything[0] if not known_drop(x[0])],
                                     s_first, SOURCE_ALIASES), False),
                     contents(_group(everything[1], t_first), True, kinds))
    return result


def contents(units: list[Layer], target: bool,
             kinds: dict[str, Any] | None = None) -> dict[str, Counter]:
    """Every block's contents: block path -> the signatures of the units inside it, counted
    (the root is ``""``). Two blocks holding the same contents can be the same block of the
    two networks, whatever order and nesting each gives its layers."""
    found: dict[str, Counter] = {}
    for unit in units:
        if target:
            unit.kind = (kinds or {}).get(unit.path)
            unit.rule = _rule_for(unit)
        sig = unit.signature(target)
        block = unit.path
        while block:
            block = block.rpartition(".")[0]
            found.setdefault(block, Counter())[sig] += 1
    return found


def _first_indices(order: list[str]) -> dict[str, int]:
    first: dict[str, int] = {}
    for name in order:
        first.setdefault(unit_of(name), len(first))
    return first


def _anchors(matched: list[tuple[str, str]], s_first: dict[str, int],
             t_first: dict[str, int]) -> list[tuple[int, int]]:
    """Layer pairs the earlier stages made, as positions: their longest chain increasing on
    both sides (one pair out of order must not discard every later anchor)."""
    import bisect

    pairs = sorted({(s_first[unit_of(s)], t_first[unit_of(t)])
                    for t, s in matched if s}, key=lambda p: (p[0], -p[1]))
    tails: list[int] = []  # smallest target end of an increasing chain of each length
    ends: list[int] = []   # index into pairs of that chain's last pair
    back = [-1] * len(pairs)
    for k, (_, t) in enumerate(pairs):
        n = bisect.bisect_left(tails, t)
        back[k] = ends[n - 1] if n else -1
        if n == len(tails):
            tails.append(t)
            ends.append(k)
        else:
            tails[n], ends[n] = t, k
    chain, k = [], ends[-1] if ends else -1
    while k >= 0:
        chain.append(pairs[k])
        k = back[k]
    return chain[::-1]


#: the most best-alignment partners of one layer among which names may still decide
MAX_RIVALS = 64

#: the most layers one layer may be split into, or fused from, by alignment (q, k, v and
#: a fourth for a gate)
MAX_PARTS = 4


@dataclass(frozen=True)
class _Move:
    """``ds`` source layers from ``i`` paired with ``dt`` target layers from ``j``: one to
    one, one split into several consecutive sibling layers (a fused projection: timm's
    ``qkv`` into MindCV's ``q``, ``k``, ``v``), or several fused into one."""

    i: int
    ds: int
    j: int
    dt: int
    #: layers covered, both sides (one to one: 2); a weight paired without its bias, 1
    gain: int = 0

    def __post_init__(self) -> None:
        if not self.gain:
            object.__setattr__(self, "gain", self.ds + self.dt)

    @property
    def i1(self) -> int:
        return self.i + self.ds

    @property
    def j1(self) -> int:
        return self.j + self.dt


def _without_bias(sig: frozenset) -> frozenset | None:
    """A source layer's signature as a bias-less layer's would read: its weight alone."""
    found = {s: (n, k) for s, n, k in sig}
    if set(found) != {"weight", "bias"} or found["bias"] != (found["weight"][0], 1) \
            or found["weight"][1] == 1:  # a norm's scale and shift are no weight and bias
        return None
    return frozenset({(LONE, *found["weight"])})


def _parent(layer: Layer) -> str:
    return layer.path.rpartition(".")[0]


def _joined(parts: list[Layer], target: bool) -> frozenset[tuple[str, int, int]] | None:
    """The signature of consecutive sibling layers concatenated along their first axis,
    or ``None`` where they cannot be one layer's parts (other parents, other tensors, or
    other sizes off the first axis)."""
    first = parts[0]
    if any(_parent(p) != _parent(first) or set(p.params) != set(first.params)
           or (target and p.rule is not first.rule) for p in parts):
        return None
    if not any(len(shape) >= 2 for shape in first.params.values()):
        return None  # a projection's rows split, never a norm's vector or a lone scale
    for suffix in first.params:
        if len({math.prod(p.params[suffix][1:]) for p in parts}) != 1:
            return None
    total: dict[tuple[str, int], int] = {}
    for p in parts:
        for suffix, n, per_row in p.signature(target):
            total[suffix, per_row] = total.get((suffix, per_row), 0) + n
    return frozenset((suffix, n, per_row) for (suffix, per_row), n in total.items())


def _row_sizes_agree(whole: Layer, parts: list[Layer]) -> bool:
    """Each tensor of ``whole`` has as many elements per row as the parts' (its rows are
    theirs, one after the other), for a 1×1 convolution's weight as for a Dense's."""
    rows = sorted(math.prod(s[1:]) for s in whole.params.values())
    part_rows = sorted(math.prod(s[1:]) for s in parts[0].params.values())
    return rows == part_rows


def _moves(src: list[Layer], tgt: list[Layer], splits: bool = True) -> list[_Move]:
    """Every pairing one step of an alignment may take: equal signatures one to one, and a
    layer whose tensors are the concatenation of 2..MAX_PARTS consecutive sibling layers of
    the other side (either way)."""
    sigs = [x.signature(False) for x in src]
    tsigs = [y.signature(True) for y in tgt]
    by_sig: dict[frozenset, list[int]] = {}
    for j, sig in enumerate(tsigs):
        by_sig.setdefault(sig, []).append(j)
    moves = [_Move(i, 1, j, 1) for i, sig in enumerate(sigs) for j in by_sig.get(sig, ())]
    # a layer with a bias against one without (torchvision's VGG, MindCV's): its weight
    # pairs, for less than a whole layer; the bias is then judged alone (a zero bias is
    # dropped, another one names the networks' difference)
    moves += [_Move(i, 1, j, 1, gain=1) for i, sig in enumerate(sigs)
              for j in by_sig.get(_without_bias(sig), ())]
    for whole_is_source, whole, many, whole_sigs in ((True, src, tgt, sigs),
                                                     (False, tgt, src, tsigs)) * splits:
        runs = sibling_runs(many, whole_is_source)
        for w, sig in enumerate(whole_sigs):
            for start, k in runs.get(sig, ()):
                if _row_sizes_agree(whole[w], many[start:start + k]):
                    moves.append(_Move(w, 1, start, k) if whole_is_source
                                 else _Move(start, k, w, 1))
    if splits:
        moves += _weight_splits(src, tgt, sigs)
    return moves


def sibling_runs(many: list[Layer], target: bool) -> dict[frozenset, list[tuple[int, int]]]:
    """Every run of 2..MAX_PARTS consecutive sibling layers that can be one layer's parts,
    by the signature they make joined (:func:`_joined`): ``(start, length)`` each."""
    runs: dict[frozenset, list[tuple[int, int]]] = {}
    for start in range(len(many)):
        for k in range(2, MAX_PARTS + 1):
            if start + k > len(many):
                break
            joined = _joined(many[start:start + k], target)
            if joined is None:
                break  # no longer run from here can be one layer's parts either
            runs.setdefault(joined, []).append((start, k))
    return runs


def _weight_splits(src: list[Layer], tgt: list[Layer], sigs: list[frozenset]) -> list[_Move]:
    """A fused weight with no bias split into sibling layers of which only some have
    one (timm's SwinV2 and BEiT hold ``qkv.weight`` and, apart, ``q_bias`` and ``v_bias``;
    MindCV's ``q`` and ``v`` have a bias, ``k`` none): the weights pair, for less than
    whole layers; each part's bias is then taken from the loose tensor named for it
    (:data:`~ms_port.match.rules.PART_BIAS`)."""
    found = []
    for start in range(len(tgt)):
        for k in range(2, MAX_PARTS + 1):
            parts = tgt[start:start + k]
            if len(parts) < k or any(_parent(p) != _parent(parts[0])
                                     or p.rule is not parts[0].rule
                                     or set(p.params) - {"weight", "bias"}
                                     or "weight" not in p.params for p in parts):
                break
            if len({frozenset(p.params) for p in parts}) == 1:
                continue  # all alike: a whole split, found with the others
            shapes = [p.params["weight"] for p in parts]
            if len(shapes[0]) < 2 or len({rows(sh)[1] for sh in shapes}) != 1:
                break
            joined = frozenset({(LONE, sum(rows(sh)[0] for sh in shapes), rows(shapes[0])[1])})
            found += [_Move(w, 1, start, k, gain=k) for w, sig in enumerate(sigs)
                      if sig == joined and set(src[w].params) == {"weight"}]
    return found


def _optimal(moves: list[_Move], a: int, b: int) -> list[_Move]:
    """The moves on some best alignment (most layers covered), by dynamic programming
    forward and backward over the a × b grid."""
    ending: dict[tuple[int, int], list[_Move]] = {}
    starting: dict[tuple[int, int], list[_Move]] = {}
    for m in moves:
        ending.setdefault((m.i1, m.j1), []).append(m)
        starting.setdefault((m.i, m.j), []).append(m)
    fwd = [[0] * (b + 1) for _ in range(a + 1)]
    for i in range(a + 1):
        row, prev = fwd[i], fwd[i - 1] if i else None
        for j in range(b + 1):
            v = prev[j] if prev is not None else 0
            if j and row[j - 1] > v:
                v = row[j - 1]
            for m in ending.get((i, j), ()):
                v = max(v, fwd[m.i][m.j] + m.gain)
            row[j] = v
    bwd = [[0] * (b + 2) for _ in range(a + 2)]
    for i in range(a, -1, -1):
        row, nxt = bwd[i], bwd[i + 1]
        for j in range(b, -1, -1):
            v = max(nxt[j], row[j + 1])
            for m in starting.get((i, j), ()):
                v = max(v, m.gain + bwd[m.i1][m.j1])
            row[j] = v
    best = fwd[a][b]
    if best == 0:
        return []
    return [m for m in moves if fwd[m.i][m.j] + m.gain + bwd[m.i1][m.j1] == best]


def _contested(on: list[_Move]) -> tuple[set[_Move], dict[tuple[bool, int], list[_Move]]]:
    """(the moves another best-alignment move crosses: wholly before it on one side and
    after it on the other; each layer's moves, as ``(target side, index)`` -> moves: two
    sharing a layer) — either way the two are alternatives, and neither is in every best
    alignment."""
    import bisect

    by_end = sorted(on, key=lambda m: m.i1)
    ends = [m.i1 for m in by_end]
    prefix, most = [], -1
    for m in by_end:  # the largest target start among moves ending this early
        most = max(most, m.j)
        prefix.append(most)
    by_start = sorted(on, key=lambda m: m.i)
    starts = [m.i for m in by_start]
    suffix, least = [0] * len(by_start), math.inf
    for k in range(len(by_start) - 1, -1, -1):  # the smallest target end from here on
        least = min(least, by_start[k].j1)
        suffix[k] = least
    crossed: set[_Move] = set()
    for m in on:
        before = bisect.bisect_right(ends, m.i)  # moves wholly before m on the source
        after = bisect.bisect_left(starts, m.i1)  # moves wholly after m on the source
        if (before and prefix[before - 1] >= m.j1) or (after < len(on)
                                                        and suffix[after] <= m.j):
            crossed.add(m)
    cover: dict[tuple[bool, int], list[_Move]] = {}
    for m in on:
        for i in range(m.i, m.i1):
            cover.setdefault((False, i), []).append(m)
        for j in range(m.j, m.j1):
            cover.setdefault((True, j), []).append(m)
    return crossed, cover


def _align_segment(src: list[Layer], tgt: list[Layer], out: Alignment, splits: bool,
                   among: str = "between the same anchors") -> None:
    a, b = len(src), len(tgt)
    on = _optimal(_moves(src, tgt, splits), a, b)
    if not on:
        return
    crossed, cover = _contested(on)
    chosen: list[tuple[_Move, str]] = []
    for m in on:
        if m in crossed:
            continue
        keys = (*((False, i) for i in range(m.i, m.i1)), *((True, j) for j in range(m.j, m.j1)))
        if all(len(cover[key]) == 1 for key in keys):
            chosen.append((m, "the only partner in every best alignment"))
            continue
        if any(len(cover[key]) > MAX_RIVALS for key in keys):
            continue  # names decide among a few, not among dozens of equals
        rivals = list({id(r): r for key in keys for r in cover[key] if r is not m}.values())
        if (m.ds == m.dt == 1 and all(r.ds == r.dt == 1 for r in rivals)
                and _names_decide(m, rivals, src, tgt)):
            chosen.append((m, "order and shapes allow several partners; the names decide"))
    last, kept = -1, set()
    for m, why in sorted(chosen, key=lambda c: (c[0].i, c[0].j)):
        if m.j <= last:
            continue  # a tie-break may not cross another pair
        last = m.j1 - 1
        kept.update(range(m.j, m.j1))
        out.pairs.append(_pair(m, src, tgt, (a, b), why, among))
    for j in range(b):
        if j in kept:
            continue
        candidates = tuple(dict.fromkeys(src[i].path for m in on if m.j <= j < m.j1
                                         for i in range(m.i, m.i1)))
        if candidates:
            for name in tgt[j].names.values():
                out.ambiguous[name] = candidates


def _align_rest(seg_s: list[Layer], seg_t: list[Layer], out: Alignment,
                splits: bool) -> None:
    """The layers a segment's alignment left, aligned again among themselves: a pair
    the first pass could not take because a pair it took crosses it (timm's SwinV2
    defines its fused ``qkv`` after the position-bias MLP, MindCV its ``q``, ``k``, ``v``
    before), each still only where every best alignment of the leftovers makes it."""
    taken = {id(x) for p in out.pairs
             for x in (*(p.sources or (p.source,)), *(p.targets or (p.target,)))}
    # a layer the first pass found several partners for stays a choice, never settled
    # by taking the others away
    choice = {path for candidates in out.ambiguous.values() for path in candidates}
    rest_s = [x for x in seg_s if id(x) not in taken and x.path not in choice]
    rest_t = [x for x in seg_t if id(x) not in taken
              and not any(n in out.ambiguous for n in x.names.values())]
    if not rest_s or not rest_t or (len(rest_s), len(rest_t)) == (len(seg_s), len(seg_t)):
        return
    _align_segment(rest_s, rest_t, out, splits,
                   among="among the layers the first alignment left between the same anchors")


def _names_decide(m: _Move, rivals: list[_Move], src: list[Layer], tgt: list[Layer]) -> bool:
    """A one-to-one move among one-to-one rivals: the strictly most similar names, both
    ways."""
    js = [m.j, *(r.j for r in rivals if r.i == m.i)]
    is_ = [m.i, *(r.i for r in rivals if r.j == m.j)]
    return (_strict_best(src[m.i], [tgt[k] for k in js], js) == m.j
            and _strict_best(tgt[m.j], [src[k] for k in is_], is_) == m.i)


def _pair(m: _Move, src: list[Layer], tgt: list[Layer], sizes: tuple[int, int],
          why: str, among: str = "between the same anchors") -> AlignedPair:
    sources, targets = tuple(src[m.i:m.i1]), tuple(tgt[m.j:m.j1])
    kind = (targets[0].kind or ("?",))[0]
    if m.ds == m.dt == 1:
        what = (f"aligned {kind} {sources[0].path} -> {targets[0].path}: "
                f"{len(targets[0].params)} tensors with matching shapes")
    elif m.ds == 1:
        what = (f"aligned {kind} {sources[0].path} -> {', '.join(x.path for x in targets)}: "
                "its rows are theirs, in order (a fused layer split)")
    else:
        what = (f"aligned {kind} {', '.join(x.path for x in sources)} -> {targets[0].path}: "
                "their rows, in order, are its (layers fused)")
    return AlignedPair(sources[0], targets[0], (
        f"{what}; unpaired layer {m.i + 1} of {sizes[0]} (PyTorch) and {m.j + 1} of "
        f"{sizes[1]} (MindSpore) {among}; {why}"), sources, targets)


def _strict_best(layer: Layer, others: list[Layer], keys: list[int]) -> int | None:
    scores = sorted(((_similarity(layer, o), k) for o, k in zip(others, keys)), reverse=True)
    if any(scores[0][0]) and (len(scores) == 1 or scores[0][0] > scores[1][0]):
        return scores[0][1]
    return None
