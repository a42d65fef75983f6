"""The vocabulary in spans of rows: the embedding and the head at a decoder layer's size.

At GLM-4-9B's widths the head is 151,552 × 4096: 2.3 GiB in float32, 4.6 GiB in the
float64 of the noise pass, against 1.5 GiB for a whole decoder layer in float64. Verify by
layers (:mod:`ms_port.check.blocks`) runs a piece whose tensors' rows are the vocabulary
(:attr:`~ms_port.archs.llama.blocks.Piece.rows`) a span of rows at a time, each span's
networks built for that many rows and freed before the next:

- **the head**: every span sees the same hidden states; its logits are its columns of
  the whole logits, and so is every layer output running over the vocabulary
  (:attr:`~ms_port.archs.llama.blocks.Piece.wide`); the final norm is the same in every
  span;
- **the embedding**: a span takes the token ids it holds (shifted to its first row; the
  others are given row 0 and not kept); each position's vector comes from the span that
  holds its id. Only spans holding an id run.

The spans' outputs are put back together into exactly what the whole piece gives, so the
comparisons, the noise and the sensitivity are measured on the same arrays as before
(:func:`measured` is :class:`~ms_port.check.layers.Measure` on recorded outputs).

This module is arithmetic on arrays and recorded layers; it reads and builds nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .layers import Event, distance


@dataclass(frozen=True)
class Span:
    """Rows ``start:stop`` of the vocabulary, and where the piece's token ids fall in it.

    Attributes:
        start / stop: the rows.
        embedding: the piece looks rows up by token id (False: a head, every row used).
    """

    start: int
    stop: int
    embedding: bool

    @property
    def rows(self) -> int:
        return self.stop - self.start

    def ids(self, ids: np.ndarray) -> np.ndarray:
        """The token ids this span's embedding is given: its own ids shifted to its first
        row, every other id to row 0 (its output there is not kept); a head's ids as
        they are (they are not looked up)."""
        if not self.embedding:
            return ids
        return np.where(self.holds(ids), ids - self.start, 0).astype(ids.dtype)

    def holds(self, ids: np.ndarray) -> np.ndarray:
        return (ids >= self.start) & (ids < self.stop)


def plan_spans(vocab: int, rows: int, *, embedding: bool,
               ids: list[np.ndarray]) -> list[Span]:
    """The spans of ``rows`` rows (the last may be shorter) covering ``vocab``; for an
    embedding, only those holding one of ``ids``."""
    rows = max(1, rows)
    spans = [Span(a, min(a + rows, vocab), embedding) for a in range(0, vocab, rows)]
    if embedding:
        spans = [s for s in spans if any(s.holds(x).any() for x in ids)]
    return spans


def _merge_arrays(parts: list[np.ndarray], spans: list[Span], ids: np.ndarray,
                  wide: bool) -> np.ndarray:
    """One output from each span's: the columns side by side (``wide``), the positions
    each embedding span holds (``Span.embedding``), or the first (the same in every
    span)."""
    if spans[0].embedding:
        merged = np.array(parts[0], copy=True)
        flat = merged.reshape(ids.size, -1)
        for part, span in zip(parts, spans):
            held = span.holds(ids).reshape(-1)
            flat[held] = part.reshape(ids.size, -1)[held]
        return merged
    if wide:
        return np.concatenate(parts, axis=-1)
    return parts[0]


def merge_output(parts: list[np.ndarray], spans: list[Span], ids: np.ndarray) -> np.ndarray:
    """The piece's output from its spans' (a head's runs over the vocabulary)."""
    return _merge_arrays(parts, spans, ids, wide=True)


def merge_events(per_span: list[list[Event]], spans: list[Span], ids: np.ndarray,
                 wide: tuple[str, ...]) -> list[Event]:
    """The layers a piece recorded, from each span's recording: as the first span
    recorded them, each output put together from every span's (:func:`_merge_arrays`)."""
    merged = []
    for k, first in enumerate(per_span[0]):
        same = [events[k] for events in per_span]
        if any((e.path, e.call) != (first.path, first.call) for e in same):
            raise ValueError(f"span recordings differ at {first.path!r}")  # same network
        arrays = [_merge_arrays([e.arrays[i] for e in same], spans, ids,
                                wide=first.path in wide)
                  for i in range(len(first.arrays))]
        merged.append(replace(first, arrays=arrays))
    return merged


def measured(recorded: list[Event], other: list[Event],
             reference: str) -> dict[tuple[str, int], float]:
    """Each layer's distance of ``other`` (a second pass, recorded) from ``recorded``:
    what :class:`~ms_port.check.layers.Measure` measures as the pass runs. A call whose
    outputs do not line up is not measured."""
    by_key = {(e.path, e.call): e for e in other}
    values = {}
    for event in recorded:
        new = by_key.get((event.path, event.call))
        if new is None or [a.shape for a in new.arrays] != [a.shape for a in event.arrays]:
            continue
        values[(event.path, event.call)] = max(
            (distance(ref, got, reference) for ref, got in zip(event.arrays, new.arrays)),
            default=0.0)
    return values


#: a span's share of the largest decoder layer's parameters. A span's float64 pass holds
#: its rows whole (8 bytes a parameter), where a decoder layer's float64 weights are read a
#: module at a time: at half a layer the head's spans set the run's peak (DeepSeek-V3.2's
#: widths: 7.1 GiB against the layers' 6.1); at a quarter they stay below the layers'
#: (5.3 GiB), in the same time (249 s against 257 s, one sampled run each)
SPAN_SHARE = 0.25
#: the share of the largest decoder layer's parameters a vocabulary tensor must exceed to
#: run in spans at all (a smaller one runs whole, as a layer does)
SPAN_FROM = 0.5


def span_rows(layer_numel: int, width: int, share: float = SPAN_SHARE) -> int:
    """Rows per span: ``share`` of the largest decoder layer's parameters, in rows of
    ``width``."""
    return max(1, int(layer_numel * share) // max(1, width))


def in_spans(vocab_tensor: Any, rows: int) -> bool:
    """Whether a vocabulary tensor of this shape is run in spans of ``rows`` rows."""
    return vocab_tensor is not None and len(vocab_tensor.shape) == 2 \
        and vocab_tensor.shape[0] > rows


__all__ = ["SPAN_FROM", "SPAN_SHARE", "Span", "in_spans", "measured", "merge_events",
           "merge_output", "plan_spans", "span_rows"]
