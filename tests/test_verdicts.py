"""Verdicts tested both ways, on realistic weights (BatchNorm statistics estimated on data)
and on networks whose output barely depends on the input.

Every wrong conversion must FAIL and name the layer and the tensor — or, where the network
cannot show it, be INCONCLUSIVE. It is never a PASS.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")
torch = pytest.importorskip("torch")

import verify_nets as vn  # noqa: E402
from click.testing import CliRunner  # noqa: E402

import ms_port  # noqa: E402
from ms_port.check.parity import run_parity  # noqa: E402
from ms_port.cli import main  # noqa: E402
from ms_port.errors import DeviceError  # noqa: E402
from ms_port.testing import rewrite_checkpoint  # noqa: E402


def _convert(tmp: Path, net: torch.nn.Module, name: str) -> tuple[Path, Path]:
    pth, ckpt = tmp / f"{name}.pth", tmp / f"{name}.ckpt"
    torch.save(net.state_dict(), pth)
    report = ms_port.convert(pth, ms_model=vn.MsNet, mapping="resnet", output=ckpt)
    assert report.ok, report.plan.problems()
    return pth, ckpt


@pytest.fixture(scope="module")
def nets(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    tmp = tmp_path_factory.mktemp("verdicts")
    return {name: _convert(tmp, make(), name) for name, make in
            (("realistic", vn.realistic), ("insensitive", vn.insensitive),
             ("zero_head", vn.zero_head))}


def _verify(pth: Path, ckpt: Path, **kw):
    kw.setdefault("ms_model", vn.MsNet)
    kw.setdefault("torch_model", vn.TorchNet)
    return ms_port.verify(pth, ckpt, mapping="resnet",
                          input_shape=vn.SHAPE, batch=2, **kw)


def _swap(a_name: str, b_name: str):
    def edit(a):
        a[a_name], a[b_name] = a[b_name].copy(), a[a_name].copy()
    return edit


def _roll_rows(a):
    a["end_point.weight"] = np.roll(a["end_point.weight"], 1, axis=0)


def _transpose_square(a):
    w = a["layer1.0.conv2.weight"]
    a["layer1.0.conv2.weight"] = np.ascontiguousarray(w.transpose(1, 0, 2, 3))


def _nan(a):
    a["layer1.0.conv1.weight"][0, 0, 0, 0] = np.nan


WRONG = {
    "swapped-mean-var": (_swap("layer1.0.bn2.moving_mean", "layer1.0.bn2.moving_variance"),
                         "layer1.0.bn2", "layer1.0.bn2.moving_mean"),
    "swapped-gamma-beta": (_swap("bn1.gamma", "bn1.beta"), "bn1", "bn1.gamma"),
    "rolled-classifier": (_roll_rows, "end_point", "end_point.weight"),
    "transposed-square": (_transpose_square, "layer1.0.conv2", "layer1.0.conv2.weight"),
    "nan-weight": (_nan, "layer1.0.conv1", "layer1.0.conv1.weight"),
}


def test_correct_realistic_conversion_passes_at_1e_5(nets):
    report = _verify(*nets["realistic"], tol=1e-5)
    assert report.verdict == "PASS", report.message
    assert report.exit_code == 0 and report.message.startswith("PASS")
    assert report.tensors is not None and report.tensors.ok  # every tensor identical
    # every layer compared, weightless ones too, with its own noise and bound
    kinds = {c.torch_kind for c in report.layers}
    assert {"Conv2d", "BatchNorm2d", "ReLU", "MaxPool2d", "AdaptiveAvgPool2d"} <= kinds
    assert all(c.status in ("ok", "insensitive") for c in report.layers)
    assert report.outputs[0].sensitivity > 10 * report.outputs[0].bound
    json.dumps(report.to_dict(), allow_nan=False)


@pytest.mark.parametrize("case", list(WRONG))
def test_wrong_conversions_fail_and_name_layer_and_tensor(nets, tmp_path, case):
    edit, layer, tensor = WRONG[case]
    pth, ckpt = nets["realistic"]
    report = _verify(pth, rewrite_checkpoint(ckpt, tmp_path / "bad.ckpt", edit))
    assert report.verdict == "FAIL", report.message
    assert report.exit_code == 1
    assert report.first_divergence is not None and report.first_divergence.ms_name == layer
    assert tensor in report.message, report.message
    if case.startswith("swapped"):  # the tensor comparison says what it holds instead
        assert f"{tensor} holds " in report.message


@pytest.mark.parametrize("case", list(WRONG))
def test_wrong_conversions_on_an_insensitive_network_never_pass(nets, tmp_path, case):
    edit = WRONG[case][0]
    pth, ckpt = nets["insensitive"]
    report = _verify(pth, rewrite_checkpoint(ckpt, tmp_path / "bad.ckpt", edit))
    assert report.verdict in ("FAIL", "INCONCLUSIVE"), report.message
    assert report.verdict == "FAIL"  # the tensor and layer comparisons still see it


def test_correct_conversion_of_an_insensitive_network_is_inconclusive(nets):
    report = _verify(*nets["insensitive"])
    assert report.verdict == "INCONCLUSIVE", report.message
    assert report.exit_code == 3
    assert "barely depends on the input" in report.message
    assert "--input" in report.message


def test_constant_output_zero_head_is_inconclusive(nets):
    report = _verify(*nets["zero_head"])
    assert report.verdict == "INCONCLUSIVE", report.message
    assert report.outputs[0].sensitivity == 0.0


def test_a_weightless_layer_that_differs_is_named(nets):
    """MindCV pads its max-pool 'same' (bottom/right only): the pool is named, not the
    next weighted layer."""
    pth, ckpt = nets["realistic"]
    report = _verify(pth, ckpt, ms_model=functools.partial(vn.MsNet, pool_pad_mode="same"))
    assert report.verdict == "FAIL"
    div = report.first_divergence
    assert div.ms_name == "maxpool" and div.weightless, div
    assert "a layer without weights" in report.message
    # and it is named for what it is: a network difference, with the fix
    assert "known network difference" in report.message and "pad_mode='pad'" in report.message
    assert report.known_differences


def test_a_block_drawn_differently_is_not_a_verdict():
    """torchvision's DenseNet applies its last ReLU after `features`, MindCV's inside it:
    the block differs, every layer inside and the output agree — PASS, with a note."""
    torch.manual_seed(0)
    tnet = torch.nn.Sequential()
    tnet.features = torch.nn.Sequential(torch.nn.Linear(6, 6))
    tnet.head = torch.nn.Linear(6, 3)
    tnet.forward = lambda x: tnet.head(torch.relu(tnet.features(x)))
    mnet = ms.nn.SequentialCell([ms.nn.Dense(6, 6), ms.nn.ReLU()])
    outer = ms.nn.Cell()
    outer.features = mnet
    outer.head = ms.nn.Dense(6, 3)
    outer.construct = lambda x: outer.head(outer.features(x))
    for (_, tp), (_, mp) in zip([*tnet.features.named_parameters(), *tnet.head.named_parameters()],
                                [*mnet.parameters_and_names(), *outer.head.parameters_and_names()]):
        mp.set_data(ms.Tensor(tp.detach().numpy()))
    report = run_parity(tnet, outer, input_shape=(6,), batch=4,
                        correspondence=[("features.0", "features.0"), ("features", "features"),
                                        ("head", "head")])
    assert report.verdict == "PASS", report.message
    assert any("draw this block's boundary differently" in n for n in report.notes)
    assert next(c for c in report.layers if c.ms == "features").status == "boundary"


def test_a_missing_kernel_is_bad_input_naming_op_cell_and_device():
    tnet = torch.nn.Sequential(torch.nn.InstanceNorm2d(3, affine=True))
    mnet = ms.nn.SequentialCell([ms.nn.InstanceNorm2d(3)])
    with pytest.raises(DeviceError, match=r"no CPU kernel for InstanceNorm in cell '0'"):
        run_parity(tnet, mnet, input_shape=(3, 4, 4), noise_floor=False)


def test_token_inputs_are_generated_in_range_and_compared(tmp_path):
    torch.manual_seed(0)
    tnet = vn.TorchTokens()
    pth = tmp_path / "tok.pth"
    torch.save(tnet.state_dict(), pth)
    ckpt = tmp_path / "tok.ckpt"
    assert ms_port.convert(pth, ms_model=vn.MsTokens, output=ckpt).ok
    runner = CliRunner()
    args = ["verify", str(pth), str(ckpt), "--torch-model", "verify_nets:TorchTokens",
            "--ms-model", "verify_nets:MsTokens", "--input-shape", "6", "--input-dtype",
            "int64", "--input-range", "0,32", "--batch", "3", "--json"]
    result = runner.invoke(main, args)
    data = json.loads(result.stdout)
    assert result.exit_code == 0, data["message"]
    assert data["inputs"][0]["dtype"] == "int64" and data["inputs"][0]["shape"] == [3, 6]
    # a wrong embedding row order fails at the embedding
    bad = rewrite_checkpoint(ckpt, tmp_path / "bad.ckpt",
                   lambda a: a.update({"embed.embedding_table":
                                       np.roll(a["embed.embedding_table"], 1, axis=0)}))
    result = runner.invoke(main, [*args[:2], str(bad), *args[3:]])
    assert result.exit_code == 1
    assert json.loads(result.stdout)["first_divergence"]["ms_name"] == "embed"


def test_real_inputs_from_a_file(nets, tmp_path):
    pth, ckpt = nets["realistic"]
    np.save(tmp_path / "x.npy", vn.rng_array((2, *vn.SHAPE), seed=5))
    report = ms_port.verify(pth, ckpt, torch_model=vn.TorchNet, ms_model=vn.MsNet,
                            mapping="resnet", inputs=tmp_path / "x.npy")
    assert report.verdict == "PASS", report.message
    assert report.inputs[0]["origin"].endswith("x.npy") and report.batch == 2


def test_html_report_is_written_and_never_clobbers(nets, tmp_path):
    pth, ckpt = nets["realistic"]
    out = tmp_path / "r.html"
    _verify(pth, ckpt, report=out)
    text = out.read_text()
    assert "<svg" in text and "PASS" in text and "layer1.0.bn2" in text
    with pytest.raises(ms_port.MsPortError, match="exists"):
        _verify(pth, ckpt, report=out)
    _verify(pth, ckpt, report=out, force=True)


def test_html_report_of_a_failure_shows_the_layer_and_what_the_tensor_holds(nets, tmp_path):
    """Built from the real report (not a hand-made dict): the first failure and the
    tensor comparison's 'holds' name must reach the page."""
    pth, ckpt = nets["realistic"]
    bad = rewrite_checkpoint(ckpt, tmp_path / "bad.ckpt", WRONG["swapped-gamma-beta"][0])
    report = _verify(pth, bad, report=tmp_path / "r.html")
    assert report.verdict == "FAIL"
    text = (tmp_path / "r.html").read_text()
    assert "<h2>First failure</h2>" in text and "<code>bn1</code>" in text
    assert "bn1.bias" in text.split("<h2>Tensors")[1]  # bn1.gamma holds bn1.bias
    assert "Conv2d" in text  # the layer kinds column is filled


def test_real_inputs_in_float64_or_bfloat16_run_in_float32(nets, tmp_path):
    import ml_dtypes

    pth, ckpt = nets["realistic"]
    x = vn.rng_array((2, *vn.SHAPE), seed=7)
    for name, array in (("x64.npy", x.astype(np.float64)),):
        np.save(tmp_path / name, array)
        report = ms_port.verify(pth, ckpt, torch_model=vn.TorchNet, ms_model=vn.MsNet,
                                mapping="resnet", inputs=tmp_path / name)
        assert report.verdict == "PASS", report.message
    from ms_port.check.inputs import InputArray

    bf16 = InputArray("input0", x.astype(ml_dtypes.bfloat16), "given array")
    report = ms_port.verify(pth, ckpt, torch_model=vn.TorchNet, ms_model=vn.MsNet,
                            mapping="resnet", inputs=[bf16])
    assert report.verdict == "PASS", report.message


def test_a_constant_output_is_never_a_pass_even_at_tol_0():
    """tol=0 and no noise run: the bound is 0; a constant output must still be caught."""
    tnet = torch.nn.Linear(4, 3)
    with torch.no_grad():
        tnet.weight.zero_()
    mnet = ms.nn.Dense(4, 3)
    mnet.weight.set_data(ms.Tensor(np.zeros((3, 4), np.float32)))
    mnet.bias.set_data(ms.Tensor(tnet.bias.detach().numpy()))
    report = run_parity(tnet, mnet, input_shape=(4,), batch=2, tol=0.0, noise_floor=False)
    assert report.verdict == "INCONCLUSIVE", report.message


def test_a_lone_output_pairs_with_its_shape_not_the_name_0():
    """PyTorch returns (features, logits), MindSpore logits alone: both are named '0' by
    position, but only the logits can be compared."""
    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 5)

        def forward(self, x):
            return x[:, :3], self.fc(x)

    tnet = Two()
    mnet = ms.nn.Dense(4, 5)
    mnet.weight.set_data(ms.Tensor(tnet.fc.weight.detach().numpy()))
    mnet.bias.set_data(ms.Tensor(tnet.fc.bias.detach().numpy()))
    report = run_parity(tnet, mnet, input_shape=(4,), batch=4, correspondence=[])
    assert report.verdict == "PASS", report.message
    assert [(o.name, o.ms_name) for o in report.outputs] == [("1", "0")]


def _climb(ratios, noise=1e-6, tol=0.0):
    """Layers whose error is `ratio × noise`, judged in order as verify judges them."""
    from ms_port.check.verdict import Drift
    drift, layers = Drift(), []
    for i, r in enumerate(ratios):
        bound, status, _applied = drift.judge(f"l{i}", r * noise, noise, None, tol=tol)
        layers.append(SimpleNamespace(status=status, bound=bound))
    return drift, layers


def test_rounding_that_compounds_gradually_passes_where_a_fixed_bound_fails():
    """MindSpore's biased sigmoid makes EfficientNet's error/noise climb to ~12-17 over the
    depth, never more than 2× at a step: each bound follows the drift reached before it."""
    from ms_port.check.verdict import K
    ratios = [0.9, 1.8, 3.0, 2.5, 5.0, 4.0, 8.0, 9.5, 12.0]
    drift, layers = _climb(ratios)
    assert all(c.status == "ok" for c in layers)
    assert drift.ratio == drift.peak == 12.0 and drift.where == "l8"
    assert [r for r in ratios if r > K]  # a fixed 4× bound would have failed these


def test_a_departure_within_the_bound_does_not_raise_the_drift_and_is_named():
    """A small network difference (a BatchNorm epsilon) lifts the ratio 3.5× at once: it
    passes its own bound but may not ratchet the drift, so where it compounds it FAILs and
    the layer it began at is named."""
    drift, layers = _climb([1.0, 1.2, 4.0, 4.3, 4.6, 5.0])
    assert [c.status for c in layers] == ["ok", "ok", "ok", "ok", "ok", "fail"]
    assert drift.ratio == 1.2
    assert drift.departure.startswith("l2: 4× its noise against a drift of 1.2")


def test_a_return_to_the_climb_clears_the_departure():
    drift, layers = _climb([1.0, 3.5, 1.5, 2.0, 9.0])
    assert layers[-1].status == "fail" and drift.departure is None


def test_the_drift_relaxes_to_the_level_of_the_layers_since_a_peak():
    """A spike of the ratio in a side branch (a squeeze-and-excitation's pooled vector in
    EfficientNet: 14× while the trunk stays near 5×) must not loosen every layer after it:
    measured on EfficientNet-B0 with one BatchNorm's epsilon 1e-5 -> 1e-4 deep inside, the
    changed layer (42× the noise against a trunk at 5.4×) passed under a drift held at 14
    and the run failed only at the output, by 1.1×; relaxed, it FAILs at that very layer."""
    climb = [1.0, 2.0, 4.0, 7.0, 14.0]
    trunk = [5.4] * 70
    drift, layers = _climb([*climb, *trunk, 41.6])
    assert layers[-1].status == "fail"
    assert all(c.status == "ok" for c in layers[:-1])
    assert drift.peak == 14.0 and drift.where == "l4" and drift.ratio == 5.4
    # a climb that stays high keeps its level: the next 2× step still passes
    drift, layers = _climb([*climb, *[12.0] * 100, 22.0])
    assert all(c.status == "ok" for c in layers) and drift.ratio == 22.0


def test_the_drift_is_capped():
    from ms_port.check.verdict import DRIFT_CAP, K
    ratios = [1.0 * 1.9 ** i for i in range(12)]  # 1 … 1.2e3, each step 1.9×
    drift, layers = _climb(ratios)
    assert drift.ratio == DRIFT_CAP
    assert layers[-1].status == "fail" and layers[-1].bound == K * DRIFT_CAP * 1e-6


def test_layers_bounded_by_tol_say_nothing_about_rounding():
    drift, layers = _climb([50.0, 1.5], tol=1e-4)  # 5e-5 < tol: passes, but not as rounding
    assert layers[0].status == "ok" and drift.ratio == 1.5 and drift.departure is None


class _NoFloat64(vn.TorchNet):
    """A PyTorch side whose float64 forward fails (a user's wrapper that casts its input
    to float32, a kernel with no float64): the noise that sets each bound is unknown."""

    def forward(self, x):
        if x.dtype == torch.float64:
            raise RuntimeError("expected scalar type Float but found Double")
        return super().forward(x)


def test_without_the_noise_a_near_miss_is_inconclusive_never_a_silent_tol_fail(nets):
    """A miss of tol within what rounding reaches says the bound was not known; a miss far
    past it is still a FAIL, saying which bound it used and why."""
    report = _verify(*nets["realistic"], torch_model=_NoFloat64, tol=1e-9)
    assert report.verdict == "INCONCLUSIVE", report.message
    assert "not measured" in report.message and "float64" in report.message
    assert report.exit_code == 3
    pth, ckpt = nets["realistic"]
    bad = rewrite_checkpoint(ckpt, Path(ckpt).with_name("bad-bn.ckpt"),
                             _swap("layer1.0.bn2.moving_mean", "layer1.0.bn2.moving_variance"))
    failed = _verify(pth, bad, torch_model=_NoFloat64, tol=1e-9)
    assert failed.verdict == "FAIL"
    assert "bound: tol 1e-09 alone (the float32 noise was not measured" in failed.message
    # an early layer's rounding above tol is no divergence: the first past rounding is named
    assert "first divergence at layer1.0.bn2" in failed.message
    # with the noise measured, the right conversion passes at the same tol: the noise is
    # what tells rounding from error
    assert _verify(*nets["realistic"], tol=1e-9).verdict == "PASS"
