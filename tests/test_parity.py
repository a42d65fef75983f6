"""The verify engine: tiny twin networks, copied exactly or broken on purpose.

Each test builds a small PyTorch net and its MindSpore twin (MindSpore names:
gamma/beta/moving_mean/moving_variance, ``end_point`` for the classifier), copies the
weights across, optionally breaks one tensor, and checks what :func:`run_parity` says.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")
torch = pytest.importorskip("torch")

from verify_nets import MsBlock, TorchBlock  # noqa: E402  (the same residual block)

from ms_port.check import devices  # noqa: E402
from ms_port.check.parity import (  # noqa: E402
    ERROR_DEFINITION,
    Divergence,
    ParityReport,
    correspondence_from_pairs,
    run_parity,
)
from ms_port.errors import DeviceError, ParityError  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHAPE = (3, 8, 8)
CLASSES = 5

# torch suffix -> MindSpore suffix for BatchNorm; the classifier is renamed fc -> end_point
BN_SUFFIX = {"weight": "gamma", "bias": "beta", "running_mean": "moving_mean",
             "running_var": "moving_variance"}


# --- the twin networks ------------------------------------------------------------------


class TorchNet(torch.nn.Module):
    def __init__(self, classes: int = CLASSES):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 4, 3, stride=2, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(4)
        self.relu = torch.nn.ReLU(inplace=True)
        self.layer1 = torch.nn.Sequential(TorchBlock(4))
        self.pool = torch.nn.AdaptiveAvgPool2d(1)
        self.fc = torch.nn.Linear(4, classes)

    def forward(self, x):
        x = self.layer1(self.relu(self.bn1(self.conv1(x))))
        return self.fc(torch.flatten(self.pool(x), 1))


class MsNet(ms.nn.Cell):
    def __init__(self, classes: int = CLASSES):
        super().__init__()
        self.conv1 = ms.nn.Conv2d(3, 4, 3, stride=2, pad_mode="pad", padding=1, has_bias=False)
        self.bn1 = ms.nn.BatchNorm2d(4)
        self.relu = ms.nn.ReLU()
        self.layer1 = ms.nn.SequentialCell([MsBlock(4)])
        self.pool = ms.nn.AdaptiveAvgPool2d(1)
        self.end_point = ms.nn.Dense(4, classes)

    def construct(self, x):
        x = self.layer1(self.relu(self.bn1(self.conv1(x))))
        return self.end_point(ms.ops.flatten(self.pool(x)))


class TorchMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 8)
        self.act = torch.nn.Tanh()
        self.fc2 = torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class MsMLP(ms.nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1 = ms.nn.Dense(6, 8)
        self.act = ms.nn.Tanh()
        self.fc2 = ms.nn.Dense(8, 3)

    def construct(self, x):
        return self.fc2(self.act(self.fc1(x)))


def ms_name(torch_name: str) -> str:
    """The MindSpore parameter name of a torch state-dict key in these twins."""
    module, _, suffix = torch_name.rpartition(".")
    if module.rpartition(".")[2].startswith("bn"):
        suffix = BN_SUFFIX[suffix]
    if module == "fc":
        module = "end_point"
    return f"{module}.{suffix}"


def copy_weights(torch_net, ms_net, edit=None) -> list[tuple[str, str]]:
    """Copy torch weights into the MindSpore twin; ``edit(ms_name, array)`` may break one.

    Returns the (mindspore_name, torch_name) pairs, as a conversion Plan would.
    """
    params = dict(ms_net.parameters_and_names())
    pairs = []
    for name, tensor in torch_net.state_dict().items():
        if name.endswith("num_batches_tracked"):
            continue
        target = ms_name(name) if isinstance(ms_net, MsNet) else name
        array = tensor.detach().numpy().copy()
        if edit is not None:
            array = edit(target, array)
        if tuple(params[target].shape) == array.shape:
            params[target].set_data(ms.Tensor(array))
        pairs.append((target, name))
    return pairs


def make_twins(edit=None, *, classes: int = CLASSES, seed: int = 0):
    """A torch net with BN statistics moved off 0/1, and its MindSpore copy."""
    torch.manual_seed(seed)
    net = TorchNet(classes=CLASSES)
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for module in net.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                n = module.num_features
                # positive means, so a mean/variance swap stays finite (no sqrt of < 0)
                module.running_mean.copy_(torch.from_numpy(rng.uniform(0.2, 1.0, n)))
                module.running_var.copy_(torch.from_numpy(rng.uniform(0.5, 2.0, n)))
                module.weight.copy_(torch.from_numpy(rng.uniform(0.5, 1.5, n)))
                module.bias.copy_(torch.from_numpy(rng.uniform(-0.5, 0.5, n)))
    twin = MsNet(classes=classes)
    pairs = copy_weights(net, twin, edit)
    return net, twin, correspondence_from_pairs(pairs)


def parity(net, twin, corr=None, **kw) -> ParityReport:
    kw.setdefault("input_shape", SHAPE)
    kw.setdefault("batch", 2)
    return run_parity(net, twin, correspondence=corr, **kw)


# --- correct copies pass ----------------------------------------------------------------


def test_exact_copy_passes_with_error_at_rounding_level():
    net, twin, corr = make_twins()
    steps = []
    report = parity(net, twin, corr, progress=steps.append)
    assert report.ok, report.message
    assert report.error < 1e-6  # float32 rounding, far below tol
    assert report.noise_floor is not None and 0 < report.noise_floor < 1e-5
    assert report.first_divergence is None
    assert report.message.startswith("PASS: 1 output and ")
    assert report.verdict == "PASS" and report.exit_code == 0
    (out,) = report.outputs
    assert out.ms_shape == out.torch_shape == (2, CLASSES)
    assert out.top1_agreement == 1.0 and out.cosine == pytest.approx(1.0)
    assert out.ms_nan_count == out.torch_nan_count == 0
    assert {"torch_forward", "mindspore_forward", "torch_float64_forward",
            "torch_second-input_forward"} <= set(report.timings)
    assert steps == ["checking weights for NaN/Inf", "torch forward",
                     "torch float64 forward (noise)", "torch second-input forward (sensitivity)",
                     "mindspore forward"]
    # every layer compared, weightless ones too (ReLU calls, pooling), each with its noise
    assert report.layers_checked == len(report.layers) >= 10
    assert all(c.noise is not None and c.bound >= report.tol for c in report.layers)
    assert {c.torch_kind for c in report.layers} >= {"Conv2d", "BatchNorm2d", "ReLU"}
    data = report.to_dict()
    json.dumps(data, allow_nan=False)
    assert {"ok", "max_abs", "error", "tol", "first_divergence"} <= set(data)
    assert data["first_divergence"] is None and data["ok"] is True
    assert repr(report).startswith("ParityReport(PASS, ok=True, error=")


def test_same_seed_same_input_and_batch_recorded():
    net, twin, corr = make_twins()
    a = parity(net, twin, corr, seed=7, batch=3, noise_floor=False)
    b = parity(net, twin, corr, seed=7, batch=3, noise_floor=False)
    assert a.error == b.error and a.batch == 3 and a.seed == 7
    assert a.noise_floor is None and a.input_shape == SHAPE


def test_tuple_outputs_are_compared_one_by_one():
    net, twin, _ = make_twins()

    class TorchPair(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, x):
            y = self.net(x)
            return y, [y * 2]

    class MsPair(ms.nn.Cell):
        def __init__(self):
            super().__init__()
            self.net = twin

        def construct(self, x):
            y = self.net(x)
            return y, y * 2

    report = parity(TorchPair(), MsPair())
    assert report.ok and [o.index for o in report.outputs] == [0, 1]


# --- broken copies fail and are located -------------------------------------------------


@pytest.mark.parametrize("sign", [
    pytest.param(1, id="finite"),
    # a negative mean as variance: MindSpore's BN gives NaN, its ReLU turns them into 0
    pytest.param(-1, id="negative-variance"),
])
def test_swapped_bn_statistics_located_at_that_bn(sign):
    def swap(name, array):
        # moving_mean <- running_var and moving_variance <- running_mean in one BN
        if name == "layer1.0.bn2.moving_mean":
            return torch_stats["running_var"]
        if name == "layer1.0.bn2.moving_variance":
            return sign * torch_stats["running_mean"]
        return array

    reference, _, _ = make_twins()  # make_twins is deterministic
    torch_stats = {k: v.numpy().copy()
                   for k, v in reference.layer1[0].bn2.state_dict().items()}
    net, twin, corr = make_twins(swap)
    report = parity(net, twin, corr)
    assert not report.ok
    assert report.error > 1e-2
    div = report.first_divergence
    assert isinstance(div, Divergence)
    assert (div.ms_name, div.torch_name) == ("layer1.0.bn2", "layer1.0.bn2")
    assert div.ms_block == "layer1.0" and div.nan == (sign < 0) and div.error > 1e-2
    assert "first divergence at layer1.0.bn2 (" in report.message
    assert "in block layer1.0" in report.message
    assert report.to_dict()["first_divergence"]["ms_name"] == "layer1.0.bn2"


def test_rolled_classifier_rows_located_at_classifier():
    def roll(name, array):
        return np.roll(array, 1, axis=0) if name == "end_point.weight" else array

    net, twin, corr = make_twins(roll)
    report = parity(net, twin, corr)
    assert not report.ok
    div = report.first_divergence
    assert (div.ms_name, div.torch_name) == ("end_point", "fc")
    assert "first divergence at end_point (PyTorch: fc; error" in report.message
    assert report.outputs[0].top1_agreement is not None


@pytest.mark.parametrize(("weight", "layer", "reaches_output"), [
    pytest.param("end_point.weight", ("end_point", "fc"), True, id="classifier"),
    # MindSpore's ReLU maps NaN to 0 (PyTorch's keeps it): the outputs agree, the
    # weight check still fails the run
    pytest.param("layer1.0.conv1.weight", ("layer1.0.conv1", "layer1.0.conv1"), False,
                 id="masked-by-relu"),
])
def test_nan_weight_never_passes_even_with_infinite_tol(weight, layer, reaches_output):
    def poison(name, array):
        if name == weight:
            array.flat[0] = np.nan
        return array

    net, twin, corr = make_twins(poison)
    report = parity(net, twin, corr, tol=float("inf"))
    assert not report.ok
    assert report.nonfinite_weights == [f"MindSpore {weight}: 1 NaN"]
    assert f"weights hold NaN/Inf: MindSpore {weight}: 1 NaN" in report.message
    out = report.outputs[0]
    assert (out.ms_nan_count > 0) == reaches_output and out.torch_nan_count == 0
    div = report.first_divergence
    assert (div.ms_name, div.torch_name) == layer and div.nan
    assert f"first divergence at {layer[0]} (" in report.message and "NaN/Inf)" in report.message
    data = report.to_dict()
    json.dumps(data, allow_nan=False)
    if reaches_output:
        assert "MindSpore output 0 holds" in report.message
        assert data["error"] is None and data["outputs"][0]["ms_nan_count"] == out.ms_nan_count


def test_different_output_shapes_fail_clearly():
    net, twin, corr = make_twins(classes=CLASSES + 1)
    report = parity(net, twin, corr)
    assert not report.ok
    assert "output 0: shapes differ: MindSpore 2×6 vs PyTorch 2×5" in report.message
    assert report.outputs[0].problem.startswith("output 0: shapes differ")
    assert report.outputs[0].top1_agreement is None
    # every layer before the classifier agrees; the classifier cannot be compared
    assert report.first_divergence is None
    assert any("end_point (PyTorch: fc): shapes differ: MindSpore 2×6 vs PyTorch 2×5" in n
               for n in report.notes), report.notes


def test_graph_mode_network_is_compared_and_located():
    def swap(name, array):
        return array[::-1].copy() if name == "layer1.0.bn2.moving_variance" else array

    net, twin, corr = make_twins(swap)
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        report = parity(net, twin, corr)
        # hooks need PyNative: the search switches there and back
        assert ms.get_context("mode") == ms.GRAPH_MODE
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    assert report.first_divergence.ms_name == "layer1.0.bn2"


def test_default_correspondence_pairs_same_named_layers():
    def swap(name, array):
        return array[::-1].copy() if name == "bn1.moving_variance" else array

    net, twin, _ = make_twins(swap)
    report = parity(net, twin)  # correspondence=None: same paths on both sides
    assert report.first_divergence.ms_name == "bn1"
    assert report.first_divergence.ms_block is None
    assert "first divergence at bn1 (error" in report.message


def test_without_names_leaf_layers_pair_by_order_and_shape():
    """No plan pairs: same-named layers pair by name, the rest (the classifier, named
    end_point vs fc) by execution order and output shape — the rolled rows are found."""
    def roll(name, array):
        return np.roll(array, 1, axis=0) if name == "end_point.weight" else array

    net, twin, _ = make_twins(roll)
    report = parity(net, twin, [])
    assert report.verdict == "FAIL" and report.layers_checked > 0
    div = report.first_divergence
    assert (div.ms_name, div.torch_name) == ("end_point", "fc")
    assert next(c for c in report.layers if c.ms == "end_point").paired_by == "order"


def test_without_any_layer_pairing_the_message_says_how_to_locate():
    def roll(name, array):
        return np.roll(array, 1, axis=0) if name == "end_point.weight" else array

    net, twin, _ = make_twins(roll)
    report = parity(net, twin, [], layers=False)
    assert report.verdict == "FAIL" and report.first_divergence is None
    assert report.layers_checked == 0 and "no layers were paired" in report.message


# --- float64 ------------------------------------------------------------------------------


def test_float64_runs_where_mindspore_has_kernels():
    torch.manual_seed(0)
    net, twin = TorchMLP(), MsMLP()
    copy_weights(net, twin)
    report = run_parity(net, twin, input_shape=(6,), batch=4, dtype="float64", tol=1e-12)
    assert report.ok, report.message
    assert report.error < 1e-13 and report.dtype == "float64"
    assert report.noise_floor > report.error  # float32 rounding, for contrast
    # the caller's models keep their dtype
    assert net.fc1.weight.dtype == torch.float32
    assert all(p.dtype == ms.float32 for p in twin.get_parameters())


def test_float64_refused_clearly_for_conv_nets():
    net, twin, corr = make_twins()
    with pytest.raises(ParityError, match=r"kernel for Conv2D has no float64 .*'conv1'.*"
                                          r"dtype='float32'"):
        parity(net, twin, corr, dtype="float64")
    assert all(p.dtype == ms.float32 for p in twin.get_parameters())
    assert parity(net, twin, corr).ok  # the net still works afterwards


# --- devices and arguments ----------------------------------------------------------------


def test_mindspore_gpu_refused_by_cpu_build():
    net, twin, corr = make_twins()
    with pytest.raises(DeviceError, match=r"MindSpore side: device GPU not supported by "
                                          r"this MindSpore build \(it supports CPU\)"):
        parity(net, twin, corr, ms_device="gpu")
    assert ms.get_context("device_target") == "CPU"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_torch_gpu_without_cuda_refused():
    net, twin, corr = make_twins()
    with pytest.raises(DeviceError, match=r"PyTorch side: no CUDA device available"):
        parity(net, twin, corr, torch_device="gpu")


def test_torch_ascend_refused():
    net, twin, corr = make_twins()
    with pytest.raises(DeviceError, match=r"PyTorch side: device 'ascend' is not supported"):
        parity(net, twin, corr, torch_device="ascend")


@pytest.mark.parametrize(("kw", "match"), [
    ({"dtype": "float16"}, r"unknown dtype 'float16'; choose one of: float32, float64"),
    ({"batch": 0}, r"batch must be at least 1"),
    ({"tol": float("nan")}, r"tol must be a number >= 0"),
    ({"input_shape": (3, 0, 8)}, r"input_shape must be positive integers"),
])
def test_bad_arguments(kw, match):
    net, twin, corr = make_twins()
    with pytest.raises(ParityError, match=match):
        parity(net, twin, corr, **kw)


def test_forward_failure_names_the_layer():
    net, twin, corr = make_twins()
    with pytest.raises(ParityError, match=r"PyTorch forward failed in module 'conv1'"):
        parity(net, twin, corr, input_shape=(5, 8, 8))


# --- correspondence_from_pairs ------------------------------------------------------------


def test_correspondence_from_resnet_style_pairs():
    pairs = [
        ("conv1.weight", "conv1.weight"),
        ("bn1.gamma", "bn1.weight"),
        ("layer1.0.conv1.weight", "layer1.0.conv1.weight"),
        ("layer1.0.down_sample_layer.0.weight", "layer1.0.downsample.0.weight"),
        ("layer1.0.down_sample_layer.1.gamma", "layer1.0.downsample.1.weight"),
        ("layer1.0.down_sample_layer.1.moving_mean", "layer1.0.downsample.1.running_mean"),
        ("layer3.2.bn2.gamma", "layer3.2.bn2.weight"),
        ("layer3.2.bn2.moving_variance", "layer3.2.bn2.running_var"),
        ("end_point.weight", "fc.weight"),
        ("end_point.bias", "fc.bias"),
    ]
    assert correspondence_from_pairs(pairs) == [
        ("conv1", "conv1"),
        ("bn1", "bn1"),
        ("layer1.0.conv1", "layer1.0.conv1"),
        ("layer1.0.down_sample_layer.0", "layer1.0.downsample.0"),
        ("layer1.0.down_sample_layer.1", "layer1.0.downsample.1"),
        ("layer1.0.down_sample_layer", "layer1.0.downsample"),
        ("layer1.0", "layer1.0"),
        ("layer1", "layer1"),
        ("layer3.2.bn2", "layer3.2.bn2"),
        ("layer3.2", "layer3.2"),
        ("layer3", "layer3"),
        ("end_point", "fc"),
    ]


def test_correspondence_drops_ambiguous_blocks_and_root_params():
    pairs = [
        ("a.x.weight", "p.x.weight"),
        ("a.y.weight", "q.y.weight"),  # 'a' would pair with both 'p' and 'q'
        ("head.proj.weight", "proj.weight"),  # depths differ: no block
        ("scale", "scale"),  # root-level parameter: no layer
    ]
    assert correspondence_from_pairs(pairs) == [
        ("a.x", "p.x"), ("a.y", "q.y"), ("head.proj", "proj"),
    ]


# --- the module stays light ---------------------------------------------------------------


def test_import_does_not_load_frameworks():
    code = ("import sys, ms_port.check.parity as p; "
            "assert 'torch' not in sys.modules and 'mindspore' not in sys.modules; "
            "print(p.ERROR_DEFINITION)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == ERROR_DEFINITION


def test_pass_far_above_the_noise_floor_gets_a_note():
    """LayerNorm epsilon differs by default (MindSpore 1e-7, PyTorch 1e-5): a real but
    small mismatch that may pass the tolerance must not pass silently."""
    import mindspore as ms
    import torch
    from mindspore import nn

    from ms_port.check.parity import run_parity

    torch.manual_seed(0)
    tnet = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
    mnet = nn.SequentialCell([nn.Dense(8, 8), nn.LayerNorm((8,))])  # epsilon 1e-7
    sd = tnet.state_dict()
    names = {"0.weight": "0.weight", "0.bias": "0.bias", "1.weight": "1.gamma",
             "1.bias": "1.beta"}
    ms.load_param_into_net(mnet, {m: ms.Parameter(ms.Tensor(sd[t].numpy()), name=m)
                                  for t, m in names.items()})
    report = run_parity(tnet, mnet, input_shape=(8,), batch=4, tol=1e-3,
                        correspondence=[])
    assert report.ok and report.noise_floor is not None
    assert report.error > 10 * report.noise_floor
    assert any("noise floor" in n and "LayerNorm epsilon" in n for n in report.notes)


def test_order_pairing_takes_a_weightless_composite_as_one_unit():
    """MindCV's Swish is a Cell holding a Sigmoid; torch's SiLU is one module. The unit
    paired by order is the Swish (its output), never the Sigmoid inside it."""
    import torch
    from mindspore import nn, ops

    from ms_port.check.layers import units

    class Swish(nn.Cell):
        def __init__(self):
            super().__init__()
            self.sigmoid = nn.Sigmoid()

        def construct(self, x):
            return x * self.sigmoid(x)

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc = nn.Dense(4, 4)
            self.act = Swish()

        def construct(self, x):
            return ops.relu(self.act(self.fc(x)))

    ms_units = units(Net(), torch_side=False)
    assert ms_units == {"fc", "act"}  # not "act.sigmoid"
    module = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.SiLU())
    assert units(module, torch_side=True) == {"0", "1"}


# --- CPU kernels ---------------------------------------------------------------------------

_CONV = """
import sys
from ms_port.check.devices import cpu_kernels_note, prefer_fast_cpu_kernels
import numpy as np, mindspore as ms
conv = ms.nn.Conv2d(8, 8, 3, pad_mode="pad", padding=1)
x = ms.Tensor(np.ones((1, 8, 8, 8), np.float32))
if sys.argv[1] == "late":  # oneDNN has read its limit by now
    conv(x).asnumpy()
if sys.argv[1] != "uncapped":
    prefer_fast_cpu_kernels()
conv(x).asnumpy()
print("note:", cpu_kernels_note())
"""


def _conv_kernels(mode: str) -> tuple[list[str], str]:
    env = {k: v for k, v in os.environ.items() if k not in devices.ISA_VARS}
    env["ONEDNN_VERBOSE"] = "1"
    out = subprocess.run([sys.executable, "-c", _CONV, mode], env=env, capture_output=True,
                         text=True, timeout=300, check=True).stdout
    kernels = [line.split(",")[6] for line in out.splitlines()
               if line.startswith("onednn_verbose") and ",exec,cpu,convolution," in line]
    return kernels, out.rpartition("note: ")[2].strip()


def test_cpu_cap_keeps_mindspore_convolutions_off_onednn_reference_kernel():
    """The reason for the cap, held on this machine: uncapped on an AVX-512 CPU, MindSpore's
    NCHW convolution runs oneDNN's reference kernel (100x slower); capped in time, it does
    not, and the report says which limit was in force, or that it came too late."""
    capped, note = _conv_kernels("capped")
    assert capped and not any("ref" in k for k in capped), capped
    assert note == "MindSpore's CPU kernels: oneDNN limited to AVX2 (ONEDNN_MAX_CPU_ISA)"
    if devices._avx512():
        uncapped, note = _conv_kernels("uncapped")
        assert any("ref" in k for k in uncapped)
        assert "set ONEDNN_MAX_CPU_ISA=AVX2 before" in note
        late, note = _conv_kernels("late")
        assert all("ref" in k for k in late), late
        assert note.startswith("ONEDNN_MAX_CPU_ISA=AVX2 was set after oneDNN's first "
                               "operation in this process"), note


def test_cpu_cap_set_only_where_unset_and_reported(monkeypatch):
    for var in devices.ISA_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(devices, "_avx512", lambda: True)
    assert "set ONEDNN_MAX_CPU_ISA=AVX2" in devices.cpu_kernels_note()
    monkeypatch.setattr(devices, "_avx512", lambda: False)
    assert devices.cpu_kernels_note() is None
    assert devices.prefer_fast_cpu_kernels() is True
    assert os.environ[devices.ONEDNN_ISA] == "AVX2"
    assert devices.prefer_fast_cpu_kernels() is False
    monkeypatch.setenv(devices.ONEDNN_ISA, "AVX512_CORE")  # the user's choice stands
    assert devices.prefer_fast_cpu_kernels() is False
    assert os.environ[devices.ONEDNN_ISA] == "AVX512_CORE"
    net, twin, corr = make_twins()
    assert ("MindSpore's CPU kernels: oneDNN limited to AVX512_CORE (ONEDNN_MAX_CPU_ISA)"
            in parity(net, twin, corr).notes)
    monkeypatch.delenv(devices.ONEDNN_ISA)
    monkeypatch.setenv("DNNL_MAX_CPU_ISA", "SSE41")  # the older name is a choice too
    assert devices.prefer_fast_cpu_kernels() is False
    assert devices.ONEDNN_ISA not in os.environ
    assert devices.cpu_kernels_note() == ("MindSpore's CPU kernels: oneDNN limited to SSE41 "
                                          "(DNNL_MAX_CPU_ISA)")


# --- where the shapes part ------------------------------------------------------------------


def test_a_pool_rounding_its_size_the_other_way_is_named_where_the_shapes_part():
    """torchvision's SqueezeNet pools with ceil_mode=True, MindCV's does not: every layer
    after the pool has another shape, so the first comparable layer (the head) is where it
    fails. The report must say where the shapes part, and why."""
    import torch.nn as tnn

    class T(tnn.Module):
        def __init__(self):
            super().__init__()
            self.conv = tnn.Conv2d(3, 4, 3, padding=1)
            self.pool = tnn.MaxPool2d(3, 2, ceil_mode=True)
            self.head = tnn.Linear(4, 5)

        def forward(self, x):
            return self.head(self.pool(self.conv(x)).mean((2, 3)))

    class M(ms.nn.Cell):
        def __init__(self):
            super().__init__()
            self.conv = ms.nn.Conv2d(3, 4, 3, pad_mode="pad", padding=1, has_bias=True)
            self.pool = ms.nn.MaxPool2d(3, 2)
            self.head = ms.nn.Dense(4, 5)

        def construct(self, x):
            return self.head(self.pool(self.conv(x)).mean((2, 3)))

    torch.manual_seed(0)
    net, twin = T().eval(), M()
    for (_, t), (_, m) in zip(net.named_parameters(), twin.parameters_and_names()):
        m.set_data(ms.Tensor(t.detach().numpy()))
    report = run_parity(net, twin, input_shape=(3, 8, 8), batch=2,
                        correspondence=[("conv", "conv"), ("pool", "pool"), ("head", "head")])
    assert report.verdict == "FAIL"
    assert ("the shapes part before the first divergence, at pool (shapes differ: MindSpore"
            in report.message)
    assert "PyTorch rounds this pool's output size up (ceil_mode=True), MindSpore down" \
        in report.message


def test_outputs_in_another_layout_compare_only_as_the_same_values():
    """Channels last against channels first (ConvNeXt's blocks beside 1x1 convolutions) and
    Swin's tokens against its map compare as the same values in another order; a map whose
    values are not the reference's in that order stays over any bound, and shapes that are
    no layout of each other are not compared at all."""
    import numpy as np

    from ms_port.check.compare import comparable, relative_error

    rng = np.random.default_rng(0)
    ref = rng.standard_normal((1, 8, 4, 4)).astype(np.float32)          # N, C, H, W
    last = np.ascontiguousarray(ref.transpose(0, 2, 3, 1))              # N, H, W, C
    assert np.array_equal(comparable(last, ref), ref)
    swapped = np.ascontiguousarray(last.transpose(0, 2, 1, 3))          # H and W exchanged
    assert relative_error(comparable(swapped, ref), ref)[0] > 0.5
    tokens = rng.standard_normal((1, 16, 8)).astype(np.float32)         # N, L, C
    assert np.array_equal(comparable(tokens, tokens.reshape(1, 4, 4, 8)),
                          tokens.reshape(1, 4, 4, 8))
    assert isinstance(comparable(rng.standard_normal((1, 8, 16)).astype(np.float32),
                                 np.zeros((1, 16, 8), np.float32)), str)
