"""The architecture registry: one decorator registers one named architecture.

An entry ties together a MindSpore network factory, the PyTorch reference network it
must reproduce, the mapping table that bridges their names, and the default input
shape for ``verify``. Neither framework is imported until a network is built.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import ArchError

_REGISTRY: dict[str, Arch] = {}


def _import_callable(spec: str) -> Callable[..., Any]:
    module, _, attr = spec.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


@dataclass(frozen=True)
class Arch:
    """A registered architecture.

    Attributes:
        name: the registry key (``resnet50``).
        ms_factory: builds the MindSpore ``nn.Cell``; keyword options pass through.
        torch_factory: builds the PyTorch reference module, a callable or a
            ``"module:callable"`` string imported on first use.
        mapping: name of a table in ``mappings/`` (``"resnet"``) or a path to a YAML file.
        input_shape: one sample's input shape for ``verify`` (no batch axis).
        reference: what the PyTorch side is, for humans (``torchvision.models.resnet50``).
        notes: restrictions or remarks shown by ``ms-port archs``.
    """

    name: str
    ms_factory: Callable[..., Any]
    torch_factory: Callable[..., Any] | str
    mapping: str | None = None
    input_shape: tuple[int, ...] = (3, 224, 224)
    reference: str = ""
    notes: str = ""
    defaults: dict[str, Any] = field(default_factory=dict)

    def build_mindspore(self, **kwargs: Any) -> Any:
        """Build the MindSpore network (``mindspore.nn.Cell``)."""
        return self.ms_factory(**{**self.defaults, **kwargs})

    def build_torch(self, **kwargs: Any) -> Any:
        """Build the PyTorch reference network (``torch.nn.Module``), randomly initialised."""
        factory = self.torch_factory
        if isinstance(factory, str):
            factory = _import_callable(factory)
        return factory(**{**self.defaults, **kwargs})

    def mapping_table(self) -> Any:
        """The :class:`~ms_port.match.mapping.MappingTable` this architecture converts with."""
        from ..match.mapping import MappingTable, load_mapping

        return load_mapping(self.mapping) if self.mapping else MappingTable.empty()


def register_arch(
    name: str,
    *,
    torch: Callable[..., Any] | str,
    mapping: str | None = None,
    input_shape: tuple[int, ...] = (3, 224, 224),
    reference: str = "",
    notes: str = "",
    defaults: dict[str, Any] | None = None,
    replace: bool = False,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated MindSpore factory as architecture ``name``.

    Args:
        name: registry key; registering it twice raises unless ``replace=True``.
        torch: the PyTorch reference factory, or ``"module:callable"``.
        mapping: mapping table name in ``mappings/`` or a path to a YAML file.
        input_shape: one sample's input shape for ``verify``.
        reference: human-readable name of the PyTorch reference.
        notes: restrictions shown by ``ms-port archs``.
        defaults: keyword arguments passed to both factories (e.g. ``num_classes``).
        replace: allow overriding an existing entry (for experiments in a notebook).

    Example:
        >>> @register_arch("tiny", torch="mypkg.torch_nets:tiny", mapping="my.yaml")
        ... def tiny(**kw):
        ...     return MyTinyCell(**kw)
    """

    _load_builtins()  # so a user's name that clashes with a built-in fails here, not later

    def decorator(ms_factory: Callable[..., Any]) -> Callable[..., Any]:
        if name in _REGISTRY and not replace:
            raise ArchError(
                f"architecture {name!r} is already registered; pick another name "
                "or pass replace=True"
            )
        _REGISTRY[name] = Arch(
            name=name, ms_factory=ms_factory, torch_factory=torch, mapping=mapping,
            input_shape=tuple(input_shape), reference=reference, notes=notes,
            defaults=dict(defaults or {}),
        )
        return ms_factory

    return decorator


_BUILTINS: list[str] = []  # the built-in names, once registered


def _load_builtins() -> None:
    """Register the built-in families (ResNet), once."""
    if _BUILTINS:
        return
    from .resnet.family import builtin_archs

    for fields in builtin_archs():
        _REGISTRY.setdefault(fields["name"], Arch(**fields))
        _BUILTINS.append(fields["name"])


def _natural(name: str) -> list:
    """``resnet18`` before ``resnet101``."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def list_archs() -> list[str]:
    """Names of all registered architectures, in natural order (resnet18 … resnet152)."""
    _load_builtins()
    return sorted(_REGISTRY, key=_natural)


def get_arch(name: str) -> Arch:
    """The registered architecture ``name``; an unknown name lists the known ones."""
    _load_builtins()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ArchError(
            f"unknown architecture {name!r}; known: {', '.join(sorted(_REGISTRY))} "
            "(or register your own with ms_port.register_arch)"
        ) from None
