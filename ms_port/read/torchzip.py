"""Read PyTorch's zip checkpoints without importing torch, and without running any pickle.

``torch.save`` writes a zip: ``<root>/data.pkl`` (a pickle of the state dict whose
tensors point at storages) and ``<root>/data/<key>`` (each storage's raw bytes, stored
uncompressed). Importing torch costs seconds and hundreds of MiB, more than the whole
conversion of a ResNet, so this module reads ``data.pkl`` with its own small pickle
machine (:class:`_Machine`) instead of :mod:`pickle`.

The contract: this reader is **no wider than** ``torch.load(weights_only=True)``.

- It interprets only opcodes that torch's weights-only unpickler interprets, with the
  same stack semantics, and resolves only ``collections.OrderedDict``, the tensor and
  parameter rebuild functions and the typed storage classes — to local stand-ins.
- ``BUILD`` may only touch a plain ``OrderedDict`` (torch stores a state dict's
  ``_metadata`` that way) and is otherwise handed to torch; it never sets state on the
  reader's own objects. ``SETITEM(S)``/``APPEND(S)`` only touch dicts and lists.
- Every storage names an uncompressed member ``<root>/data/<key>`` of this archive; its
  extent is what the pickle declares (``numel × itemsize``) and must equal the member's
  size, as torch requires. Every tensor's geometry (sizes, strides, offset: non-negative
  ints, at most :data:`MAX_RANK` dimensions, overflow-free) must fit inside its storage,
  and a tensor may not hold more bytes than its storage (no stride-0 expansion): all
  checked before a byte is read.

**Modules pickled whole** (``torch.save(model)``, ultralytics' ``model``/``ema``, YOLOv5 and
YOLOv7) are read by a second pass, asked for by the caller after the first says
:class:`Unsupported`: ``load(path, modules=True)``. There a class global the list above does
not hold becomes an inert :class:`ClassRef` (a name; nothing is imported), ``NEWOBJ`` or
``REDUCE`` of one with no arguments an :class:`Instance` of it, and ``BUILD`` keeps the state
it would set as a plain dict on that instance. Nothing is ever called: ``REDUCE`` of a name
with arguments is refused (:class:`CodeRefused`), except the few data builders torch's own
unpickler allows, and numpy's numeric scalars (:data:`_DATA_BUILDERS`: ``set``,
``frozenset``, ``torch.Size``, ``numpy.dtype`` of a number, ``numpy`` scalars from their
bytes, protocol 2's ``_codecs.encode(text, 'latin1')`` for bytes), computed
here. :mod:`ms_port.read.modules` then walks the instances' ``_parameters``, ``_buffers``
and ``_modules`` for the names ``state_dict()`` would give.

Anything it does not handle exactly as torch would raises :class:`Unsupported`; the
caller then lets ``torch.load(weights_only=True)`` decide, with its own guards
(:mod:`ms_port.read.sources`). Damaged bytes raise :class:`Refused` (or the zip
module's own errors) — torch refuses those files too. Tensor data is read on demand
with one positioned read, so listing a file reads only its pickle.
"""

from __future__ import annotations

import collections
import io
import math
import os
import struct
import zipfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .tensors import FLOAT_DTYPES, MAX_DIM, MAX_RANK, numpy_dtype

#: torch storage class name -> canonical dtype
STORAGE_DTYPES = {
    "DoubleStorage": "float64", "FloatStorage": "float32", "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16", "LongStorage": "int64", "IntStorage": "int32",
    "ShortStorage": "int16", "CharStorage": "int8", "ByteStorage": "uint8",
    "BoolStorage": "bool", "ComplexFloatStorage": "complex64",
    "ComplexDoubleStorage": "complex128",
}
#: the largest data.pkl read into memory (a 100k-tensor state dict pickles to ~10 MiB)
MAX_PICKLE_BYTES = 256 << 20


class Unsupported(Exception):
    """The file uses something this reader does not handle; let torch.load judge it."""


class Refused(ValueError):
    """The file is damaged or inconsistent: torch refuses it as well."""


class CodeRefused(Unsupported):
    """Reading modules as data: the file calls something with arguments (code, not data)."""


@dataclass(frozen=True)
class ClassRef:
    """A global the file names and that is never imported: ``module.name`` as data."""

    module: str
    name: str

    def __str__(self) -> str:
        return f"{self.module}.{self.name}"


class Instance:
    """An object of a :class:`ClassRef`, never constructed: the state ``BUILD`` would set
    (``__dict__`` for an ``nn.Module``) kept as a plain dict."""

    __slots__ = ("cls", "state")

    def __init__(self, cls: ClassRef) -> None:
        self.cls = cls
        self.state: dict[str, Any] | None = None

    def __repr__(self) -> str:
        return f"<{self.cls} (not constructed)>"


@dataclass(frozen=True)
class _Storage:
    path: str
    key: str
    dtype: str
    offset: int  # of the storage's bytes in the file
    nbytes: int  # numel × itemsize, as declared by the pickle


@dataclass(frozen=True)
class LazyTensor:
    """A tensor of a torch zip file: where its bytes are, not the bytes."""

    storage: _Storage
    storage_offset: int  # in elements
    shape: tuple[int, ...]
    stride: tuple[int, ...]

    @property
    def dtype(self) -> str:
        return self.storage.dtype

    def load(self) -> np.ndarray:
        """Read just the span of the storage this tensor covers (one copy, no mmap)."""
        dt = numpy_dtype(self.dtype)
        if math.prod(self.shape) == 0:
            return np.zeros(self.shape, dt)
        span = _span(self.shape, self.stride)
        nbytes = span * dt.itemsize
        flat = np.empty(span, dt)
        with open(self.storage.path, "rb") as f:
            got = os.preadv(f.fileno(), [memoryview(flat.view(np.uint8))],
                            self.storage.offset + self.storage_offset * dt.itemsize)
        if got != nbytes:
            raise Refused(f"file ends inside a tensor (read {got} of {nbytes} bytes)")
        strides = tuple(s * dt.itemsize if n > 1 else 0 for n, s in zip(self.shape, self.stride))
        # geometry was checked against the storage in _rebuild_tensor: the view is inside
        view = np.lib.stride_tricks.as_strided(flat, self.shape, strides, writeable=False)
        return view if view.flags.c_contiguous else np.ascontiguousarray(view)

    def load_rows(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` along the first axis, only their span of the storage read:
        a view of this tensor, inside it, so inside the storage checked for it."""
        if not self.shape or not 0 <= start <= stop <= self.shape[0]:
            raise ValueError(f"rows {start}:{stop} of a tensor of shape {self.shape}")
        return replace(self, storage_offset=self.storage_offset + start * self.stride[0],
                       shape=(stop - start, *self.shape[1:])).load()


def _span(shape: tuple[int, ...], stride: tuple[int, ...]) -> int:
    """Elements from the first to the last one a non-empty view touches, inclusive."""
    return 1 + sum((n - 1) * s for n, s in zip(shape, stride) if n > 1)


def _is_int(v: Any) -> bool:
    return type(v) is int  # bool is an int subclass: torch treats it differently


def _int_tuple(v: Any, what: str) -> tuple[int, ...]:
    if type(v) is not tuple or not all(_is_int(x) for x in v):
        raise Unsupported(f"tensor {what} is not a tuple of ints")
    if len(v) > MAX_RANK:
        raise Refused(f"tensor has {len(v)} dimensions (at most {MAX_RANK} are supported)")
    return v


def _rebuild_tensor(storage: Any, storage_offset: Any, size: Any, stride: Any,
                    requires_grad: Any = False, backward_hooks: Any = None,
                    metadata: Any = None, *extra: Any) -> LazyTensor:
    if extra or not isinstance(storage, _Storage):
        raise Unsupported("tensor without a plain storage")
    if type(requires_grad) is not bool or (requires_grad and storage.dtype not in FLOAT_DTYPES):
        raise Unsupported("unusual requires_grad")
    if type(backward_hooks) is not collections.OrderedDict or backward_hooks:
        raise Unsupported("tensor with backward hooks")
    if metadata not in (None, {}):
        raise Unsupported("tensor with metadata")
    if not _is_int(storage_offset):
        raise Unsupported("storage offset is not an int")
    shape, strides = _int_tuple(size, "size"), _int_tuple(stride, "stride")
    if len(shape) != len(strides):
        raise Refused(f"tensor size {list(shape)} and stride {list(strides)} differ in rank")
    if any(v >= 1 << 63 for v in (storage_offset, *shape, *strides)):
        raise Refused("tensor geometry does not fit in 64 bits")
    if any(not 0 <= n < MAX_DIM for n in shape):  # torch lets [0, -8] through
        raise Refused(f"tensor size {list(shape)} has a dimension outside 0..2^40")
    item = numpy_dtype(storage.dtype).itemsize
    numel = math.prod(shape)
    # an empty tensor reads nothing, so torch accepts any strides for it (not offsets); a
    # negative stride only matters along a dimension of 2+ elements
    if storage_offset < 0 or (numel and any(s < 0 and n > 1 for n, s in zip(shape, strides))):
        raise Refused(f"negative tensor geometry (offset {storage_offset}, size "
                      f"{list(shape)}, stride {list(strides)})")
    if numel:
        end = (storage_offset + _span(shape, strides)) * item  # Python ints: no overflow
        if end > storage.nbytes:
            raise Refused(f"tensor of size {list(shape)}, stride {list(strides)} at offset "
                          f"{storage_offset} needs {end} bytes of a {storage.nbytes}-byte "
                          f"storage {storage.key!r}")
        if numel * item > storage.nbytes:
            raise Refused(f"tensor of size {list(shape)} repeats its {storage.nbytes}-byte "
                          f"storage {storage.key!r} (stride-0 expansion); re-save it with "
                          ".contiguous()")
    return LazyTensor(storage, storage_offset, shape, strides)


def _rebuild_parameter(data: Any, requires_grad: Any = None, backward_hooks: Any = None,
                       *extra: Any) -> LazyTensor:
    if not isinstance(data, LazyTensor) or type(requires_grad) is not bool:
        raise Unsupported("parameter without a plain tensor")
    if requires_grad and data.dtype not in FLOAT_DTYPES:
        raise Unsupported("integer parameter requiring grad")
    if type(backward_hooks) is not collections.OrderedDict or backward_hooks:
        raise Unsupported("parameter with backward hooks")
    if extra and (len(extra) != 1 or extra[0] not in (None, {})):
        raise Unsupported("parameter with state")
    return data


def _ordered_dict(*args: Any) -> collections.OrderedDict:
    if args:
        raise Unsupported("OrderedDict built from arguments")
    return collections.OrderedDict()


@dataclass(frozen=True)
class _StorageType:
    dtype: str


_CALLABLES: dict[tuple[str, str], Callable[..., Any]] = {
    ("collections", "OrderedDict"): _ordered_dict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
}
_MARK = object()


class _Machine:
    """The subset of pickle that torch's weights-only unpickler interprets, on data only.

    Mirrors ``torch/_weights_only_unpickler.py`` opcode by opcode; where torch would call
    into something this module does not model, raises :class:`Unsupported`.
    """

    def __init__(self, data: bytes, persistent_load: Callable[[Any], Any],
                 modules: bool = False):
        self._f = io.BytesIO(data)
        #: read modules pickled whole as data (:class:`ClassRef`, :class:`Instance`)
        self.modules = modules
        #: the instances made, in file order (bounded by the pickle's size)
        self.instances = 0
        self._persistent_load = persistent_load
        self._stack: list[Any] = []
        self._marks: list[list[Any]] = []
        self._memo: dict[int, Any] = {}

    def _read(self, n: int) -> bytes:
        b = self._f.read(n)
        if len(b) != n:
            raise Refused("pickle ends early")
        return b

    def _pop(self) -> Any:
        if not self._stack:
            raise Refused("pickle stack underflow")
        return self._stack.pop()

    def _top(self) -> Any:
        if not self._stack:
            raise Refused("pickle stack underflow")
        return self._stack[-1]

    def _pop_mark(self) -> list[Any]:
        if not self._marks:
            raise Refused("pickle has no MARK to pop")
        items, self._stack = self._stack, self._marks.pop()
        return items

    def _push(self, value: Any) -> None:
        self._stack.append(value)

    def load(self) -> Any:
        read, push = self._read, self._push
        while True:
            op = read(1)[0]
            handler = _OPS.get(op) or (_MODULE_OPS.get(op) if self.modules else None)
            if handler is None:
                raise Unsupported(f"pickle opcode {op:#04x}")
            if op == 0x2E:  # STOP
                return self._pop()
            handler(self, read, push)


def _global(m: _Machine, read: Any, push: Any) -> None:
    module = m._f.readline()
    name = m._f.readline()
    if not module.endswith(b"\n") or not name.endswith(b"\n"):
        raise Refused("pickle ends inside a GLOBAL")
    key = (module[:-1].decode("utf-8", "replace"), name[:-1].decode("utf-8", "replace"))
    if key in _CALLABLES:
        push(_CALLABLES[key])
    elif key[0] == "torch" and key[1] in STORAGE_DTYPES:
        push(_StorageType(STORAGE_DTYPES[key[1]]))
    elif m.modules:
        push(ClassRef(*key))  # a name, never imported
    else:
        raise Unsupported(f"{key[0]}.{key[1]}")


def _reduce(m: _Machine, read: Any, push: Any) -> None:
    args = m._pop()
    func = m._top()
    if isinstance(func, ClassRef):
        m._stack[-1] = _construct(m, func, args, "REDUCE")
        return
    if func not in _CALLABLES.values() or type(args) is not tuple:
        raise Unsupported("REDUCE on something other than a known rebuild function")
    try:
        m._stack[-1] = func(*args)
    except TypeError:  # wrong number of arguments: torch's call fails the same way
        raise Refused("a rebuild function called with the wrong arguments") from None


def _build(m: _Machine, read: Any, push: Any) -> None:
    state = m._pop()
    inst = m._top()
    if isinstance(inst, np.dtype) and m.modules:
        # numpy's dtype state: (version, byte order, ...); only this machine's order is
        # taken (a big-endian number would need the dtype replaced under its memo entry)
        if type(state) is not tuple or len(state) < 2 or state[1] not in ("<", "|", "="):
            raise CodeRefused(f"BUILD of numpy dtype {inst} with state {state!r:.60}")
        return
    if isinstance(inst, Instance):
        if type(state) is not dict or inst.state is not None:
            raise CodeRefused(f"BUILD on {inst.cls} with a {type(state).__name__} state "
                              "(only a plain dict, once, is kept as data)")
        inst.state = state
        return
    # torch sets a plain OrderedDict's attributes (a state dict's _metadata); they carry
    # nothing we read, so they are checked and dropped. Anything else is torch's call.
    if type(inst) is not collections.OrderedDict or type(state) is not dict:
        raise Unsupported("BUILD on something other than an OrderedDict")


def _setitems(m: _Machine, items: list[Any]) -> None:
    target = m._top()
    if type(target) not in (dict, collections.OrderedDict):
        raise Refused(f"SETITEM on a {type(target).__name__}")
    if len(items) % 2:
        raise Refused("odd number of items for SETITEMS")
    for k, v in zip(items[::2], items[1::2]):
        try:
            target[k] = v
        except TypeError:
            raise Refused("unhashable dict key in pickle") from None


def _appends(m: _Machine, items: list[Any]) -> None:
    target = m._top()
    if type(target) is not list:
        raise Refused(f"APPEND on a {type(target).__name__}")
    target.extend(items)


def _persid(m: _Machine, read: Any, push: Any) -> None:
    push(m._persistent_load(m._pop()))


def _get(m: _Machine, idx: int, push: Any) -> None:
    if idx not in m._memo:
        raise Refused(f"pickle memo {idx} read before it was written")
    push(m._memo[idx])


def _put(m: _Machine, idx: int) -> None:
    m._memo[idx] = m._top()


def _tuple(m: _Machine, n: int) -> None:
    if len(m._stack) < n:
        raise Refused("pickle stack underflow")
    items = tuple(m._stack[len(m._stack) - n:])
    del m._stack[len(m._stack) - n:]
    m._push(items)


def _mark(m: _Machine, read: Any, push: Any) -> None:
    m._marks.append(m._stack)
    m._stack = []


def _string(m: _Machine, data: bytes, encoding: str) -> None:
    try:
        m._push(data.decode(encoding, "surrogatepass" if encoding == "utf-8" else "strict"))
    except UnicodeDecodeError:
        raise Refused("undecodable string in pickle") from None


def _as_set(items: Any = ()) -> set:
    if type(items) not in (list, tuple, set, frozenset):
        raise CodeRefused("set() of something other than a list or tuple")
    try:
        return set(items)
    except TypeError:
        raise Refused("unhashable set item in pickle") from None


def _as_size(dims: Any = ()) -> tuple:
    if type(dims) is not tuple or not all(_is_int(d) for d in dims):
        raise CodeRefused("torch.Size of something other than a tuple of ints")
    return dims


#: numeric numpy kinds a scalar may hold: bool, ints, floats, complex (never objects)
_NUMPY_KINDS = "biufc"


def _numpy_dtype(name: Any = None, align: Any = False, copy: Any = True) -> np.dtype:
    """``numpy.dtype('f8', False, True)``, as numpy pickles a dtype: numeric kinds only."""
    if type(name) is not str or type(align) is not bool or type(copy) is not bool:
        raise CodeRefused("numpy.dtype of something other than a name")
    try:
        dtype = np.dtype(name)
    except TypeError:
        raise Refused(f"numpy dtype {name!r} is not one numpy knows") from None
    if dtype.kind not in _NUMPY_KINDS or dtype.fields is not None or dtype.shape:
        raise CodeRefused(f"numpy dtype {name!r} is not a plain number")
    return dtype


def _numpy_scalar(dtype: Any = None, data: Any = None) -> Any:
    """``numpy.core.multiarray.scalar(dtype, bytes)``: one number read from its bytes
    (older ultralytics files keep their metrics as numpy floats)."""
    if not isinstance(dtype, np.dtype) or type(data) is not bytes:
        raise CodeRefused("numpy scalar of something other than a dtype and its bytes")
    if len(data) != dtype.itemsize:
        raise Refused(f"numpy {dtype} scalar of {len(data)} bytes")
    return np.frombuffer(data, dtype, count=1)[0]


def _latin1(text: Any = None, encoding: Any = None) -> bytes:
    """``_codecs.encode(text, 'latin1')``: how pickle protocol 2 writes ``bytes``."""
    if type(text) is not str or encoding not in ("latin1", "latin-1"):
        raise CodeRefused("_codecs.encode of something other than latin-1 text")
    try:
        return text.encode("latin1")
    except UnicodeEncodeError:
        raise Refused("_codecs.encode of text that is not latin-1") from None


@dataclass(frozen=True)
class NamedValue:
    """A member of an enumeration the file names by its value (``SchedulerType('cosine')``,
    ``torch.device('cpu')``), never looked up: the class's name and the value, as data."""

    cls: ClassRef
    value: str | tuple[str, int]

    def __str__(self) -> str:
        return self.value if isinstance(self.value, str) else ":".join(map(str, self.value))


#: enumerations a Trainer's ``training_args.bin`` names members of by value
_NAMED_VALUE_CLASSES = frozenset({
    ("transformers.trainer_utils", "SchedulerType"),
    ("transformers.trainer_utils", "IntervalStrategy"),
    ("transformers.trainer_utils", "SaveStrategy"),
    ("transformers.trainer_utils", "HubStrategy"),
    ("transformers.training_args", "OptimizerNames"),
    ("accelerate.utils.dataclasses", "DistributedType"),
    ("torch", "device"),
})


def _named_value(module: str, name: str) -> Callable[..., NamedValue]:
    def build(value: Any = None, index: Any = None) -> NamedValue:
        if type(value) is not str or len(value) > 256 or not (
                index is None or (type(index) is int and 0 <= index < 1 << 16)):
            raise CodeRefused(f"{module}.{name} called with something other than a name")
        return NamedValue(ClassRef(module, name), value if index is None else (value, index))
    return build


#: what a whole-module pickle may build with arguments, computed here as data (each
#: returns plain data; none calls anything the file names)
_DATA_BUILDERS: dict[tuple[str, str], Callable[..., Any]] = {
    **{key: _named_value(*key) for key in _NAMED_VALUE_CLASSES},
    ("builtins", "set"): _as_set, ("__builtin__", "set"): _as_set,
    ("builtins", "frozenset"): lambda items=(): frozenset(_as_set(items)),
    ("__builtin__", "frozenset"): lambda items=(): frozenset(_as_set(items)),
    ("torch", "Size"): _as_size,
    ("numpy", "dtype"): _numpy_dtype,
    ("numpy.core.multiarray", "scalar"): _numpy_scalar,
    ("numpy._core.multiarray", "scalar"): _numpy_scalar,
    ("_codecs", "encode"): _latin1,
}
#: instances one pickle may make (each at least 4 bytes of pickle: bounded anyway)
MAX_INSTANCES = 1 << 20


def _construct(m: _Machine, cls: ClassRef, args: Any, op: str) -> Any:
    """``cls(*args)`` as data: a known data builder's value, or an :class:`Instance` when
    there are no arguments; anything else would run code and is refused."""
    builder = _DATA_BUILDERS.get((cls.module, cls.name))
    if type(args) is not tuple:
        raise CodeRefused(f"{op} of {cls} with arguments that are not a tuple")
    if builder is not None:
        try:
            return builder(*args)
        except TypeError:
            raise Refused(f"{cls} called with the wrong arguments") from None
    if args:
        raise CodeRefused(f"{op} calls {cls} with arguments: code, not data")
    m.instances += 1
    if m.instances > MAX_INSTANCES:
        raise Refused(f"more than {MAX_INSTANCES} objects in one pickle")
    return Instance(cls)


def _newobj(m: _Machine, read: Any, push: Any) -> None:
    args = m._pop()
    cls = m._pop()
    if not isinstance(cls, ClassRef):
        raise CodeRefused("NEWOBJ of something other than a named class")
    push(_construct(m, cls, args, "NEWOBJ"))


#: opcodes only the whole-module pass reads (torch's weights-only unpickler has NEWOBJ for
#: its allowed classes; the first pass leaves those files to torch)
_MODULE_OPS: dict[int, Callable[[_Machine, Any, Any], None]] = {0x81: _newobj}

_OPS: dict[int, Callable[[_Machine, Any, Any], None]] = {
    0x80: lambda m, read, push: read(1),  # PROTO: torch accepts any protocol number
    0x2E: lambda m, read, push: None,  # STOP, handled in load()
    0x63: _global,  # GLOBAL
    0x52: _reduce,  # REDUCE
    0x62: _build,  # BUILD
    0x51: _persid,  # BINPERSID
    0x61: lambda m, read, push: _appends(m, [m._pop()]),  # APPEND
    0x65: lambda m, read, push: _appends(m, m._pop_mark()),  # APPENDS
    0x73: lambda m, read, push: _setitems(m, list(reversed([m._pop(), m._pop()]))),
    0x75: lambda m, read, push: _setitems(m, m._pop_mark()),  # SETITEMS
    0x28: _mark,  # MARK
    0x74: lambda m, read, push: m._push(tuple(m._pop_mark())),  # TUPLE
    0x85: lambda m, read, push: _tuple(m, 1),
    0x86: lambda m, read, push: _tuple(m, 2),
    0x87: lambda m, read, push: _tuple(m, 3),
    0x4E: lambda m, read, push: push(None),
    0x89: lambda m, read, push: push(False),
    0x88: lambda m, read, push: push(True),
    0x29: lambda m, read, push: push(()),
    0x5D: lambda m, read, push: push([]),
    0x7D: lambda m, read, push: push({}),
    0x8F: lambda m, read, push: push(set()),
    0x4A: lambda m, read, push: push(struct.unpack("<i", read(4))[0]),  # BININT
    0x4B: lambda m, read, push: push(read(1)[0]),  # BININT1
    0x4D: lambda m, read, push: push(struct.unpack("<H", read(2))[0]),  # BININT2
    0x47: lambda m, read, push: push(struct.unpack(">d", read(8))[0]),  # BINFLOAT
    0x58: lambda m, read, push: _string(m, read(struct.unpack("<I", read(4))[0]), "utf-8"),
    0x55: lambda m, read, push: _string(m, read(read(1)[0]), "ascii"),  # SHORT_BINSTRING
    0x68: lambda m, read, push: _get(m, read(1)[0], push),  # BINGET
    0x6A: lambda m, read, push: _get(m, struct.unpack("<I", read(4))[0], push),
    0x71: lambda m, read, push: _put(m, read(1)[0]),  # BINPUT
    0x72: lambda m, read, push: _put(m, struct.unpack("<I", read(4))[0]),  # LONG_BINPUT
    0x8A: lambda m, read, push: push(int.from_bytes(read(read(1)[0]), "little", signed=True)),
}


def _data_offset(f: Any, info: zipfile.ZipInfo) -> int:
    """Where a stored member's bytes start: after its local header, name and extra field."""
    f.seek(info.header_offset)
    header = f.read(30)
    if len(header) != 30 or header[:4] != b"PK\x03\x04":
        raise Refused(f"bad local header for {info.filename!r}")
    name_len, extra_len = struct.unpack("<HH", header[26:30])
    return info.header_offset + 30 + name_len + extra_len


def compressed_members(infos: list[zipfile.ZipInfo]) -> list[str]:
    """Members that are not stored as-is (torch.save writes none)."""
    return [i.filename for i in infos if i.compress_type != zipfile.ZIP_STORED]


def oversized_members(infos: list[zipfile.ZipInfo], size: int) -> list[str]:
    """Stored members whose directory entry claims bytes the archive of ``size`` bytes
    does not hold, or a stored size other than their own: ``zipfile`` sizes its first
    read by the claim (a 2 KiB file claiming 2.4 GB asked for 2.4 GB at once)."""
    return [i.filename for i in infos
            if i.compress_size != i.file_size or i.header_offset + i.compress_size > size]


def load(path: str | Path, *, modules: bool = False) -> Any:
    """Read a torch zip checkpoint into plain containers of :class:`LazyTensor`.

    ``modules``: the whole-module pass (the module docstring): class globals become
    :class:`ClassRef`, their objects :class:`Instance`; a call with arguments raises
    :class:`CodeRefused`. Nothing is imported or called either way.

    Raises:
        Unsupported: the file needs torch itself (a global outside the list above, an
            untyped storage, big-endian data...); let ``torch.load(weights_only=True)``
            decide.
        Refused, zipfile.BadZipFile: the file is damaged or inconsistent.
    """
    path = str(path)
    with zipfile.ZipFile(path) as zf, open(path, "rb") as f:
        infos = zf.infolist()
        if not infos:
            raise Refused("empty zip archive")
        # torch takes the archive's root folder from its first member
        root = infos[0].filename.split("/", 1)[0] + "/"
        members = {i.filename: i for i in infos}
        pkl = members.get(f"{root}data.pkl")
        if pkl is None or "/" not in infos[0].filename:
            raise Unsupported("no <root>/data.pkl (not a torch.save archive)")
        if f"{root}version" not in members and f"{root}.data/version" not in members:
            raise Unsupported("no version record")
        bad = compressed_members(infos)
        if bad:
            raise Refused(f"member {bad[0]!r} is compressed; torch.save writes none")
        order = members.get(f"{root}byteorder")
        if order is not None and zf.read(order) != b"little":
            raise Unsupported("byte order other than little-endian")
        if pkl.file_size > MAX_PICKLE_BYTES:
            raise Refused(f"data.pkl is {pkl.file_size} bytes (at most {MAX_PICKLE_BYTES})")
        end = os.fstat(f.fileno()).st_size
        loaded: dict[str, _Storage] = {}

        def storage(pid: Any) -> _Storage:
            if type(pid) is not tuple or len(pid) != 5 or pid[0] != "storage":
                raise Unsupported("persistent id other than a storage")
            _, stype, key, location, numel = pid
            if (not isinstance(stype, _StorageType) or type(key) is not str
                    or type(location) is not str or not _is_int(numel) or numel < 0):
                raise Unsupported("unusual storage reference")
            if key in loaded:  # torch reuses the first storage loaded under a key
                return loaded[key]
            info = members.get(f"{root}data/{key}")
            if info is None:
                raise Refused(f"storage {key!r} is missing from the archive")
            nbytes = numel * numpy_dtype(stype.dtype).itemsize
            if nbytes != info.file_size:  # torch requires the exact size too
                raise Refused(f"storage {key!r} declares {nbytes} bytes; its record holds "
                              f"{info.file_size}")
            offset = _data_offset(f, info)
            if offset + info.file_size > end:
                raise Refused(f"storage {key!r} extends past the end of the file")
            loaded[key] = _Storage(path, key, stype.dtype, offset, nbytes)
            return loaded[key]

        # the machine is iterative: deep nesting costs no recursion here (the tree walk
        # in sources bounds the depth)
        return _Machine(zf.read(pkl), storage, modules).load()
