"""An output that overflows on the input, at the same positions on both sides.

A detector's box decoding takes ``exp`` of its regression output; with random weights and
a noise input it overflows to Inf. When PyTorch and MindSpore overflow at the same
positions and agree everywhere else, the conversion is not shown wrong there — what the
network computes at those positions just cannot be compared: INCONCLUSIVE, saying what to
feed. A difference in the finite values, or Inf on one side only, still FAILs.
"""

from __future__ import annotations

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")
torch = pytest.importorskip("torch")

from ms_port.check.parity import run_parity  # noqa: E402


class TorchDecode(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.reg = torch.nn.Linear(2, 4)

    def forward(self, x):
        return torch.exp(self.reg(x))


class MsDecode(ms.nn.Cell):
    def __init__(self):
        super().__init__()
        self.reg = ms.nn.Dense(2, 4)

    def construct(self, x):
        return ms.ops.exp(self.reg(x))


def twins(edit=None):
    weight = np.array([[1, 0], [0, 1], [1, 1], [0.5, -0.5]], np.float32)
    bias = np.array([0, 0, 0, 95], np.float32)  # exp(95 ± a few) overflows float32
    net, twin = TorchDecode(), MsDecode()
    with torch.no_grad():
        net.reg.weight.copy_(torch.from_numpy(weight))
        net.reg.bias.copy_(torch.from_numpy(bias))
    if edit:
        weight, bias = edit(weight.copy(), bias.copy())
    twin.reg.weight.set_data(ms.Tensor(weight))
    twin.reg.bias.set_data(ms.Tensor(bias))
    return net, twin


def check(net, twin):
    return run_parity(net, twin, correspondence=[("reg", "reg")], input_shape=(2,), batch=8)


def test_the_same_overflow_on_both_sides_is_inconclusive_saying_why():
    report = check(*twins())
    (out,) = report.outputs
    assert out.torch_inf_count == out.ms_inf_count == 8  # the 4th value of every sample
    assert out.status == "overflow" and out.ok and out.error < out.bound
    assert report.verdict == "INCONCLUSIVE", report.message
    assert "not finite at the same 8 position(s) on both sides" in report.message
    assert "--input" in report.message


def test_a_difference_in_the_finite_values_still_fails():
    def wrong(weight, bias):
        weight[0] = weight[0][::-1].copy()  # a row changed: finite values differ
        return weight, bias

    report = check(*twins(wrong))
    assert report.verdict == "FAIL"
    assert report.outputs[0].status == "fail"
    assert "where both sides are finite" in report.message


def test_an_overflow_on_one_side_only_still_fails():
    def lower(weight, bias):
        bias[3] = 0.0  # MindSpore finite where PyTorch overflows
        return weight, bias

    report = check(*twins(lower))
    assert report.verdict == "FAIL"
    assert "PyTorch output 0 holds 8 Inf" in report.message
