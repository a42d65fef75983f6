"""A stand-in for verify's :class:`~ms_port.check.reuse.HandedBack` (what MindSpore keeps
after its passes): each array it would hand back is filled with NaN instead, whatever its
size, so that anything computing on it again changes the report; or filled as soon as it
is watched, before MindSpore computes on it (the control: the report must change)."""

from __future__ import annotations

import numpy as np

from ms_port.check import reuse


def poisoning(early: bool = False):
    """A ``HandedBack`` class to put in ``ms_port.check.blocks``, and the list of the
    shapes it filled."""
    filled: list[tuple[int, ...]] = []

    def give(array: np.ndarray) -> int:
        if array.dtype.kind == "f":
            array.fill(np.nan)
            filled.append(array.shape)
        return 0

    class Poisoning(reuse.HandedBack):
        def __init__(self, smallest):
            super().__init__(None if smallest is None else 0, give)

        def watch(self, arrays):
            super().watch(arrays)
            if early:
                self.hand_back()

    return Poisoning, filled


def report_fields(report) -> dict:
    """Everything a report says but its timings."""
    data = report.to_dict()
    data.pop("timings", None)
    return data
