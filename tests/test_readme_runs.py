"""The sessions the README and docs/llm.md show run: each ``$ ms-port …`` (and ``$ python
examples/…``) line is run as written, in order, on the files it names (a seeded ResNet50
with BatchNorm statistics estimated on data, as ``make demo`` makes; the ``.ckpt`` the
shown ``convert`` writes; a copy of it with one BatchNorm's statistics swapped; a
converted ResNet18; the seeded tiny language models), and must end as shown: the same
verdict (panel title and exit code) and the same plan, mapping, read-back and tensor
count lines. The shown floating-point figures are the pages'; they are not compared."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("mindspore")

from ms_port.cli import main

ROOT = Path(__file__).resolve().parent.parent

#: a panel's title -> the exit code that goes with it
TITLES = {"CONVERTED": 0, "EXPORTED": 0, "PASS": 0, "PLAN OK": 0, "IDENTICAL": 0,
          "DIFFERENT": 1, "FAIL": 1, "NOT CONVERTED": 1, "INCONCLUSIVE": 3}
#: shown lines (box drawing and spacing aside) that must come out word for word
KEPT = re.compile(r"^(matched:|mapping:|readback:|tensors:|compared through the plan|source:"
                  r"|target:|✗ \S+\s+differs|… \d+ more)")


PAGES = ("README.md", "docs/llm.md")


def _sessions(page: str) -> list[tuple[str, str, list[str]]]:
    """(where, command, shown output) for each ``$ ms-port`` or ``$ python examples/`` line
    in a fenced block, its continuation lines joined and its comment cut."""
    found: list[tuple[str, str, list[str]]] = []
    lines = (ROOT / page).read_text().splitlines()
    fenced = False
    k = 0
    while k < len(lines):
        line = lines[k]
        if line.startswith("```"):
            fenced = not fenced
        elif fenced and re.match(r"^\$ (ms-port|python examples/) ?", line):
            start, command = k + 1, line[2:]
            while command.rstrip().endswith("\\"):
                k += 1
                command = command.rstrip()[:-1] + " " + lines[k].strip()
            shown = []
            for after in lines[k + 1:]:
                if after.startswith("```") or after.startswith("$ "):
                    break
                shown.append(after)
            found.append((f"{page}:{start}", command.split("  #")[0].strip(), shown))
        k += 1
    return found


def _plain(line: str) -> str:
    return " ".join(line.strip("│╭╮╰╯─ ").split())


def _title(shown: list[str]) -> str | None:
    for line in shown:
        m = re.match(r"^╭─ (.+?) ─", line)
        if m:
            return m.group(1)
    return None


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    from ms_port.testing import save_reference_checkpoint

    root = tmp_path_factory.mktemp("readme")
    save_reference_checkpoint("resnet50", root / "resnet50.pth", seed=0, bn_from_data=True)
    save_reference_checkpoint("resnet18", root / "resnet18.pth", seed=0, bn_from_data=True)
    (root / "demo").mkdir()
    return root


def _prepare(root: Path, command: str) -> None:
    """The files a shown command names that no earlier shown command writes."""
    import ms_port
    from ms_port.testing import rewrite_checkpoint

    if "broken.ckpt" in command and not (root / "broken.ckpt").exists():
        def swap(arrays: dict) -> None:
            a, b = "layer3.1.bn2.moving_mean", "layer3.1.bn2.moving_variance"
            arrays[a], arrays[b] = arrays[b], arrays[a]

        rewrite_checkpoint(root / "resnet50.ckpt", root / "broken.ckpt", swap)
    if "resnet18.ckpt" in command and not (root / "resnet18.ckpt").exists():
        ms_port.convert(root / "resnet18.pth", arch="resnet18", output=root / "resnet18.ckpt")
    if "demo/tiny-llama" in command and not (root / "demo/tiny-llama").exists():
        _python(root, ["examples/make_tiny_llm.py", "demo/tiny-llama", "--kind", "llama"])
        ms_port.convert(root / "demo/tiny-llama", ms_model="mindformers:llama",
                        output=root / "demo/tiny-llama.ckpt")


def _downloads(root: Path, command: str) -> bool:
    """Whether the command's source is a Hugging Face id (a download), not a file."""
    from ms_port.read.hub import is_hub_id

    source = shlex.split(command)[2]
    return is_hub_id(source) and not (root / source).exists()


def _python(root: Path, args: list[str]) -> str:
    """An example script, run as the page shows it, in the session's folder."""
    result = subprocess.run([sys.executable, str(ROOT / args[0]), *args[1:]], cwd=root,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return result.stdout


SESSIONS = [s for page in PAGES for s in _sessions(page)]


def test_the_pages_show_a_session_per_command():
    shown = {shlex.split(cmd)[1] for _, cmd, _ in SESSIONS if cmd.startswith("ms-port")}
    assert shown >= {"inspect", "convert", "verify", "diff", "export"}
    assert {where.split(":")[0] for where, _, _ in SESSIONS} == set(PAGES)


@pytest.mark.slow
def test_each_readme_session_ends_as_shown(workdir, monkeypatch):
    monkeypatch.chdir(workdir)
    monkeypatch.setenv("COLUMNS", "200")  # no shown line wraps
    runner = CliRunner()
    ran = []
    for line, command, shown in SESSIONS:
        if command.startswith("python "):
            _python(workdir, shlex.split(command)[1:])
            continue
        _prepare(workdir, command)
        if _downloads(workdir, command):  # no network in tests
            continue
        ran.append(line)
        result = runner.invoke(main, shlex.split(command)[1:], catch_exceptions=False)
        out = [_plain(x) for x in result.output.splitlines()]
        title = _title(shown)
        where = f"{line}: {command}"
        if title is not None:
            assert result.exit_code == TITLES[title], (where, result.output[-2000:])
            assert any(x.startswith(title) for x in out), (where, title, result.output[-2000:])
        else:
            assert result.exit_code == 0, (where, result.output[-2000:])
        for expected in (_plain(x) for x in shown):
            if KEPT.match(expected):  # the README's line may wrap where the output does not
                assert any(x.startswith(expected) for x in out), (where, expected,
                                                                  result.output[-3000:])
    assert len(ran) == len(SESSIONS) - 2  # all but the example script and the Hub id
