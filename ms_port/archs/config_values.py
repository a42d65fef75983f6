"""The one reader of a Hugging Face ``config.json`` for every family: numbers and switches
here, the rotary settings (``rope_theta``, ``partial_rotary_factor``, the scaling; at the
top of the config or inside transformers 5's ``rope_parameters``) through
:func:`~ms_port.match.rope.read_rope`, re-exported here. Each value is checked before use
(a file's value is data); each refusal is one line naming the key and what it should be.
``tests/test_config_reader.py`` holds every family to both config layouts, and that no
family reads a rotary key by itself."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import TargetError, shown
from ..match.rope import Rope, read_rope

#: the largest size a config may give (a dimension of a real model is far below)
MAX_SIZE = 2**31
#: the most decoder layers a config may ask for (the largest published LLaMA has 126): a
#: target is listed layer by layer, so this bounds the work a file asks for
MAX_LAYERS = 1024


def read_int(config: Mapping[str, Any], key: str, default: int | None = None, *,
             least: int = 1, most: int = MAX_SIZE) -> int:
    """An integer from ``least`` (a positive one by default) to ``most``; ``default``
    where unset or null."""
    value = config.get(key, default)
    if value is None:
        value = default
    if not isinstance(value, int) or isinstance(value, bool) or not least <= value <= most:
        kind = "a positive integer" if least == 1 else f"an integer from {least}"
        raise TargetError(f"config.json: {key} is {shown(value)}; expected {kind} there (at "
                          f"most {most})")
    return value


def read_float(config: Mapping[str, Any], key: str, default: float) -> float:
    """A positive finite number; ``default`` where unset or null."""
    value = config.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            0 < value < 1e300):
        raise TargetError(f"config.json: {key} is {shown(value)}; expected a positive finite "
                          "number there")
    return float(value)


def read_bool(config: Mapping[str, Any], key: str, default: bool = False) -> bool:
    """true or false; ``default`` where unset or null."""
    value = config.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise TargetError(f"config.json: {key} is {shown(value)}; expected true or false")
    return value


def read_layers(config: Mapping[str, Any]) -> int:
    """``num_hidden_layers``, at most :data:`MAX_LAYERS`."""
    layers = read_int(config, "num_hidden_layers")
    if layers > MAX_LAYERS:
        raise TargetError(f"config.json: num_hidden_layers {layers} is more than any "
                          f"published model ({MAX_LAYERS} at most); check the config")
    return layers


__all__ = ["MAX_LAYERS", "MAX_SIZE", "Rope", "read_bool", "read_float", "read_int",
           "read_layers", "read_rope"]
