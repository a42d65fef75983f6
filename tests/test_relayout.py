"""Outputs that hold the same values in another layout are paired and compared, and the
report says how; where the shapes leave the layout in doubt they are not paired."""

from __future__ import annotations

import numpy as np

from ms_port.check.parity import _compare_outputs
from ms_port.check.relayout import Joined, groups, transposed
from ms_port.check.verdict import Drift

rng = np.random.default_rng(0)


def _compare(torch_outs, ms_outs):
    notes: list[str] = []
    alt = {n: a.astype(np.float64) for n, a in torch_outs}
    sens = {n: a + 1 for n, a in torch_outs}
    out = _compare_outputs(torch_outs, ms_outs, alt, sens, tol=1e-5, scaled=True,
                           drift=Drift(), notes=notes)
    return out, notes


def _detector(channels=84, levels=((12, 12), (6, 6), (3, 3))):
    """ultralytics' outputs and MindYOLO's, the same numbers: predictions B×C×N and B×N×C;
    boxes/scores B×64×N, B×(C-4)×N against per-level maps B×(64+C-4)×H×W."""
    maps = [rng.standard_normal((1, 64 + channels - 4, h, w)).astype(np.float32)
            for h, w in levels]
    flat = np.concatenate([m.reshape(1, m.shape[1], -1) for m in maps], axis=2)
    pred = rng.standard_normal((1, channels, flat.shape[2])).astype(np.float32)
    torch_outs = [("0", pred), ("1.boxes", flat[:, :64]), ("1.scores", flat[:, 64:]),
                  ("1.feats.0", rng.standard_normal((1, 8, 12, 12)).astype(np.float32))]
    ms_outs = [("0", np.ascontiguousarray(pred.transpose(0, 2, 1)))] + [
        (f"1.{i}", m) for i, m in enumerate(maps)]
    return torch_outs, ms_outs


def test_a_detectors_outputs_pair_across_layouts_and_say_how():
    torch_outs, ms_outs = _detector()
    out, notes = _compare(torch_outs, ms_outs)
    by_name = {o.name: o for o in out}
    assert set(by_name) == {"0", "1.{boxes,scores}"}
    assert by_name["0"].error == 0 and "transposed" in by_name["0"].layout
    joined = by_name["1.{boxes,scores}"]
    assert joined.error == 0 and joined.ms_name == "1.{0,1,2}"
    assert "joined along channels" in joined.layout and "flattened" in joined.layout
    assert any(n.startswith("outputs compared in another layout") for n in notes)
    assert any("no counterpart" in n and "PyTorch 1.feats.0" in n for n in notes)


def test_a_wrong_value_in_another_layout_still_fails():
    torch_outs, ms_outs = _detector()
    bad = ms_outs[2][1].copy()
    bad[0, 70] += 1.0  # one level's class map off
    ms_outs[2] = (ms_outs[2][0], bad)
    out, _ = _compare(torch_outs, ms_outs)
    joined = next(o for o in out if o.name == "1.{boxes,scores}")
    assert not joined.ok and joined.status == "fail"
    transposed_wrong = [("0", torch_outs[0][1].transpose(0, 2, 1)[:, ::-1].copy())]
    out, _ = _compare(torch_outs[:1], transposed_wrong)
    assert not out[0].ok


def test_a_square_transposition_is_not_guessed():
    """B×84×84 against B×84×84 pairs as it is (by shape): the layout cannot be told."""
    a = rng.standard_normal((1, 84, 84)).astype(np.float32)
    assert not transposed(a.transpose(0, 2, 1), a)
    out, _ = _compare([("0", a)], [("0", np.ascontiguousarray(a.transpose(0, 2, 1)))])
    assert out[0].layout is None and not out[0].ok


def test_leftovers_of_unequal_number_are_not_paired_by_position():
    """A MindYOLO v10 head's top-k detections (B×300×6) have no counterpart among
    ultralytics' raw outputs: not compared, said, never a FAIL by position."""
    torch_outs, ms_outs = _detector()
    ms_outs[0] = ("0", rng.standard_normal((1, 300, 6)).astype(np.float32))
    out, notes = _compare(torch_outs, ms_outs)
    assert {o.name for o in out} == {"1.{boxes,scores}"} and all(o.ok for o in out)
    assert any("MindSpore 0" in n for n in notes if "no counterpart" in n)


def test_groups_join_only_what_shares_every_other_size():
    maps = [("1.0", np.zeros((1, 144, 4, 4))), ("1.1", np.zeros((1, 144, 2, 2))),
            ("1.2", np.zeros((1, 80, 1, 1)))]
    assert groups(maps) == []  # one map of another channel count: no join
    assert groups(maps[:2]) == [Joined("1", ("1.0", "1.1"), flatten=True)]
    assert groups([("0", np.zeros((1, 3, 5)))]) == []  # no parent
