"""Read and write MindSpore ``.ckpt`` files without importing MindSpore.

A ``.ckpt`` is the protobuf ``Checkpoint { repeated Value value = 1; }`` where
``Value { string tag = 1; oneof { TensorProto tensor = 2; MapTensorProto maptensor = 3; } }``
and ``TensorProto { repeated int64 dims = 1; string tensor_type = 2; bytes tensor_content = 3; }``.
A file is therefore just top-level ``value`` records one after another, which lets us
stream-write one tensor at a time and list a multi-GB file over an ``mmap`` without
reading the data.

What MindSpore 2.x ``save_checkpoint`` does, and this module reproduces byte for byte:

- a 0-d tensor has no ``dims`` at all; every other tensor lists its dims unpacked;
- a tensor over 512 MiB is split into 512 MiB pieces, each a separate ``value`` with the
  same tag and the full dims; loaders join consecutive records that share a tag;
- ``crc_check=True`` appends ``b"crc_num"`` plus the CRC-32 (zlib's; :mod:`ms_port._crc`) of every
  byte before it, as a 10-byte big-endian integer;
- empty (0-element) tensors are dropped silently, and ``load_checkpoint`` reads dims
  ``[0]`` as a scalar, so :class:`CkptWriter` refuses them rather than lose them;
- ``append_dict`` strings are stored as tensor_type ``"str"`` (UTF-32) and listed here as
  skipped, as are map tensors.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, BinaryIO, NamedTuple

import numpy as np

from .._crc import crc32
from ..errors import SourceError, WriteError
from .tensors import MAX_RANK, STORED_DTYPES, dtype_name, format_shape, numpy_dtype

#: canonical dtype name -> MindSpore ``tensor_type`` string
MS_TENSOR_TYPES: dict[str, str] = {
    "float64": "Float64", "float32": "Float32", "float16": "Float16", "bfloat16": "BFloat16",
    "int64": "Int64", "int32": "Int32", "int16": "Int16", "int8": "Int8",
    "uint64": "UInt64", "uint32": "UInt32", "uint16": "UInt16", "uint8": "UInt8",
    "bool": "Bool", "complex64": "Complex64", "complex128": "Complex128",
}
#: MindSpore ``tensor_type`` string -> canonical dtype name
CANONICAL_DTYPES: dict[str, str] = {ms: name for name, ms in MS_TENSOR_TYPES.items()}
# save_checkpoint writes Complex64/128, but load_checkpoint (2.10) has no entry for them and
# fails; a converter must not produce a file MindSpore cannot load.
WRITABLE_DTYPES = frozenset(MS_TENSOR_TYPES) - {"complex64", "complex128"}

#: save_checkpoint's piece size (serialization.SLICE_SIZE KiB) for large tensors
SLICE_BYTES = 512 * 1024 * 1024
CRC_MAGIC = b"crc_num"
CRC_TRAILER_SIZE = len(CRC_MAGIC) + 10
_CRC_BLOCK = 8 * 1024 * 1024
_STRING_TYPE = "str"
#: the most bytes one ``write()`` call passes to the kernel. Linux sizes the page-cache
#: folios of a buffered write by the length of the call: a call of 1 MiB or more gets
#: folios of 1-2 MiB, which the allocator takes from whole free blocks. Where a virtual
#: machine hands free blocks back to its host (virtio-balloon free page reporting, on in
#: the machines measured here), each such block must be faulted back in on first touch:
#: 2 GiB written in 16 MiB calls took 6.0-6.6 s after the machine had been idle 20 s,
#: against 0.9-1.1 s in calls of 128-512 KiB and 0.8 s for ``cp``
#: (benchmarks/README.md). Back to back, the memory just freed: 256 KiB calls 1.00-1.11 s,
#: 16 MiB calls 0.80-3.51 s; large calls win 0.2 s at best, when the memory is warm.
WRITE_STEP = 256 * 1024


def write_all(file: BinaryIO, data: bytes | memoryview) -> None:
    """Write all of ``data`` to ``file``, at most :data:`WRITE_STEP` bytes per call.

    Raises:
        OSError: from the file, as its ``write`` raised it.
    """
    view = memoryview(data).cast("B")
    while view.nbytes:
        n = file.write(view[:WRITE_STEP])
        view = view[min(WRITE_STEP, view.nbytes) if n is None else n:]


@dataclass(frozen=True)
class CkptEntry:
    """One tensor in a ``.ckpt`` file, located but not read.

    Attributes:
        name: the tensor's tag.
        shape: its shape; ``()`` for a scalar.
        dtype: canonical dtype name.
        offset: file offset of its (first) ``tensor_content``.
        nbytes: total data size in bytes.
        pieces: ``(offset, nbytes)`` of each record holding its data; more than one when
            save_checkpoint split the tensor (over 512 MiB).
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    offset: int
    nbytes: int
    pieces: tuple[tuple[int, int], ...] = ()

    @property
    def numel(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)


class SkippedValue(NamedTuple):
    """A record that is not a tensor: an ``append_dict`` string or a map tensor."""

    name: str
    kind: str
    reason: str


@dataclass(frozen=True)
class CkptIndex:
    """The listing of a ``.ckpt`` file.

    Attributes:
        path: the file.
        entries: tensors in file order.
        skipped: non-tensor records.
        has_crc: the file ends with a ``crc_num`` trailer.
        crc_ok: ``True``/``False`` when the trailer was checked, ``None`` when there is none
            or the check was not asked for. A mismatch is reported here, not raised.
    """

    path: str
    entries: tuple[CkptEntry, ...]
    skipped: tuple[SkippedValue, ...]
    has_crc: bool
    crc_ok: bool | None


class _Malformed(Exception):
    """Raised inside the walker; turned into a SourceError naming the file."""

    def __init__(self, pos: int, what: str):
        super().__init__(what)
        self.pos, self.what = pos, what


def _varint(buf: Any, pos: int, end: int) -> tuple[int, int]:
    """Decode a protobuf varint at ``pos``; return (value, next position)."""
    result = shift = 0
    start = pos
    while True:
        if pos >= end:
            raise _Malformed(start, "a number runs past the end of its record")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise _Malformed(start, "a number is longer than 10 bytes")


def _field(buf: Any, pos: int, end: int) -> tuple[int, int, int, int]:
    """Read a field key and, for length-delimited fields, its bounds: (field, wire, a, b)."""
    start = pos
    key, pos = _varint(buf, pos, end)
    field, wire = key >> 3, key & 7
    if wire == 0:
        value, nxt = _varint(buf, pos, end)
        return field, wire, value, nxt
    if wire == 2:
        length, data = _varint(buf, pos, end)
        if length > end - data:
            raise _Malformed(start, f"a {length}-byte field runs {length - (end - data)} bytes "
                                    "past the end of its record")
        return field, wire, data, data + length
    raise _Malformed(start, f"unexpected field {field} with wire type {wire}")


def _parse_value(buf: Any, pos: int, end: int) -> tuple[str, str, list[int], int, int]:
    """Parse one Value record: (tag, tensor_type or "" for a map tensor, dims, content a, b)."""
    tag, tensor, is_map = None, None, False
    while pos < end:
        at = pos
        field, wire, a, b = _field(buf, pos, end)
        pos = b
        if wire != 2 or field not in (1, 2, 3):
            raise _Malformed(at, f"unknown field {field} (wire type {wire}) in a tensor record")
        if field == 1:
            try:
                tag = bytes(buf[a:b]).decode("utf-8")
            except UnicodeDecodeError:
                raise _Malformed(a, "a tensor name is not valid UTF-8") from None
        elif field == 2:
            tensor, is_map = _parse_tensor(buf, a, b), False
        else:
            is_map = True
    if tag is None:
        raise _Malformed(end, "a record has no name")
    if is_map:
        return tag, "", [], 0, 0
    if tensor is None:
        raise _Malformed(end, f"record {tag!r} holds no tensor")
    return (tag, *tensor)


def _parse_tensor(buf: Any, pos: int, end: int) -> tuple[str, list[int], int, int]:
    """Parse a TensorProto: (tensor_type, dims, content start, content end)."""
    dims: list[int] = []
    ttype, content = None, None
    while pos < end:
        at = pos
        field, wire, a, b = _field(buf, pos, end)
        pos = b
        if field == 1 and wire == 0:
            dims.append(a)
        elif field == 1 and wire == 2:  # packed dims: legal protobuf, never written by MindSpore
            while a < b:
                dim, a = _varint(buf, a, b)
                dims.append(dim)
        elif field == 2 and wire == 2:
            ttype = bytes(buf[a:b]).decode("ascii", "replace")
        elif field == 3 and wire == 2:
            content = (a, b)
        else:
            raise _Malformed(at, f"unknown field {field} (wire type {wire}) in a tensor")
    if ttype is None or content is None:
        raise _Malformed(end, "a tensor lacks its tensor_type or tensor_content")
    if any(d >= 1 << 63 for d in dims):
        raise _Malformed(end, f"a tensor has a negative dimension in {dims}")
    if len(dims) > MAX_RANK:
        raise _Malformed(end, f"a tensor has {len(dims)} dimensions (at most {MAX_RANK})")
    return (ttype, dims, *content)


def _sniff(head: bytes) -> str:
    """A hint of what a file that is not a checkpoint looks like instead."""
    if head.startswith(b"PK"):
        return " (it looks like a zip archive, e.g. a PyTorch .pt/.pth file)"
    if head[8:9] == b"{":
        return " (it looks like a safetensors file)"
    if head[:1] == b"\x80":
        return " (it looks like a pickle)"
    if head and all(32 <= c < 127 or c in b"\t\r\n" for c in head):
        return " (it looks like a text file)"
    return ""


def _finish_group(path: str, group: list[Any], entries: list[CkptEntry]) -> None:
    """Turn consecutive records sharing a tag into one CkptEntry, checking the data size."""
    name, ttype, dims, pieces, at = group
    dtype = CANONICAL_DTYPES.get(ttype)
    if dtype is None:
        raise SourceError(
            f"{path}: tensor {name!r} has tensor_type {ttype!r}, which ms-port cannot read "
            f"(known: {', '.join(CANONICAL_DTYPES)}); convert it with MindSpore first",
            path=path, tensor=name, tensor_type=ttype)
    shape, size = tuple(dims), numpy_dtype(dtype).itemsize
    nbytes = sum(n for _, n in pieces)
    if shape == (0,) and nbytes == size:  # load_checkpoint reads dims [0] as a scalar
        shape = ()
    if nbytes != math.prod(shape) * size:
        raise _Malformed(at, f"tensor {name!r} holds {nbytes} bytes but {format_shape(shape)} "
                             f"{dtype} needs {math.prod(shape) * size}")
    entries.append(CkptEntry(name, shape, dtype, pieces[0][0], nbytes, tuple(pieces)))


def _file_crc32(path: str, end: int) -> int:
    """CRC-32 of a file's first ``end`` bytes, read through one small reused buffer.

    Not through the mmap: every page touched there would stay in this process's RSS.
    """
    crc, block = 0, memoryview(bytearray(_CRC_BLOCK))
    with open(path, "rb") as f:
        while end > 0:
            n = f.readinto(block[:min(end, _CRC_BLOCK)])
            if not n:
                break
            crc, end = crc32(block[:n], crc), end - n
    return crc


def _scan(buf: Any, path: str, verify_crc: bool) -> CkptIndex:
    """Walk every record of a mapped checkpoint and build its index."""
    size = len(buf)
    entries: list[CkptEntry] = []
    skipped: list[SkippedValue] = []
    group: list[Any] | None = None  # the tensor being read: [name, type, dims, pieces, at]
    has_crc, pos, dropped = False, 0, 0
    last: tuple[str, str] | None = None
    try:
        while pos < size:
            if buf[pos:pos + len(CRC_MAGIC)] == CRC_MAGIC:
                if size - pos != CRC_TRAILER_SIZE:
                    raise _Malformed(pos, f"the crc_num trailer is {size - pos} bytes long, "
                                          f"not {CRC_TRAILER_SIZE}")
                has_crc = True
                break
            if buf[pos] != 0x0A:
                raise _Malformed(pos, f"found byte 0x{buf[pos]:02x} where a tensor record "
                                      "(0x0a) should start")
            _, _, a, b = _field(buf, pos, size)
            name, ttype, dims, c0, c1 = _parse_value(buf, a, b)
            if group and group[0] == name:  # another piece of a tensor save_checkpoint split
                if (group[1], group[2]) != (ttype, dims):
                    raise _Malformed(pos, f"tensor {name!r} changes shape or type mid-way")
                group[3].append((c0, c1 - c0))
            elif last != (name, ""):  # further pieces of a map tensor need no new note
                if group:
                    _finish_group(path, group, entries)
                group = None
                if ttype == _STRING_TYPE:
                    skipped.append(SkippedValue(name, "string", "an append_dict string"))
                elif not ttype:
                    skipped.append(SkippedValue(
                        name, "maptensor", "a MapParameter; ms-port converts only tensors"))
                else:
                    group = [name, ttype, dims, [(c0, c1 - c0)], pos]
            last = (name, ttype)
            pos = b
            dropped = _unmap_before(buf, dropped, pos)
        if group:
            _finish_group(path, group, entries)
    except _Malformed as exc:
        hint = "" if buf[0] == 0x0A else _sniff(bytes(buf[:16]))
        raise SourceError(
            f"{path} is not a MindSpore checkpoint, or is truncated or damaged at byte "
            f"{exc.pos}: {exc.what}{hint}; re-create it or check the download",
            path=path, offset=exc.pos) from None
    seen: set[str] = set()
    for name in [e.name for e in entries] + [s.name for s in skipped]:  # linear, not count()
        if name in seen:
            raise SourceError(f"{path}: tensor {name!r} appears twice, apart (load_checkpoint "
                              "would keep the last); re-save the checkpoint",
                              path=path, tensor=name)
        seen.add(name)
    crc_ok = None
    if has_crc and verify_crc:
        stored = int.from_bytes(buf[size - 10:size], "big")
        crc_ok = stored == _file_crc32(path, size - CRC_TRAILER_SIZE)
    return CkptIndex(path, tuple(entries), tuple(skipped), has_crc, crc_ok)


#: bytes walked past before the pages touched in them are let go
_UNMAP_STEP = 64 * 1024 * 1024


def _unmap_before(buf: Any, dropped: int, pos: int) -> int:
    """Let go of the mapped pages before ``pos`` (from ``dropped`` on), every
    :data:`_UNMAP_STEP` bytes; returns the new ``dropped``.

    Reading one record's header maps the page-cache folio it lies in, and a file read
    in by readahead sits in folios of up to 2 MiB: listing a 3 GiB checkpoint of 288
    tensors kept 465 MiB mapped, all counted in this process's RSS, until the map closed.
    """
    end = pos - pos % mmap.PAGESIZE
    if end - dropped < _UNMAP_STEP or not hasattr(mmap, "MADV_DONTNEED") \
            or not hasattr(buf, "madvise"):
        return dropped
    with contextlib.suppress(OSError, ValueError):  # only memory is at stake
        buf.madvise(mmap.MADV_DONTNEED, dropped, end - dropped)
    return end


def _open_map(path: str | os.PathLike) -> mmap.mmap:
    """Map a file read-only, turning every OS failure into a SourceError."""
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                raise SourceError(f"{path} is empty (0 bytes); re-create or re-download it",
                                  path=path)
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except FileNotFoundError:
        raise SourceError(f"{path}: no such file; check the path", path=path) from None
    except PermissionError:
        raise SourceError(f"{path}: permission denied; make the file readable", path=path) from None
    except (OSError, ValueError) as exc:
        raise SourceError(f"{path}: cannot read it ({exc}); check that it is a regular file",
                          path=path) from None


def _array(buf: Any, entry: CkptEntry, path: str) -> np.ndarray:
    """The data of ``entry``: a read-only view of ``buf``, or a joined copy when split."""
    dtype = numpy_dtype(entry.dtype)
    pieces = entry.pieces or ((entry.offset, entry.nbytes),)
    if pieces[-1][0] + pieces[-1][1] > len(buf):
        raise SourceError(f"{path}: tensor {entry.name!r} lies past the end of the file; the file "
                          "changed since it was listed, list it again", path=path)
    if len(pieces) == 1:
        flat = np.frombuffer(buf, dtype=dtype, count=entry.numel, offset=entry.offset)
    else:
        flat = np.empty(entry.numel, dtype)
        raw, at = flat.view(np.uint8), 0
        for offset, n in pieces:
            raw[at:at + n] = np.frombuffer(buf, np.uint8, count=n, offset=offset)
            at += n
    return flat.reshape(entry.shape)


def _read(path: str, entry: CkptEntry, rows: tuple[int, int] | None = None) -> np.ndarray:
    """Read ``entry``'s bytes (all its pieces) from ``path`` into a fresh array; with
    ``rows`` (``start, stop`` along the first axis, within it), only those rows' bytes."""
    count, shape, lo = entry.numel, entry.shape, 0
    if rows is not None:
        start, stop = rows
        if not entry.shape or not 0 <= start <= stop <= entry.shape[0]:
            raise ValueError(f"rows {start}:{stop} of tensor {entry.name!r} "
                             f"{entry.shape}: outside it")
        per_row = count // entry.shape[0] if entry.shape[0] else 0
        count, shape = (stop - start) * per_row, (stop - start, *entry.shape[1:])
        lo = start * per_row * numpy_dtype(entry.dtype).itemsize
    flat = np.empty(count, numpy_dtype(entry.dtype))
    raw, at = flat.view(np.uint8), 0
    try:
        with open(path, "rb") as f:
            for offset, n in entry.pieces or ((entry.offset, entry.nbytes),):
                skip = min(lo, n)  # the bytes of this piece before the wanted span
                lo -= skip
                n = min(n - skip, raw.nbytes - at)
                if n <= 0:
                    continue
                f.seek(offset + skip)
                if f.readinto(raw[at:at + n]) != n:
                    raise SourceError(f"{path}: tensor {entry.name!r} lies past the end of "
                                      "the file; the file changed since it was listed, list "
                                      "it again", path=path)
                at += n
    except OSError as exc:
        raise SourceError(f"{path}: cannot read tensor {entry.name!r} ({exc})",
                          path=path) from None
    return flat.reshape(shape)


def read_ckpt(path: str | os.PathLike, *, verify_crc: bool = True) -> CkptIndex:
    """List the tensors of a ``.ckpt`` file without reading their data.

    Args:
        path: the checkpoint file.
        verify_crc: check a ``crc_num`` trailer when there is one (reads the whole file,
            in constant memory); a mismatch sets ``crc_ok=False``.

    Returns:
        The :class:`CkptIndex`: tensors, skipped non-tensors and the CRC status.

    Raises:
        SourceError: the file is missing, empty, truncated, corrupt or not a checkpoint.
    """
    with CkptReader(path, verify_crc=verify_crc) as reader:
        return reader.index


def load_entry(source: str | os.PathLike | mmap.mmap, entry: CkptEntry) -> np.ndarray:
    """Read one tensor listed by :func:`read_ckpt`.

    Args:
        source: the checkpoint path, or an ``mmap`` of it (cheaper for many tensors;
            better still, use :class:`CkptReader`).
        entry: the tensor's entry.

    Returns:
        Its data with the right shape and dtype (bfloat16 as ``ml_dtypes.bfloat16``),
        usually a read-only view of the mapped file; it stays valid after the map is closed.
    """
    if isinstance(source, mmap.mmap):
        return _array(source, entry, "checkpoint")
    return _array(_open_map(source), entry, str(source))


class CkptReader:
    """One ``.ckpt`` file: its listing, and tensors read by name.

    The file is mapped only while it is listed. Each :meth:`load` reads that tensor's
    bytes into a fresh array: converting or checking a multi-GB file one tensor at a time
    then holds one tensor, where a long-lived map would keep every page it touched
    resident (and counted in the process's RSS).

    Attributes:
        path, index, entries, skipped, has_crc, crc_ok: as in :class:`CkptIndex`.
    """

    def __init__(self, path: str | os.PathLike, *, verify_crc: bool = True):
        """List ``path`` (see :func:`read_ckpt` for arguments and errors)."""
        self.path = str(path)
        buf = _open_map(path)
        try:
            self.index = _scan(buf, self.path, verify_crc)
        finally:
            with contextlib.suppress(BufferError):
                buf.close()
        self.entries, self.skipped = self.index.entries, self.index.skipped
        self.has_crc, self.crc_ok = self.index.has_crc, self.index.crc_ok
        self._by_name = {e.name: e for e in self.entries}

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    def load(self, name: str, rows: tuple[int, int] | None = None) -> np.ndarray:
        """Return tensor ``name``'s data as a fresh array (with ``rows``, ``start, stop``
        along its first axis: only those rows read); KeyError if absent."""
        return _read(self.path, self._by_name[name], rows)

    def close(self) -> None:
        """Nothing stays open between loads; kept for ``with`` and symmetry."""

    def __enter__(self) -> CkptReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _encode_varint(value: int) -> bytes:
    """Encode a non-negative int as a protobuf varint."""
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _len_field(key: int, payload_size: int) -> bytes:
    """Key and length prefix of a length-delimited field."""
    return bytes([key]) + _encode_varint(payload_size)


def _record_header(name: bytes, dims: tuple[int, ...], ttype: bytes, size: int) -> bytes:
    """Everything of one ``value`` record that precedes its ``size`` content bytes."""
    tensor = (b"".join(b"\x08" + _encode_varint(d) for d in dims)
              + _len_field(0x12, len(ttype)) + ttype + _len_field(0x1A, size))
    value = _len_field(0x0A, len(name)) + name + _len_field(0x12, len(tensor) + size) + tensor
    return _len_field(0x0A, len(value) + size) + value


def tensor_bytes(array: Any) -> tuple[tuple[int, ...], str, np.ndarray]:
    """An array as a checkpoint stores it: its shape, canonical dtype name (or numpy's,
    for a dtype no checkpoint holds) and its bytes in C order, little-endian, as a flat
    ``uint8`` array: a view where the array already is so, else one copy."""
    array = np.asarray(array)
    try:
        dtype = dtype_name(array.dtype.newbyteorder("<"))
    except (KeyError, TypeError, ValueError):
        return array.shape, str(array.dtype), np.empty(0, np.uint8)
    # the shape is kept first: ascontiguousarray turns a 0-d array into shape (1,)
    raw = np.ascontiguousarray(array, dtype=numpy_dtype(dtype)).reshape(-1).view(np.uint8)
    return array.shape, dtype, raw


class CkptWriter:
    """Stream tensors into a ``.ckpt`` byte-identical to ``mindspore.save_checkpoint``.

    Wraps a file object the caller opened (and later closes, renames or deletes); each
    :meth:`write` goes out at once, so only one tensor is ever held. Leaving the ``with``
    block normally calls :meth:`finish`; leaving it on an exception writes nothing more.

    Attributes:
        bytes_written: bytes written so far, trailer included once finished.
    """

    def __init__(self, file: BinaryIO, *, crc: bool = False, slice_bytes: int = SLICE_BYTES):
        """Write to ``file``; ``crc`` appends save_checkpoint's ``crc_check`` trailer.

        ``slice_bytes`` is save_checkpoint's split size; change it only in tests.
        """
        self._file, self._crc_on, self._slice = file, crc, slice_bytes
        self._crc, self._names, self._done = 0, set(), False
        self.bytes_written = 0

    def _fail(self, what: str, **data: Any) -> WriteError:
        """A WriteError naming the output file."""
        where = getattr(self._file, "name", "the output")
        return WriteError(f"{where}: {what}", path=where if isinstance(where, str) else None,
                          **data)

    def _put(self, data: bytes | memoryview) -> None:
        """Write all of ``data``, updating the CRC and the byte count."""
        if self._crc_on:
            self._crc = crc32(data, self._crc)
        try:
            write_all(self._file, data)
        except OSError as exc:
            raise self._fail(f"cannot write ({exc.strerror or exc}); check free disk space "
                             "and permissions") from exc
        self.bytes_written += len(data)

    def write(self, name: str, array: Any) -> tuple[tuple[int, int], ...]:
        """Encode and write one tensor.

        Args:
            name: the parameter name (unique in the file).
            array: the data; any layout or byte order, 0-d included. bfloat16 must be
                ``ml_dtypes.bfloat16``.

        Returns:
            Where its data went: ``(offset, nbytes)`` of each record's data, as a
            reader's :attr:`CkptEntry.pieces` (offsets counted from the writer's start).

        Raises:
            WriteError: the writer is finished, the name repeats, the array is empty or
                its dtype cannot be stored in a checkpoint MindSpore loads.
        """
        shape, dtype, raw = tensor_bytes(array)
        return self.write_chunks(name, shape, dtype, (raw,))

    def write_chunks(self, name: str, shape: tuple[int, ...], dtype: str,
                     chunks: Iterable[Any]) -> tuple[tuple[int, int], ...]:
        """Write one tensor whose bytes come in ``chunks``, as they come.

        Args:
            name: the parameter name (unique in the file).
            shape, dtype: the tensor's; ``dtype`` a canonical name.
            chunks: its bytes in C order, little-endian, cut anywhere (``uint8``
                arrays, bytes); each is written before the next is asked for.

        Returns:
            As :meth:`write`.

        Raises:
            WriteError: as :meth:`write`, or the chunks hold other than the shape's bytes.
        """
        if self._done:
            raise self._fail(f"cannot write {name!r}: the checkpoint is already finished")
        if not name or name in self._names:
            raise self._fail(f"tensor name {name!r} is empty or written twice; names must "
                             "be unique", tensor=name)
        if dtype not in WRITABLE_DTYPES:
            fix = ("ms-port dequantizes float8 weights that have block scales and a "
                   "quantization_config.weight_block_size in config.json"
                   if dtype in STORED_DTYPES else
                   f"cast it to one of {sorted(WRITABLE_DTYPES)}")
            raise self._fail(f"tensor {name!r} has dtype {dtype}, which MindSpore cannot load "
                             f"from a checkpoint; {fix}", tensor=name)
        nbytes = math.prod(shape) * numpy_dtype(dtype).itemsize
        if nbytes == 0:
            raise self._fail(f"tensor {name!r} is empty ({format_shape(shape)}): "
                             "MindSpore drops empty tensors when saving and misreads them "
                             "when loading; leave it out", tensor=name)
        ttype, tag = MS_TENSOR_TYPES[dtype].encode(), name.encode("utf-8")
        sizes = iter(self._record_sizes(nbytes))
        pieces: list[tuple[int, int]] = []
        left = 0  # bytes the current record still takes
        for chunk in chunks:
            view = memoryview(chunk).cast("B")
            while view.nbytes:
                if not left:
                    left = next(sizes, 0)
                    if not left:
                        raise self._wrong_size(name, shape, dtype, nbytes, "more")
                    self._put(_record_header(tag, shape, ttype, left))
                    pieces.append((self.bytes_written, left))
                n = min(left, view.nbytes)
                self._put(view[:n])
                view, left = view[n:], left - n
        if left or next(sizes, 0):
            raise self._wrong_size(name, shape, dtype, nbytes, "fewer")
        self._names.add(name)
        return tuple(pieces)

    def _record_sizes(self, nbytes: int) -> list[int]:
        """The data bytes of each record a tensor of ``nbytes`` is split into."""
        return [min(self._slice, nbytes - at) for at in range(0, nbytes, self._slice)]

    def _wrong_size(self, name: str, shape: tuple[int, ...], dtype: str, nbytes: int,
                    held: str) -> WriteError:
        return self._fail(f"tensor {name!r} ({format_shape(shape)} {dtype}) takes {nbytes} "
                          f"bytes and its data held {held}; the file is incomplete",
                          tensor=name)

    def size_of(self, name: str, shape: tuple[int, ...], dtype: str) -> int:
        """The bytes :meth:`write_chunks` puts in the file for such a tensor, its records'
        framing included."""
        ttype, tag = MS_TENSOR_TYPES[dtype].encode(), name.encode("utf-8")
        sizes = self._record_sizes(math.prod(shape) * numpy_dtype(dtype).itemsize)
        return sum(len(_record_header(tag, shape, ttype, n)) + n for n in sizes)

    @property
    def trailer_size(self) -> int:
        """The bytes :meth:`finish` appends (the CRC trailer, if asked for)."""
        return CRC_TRAILER_SIZE if self._crc_on else 0

    def finish(self) -> None:
        """Write the CRC trailer if asked for and flush; the file stays open."""
        if self._done:
            return
        self._done = True
        if self._crc_on:
            self._crc_on = False  # the trailer is not part of its own CRC
            self._put(CRC_MAGIC + self._crc.to_bytes(10, "big"))
        try:
            self._file.flush()
        except OSError as exc:
            raise self._fail(f"cannot write ({exc.strerror or exc}); check free disk space") \
                from exc

    close = finish

    def __enter__(self) -> CkptWriter:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self.finish()
        else:
            self._done = True

