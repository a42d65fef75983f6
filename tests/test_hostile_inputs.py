"""Hostile mapping files, attacker-sized name sets, and outputs nobody can clobber."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

import ms_port
from ms_port.errors import MappingError, OutputExistsError, WriteError
from ms_port.match.mapping import parse_mapping
from ms_port.match.plan import PlanOptions, make_plan
from ms_port.read.sources import read_source
from ms_port.read.targets import from_infos
from ms_port.read.tensors import TensorInfo
from ms_port.write import writers
from ms_port.write.proof import Checks

# -- mapping files ----------------------------------------------------------------------

def _laughs(levels: int = 9) -> str:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_billion_laughs_is_refused_before_expanding():
    text = _laughs()
    assert len(text) < 1000
    start = time.perf_counter()
    with pytest.raises(MappingError, match="anchors and aliases"):
        parse_mapping(text, origin="laughs.yaml")
    assert time.perf_counter() - start < 2


def test_both_yaml_parsers_refuse_aliases_and_read_tables_alike(monkeypatch):
    """The tables are read with libyaml's safe loader where PyYAML has it: the pure-Python
    one (its fallback, and the words of a syntax error) refuses the same aliases and reads
    every shipped table to the same data."""
    from importlib import resources

    import yaml

    from ms_port.match import mapping_yaml
    from ms_port.match.mapping import builtin_mappings

    for loader in {mapping_yaml._LOADER, yaml.SafeLoader}:
        monkeypatch.setattr(mapping_yaml, "_LOADER", loader)
        with pytest.raises(MappingError, match="anchors and aliases"):
            parse_mapping(_laughs(), origin="laughs.yaml")
    for name in builtin_mappings():
        text = (resources.files("ms_port.mappings") / f"{name}.yaml").read_text()
        assert (yaml.load(text, Loader=mapping_yaml._LOADER)
                == yaml.load(text, Loader=yaml.SafeLoader)), name


def test_mapping_file_size_is_capped(tmp_path):
    big = tmp_path / "big.yaml"
    with open(big, "w") as f:
        f.truncate(40 << 20)
    with pytest.raises(MappingError, match="too large"):
        ms_port.load_mapping(big)


@pytest.mark.parametrize("entry", ["rename: {regex: [{from: '(a+)+$', to: x}]}",
                                   "drop: ['(x+x+)+y']"])
def test_catastrophic_regexes_run_in_linear_time(entry):
    table = parse_mapping(entry, origin="m.yaml")
    start = time.perf_counter()
    name = "a" * 50_000 + "!" if "a+" in entry else "x" * 50_000
    table.rename(name)
    table.dropped_by(name)
    assert time.perf_counter() - start < 2  # Python's re: minutes


@pytest.mark.parametrize("pattern,why", [(r"(a)\1", "backreferences"),
                                         (r"(?=a)b", "lookarounds")])
def test_patterns_re2_cannot_run_are_named(pattern, why, capfd):
    with pytest.raises(MappingError, match=f"drop\\[0\\].*{why}"):
        parse_mapping(f"drop: ['{pattern}']", origin="m.yaml")
    assert "re2.cc" not in capfd.readouterr().err  # no engine log on stderr


def test_full_match_rename_replaces_once():
    table = parse_mapping(r"rename: {regex: [{from: '(.*)', to: 'net.\1'}]}", origin="m")
    assert table.rename("layer.weight")[0] == "net.layer.weight"


def test_renames_read_the_original_name_and_never_chain():
    """Index shifts no longer have to be written high to low."""
    text = r"""rename:
  regex:
    - {from: 'features\.(\d+)\.(.*)', to: 'features.{1+1}.\2'}
    - {from: 'features\.denselayer(\d+)\.(.*)', to: 'cell_list.{1-1}.\2'}
  segments: {fc: end_point, features: body}
"""
    table = parse_mapping(text, origin="m.yaml")
    assert table.rename("features.1.weight")[0] == "features.2.weight"  # not 3, 4, …
    assert table.rename("features.denselayer1.conv.weight")[0] == "cell_list.0.conv.weight"
    assert table.rename("features.denselayer10.norm.bias")[0] == "cell_list.9.norm.bias"
    assert table.rename("fc.weight") == ("end_point.weight", ["segment fc->end_point"])
    # a regex-renamed name keeps what the regex wrote: segments do not rename it again
    assert table.rename("features.0.fc.weight")[0] == "features.1.fc.weight"
    # the first regex that matches the ORIGINAL name wins: put a broad one first and the
    # dense-layer rule never sees a name the broad one already rewrote
    broad_first = parse_mapping(r"""rename:
  regex:
    - {from: 'features\.(.*)', to: 'body.\1'}
    - {from: 'body\.denselayer(\d+)\.(.*)', to: 'cell_list.{1-1}.\2'}
""", origin="m")
    assert broad_first.rename("features.denselayer3.w")[0] == "body.denselayer3.w"


def test_index_arithmetic_is_validated_and_never_goes_negative():
    with pytest.raises(MappingError, match=r"rename.regex\[0\].*\{2-1\}"):
        parse_mapping(r"rename: {regex: [{from: 'a(\d+)', to: 'b{2-1}'}]}", origin="m")
    table = parse_mapping(r"rename: {regex: [{from: 'a(\d+)', to: 'b{1-1}'}]}", origin="m")
    assert table.rename("a0") == ("a0", [])  # -1 is no index: not renamed


def test_a_leftover_says_what_a_rename_produced(tmp_path):
    save_file({"features.1.weight": np.ones(2, np.float32)}, str(tmp_path / "s.safetensors"))
    table = parse_mapping(r"rename: {regex: [{from: 'features\.(\d+)\.(.*)', "
                          r"to: 'body.{1-1}.\2'}]}", origin="m.yaml")
    target = from_infos([TensorInfo("body.1.weight", (2,), "float32")], "t")
    plan = make_plan(read_source(tmp_path / "s.safetensors"), target, table,
                     options=PlanOptions(align=False))
    (unused,) = plan.unused
    assert unused.renamed == "body.0.weight"
    assert "renamed to 'body.0.weight' by regex" in "\n".join(plan.problems())


def test_bad_group_reference_is_named():
    with pytest.raises(MappingError, match=r"rename.regex\[0\].*group"):
        parse_mapping(r"rename: {regex: [{from: 'a(b)', to: '\2'}]}", origin="m")


@pytest.mark.parametrize("ops", ["[{unsqueeze: 99}]", "[{unsqueeze: 100000000000000000000}]",
                                 "[{transpose: [0, 0]}]", "[{reshape: [-1, -1]}]"])
def test_out_of_range_transforms_become_conflicts_not_tracebacks(tmp_path, ops):
    src = tmp_path / "s.safetensors"
    save_file({"w": np.ones((4, 4), np.float32)}, str(src))
    try:
        table = parse_mapping(f"transforms: [{{match: 'w', ops: {ops}}}]", origin="m.yaml")
    except MappingError:
        return  # refused at parse time: fine
    plan = make_plan(read_source(src), from_infos([TensorInfo("w", (4, 4), "float32")], "t"),
                     table)
    assert not plan.ok and "w" in "\n".join(plan.problems())


def test_out_of_range_unsqueeze_is_one_line_from_the_cli(tmp_path):
    """unsqueeze(99) once predicted 4x4x1 for a 4x4 tensor, then crashed while writing."""
    from click.testing import CliRunner

    from ms_port.cli import main

    save_file({"w": np.ones((4, 4), np.float32)}, str(tmp_path / "s.safetensors"))
    save_file({"w": np.ones((4, 4, 1), np.float32)}, str(tmp_path / "t.safetensors"))
    (tmp_path / "m.yaml").write_text("transforms: [{match: 'w', ops: [{unsqueeze: 99}]}]\n")
    result = CliRunner().invoke(main, ["convert", str(tmp_path / "s.safetensors"), "--target",
                                       str(tmp_path / "t.safetensors"), "--map",
                                       str(tmp_path / "m.yaml"), "-o", str(tmp_path / "o.ckpt")])
    # a refused plan (exit 1), not a traceback (CliRunner keeps any other exception)
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert "do not apply" in result.output and not (tmp_path / "o.ckpt").exists()


def test_declared_transpose_of_a_square_weight_is_applied(tmp_path):
    w = np.arange(16, dtype=np.float32).reshape(4, 4)
    save_file({"w": w}, str(tmp_path / "s.safetensors"))
    table = parse_mapping("tensors: {w: {source: w, transforms: [{transpose: [1, 0]}]}}",
                          origin="m.yaml")
    target = from_infos([TensorInfo("w", (4, 4), "float32")], "t")
    plan = make_plan(read_source(tmp_path / "s.safetensors"), target, table)
    assert plan.ok and plan.matches[0].transforms
    ((_, array),) = list(plan.arrays())
    np.testing.assert_array_equal(array, w.T)


# -- attacker-sized name sets -----------------------------------------------------------

def test_closest_suggestions_stay_fast_with_10k_names(tmp_path):
    """All-pairs difflib over 10,000 × 10,000 names (10^8 ratios) would take the better
    part of an hour; the suggestions' index answers in seconds (25,000 names took 30 s of
    the suite, 100,000 took 35-50 s: the same bound)."""
    n = 10_000
    source = {f"blocks.{i}.mlp.fc{i % 7}.weight": np.zeros(1, np.float32) for i in range(n)}
    save_file(source, str(tmp_path / "s.safetensors"))
    target = from_infos([TensorInfo(f"layers.{i}.ffn.w{i % 5}", (1,), "float32")
                         for i in range(n)], "t")
    start = time.perf_counter()
    plan = make_plan(read_source(tmp_path / "s.safetensors"), target)
    took = time.perf_counter() - start
    assert len(plan.missing) == n and len(plan.unused) == n
    assert took < 120, f"{took:.0f} s"  # all-pairs difflib: hours


# -- outputs ----------------------------------------------------------------------------

@pytest.fixture()
def pair(tmp_path):
    src = tmp_path / "s.safetensors"
    save_file({"w": np.ones(3, np.float32)}, str(src))
    return src


def test_save_map_never_overwrites_without_force(pair, tmp_path):
    existing = tmp_path / "plan.yaml"
    existing.write_text("keep me")
    with pytest.raises(OutputExistsError):
        ms_port.convert(pair, target=pair, dry_run=True, save_map=existing)
    assert existing.read_text() == "keep me"
    ms_port.convert(pair, target=pair, dry_run=True, save_map=existing, force=True)
    assert "tensors" in existing.read_text()


def test_save_map_to_a_directory_or_an_input_is_refused(pair, tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(WriteError, match="directory"):
        ms_port.convert(pair, target=pair, dry_run=True, save_map=tmp_path / "d")
    with pytest.raises(WriteError, match="input"):
        ms_port.convert(pair, target=pair, dry_run=True, save_map=pair, force=True)


def test_output_over_an_input_is_refused_even_with_force(pair, tmp_path):
    before = pair.read_bytes()
    with pytest.raises(WriteError, match="input"):
        ms_port.convert(pair, target=pair, output=pair, force=True, format="safetensors")
    assert pair.read_bytes() == before


def test_long_output_names_are_fine(pair, tmp_path):
    out = tmp_path / ("x" * 245 + ".ckpt")
    ms_port.convert(pair, target=pair, output=out)
    assert out.exists() and not list(tmp_path.glob(".ms-port-*"))
    with pytest.raises(WriteError, match="not a usable output path"):
        ms_port.convert(pair, target=pair, output=tmp_path / ("y" * 300 + ".ckpt"))


def test_a_file_appearing_during_the_run_is_never_replaced(pair, tmp_path, monkeypatch):
    out = tmp_path / "o.ckpt"
    real = Checks.finish

    def and_meanwhile(self):
        out.write_text("someone else's")  # appears after the start-up check
        return real(self)

    monkeypatch.setattr(Checks, "finish", and_meanwhile)
    with pytest.raises(OutputExistsError, match="appeared"):
        ms_port.convert(pair, target=pair, output=out)
    assert out.read_text() == "someone else's"
    assert not list(tmp_path.glob(".ms-port-*"))


def test_two_concurrent_conversions_to_one_new_path(tmp_path):
    import torch

    torch.save({f"w{i}": torch.ones(256, 256) for i in range(16)}, tmp_path / "s.pth")
    out = tmp_path / "o.ckpt"
    cmd = [sys.executable, "-m", "ms_port", "convert", str(tmp_path / "s.pth"), "--target",
           str(tmp_path / "s.pth"), "-o", str(out), "-q"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    codes = sorted(p.wait(timeout=300) for p in procs)
    errs = "".join(p.stderr.read() for p in procs)
    assert codes in ([0, 2], [0, 0]), errs
    if codes == [0, 2]:  # the loser says so; the winner's file is whole
        assert "exists" in errs
    assert read_source(out).tensors.keys() == {f"w{i}" for i in range(16)}
    assert not list(tmp_path.glob(".ms-port-*"))


def test_temp_files_are_created_exclusively(tmp_path):
    out = tmp_path / "o.bin"
    with writers.atomic_output(out) as (_, tmp):
        assert tmp.exists() and tmp.parent == tmp_path and len(tmp.name) < 64
        assert oct(tmp.stat().st_mode & 0o777) == "0o600"  # mkstemp: O_EXCL, private
        tmp.write_bytes(b"x")
    assert out.read_bytes() == b"x"
    assert out.stat().st_mode & 0o777 == 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_ = Path


def test_mapped_at_finds_a_slice_in_its_map_and_declines_a_copy(tmp_path):
    """The writer releases a mapped tensor's pages as it goes: the offset it releases from
    must be the slice's own in the map (a slice of a memmap carries its parent's offset),
    and a copy (a transposed tensor's bytes) has no map to release."""
    from ms_port.read.tensors import flat_bytes, mapped_at

    path = tmp_path / "data.bin"
    path.write_bytes(np.arange(300_000, dtype=np.uint32).tobytes())
    whole = np.memmap(path, dtype=np.float32, mode="r", offset=70_000 * 4,
                      shape=(1000, 200))
    for view in (whole, whole[512:], whole[3:9, :], whole[700]):
        raw = flat_bytes(view) if view.flags.c_contiguous else None
        if raw is None:
            continue
        mm, first = mapped_at(raw)
        assert bytes(mm[first:first + raw.nbytes]) == raw.tobytes()
    assert mapped_at(flat_bytes(np.ascontiguousarray(whole.T))) is None
    assert mapped_at(flat_bytes(np.zeros(8, np.float32))) is None
