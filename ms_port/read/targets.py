"""What the MindSpore side expects: names, shapes, dtypes and owning layer types.

Three equal ways to get a :class:`Target`: a built-in architecture (:func:`from_arch`),
a live ``mindspore.nn.Cell`` (:func:`from_cell`, or :func:`from_factory` for a
``module:callable`` path), or a template checkpoint (:func:`from_template`), whose
names and shapes are read without keeping its data.
"""

from __future__ import annotations

import functools
import importlib
import json
import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Callable

from ..errors import MsPortError, TargetError
from .tensors import NUMPY_DTYPES, TensorInfo


@dataclass(frozen=True)
class TargetTensor:
    """One tensor the MindSpore side expects; ``layer`` is the owning cell's class name,
    ``lineage`` that class and its base classes (nearest first), so a rule for
    ``LayerNorm`` also fits MindCV's ``ConvNextLayerNorm(LayerNorm)``."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    layer: str | None = None
    lineage: tuple[str, ...] = ()
    #: a constant the network computes when it is built (a non-trainable parameter made
    #: from a concrete array, not drawn from an initialiser: MindCV's Swin attention mask
    #: and one-hot relative-position index): its value, read on demand
    constant: Callable[[], Any] | None = field(default=None, compare=False, repr=False)
    #: where the network holds it (``downsample_layers.1.1.weight``), where that differs
    #: from its checkpoint name (MindCV's lists name parameters ``0.1.1.weight``, the same
    #: prefix for two lists): the structure alignment follows
    path: str | None = None

    def to_dict(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype,
                "layer": self.layer}


@dataclass
class Target:
    """An ordered mapping name -> :class:`TargetTensor`.

    Attributes:
        kind: ``arch``, ``cell`` or ``template``.
        description: for reports (``resnet50``, ``mypkg.nets:build``, a file path).
        tensors: the expected tensors, in the network's parameter order.
        cell: the live network when built from one (architectures and factories).
    """

    kind: str
    description: str
    tensors: dict[str, TargetTensor]
    cell: Any = field(default=None, repr=False)
    #: a known model family (``mindformers:llama``), for choosing a mapping table
    family: str | None = None
    #: the network's class (``module.Class``), where built from a Cell
    cls: str | None = None
    #: what the target's maker wants said in the plan (a RoPE scaling, computed or not)
    notes: list[str] = field(default_factory=list)
    #: the network's settings a mapping table's ``when:`` reads, where they differ from
    #: or are not left to the table's defaults (``use_interleaved_weight_layout_mlp``)
    settings: dict[str, Any] = field(default_factory=dict)
    #: parts of the network a checkpoint may lack altogether, by name prefix, each with the
    #: line that says so and how to convert without it (DeepSeek-V3's Multi-Token
    #: Prediction layer, which transformers neither loads nor saves)
    optional: dict[str, str] = field(default_factory=dict)

    @property
    def keys(self) -> tuple[str, ...]:
        """What a mapping table's ``select.target`` may name to choose this target."""
        return tuple(k for k in (self.family, self.cls, self.description) if k)

    def __len__(self) -> int:
        return len(self.tensors)

    def __contains__(self, name: object) -> bool:
        return name in self.tensors

    def __getitem__(self, name: str) -> TargetTensor:
        return self.tensors[name]

    def layers(self) -> dict[str, tuple[str, ...] | None]:
        """Layer path -> the cell's class names, its own first, then its bases (``None``
        when unknown, as for templates)."""
        return {t.name.rpartition(".")[0]: t.lineage or ((t.layer,) if t.layer else None)
                for t in self.tensors.values()}

    def siblings(self) -> dict[str, frozenset[str]]:
        """Layer path -> the parameter suffixes the target has at that path."""
        out: dict[str, set[str]] = {}
        for name in self.tensors:
            prefix, _, suffix = name.rpartition(".")
            out.setdefault(prefix, set()).add(suffix)
        return {k: frozenset(v) for k, v in out.items()}


def from_cell(cell: Any, description: str | None = None) -> Target:
    """The tensors a MindSpore ``nn.Cell`` expects, with each owning layer's type.

    Args:
        cell: a ``mindspore.nn.Cell``.
        description: shown in reports; defaults to the cell's class name.
    """
    from mindspore import nn

    if not isinstance(cell, nn.Cell):
        raise TargetError(f"{description or cell!r} is a {type(cell).__name__}, not a "
                          "mindspore.nn.Cell; the factory must return the network")
    cells = dict(cell.cells_and_names())
    tensors: dict[str, TargetTensor] = {}
    for path, param in cell.parameters_and_names():
        # the checkpoint is keyed by Parameter.name; the path finds the owning cell
        owner = cells.get(path.rpartition(".")[0])
        tensors[param.name] = TargetTensor(param.name, tuple(param.shape),
                                           _ms_dtype_name(param.dtype),
                                           None if owner is None else type(owner).__name__,
                                           _lineage(owner), _constant(param),
                                           path if path != param.name else None)
    return Target("cell", description or type(cell).__name__, tensors, cell=cell,
                  cls=f"{type(cell).__module__}.{type(cell).__qualname__}")


def _constant(param: Any) -> Callable[[], Any] | None:
    """The value of a parameter the network computes itself, or ``None``: not trainable,
    and holding a concrete array rather than an initialiser's pending draw (which is how
    ``no_init_parameters`` leaves every weight, BatchNorm statistics included)."""
    if param.requires_grad or getattr(param, "has_init", True):
        return None
    if _ms_dtype_name(param.dtype) not in NUMPY_DTYPES:
        return None
    return lambda: param.asnumpy()


def _lineage(cell: Any) -> tuple[str, ...]:
    """The cell's class and its bases up to (not including) ``nn.Cell``, nearest first."""
    if cell is None:
        return ()
    names = []
    for cls in type(cell).__mro__:
        if cls.__name__ in ("Cell", "object"):
            break
        names.append(cls.__name__)
    return tuple(names)


def _ms_dtype_name(dtype: Any) -> str:
    # MindSpore names dtypes Float32, BFloat16, UInt8...: lower-cased, ours
    name = str(dtype).lower()
    return name if name in NUMPY_DTYPES else str(dtype)


#: the folder of ``ms_port.archs`` holding the recorded targets of the built-in architectures
MANIFESTS = "manifests"


def load_manifest(name: str) -> Target | None:
    """The recorded Target of a built-in architecture, or ``None`` if none is recorded
    (``ms_port/archs/manifests/<name>.json``, written by :mod:`ms_port.archs.manifest`)."""
    resource = resources.files("ms_port.archs") / MANIFESTS / f"{name}.json"
    if not resource.is_file():
        return None
    data = json.loads(resource.read_text())
    tensors = {n: TargetTensor(n, tuple(shape), dtype, layer)
               for n, shape, dtype, layer in data["tensors"]}
    return Target("arch", name, tensors)


#: the MindCV release whose models are recorded (:mod:`ms_port.archs.manifest`)
MINDCV_RECORDED = "0.3.0"


def zoo_tensor_row(t: TargetTensor) -> list[Any]:
    """One tensor of a recorded zoo model: what :func:`recorded_zoo` rebuilds it from."""
    return [t.name, list(t.shape), t.dtype, t.layer, list(t.lineage), t.path]


def _mindcv_archive() -> Any:
    return resources.files("ms_port.archs") / MANIFESTS / f"mindcv-{MINDCV_RECORDED}.zip"


@functools.lru_cache(maxsize=1)
def mindcv_recorded() -> frozenset[str]:
    """The MindCV models recorded (:mod:`ms_port.archs.manifest`)."""
    import zipfile

    archive = _mindcv_archive()
    if not archive.is_file():
        return frozenset()
    with archive.open("rb") as f, zipfile.ZipFile(f) as zf:
        return frozenset(n.removesuffix(".json") for n in zf.namelist())


def _mindcv_record(name: str) -> dict[str, Any] | None:
    """One recorded MindCV model (its member of the archive only), or ``None``."""
    import zipfile

    if name not in mindcv_recorded():
        return None
    with _mindcv_archive().open("rb") as f, zipfile.ZipFile(f) as zf:
        return json.loads(zf.read(f"{name}.json"))


def recorded_zoo(spec: str) -> Target | None:
    """``mindcv:NAME`` as recorded from MindCV (:mod:`ms_port.archs.manifest`), or
    ``mindyolo:CONFIG.yaml`` as an earlier conversion recorded it
    (:mod:`ms_port.archs.yolo.record`), without importing MindSpore; ``None`` where it is
    not recorded, or where another MindCV than the recorded one is installed (then the
    network is built)."""
    from importlib import metadata

    prefix, _, name = spec.partition(":")
    if prefix == "mindyolo":  # recorded by an earlier conversion, in the user's cache
        return importlib.import_module("ms_port.archs.yolo.record").recorded(spec)
    if prefix != "mindcv":
        return None
    try:
        installed = metadata.version("mindcv")
    except metadata.PackageNotFoundError:
        installed = None
    if installed not in (None, MINDCV_RECORDED):
        return None
    record = _mindcv_record(name)
    if record is None:
        return None
    tensors = {n: TargetTensor(n, tuple(shape), dtype, layer, tuple(lineage), None, path)
               for n, shape, dtype, layer, lineage, path in record["tensors"]}
    return Target("cell", spec, tensors, cls=record["cls"], notes=[
        f"{spec}: names, shapes and layer kinds as recorded from MindCV {MINDCV_RECORDED}'s "
        "create_model (MindSpore not imported)"])


def from_arch(name: str, **kwargs: Any) -> Target:
    """Describe a registered architecture's MindSpore network.

    Built-in architectures at their default options come from a recorded manifest
    (:mod:`ms_port.archs.manifest`); anything else builds the network.
    """
    from ..archs import get_arch

    arch = get_arch(name)
    if not kwargs and (recorded := load_manifest(name)) is not None:
        return recorded  # no MindSpore import needed for the default options
    cell = _call(arch.build_mindspore, f"building architecture {name!r}", **kwargs)
    target = from_cell(cell, name)
    target.kind = "arch"
    return target


def _mindcv_factory(name: str, option: str) -> Callable[..., Any]:
    """``mindcv:NAME``: MindCV's ``create_model(NAME, pretrained=False)`` (no download)."""
    try:
        models = importlib.import_module("mindcv.models")
    except ImportError:
        raise TargetError(f"{option} 'mindcv:{name}': MindCV is not installed; "
                          "pip install mindcv==0.3.0") from None
    known = list(models.list_models())
    if name not in known:
        import difflib

        close = difflib.get_close_matches(name, known, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else f" ({len(known)} known)"
        raise TargetError(f"{option} 'mindcv:{name}': MindCV has no model {name!r}{hint}")
    return lambda **kw: models.create_model(name, pretrained=False, **kw)


def _mindyolo_factory(name: str, option: str) -> Callable[..., Any]:
    """``mindyolo:CONFIG.yaml``: MindYOLO's network for a config file
    (:mod:`ms_port.archs.yolo.mindyolo`)."""
    return importlib.import_module("ms_port.archs.yolo.mindyolo").factory(name, option)


def _timm_factory(name: str, option: str) -> Callable[..., Any]:
    """``timm:NAME``: ``timm.create_model(NAME, pretrained=False)`` (no download)."""
    try:
        timm = importlib.import_module("timm")
    except ImportError:
        raise TargetError(f"{option} 'timm:{name}': timm is not installed; pip install timm"
                          ) from None
    return _zoo_model(name, option, "timm", timm.list_models(),
                      lambda **kw: timm.create_model(name, pretrained=False, **kw))


def _torchvision_factory(name: str, option: str) -> Callable[..., Any]:
    """``torchvision:NAME``: ``torchvision.models.get_model(NAME)`` (no weights)."""
    try:
        models = importlib.import_module("torchvision.models")
    except ImportError:
        raise TargetError(f"{option} 'torchvision:{name}': torchvision is not installed; "
                          "pip install torchvision") from None
    return _zoo_model(name, option, "torchvision", models.list_models(module=models),
                      lambda **kw: models.get_model(name, **kw))


def _zoo_model(name: str, option: str, zoo: str, known: list[str],
               build: Callable[..., Any]) -> Callable[..., Any]:
    if name not in known:
        import difflib

        close = difflib.get_close_matches(name, known, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else f" ({len(known)} known)"
        raise TargetError(f"{option} '{zoo}:{name}': {zoo} has no model {name!r}{hint}")
    return build


#: known zoo families: ``PREFIX:NAME`` builds the network without a user factory; the
#: MindSpore side's, and the PyTorch side's (``--torch-model timm:NAME``)
ZOOS: dict[str, Callable[[str, str], Callable[..., Any]]] = {
    "mindcv": _mindcv_factory, "mindyolo": _mindyolo_factory}
TORCH_ZOOS: dict[str, Callable[[str, str], Callable[..., Any]]] = {
    "timm": _timm_factory, "torchvision": _torchvision_factory}


#: PyTorch references built from what the checkpoint itself describes (its pickled module's
#: architecture): ``--torch-model PREFIX[:NAME]`` -> ``module:function(name, described)``
REFERENCES = {"ultralytics": "ms_port.archs.yolo.ultralytics:reference"}


def torch_reference(spec: Any, described: Any) -> Any:
    """``spec`` as verify builds it: a :data:`REFERENCES` prefix becomes its builder (told
    what the checkpoint describes of itself), anything else is returned as it is."""
    if not isinstance(spec, str):
        return spec
    prefix, _, name = spec.partition(":")
    if prefix not in REFERENCES:
        return spec
    module, _, function = REFERENCES[prefix].partition(":")
    return getattr(importlib.import_module(module), function)(name, described)


def zoo_input_shape(spec: Any) -> tuple[tuple[int, ...], str] | None:
    """The input a zoo model is made for, and where that was read: for ``mindcv:NAME`` its
    default configuration's ``input_size``, else MindCV's 3×224×224; for
    ``mindyolo:CONFIG.yaml`` the config's ``img_size`` (MindYOLO's default 640)."""
    if isinstance(spec, str) and spec.startswith("mindyolo:"):
        return importlib.import_module("ms_port.archs.yolo.mindyolo").input_shape(
            spec.partition(":")[2])
    if not isinstance(spec, str) or not spec.startswith("mindcv:"):
        return None
    name = spec.partition(":")[2]
    try:
        models = importlib.import_module("mindcv.models")
        cfg = models.get_pretrained_cfg(name) if models.is_model(name) else {}
    except Exception:  # MindCV absent or its registry changed: the caller's default holds
        return None
    size = cfg.get("input_size") if isinstance(cfg, dict) else None
    if (isinstance(size, (tuple, list)) and len(size) == 3
            and all(isinstance(d, int) and 0 < d <= 4096 for d in size)):
        return tuple(size), f"MindCV's default configuration of {name}"
    return (3, 224, 224), f"MindCV's input size (its configuration of {name} names none)"


def import_callable(spec: str, option: str = "--ms-model") -> Callable[..., Any]:
    """Import ``package.module:callable`` (the current directory is importable), or a
    known zoo's model: ``mindcv:resnet50`` (``--ms-model``), ``timm:resnet50`` or
    ``torchvision:resnet50`` (``--torch-model``)."""
    zoo, _, zoo_name = spec.partition(":")
    zoos = TORCH_ZOOS if option == "--torch-model" else ZOOS
    if zoo in zoos and zoo_name:
        return zoos[zoo](zoo_name, option)
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise TargetError(f"{option} {spec!r}: expected 'package.module:callable', "
                          "e.g. mypkg.nets:build_net")
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:  # any import failure is the module's own
        raise TargetError(f"{option} {spec!r}: cannot import {module_name!r} "
                          f"({type(exc).__name__}: {exc}); check the module path and that "
                          "it imports on its own") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise TargetError(f"{option} {spec!r}: module {module_name!r} has no {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise TargetError(f"{option} {spec!r}: {attr!r} is not callable")
    return obj


def instantiate(spec: Any, option: str) -> Any:
    """A network from ``"module:callable"``, a class or factory function, or as given."""
    if isinstance(spec, str):
        return _call(import_callable(spec, option), f"{option} {spec!r}")
    if isinstance(spec, type) or (callable(spec) and not hasattr(spec, "state_dict")
                                  and not hasattr(spec, "parameters_and_names")):
        return _call(spec, f"{option} {getattr(spec, '__name__', spec)!r}")
    return spec


def _call(factory: Callable[..., Any], what: str, **kwargs: Any) -> Any:
    try:
        return factory(**kwargs)
    except MsPortError:
        raise
    except Exception as exc:  # the factory is user code
        raise TargetError(f"{what} failed ({type(exc).__name__}: {exc})") from exc


def without_weights(build: Callable[[], Any]) -> Any:
    """``build()`` under MindSpore's ``no_init_parameters``: the names and shapes are all
    there, the random initial weights are never drawn (a 1.1B model: milliseconds instead
    of 34 s and 3 GiB). A factory that reads its parameters while building is built the
    ordinary way."""
    try:
        from mindspore.nn.utils import no_init_parameters
    except ImportError:  # pragma: no cover - MindSpore < 2.5
        return build()
    try:
        with no_init_parameters():
            return build()
    except TargetError:
        return build()


def from_factory(spec: str, *, recorded: bool = True, **kwargs: Any) -> Target:
    """Build a network from ``module:callable`` (without drawing its weights) and
    describe it; a recorded zoo model (:func:`recorded_zoo`) is described without
    building, unless ``recorded`` is False."""
    if recorded and not kwargs and (found := recorded_zoo(spec)) is not None:
        return found
    factory = import_callable(spec)
    cell = without_weights(lambda: _call(factory, f"--ms-model {spec!r}", **kwargs))
    target = from_cell(cell, spec)
    if recorded and not kwargs and spec.startswith("mindyolo:"):  # for the next time
        note = importlib.import_module("ms_port.archs.yolo.record").remember(spec, target)
        target.notes += [note] if note else []
    return target


#: model families built from the source's config.json: spec -> module with
#: ``target(config, **options)``, ``build(config, **options)`` and ``OPTIONS``
FAMILIES = {"mindformers:llama": "ms_port.archs.llama.family",
            "mindformers:qwen3": "ms_port.archs.parallel_core.family",
            "mindformers:qwen3_moe": "ms_port.archs.parallel_core.moe",
            "mindformers:deepseek3": "ms_port.archs.parallel_core.deepseek",
            "mindformers:deepseek32": "ms_port.archs.parallel_core.deepseek32",
            "mindformers:deepseek4": "ms_port.archs.parallel_core.deepseek4",
            "mindformers:glm4": "ms_port.archs.glm.family"}


#: the MindFormers 2.1 network each family builds, for ``ms-port archs``
FAMILY_NETWORKS = {
    "mindformers:llama": "LlamaForCausalLM (legacy)",
    "mindformers:qwen3": "TrainingQwen3ForCausalLM",
    "mindformers:qwen3_moe": "TrainingQwen3MoeForCausalLM",
    "mindformers:deepseek3": "TrainingDeepseekV3ForCausalLM",
    "mindformers:deepseek32": "TrainingDeepseekV3ForCausalLM (experimental_attention_variant: "
                              "dsa)",
    "mindformers:deepseek4": "DeepseekV4ForCausalLM (PyNative; needs hyper_parallel)",
    "mindformers:glm4": "ChatGLM2ForConditionalGeneration",
}

#: the model zoos a ``PREFIX:NAME`` names, each side, with what it calls
ZOO_HELP = {
    "--ms-model mindcv:NAME": "MindCV 0.3.0's create_model(NAME), no download",
    "--ms-model mindyolo:CONFIG.yaml": "MindYOLO 0.5.0's network for its training config "
                                       "(with its __BASE__ files)",
    "--torch-model timm:NAME": "timm.create_model(NAME, pretrained=False)",
    "--torch-model torchvision:NAME": "torchvision.models.get_model(NAME), no weights",
    "--torch-model ultralytics[:NAME.yaml]": "ultralytics' network, as the checkpoint's own "
                                             "pickled module describes it (or NAME.yaml)",
}


def family_module(spec: str) -> Any:
    return importlib.import_module(FAMILIES[spec])


def family_blocks(spec: str) -> Any:
    """The family's blocks factory, for verify one block at a time, or None.

    A family module names it as ``BLOCKS = "module:function"``, imported only here: the
    blocks import MindSpore and the family's own module, which stays light (it is read for
    every plan) and imports neither back."""
    named = getattr(family_module(spec), "BLOCKS", None)
    if named is None:
        return None
    module, _, function = named.partition(":")
    return getattr(importlib.import_module(module), function)


def family_options(spec: str, options: dict[str, Any] | None) -> dict[str, Any]:
    """Options for a family, checked against what it takes (``qkv_concat=true``)."""
    allowed = family_module(spec).OPTIONS
    out: dict[str, Any] = {}
    for key, value in (options or {}).items():
        if key not in allowed:
            raise TargetError(f"{spec} takes no option {key!r}; it takes "
                              f"{', '.join(sorted(allowed))}")
        kind = allowed[key]
        if isinstance(value, str):
            if kind is bool:
                if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                    raise TargetError(f"{spec} option {key}={value!r}: expected true or false")
                value = value.lower() in ("true", "1", "yes")
            else:
                try:
                    value = kind(value)
                except ValueError:
                    raise TargetError(f"{spec} option {key}={value!r}: expected "
                                      f"{kind.__name__}") from None
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise TargetError(f"{spec} option {key}={value!r}: expected {kind.__name__}")
        out[key] = value
    return out


def from_family(spec: str, config: dict[str, Any] | None,
                options: dict[str, Any] | None = None) -> Target:
    """A known family's target computed from the model's config (no network is built)."""
    if config is None:
        raise TargetError(f"--ms-model {spec} builds the network from the model's config.json, "
                          "and none was found beside the source — give a Hugging Face model "
                          "directory, put config.json beside the file, or pass --config")
    opts = {k: v for k, v in family_options(spec, options).items() if k != "seq_length"}
    return family_module(spec).target(config, **opts)


def _recognise(config: dict[str, Any] | None, names: set[str],
               only: str | None = None) -> tuple[str, dict[str, Any]] | None:
    """(the family, the options of its variant) whose target has these names: ``only``
    that family, or every known one in turn."""
    if not config:
        return None
    for spec in FAMILIES if only is None else (only,):
        module = family_module(spec)
        for options in getattr(module, "VARIANTS", ({},)):
            try:
                target = module.target(config, **options)
            except MsPortError:
                break  # the config is not this family's
            if set(target.tensors) == names:
                return spec, dict(options)
    return None


def mark_family(target: Target, config: dict[str, Any] | None,
                options: dict[str, Any] | None, family: str | None = None) -> Target | None:
    """Mark a checkpoint's own names (``target``) as a known family's checkpoint:
    ``family``, or the one its names are recognised as. ``target`` takes the family and
    the ``settings`` the family's table reads: the layout its names show (``qkv_concat``),
    with the user's ``options`` for what names cannot show (``use_rearrange_rope``); an
    option the names contradict is refused in one line. Returns the family's computed
    target (its ``notes`` say what to know), or ``None`` where there is no family or no
    config to compute it from."""
    names = set(target.tensors)
    found = _recognise(config, names, only=family)
    if family is None and found is None:
        return None
    family = family or found[0]
    target.family = family
    if not config:
        return None
    shown, given = (found[1] if found else {}), family_options(family, options)
    for key, value in shown.items():
        if key in given and given[key] != value:
            raise TargetError(f"--ms-option {key}={str(given[key]).lower()}: the checkpoint's "
                              f"names are {family}'s layout with {key}={str(value).lower()}; "
                              "drop the option")
    computed = from_family(family, config, {**shown, **given})
    target.settings = computed.settings
    return computed


def from_template(path: str | Path) -> Target:
    """The names, shapes and dtypes of a template checkpoint (its data is not kept)."""
    from .sources import read_source

    source = read_source(path, strip_prefixes=False)
    return from_infos(source.tensors.values(), str(path))


def from_infos(infos: Any, description: str) -> Target:
    tensors = {i.name: TargetTensor(i.name, i.shape, i.dtype) for i in infos
               if isinstance(i, TensorInfo)}
    return Target("template", description, tensors)
