"""Tensor-level diff: names exactly the tensors that differ, and what each holds instead.

A tiny network (every rule's layer kind, a square classifier) is converted, then its
``.ckpt`` is corrupted in known ways: BatchNorm statistics swapped, GroupNorm gamma and
beta swapped, the square weight transposed, a weight scaled by 1.0001. The diff must
name those tensors and no other, each with what it holds.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import ms_port
from ms_port.check.tensors import TensorDiff, compare_by_name
from ms_port.cli import main
from ms_port.read.sources import Source
from ms_port.read.tensors import TensorInfo, dtype_name
from ms_port.testing import rewrite_checkpoint
from tests import tiny_nets

REPO = Path(__file__).resolve().parent.parent
CLASSES = 6  # fc.weight is 6×6: a transposed copy keeps its shape
CONV1D_MAP = "transforms:\n  - {match: 'conv1d\\.weight', ops: [{unsqueeze: 2}]}\n"

#: hostile names, as in test_terminal_injection
NAMES = ["a\x1b[2J.weight", "b\x1b]8;;https://evil.example/\x1b\\x\x1b]8;;\x1b\\.bias",
         "c\u202eexe.txt", "d[bold red]markup[/]", "e\rover"]

#: the corruption, and what the diff must say each corrupted tensor holds
HOLDS = {
    "bn.moving_mean": ("bn.running_var", "exact"),
    "bn.moving_variance": ("bn.running_mean", "exact"),
    "gn.gamma": ("gn.bias", "exact"),
    "gn.beta": ("gn.weight", "exact"),
    "fc.weight": ("fc.weight", "exact (transposed)"),
}
SCALED = "conv.weight"


def _state() -> dict:
    state = tiny_nets.torch_state(classes=CLASSES, seed=1)
    gen = torch.Generator().manual_seed(7)
    for name in ("bn.weight", "bn.bias", "gn.weight", "gn.bias", "ln.weight", "ln.bias"):
        # fresh norms hold ones and zeros, which many tensors share; make each unique
        state[name] = torch.rand(state[name].shape, generator=gen) + 0.5
    return state


def _corrupt(a: dict) -> None:
    a["bn.moving_mean"], a["bn.moving_variance"] = a["bn.moving_variance"], a["bn.moving_mean"]
    a["gn.gamma"], a["gn.beta"] = a["gn.beta"], a["gn.gamma"]
    a["fc.weight"] = np.ascontiguousarray(a["fc.weight"].T)
    a[SCALED] = a[SCALED] * np.float32(1.0001)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("diff")
    pth = root / "tiny.pth"
    torch.save(_state(), pth)
    ckpt = root / "tiny.ckpt"
    assert ms_port.convert(pth, ms_model=tiny_nets.build_ms(classes=CLASSES), output=ckpt).ok
    mapping = root / "conv1d.yaml"
    mapping.write_text(CONV1D_MAP)
    return {"pth": pth, "ckpt": ckpt, "map": mapping, "root": root,
            "bad": rewrite_checkpoint(ckpt, root / "bad.ckpt", _corrupt)}


def _cell():
    return tiny_nets.build_ms(classes=CLASSES)


def _cli(*args: object):
    # rich wraps at the terminal's width: a wide one keeps each tensor's line whole
    return CliRunner().invoke(main, ["diff", *map(str, args)], env={"COLUMNS": "250"})


def _differing(d: TensorDiff) -> dict[str, tuple[str | None, str | None]]:
    return {x.target: (x.holds, x.holds_how) for x in d.problems}


# -- through the plan ---------------------------------------------------------------


def test_a_correct_conversion_is_identical(files):
    d = ms_port.diff(files["pth"], files["ckpt"], ms_model=_cell())
    assert d.ok and d.mode == "plan"
    assert d.counts["identical"] == len(d.deltas) == 23
    assert all(x.max_abs == 0.0 for x in d.deltas)


def test_names_exactly_the_corrupted_tensors_and_what_they_hold(files):
    d = ms_port.diff(files["pth"], files["bad"], ms_model=_cell())
    assert not d.ok
    found = _differing(d)
    assert set(found) == {*HOLDS, SCALED}
    for name, holds in HOLDS.items():
        assert found[name] == holds, name
    scaled = next(x for x in d.deltas if x.target == SCALED)
    assert scaled.holds == SCALED and scaled.holds_how.startswith("close (cosine ")
    assert 0 < scaled.max_abs < 1e-3 and scaled.cosine > 0.9999
    swapped = next(x for x in d.deltas if x.target == "bn.moving_mean")
    assert swapped.status == "differs" and swapped.source == "bn.running_mean"
    assert swapped.max_abs > 0.1 and swapped.cosine < 0.99
    assert swapped.describe().startswith("bn.moving_mean  differs (source bn.running_mean)")
    assert swapped.describe().endswith("holds bn.running_var (exact)")


def test_either_order_gives_the_same_answer(files):
    d = ms_port.diff(files["bad"], files["pth"], ms_model=_cell())
    assert d.a == str(files["pth"]) and d.b == str(files["bad"])  # PyTorch side is A
    assert set(_differing(d)) == {*HOLDS, SCALED}


def test_template_mode_needs_conv1d_layout_and_says_so(files):
    # the .ckpt alone has no layer types: Conv1d's extra axis is unknown, so that tensor
    # is unplanned (and the note says why) until a mapping declares the transform
    d = ms_port.diff(files["pth"], files["ckpt"])
    assert [(x.target, x.status) for x in d.problems] == [("conv1d.weight", "unplanned")]
    assert any("declare a transform" in n for n in d.notes)
    d = ms_port.diff(files["pth"], files["bad"], mapping=files["map"])
    assert _differing(d)["bn.moving_mean"] == HOLDS["bn.moving_mean"]
    assert set(_differing(d)) == {*HOLDS, SCALED}


def test_missing_and_shape(files):
    def edit(a):
        del a["act.w"]
        a["fc.bias"] = a["fc.bias"][:3].copy()

    ckpt = rewrite_checkpoint(files["ckpt"], files["root"] / "holes.ckpt", edit)
    d = ms_port.diff(files["pth"], ckpt, ms_model=_cell())
    status = {x.target: x.status for x in d.problems}
    assert status == {"act.w": "missing", "fc.bias": "shape"}
    shape = next(x for x in d.deltas if x.target == "fc.bias")
    assert shape.shape == (3,) and shape.expected_shape == (CLASSES,)
    assert "shape 3 ≠ 6" in shape.describe()


def test_a_cast_conversion_compares_in_the_held_dtype(files):
    out = files["root"] / "half.ckpt"
    assert ms_port.convert(files["pth"], ms_model=_cell(), output=out, dtype="bfloat16").ok
    d = ms_port.diff(files["pth"], out, ms_model=_cell())
    assert d.ok, [x.describe() for x in d.problems]

    def swap(a):
        a["ln.gamma"], a["ln.beta"] = a["ln.beta"], a["ln.gamma"]

    d = ms_port.diff(files["pth"], rewrite_checkpoint(out, files["root"] / "half-bad.ckpt", swap),
                     ms_model=_cell())
    assert _differing(d) == {"ln.gamma": ("ln.bias", "exact"), "ln.beta": ("ln.weight", "exact")}


# -- by name --------------------------------------------------------------------------


def _source(path: str, arrays: dict[str, np.ndarray], loads: list | None = None) -> Source:
    def loader(name: str, array: np.ndarray):
        def load() -> np.ndarray:
            if loads is not None:
                loads.append(name)
            return array
        return load

    return Source(path, "safetensors", {
        n: TensorInfo(n, a.shape, dtype_name(a.dtype), loader(n, a)) for n, a in arrays.items()})


def test_by_name_finds_swaps_transposes_and_near_copies():
    rng = np.random.default_rng(0)
    a = {n: rng.standard_normal(s).astype(np.float32) for n, s in
         [("x.weight", (4, 4)), ("x.bias", (4,)), ("y.weight", (4, 4)), ("y.bias", (4,)),
          ("z.big", (3, 5, 7))]}
    b = dict(a, **{"x.bias": a["y.bias"], "y.bias": a["x.bias"], "x.weight": a["x.weight"].T,
                   "y.weight": a["y.weight"] * np.float32(1.0002)})
    loads: list[str] = []
    d = compare_by_name(_source("a", a, loads), _source("b", b))
    assert _differing(d) == {"x.bias": ("y.bias", "exact"), "y.bias": ("x.bias", "exact"),
                             "x.weight": ("x.weight", "exact (transposed)"),
                             "y.weight": ("y.weight", "close (cosine 1.0000)")}
    # a tensor whose shape nothing differing has is read once (compared), never searched
    assert loads.count("z.big") == 1


def test_by_name_says_when_several_tensors_hold_the_same_values():
    a = {"p.bias": np.zeros(3, np.float32), "q.bias": np.zeros(3, np.float32),
         "p.weight": np.ones(3, np.float32)}
    d = compare_by_name(_source("a", a), _source("b", dict(a, **{"p.weight": a["p.bias"]})))
    # ties go to the name closest to the tensor's own
    assert _differing(d) == {"p.weight": ("p.bias", "exact (1 of 2 equal tensors)")}


def test_two_pth_files_by_name_bfloat16(tmp_path):
    state = tiny_nets.torch_state(seed=2, dtype=torch.bfloat16)
    torch.save(state, tmp_path / "a.pth")
    other = dict(state)
    other["bn.running_mean"], other["bn.running_var"] = state["bn.running_var"], \
        state["bn.running_mean"]
    del other["fc.bias"]
    other["extra.weight"] = torch.ones(2)
    torch.save(other, tmp_path / "b.pth")
    d = ms_port.diff(tmp_path / "a.pth", tmp_path / "b.pth")
    assert d.mode == "names"
    assert {x.target: x.status for x in d.problems} == {
        "bn.running_mean": "differs", "bn.running_var": "differs",
        "fc.bias": "missing", "extra.weight": "unplanned"}
    assert _differing(d)["bn.running_mean"] == ("bn.running_var", "exact")
    assert ms_port.diff(tmp_path / "a.pth", tmp_path / "a.pth").ok
    with pytest.raises(ms_port.MsPortError, match=r"both PyTorch checkpoints.*arch"):
        ms_port.diff(tmp_path / "a.pth", tmp_path / "b.pth", arch="resnet18")


# -- the command ----------------------------------------------------------------------


def test_cli_exit_codes_and_report(files):
    ok = _cli(files["pth"], files["ckpt"], "--map", files["map"])
    assert ok.exit_code == 0, ok.output
    assert "IDENTICAL" in ok.stdout and "identical 23" in ok.stdout

    bad = _cli(files["pth"], files["bad"], "--map", files["map"])
    assert bad.exit_code == 1, bad.output
    assert "DIFFERENT" in bad.stdout and "identical 17, differs 6" in bad.stdout
    lines = [ln for ln in bad.stdout.splitlines() if ln.startswith("✗")]
    assert len(lines) == 6
    assert any("bn.moving_mean  differs" in ln and "holds bn.running_var (exact)" in ln
               for ln in lines)
    assert any("fc.weight  differs" in ln and "(exact, transposed)" in ln for ln in lines)
    assert "gn.beta" not in ok.stdout  # identical tensors are listed only with --all
    assert "✓ gn.beta  identical" not in bad.stdout
    assert "✓ ln.beta  identical" in _cli(files["pth"], files["bad"], "--map", files["map"],
                                          "--all").stdout


def test_cli_json(files):
    result = _cli(files["bad"], files["pth"], "--map", files["map"], "--json")
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["ok"] is False and data["mode"] == "plan"
    assert data["counts"] == {"identical": 17, "differs": 6, "shape": 0, "missing": 0,
                              "unplanned": 0}
    rows = {r["target"]: r for r in data["deltas"] if r["status"] != "identical"}
    assert {k: (r["holds"], r["holds_how"]) for k, r in rows.items() if k != SCALED} == HOLDS


def test_cli_ms_model(files, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    pth, ckpt = tmp_path / "five.pth", tmp_path / "five.ckpt"
    torch.save(tiny_nets.torch_state(), pth)
    assert ms_port.convert(pth, ms_model=tiny_nets.build_ms(), output=ckpt).ok
    result = _cli(pth, ckpt, "--ms-model", "tests.tiny_nets:build_ms")
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("args, message", [
    (["{root}/nope.pth", "{ckpt}"], "no such file"),
    (["{map}", "{ckpt}"], "not a checkpoint"),
    (["{pth}", "{ckpt}", "--arch", "nope"], "unknown architecture"),
    (["{pth}", "{ckpt}", "--arch", "resnet18", "--ms-model", "x:y"], "not both"),
    (["{pth}", "{pth}", "--map", "{map}"], "both PyTorch"),
])
def test_cli_bad_input_exits_2(files, args, message):
    result = _cli(*(a.format(**files) for a in args))
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_cli_calls_the_library(monkeypatch):
    import ms_port.api

    seen = {}

    def fake(a, b, **kw):
        seen.update(kw, a=a, b=b)
        return TensorDiff(a, b, "names", [])

    monkeypatch.setattr(ms_port.api, "diff", fake)
    result = _cli("x.pth", "y.ckpt", "--arch", "resnet18", "--map", "m.yaml", "--key", "ema",
                  "--step", "1_10", "--config", "c.json", "--ms-option", "qkv_concat=true")
    assert result.exit_code == 0, result.output
    assert seen == {"a": "x.pth", "b": "y.ckpt", "arch": "resnet18", "ms_model": None,
                    "mapping": ["m.yaml"], "key": "ema", "unsafe_pickle": False,
                    "revision": None, "strategy": None, "step": "1_10", "config": "c.json",
                    "ms_options": {"qkv_concat": "true"}}


def test_names_from_files_are_escaped(tmp_path):
    from safetensors.numpy import save_file

    rng = np.random.default_rng(1)
    a = {n: rng.standard_normal(3).astype(np.float32) for n in NAMES}
    b = dict(a, **{NAMES[0]: a[NAMES[1]], NAMES[1]: a[NAMES[0]]})
    save_file(a, str(tmp_path / "a.safetensors"))
    save_file(b, str(tmp_path / "b.safetensors"))
    result = _cli(tmp_path / "a.safetensors", tmp_path / "b.safetensors", "--all")
    assert result.exit_code == 1
    for raw in ("\x1b", "\u202e", "\r"):
        assert raw not in result.stdout
    assert "\\x1b[2J" in result.stdout and "\\u202e" in result.stdout
    assert "[bold red]markup[/]" in result.stdout
    data = json.loads(_cli(tmp_path / "a.safetensors", tmp_path / "b.safetensors",
                           "--json").stdout)
    assert {r["target"]: r["holds"] for r in data["deltas"] if r["holds"]} == {
        NAMES[0]: NAMES[1], NAMES[1]: NAMES[0]}


def test_report_repr_dict_and_rendering(files):
    d = ms_port.diff(files["pth"], files["bad"], ms_model=_cell())
    assert repr(d) == "TensorDiff(ok=False, mode='plan', identical=17, differs=6)"
    json.dumps(d.to_dict(), allow_nan=False)
    assert "DIFFERENT" in d._repr_html_()


def test_holds_search_stays_bounded_among_many_same_shape_tensors():
    rng = np.random.default_rng(3)
    n = 10_000
    a = {f"layers.{i // 2}.attn.{'qk'[i % 2]}": rng.standard_normal(8).astype(np.float32)
         for i in range(n)}
    b = dict(a, **{"layers.4321.attn.q": a["layers.4321.attn.k"] * np.float32(1.0001),
                   "layers.77.attn.k": a["layers.77.attn.q"]})
    loads: list[str] = []
    d = compare_by_name(_source("a", a, loads), _source("b", b))
    assert _differing(d) == {"layers.4321.attn.q": ("layers.4321.attn.k", "close (cosine 1.0000)"),
                             "layers.77.attn.k": ("layers.77.attn.q", "exact")}
    # compared once, hashed once (same shape as a differing tensor), scored at most 64
    assert len(loads) <= 2 * n + 64
