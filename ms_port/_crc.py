"""CRC-32 (zlib's polynomial), as fast as the machine allows.

A zip member's and a ``.ckpt`` trailer's checksum is the CRC-32 of zlib. ``zlib.crc32``
computes it at 1.6 GB/s here; ISA-L's (the ``isal`` package, the bindings the
``pycompression`` project keeps for ISA-L) at 8.3 GB/s on the same 256 MiB, same values
(zlib-ng's, also considered: 5.8 GB/s). Writing a 1.1B model's optimizer state (8.8 GB)
computes two CRCs of it, so the difference is seconds. Where ``isal`` is missing (a
platform without its wheel), zlib's is used: slower, never different.
"""

from __future__ import annotations

try:
    from isal.isal_zlib import crc32
    FAST = True
except ImportError:  # pragma: no cover - isal ships wheels for the platforms we test on
    from zlib import crc32
    FAST = False


__all__ = ["FAST", "crc32"]
