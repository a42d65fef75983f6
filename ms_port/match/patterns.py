"""Regular expressions from mapping files and options, matched in linear time.

A pattern comes from a file the user may not have written, so it must not be able to
hang the tool: Python's ``re`` backtracks (``(a+)+$`` on 30 characters takes minutes).
RE2 (``google-re2``, the engine of Go and of Google's production systems) guarantees
time linear in the input and has no backreferences or lookarounds; ``regex`` with a
timeout was the alternative, but a timeout turns a slow pattern into a flaky failure
instead of ruling it out. Patterns RE2 cannot run are refused with the reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import re2

#: longest pattern accepted (real ones are under 200 characters)
MAX_PATTERN = 4096
_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # the reason travels in the exception, not on stderr
_OPTIONS.max_mem = 8 << 20  # a pattern that needs more is refused, not compiled


#: group references in a replacement template (a fixed pattern of ours: re is fine)
_GROUP_REF = re.compile(r"\\(\d+)|\\g<(\w+)>")
#: index arithmetic in a replacement: {1-1} is group 1 as a number minus one
_ARITH = re.compile(r"\{(\d+)([+-]\d+)?\}")
#: the longest group ``{N+K}`` computes with; a longer one makes the rename not apply
MAX_DIGITS = 18


class PatternError(ValueError):
    """A pattern RE2 cannot compile (or too long); the message says why."""


@dataclass(frozen=True)
class Pattern:
    """A compiled pattern with the few operations ms-port needs."""

    pattern: str
    _compiled: Any

    def fullmatch(self, text: str) -> bool:
        return self._compiled.fullmatch(text) is not None

    def search(self, text: str) -> bool:
        return self._compiled.search(text) is not None

    def replace_full(self, text: str, template: str) -> str | None:
        """``template`` expanded for a whole-name match (one replacement), else None.

        Besides ``\\1`` and ``\\g<name>``, ``{N+K}`` / ``{N-K}`` put group N's number
        plus or minus K (renumbered blocks: ``denselayer(\\d+)`` -> ``cell_list.{1-1}``);
        a group that is not a number, or a result below 0, means no match.
        """
        match = self._compiled.fullmatch(text)
        if match is None:
            return None
        failed = False

        def number(m: re.Match) -> str:
            nonlocal failed
            value = match.group(int(m.group(1))) or ""
            # an index, not a 5,000-digit number (int() refuses those; nothing has them)
            if not (value.isascii() and value.isdigit()) or len(value) > MAX_DIGITS:
                failed = True
                return ""
            result = int(value) + int(m.group(2) or 0)
            failed = failed or result < 0
            return str(result)

        expanded = _ARITH.sub(number, template)
        return None if failed else match.expand(expanded)

    def check_template(self, template: str) -> None:
        """Raise PatternError if ``template`` refers to a group the pattern lacks."""
        groups = self._compiled.groups
        names = set(self._compiled.groupindex)
        for m in _GROUP_REF.finditer(template):
            ref = m.group(1) or m.group(2)
            bad = int(ref) > groups if ref.isdigit() else ref not in names
            if bad:
                raise PatternError(f"invalid group reference {m.group(0)}")
        for m in _ARITH.finditer(template):
            if not 0 < int(m.group(1)) <= groups:
                raise PatternError(f"invalid group reference {m.group(0)} (index arithmetic "
                                   f"needs a group 1..{groups})")

    def __str__(self) -> str:
        return self.pattern


def compile_pattern(pattern: str) -> Pattern:
    """Compile with RE2.

    Raises:
        PatternError: the syntax RE2 refuses (backreferences, lookarounds), or too long.
    """
    if len(pattern) > MAX_PATTERN:
        raise PatternError(f"pattern of {len(pattern)} characters (at most {MAX_PATTERN})")
    try:
        return Pattern(pattern, re2.compile(pattern, _OPTIONS))
    except re2.error as exc:
        reason = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) \
            else str(exc)
        raise PatternError(f"{reason} (RE2 syntax: no backreferences or lookarounds)") \
            from None
