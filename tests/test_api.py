"""The Python API's contract, as a notebook user meets it.

``import ms_port`` is light; the four entry points are documented functions; every report
has ``to_dict()`` (JSON-safe), ``ok`` where it applies, a short ``repr``, a rich rendering
and an HTML one for Jupyter; the library never prints; failures are ``MsPortError``
subclasses carrying their data; a user's own architecture registers from Python.

Everything runs on a tiny network registered as an architecture (conv + BatchNorm +
Linear, PyTorch names ``features.0/1``/``classifier``, MindSpore ``stem.conv/bn``/``head``).
"""

from __future__ import annotations

import importlib
import inspect as pyinspect
import json
import pkgutil
import re
import subprocess
import sys
import textwrap
from io import StringIO
from pathlib import Path

import pytest

import ms_port

TINY = "test-api-tiny"
TINY_MAPPING = r"""
version: 1
description: test-api tiny net
rename:
  regex:
    - {from: 'features\.0\.(\w+)', to: 'stem.conv.\1'}
    - {from: 'features\.1\.(\w+)', to: 'stem.bn.\1'}
  segments:
    classifier: head
"""
SHAPE = (3, 8, 8)


def torch_tiny():
    """The PyTorch side (torch is imported only when a test needs it)."""
    import torch
    from torch import nn

    class TorchTiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, bias=False),
                                          nn.BatchNorm2d(4), nn.ReLU())
            self.classifier = nn.Linear(4, 3)

        def forward(self, x):
            return self.classifier(torch.mean(self.features(x), dim=(2, 3)))

    return TorchTiny()


def ms_tiny():
    """The MindSpore side, named differently."""
    from mindspore import nn, ops

    class Stem(nn.Cell):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, pad_mode="pad", padding=1)
            self.bn = nn.BatchNorm2d(4)
            self.relu = nn.ReLU()

        def construct(self, x):
            return self.relu(self.bn(self.conv(x)))

    class MsTiny(nn.Cell):
        def __init__(self):
            super().__init__()
            self.stem = Stem()
            self.head = nn.Dense(4, 3)

        def construct(self, x):
            return self.head(ops.mean(self.stem(x), axis=(2, 3)))

    return MsTiny()


def _save_tiny(path: Path, *, swap_bn_stats: bool = False) -> Path:
    import torch

    torch.manual_seed(0)
    net = torch_tiny()
    bn = net.features[1]
    with torch.no_grad():  # trained-looking statistics, so a swap changes the outputs
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2.0)
    state = net.state_dict()
    if swap_bn_stats:
        state["features.1.running_mean"], state["features.1.running_var"] = (
            state["features.1.running_var"], state["features.1.running_mean"])
    torch.save(state, path)
    return path


@pytest.fixture(scope="module")
def tiny_arch(tmp_path_factory):
    """Register the tiny network as an architecture; unregister it afterwards."""
    from ms_port.archs import registry

    mapping = tmp_path_factory.mktemp("tiny-arch") / "tiny.yaml"
    mapping.write_text(TINY_MAPPING)
    ms_port.register_arch(TINY, torch=torch_tiny, mapping=str(mapping), input_shape=SHAPE,
                          reference="test_api.torch_tiny", replace=True)(ms_tiny)
    yield TINY
    # no public unregister: keep the registry as other tests expect it
    registry._REGISTRY.pop(TINY, None)


@pytest.fixture(scope="module")
def tiny(tiny_arch, tmp_path_factory):
    """Checkpoints and every kind of report, passing and failing, computed once."""
    work = tmp_path_factory.mktemp("tiny")
    pth = _save_tiny(work / "tiny.pth")
    broken_pth = _save_tiny(work / "broken.pth", swap_bn_stats=True)
    ckpt = work / "tiny.ckpt"
    broken_ckpt = work / "broken.ckpt"
    converted = ms_port.convert(pth, arch=tiny_arch, output=ckpt)
    assert converted.ok, converted.plan.problems()
    assert ms_port.convert(broken_pth, arch=tiny_arch, output=broken_ckpt).ok
    reports = {
        "inspect": ms_port.inspect(pth),
        "plan": ms_port.plan(pth, arch=tiny_arch),
        "conversion": converted,
        "parity": ms_port.verify(pth, ckpt, arch=tiny_arch),
        # no mapping, names only: the names differ, so strict matching refuses
        "plan-incomplete": ms_port.plan(pth, ms_model=ms_tiny(), align=False),
        "conversion-refused": ms_port.convert(pth, ms_model=ms_tiny(), align=False,
                                              output=work / "refused.ckpt"),
        # mean and variance swapped in the source: converts fine, verify must fail
        "parity-fail": ms_port.verify(pth, broken_ckpt, arch=tiny_arch),
    }
    return {"pth": pth, "ckpt": ckpt, "work": work, "reports": reports}


# --------------------------------------------------------------------------------------
# import and names


def _heavy_modules_after(code: str) -> list[str]:
    script = code + textwrap.dedent("""
        import json, sys
        print(json.dumps(sorted(m for m in sys.modules
                                if m.split('.')[0] in ('torch', 'torchvision', 'mindspore'))))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120, check=True)
    return json.loads(result.stdout)


def test_import_loads_neither_torch_nor_mindspore():
    assert _heavy_modules_after("import ms_port") == []


def test_resolving_every_public_name_loads_neither_torch_nor_mindspore():
    # `from ms_port import Plan, ParityReport` for type hints must stay cheap too
    code = "import ms_port\nfor n in ms_port.__all__: getattr(ms_port, n)"
    assert _heavy_modules_after(code) == []


@pytest.mark.parametrize("name", ms_port.__all__)
def test_every_public_name_resolves(name):
    assert getattr(ms_port, name) is not None


def test_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        ms_port.nope  # noqa: B018
    assert sorted(dir(ms_port)) == sorted(ms_port.__all__)


ENTRY_POINTS = ["inspect", "plan", "convert", "verify"]


def _import_every_submodule() -> None:
    for info in pkgutil.walk_packages(ms_port.__path__, "ms_port."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_entry_points_are_documented_functions(name):
    _import_every_submodule()  # a submodule named like a function would shadow it
    fn = getattr(ms_port, name)
    assert pyinspect.isfunction(fn), f"ms_port.{name} is {type(fn).__name__}, not a function"
    assert fn.__module__ == "ms_port.api"
    doc = pyinspect.getdoc(fn) or ""
    for section in ("Args:", "Returns:", "Example:"):
        assert section in doc, f"ms_port.{name}'s docstring has no {section!r} section"
    assert f"ms_port.{name}(" in doc, "the example should call the function it documents"


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_entry_points_take_options_by_keyword(name):
    params = list(pyinspect.signature(getattr(ms_port, name)).parameters.values())
    positional = [p for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert len(positional) <= 2, [p.name for p in positional]


def test_plan_returns_the_public_plan_class(tiny):
    assert isinstance(tiny["reports"]["plan"], ms_port.Plan)
    assert isinstance(tiny["reports"]["conversion"], ms_port.ConversionReport)
    assert isinstance(tiny["reports"]["parity"], ms_port.ParityReport)
    assert isinstance(tiny["reports"]["inspect"], ms_port.InspectReport)


# --------------------------------------------------------------------------------------
# reports

KINDS = ["inspect", "plan", "conversion", "parity", "plan-incomplete", "conversion-refused",
         "parity-fail"]
OK = {"plan": True, "conversion": True, "parity": True, "plan-incomplete": False,
      "conversion-refused": False, "parity-fail": False}
# what a reader must find in the rendering
FACTS = {
    "inspect": ["features.1.running_var", "4×3×3×3", "tensors: 8"],
    "plan": ["PLAN OK", "stem.bn.moving_variance", "features.1.running_var", "batchnorm"],
    "conversion": ["CONVERTED", "matched: 7/7", "bit-exact"],
    "parity": ["PASS", "error", "noise floor"],
    "plan-incomplete": ["no source tensor for 'head.weight'", "classifier.weight"],
    "conversion-refused": ["NOT CONVERTED", "no source tensor for 'head.weight'"],
    "parity-fail": ["FAIL", "first divergence", "stem.bn"],
}


def _render(report) -> str:
    from rich.console import Console

    console = Console(file=StringIO(), width=100, color_system=None)
    console.print(report)
    return console.file.getvalue()


@pytest.mark.parametrize("kind", KINDS)
def test_report_to_dict_is_json(tiny, kind):
    report = tiny["reports"][kind]
    data = report.to_dict()
    text = json.dumps(data, allow_nan=False)
    assert json.loads(text) == data
    if kind in OK:
        assert data["ok"] is OK[kind]


@pytest.mark.parametrize("kind", sorted(OK))
def test_report_ok(tiny, kind):
    assert tiny["reports"][kind].ok is OK[kind]


@pytest.mark.parametrize("kind", KINDS)
def test_report_repr_is_short(tiny, kind):
    report = tiny["reports"][kind]
    text = repr(report)
    assert text.startswith(type(report).__name__ + "("), text[:200]
    assert len(text) < 300 and "\n" not in text, text[:400]
    if kind in OK:
        assert f"ok={OK[kind]}" in text


@pytest.mark.parametrize("kind", KINDS)
def test_report_renders_with_rich(tiny, kind):
    report = tiny["reports"][kind]
    assert hasattr(report, "__rich__"), f"{type(report).__name__} has no __rich__"
    text = _render(report)
    for fact in FACTS[kind]:
        assert fact in text, f"{fact!r} not in:\n{text}"


@pytest.mark.parametrize("kind", KINDS)
def test_report_renders_as_html(tiny, kind):
    report = tiny["reports"][kind]
    assert hasattr(report, "_repr_html_"), f"{type(report).__name__} has no _repr_html_"
    html = report._repr_html_()
    assert "<pre" in html
    assert re.search("[┏╭┌]", html), "no table or panel in the HTML"
    for fact in FACTS[kind]:
        assert fact.replace("'", "&#x27;") in html or fact in html, fact
    # a fragment: a whole page's <style> for <body> would restyle the notebook around it
    assert "<body" not in html and "<style" not in html


def test_html_does_not_display_twice_in_jupyter(tiny, monkeypatch):
    """Inside a kernel rich displays what it prints; _repr_html_ must only return."""
    import rich.console
    import rich.jupyter

    displayed = []
    monkeypatch.setattr(rich.console, "_is_jupyter", lambda: True)
    monkeypatch.setattr(rich.jupyter, "display", lambda *a, **k: displayed.append(a))
    html = tiny["reports"]["conversion"]._repr_html_()
    assert "CONVERTED" in html
    assert displayed == []


def test_rendering_keeps_brackets_in_names(tmp_path, tiny_arch):
    """User text (paths, regexes, transforms) is not rich markup: `[a-z]` stays."""
    work = tmp_path / "run[abc]"
    work.mkdir()
    pth = _save_tiny(work / "tiny.pth")
    mapping = work / "m.yaml"
    mapping.write_text(TINY_MAPPING.replace(r"features\.0", r"feature[s]\.0"))
    plan = ms_port.plan(pth, ms_model=ms_tiny(), mapping=mapping)
    assert plan.ok, plan.problems()
    text = _render(plan) + _render(ms_port.inspect(pth))
    assert r"feature[s]\.0" in text
    assert "run[abc]" in text


# --------------------------------------------------------------------------------------
# the library never prints

_MS_LOG_LINE = re.compile(r"^\[(DEBUG|INFO|WARNING|ERROR|CRITICAL)\] [A-Z_]+\(\d+")


def test_library_never_prints(tiny_arch, tmp_path, capfd):
    """Nothing on stdout, ever; stderr only MindSpore's own C++ log lines, if any.

    Captured at file-descriptor level, so C++ output would show too. On the pinned
    versions nothing at all is written; MindSpore's C++ logger (glog, ``[WARNING] ME(…``)
    may write to stderr on other versions, which is outside the library's control.
    """
    pth = _save_tiny(tmp_path / "tiny.pth")
    capfd.readouterr()
    ms_port.inspect(pth)
    ms_port.inspect(arch=tiny_arch)
    ms_port.plan(pth, arch=tiny_arch)
    ms_port.convert(pth, arch=tiny_arch, output=tmp_path / "tiny.ckpt", dry_run=True)
    report = ms_port.convert(pth, arch=tiny_arch, output=tmp_path / "tiny.ckpt",
                             save_map=tmp_path / "plan.yaml")
    ms_port.convert(pth, ms_model=ms_tiny(), output=tmp_path / "refused.ckpt")
    parity = ms_port.verify(pth, report.output, arch=tiny_arch)
    assert report.ok and parity.ok
    out, err = capfd.readouterr()
    assert out == ""
    assert [line for line in err.splitlines() if not _MS_LOG_LINE.match(line)] == []


# --------------------------------------------------------------------------------------
# errors


def test_every_error_is_an_ms_port_error():
    errors = [getattr(ms_port, n) for n in ms_port.__all__ if n.endswith("Error")]
    assert len(errors) >= 10
    for cls in errors:
        assert issubclass(cls, ms_port.MsPortError), cls


def test_missing_file_error_carries_its_path(tmp_path):
    path = tmp_path / "nope.pth"
    with pytest.raises(ms_port.SourceError) as info:
        ms_port.inspect(path)
    err = info.value
    assert err.path == str(path) and str(path) in err.message and str(err) == err.message
    assert err.exit_code == 2


def test_bad_mapping_error_names_file_and_entry(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("rename:\n  regex:\n    - {from: '(', to: x}\n")
    with pytest.raises(ms_port.MappingError, match=r"rename\.regex\[0\]: bad regex") as info:
        ms_port.load_mapping(path)
    assert info.value.path == str(path)


def test_unknown_arch_lists_the_known_ones():
    with pytest.raises(ms_port.ArchError, match=r"unknown architecture 'resnet5'; known: .*50"):
        ms_port.get_arch("resnet5")


def test_existing_output_is_not_replaced_without_force(tiny, tiny_arch):
    with pytest.raises(ms_port.OutputExistsError) as info:
        ms_port.convert(tiny["pth"], arch=tiny_arch, output=tiny["ckpt"])
    assert info.value.path == str(tiny["ckpt"])


@pytest.mark.parametrize(("call", "kwargs", "message"), [
    ("inspect", {}, "give a checkpoint path or an architecture"),
    ("convert", {"arch": "resnet18"}, "no output given"),
    ("plan", {"arch": "resnet18", "target": "y.ckpt"}, "give exactly one target"),
    ("plan", {}, "give exactly one target"),
])
def test_bad_calls_say_what_to_do(tiny, call, kwargs, message):
    args = () if call == "inspect" else (tiny["pth"],)
    with pytest.raises(ms_port.MsPortError, match=message):
        getattr(ms_port, call)(*args, **kwargs)


# --------------------------------------------------------------------------------------
# a user's own architecture


def test_registered_arch_converts_and_verifies_by_name(tiny, tiny_arch):
    assert tiny_arch in ms_port.list_archs()
    arch = ms_port.get_arch(tiny_arch)
    assert arch.input_shape == SHAPE and arch.reference == "test_api.torch_tiny"
    listed = ms_port.inspect(arch=tiny_arch)
    assert [t.name for t in listed.tensors][:2] == ["stem.conv.weight", "stem.bn.moving_mean"]
    plan = tiny["reports"]["plan"]
    # the BatchNorm tensors reach their names through a regex rename, then the rule: the
    # mapping made the match, and is counted for it
    assert plan.counts["mapping"] == 7 and plan.counts["rule"] == 0
    parity = tiny["reports"]["parity"]
    assert parity.ok and parity.input_shape == SHAPE and parity.error < 1e-6


def test_broken_conversion_is_located(tiny):
    parity = tiny["reports"]["parity-fail"]
    assert not parity.ok and parity.first_divergence is not None
    assert "stem.bn" in parity.first_divergence.describe()


def test_verify_takes_live_networks(tiny):
    """Module/Cell instances work as well as factories and ``module:callable`` strings."""
    import mindspore as ms

    tnet, mnet = torch_tiny(), ms_tiny()
    parity = ms_port.verify(tiny["pth"], tiny["ckpt"], torch_model=tnet, ms_model=mnet,
                            mapping=ms_port.get_arch(TINY).mapping, input_shape=SHAPE)
    assert parity.ok
    assert isinstance(mnet, ms.nn.Cell)


def test_registering_a_name_twice_raises(tiny_arch):
    with pytest.raises(ms_port.ArchError, match=f"'{tiny_arch}' is already registered"):
        ms_port.register_arch(tiny_arch, torch=torch_tiny)(ms_tiny)
    assert ms_port.get_arch(tiny_arch).ms_factory is ms_tiny  # the first one stands


def test_registering_a_builtin_name_raises_even_before_first_lookup():
    """In a fresh process the built-ins are not loaded yet; the clash must still show."""
    script = textwrap.dedent("""
        import ms_port
        try:
            ms_port.register_arch("resnet50", torch="torchvision.models:resnet50")(object)
        except ms_port.ArchError as exc:
            print("refused:", exc)
        print(ms_port.get_arch("resnet50").reference)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "refused: architecture 'resnet50' is already registered" in result.stdout
    assert "torchvision.models.resnet50" in result.stdout


@pytest.mark.parametrize("model", ["cell", "factory", "class", "path"])
def test_ms_model_is_a_cell_a_factory_or_a_path_everywhere(tiny, model):
    """plan/convert take what verify takes (issue: plan() refused a callable)."""
    spec = {"cell": ms_tiny(), "factory": ms_tiny, "class": type(ms_tiny()),
            "path": "test_api:ms_tiny"}[model]
    p = ms_port.plan(tiny["pth"], ms_model=spec, mapping=ms_port.get_arch(TINY).mapping)
    assert p.ok, p.problems()


def test_structure_alone_converts_the_tiny_net(tiny, tmp_path):
    """No mapping: names differ everywhere (features.0 vs stem.conv, classifier vs head),
    yet the layers pair one to one by order, kind and shape — and verify agrees."""
    out = tmp_path / "aligned.ckpt"
    report = ms_port.convert(tiny["pth"], ms_model=ms_tiny, output=out)
    assert report.ok and report.plan.counts["aligned"] == len(report.plan.matches) - \
        report.plan.counts["exact"]
    assert ms_port.verify(tiny["pth"], out, torch_model=torch_tiny, ms_model=ms_tiny,
                          input_shape=SHAPE).verdict == "PASS"


def test_mapping_is_a_path_a_dict_or_a_table(tiny):
    import yaml

    as_dict = yaml.safe_load(TINY_MAPPING)
    table = ms_port.load_mapping(ms_port.get_arch(TINY).mapping)
    for mapping in (ms_port.get_arch(TINY).mapping, as_dict, table, [as_dict]):
        assert ms_port.plan(tiny["pth"], ms_model=ms_tiny, mapping=mapping).ok
    with pytest.raises(ms_port.MsPortError, match=r"mapping= takes .* got int"):
        ms_port.plan(tiny["pth"], ms_model=ms_tiny, mapping=7)
    with pytest.raises(ms_port.MappingError, match=r"mapping \(a dict\).*rename"):
        ms_port.plan(tiny["pth"], ms_model=ms_tiny, mapping={"rename": 3})


def test_a_user_factory_is_introspected_without_drawing_its_weights():
    """--ms-model's factory is built under no_init_parameters: its names and shapes, not
    its random weights (a 7B target's introspection costs its imports, not 28 GB). The
    same factory built the ordinary way draws them, so the test can tell."""
    ms = pytest.importorskip("mindspore")
    from mindspore.common.initializer import Initializer

    from ms_port.resolve import resolve_target

    drawn = []

    class Recording(Initializer):
        def _initialize(self, arr):
            drawn.append(arr.shape)
            arr[...] = 0

    def factory():
        return ms.nn.Dense(512, 256, weight_init=Recording(), bias_init="zeros")

    target = resolve_target(ms_model=factory)
    assert target.tensors["weight"].shape == (256, 512) and target.tensors["bias"].shape == (256,)
    assert drawn == []
    factory()
    assert drawn == [(256, 512)]


@pytest.mark.parametrize("name, asked, written", [
    ("out.safetensors", None, "safetensors"), ("out.ckpt", None, "ckpt"),
    ("out.bin", None, "ckpt"), ("out.SAFETENSORS", "safetensors", "safetensors")])
def test_the_output_format_follows_the_name_unless_told(tiny_arch, tmp_path, name,
                                                       asked, written):
    """``-o model.safetensors`` writes safetensors (it used to write a checkpoint under that
    name, which every safetensors reader then refused)."""
    pth = _save_tiny(tmp_path / "tiny.pth")
    report = ms_port.convert(pth, arch=tiny_arch, output=tmp_path / name, format=asked)
    assert report.ok and report.written.format == written
    head = (tmp_path / name).read_bytes()[:8]
    assert (int.from_bytes(head, "little") < 1 << 20) == (written == "safetensors")


@pytest.mark.parametrize("name, asked", [("out.safetensors", "ckpt"),
                                         ("out.ckpt", "safetensors")])
def test_a_format_the_output_name_contradicts_is_refused(tiny_arch, tmp_path, name, asked):
    pth = _save_tiny(tmp_path / "tiny.pth")
    with pytest.raises(ms_port.MsPortError, match=rf"--format {asked}, but the output .* is "
                                                  r"named \.\w+: .* drop --format"):
        ms_port.convert(pth, arch=tiny_arch, output=tmp_path / name, format=asked)
    assert not (tmp_path / name).exists()
