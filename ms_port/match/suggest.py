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
    """Whether exact names or a rule reproduce ``m`` once ``segments`` rename its source.
    A match with transforms keeps its line: they may come from the mapping's own
    ``transforms:`` section, which a saved map does not repeat."""
    if m.transforms:
        return False
    *s_path, s_leaf = m.source.split(".")
    *t_path, t_leaf = m.target.split(".")
    if _renamed(s_path, segments) != t_path:
        return False
    return s_leaf == t_leaf or s_leaf in _RULE_SUFFIXES.get(t_leaf, ())


def _one_segment_diff(source: str, target: str) -> tuple[str, str] | None:
    """``(old, new)`` when the two layer paths differ in exactly one segment."""
    s_path, t_path = source.split(".")[:-1], target.split(".")[:-1]
    if len(s_path) != len(t_path):
        return None
    diffs = {(a, b) for a, b in zip(s_path, t_path) if a != b}
    return diffs.pop() if len(diffs) == 1 else None


def minimal(matches: list[Any], source_names: Any = ()) -> tuple[dict[str, str], list[Any]]:
    """(segment renames, the matches they do not explain and that need a line).

    A candidate ``old: new`` comes from a pair whose layer paths differ in exactly one
    segment; candidates are tried most frequent first, and one is kept only if every match
    whose source path holds ``old`` is still reproduced with it, and no source tensor
    outside the plan holds it (renamed on loading, it could claim a target).
    """
    needed = [m for m in matches if (m.how in NEEDS_A_LINE or m.transforms)
              and m.init is None]
    votes: Counter = Counter(d for m in needed
                             if (d := _one_segment_diff(m.source, m.target)) is not None)
    matched_sources = {m.source for m in matches}
    outside = [n.split(".")[:-1] for n in source_names if n not in matched_sources]
    segments: dict[str, str] = {}
    for (old, new), _n in votes.most_common():
        if old in segments or new in segments.values():
            continue
        if any(old in path for path in outside):
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
    votes: Counter = Counter(d for u in unused if u.candidates and (
        d := _one_segment_diff(u.name, u.candidates[0].name)) is not None)
    return [(n, old, new) for (old, new), n in votes.most_common() if n >= least]


def group_line(count: int, old: str, new: str) -> str:
    return (f"{count} leftovers under *.{old}.*; MindSpore has *.{new}.* -> add "
            f"'{old}: {new}' under rename.segments in a mapping file")
