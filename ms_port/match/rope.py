"""Rotary position embeddings as a Hugging Face config states them, and as MindFormers
computes them.

The weights never depend on RoPE scaling; the network does. This module reads the scaling
from either config form (the Hub's ``rope_scaling`` beside a top-level ``rope_theta``, and
transformers 5's ``rope_parameters`` with ``rope_theta`` inside), says what MindFormers'
legacy ``FreqsMgr`` (``extend_method`` / ``scaling_factor``) computes the same function
with, or why none does, and computes the ``inv_freq`` a config implies (old checkpoints
saved it as a buffer).

Measured on MindFormers 2.1.0 against transformers 5 (tiny seeded models, 200 positions):
``LLAMA3`` matches ``llama3`` to 2.2e-7, ``YARN`` with Hugging Face's defaults matches
``yarn`` to 3.0e-7 (the 0.1·ln(factor)+1 attention factor is folded into cos/sin).
MindFormers' ``linear`` always raises (its factor check is inverted); ``dynamic`` depends
on the sequence length at run time, which MindFormers' table does not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import TargetError, shown


@dataclass(frozen=True)
class Rope:
    """A model's rotary embedding: what its config says and what MindFormers makes of it.

    Attributes:
        kind: Hugging Face's ``rope_type`` (``default``, ``llama3``, ``yarn``, …).
        key: the config key it was read from (``rope_scaling``, ``rope_parameters``), or
            ``None`` for plain RoPE with no such key.
        theta: the base.
        params: the scaling's parameters as the config gives them.
        method: the MindFormers ``extend_method`` of this kind (``LLAMA3``, ``YARN``), if any.
        scaling: its ``scaling_factor`` dict, as read from the config.
        problem: why MindFormers cannot compute this scaling exactly, else ``None``.
        original: the pretraining length the scaling extends from, else ``None``.
        partial: ``partial_rotary_factor`` (the share of each head rotated) where the config
            gives one (inside the RoPE mapping first, then at the top, as transformers
            reads it), else ``None``: the network's own default.
    """

    kind: str
    key: str | None
    theta: float
    params: dict[str, Any] = field(default_factory=dict)
    method: str | None = None
    scaling: dict[str, Any] | None = None
    problem: str | None = None
    original: int | None = None
    partial: float | None = None

    def require_partial(self, expected: float, network: str) -> None:
        """Refuse a ``partial_rotary_factor`` other than the one ``network`` rotates with
        (1.0: every dimension of a head; GLM-4's 0.5: half). Unset is the network's own."""
        if self.partial is not None and self.partial != expected:
            where = f"{self.key}." if self.partial_key else ""
            raise TargetError(f"config.json: {where}partial_rotary_factor is "
                              f"{self.partial:g}; {network} rotates {_share(expected)} of "
                              "each head, so it would compute another function")

    @property
    def partial_key(self) -> bool:
        """Whether ``partial`` was read inside the RoPE mapping (transformers 5's layout)."""
        return "partial_rotary_factor" in self.params

    @property
    def extend_method(self) -> str:
        """MindFormers' ``extend_method``: ``"None"`` unless it computes this exactly."""
        return self.method if self.method and not self.problem else "None"

    @property
    def scaling_factor(self) -> Any:
        """MindFormers' ``scaling_factor``: 1.0 unless it computes this exactly."""
        return dict(self.scaling) if self.scaling and not self.problem else 1.0

    def describe(self) -> str:
        """``yarn (rope_scaling) -> YARN {factor: 4.0, …}`` or ``plain RoPE, theta 10000``."""
        if self.kind == "default":
            return f"plain RoPE, theta {self.theta:g}"
        mapped = (f"MindFormers cannot compute it exactly: {self.problem}" if self.problem
                  else f"extend_method {self.extend_method}, scaling_factor "
                       f"{self.scaling_factor}")
        return f"RoPE scaling {self.kind} ({self.key}), theta {self.theta:g}: {mapped}"


def _share(factor: float) -> str:
    return {1.0: "every dimension", 0.5: "half"}.get(factor, f"{factor:g}")


def _number(given: dict[str, Any], key: str, where: str, default: float | None = None
            ) -> float | None:
    value = given.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and 0 < value < 1e300):
        raise TargetError(f"config.json: {where}.{key} is {shown(value)}; expected a positive "
                          "finite number")
    return float(value)


def _positions(given: dict[str, Any], key: str, where: str, default: Any) -> int | None:
    value = given.get(key, default)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= 2**31:
        raise TargetError(f"config.json: {where}.{key} is {shown(value)}; expected a positive "
                          "integer")
    return value


def _llama3(p: dict[str, Any], where: str, config: dict[str, Any]) -> tuple[Any, str | None,
                                                                            int | None]:
    factor = _number(p, "factor", where)
    low = _number(p, "low_freq_factor", where)
    high = _number(p, "high_freq_factor", where)
    original = _positions(p, "original_max_position_embeddings", where,
                          config.get("max_position_embeddings"))
    if factor is None or low is None or high is None or original is None:
        lacking = [k for k, v in (("factor", factor), ("low_freq_factor", low),
                                  ("high_freq_factor", high),
                                  ("original_max_position_embeddings", original)) if v is None]
        raise TargetError(f"config.json: {where} (llama3) lacks {', '.join(lacking)}; check "
                          "the config")
    problem = None
    if factor < 1 or high <= low:
        problem = (f"factor {factor:g} < 1 or high_freq_factor {high:g} <= low_freq_factor "
                   f"{low:g}, which MindFormers' LLAMA3 refuses")
    return ({"factor": factor, "low_freq_factor": low, "high_freq_factor": high,
             "original_max_position_embeddings": original}, problem, original)


def _yarn(p: dict[str, Any], where: str, config: dict[str, Any]) -> tuple[Any, str | None,
                                                                          int | None]:
    original = _positions(p, "original_max_position_embeddings", where,
                          config.get("max_position_embeddings"))
    if original is None:
        raise TargetError(f"config.json: {where} (yarn) lacks original_max_position_embeddings "
                          "and the config has no max_position_embeddings; check the config")
    factor = _number(p, "factor", where)
    if factor is None:  # transformers: the ratio of the two lengths
        longest = _positions(config, "max_position_embeddings", "config", None)
        factor = float(longest / original) if longest else None
    if factor is None:
        raise TargetError(f"config.json: {where} (yarn) gives no factor; check the config")
    problems = []
    beta_fast = _number(p, "beta_fast", where, 32.0)
    beta_slow = _number(p, "beta_slow", where, 1.0)
    mscale, mscale_all_dim = p.get("mscale"), p.get("mscale_all_dim")
    if p.get("attention_factor") is not None:
        problems.append("an explicit attention_factor (MindFormers derives it from factor "
                        "and mscale)")
    if p.get("truncate") is False:
        problems.append("truncate: false (MindFormers always rounds the correction range)")
    if factor < 1 or beta_fast < beta_slow:
        problems.append(f"factor {factor:g} < 1 or beta_fast < beta_slow")
    partial = _partial(p, config, where)
    if partial not in (1.0, None):
        problems.append(f"partial_rotary_factor {partial:g}")
    # transformers uses mscale and mscale_all_dim only when both are set (and nonzero);
    # else its attention factor is 0.1*ln(factor)+1: MindFormers' with mscale 1, all_dim 0
    both = bool(mscale) and bool(mscale_all_dim)
    scale = _number(p, "mscale", where, 1.0) if both else 1.0
    scale_all = _number(p, "mscale_all_dim", where, 0.0) if both else 0.0
    return ({"factor": factor, "original_max_position_embeddings": original,
             "beta_fast": beta_fast, "beta_slow": beta_slow, "mscale": scale,
             "mscale_all_dim": scale_all}, "; ".join(problems) or None, original)


def _partial(given: dict[str, Any], config: dict[str, Any], where: str) -> float | None:
    """``partial_rotary_factor`` as transformers reads it: inside the RoPE mapping first,
    then at the top of the config; a share of a head, in (0, 1]."""
    inside = given.get("partial_rotary_factor") is not None
    value = _number(given, "partial_rotary_factor", where) if inside else \
        _number(config, "partial_rotary_factor", "config")
    if value is not None and value > 1:
        raise TargetError(f"config.json: {where if inside else 'config'}.partial_rotary_factor "
                          f"is {value:g}; expected a share of a head, at most 1")
    return value


#: Hugging Face rope_type -> (MindFormers extend_method, reader of its parameters)
SCALINGS = {"llama3": ("LLAMA3", _llama3), "yarn": ("YARN", _yarn)}
#: scalings MindFormers has no exact counterpart for, and why
UNSUPPORTED = {
    "linear": "MindFormers 2.1's 'linear' extend method refuses every factor (its check is "
              "inverted)",
    "dynamic": "dynamic NTK recomputes the frequencies from the sequence length at run time; "
               "MindFormers' table is fixed",
}


#: the labels DeepSeek-V4's rope_parameters is keyed by (the attention's own, and its
#: compressed branches'), in place of one mapping
LABELLED = ("main", "compress")
#: DeepSeek-V4's compressed branches' rotary base where its config is silent (transformers'
#: and MindFormers' default)
COMPRESS_THETA = 160000.0


def read_rope(config: dict[str, Any], part: str = "main") -> Rope:
    """The rotary embedding a Hugging Face config describes (either config form): the
    one reader of ``rope_theta``, ``partial_rotary_factor`` and the scaling for every
    family (a test holds that no family reads those keys by itself).

    DeepSeek-V4 describes two embeddings: its attention's (``part`` ``main``) and its
    compressed branches' (``compress``): transformers 5 writes ``rope_parameters`` keyed by
    those labels, the Hub's files ``rope_theta`` for the first and ``compress_rope_theta``
    with ``rope_scaling`` for the second (the sliding-window attention is never scaled).

    Never refuses a scaling for conversion: the weights do not depend on it. A scaling
    MindFormers cannot compute exactly carries its ``problem``; a malformed value is a
    :class:`~ms_port.errors.TargetError` naming the key.
    """
    given, key = None, None
    # transformers 5 writes rope_parameters; where a config holds both, transformers takes
    # rope_scaling (its convert_rope_params_to_dict: `rope_scaling or rope_parameters`)
    for name in ("rope_scaling", "rope_parameters"):
        value = config.get(name)
        if value is None:
            continue
        if not isinstance(value, dict):
            raise TargetError(f"config.json: {name} is {shown(value)}, not a mapping; check "
                              "the config")
        if given is None and value:
            given, key = value, name
    given = given or {}
    if part not in LABELLED:
        raise ValueError(f"part {part!r}: one of {LABELLED}")
    if given and set(given) <= set(LABELLED) and isinstance(given.get(part), dict):
        # DeepSeek-V4: one mapping per kind of embedding
        given, key = given[part], f"{key}.{part}"
    elif part == "compress":  # the Hub's DeepSeek-V4: the scaling is the compressed ones'
        theta = _number(config, "compress_rope_theta", "config")
        given = {**given, "rope_theta": COMPRESS_THETA if theta is None else theta}
    elif key == "rope_scaling" and config.get("compress_rope_theta") is not None:
        given, key = {}, None  # the Hub's DeepSeek-V4: its attention is never scaled
    # transformers takes the theta inside the RoPE mapping first (its setdefault)
    theta = (_number(given, "rope_theta", key or "rope_parameters")
             or _number(config, "rope_theta", "config") or 10000.0)
    kind = given.get("rope_type", given.get("type", "default")) or "default"
    if not isinstance(kind, str):
        raise TargetError(f"config.json: {key}.rope_type is {shown(kind)}; expected a name")
    where = key or "rope_scaling"
    partial = _partial(given, config, where)
    params = {k: v for k, v in given.items() if k not in ("rope_type", "type", "rope_theta")}
    if kind == "default":
        return Rope("default", key, theta, params, partial=partial)
    if kind in SCALINGS:
        method, reader = SCALINGS[kind]
        scaling, problem, original = reader(given, where, config)
        return Rope(kind, key, theta, params, method, scaling, problem, original, partial)
    problem = UNSUPPORTED.get(kind, f"MindFormers' LlamaForCausalLM has no {shown(kind)} "
                                    "extend method")
    return Rope(kind, key, theta, params, problem=problem, partial=partial)


def inv_freq(rope: Rope, head_dim: int) -> np.ndarray:
    """The float32 ``inv_freq`` a model with this embedding computes at initialisation,
    as transformers' rotary classes do (``1 / theta ** (arange(0, d, 2) / d)``, then the
    scaling's own change for llama3 and yarn)."""
    exponent = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    base = np.float32(rope.theta) ** exponent
    plain = (np.float32(1.0) / base).astype(np.float32)
    s = rope.scaling
    if s is None or rope.kind not in SCALINGS:  # plain, linear, dynamic (and unknown kinds)
        return plain
    if rope.kind == "llama3":
        factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
        old = s["original_max_position_embeddings"]
        wavelen = 2 * math.pi / plain
        scaled = np.where(wavelen > old / low, plain / factor, plain)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / high) & ~(wavelen > old / low)
        return np.where(medium, smoothed, scaled).astype(np.float32)
    # yarn
    factor, dim = s["factor"], head_dim

    def correction(rotations: float) -> float:
        return (dim * math.log(s["original_max_position_embeddings"]
                               / (rotations * 2 * math.pi))) / (2 * math.log(rope.theta))

    low = max(math.floor(correction(s["beta_fast"])), 0)
    high = min(math.ceil(correction(s["beta_slow"])), dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp.astype(np.float32)
    interpolation = np.float32(1.0) / (np.float32(factor) * base)
    return (interpolation * (1 - extrapolation) + plain * extrapolation).astype(np.float32)


__all__ = ["SCALINGS", "UNSUPPORTED", "Rope", "inv_freq", "read_rope"]
