"""The torchvision ResNet family, registered by name (``resnet50``, ``resnext50_32x4d``, …).

Each entry pairs ``torchvision.models.<name>`` with the MindSpore network of
:mod:`ms_port.archs.resnet._ms`, converted through ``mappings/resnet.yaml``. Nothing
heavy is imported here: MindSpore loads only when a network is built.
"""

from __future__ import annotations

from typing import Any, Callable

# name: (block, blocks per stage, groups, width_per_group) — as in torchvision.
FAMILY: dict[str, tuple[str, tuple[int, int, int, int], int, int]] = {
    "resnet18": ("basic", (2, 2, 2, 2), 1, 64),
    "resnet34": ("basic", (3, 4, 6, 3), 1, 64),
    "resnet50": ("bottleneck", (3, 4, 6, 3), 1, 64),
    "resnet101": ("bottleneck", (3, 4, 23, 3), 1, 64),
    "resnet152": ("bottleneck", (3, 8, 36, 3), 1, 64),
    "resnext50_32x4d": ("bottleneck", (3, 4, 6, 3), 32, 4),
    "resnext101_32x8d": ("bottleneck", (3, 4, 23, 3), 32, 8),
    "resnext101_64x4d": ("bottleneck", (3, 4, 23, 3), 64, 4),
    "wide_resnet50_2": ("bottleneck", (3, 4, 6, 3), 1, 128),
    "wide_resnet101_2": ("bottleneck", (3, 4, 23, 3), 1, 128),
}

_NOTES = "options: num_classes, zero_init_residual (no replace_stride_with_dilation, norm_layer)"


def _factory(
    name: str, block: str, layers: tuple[int, ...], groups: int, width: int,
) -> Callable[..., Any]:
    def factory(*, num_classes: int = 1000, zero_init_residual: bool = False) -> Any:
        from ._ms import build

        return build(
            block, layers, groups=groups, width_per_group=width,
            num_classes=num_classes, zero_init_residual=zero_init_residual,
        )

    factory.__name__ = factory.__qualname__ = name
    factory.__doc__ = f"MindSpore ``{name}`` matching ``torchvision.models.{name}``."
    return factory


def builtin_archs() -> list[dict[str, Any]]:
    """The family's entries for the registry (:func:`ms_port.archs.registry.get_arch`),
    as :class:`~ms_port.archs.registry.Arch` fields; this module imports no registry."""
    return [dict(name=name, ms_factory=_factory(name, block, layers, groups, width),
                 torch_factory=f"torchvision.models:{name}", mapping="resnet",
                 input_shape=(3, 224, 224), reference=f"torchvision.models.{name}",
                 notes=_NOTES)
            for name, (block, layers, groups, width) in FAMILY.items()]
