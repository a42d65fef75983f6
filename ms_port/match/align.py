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
from dataclasses import dataclass, field
from typing import Any

from .closest import _tokens
from .rules import RULES, LayerRule, known_drop

#: the largest segment aligned (layers × layers): beyond it, leftovers stay leftovers
MAX_CELLS = 250_000
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

    def signature(self, target: bool) -> frozenset[tuple[str, int]]:
        """(PyTorch suffix, element count) per tensor: equal on both sides when the layers
        can pair (counts survive the rules' unsqueeze/transpose/reshape). A lone tensor
        with no rule (a block's own scale: torchvision's ``layer_scale``, MindCV's
        ``gamma_``) pairs by its size alone: its name is the module's attribute name."""
        if len(self.params) == 1 and not (target and self.rule):
            return frozenset({(LONE, math.prod(next(iter(self.params.values()))))})
        if not target:
            return frozenset((s, math.prod(shape)) for s, shape in self.params.items())
        params = self.rule.params if self.rule else {}
        return frozenset((params.get(s, s), math.prod(shape)) for s, shape in self.params.items())


@dataclass(frozen=True)
class AlignedPair:
    source: Layer
    target: Layer
    evidence: str


@dataclass
class Alignment:
    pairs: list[AlignedPair]
    #: target tensor name -> source layer paths an ambiguous alignment could pair it with
    ambiguous: dict[str, tuple[str, ...]]
    notes: list[str]


#: PyTorch parameters that are a Linear's under another name: MultiheadAttention keeps its
#: packed q/k/v input projection as ``in_proj_weight``/``in_proj_bias`` (the same rows as
#: a fused ``qkv`` Dense on the MindSpore side)
SOURCE_ALIASES = {"in_proj_weight": "weight", "in_proj_bias": "bias"}


def _group(items: list[tuple[str, tuple[int, ...]]], first_index: dict[str, int],
           aliases: dict[str, str] | None = None) -> list[Layer]:
    layers: dict[str, Layer] = {}
    for name, shape in items:
        path, _, suffix = name.rpartition(".")
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
        fits = (rule.cells.intersection(layer.kind) if layer.kind
                else rule.signature and rule.signature <= have)
        if fits and have <= set(rule.params):
            return rule
    return None


def _similarity(a: Layer, b: Layer) -> float:
    ta, tb = _tokens(a.path), _tokens(b.path)
    return len(ta & tb) / len(ta | tb) if ta | tb else 0.0


def align(pending_source: list[tuple[str, tuple[int, ...]]],
          pending_target: list[tuple[str, tuple[int, ...]]],
          source_order: list[str], target_order: list[str],
          matched: list[tuple[str, str]],
          kinds: dict[str, Any]) -> Alignment:
    """Align the leftover layers of both sides (see the module docstring).

    Args:
        pending_source / pending_target: (tensor name, shape) not yet paired, in order.
        source_order / target_order: every tensor name of each side, in order.
        matched: (target name, source name) pairs the earlier stages made.
        kinds: target layer path -> its class names (``Target.layers()``).

    Returns:
        The unambiguous layer pairs, the ambiguous targets with their candidates, notes.
    """
    s_first = _first_indices(source_order)
    t_first = _first_indices(target_order)
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
        _align_segment(seg_s, seg_t, result)
    return result


def _first_indices(order: list[str]) -> dict[str, int]:
    first: dict[str, int] = {}
    for name in order:
        first.setdefault(name.rpartition(".")[0], len(first))
    return first


def _anchors(matched: list[tuple[str, str]], s_first: dict[str, int],
             t_first: dict[str, int]) -> list[tuple[int, int]]:
    """Layer pairs the earlier stages made, as positions: their longest chain increasing on
    both sides (one pair out of order must not discard every later anchor)."""
    import bisect

    pairs = sorted({(s_first[s.rpartition(".")[0]], t_first[t.rpartition(".")[0]])
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


def _align_segment(src: list[Layer], tgt: list[Layer], out: Alignment) -> None:
    a, b = len(src), len(tgt)
    sigs = [x.signature(False) for x in src]
    tsigs = [y.signature(True) for y in tgt]
    ok = [[sigs[i] == tsigs[j] for j in range(b)] for i in range(a)]
    fwd = [[0] * (b + 1) for _ in range(a + 1)]
    for i in range(1, a + 1):
        row, prev = fwd[i], fwd[i - 1]
        for j in range(1, b + 1):
            row[j] = max(prev[j], row[j - 1], prev[j - 1] + ok[i - 1][j - 1])
    bwd = [[0] * (b + 2) for _ in range(a + 2)]
    for i in range(a, 0, -1):
        row, nxt = bwd[i], bwd[i + 1]
        for j in range(b, 0, -1):
            row[j] = max(nxt[j], row[j + 1], nxt[j + 1] + ok[i - 1][j - 1])
    best = fwd[a][b]
    if best == 0:
        return
    # (i, j) lies on some best alignment
    on = [(i, j) for i in range(a) for j in range(b)
          if ok[i][j] and fwd[i][j] + 1 + bwd[i + 2][j + 2] == best]
    by_s: dict[int, list[int]] = {}
    by_t: dict[int, list[int]] = {}
    for i, j in on:
        by_s.setdefault(i, []).append(j)
        by_t.setdefault(j, []).append(i)
    crossed = _crossed(on)
    chosen: list[tuple[int, int, str]] = []
    for i in sorted(by_s):
        js = [j for j in by_s[i] if (i, j) not in crossed]  # a crossed pair has a rival
        if not js:
            continue
        if len(by_s[i]) == 1 and len(by_t[js[0]]) == 1:
            chosen.append((i, js[0], "the only partner in every best alignment"))
            continue
        j = _strict_best(src[i], [tgt[k] for k in js], js)
        if j is not None and _strict_best(tgt[j], [src[k] for k in by_t[j]], by_t[j]) == i:
            chosen.append((i, j, "order and shapes allow several partners; the names decide"))
    last, kept = -1, set()
    for i, j, why in sorted(chosen):
        if j <= last:
            continue  # a tie-break may not cross another pair
        last = j
        kept.add(j)
        s, t = src[i], tgt[j]
        kind = (t.kind or ("?",))[0]
        out.pairs.append(AlignedPair(s, t, (
            f"aligned {kind} {s.path} -> {t.path}: {len(t.params)} tensors with matching "
            f"shapes; unpaired layer {i + 1} of {a} (PyTorch) and {j + 1} of {b} (MindSpore) "
            f"between the same anchors; {why}")))
    for j, is_ in by_t.items():
        if j not in kept:
            for name in tgt[j].names.values():
                out.ambiguous[name] = tuple(src[i].path for i in is_)


def _crossed(on: list[tuple[int, int]]) -> set[tuple[int, int]]:
    """Pairs some other best-alignment pair crosses (one earlier on one side and later on
    the other): then the two are alternatives, and neither is in every best alignment."""
    from itertools import groupby

    groups = [list(g) for _, g in groupby(sorted(on), key=lambda p: p[0])]
    crossed: set[tuple[int, int]] = set()
    most = -1  # the largest j among pairs with a smaller i
    for group in groups:
        crossed.update(p for p in group if most > p[1])
        most = max(most, *(p[1] for p in group))
    least = float("inf")  # the smallest j among pairs with a larger i
    for group in reversed(groups):
        crossed.update(p for p in group if least < p[1])
        least = min(least, *(p[1] for p in group))
    return crossed


def _strict_best(layer: Layer, others: list[Layer], keys: list[int]) -> int | None:
    scores = sorted(((_similarity(layer, o), k) for o, k in zip(others, keys)), reverse=True)
    if len(scores) == 1 or scores[0][0] > scores[1][0]:
        return scores[0][1]
    return None
