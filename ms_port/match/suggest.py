"""The smallest mapping that explains a plan: segment renames, renumbering regexes, then
single lines.

Matches made by exact names and rules need no line; what a mapping entry, the alignment
or the shape fallback found does. Where many such pairs differ from their source in one
and the same dotted segment (``layer1.0.downsample.0`` -> ``layer1.0.down_sample_layer.0``),
one ``rename.segments`` entry explains them all — if it is consistent with every match
whose source has that segment. Where blocks are renumbered and restructured
(torchvision's ``features.1.conv.0.0`` -> MindCV's ``features.3.layers.0``), one
``rename.regex`` with index arithmetic (``{1+2}``) explains every block alike — if every
source name it matches lands on its own target. What nothing explains stays a
``tensors:`` line.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from typing import Any

from .patterns import _ARITH, MAX_DIGITS
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
    return _leaf_ok(s_leaf, t_leaf)


def _one_segment_diff(source: str, target: str) -> tuple[str, str] | None:
    """``(old, new)`` when the two layer paths differ in exactly one segment."""
    s_path, t_path = source.split(".")[:-1], target.split(".")[:-1]
    if len(s_path) != len(t_path):
        return None
    diffs = {(a, b) for a, b in zip(s_path, t_path) if a != b}
    return diffs.pop() if len(diffs) == 1 else None


def minimal(matches: list[Any], source_names: Any = ()
            ) -> tuple[dict[str, str], list[dict[str, str]], list[Any]]:
    """(segment renames, regex renames, the matches they do not explain: a line each).

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
    rest = [m for m in needed if not _explained(m, segments)]
    regexes, rest = _renumbering(rest, matches, source_names)
    return segments, regexes, rest


#: a regex is worth writing when it explains at least this many tensors
_LEAST = 3
#: at most this many numbered segments are tried as fixed values (2**n partitions)
_MAX_SLOTS = 6
#: beyond this many lines to explain, no regex is sought
_MAX_LINES = 20_000
#: a saved map holds at most this many regexes (each is tried on every name on loading)
_MAX_REGEXES = 200


def _number(part: str) -> bool:
    """An ASCII number (what a regex's ``[0-9]+`` matches; ``"²".isdigit()`` is true) short
    enough to be an index; a longer run of digits is a word."""
    return part.isascii() and part.isdigit() and len(part) <= MAX_DIGITS


def _skeleton(path: list[str]) -> tuple[str, ...]:
    return tuple("#" if _number(p) else p for p in path)


def _leaf_ok(s_leaf: str, t_leaf: str) -> bool:
    return s_leaf == t_leaf or s_leaf in _RULE_SUFFIXES.get(t_leaf, ())


def _renumbering(lines: list[Any], matches: list[Any], source_names: Any
                 ) -> tuple[list[dict[str, str]], list[Any]]:
    """Regex renames with index arithmetic for lines whose layer paths differ only in
    numbers and fixed words. Lines are grouped by both paths' words; within a group each
    target number must be one source number plus a constant; a group that needs it is
    split by the values of some source numbers (fewest first), which the regex then
    spells out. A regex is kept only if every source name it matches — in the plan or
    outside it — lands on that tensor's own target (by name, or by a rule's suffix)."""
    if len(lines) > _MAX_LINES:
        return [], lines
    target_of = {m.source: m.target for m in matches if m.source and m.init is None}
    names: dict[tuple[str, ...], list[str]] = {}  # only a name of a regex's skeleton matches
    for name in dict.fromkeys([*source_names, *target_of]):
        names.setdefault(_skeleton(name.split(".")[:-1]), []).append(name)
    groups: dict[tuple, list[Any]] = {}
    for m in lines:
        if m.transforms or not m.source:
            continue
        s_path, t_path = m.source.split(".")[:-1], m.target.split(".")[:-1]
        if s_path and t_path and _leaf_ok(m.source.rpartition(".")[2], m.target.rpartition(".")[2]):
            groups.setdefault((_skeleton(s_path), _skeleton(t_path)), []).append(m)
    regexes: list[dict[str, str]] = []
    explained: set[str] = set()
    for (s_skel, t_skel), members in groups.items():
        s_slots = [i for i, p in enumerate(s_skel) if p == "#"][:_MAX_SLOTS]
        pool = list(members)
        size = 0
        while pool and size <= len(s_slots):
            # of the ways to fix `size` source numbers, the one explaining the most lines
            # with the fewest regexes
            best: tuple[int, int, list[dict[str, str]], set[str]] = (0, 0, [], set())
            for fixed in itertools.combinations(s_slots, size):
                rules, done = _partition(pool, s_skel, t_skel, fixed, names, target_of,
                                         _MAX_REGEXES - len(regexes))
                if (len(done), -len(rules)) > (best[0], best[1]):
                    best = (len(done), -len(rules), rules, done)
            if not best[2]:
                size += 1
                continue
            if len(regexes) + len(best[2]) > _MAX_REGEXES:
                break  # past this, lines read better than regexes (and load faster)
            regexes.extend(best[2])
            explained |= best[3]
            pool = [m for m in pool if m.target not in explained]
    return regexes, [m for m in lines if m.target not in explained]


def _partition(pool: list[Any], s_skel: tuple[str, ...], t_skel: tuple[str, ...],
               fixed: tuple[int, ...], names: dict[tuple[str, ...], list[str]],
               target_of: dict[str, str], budget: int
               ) -> tuple[list[dict[str, str]], set[str]]:
    """The safe regexes for ``pool`` split by the values of the ``fixed`` source numbers,
    and the targets they explain; none where that needs more than ``budget`` regexes."""
    def values_of(name: str) -> tuple[str, ...]:
        path = name.split(".")
        return tuple(path[i] for i in fixed)

    cells: dict[tuple[str, ...], list[Any]] = {}
    for m in pool:
        cells.setdefault(values_of(m.source), []).append(m)
    candidates = [(values, cell) for values, cell in cells.items() if len(cell) >= _LEAST]
    if len(candidates) > budget:
        return [], set()  # more regexes than a map may hold: not worth checking
    # a regex spells the fixed numbers out: only names with those values can match it
    by_values: dict[tuple[str, ...], list[str]] = {}
    for name in names.get(s_skel, []):
        by_values.setdefault(values_of(name), []).append(name)
    rules, done = [], set()
    for values, cell in candidates:
        rule = _infer(cell, s_skel, t_skel, dict(zip(fixed, values)))
        if rule and _safe(rule, cell, by_values.get(values, []), target_of):
            rules.append(rule)
            done.update(m.target for m in cell)
    return rules, done


def _infer(cell: list[Any], s_skel: tuple[str, ...], t_skel: tuple[str, ...],
           fixed: dict[int, str]) -> dict[str, str] | None:
    """``{from, to}`` explaining every match of ``cell``, or None."""
    s_nums = [[int(p) for p in m.source.split(".")[:-1] if _number(p)] for m in cell]
    t_nums = [[int(p) for p in m.target.split(".")[:-1] if _number(p)] for m in cell]
    s_slots = [i for i, p in enumerate(s_skel) if p == "#"]
    varying = [k for k, i in enumerate(s_slots) if i not in fixed]
    group_of = {k: g + 1 for g, k in enumerate(varying)}  # regex group per varying slot
    pieces, t_pieces = [], []
    for i, part in enumerate(s_skel):
        if part != "#":
            pieces.append(re.escape(part))
        else:
            pieces.append(re.escape(fixed[i]) if i in fixed else r"([0-9]+)")
    leaf_group = len(varying) + 1
    tslot = 0
    for part in t_skel:
        if part != "#":
            if "\\" in part or _ARITH.search(part):
                return None  # would read as a group reference or arithmetic: keep the lines
            t_pieces.append(part)
            continue
        values = [nums[tslot] for nums in t_nums]
        choice = None
        for k in varying:  # a source number plus a constant: the least constant first
            offsets = {t - s[k] for t, s in zip(values, s_nums)}
            if len(offsets) == 1 and (choice is None or abs(next(iter(offsets))) <
                                      abs(choice[1])):
                choice = (k, offsets.pop())
        if choice is not None:
            k, d = choice
            t_pieces.append(f"\\{group_of[k]}" if d == 0 else
                            f"{{{group_of[k]}{d:+d}}}")
        elif len(set(values)) == 1:
            t_pieces.append(str(values[0]))
        else:
            return None
        tslot += 1
    pattern = "\\.".join(pieces) + r"\.([^.]+)"
    return {"from": pattern, "to": ".".join(t_pieces) + f".\\{leaf_group}"}


def _safe(rule: dict[str, str], cell: list[Any], names: list[str],
          target_of: dict[str, str]) -> bool:
    """The regex must carry every member of ``cell`` exactly onto its own target (its leaf
    by name or by a rule), and every other source name it matches onto that tensor's own
    target's layer; a name outside the plan must not match at all."""
    from .patterns import compile_pattern

    pattern = compile_pattern(rule["from"])
    for m in cell:
        new = pattern.replace_full(m.source, rule["to"])
        if new is None or new.rpartition(".")[0] != m.target.rpartition(".")[0]:
            return False
    for name in names:
        new = pattern.replace_full(name, rule["to"])
        if new is None:
            continue
        target = target_of.get(name)
        if target is None:
            return False
        if new.rpartition(".")[0] != target.rpartition(".")[0] or not _leaf_ok(
                new.rpartition(".")[2], target.rpartition(".")[2]):
            return False
    return True


def leftover_groups(unused: list[Any], *, least: int = 2) -> list[tuple[int, str, str]]:
    """Leftovers one segment rename would explain: ``(count, old, new)``, most first.

    Each unused source tensor votes with its closest target candidate when their layer
    paths differ in exactly one segment (``layer1.0.downsample.0`` vs
    ``layer1.0.down_sample_layer.0``); a rename with at least ``least`` votes is a group,
    unless another group renames the same segment or into the same name (they collide).
    """
    votes: Counter = Counter(d for u in unused if u.candidates and (
        d := _one_segment_diff(u.name, u.candidates[0].name)) is not None)
    # a rename maps one segment to one other: several segments onto one name ('q: qkv',
    # 'k: qkv', 'v: qkv': a fused tensor), or one onto several, would collide
    olds = Counter(old for old, _ in votes)
    news = Counter(new for _, new in votes)
    return [(n, old, new) for (old, new), n in votes.most_common()
            if n >= least and olds[old] == 1 and news[new] == 1]


def group_line(count: int, old: str, new: str) -> str:
    return (f"{count} leftovers under *.{old}.*; MindSpore has *.{new}.* -> add "
            f"'{old}: {new}' under rename.segments in a mapping file")
