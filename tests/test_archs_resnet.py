"""The ResNet family: each MindSpore network reproduces its torchvision reference.

The conversion engine is not used here: :func:`to_mindspore_params` is a small stand-in
that applies ``mappings/resnet.yaml``'s segment renames plus the BatchNorm suffix rules,
so these tests pin the networks and the mapping table, not the engine.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")
torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")
yaml = pytest.importorskip("yaml")

from ms_port.archs import get_arch, list_archs, register_arch  # noqa: E402
from ms_port.errors import ArchError  # noqa: E402
from ms_port.testing import seeded_torch_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MAPPING = ROOT / "mappings" / "resnet.yaml"
FAMILY = [name for name in list_archs() if get_arch(name).mapping == "resnet"]
EXPECTED_FAMILY = {
    "resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "resnext50_32x4d",
    "resnext101_32x8d", "resnext101_64x4d", "wide_resnet50_2", "wide_resnet101_2",
}
BN_SUFFIXES = {
    "weight": "gamma", "bias": "beta",
    "running_mean": "moving_mean", "running_var": "moving_variance",
}
TOL = 1e-5
FAMILY_LAYERS = {"resnet18": (2, 2, 2, 2), "resnet50": (3, 4, 6, 3)}


# ---------------------------------------------------------------- helpers


def segment_renames() -> dict[str, str]:
    table = yaml.safe_load(MAPPING.read_text())
    assert table["version"] == 1
    return dict(table["rename"]["segments"])


def to_mindspore_params(model: torch.nn.Module) -> dict[str, np.ndarray]:
    """torchvision state dict → MindSpore names (stand-in for the conversion engine)."""
    segments = segment_renames()
    bn_modules = {
        name for name, module in model.named_modules()
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm)
    }
    params = {}
    for key, tensor in model.state_dict().items():
        module, _, leaf = key.rpartition(".")
        if leaf == "num_batches_tracked":
            continue
        if module in bn_modules:
            leaf = BN_SUFFIXES[leaf]
        parts = [segments.get(part, part) for part in module.split(".")]
        params[".".join([*parts, leaf])] = tensor.detach().cpu().numpy().copy()
    return params


def ms_shapes(net) -> dict[str, tuple[int, ...]]:
    return {p.name: tuple(p.shape) for p in net.get_parameters()}


def load_into(net, params: dict[str, np.ndarray]) -> None:
    """Load converted params; every MindSpore param filled, every tensor used."""
    shapes = ms_shapes(net)
    assert set(shapes) == set(params), (
        f"missing in checkpoint: {sorted(set(shapes) - set(params))[:5]}, "
        f"unused: {sorted(set(params) - set(shapes))[:5]}"
    )
    wrong = {k: (shapes[k], v.shape) for k, v in params.items() if shapes[k] != v.shape}
    assert not wrong, f"shape mismatches (ms, torch): {wrong}"
    param_dict = {k: ms.Parameter(ms.Tensor(v), name=k) for k, v in params.items()}
    params_not_loaded, ckpt_not_loaded = ms.load_param_into_net(net, param_dict)
    assert params_not_loaded == []
    assert ckpt_not_loaded == []


def torch_reference(name: str, **kwargs) -> torch.nn.Module:
    return seeded_torch_model(name, seed=0, **kwargs)


def build_ms(name: str, **kwargs):
    ms.set_seed(0)
    net = get_arch(name).build_mindspore(**kwargs)
    net.set_train(False)
    return net


def sample(shape: tuple[int, ...]) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)


def rel_err(ms_out: np.ndarray, torch_out: np.ndarray) -> float:
    a, b = ms_out.astype(np.float64), torch_out.astype(np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def forward_both(model, net, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    with torch.no_grad():
        ref = model(torch.from_numpy(x)).numpy()
    return net(ms.Tensor(x)).asnumpy(), ref


def parity(name: str, input_shape=(2, 3, 64, 64), **kwargs) -> tuple[float, tuple[int, ...]]:
    model = torch_reference(name, **kwargs)
    net = build_ms(name, **kwargs)
    load_into(net, to_mindspore_params(model))
    out, ref = forward_both(model, net, sample(input_shape))
    assert out.shape == ref.shape
    err = rel_err(out, ref)
    print(f"{name} {input_shape}: relative L2 error {err:.2e}")
    return err, out.shape


# ---------------------------------------------------------------- registry


def test_family_is_registered_with_metadata():
    assert set(FAMILY) == EXPECTED_FAMILY
    for name in FAMILY:
        arch = get_arch(name)
        assert arch.torch_factory == f"torchvision.models:{name}"
        assert arch.reference == f"torchvision.models.{name}"
        assert arch.input_shape == (3, 224, 224)
        assert arch.mapping == "resnet"
        assert arch.ms_factory.__name__ == name


def test_listing_imports_neither_framework():
    code = textwrap.dedent("""
        import sys
        import ms_port.archs as archs
        assert "resnet50" in archs.list_archs()
        heavy = sorted(m for m in ("mindspore", "torch", "torchvision") if m in sys.modules)
        assert not heavy, heavy
    """)
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_duplicate_registration_raises():
    before = get_arch("resnet50")
    with pytest.raises(ArchError, match="already registered"):
        register_arch("resnet50", torch="torchvision.models:resnet50")(lambda **kw: None)
    assert get_arch("resnet50") is before


def test_unknown_name_lists_known_names():
    with pytest.raises(ArchError) as info:
        get_arch("resnet51")
    message = str(info.value)
    assert "resnet51" in message
    for name in EXPECTED_FAMILY:
        assert name in message


def test_mapping_table_content():
    assert segment_renames() == {"downsample": "down_sample_layer", "fc": "end_point"}


# ---------------------------------------------------------------- structure


@pytest.mark.parametrize("name", ["resnet18", "resnext50_32x4d", "wide_resnet50_2"])
def test_param_names_and_shapes_match_converted_state_dict(name):
    torch.manual_seed(0)
    params = to_mindspore_params(get_arch(name).build_torch())
    shapes = ms_shapes(build_ms(name))
    assert set(shapes) == set(params)
    assert {k: tuple(v.shape) for k, v in params.items()} == shapes
    # Model-zoo names, not torchvision's.
    assert "end_point.weight" in shapes
    assert "layer2.0.down_sample_layer.0.weight" in shapes
    assert "layer2.0.down_sample_layer.1.moving_variance" in shapes
    assert not any("downsample" in k or k.startswith("fc.") for k in shapes)


def test_initialisation_follows_torchvision():
    net = build_ms("resnet50")
    values = {p.name: p.asnumpy() for p in net.get_parameters()}
    # Convs: He normal, fan_out, relu → std √(2 / (out · k · k)).
    for key in ("conv1.weight", "layer3.0.conv2.weight", "layer4.0.conv3.weight"):
        w = values[key]
        expected = np.sqrt(2.0 / (w.shape[0] * w.shape[2] * w.shape[3]))
        assert abs(w.std() / expected - 1) < 0.05, (key, w.std(), expected)
        assert abs(w.mean()) < 0.1 * expected
    # BatchNorm: gamma 1, beta 0, stats 0/1.
    for key, v in values.items():
        if key.endswith(".gamma") or key.endswith(".moving_variance"):
            assert np.all(v == 1), key
        elif key.endswith(".beta") or key.endswith(".moving_mean"):
            assert np.all(v == 0), key
    # Dense: torch's nn.Linear default, U(±1/√fan_in) for weight and bias.
    bound = 1 / np.sqrt(2048)
    w, b = values["end_point.weight"], values["end_point.bias"]
    assert np.abs(w).max() <= bound and np.abs(b).max() <= bound
    assert abs(w.std() / (bound / np.sqrt(3)) - 1) < 0.02


@pytest.mark.parametrize("name, last_bn", [("resnet18", "bn2"), ("resnet50", "bn3")])
def test_zero_init_residual_zeroes_last_bn_gamma(name, last_bn):
    net = build_ms(name, zero_init_residual=True)
    gammas = {p.name: p.asnumpy() for p in net.get_parameters() if p.name.endswith(".gamma")}
    last = {k for k in gammas if k.startswith("layer") and k.endswith(f".{last_bn}.gamma")}
    assert len(last) == sum(FAMILY_LAYERS[name])
    for key, gamma in gammas.items():
        assert np.all(gamma == (0 if key in last else 1)), key
    # torchvision zeroes the same tensors.
    torch.manual_seed(0)
    ref = to_mindspore_params(get_arch(name).build_torch(zero_init_residual=True))
    assert {k for k, v in ref.items() if k.endswith(".gamma") and not v.any()} == last
    # Off by default.
    assert all(p.asnumpy().all() for p in build_ms(name).get_parameters()
               if p.name.endswith(".gamma"))



def test_maxpool_pads_symmetrically_with_minus_infinity():
    # After ReLU, zero padding would hide; test the pool alone on negative input.
    pool = build_ms("resnet18").maxpool
    x = sample((2, 4, 15, 16)) - 5.0
    ref = torch.nn.MaxPool2d(3, 2, 1)(torch.from_numpy(x)).numpy()
    out = pool(ms.Tensor(x)).asnumpy()
    assert out.shape == ref.shape
    np.testing.assert_array_equal(out, ref)


# ---------------------------------------------------------------- parity


# The whole family at 64×64 takes ~45 s on 2 CPU cores (the 101-layer ResNeXt/Wide
# nets ~8 s each, mostly building and initialising them), so none is marked slow.
@pytest.mark.parametrize("name", FAMILY)
def test_family_matches_torchvision(name):
    err, shape = parity(name)
    assert shape == (2, 1000)
    assert err < TOL


def test_num_classes_option():
    err, shape = parity("resnet18", num_classes=10)
    assert shape == (2, 10)
    assert err < TOL
    assert ms_shapes(build_ms("resnet18", num_classes=10))["end_point.weight"] == (10, 512)


def _swap(params, a, b):
    params[a], params[b] = params[b], params[a]


@pytest.mark.parametrize("corrupt", [
    pytest.param(lambda p: _swap(p, "layer3.1.bn1.moving_mean", "layer3.1.bn1.moving_variance"),
                 id="bn-mean-var-swapped"),
    pytest.param(lambda p: _swap(p, "layer1.0.bn2.gamma", "layer1.0.bn2.beta"),
                 id="bn-gamma-beta-swapped"),
])
def test_wrong_mapping_is_detected(corrupt):
    model = torch_reference("resnet18")
    net = build_ms("resnet18")
    params = to_mindspore_params(model)
    corrupt(params)
    load_into(net, params)  # names and shapes still agree: only the numbers can tell
    out, ref = forward_both(model, net, sample((2, 3, 64, 64)))
    err = rel_err(out, ref)
    print(f"corrupted mapping: relative L2 error {err:.2e}")
    # `not <` so that NaN would count as detected too. (A moving_mean used as variance is
    # partly negative → NaN channels; MindSpore's ReLU maps NaN to 0, so the output stays
    # finite and simply wrong: ~1.2 measured. The gamma/beta swap gives ~0.9.)
    assert not err < 1e-2


@pytest.mark.slow
def test_resnet50_full_size():
    err, shape = parity("resnet50", input_shape=(2, 3, 224, 224))
    assert shape == (2, 1000)
    assert err < TOL


def test_archs_lists_every_target_and_fits_80_columns(monkeypatch):
    """The architectures, the families with the Hugging Face model types each takes, and
    the zoos: one row each at 80 columns (each used to wrap into four lines)."""
    import json

    from click.testing import CliRunner

    from ms_port.cli import main
    from ms_port.read.targets import FAMILIES

    monkeypatch.setenv("COLUMNS", "80")
    result = CliRunner().invoke(main, ["archs"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert any(line.startswith("resnet50 ") and "torchvision.models.resnet50" in line
               for line in lines)
    row = next(line for line in lines if line.startswith("mindformers:llama "))
    assert "llama, mistral, qwen2" in row and "LlamaForCausalLM" in row
    assert all(any(line.startswith(f"{f} ") for line in lines) for f in FAMILIES)
    assert any("--torch-model timm:NAME" in line for line in lines)
    data = json.loads(CliRunner().invoke(main, ["archs", "--json"]).output)
    assert {f["name"] for f in data["families"]} == set(FAMILIES)
    assert "qwen3_moe" in next(f for f in data["families"]
                               if f["name"] == "mindformers:qwen3_moe")["model_types"]
    # each family's --ms-option keys, on its own lines under the table
    glm = next(f for f in data["families"] if f["name"] == "mindformers:glm4")
    assert {"qkv_concat", "use_rearrange_rope"} <= set(glm["options"])
    assert any(line.startswith("    mindformers:glm4: ") and "qkv_concat" in line
               for line in lines)
