"""'Did you mean' suggestions that stay fast with 100,000 names.

Comparing every missing name with every unused one is quadratic: with 1 MB of names it
took minutes. An index built once narrows each query to a few hundred candidates — names
of the same shape and names sharing the query's rarest tokens — and only those are
scored with :class:`difflib.SequenceMatcher`.
"""

from __future__ import annotations

import difflib
import re
from collections import defaultdict
from collections.abc import Iterable

#: candidates gathered per query, at most (per source: same shape, shared tokens); the
#: best :data:`SCORED` of them by shared tokens are scored with SequenceMatcher
CAP = 200
SCORED = 48
_TOKENS = re.compile(r"[A-Za-z]+|\d+")


def _tokens(name: str) -> set[str]:
    return set(_TOKENS.findall(name[:1024]))


def own_tokens(name: str) -> set[str]:
    """The name tokens of a tensor's own name, not its path (``blocks``, ``attn``): its
    last segment, or for an item of a parameter list (``pos_embed.0``) the list's name
    and the index."""
    segments = name.lower().split(".")
    own = segments[-1] if not segments[-1].isdigit() or len(segments) < 2 else \
        f"{segments[-2]}_{segments[-1]}"
    return _tokens(own)


def shared_words(a: str, b: str) -> list[str]:
    """The words two tensors' own names share (one a prefix of the other, three letters
    at least: ``class_token`` / ``cls_token`` share ``token``), or ``[]`` where they
    share none or their indices differ (``pos_embed.0`` / ``pos_embed_1``)."""
    mine, theirs = own_tokens(a), own_tokens(b)
    words = {w for w in mine if not w.isdigit()}
    shared = sorted({x for x in words for y in theirs
                     if len(min(x, y, key=len)) >= 3 and (x.startswith(y) or y.startswith(x))})
    numbers = ({w for w in mine if w.isdigit()}, {w for w in theirs if w.isdigit()})
    return [] if all(numbers) and numbers[0] != numbers[1] else shared


class NameIndex:
    """Names with shapes, indexed by shape and by name token."""

    def __init__(self, pool: Iterable[tuple[str, tuple[int, ...]]]):
        self._shape_of: dict[str, tuple[int, ...]] = {}
        self._by_shape: dict[tuple[int, ...], list[str]] = defaultdict(list)
        self._by_token: dict[str, list[str]] = defaultdict(list)
        for name, shape in pool:
            self._shape_of[name] = shape
            self._by_shape[shape].append(name)
            for token in _tokens(name):
                self._by_token[token].append(name)

    def closest(self, name: str, shape: tuple[int, ...] | None = None,
                n: int = 3) -> list[tuple[str, tuple[int, ...]]]:
        """The ``n`` nearest names: same shape first, then name similarity."""
        if not self._shape_of:
            return []
        picked: dict[str, None] = {}
        if shape is not None:
            picked.update(dict.fromkeys(self._by_shape.get(shape, ())[:CAP]))
        # rarest tokens first: "layer3" says more than "weight"
        for token in sorted(_tokens(name), key=lambda t: len(self._by_token.get(t, ()))):
            if len(picked) >= 2 * CAP:
                break
            picked.update(dict.fromkeys(self._by_token.get(token, ())[:CAP]))
        mine = _tokens(name)
        ranked = sorted(picked, key=lambda o: -len(mine & _tokens(o)))[:SCORED]
        matcher = difflib.SequenceMatcher(b=name[:1024], autojunk=False)
        scored = []
        for other in ranked:
            matcher.set_seq1(other[:1024])
            if matcher.real_quick_ratio() < 0.3 or matcher.quick_ratio() < 0.3:
                continue
            bonus = 0.5 if shape is not None and self._shape_of[other] == shape else 0.0
            score = matcher.ratio() + bonus
            if score > 0.6:
                scored.append((-score, other))
        scored.sort()
        return [(o, self._shape_of[o]) for _, o in scored[:n]]
