"""Which layer and which output on one side corresponds to which on the other.

:func:`correspondence_from_pairs` turns the conversion plan's parameter pairs into layer
pairs (and their blocks); :func:`pair_outputs` pairs the two networks' outputs by name,
then shape, then position. Leaf layers that names do not pair are aligned by execution
order in :mod:`ms_port.check.layers`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .compare import comparable

if TYPE_CHECKING:
    from collections.abc import Iterable


def correspondence_from_pairs(pairs: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """Turn parameter-name pairs into the layer correspondence :func:`run_parity` walks.

    Each pair's parent paths become a layer pair (``layer3.2.bn2.gamma`` ↔
    ``layer3.2.bn2.weight`` gives ``("layer3.2.bn2", "layer3.2.bn2")``). Where both parent
    paths have the same number of segments, their common-depth prefixes are paired too,
    so a divergence can be named at block level (``("layer3.2", "layer3.2")``,
    ``("layer3", "layer3")``, ``("layer1.0.down_sample_layer", "layer1.0.downsample")``).
    A block that would pair with two different counterparts is dropped. Root-level
    parameters (no parent) give no pair. Layers come in parameter order; each block
    follows the last layer inside it, which is the order in which forward hooks fire.

    Args:
        pairs: ``(mindspore_param_name, torch_param_name)`` pairs, as in a conversion Plan.

    Returns:
        ``(mindspore_path, torch_path)`` pairs, deduplicated.

    Example:
        >>> correspondence_from_pairs([("layer1.0.bn1.gamma", "layer1.0.bn1.weight"),
        ...                            ("end_point.weight", "fc.weight")])
        [('layer1.0.bn1', 'layer1.0.bn1'), ('layer1.0', 'layer1.0'), ('layer1', 'layer1'), \
('end_point', 'fc')]
    """
    layers: list[tuple[str, str]] = []
    for ms_name, torch_name in pairs:
        layer = (ms_name.rpartition(".")[0], torch_name.rpartition(".")[0])
        if layer[0] and layer[1] and layer not in layers:
            layers.append(layer)

    def blocks_of(layer: tuple[str, str]) -> list[tuple[str, str]]:
        ms_parts, torch_parts = layer[0].split("."), layer[1].split(".")
        if len(ms_parts) != len(torch_parts):
            return []
        # outermost first, so a stack of open blocks can be kept below
        return [(".".join(ms_parts[:k]), ".".join(torch_parts[:k]))
                for k in range(1, len(ms_parts))]

    # A block that two layers would pair differently is ambiguous: keep neither.
    ms_to_torch: dict[str, set[str]] = {}
    torch_to_ms: dict[str, set[str]] = {}
    for layer in layers:
        for ms_block, torch_block in blocks_of(layer):
            ms_to_torch.setdefault(ms_block, set()).add(torch_block)
            torch_to_ms.setdefault(torch_block, set()).add(ms_block)

    def unambiguous(block: tuple[str, str]) -> bool:
        return len(ms_to_torch[block[0]]) == 1 and len(torch_to_ms[block[1]]) == 1

    result: list[tuple[str, str]] = []
    open_blocks: list[tuple[str, str]] = []

    def emit(pair: tuple[str, str]) -> None:
        if pair not in result:
            result.append(pair)

    for layer in layers:
        blocks = [b for b in blocks_of(layer) if unambiguous(b)]
        # close the blocks this layer is not inside (innermost first)
        while open_blocks and open_blocks[-1] not in blocks:
            emit(open_blocks.pop())
        for block in blocks:
            if block not in open_blocks:
                open_blocks.append(block)
        emit(layer)
    while open_blocks:
        emit(open_blocks.pop())
    return result


def default_correspondence(torch_model: Any, ms_model: Any) -> list[tuple[str, str]]:
    """Layers that carry the same path on both sides, in PyTorch definition order."""
    ms_paths = {name for name, _ in ms_model.cells_and_names() if name}
    return [(name, name) for name, _ in torch_model.named_modules() if name in ms_paths]


def enclosing_block(torch_name: str, pairs: list[tuple[str, str]]) -> tuple[str, str] | None:
    """The pair whose PyTorch path most closely encloses ``torch_name``."""
    best = None
    for ms_path, torch_path in pairs:
        if torch_name.startswith(torch_path + ".") and (
                best is None or len(torch_path) > len(best[1])):
            best = (ms_path, torch_path)
    return best


def pair_outputs(torch_outs: list[tuple[str, np.ndarray]],
                 ms_outs: list[tuple[str, np.ndarray]], *,
                 by_position: bool = True) -> list[tuple[int, int]]:
    """Outputs paired by name (where the shapes agree), then by shape, then (unless
    ``by_position`` is false) by position: a lone output is named ``0``, like the first of a
    tuple, so a name alone proves little."""
    free = list(range(len(ms_outs)))
    pairs: list[tuple[int, int]] = []

    def fits(ti: int, mi: int) -> bool:
        return not isinstance(comparable(ms_outs[mi][1], torch_outs[ti][1]), str)

    rules = (lambda ti, mi: ms_outs[mi][0] == torch_outs[ti][0] and fits(ti, mi), fits,
             lambda ti, mi: True)[:3 if by_position else 2]
    rest = list(range(len(torch_outs)))
    for rule in rules:
        left = []
        for ti in rest:
            mi = next((m for m in free if rule(ti, m)), None)
            if mi is None:
                left.append(ti)
            else:
                pairs.append((ti, mi))
                free.remove(mi)
        rest = left
    return sorted(pairs)
