"""Tensor metadata shared by every reader, target and writer.

Data travels as numpy arrays. numpy has no bfloat16, so bfloat16 arrays use
``ml_dtypes.bfloat16`` (the dtype JAX and TensorFlow use); everything else is plain numpy.
Dtypes are named by one canonical string each (``"float32"``, ``"bfloat16"``, ``"int64"``…).
A file may also store dtypes MindSpore cannot hold (:data:`STORED_DTYPES`: float8 as
ml_dtypes arrays; :data:`PACKED_DTYPES`: 4- and 6-bit floats, several to a byte): they
are listed by their own names and loaded as stored, never converted silently.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import mmap
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import ml_dtypes
import numpy as np

from .._libc import libc_function

if TYPE_CHECKING:
    from .hub import HubRef

#: canonical dtype name -> numpy dtype
NUMPY_DTYPES: dict[str, np.dtype] = {
    "float64": np.dtype(np.float64),
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "int64": np.dtype(np.int64),
    "int32": np.dtype(np.int32),
    "int16": np.dtype(np.int16),
    "int8": np.dtype(np.int8),
    "uint8": np.dtype(np.uint8),
    "uint16": np.dtype(np.uint16),
    "uint32": np.dtype(np.uint32),
    "uint64": np.dtype(np.uint64),
    "bool": np.dtype(np.bool_),
    "complex64": np.dtype(np.complex64),
    "complex128": np.dtype(np.complex128),
}
#: dtypes a file may store that MindSpore cannot hold: listed, and loaded as stored
STORED_DTYPES: dict[str, np.dtype] = {
    "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2),
    "float8_e4m3fnuz": np.dtype(ml_dtypes.float8_e4m3fnuz),
    "float8_e5m2fnuz": np.dtype(ml_dtypes.float8_e5m2fnuz),
    "float8_e8m0fnu": np.dtype(ml_dtypes.float8_e8m0fnu),  # a power of two: MX block scales
}
#: float8 formats that hold weights (dequantized with their block scales, see
#: :mod:`ms_port.read.fp8`); e8m0 holds only scales
FLOAT8_DTYPES = frozenset(STORED_DTYPES) - {"float8_e8m0fnu"}
#: sub-byte dtypes packed several to a byte (safetensors ``F4``, ``F6_*``): bits per
#: element. No numpy dtype holds them packed: they load as their bytes, a flat uint8 array
PACKED_DTYPES: dict[str, int] = {"float4_e2m1fn": 4, "float6_e2m3fn": 6, "float6_e3m2fn": 6}
_NAME_OF = {dt: name for name, dt in {**NUMPY_DTYPES, **STORED_DTYPES}.items()}

FLOAT_DTYPES = frozenset({"float64", "float32", "float16", "bfloat16"})
#: more dimensions than any real network uses (torch allows 64, numpy 32): files that
#: claim more are refused by every reader
MAX_RANK = 16
#: no real tensor has a dimension this large (2^40 elements): a file claiming one lies
MAX_DIM = 1 << 40


def dtype_name(dtype: np.dtype | str) -> str:
    """The canonical name of a numpy dtype (``ml_dtypes.bfloat16`` is ``"bfloat16"``)."""
    if isinstance(dtype, str):
        if dtype in NUMPY_DTYPES:
            return dtype
        dtype = np.dtype(dtype)
    return _NAME_OF[np.dtype(dtype)]


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype for a canonical dtype name (float8 ones too, as ml_dtypes')."""
    found = NUMPY_DTYPES.get(name, STORED_DTYPES.get(name))
    if found is None:
        packed = " (packed below a byte: no numpy dtype)" if name in PACKED_DTYPES else ""
        raise ValueError(f"unknown dtype {name!r}{packed}; known: "
                         f"{', '.join([*NUMPY_DTYPES, *STORED_DTYPES])}")
    return found


def itemsize(name: str) -> int:
    return numpy_dtype(name).itemsize


def nbytes_of(numel: int, dtype: str) -> int:
    """The bytes ``numel`` elements of ``dtype`` take, packed dtypes rounded up to a byte."""
    bits = PACKED_DTYPES.get(dtype)
    return numel * itemsize(dtype) if bits is None else (numel * bits + 7) // 8


#: bytes compared at a time where numpy compares: bounds its boolean temporaries
COMPARE_BYTES = 1 << 24


#: ``memcmp(a, b, n)``: compares bytes at any alignment without copying them. A
#: checkpoint's tensors start at whatever offset its protobuf framing leaves them, and
#: numpy copies misaligned words into aligned buffers before comparing them: memcmp
#: compared the 0.9 GB of a 1.1B LLaMA's unfused tensors in 0.14-0.17 s, numpy's
#: uint64 words in 0.28-0.32 s.
_MEMCMP = libc_function("memcmp", ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                         ctypes.c_size_t)


def flat_bytes(array: np.ndarray) -> np.ndarray:
    """An array's bytes in C order as a flat ``uint8`` array (a view when contiguous)."""
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two arrays hold the same bytes (NaN equals NaN bit for bit): by
    ``memcmp`` where the C library is reachable, else by numpy a bounded chunk at a time."""
    if a.nbytes != b.nbytes:
        return False
    a, b = flat_bytes(a), flat_bytes(b)
    if _MEMCMP is not None:
        return a.nbytes == 0 or _MEMCMP(a.ctypes.data, b.ctypes.data, a.nbytes) == 0
    return all(np.array_equal(a[i:i + COMPARE_BYTES], b[i:i + COMPARE_BYTES])
               for i in range(0, a.nbytes, COMPARE_BYTES))


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's name, shape and dtype, with its data fetched only on demand.

    Attributes:
        name: the tensor's name after unwrapping and prefix stripping.
        shape: the tensor's shape; ``()`` for a scalar.
        dtype: canonical dtype name.
        loader: returns the data as a numpy array; ``None`` for metadata-only entries
            (targets, or a template checkpoint read without its data).
        rows_loader: where a format can read a span of rows alone, ``(start, stop)`` ->
            those rows along the first axis (:meth:`load_rows`).
        extents: ``(file, offset, bytes)`` of each stretch of a file holding the tensor's
            stored bytes, where the format says (safetensors, ``.ckpt``); what a reader may
            read ahead (:class:`~ms_port.read.ahead.ReadAhead`). Empty: unknown.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    loader: Callable[[], np.ndarray] | None = field(default=None, repr=False, compare=False)
    rows_loader: Callable[[int, int], np.ndarray] | None = field(default=None, repr=False,
                                                                 compare=False)
    extents: tuple[tuple[str, int, int], ...] = field(default=(), repr=False, compare=False)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return nbytes_of(self.numel, self.dtype)

    def load(self) -> np.ndarray:
        """Return the tensor's data (a fresh array or a read-only memory map)."""
        if self.loader is None:
            raise ValueError(f"tensor {self.name!r} carries no data (metadata only)")
        return self.loader()

    def load_rows(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` along the first axis: only their bytes read where the
        format allows (:attr:`rows_loader`), else sliced from the whole tensor."""
        if self.rows_loader is not None:
            return self.rows_loader(start, stop)
        return self.load()[start:stop]

    def to_dict(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype,
                "numel": self.numel, "nbytes": self.nbytes}


def format_shape(shape: tuple[int, ...]) -> str:
    """``(64, 3, 7, 7)`` as ``64×3×7×7``; a scalar as ``scalar``."""
    return "×".join(str(d) for d in shape) if shape else "scalar"


#: the largest shard index (``*.index.json``) read: its weight map names every tensor
MAX_INDEX_BYTES = 64 << 20


@dataclass(frozen=True)
class Skipped:
    """A checkpoint entry that is not a tensor (epoch, optimizer state, args)."""

    name: str
    kind: str
    reason: str

    def to_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "reason": self.reason}


def mapped_at(raw: np.ndarray) -> tuple[Any, int] | None:
    """(the ``mmap`` that ``raw``'s bytes lie in, the offset of its first byte in that
    map), where ``raw`` views a file's memory map (a safetensors source's tensor, or a
    slice of one); ``None`` for memory of its own (a copy: a transposed tensor's bytes)."""
    root = raw
    while isinstance(root.base, np.ndarray):  # a slice of a map is a np.memmap too, with
        root = root.base                      # its parent's offset: only the root counts
    mm = getattr(root, "_mmap", None) if isinstance(root, np.memmap) else None
    if mm is None:
        return None
    start, here = root.__array_interface__["data"][0], raw.__array_interface__["data"][0]
    if not start <= here <= here + raw.nbytes <= start + root.nbytes:
        return None
    # the map starts at the root's offset rounded down to the allocation granularity
    return mm, here - start + root.offset % mmap.ALLOCATIONGRANULARITY


def released_chunks(raw: np.ndarray, step: int) -> Iterator[np.ndarray]:
    """``raw`` (a tensor's bytes) in chunks of ``step`` bytes. Where ``raw`` views a
    file's memory map, each chunk's pages leave this process two chunks after it was
    handed out (they stay in the page cache; a reread only faults them back): a 1.2 GiB
    embedding no longer counts whole in a writer's or a read-back's memory."""
    found = mapped_at(raw)
    if found is None or not hasattr(found[0], "madvise") or \
            not hasattr(mmap, "MADV_DONTNEED"):
        yield from (raw[i:i + step] for i in range(0, raw.size, step))
        return
    mm, first = found
    released = first - first % mmap.PAGESIZE
    for i in range(0, raw.size, step):
        yield raw[i:i + step]
        upto = first + max(0, i - step)  # two chunks behind the one just handed out
        upto -= upto % mmap.PAGESIZE
        if upto > released:
            with contextlib.suppress(OSError, ValueError):  # only memory is at stake
                mm.madvise(mmap.MADV_DONTNEED, released, upto - released)
            released = upto


@dataclass
class Source:
    """The tensors of one checkpoint, in file order.

    Attributes:
        path: the file read (the index file for a sharded safetensors set).
        format: ``torch-zip``, ``torch-legacy``, ``safetensors``, ``safetensors-sharded``,
            ``torch-sharded``
            or ``mindspore-ckpt``.
        tensors: name -> :class:`~ms_port.read.tensors.TensorInfo`, in file order.
        unwrapped: container keys descended into (``["state_dict"]``).
        stripped: wrapper prefixes removed from every name (``["module."]``).
        skipped: non-tensor entries, listed rather than silently dropped.
        metadata: format metadata (safetensors ``__metadata__``), if any.
    """

    path: str
    format: str
    tensors: dict[str, TensorInfo]
    unwrapped: list[str] = field(default_factory=list)
    stripped: list[str] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)
    #: bytes on disk of every shard of a sharded set (0 for a single file)
    shard_bytes: int = 0
    #: the shard files of a sharded set (read as inputs: never written over)
    shards: list[str] = field(default_factory=list)
    #: the model's ``config.json`` (a Hugging Face directory), and where it was read
    config: dict[str, Any] | None = None
    config_path: str | None = None
    #: the Hugging Face Hub id and commit ``path`` was resolved from, if it was one
    hub: HubRef | None = None
    #: a distributed training output's layout (:class:`~ms_port.read.distributed.
    #: ClusterLayout`), and its training state (optimizer moments, counters), kept apart
    cluster: Any = None
    training_state: list[TensorInfo] = field(default_factory=list)
    #: what the reader wants said about how it read the file (a whole pickled module
    #: read as data, and which of its copies was taken)
    notes: list[str] = field(default_factory=list)
    #: a whole pickled module's own description (:class:`~ms_port.read.modules.
    #: Description`: its class, ultralytics' architecture), for building its PyTorch twin
    described: Any = None

    def __len__(self) -> int:
        return len(self.tensors)

    def __iter__(self):
        return iter(self.tensors.values())

    def __getitem__(self, name: str) -> TensorInfo:
        return self.tensors[name]

    def __contains__(self, name: object) -> bool:
        return name in self.tensors
