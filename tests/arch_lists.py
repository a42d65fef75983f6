"""Which built-in architectures the slowest per-architecture tests run on.

The deeper members of a family repeat its blocks: resnet101 is resnet50's bottleneck 33
times where resnet50 has it 16, wide_resnet101_2 wide_resnet50_2's, resnext101_32x8d
resnext50's grouped block with wider groups. Their round trips (convert, export, dtypes)
take a minute or more each on two cores and go through the same rules and tables as their
shallower twins; every one of them is still built and held to torchvision's names and
shapes (test_archs_resnet.py), and verify runs on the deepest (resnet152: rounding grows
with depth) and the most grouped (resnext101_64x4d).
"""

from __future__ import annotations

import ms_port

#: a deeper architecture -> the shallower one with the same blocks
DEEPER_TWINS = {"resnet101": "resnet50", "resnet152": "resnet50",
                "resnext101_32x8d": "resnext50_32x4d", "resnext101_64x4d": "resnext50_32x4d",
                "wide_resnet101_2": "wide_resnet50_2"}
#: verify still runs on these deeper ones (depth, groups)
VERIFIED_DEEP = ("resnet152", "resnext101_64x4d")


def round_trip_archs() -> list[str]:
    """The architectures whose round trips the tests run: all but the deeper twins."""
    return [a for a in ms_port.list_archs() if a not in DEEPER_TWINS]


def verify_archs() -> list[str]:
    return [a for a in ms_port.list_archs() if a not in DEEPER_TWINS or a in VERIFIED_DEEP]
