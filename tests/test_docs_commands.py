"""The commands the README and docs/ show are the CLI's: every `ms-port CMD --flag` in a
code block names a command that exists and flags it takes, so the pages cannot drift
from the code (what the commands print is the examples' and the tests' to prove)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from ms_port.cli import main

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _commands(page: Path) -> list[tuple[int, str]]:
    """(line number, command) for each ms-port command line in a code block (fenced, or
    indented), its continuation lines joined."""
    found, lines = [], page.read_text().splitlines()
    fenced = False
    k = 0
    while k < len(lines):
        if lines[k].lstrip().startswith("```"):
            fenced = not fenced
        m = re.match(r"^\s*(?:\$ )?(ms-port \S.*)$", lines[k])
        if m and (fenced or lines[k].startswith("    ")):
            text, start = m.group(1), k + 1
            while text.rstrip().endswith("\\") and k + 1 < len(lines):
                k += 1
                text = text.rstrip()[:-1] + " " + lines[k].strip()
            found.append((start, text.split("#")[0]))
        k += 1
    return found


SHOWN = [(page.name, line, cmd) for page in PAGES for line, cmd in _commands(page)]


def test_the_pages_show_commands():
    assert len(SHOWN) >= 10 and {p for p, *_ in SHOWN} >= {"README.md", "llm.md"}


@pytest.mark.parametrize(("page", "line", "command"), SHOWN,
                         ids=[f"{p}:{n}" for p, n, _ in SHOWN])
def test_each_shown_command_and_flag_exists(page, line, command):
    tokens = shlex.split(command.replace("…", ""))
    name = tokens[1]
    assert name in main.commands, f"{page}:{line}: no command {name!r}"
    known = {opt for param in main.commands[name].params
             for opt in (*getattr(param, "opts", ()), *getattr(param, "secondary_opts", ()))}
    known.add("--help")
    for token in tokens[2:]:
        if token.startswith("-") and token not in ("-", "--"):
            flag = token.split("=")[0]
            assert flag in known, f"{page}:{line}: {name} has no {flag}"
