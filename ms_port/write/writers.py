"""Write a Plan to disk safely, then prove the file holds exactly what was planned.

The output is streamed, one tensor at a time, into a temporary file beside the
destination; each tensor is read back from it and compared bit for bit with the source
as soon as it is written (:mod:`.proof`), the finished file's framing is checked and
the file fsynced, and only then is it renamed into place. An existing output is
replaced only with ``force``. Whatever goes wrong, the temporary file is removed and the
old output is untouched; a run killed outright leaves a ``.ms-port-PID-*.tmp`` file that
the next run removes.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import tempfile
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from .._digest import digest
from .._libc import libc_function
from ..errors import NonFiniteError, OutputExistsError, WriteError
from ..match.plan import Match, Plan
from ..read.ckpt import WRITABLE_DTYPES, CkptWriter, tensor_bytes, write_all
from ..read.sources import SAFETENSORS_DTYPES
from ..read.tensors import FLOAT_DTYPES, itemsize, numpy_dtype, released_chunks
from .proof import Checks, Digests, Progress, readback
from .recycle import Recycled

FORMATS = ("ckpt", "safetensors", "pth")  # pth: export, MindSpore -> PyTorch
_ST_CODES = SAFETENSORS_CODES = {v: k for k, v in SAFETENSORS_DTYPES.items()}

@dataclass(frozen=True)
class WriteResult:
    """What was written and how it was checked.

    Attributes:
        path: the final output file.
        format: ``ckpt`` or ``safetensors``.
        tensors: number of tensors written. nbytes: size of the file.
        readback: ``"bit-exact"`` once every tensor was read back and compared.
        replaced: whether an existing file was replaced (``force``).
        seconds: time spent writing and checking.
    """

    path: str
    format: str
    tensors: int
    nbytes: int
    readback: str
    replaced: bool
    crc: bool
    seconds: float
    nonfinite: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "nonfinite": dict(self.nonfinite)}


def check_output(output: str | Path, *, force: bool) -> Path:
    """Fail early, before any work, if ``output`` cannot be written."""
    try:
        return _check_output(Path(output), force=force)
    except OSError as exc:  # a name too long, a path through a file...
        raise WriteError(f"{output}: not a usable output path ({exc.strerror or exc}); "
                         "choose another name", path=output) from None


def _check_output(output: Path, *, force: bool) -> Path:
    if output.is_dir():
        raise WriteError(f"{output} is a directory; give a file name for the output",
                         path=output)
    if not output.parent.is_dir():
        raise WriteError(f"{output.parent}: no such directory for the output; create it first",
                         path=output)
    remove_stale_temps(output)  # left by a killed run, whatever this run decides
    if output.exists() and not force:
        raise OutputExistsError(f"{output} exists; pass --force (force=True) to replace it",
                                path=output)
    if not os.access(output.parent, os.W_OK):
        raise WriteError(f"{output.parent}: not writable; choose another output directory",
                         path=output)
    return output


#: temporary outputs: ``.ms-port-PID-RANDOM.tmp`` beside the output (short: never past
#: NAME_MAX, whatever the output's name; the PID lets a later run remove a killed run's)
_TEMP_PREFIX = ".ms-port-"


def _new_temp(output: Path) -> Path:
    """A fresh temporary file beside ``output``, created exclusively (O_EXCL)."""
    fd, name = tempfile.mkstemp(dir=output.parent, prefix=f"{_TEMP_PREFIX}{os.getpid()}-",
                                suffix=".tmp")
    os.close(fd)
    return Path(name)


def remove_stale_temps(output: Path) -> list[Path]:
    """Remove temporary files of ours beside ``output`` whose process no longer runs."""
    removed = []
    for tmp in output.parent.glob(f"{_TEMP_PREFIX}*.tmp"):
        pid = tmp.name[len(_TEMP_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            with contextlib.suppress(OSError):
                tmp.unlink()
                removed.append(tmp)
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def check_not_input(output: str | Path, *inputs: str | Path | None) -> None:
    """Refuse an output that is one of the inputs (by file identity, links included)."""
    output = Path(output)
    for given in inputs:
        if given is None or not output.exists():
            continue
        with contextlib.suppress(OSError):
            if Path(given).exists() and os.path.samefile(output, given):
                raise WriteError(f"{output} is an input of this run ({given}); refusing to "
                                 "write over it — choose another output", path=output)


_RENAME_NOREPLACE = 1


def _publish_no_replace(tmp: Path, output: Path) -> None:
    """Move ``tmp`` to ``output`` atomically, failing if ``output`` exists at that moment.

    A hard link fails with EEXIST when the name is taken, atomically; where the
    filesystem has no hard links, Linux's renameat2(RENAME_NOREPLACE) does the same.
    """
    try:
        os.link(tmp, output)
    except FileExistsError:
        raise _exists(output) from None
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK,
                             errno.ENOSYS):
            raise
        _renameat2_noreplace(tmp, output)
        return
    tmp.unlink()


def _renameat2_noreplace(tmp: Path, output: Path) -> None:
    fn = libc_function("renameat2", ctypes.c_int, ctypes.c_int, ctypes.c_char_p,
                       ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    if fn is None:
        raise WriteError(f"{output}: this filesystem supports neither hard links nor "
                         "renameat2, so ms-port cannot publish without a race; pass --force "
                         "to replace atomically", path=output)
    at_fdcwd = -100
    if fn(at_fdcwd, os.fsencode(tmp), at_fdcwd, os.fsencode(output), _RENAME_NOREPLACE):
        err = ctypes.get_errno()
        if err == errno.EEXIST:
            raise _exists(output)
        raise OSError(err, os.strerror(err), str(output))


def _exists(output: Path) -> OutputExistsError:
    return OutputExistsError(f"{output} exists (it appeared while this run was writing); "
                             "nothing was replaced — pass --force (force=True) to replace it",
                             path=output)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_output(output: str | Path, *, force: bool = False) -> Iterator[tuple[Path, Path]]:
    """Yield ``(final, temporary)`` paths; on a clean exit the temporary file becomes final.

    The temporary file is created exclusively beside the output (same filesystem, so
    publishing is atomic). Without ``force`` it is published with an atomic no-replace
    (a file that appeared at ``output`` meanwhile, or a concurrent run's, is never
    replaced); with ``force`` it atomically replaces the old output. On any exception
    the temporary file is removed and the old output, if any, is untouched. Stale
    temporary files of dead ms-port processes are removed first.

    Raises:
        OutputExistsError, WriteError.
    """
    output = check_output(output, force=force)
    try:
        tmp = _new_temp(output)
    except OSError as exc:
        raise WriteError(f"{output}: cannot create a file beside it ({exc.strerror or exc}); "
                         "check permissions and free space", path=output) from None
    try:
        yield output, tmp
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp made it 0600: the usual mode instead
        if force:
            os.replace(tmp, output)
        else:
            _publish_no_replace(tmp, output)
    except OSError as exc:
        raise WriteError(f"{output}: cannot write ({exc.strerror or exc}); check free disk "
                         "space and permissions — the previous output, if any, is untouched",
                         path=output) from exc
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def write_text(output: str | Path, text: str, *, force: bool = False) -> Path:
    """Write a text file (a saved mapping) with the same rules as every output."""
    with atomic_output(output, force=force) as (final, tmp), \
            open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        fsynced(f)
    return final


def fsynced(f: BinaryIO) -> None:
    """Push a written file to the disk before it is renamed into place."""
    f.flush()
    os.fsync(f.fileno())


def write_plan(
    plan: Plan,
    output: str | Path,
    *,
    format: str = "ckpt",
    force: bool = False,
    crc: bool = False,
    check_finite: bool = False,
    progress: Progress | None = None,
    metadata: dict[str, str] | None = None,
) -> WriteResult:
    """Write ``plan`` to ``output`` atomically and verify it bit for bit.

    NaN/Inf values are counted per tensor in the same pass (``WriteResult.nonfinite``);
    with ``check_finite`` they abort the write before anything is put in place.

    Args:
        plan: an ok :class:`~ms_port.match.plan.Plan`.
        output: destination file.
        format: ``ckpt`` (default) or ``safetensors`` (MindSpore loads it with
            ``format="safetensors"``).
        force: replace an existing output (only after the new one is verified).
        crc: append MindSpore's ``crc_check`` trailer (``ckpt`` only).
        check_finite: refuse (NonFiniteError) weights holding NaN or Inf.
        progress: called with (phase, bytes done, bytes total) while writing/reading back.
        metadata: a safetensors header's ``__metadata__`` (transformers wants
            ``{"format": "pt"}``); default ``{"format": "ms-port"}``.

    Raises:
        OutputExistsError, WriteError, ReadbackError, NonFiniteError.
    """
    if format not in FORMATS:
        raise WriteError(f"unknown output format {format!r}; choose {' or '.join(FORMATS)}")
    if crc and format != "ckpt":
        raise WriteError("a CRC trailer exists only in the ckpt format; drop --crc")
    start = time.perf_counter()
    with atomic_output(output, force=force) as (final, tmp):
        replaced = final.exists()
        nonfinite: dict[str, int] = {}
        # "r+b", not "wb": the file is new and empty, and a truncation (O_TRUNC) makes
        # ext4 flush the whole file when any descriptor of it closes (auto_da_alloc),
        # which stalled the readback's first read behind the fsync (0.6 s for 2 GiB)
        # the digests of experts made a group at a time, taken as each group is made:
        # the read-back compares the file with them rather than making every group again
        # (every other tensor is compared with the plan's data, read or made again)
        digests: Digests = {}
        with open(tmp, "r+b") as f, ThreadPoolExecutor(1, "ms-port-fsync") as pool, \
                _checks(plan, f, tmp, format, progress, digests) as checks:
            written = _WriteBehind(f, pool, progress)
            if format == "pth":
                _write_pth(plan, f, nonfinite)
            else:
                with _prepared(plan, nonfinite, digests) as items:
                    if format == "ckpt":
                        _write_ckpt(plan, items, f, crc=crc, progress=written, checks=checks)
                    else:
                        _write_safetensors(plan, items, f, progress=written, checks=checks,
                                           metadata=metadata)
            f.flush()  # here: the framing check and a .pth's readback open the file anew
            # the disk finishes while the last tensors are read back and the framing is
            # checked; both end before the rename
            synced = pool.submit(fsynced, f)
            if nonfinite and check_finite:
                names = ", ".join(f"{k} ({v})" for k, v in list(nonfinite.items())[:5])
                raise NonFiniteError(
                    f"{plan.source.path}: NaN/Inf values in {len(nonfinite)} tensors: "
                    f"{names}; fix the weights or drop --check-finite (nothing was written)",
                    path=plan.source.path, tensors=nonfinite)
            if checks is None:
                readback(plan, tmp, format=format, progress=progress)
            else:
                checks.finish()
            synced.result()
        nbytes = tmp.stat().st_size
    return WriteResult(str(final), format, len(plan.matches), nbytes, "bit-exact", replaced,
                       crc, time.perf_counter() - start, nonfinite)


#: bytes written between two requests to start putting them on the disk
WRITE_BEHIND = 32 << 20
_SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start writeback of the range's dirty pages


_SYNC_FILE_RANGE = libc_function("sync_file_range", ctypes.c_int, ctypes.c_int, ctypes.c_int64,
                                   ctypes.c_int64, ctypes.c_uint)


class _WriteBehind:
    """A writer's progress callback that also has the kernel start putting what was
    written so far on the disk, every :data:`WRITE_BEHIND` bytes, so that the disk works
    while the rest is prepared and written and the final fsync finds only the tail left
    (2 GiB: the fsync's 0.7-0.9 s beside the readback fell to the readback's own 0.35 s).

    ``sync_file_range(SYNC_FILE_RANGE_WRITE)`` only starts writeback; the fsync still
    makes the file durable. It can block while the device's queue is full, so it runs in
    the fsync thread, one request at a time, the next covering all written since. Where
    it is missing or fails, the fsync does all the work, as before.
    """

    def __init__(self, f: BinaryIO, pool: ThreadPoolExecutor,
                 progress: Progress | None) -> None:
        self._f, self._pool, self._progress = f, pool, progress
        self._started = 0  # bytes whose writeback has been asked for
        self._request: Future[int] | None = None
        self._fn = _SYNC_FILE_RANGE

    def __call__(self, phase: str, done: int, total: int) -> None:
        if self._fn is not None:
            self._start_writeback()
        if self._progress:
            self._progress(phase, done, total)

    def _start_writeback(self) -> None:
        if self._request is not None:
            if not self._request.done():
                return
            # refused (not supported here) or failed: only a head start is lost, the
            # fsync does the rest
            if self._request.exception() is not None or self._request.result() != 0:
                self._fn = None
                return
        upto = self._f.tell()
        if upto - self._started >= WRITE_BEHIND:
            self._request = self._pool.submit(self._fn, self._f.fileno(), self._started,
                                              upto - self._started, _SYNC_FILE_RANGE_WRITE)
            self._started = upto


#: bytes a writer takes at a time: a fused tensor's groups are joined and scanned for
#: NaN/Inf in a worker, a chunk ahead of the writer, and written while in the CPU's
#: cache, where joining whole tensors first went through memory three times
CHUNK_BYTES = 2 << 20


@dataclass(frozen=True)
class _Data:
    """A target's data as a writer takes it: its shape, dtype (a canonical name, or
    numpy's for one no file holds) and bytes, in C order and little-endian, in
    consecutive chunks of whole values."""

    shape: tuple[int, ...]
    dtype: str
    chunks: Iterable[np.ndarray]


@dataclass
class _Preparing:
    """What the workers preparing a writer's data share: the chunk worker, the two
    threads that make a grouped target's groups (into ``buffers``, used again), and what
    they leave for the writer (NaN/Inf counts) and the read-back (the groups' digests)."""

    chunker: ThreadPoolExecutor
    makers: ThreadPoolExecutor
    nonfinite: dict[str, int]
    digests: Digests
    #: the groups' arrays, filled again once the writer is done with them
    buffers: Recycled


#: groups of a grouped target made at once, each in a thread of its own (a transposed
#: expert is CPU work; the writer, the read-back and the disk take the rest)
GROUPS_AHEAD = 2


@contextlib.contextmanager
def _prepared(plan: Plan, nonfinite: dict[str, int], digests: Digests
              ) -> Iterator[Iterator[tuple[Match, _Data]]]:
    """Each target's data for a writer, in workers beside it.

    One prepares the next target while the one before is written: computed whole where
    something computes it (a transform, a cast, a declared value); a source's mapped
    data where it is a source's data; where it is its parts fused, their mapped data.
    Another cuts the target being written into chunks a chunk ahead of the writer,
    joining a fused target's parts a few groups at a time
    (:meth:`~ms_port.match.layouts.Layout.chunks`, two buffers in turn) and counting
    NaN/Inf into ``nonfinite``. Two targets are alive at once, and two chunks. A target
    made a group at a time (experts) has :data:`GROUPS_AHEAD` groups made at once, in
    order, each group's digest left in ``digests`` as it is made.
    """
    with ThreadPoolExecutor(1, "ms-port-chunks") as chunker, \
            ThreadPoolExecutor(GROUPS_AHEAD, "ms-port-groups") as makers:
        prep = _Preparing(chunker, makers, nonfinite, digests, Recycled())
        items = _one_ahead(_data(plan, m, prep) for m in plan.matches)
        try:
            yield items
        finally:
            items.close()


def _data(plan: Plan, m: Match, prep: _Preparing) -> tuple[Match, _Data]:
    chunks: Iterable[np.ndarray] | None = None
    if m.groups:  # a few experts at a time, transformed and cast: never the whole tensor
        shape, dtype = m.shape, m.out_dtype
        # a source that cannot read rows alone is loaded whole by each group: one at once
        whole = not m.parts and plan.source.tensors[m.source].rows_loader is None
        made = _in_order(plan.group_makers(m, prep.buffers.empty), prep.makers,
                         1 if whole else GROUPS_AHEAD)
        chunks = _digested(m.target, (tensor_bytes(group)[2] for group in made),
                           prep.digests)
    elif m.parts and m.layout is not None and not m.transforms and m.out_dtype == m.dtype:
        parts = [plan.source.tensors[p].load() for p in m.parts]
        if all(p.dtype == numpy_dtype(m.dtype) for p in parts):  # native byte order
            shape, dtype = m.shape, m.dtype
            chunks = m.layout.chunks(parts, CHUNK_BYTES, buffers=2)
    if chunks is None:
        array = plan.expected(m)
        shape, dtype, raw = tensor_bytes(array)
        step = max(1, CHUNK_BYTES // array.dtype.itemsize) * array.dtype.itemsize  # whole values
        chunks = released_chunks(raw, step)
    scanned = _scanned(_counted_as(m), dtype, chunks, prep.nonfinite)
    if m.nbytes <= CHUNK_BYTES:
        # one chunk: scanned here, a target ahead, rather than handed to the chunk worker
        # and back (two round trips per tensor: +3 s for 20,000 small tensors)
        return m, _Data(shape, dtype, tuple(scanned))
    return m, _Data(shape, dtype, _one_ahead(scanned, prep.chunker))


def _in_order(makers: list[Any], pool: ThreadPoolExecutor, ahead: int
              ) -> Iterator[np.ndarray]:
    """Each maker's result, in order, ``ahead`` made at once in ``pool``; a caller that
    stops early waits only for those in the making."""
    pending: list[Future[np.ndarray]] = []
    try:
        for make in makers:
            pending.append(pool.submit(make))
            if len(pending) >= ahead:
                yield pending.pop(0).result()
        while pending:
            yield pending.pop(0).result()
    finally:
        for future in pending:
            if not future.cancel():
                with contextlib.suppress(BaseException):  # its error is no longer wanted
                    future.result()


def _digested(name: str, chunks: Iterable[np.ndarray], digests: Digests
              ) -> Iterator[np.ndarray]:
    """``chunks`` passed through, each one's size and digest taken as it is made (in the
    worker that makes it, before the writer or a reused buffer can touch it); the list is
    put in ``digests[name]`` once the last is made."""
    taken = []
    for chunk in chunks:
        taken.append((chunk.size, digest(chunk)))
        yield chunk
    digests[name] = tuple(taken)


def _counted_as(m: Match) -> str:
    """The name NaN/Inf in ``m`` are reported under: its source's where it is one whole
    source tensor, else the target's (fused from several, or one part of a source)."""
    return m.source if m.source and not m.parts and m.part is None else m.target


_END = object()


def _one_ahead(items: Iterator[Any], pool: ThreadPoolExecutor | None = None
               ) -> Iterator[Any]:
    """Yield ``items``, preparing the next one in a worker thread (of ``pool``, or a
    thread of its own) while the caller uses the current one; numpy and file I/O release
    the GIL. At most two items are alive at once. Whatever the worker raises is raised
    here; a caller that stops early waits for at most the one item in preparation."""
    own = pool is None
    worker = ThreadPoolExecutor(1, "ms-port-prepare") if pool is None else pool
    pending = worker.submit(next, items, _END)
    try:
        while (item := pending.result()) is not _END:
            pending = worker.submit(next, items, _END)
            yield item
    finally:
        if not pending.cancel():
            with contextlib.suppress(BaseException):  # its error is no longer wanted
                pending.result()
        if own:
            worker.shutdown()


def _scanned(name: str, dtype: str, chunks: Iterable[np.ndarray], found: dict[str, int]
             ) -> Iterator[np.ndarray]:
    """``chunks`` passed through; for a floating-point ``dtype`` NaN/Inf are counted in
    each while it is in cache, into ``found[name]``."""
    if dtype not in FLOAT_DTYPES:
        yield from chunks
        return
    values, count = numpy_dtype(dtype), 0
    for chunk in chunks:
        count += _count_nonfinite(chunk.view(values), dtype)
        yield chunk
    if count:
        found[name] = count


#: a float's exponent bits: NaN and Inf are the values with all of them set
_EXPONENT = {"bfloat16": 0x7F80, "float16": 0x7C00, "float32": 0x7F80_0000,
             "float64": 0x7FF0_0000_0000_0000}
#: values scanned for NaN/Inf at a time (0.5-2 MiB: each is read twice, the second time
#: from the CPU's cache; 1 Mi values at a time scanned 7.9 GB/s here, 256 Ki 9.1)
_SCAN = 1 << 18


def _count_nonfinite(array: np.ndarray, dtype: str) -> int:
    """NaN/Inf values, found from their bits a chunk at a time without writing anything.

    A float is NaN or Inf when every exponent bit is set: a positive one is then, as a
    signed integer, at least the exponent mask, and a negative one, as an unsigned
    integer, at least the sign bit and that mask together. Two maxima per chunk answer
    "none" for the usual weights; only a chunk holding some is counted. (``np.isfinite``
    on 16 Mi values at a time allocated fresh temporaries for every chunk and took 0.65 s
    of a 2 GiB conversion; ml_dtypes' ``isfinite`` is 5x slower still.)
    """
    flat = np.ascontiguousarray(array).reshape(-1)
    exponent = _EXPONENT.get(dtype)
    if exponent is None or flat.itemsize != itemsize(dtype) or not flat.dtype.isnative:
        with np.errstate(invalid="ignore"):
            return int(flat.size - np.count_nonzero(np.isfinite(flat)))
    unsigned, signed = flat.view(f"u{flat.itemsize}"), flat.view(f"i{flat.itemsize}")
    negative = exponent | 1 << (8 * flat.itemsize - 1)
    count = 0
    for start in range(0, flat.size, _SCAN):
        chunk = unsigned[start:start + _SCAN]
        if signed[start:start + _SCAN].max() >= exponent or chunk.max() >= negative:
            # the sign shifted out: NaN/Inf are then at least the mask shifted
            count += int(np.count_nonzero((chunk << 1) >= exponent << 1))
    return count


def _checks(plan: Plan, f: BinaryIO, tmp: Path, format: str, progress: Progress | None,
            digests: Digests) -> contextlib.AbstractContextManager[Checks | None]:
    """Each tensor read back as soon as it is written, beside the writer (a 1.1B LLaMA,
    fused, alternated CLI runs: 2.46 s with the read-back after the write, 2.31 s beside
    it); a ``.pth`` is written whole at the end and read back then."""
    if format == "pth":
        return contextlib.nullcontext()
    return Checks(plan, f, tmp, format=format, progress=progress, digests=digests)


def _write_ckpt(plan: Plan, items: Iterator[tuple[Match, _Data]], f: BinaryIO, *,
                crc: bool, progress: Progress | None, checks: Checks | None) -> None:
    total, done = plan.nbytes, 0
    with CkptWriter(f, crc=crc) as writer:
        reserved = 0
        if all(m.out_dtype in WRITABLE_DTYPES for m in plan.matches):  # else refused below
            reserved = _reserve(f, sum(writer.size_of(m.target, m.shape, m.out_dtype)
                                       for m in plan.matches) + writer.trailer_size)
        for match, data in items:
            spans = writer.write_chunks(match.target, data.shape, data.dtype, data.chunks)
            if checks:
                checks.written(match, spans)
            done += match.nbytes
            if progress:
                progress("write", done, total)
    _release_unreserved(f, reserved)


def _write_pth(plan: Plan, f: BinaryIO, nonfinite: dict[str, int]) -> None:
    """A plain state dict (loadable with ``weights_only=True``); torch.save needs it whole."""
    import collections

    import torch

    state = collections.OrderedDict()
    for match in plan.matches:
        data = np.array(plan.expected(match), order="C")  # a writable copy (torch warns
        # on read-only maps)
        if match.out_dtype in FLOAT_DTYPES:
            n = _count_nonfinite(data, match.out_dtype)
            if n:
                nonfinite[_counted_as(match)] = n
        if match.out_dtype == "bfloat16":
            state[match.target] = torch.from_numpy(data.view(np.int16)).view(torch.bfloat16)
        else:
            state[match.target] = torch.from_numpy(data)
    torch.save(state, f)


def _write_safetensors(plan: Plan, items: Iterator[tuple[Match, _Data]], f: BinaryIO, *,
                       progress: Progress | None, checks: Checks | None,
                       metadata: dict[str, str] | None) -> None:
    """Stream a safetensors file: the header is known from the Plan before any data."""
    header: dict[str, Any] = {"__metadata__": dict(metadata or {"format": "ms-port"})}
    offset = 0
    for m in plan.matches:
        if m.out_dtype not in WRITABLE_DTYPES or m.out_dtype not in _ST_CODES:
            raise WriteError(  # a float8 tensor without block scales, before any byte
                f"tensor {m.target!r} has dtype {m.out_dtype}, which MindSpore cannot load; "
                "ms-port dequantizes float8 weights that have block scales and a "
                "quantization_config.weight_block_size in config.json", tensor=m.target)
        size = m.nbytes
        header[m.target] = {"dtype": _ST_CODES[m.out_dtype], "shape": list(m.shape),
                            "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the spec pads the header to 8-byte alignment
    reserved = _reserve(f, 8 + len(blob) + offset)
    f.write(len(blob).to_bytes(8, "little") + blob)
    done = 0
    for match, data in items:
        at = f.tell()
        for chunk in data.chunks:
            write_all(f, memoryview(chunk))
        if checks:
            checks.written(match, ((at, f.tell() - at),))
        done += match.nbytes
        if progress:
            progress("write", done, offset)
    _release_unreserved(f, reserved)


_FALLOC_FL_KEEP_SIZE = 1  # <linux/falloc.h>: allocate, the file's size unchanged
_FALLOCATE = libc_function("fallocate", ctypes.c_int, ctypes.c_int, ctypes.c_int,
                           ctypes.c_int64, ctypes.c_int64)
#: errors of fallocate that say the output cannot be written here; any other (the
#: filesystem does not support it, ...) only means writing goes on without it
_NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _reserve(f: BinaryIO, nbytes: int) -> int:
    """Allocate the output's ``nbytes`` on the disk before writing, its size left at what
    is written: ext4 then finds each written page's block there instead of reserving one
    page by page (2 GiB in 256 KiB writes: 0.71 s median against 1.0 s, 6 runs each,
    alternated), and a disk without room for the output fails here, before anything is
    written. Where ``fallocate`` is missing or refused, writing goes on without it.

    Returns:
        The bytes reserved (0: none).

    Raises:
        OSError: no room for ``nbytes`` (ENOSPC, EDQUOT, EFBIG).
    """
    try:
        fd = f.fileno()
    except (OSError, ValueError):  # not a file of the OS's (io.UnsupportedOperation)
        return 0
    if _FALLOCATE is None or nbytes <= 0:
        return 0
    if _FALLOCATE(fd, _FALLOC_FL_KEEP_SIZE, 0, nbytes) != 0:
        err = ctypes.get_errno()
        if err in _NO_ROOM:
            raise OSError(err, f"{os.strerror(err)}: the output needs {nbytes} bytes")
        return 0
    return nbytes


def _release_unreserved(f: BinaryIO, reserved: int) -> None:
    """Free blocks reserved past the end of what was written (none when the reservation
    was exact, as it is meant to be): a truncation to the file's own size frees them."""
    f.flush()
    if reserved > f.tell():
        os.ftruncate(f.fileno(), f.tell())
