"""Reading ahead: the next stretches of a file read into the page cache on a thread.

verify by layers reads each block's tensors when the block starts, so the disk waited for
the CPU and the CPU for the disk: at Mistral-7B's sizes the blocks' reads took 60 s of a
222 s run, reading both files cold takes 29 s. A :class:`ReadAhead` reads the next
block's stretches of both files while the current block computes, so its reads then come
from the page cache.

The kernel's own hints (``posix_fadvise``/``madvise`` ``WILLNEED``) were measured first on
this project's machines: they returned at once and read nothing (a gigabyte read after
the hint and a two-second wait took as long as a cold one, 0.93 s against 0.82 s), where
the same gigabyte read on a thread made the next read 0.15 s. So the thread reads, with
``os.preadv`` into one buffer of :data:`CHUNK` bytes it reuses: the process holds that
buffer, and the pages read stay in the cache, the system's to evict.

Only speed is at stake: a stretch that cannot be read (a file gone, a short read) is
dropped without a word, and the reader that needs its bytes reports the error itself.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterable

#: bytes read per call (the buffer the thread reuses)
CHUNK = 8 << 20
#: the most bytes one :meth:`ReadAhead.want` reads ahead (the page cache is the system's:
#: a DeepSeek-V3 layer's 256 experts, 22 GB, are not all read ahead)
MOST_AHEAD = 4 << 30
#: the most files held open at once
MOST_OPEN = 64

Extent = tuple[str, int, int]


class ReadAhead:
    """A thread that reads stretches of files into the page cache: only the newest request.

    :meth:`want` replaces what was asked before: a stretch not yet read when the reader
    has moved on is not read at all. Use as a context manager, or :meth:`close`.
    """

    def __init__(self, most: int = MOST_AHEAD, chunk: int = CHUNK) -> None:
        self.most = most
        self.chunk = chunk
        self._cond = threading.Condition()
        self._todo: list[Extent] = []
        self._asked = 0  # requests made: the thread drops work of an older one
        self._closed = False
        self._thread: threading.Thread | None = None
        #: bytes read ahead so far (for tests and reports)
        self.read = 0

    def want(self, extents: Iterable[Extent]) -> None:
        """Read ``extents`` (file, offset, bytes) ahead, up to :attr:`most` bytes in all;
        what was asked before and is not yet read is dropped."""
        todo, budget = [], self.most
        for path, offset, nbytes in extents:
            if budget <= 0:
                break
            if nbytes <= 0 or offset < 0 or offset + nbytes > sys.maxsize:
                continue
            take = min(nbytes, budget)
            todo.append((str(path), offset, take))
            budget -= take
        with self._cond:
            if self._closed or not hasattr(os, "preadv"):  # (not on Windows): no reading ahead
                return
            self._todo, self._asked = todo, self._asked + 1
            if self._thread is None and todo:
                self._thread = threading.Thread(target=self._work, name="ms-port read-ahead",
                                                daemon=True)
                self._thread.start()
            self._cond.notify()

    def close(self) -> None:
        """Stop the thread (it finishes the chunk it is reading)."""
        with self._cond:
            self._closed = True
            self._todo = []
            self._cond.notify()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> ReadAhead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _next(self) -> tuple[Extent, int] | None:
        """The next stretch to read and the request it belongs to; None when closed."""
        with self._cond:
            while not self._todo and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            return self._todo.pop(0), self._asked

    def _work(self) -> None:
        buf = memoryview(bytearray(self.chunk))
        files: dict[str, int] = {}
        try:
            while (job := self._next()) is not None:
                (path, offset, nbytes), asked = job
                try:  # a stretch that cannot be read is dropped: only speed is at stake
                    fd = self._open(files, path)
                    if fd is not None:
                        self._read(fd, offset, nbytes, buf, asked)
                except (OSError, ValueError, OverflowError):
                    continue
        finally:
            for fd in files.values():
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _open(self, files: dict[str, int], path: str) -> int | None:
        if path not in files:
            if len(files) >= MOST_OPEN:
                with contextlib.suppress(OSError):
                    os.close(files.pop(next(iter(files))))
            try:
                files[path] = os.open(path, os.O_RDONLY)
            except OSError:
                return None
        return files[path]

    def _read(self, fd: int, offset: int, nbytes: int, buf: memoryview, asked: int) -> None:
        end = offset + nbytes
        while offset < end:
            if self._asked != asked or self._closed:  # the reader moved on
                return
            try:
                got = os.preadv(fd, [buf[:min(self.chunk, end - offset)]], offset)
            except OSError:
                return
            if got <= 0:  # past the end of the file
                return
            offset += got
            self.read += got


__all__ = ["CHUNK", "MOST_AHEAD", "ReadAhead"]
