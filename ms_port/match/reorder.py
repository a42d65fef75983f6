"""Layers the two networks define in another order, paired inside corresponding blocks.

Alignment (:mod:`ms_port.match.align`) pairs layers in definition order, so it cannot
pair a layer one network defines first and the other last: MindCV's RegNet defines a
block's shortcut (``proj``, ``bn``) before its residual branch, timm after it
(``downsample``); MindCV's ShuffleNetV2 its main branch before the projection,
torchvision after. What order leaves unpaired is paired here, by structure, inside the
smallest pair of blocks that corresponds:

1. **The blocks.** A target block corresponds to the source block that holds (the common
   path prefix of) the source layers already paired with the target layers inside it:
   MindCV's ``stages.0.blocks.0`` to timm's ``s1.b1``.
2. **A layer alone of its kind.** A leftover target layer pairs with the leftover source
   layer of the same signature (tensors and sizes) when, within the two corresponding
   blocks, each is the only leftover of that signature; among several, where the names
   decide strictly and both ways (``proj`` and ``downsample`` both name a shortcut, see
   :data:`SAME_WORDS`). At the top of the network (no smaller block corresponds) the
   names must also share a word.
3. **Its neighbours.** A layer that comes right after (or before) a pair made here, on
   both sides, with the same signature and under the same parent as its paired
   neighbour, pairs too: a convolution's BatchNorm follows it.

Steps 2 and 3 repeat until nothing more pairs; every pair's evidence says which step
made it. Nothing here is a guess among equals: where two leftovers could take one
place, both stay leftovers, with their candidates named.
"""

from __future__ import annotations

from collections import Counter

from .align import MAX_RIVALS, AlignedPair, Alignment, Layer, _row_sizes_agree, sibling_runs
from .closest import _tokens, shared_words

#: path segments that name the same thing in the zoos (a residual block's shortcut)
SAME_WORDS: tuple[frozenset[str], ...] = (
    frozenset({"downsample", "down_sample", "down_sample_layer", "downsample_layer",
               "shortcut", "short_cut", "skip", "proj", "branch_proj", "projection"}),
)


def _words(path: str) -> set[str]:
    """A path's name tokens, with the canonical word of every synonym group a segment
    belongs to (``=0`` for a shortcut)."""
    words = set(_tokens(path.lower()))
    for segment in path.lower().split("."):
        bare = segment.rstrip("0123456789_")
        words.update(f"={k}" for k, group in enumerate(SAME_WORDS) if bare in group)
    return words


def _jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a | b else 0.0


def _below(path: str, block: str) -> str:
    """``path`` inside ``block``: the names the two networks give a block's own parts
    (``layer_scale_1``, ``layer_scale1.scale``), not its number in each (``network.2``,
    ``stages.1``), which says nothing."""
    return path[len(block) + 1:] if block else path


def _parent(path: str) -> str:
    return path.rpartition(".")[0]


def _inside(path: str, block: str) -> bool:
    return not block or path.startswith(block + ".")


def _common(paths: list[str]) -> str:
    parts = [p.split(".") for p in paths]
    common = []
    for segs in zip(*parts):
        if len(set(segs)) != 1:
            break
        common.append(segs[0])
    return ".".join(common)


class _Blocks:
    """Which source block corresponds to a target block.

    Where source blocks hold exactly what the target block holds (:func:`~ms_port.match.
    align.contents`: the same layers, whatever their order and nesting), the one of them
    holding most of the source layers already paired inside the target block; else the
    deepest source block holding more than half of those (one pair made wrong does not
    move it)."""

    def __init__(self, paired: list[tuple[str, str]],
                 contents: tuple[dict[str, Counter], dict[str, Counter]]) -> None:
        self.sources_under: dict[str, list[str]] = {}
        for t_path, s_path in paired:
            self.add(t_path, s_path)
        self.target_contents = contents[1]
        self.alike: dict[frozenset, list[str]] = {}
        for block, counted in contents[0].items():
            self.alike.setdefault(frozenset(counted.items()), []).append(block)
        self.target_alike: dict[frozenset, list[str]] = {}
        for block, counted in contents[1].items():
            self.target_alike.setdefault(frozenset(counted.items()), []).append(block)
        for index in (self.alike, self.target_alike):
            for key, found in index.items():
                index[key] = _outermost_only(found)

    def add(self, t_path: str, s_path: str, sign: int = 1) -> None:
        block = _parent(t_path)
        while True:
            under = self.sources_under.setdefault(block, [])
            if sign > 0:
                under.append(_parent(s_path))
            else:
                under.remove(_parent(s_path))
            if not block:
                break
            block = _parent(block)

    def twin(self, t_block: str) -> str | None:
        """The source block holding exactly what ``t_block`` holds and most of the source
        layers paired inside it (strictly); with none paired yet, the one source block
        holding it where no other target block holds the same. Else ``None``."""
        counted = self.target_contents.get(t_block)
        if not counted:
            return None
        key = frozenset(counted.items())
        alike = self.alike.get(key, [])
        under = self.sources_under.get(t_block)
        if not under:
            mine = self.target_alike.get(key, [])
            return alike[0] if len(alike) == 1 and mine == [t_block] else None
        if len(alike) > MAX_RIVALS:
            return None  # dozens of blocks alike: which one is no longer a block's say
        scored = sorted(((sum(_inside(s, b) or s == b for s in under), b) for b in alike),
                        reverse=True)
        if scored and scored[0][0] > 0 and (len(scored) == 1 or scored[0][0] > scored[1][0]):
            return scored[0][1]
        return None

    def source_block(self, t_block: str) -> str | None:
        """The source block ``t_block`` corresponds to (class docstring), or ``None``; the
        whole network is the whole network (MindCV's SwinV2 holds most layers under
        ``layers``, its head beside them)."""
        if not t_block:
            return ""
        twin = self.twin(t_block)
        if twin is not None:
            return twin
        under = self.sources_under.get(t_block)
        if not under:
            return None
        counts: dict[str, int] = {}
        for path in under:
            while True:
                counts[path] = counts.get(path, 0) + 1
                if not path:
                    break
                path = _parent(path)
        held = [b for b, n in counts.items() if 2 * n > len(under)]
        return max(held, key=lambda b: (b.count(".") + bool(b), len(b)))

    def scopes(self, t_path: str) -> list[tuple[str, str]]:
        """(target block, source block) pairs around ``t_path``, innermost first."""
        found, block = [], _parent(t_path)
        while True:
            s_block = self.source_block(block)
            if s_block is not None:
                found.append((block, s_block))
            if not block:
                return found
            block = _parent(block)


def _outermost_only(blocks: list[str]) -> list[str]:
    """Of blocks holding the same, the deepest of each nest: a block and the one around
    it holding nothing else are one block."""
    around: set[str] = set()
    for b in blocks:
        around.update(_blocks_around(b))
    return [b for b in blocks if b not in around]


def _consistent(alignment: Alignment, blocks: _Blocks) -> None:
    """Undo a one-to-one pair that order made across blocks: where the nearest block
    around the target layer that has a twin (:meth:`_Blocks.twin`) has it elsewhere than
    around the source layer (a permuted block's layer scale paired, by order, with the
    next block's). Its two layers go back to the leftovers, for the steps below."""
    sources, targets = alignment.left
    kept, undone = [], []
    for pair in alignment.pairs:
        twin, block = None, _parent(pair.target.path)
        while block and twin is None:
            twin = blocks.twin(block)
            block = _parent(block)
        if not (pair.sources[1:] or pair.targets[1:]) and twin is not None \
                and not _inside(pair.source.path, twin):
            undone.append(pair)
        else:
            kept.append(pair)
    for pair in undone:
        blocks.add(pair.target.path, pair.source.path, -1)
        sources.append(pair.source)
        targets.append(pair.target)
    alignment.pairs[:] = kept


def reorder(alignment: Alignment, paired: list[tuple[str, str]], *,
            splits: bool = True) -> None:
    """Pair ``alignment``'s leftover layers inside corresponding blocks (module docstring),
    adding to its pairs and removing what pairs from its ambiguous targets.

    Args:
        alignment: the result of :func:`~ms_port.match.align.align`, with its leftovers.
        paired: (target layer path, source layer path) of every pair made before.
        splits: also pair a layer with a run of layers its rows are split into (see
            :func:`~ms_port.match.align.align`).
    """
    if not alignment.pairs and not (alignment.left[0] and alignment.left[1]):
        return
    blocks = _Blocks([*paired, *((x.path, p.source.path) for p in alignment.pairs
                                 for x in (p.targets or (p.target,)))], alignment.blocks)
    _consistent(alignment, blocks)
    sources, targets = alignment.left
    free = _Free(sources, targets)

    def add(pair: AlignedPair) -> None:
        alignment.pairs.append(pair)
        for x in pair.targets:
            blocks.add(x.path, pair.source.path)
            for name in x.names.values():
                alignment.ambiguous.pop(name, None)

    while True:
        made = _alone(free, blocks)
        progress = bool(made)
        while made:
            pair = made.pop()
            add(pair)
            made += _neighbours(pair.source, pair.target, free)
        for pair in _split_alone(free) if splits else ():
            add(pair)
            progress = True
        if not progress:
            break
    alignment.left = (free.sources(), free.targets())


class _Free:
    """The layers still unpaired on each side: in definition order, and by signature and
    block (every block around a layer), so that "the free layers of this kind inside this
    block" is one lookup, however many layers the networks have."""

    def __init__(self, sources: list[Layer], targets: list[Layer]) -> None:
        self.s_order = sorted(sources, key=lambda x: x.index)
        self.t_order = sorted(targets, key=lambda x: x.index)
        self.s_pos = {id(x): k for k, x in enumerate(self.s_order)}
        self.t_pos = {id(x): k for k, x in enumerate(self.t_order)}
        self.by_sig: dict[frozenset, tuple[dict[int, Layer], dict[int, Layer]]] = {}
        self.within: dict[tuple[bool, frozenset, str], dict[int, Layer]] = {}
        for target, layers in ((False, sources), (True, targets)):
            for x in layers:
                sig = x.signature(target)
                self.by_sig.setdefault(sig, ({}, {}))[int(target)][id(x)] = x
                for block in _blocks_around(x.path):
                    self.within.setdefault((target, sig, block), {})[id(x)] = x

    def take(self, x: Layer, *, target: bool) -> None:
        sig = x.signature(target)
        self.by_sig[sig][int(target)].pop(id(x), None)
        for block in _blocks_around(x.path):
            self.within.get((target, sig, block), {}).pop(id(x), None)

    def has(self, x: Layer, *, target: bool) -> bool:
        return id(x) in self.by_sig[x.signature(target)][int(target)]

    def inside(self, sig: frozenset, block: str, *, target: bool) -> dict[int, Layer]:
        """The free layers of signature ``sig`` inside ``block``."""
        return self.within.get((target, sig, block), {})

    def sources(self) -> list[Layer]:
        return [x for x in self.s_order if self.has(x, target=False)]

    def targets(self) -> list[Layer]:
        return [x for x in self.t_order if self.has(x, target=True)]


def _blocks_around(path: str) -> list[str]:
    found, block = [], path
    while block:
        block = _parent(block)
        found.append(block)
    return found


def _alone(free: _Free, blocks: _Blocks) -> list[AlignedPair]:
    """Step 2: each free target layer alone of its signature in its corresponding blocks."""
    made = []
    for sig, (sources, targets) in free.by_sig.items():
        for t in sorted(targets.values(), key=lambda x: x.index):
            if id(t) not in targets or not sources:
                continue
            for t_block, s_block in blocks.scopes(t.path):
                options = free.inside(sig, s_block, target=False)
                if not options:
                    continue  # nothing of its kind in this block: look further out
                rivals = free.inside(sig, t_block, target=True)
                if len(options) > MAX_RIVALS or len(rivals) > MAX_RIVALS:
                    break  # names decide among a few, not among dozens of equals
                pick = _pick(t, list(rivals.values()), list(options.values()),
                             (t_block, s_block))
                if pick is not None:
                    s, how = pick
                    free.take(s, target=False)
                    free.take(t, target=True)
                    where = (f"in {t_block} (PyTorch: {s_block or 'the network'})" if t_block
                             else "in the whole network")
                    made.append(AlignedPair(s, t, (
                        f"reordered {(t.kind or ('tensor',))[0]} {s.path} -> {t.path}: the two "
                        f"networks define it in another order; {how}, {where}"), (s,), (t,)))
                break  # the innermost block with candidates decides, or nothing does
    return made


def _shared_words(a: str, b: str) -> list[str]:
    """The words two layers' own names share, or else the words one's own name shares
    with the block holding the other (timm's ``head.fc`` is MindCV's ``head``)."""
    found = shared_words(a, b)
    if found or ("." in a) == ("." in b):  # both top-level or both nested: own names only
        return found
    return sorted({*shared_words(a, b.rpartition(".")[0]), *shared_words(a.rpartition(".")[0], b)})


def _pick(t: Layer, rivals_t: list[Layer], options: list[Layer],
          blocks: tuple[str, str]) -> tuple[Layer, str] | None:
    """The one source layer ``t`` pairs with among ``options`` (inside the corresponding
    ``blocks``: target, source), or ``None``."""
    t_block, s_block = blocks
    if len(options) == 1 and len(rivals_t) == 1:
        s = options[0]
        if t_block:
            return s, "the only unpaired layer of its tensors and sizes on either side"
        shared = _shared_words(t.path, s.path)
        if not shared:
            return None  # the whole network's only leftovers of a kind: the names must agree
        shape = "×".join(map(str, next(iter(t.params.values())))) if len(t.params) == 1 \
            else "its sizes"
        return s, (f"the only unpaired tensor of its shape on either side ({shape}), the names "
                   f"sharing {', '.join(repr(w) for w in shared)}")
    if not t_block:
        return None  # in the whole network, only a kind's one leftover on each side pairs
    mine = _words(_below(t.path, t_block))
    chosen = _strictly(mine, [_words(_below(s.path, s_block)) for s in options])
    if chosen is None:
        return None
    s = options[chosen]
    theirs = _words(_below(s.path, s_block))
    if not {w for w in mine & theirs if not w.isdigit()}:
        return None  # numbers alone: each network counts its blocks its own way
    if _strictly(theirs, [_words(_below(x.path, t_block)) for x in rivals_t]) is None \
            or rivals_t[_strictly(theirs, [_words(_below(x.path, t_block))
                                           for x in rivals_t])] is not t:
        return None
    return s, "several of its tensors and sizes; the names decide, both ways"


def _strictly(mine: set[str], others: list[set[str]]) -> int | None:
    """The one of ``others`` whose names ``mine`` shares strictly most with, by a word the
    runner-up does not share (``proj`` and ``downsample`` share a shortcut's word; ``bn``,
    shared with every candidate, tells none apart), or ``None``."""
    scored = sorted(((_jaccard(mine, o), k) for k, o in enumerate(others)), reverse=True)
    if not scored or scored[0][0] <= 0:
        return None
    if len(scored) > 1:
        best, second = others[scored[0][1]], others[scored[1][1]]
        if scored[0][0] == scored[1][0] or not (mine & best) - (mine & second):
            return None
    return scored[0][1]


def _neighbours(s: Layer, t: Layer, free: _Free) -> list[AlignedPair]:
    """Step 3: the free layers right before and after a new pair, on both sides."""
    made = []
    si, ti = free.s_pos[id(s)], free.t_pos[id(t)]
    for step in (1, -1):
        a, b = si + step, ti + step
        if not (0 <= a < len(free.s_order) and 0 <= b < len(free.t_order)):
            continue
        ns, nt = free.s_order[a], free.t_order[b]
        if (free.has(ns, target=False) and free.has(nt, target=True)
                and ns.signature(False) == nt.signature(True)
                and _parent(ns.path) == _parent(s.path) and _parent(nt.path) == _parent(t.path)):
            free.take(ns, target=False)
            free.take(nt, target=True)
            made.append(AlignedPair(ns, nt, (
                f"reordered {(nt.kind or ('tensor',))[0]} {ns.path} -> {nt.path}: it "
                f"{'follows' if step == 1 else 'precedes'} {s.path} -> {t.path} on both "
                "sides, with the same tensors and sizes"), (ns,), (nt,)))
    return made


def _split_alone(free: _Free) -> list[AlignedPair]:
    """A free layer whose rows are the concatenation of consecutive free sibling layers of
    the other side (a fused projection the two networks define in another order), where
    that run is the only one of its signature and the layer the only one of its own."""
    made = []
    for whole_is_source in (True, False):
        wholes = free.sources() if whole_is_source else free.targets()
        many = free.targets() if whole_is_source else free.sources()
        runs = {sig: [many[start:start + k] for start, k in found]
                for sig, found in sibling_runs(many, whole_is_source).items()}
        by_sig: dict[frozenset, list[Layer]] = {}
        for w in wholes:
            by_sig.setdefault(w.signature(not whole_is_source), []).append(w)
        for sig, ws in by_sig.items():
            found = [r for r in runs.get(sig, ()) if _row_sizes_agree(ws[0], r)]
            if len(ws) != 1 or len(found) != 1:
                continue
            (w,), parts = ws, found[0]
            if not free.has(w, target=not whole_is_source) or not all(
                    free.has(p, target=whole_is_source) for p in parts):
                continue  # taken by a pair made in this round
            free.take(w, target=not whole_is_source)
            for p in parts:
                free.take(p, target=whole_is_source)
            sources, targets = ((w,), tuple(parts)) if whole_is_source else (tuple(parts), (w,))
            what = ("its rows are theirs, in order (a fused layer split)" if whole_is_source
                    else "their rows, in order, are its (layers fused)")
            made.append(AlignedPair(sources[0], targets[0], (
                f"reordered {(targets[0].kind or ('tensor',))[0]} "
                f"{', '.join(s.path for s in sources)} -> "
                f"{', '.join(x.path for x in targets)}: {what}; the two networks define it "
                "in another order, and it is the only unpaired layer of its tensors and "
                "sizes, as they are the only such run"), sources, targets))
    return made
