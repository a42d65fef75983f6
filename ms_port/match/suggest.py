"""The smallest mapping that explains a plan: segment renames first, then single lines.

Matches made by exact names and rules need no line; what a mapping entry, the alignment
or the shape fallback found does. Where many such pairs differ from their source in one
and the same dotted segment (``layer1.0.downsample.0`` -> ``layer1.0.down_sample_layer.0``),
one ``rename.segments`` entry explains them all — if it is consistent with every match
whose source has that segment. What no rename explains stays a ``tensors:`` line.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from .rules import RULES

#: MindSpore suffix -> PyTorch suffixes some rule maps it from ("gamma" -> {"weight"})
_RULE_SUFFIXES: dict[str, set[str]] = {}
for _rule in RULES:
    for _ms, _pt in _rule.params.items():
        _RULE_SUFFIXES.setdefault(_ms, set()).add(_pt)

#: matches a mapping file must state (exact names and rules find the others by themselves)
NEEDS_A_LINE = ("mapping", "aligned", "fallback")


def _renamed(path: list[str], segments: dict[str, str]) -> list[str]:
    return [segments.get(p, p) for p in path]


def _explained(m: Any, segments: dict[str, str]) -> bool:
    """Whether exact names or a rule reproduce ``m`` once ``segments`` rename its source."""
    if m.transforms and not _rule_transforms(m):
        return False
    *s_path, s_leaf = m.source.split(".")
    *t_path, t_leaf = m.target.split(".")
    if _renamed(s_path, segments) != t_path:
        return False
    return s_leaf == t_leaf or s_leaf in _RULE_SUFFIXES.get(t_leaf, ())


def _rule_transforms(m: Any) -> bool:
    leaf = m.target.rpartition(".")[2]
    return any(tuple(r.transforms.get(leaf, ())) == tuple(m.transforms) for r in RULES)


def minimal(matches: list[Any]) -> tuple[dict[str, str], list[Any]]:
    """(segment renames, the matches they do not explain and that need a line).

    A candidate ``old: new`` comes from a pair whose layer paths differ in exactly one
    segment; candidates are tried most frequent first, and one is kept only if every match
    whose source path holds ``old`` is still reproduced with it (nothing it renames would
    then be lost).
    """
    needed = [m for m in matches if m.how in NEEDS_A_LINE and m.init is None]
    votes: Counter = Counter()
    for m in needed:
        s_path, t_path = m.source.split(".")[:-1], m.target.split(".")[:-1]
        if len(s_path) == len(t_path):
            diffs = [(a, b) for a, b in zip(s_path, t_path) if a != b]
            if len(set(diffs)) == 1:
                votes[diffs[0]] += 1
    segments: dict[str, str] = {}
    for (old, new), _n in votes.most_common():
        if old in segments or new in segments.values():
            continue
        trial = {**segments, old: new}
        touched = [m for m in matches if m.init is None and old in m.source.split(".")[:-1]]
        if all(_explained(m, trial) for m in touched):
            segments = trial
    return segments, [m for m in needed if not _explained(m, segments)]


def leftover_groups(unused: list[Any], *, least: int = 2) -> list[tuple[int, str, str]]:
    """Leftovers one segment rename would explain: ``(count, old, new)``, most first.

    Each unused source tensor votes with its closest target candidate when their layer
    paths differ in exactly one segment (``layer1.0.downsample.0`` vs
    ``layer1.0.down_sample_layer.0``); a rename with at least ``least`` votes is a group.
    """
    votes: Counter = Counter()
    for u in unused:
        if not u.candidates:
            continue
        s_path, t_path = u.name.split(".")[:-1], u.candidates[0].name.split(".")[:-1]
        if len(s_path) == len(t_path):
            diffs = {(a, b) for a, b in zip(s_path, t_path) if a != b}
            if len(diffs) == 1:
                votes[diffs.pop()] += 1
    return [(n, old, new) for (old, new), n in votes.most_common() if n >= least]


def group_line(count: int, old: str, new: str) -> str:
    return (f"{count} leftovers under *.{old}.*; MindSpore has *.{new}.* -> add "
            f"'{old}: {new}' under rename.segments in a mapping file")
