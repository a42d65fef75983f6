"""A zip archive of stored members whose CRC-32 is known before their bytes are written.

:mod:`zipfile` computes each member's CRC-32 on the thread that writes it, and writes the
header again once the member is done. :mod:`ms_port.write.torch_stream` computes the CRC
of a tensor while the tensor before it is being written, so the writer's thread only
writes. Every member is stored (as ``torch.save`` stores them) with ZIP64 sizes; the
archive is what :mod:`zipfile`, torch's reader and ms-port's own read (tested).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import BinaryIO

_LOCAL, _CENTRAL, _END64, _LOCATOR, _END = (0x04034B50, 0x02014B50, 0x06064B50,
                                           0x07064B50, 0x06054B50)
#: version needed to extract: 4.5 (ZIP64)
_VERSION = 45
#: the DOS date of 1980-01-01, the format's epoch (no time is recorded)
_DATE = (1 << 5) | 1
_SMALL = 0xFFFFFFFF  # "see the ZIP64 extra field"


@dataclass(frozen=True)
class Member:
    """A written member: its name, CRC-32, size and where its bytes start."""

    name: bytes
    crc: int
    size: int
    header: int

    @property
    def data(self) -> int:
        return self.header + 30 + len(self.name) + 20


class StoredZip:
    """Write members one after another to ``f`` (at its current position, 0), then
    :meth:`close` writes the central directory."""

    def __init__(self, f: BinaryIO) -> None:
        self._f = f
        self._at = 0
        self.members: list[Member] = []

    def add(self, name: str, chunks: Iterable[bytes | memoryview], size: int,
            crc: int) -> Member:
        """Write a member of ``size`` bytes whose CRC-32 is ``crc``; returns where it is."""
        raw = name.encode("utf-8")
        member = Member(raw, crc, size, self._at)
        extra = struct.pack("<HHQQ", 1, 16, size, size)
        self._write(struct.pack("<IHHHHHIIIHH", _LOCAL, _VERSION, 0x800, 0, 0, _DATE, crc,
                                _SMALL, _SMALL, len(raw), len(extra)) + raw + extra)
        written = 0
        for chunk in chunks:
            written += len(chunk)
            self._write(chunk)
        if written != size:
            raise ValueError(f"member {name!r}: {written} bytes written, {size} declared")
        self.members.append(member)
        return member

    def _write(self, data: bytes | memoryview) -> None:
        self._f.write(data)
        self._at += len(data)

    def close(self) -> None:
        start = self._at
        for m in self.members:
            extra = struct.pack("<HHQQQ", 1, 24, m.size, m.size, m.header)
            self._write(struct.pack("<IHHHHHHIIIHHHHHII", _CENTRAL, _VERSION, _VERSION, 0x800,
                                    0, 0, _DATE, m.crc, _SMALL, _SMALL, len(m.name),
                                    len(extra), 0, 0, 0, 0, _SMALL) + m.name + extra)
        end, count = self._at, len(self.members)
        self._write(struct.pack("<IQHHIIQQQQ", _END64, 44, _VERSION, _VERSION, 0, 0, count,
                                count, end - start, start))
        self._write(struct.pack("<IIQI", _LOCATOR, 0, end, 1))
        self._write(struct.pack("<IHHHHIIH", _END, 0, 0, 0xFFFF, 0xFFFF, _SMALL, _SMALL, 0))
