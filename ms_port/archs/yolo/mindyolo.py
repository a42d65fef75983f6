"""MindYOLO's detectors as a target: ``--ms-model mindyolo:CONFIG.yaml``, the config file a
MindYOLO user trains with (``python train.py --config configs/yolov8/yolov8n.yaml``).

MindYOLO 0.5.0 builds its networks with ``create_model(model_name=network.model_name,
model_cfg=network, num_classes=data.nc)`` from a config whose ``__BASE__`` list names other
files (relative to the config's folder), merged under the config's own keys. Its own loader
is PyYAML's ``FullLoader``, and its ``parse_model`` runs ``eval`` on every string of the
layer table (module names and arguments). ms-port reads the files with the safe loader
(no anchors or aliases, bounded size, ``__BASE__`` at most :data:`MAX_BASE_DEPTH` deep and
never a cycle) and hands MindYOLO a layer table only when each string in it is a plain name
(``C2f``, ``nc``, ``None``, ``nearest``), ``key=name`` or ``key=number``, or an activation
made of numbers (``act=nn.LeakyReLU(0.1)``, :data:`ACTIVATIONS`): never another expression.

The configs are not in MindYOLO's wheel; its users have them from its repository.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
import os
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ...errors import TargetError, shown

PREFIX = "mindyolo"
#: what MindYOLO 0.5.0 needs beside ms-port's environment (its test extra)
INSTALL = ("pip install mindyolo==0.5.0 'setuptools<81' opencv-python-headless==4.11.0.86 "
           "(MindYOLO imports pkg_resources and cv2; OpenCV 4.12 needs numpy 2, MindSpore "
           "numpy < 2)")
#: __BASE__ includes nest a few deep in MindYOLO's configs (model <- base <- coco)
MAX_BASE_DEPTH = 8
MAX_CONFIG_BYTES = 1 << 20
#: what a string of the layer table may be: a name, or key=name / key=number
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_NUMBER = re.compile(r"[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?\Z")
#: the activations a layer argument may construct (``act=nn.LeakyReLU(0.1)``, in
#: MindYOLO's own yolox-darknet53 config): MindSpore's cells, with numbers only
ACTIVATIONS = frozenset({"LeakyReLU", "ReLU", "ReLU6", "SiLU", "Sigmoid", "Tanh", "GELU",
                         "HSwish", "HSigmoid", "ELU", "Identity"})


def read_config(path: str | Path) -> dict[str, Any]:
    """A MindYOLO config with its ``__BASE__`` files merged as MindYOLO's ``load_config``
    merges them (the file's own keys over its bases', dicts merged key by key).

    Raises:
        TargetError: a file missing, unreadable, not YAML, not a mapping, too large, or a
            ``__BASE__`` chain deeper than :data:`MAX_BASE_DEPTH` or that returns to itself.
    """
    return _read(Path(path).expanduser(), ())


def _read(path: Path, chain: tuple[Path, ...]) -> dict[str, Any]:
    from ...match.mapping_yaml import safe_documents

    where = " (a __BASE__ of " + shown(str(chain[-1])) + ")" if chain else ""
    if path.suffix not in (".yaml", ".yml"):
        raise TargetError(f"mindyolo:{shown(str(path))}{where}: expected a MindYOLO config "
                          "file (.yaml), e.g. mindyolo:configs/yolov8/yolov8n.yaml")
    real = path.resolve()
    if real in chain:
        raise TargetError(f"{shown(str(path))}: its __BASE__ list leads back to itself; fix "
                          "the config", path=path)
    if len(chain) > MAX_BASE_DEPTH:
        raise TargetError(f"{shown(str(path))}: __BASE__ files nest more than "
                          f"{MAX_BASE_DEPTH} deep; fix the config", path=path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TargetError(f"cannot read the MindYOLO config {shown(str(path))}{where} "
                          f"({type(exc).__name__}: {exc}); check the path — MindYOLO's configs "
                          "are in its repository (configs/), not in its wheel",
                          path=path) from None
    docs = safe_documents(text, origin=str(path), error=TargetError, limit=MAX_CONFIG_BYTES)
    # MindYOLO reads up to three documents: the config, help texts, choices
    config = docs[0] if docs else {}
    if config is None:
        config = {}
    if not isinstance(config, dict):
        raise TargetError(f"{shown(str(path))}: a MindYOLO config is a mapping, this is a "
                          f"{type(config).__name__}", path=path)
    bases = config.pop("__BASE__", None) or []
    if isinstance(bases, str) or not isinstance(bases, list) or not all(
            isinstance(b, str) and b for b in bases):
        raise TargetError(f"{shown(str(path))}: __BASE__ is {shown(bases)}; expected a list "
                          "of file names", path=path)
    merged: dict[str, Any] = {}
    for base in bases:
        base_path = Path(base).expanduser()
        if not base_path.is_absolute():
            base_path = path.parent / base_path
        merged = _merge(_read(base_path, (*chain, real)), merged)
    return _merge(config, merged)


def _merge(config: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, Any]:
    """MindYOLO's ``_merge_config``: ``config``'s keys over ``base``'s, dicts key by key."""
    out = dict(base)
    for key, value in config.items():
        if isinstance(out.get(key), dict) and isinstance(value, Mapping):
            out[key] = _merge(value, out[key])
        else:
            out[key] = value
    return out


def network_of(config: Mapping[str, Any], origin: str) -> tuple[dict[str, Any], int]:
    """The ``network`` section and the class count (``data.nc``), checked: the layer table
    holds no string MindYOLO's ``eval`` would run as an expression."""
    network = config.get("network")
    if not isinstance(network, dict) or not isinstance(network.get("model_name"), str):
        raise TargetError(f"{origin}: no network.model_name; a MindYOLO config (with its "
                          "__BASE__ files) names its model there, e.g. yolov8")
    data = config.get("data")
    nc = data.get("nc") if isinstance(data, dict) else None
    if isinstance(nc, bool) or not isinstance(nc, int) or not 0 < nc <= 100_000:
        raise TargetError(f"{origin}: data.nc is {shown(nc)}; expected the number of classes")
    for part in ("backbone", "head"):
        rows = network.get(part)
        if rows is None:
            continue
        if not isinstance(rows, list):
            raise TargetError(f"{origin}: network.{part} is not a list of layers")
        for i, row in enumerate(rows):
            _check_layer(row, f"{origin}: network.{part}[{i}]")
    return network, nc


def _check_layer(row: Any, where: str) -> None:
    if not isinstance(row, list) or len(row) != 4:
        raise TargetError(f"{where}: expected [from, repeats, module, args], got {shown(row)}")
    source, repeats, module, args = row
    sources = source if isinstance(source, list) else [source]
    if not sources or not all(_is_int(x) for x in sources) or not _is_int(repeats):
        raise TargetError(f"{where}: from {shown(source)} and repeats {shown(repeats)} must "
                          "be integers (from: a layer index or a list of them)")
    if not isinstance(module, str) or not _NAME.match(module):
        raise TargetError(f"{where}: module {shown(module)} is not a name; MindYOLO would "
                          "eval it, ms-port refuses")
    if not isinstance(args, list):
        raise TargetError(f"{where}: args {shown(args)} is not a list")
    for arg in _strings(args):
        key, eq, value = arg.partition("=")
        plain = (_NAME.match(value) or _NUMBER.match(value) or _activation(value) if eq
                 else _NAME.match(arg))
        if not (plain and (not eq or _NAME.match(key))):
            raise TargetError(f"{where}: argument {shown(arg)} is an expression MindYOLO "
                              "would eval; ms-port builds only configs whose layer arguments "
                              "are numbers, lists, plain names and activations made of "
                              "numbers (nn.LeakyReLU(0.1); one of "
                              f"{', '.join(sorted(ACTIVATIONS))})")


def _activation(text: str) -> bool:
    """Whether ``text`` is ``nn.NAME(numbers…)`` with NAME one of :data:`ACTIVATIONS`:
    what MindYOLO's eval of it can do is make that cell."""
    import ast

    try:
        node = ast.parse(text, mode="eval").body
    except SyntaxError:
        return False
    return (isinstance(node, ast.Call) and not node.keywords
            and isinstance(node.func, ast.Attribute) and node.func.attr in ACTIVATIONS
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "nn"
            and all(isinstance(a, ast.Constant) and type(a.value) in (int, float)
                    for a in node.args))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) < 10_000


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [s for item in value for s in _strings(item)]
    return []


def _mindyolo() -> tuple[Any, Any]:
    """MindYOLO's ``create_model`` and ``Config``, imported quietly (it logs a line per
    string argument it cannot eval, and warns of pkg_resources)."""
    try:
        with contextlib.redirect_stdout(io.StringIO()), _quiet():
            factory = importlib.import_module("mindyolo.models.model_factory")
            config = importlib.import_module("mindyolo.utils.config")
    except ImportError as exc:
        raise TargetError(f"--ms-model mindyolo:… needs MindYOLO ({exc}); {INSTALL}") from None
    return factory.create_model, config.Config


@contextlib.contextmanager
def _quiet() -> Any:
    import warnings

    # its Logger is not registered with logging: its warnings reach stderr through
    # logging's last resort ("Parse Model, args: nearest, keep str type")
    module = sys.modules.get("mindyolo.utils.logger")
    logger = module.get_logger() if module is not None else logging.getLogger("MindYOLO")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


@contextlib.contextmanager
def _weights_drawn() -> Any:
    """MindYOLO reads its heads' parameters while it builds them (``initialize_biases``):
    under ``no_init_parameters`` MindSpore warns of each uninitialised read, so the network
    is built with its weights drawn (yolov8n: 0.7 s)."""
    from mindspore import Parameter

    before = getattr(Parameter, "init_param", True)
    Parameter.init_param = True
    try:
        yield
    finally:
        Parameter.init_param = before


def build(path: str | Path) -> Any:
    """MindYOLO's network for a config file, as its ``train.py`` builds it (``sync_bn``
    off: one device)."""
    origin = shown(str(path))
    network, nc = network_of(read_config(path), origin)
    create_model, config = _mindyolo()
    with contextlib.redirect_stdout(io.StringIO()), _quiet(), _weights_drawn():
        try:
            return create_model(model_name=network["model_name"], model_cfg=config(network),
                                num_classes=nc, sync_bn=False)
        except Exception as exc:  # MindYOLO's own code, on the user's config
            raise TargetError(f"MindYOLO could not build {origin} ({type(exc).__name__}: "
                              f"{exc}); check the config against MindYOLO 0.5.0's",
                              path=str(path)) from exc


def input_shape(name: str) -> tuple[tuple[int, ...], str]:
    """The input a config's network is trained on: 3 × ``img_size`` × ``img_size``."""
    size = read_config(name).get("img_size", 640)
    if isinstance(size, bool) or not isinstance(size, int) or not 32 <= size <= 8192 or size % 32:
        raise TargetError(f"{shown(name)}: img_size is {shown(size)}; expected a multiple of "
                          "32 (the detectors' largest stride)")
    return (3, size, size), f"img_size {size} in {shown(name)}"


def factory(name: str, option: str) -> Callable[..., Any]:
    """``mindyolo:CONFIG.yaml`` for ``--ms-model``: the network's builder (the config read
    and checked at once, so a bad path is one line before anything is imported)."""
    if option != "--ms-model":
        raise TargetError(f"{option} mindyolo:…: MindYOLO builds MindSpore networks; give it "
                          "as --ms-model")
    read_config(name)
    return lambda **_: build(os.path.expanduser(name))


__all__ = ["INSTALL", "MAX_BASE_DEPTH", "PREFIX", "build", "factory", "input_shape",
           "network_of", "read_config"]
