"""Matching: rules propose, the target disposes. The result is a :class:`Plan`.

The stages live in their own modules; this one gathers what callers use:

- :mod:`.entries`: the plan's parts (:class:`Match`, :class:`Missing`, :class:`Unused`, …);
- :mod:`.result`: the :class:`Plan`, and what each target must hold (:func:`materialize`);
- :mod:`.matching`: :func:`make_plan`, stages 1-4 (explicit entries, exact names, renames,
  rules) and the shape fallback;
- :mod:`.many`: the table's ``fuse:``/``split:``/``tied:``/``derived:`` entries;
- :mod:`.structure`: stage 5, structural alignment's pairs made matches.
"""

from __future__ import annotations

from .entries import HOW, Candidate, Conflict, Dropped, Match, Missing, Unused
from .matching import LENIENT, PlanOptions, make_plan
from .result import Plan, initial_array, materialize

__all__ = [
           "HOW",
           "LENIENT",
           "Candidate",
           "Conflict",
           "Dropped",
           "Match",
           "Missing",
           "Plan",
           "PlanOptions",
           "Unused",
           "initial_array",
           "make_plan",
           "materialize",
]
