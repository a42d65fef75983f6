"""Buffers a checkpoint may hold that are computed from the config, not learned.

Checkpoints saved by transformers before 4.31 hold every LLaMA layer's
``self_attn.rotary_emb.inv_freq``: a function of ``rope_theta`` and the head size, not a
weight. A mapping table's ``derived:`` entry names such a buffer and the function here
that computes it; the plan checks the buffer against the config and drops it, or refuses
it when it disagrees (that config would compute another network).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .rope import inv_freq, read_rope


@dataclass(frozen=True)
class Derived:
    """A config-derived value: how to compute it and which config keys it comes from."""

    compute: Callable[[dict[str, Any]], np.ndarray]
    keys: str
    #: relative difference still counted as the same value (the formula's float32 rounding
    #: differs by an ulp between numpy and torch; another theta or scaling differs by far more)
    rtol: float = 1e-5


def _head_dim(config: dict[str, Any]) -> int:
    given = config.get("head_dim")
    if isinstance(given, int) and not isinstance(given, bool) and given > 0:
        return given
    return int(config["hidden_size"]) // int(config["num_attention_heads"])


def _rope_inv_freq(config: dict[str, Any]) -> np.ndarray:
    return inv_freq(read_rope(config), _head_dim(config))


def _glm_inv_freq(config: dict[str, Any]) -> np.ndarray:
    """GLM-4's remote code (``modeling_chatglm.py``) stores ``rotary_pos_emb.inv_freq`` over
    ``kv_channels / 2`` dimensions with base 10000 whatever ``rope_ratio`` says; its forward
    computes its own frequencies with ``10000 × rope_ratio`` and never reads the buffer."""
    heads = int(config["num_attention_heads"])
    dim = int(config.get("kv_channels") or int(config["hidden_size"]) // heads) // 2
    return (1.0 / (10000.0 ** (np.arange(0, dim, 2, dtype=np.float64) / dim))).astype(
        np.float32)


#: the names a table's ``derived: [{value: NAME}]`` may give
DERIVED = {
    "rope_inv_freq": Derived(_rope_inv_freq, "rope_theta and head_dim (hidden_size / "
                             "num_attention_heads), with rope_scaling where set"),
    "glm_inv_freq": Derived(_glm_inv_freq, "kv_channels / 2 dimensions, base 10000 (the "
                            "remote code's stored buffer ignores rope_ratio)"),
}


def rounding_of(dtype: Any) -> float:
    """Twice the relative step of a float dtype (bfloat16: 2^-6), 0 for others: a buffer
    computed and stored in a narrow dtype (GLM-4's remote code computes its ``inv_freq``
    in ``torch_dtype``: bfloat16, each step rounded) is off the exact value by a few of
    its steps, while another base or size is off by far more."""
    import ml_dtypes

    try:
        return 2.0 * float(ml_dtypes.finfo(dtype).eps)
    except (TypeError, ValueError):
        return 0.0


def agrees(value: Derived, held: np.ndarray, config: dict[str, Any]) -> tuple[bool, str]:
    """Whether ``held`` is what ``config`` implies, within ``value.rtol`` or the rounding
    of the dtype it is stored in, and how far from it (for messages)."""
    expected = value.compute(config)
    stored = np.asarray(held).dtype
    held = np.asarray(held, dtype=np.float64)
    if held.shape != expected.shape:
        return False, f"shape {tuple(held.shape)}, the config implies {tuple(expected.shape)}"
    worst = float(np.max(np.abs(held - expected) / np.maximum(np.abs(expected), 1e-30),
                         initial=0.0))
    rtol = max(value.rtol, rounding_of(stored))
    return bool(worst <= rtol), (f"relative difference {worst:.2g}, at most {rtol:.2g} "
                                 "counted as equal")


__all__ = ["DERIVED", "Derived", "agrees", "rounding_of"]
