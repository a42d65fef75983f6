"""Names read from files are data: no terminal escape reaches the screen, JSON stays exact."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from safetensors.numpy import save_file

from ms_port.cli import main
from ms_port.text import visible

CLEAR = "\x1b[2J"
LINK = "\x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\"
BIDI = "\u202eexe.txt"
NAMES = [f"a{CLEAR}.weight", f"b{LINK}.bias", f"c{BIDI}", "d[bold red]markup[/]", "e\rover"]


@pytest.fixture()
def hostile(tmp_path):
    path = tmp_path / "h.safetensors"
    save_file({n: np.ones(2, np.float32) for n in NAMES}, str(path))
    return path


def _clean(out: str) -> None:
    for raw in ("\x1b", "\u202e", "\r", "\x07"):
        assert raw not in out, repr(out[:300])


def test_inspect_shows_escapes_not_control_characters(hostile):
    result = CliRunner().invoke(main, ["inspect", str(hostile), "--all"])
    assert result.exit_code == 0, result.output
    _clean(result.stdout)
    assert "\\x1b[2J" in result.stdout and "\\u202e" in result.stdout
    assert "[bold red]markup[/]" in result.stdout  # shown literally, not as style


def test_json_keeps_the_exact_names(hostile):
    result = CliRunner().invoke(main, ["inspect", str(hostile), "--json"])
    assert [t["name"] for t in json.loads(result.stdout)["tensors"]] == sorted(NAMES)


def test_error_lines_and_leftovers_are_inert(hostile, tmp_path):
    target = tmp_path / "t.safetensors"
    save_file({"other": np.ones(3, np.float32)}, str(target))
    result = CliRunner().invoke(main, ["convert", str(hostile), "--target", str(target),
                                       "-o", str(tmp_path / "o.ckpt")])
    assert result.exit_code == 1
    _clean(result.output)
    assert "\\x1b]8;;https://evil.example/" in result.output
    missing = tmp_path / f"no{CLEAR}such.pth"
    result = CliRunner().invoke(main, ["inspect", str(missing)])
    assert result.exit_code == 2
    _clean(result.stderr)
    assert "\\x1b[2J" in result.stderr


def test_visible_escapes_every_control_and_bidi_character():
    controls = "".join(map(chr, [*range(32), 127, *range(0x80, 0xA0), 0x202E, 0x2066]))
    shown = visible(controls)
    assert all(c.isprintable() and ord(c) < 127 for c in shown)
    assert visible("a\nb", newlines=True) == "a\nb" and visible("ok.weight") == "ok.weight"


def test_a_name_the_user_must_act_on_is_never_cut():
    """A tensor name in a message is shown whole (it was cut at 40 characters:
    'decoder.layers.0.self_attention.line...'); a crafted name past 256 characters keeps its
    head and its distinguishing tail, escaped."""
    from ms_port.errors import NAME_LIMIT, shown

    name = "decoder.layers.0.self_attention.linear_qkv.weight"
    assert shown(name) == repr(name)
    long = "layers." * 60 + "17.mlp.linear_fc2.weight\x1b[31m"
    text = shown(long)
    assert len(text) == NAME_LIMIT and text.endswith("17.mlp.linear_fc2.weight\\x1b[31m'")
    assert text.startswith("'layers.layers.") and "..." in text
    assert len(shown(list(range(100)))) == 40  # other values stay short
