"""What ``ms-port verify`` feeds both networks: arrays read from a file, or drawn, seeded.

Files are untrusted and nothing in them runs. Each ``.npy`` header (alone, or inside a
``.npz``) is checked before its data is read (real numeric dtype, a batch axis, at most
:data:`MAX_INPUT_BYTES`, no more than the file holds) and read with ``allow_pickle=False``;
``.safetensors``/``.pt``/``.pth`` go through :func:`~ms_port.read.sources.read_source`,
whose unpickler is no wider than ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import re
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np

from ..errors import MsPortError
from ..read.sources import read_source
from ..read.tensors import FLOAT_DTYPES, MAX_DIM, MAX_RANK, NUMPY_DTYPES, dtype_name

#: the largest input fed, all arrays together; and the most arrays one file may hold
MAX_INPUT_BYTES, MAX_INPUTS = 4 << 30, 256
SUPPORTED_SUFFIXES = (".npy", ".npz", ".safetensors", ".pt", ".pth")
#: added to the seed by :func:`second_draw`: far from any seed a user would pick next
SECOND_SEED_OFFSET = 1_000_003
#: real dtypes only: no network here takes complex inputs
INPUT_DTYPES = tuple(n for n in NUMPY_DTYPES if not n.startswith("complex"))


class InputError(MsPortError):
    """An input file or input option is unusable; the message names it and the fix."""

    exit_code = 2


@dataclass(frozen=True, eq=False)
class InputArray:
    """One array fed to both networks, and where it came from.

    Attributes:
        name: ``input0``, ``input1``… or the array's name in the file.
        array: the data, batch axis first.
        origin: ``file x.npz:ids``, ``generated normal(seed=0)``,
            ``generated integers [0, 32000) seed=0``…
        kind: how :func:`second_draw` makes another sample: ``file``, ``normal``,
            ``uniform`` or ``integers``; params: the ``(low, high)`` of a drawn range.
    """

    name: str
    array: np.ndarray
    origin: str
    kind: str = field(default="file", repr=False)
    params: tuple[float, ...] = field(default=(), repr=False)

    def describe(self) -> str:
        """One line: ``input0 float32 [2, 3, 224, 224] from x.npz:arr_0``."""
        where = "from " + self.origin[5:] if self.origin.startswith("file ") else self.origin
        return f"{self.name} {dtype_name(self.array.dtype)} {list(self.array.shape)} {where}"

    def to_dict(self) -> dict:
        return {"name": self.name, "dtype": dtype_name(self.array.dtype),
                "shape": list(self.array.shape), "origin": self.origin, "kind": self.kind}


def parse_shape(text: str) -> tuple[int, ...]:
    """One sample's shape, without the batch axis: ``3,224,224``, ``3x224x224`` or ``3×224``.

    Args:
        text: the ``--input-shape`` value.

    Returns:
        Positive sizes: ``parse_shape("3x224x224") == (3, 224, 224)``.
    """
    parts = re.split(r"[,x×]", text.strip().strip("()[]").replace(" ", ""))
    if len(parts) > MAX_RANK or not all(p.isascii() and p.isdigit() for p in parts):
        raise InputError(f"--input-shape {text!r} is not a shape; write one sample's size "
                         "without the batch axis, e.g. 3,224,224 or 3x224x224")
    if not all(0 < int(p) < MAX_DIM for p in parts):
        raise InputError(f"--input-shape {text!r}: every size must be at least 1")
    return tuple(int(p) for p in parts)


def parse_range(text: str) -> tuple[float, float]:
    """``LOW,HIGH`` with ``low < high``; whole numbers come back as ints.

    Args:
        text: the ``--input-range`` value.

    Returns:
        ``(low, high)``, drawn values lie in ``[low, high)``: ``parse_range("0,32000") ==
        (0, 32000)``.
    """
    try:
        values = [float(p) for p in text.split(",")]
    except ValueError:
        values = []
    if len(values) != 2 or not np.isfinite(values).all():
        raise InputError(f"--input-range {text!r} is not LOW,HIGH; write two finite numbers, "
                         "e.g. 0,32000 for token ids or -1,1")
    low, high = (int(v) if v.is_integer() else v for v in values)
    if not low < high:
        raise InputError(f"--input-range {text!r}: LOW must be below HIGH (values are drawn "
                         "in [LOW, HIGH))")
    return low, high


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def _per_input(values: Sequence, n: int, option: str) -> list:
    if len(values) not in (1, n):
        raise InputError(f"{n} input shapes but {len(values)} {option} values; give one "
                         "(for every input) or one per shape, in the same order")
    return list(values) * n if len(values) == 1 else list(values)


def _draw(rng: np.random.Generator, name: str, shape: tuple[int, ...], dtype: str,
          bounds: tuple[float, float] | None, seed: int) -> InputArray:
    """One input from ``rng``: normal or uniform floats, or uniform integers."""
    dt = NUMPY_DTYPES[dtype]
    if dtype in FLOAT_DTYPES and bounds is None:
        return InputArray(name, rng.standard_normal(shape).astype(dt),
                          f"generated normal(seed={seed})", "normal")
    if bounds is None and dtype != "bool":
        raise InputError(f"{name} is {dtype}: --input-range LOW,HIGH is needed for integer "
                         "inputs, e.g. token ids 0,VOCAB")
    low, high = bounds or (0, 2)
    span = f"[{_num(low)}, {_num(high)}) seed={seed}"
    if dtype in FLOAT_DTYPES:
        return InputArray(name, rng.uniform(low, high, shape).astype(dt),
                          f"generated uniform {span}", "uniform", (low, high))
    lo, top = (0, 2) if dtype == "bool" else (np.iinfo(dt).min, np.iinfo(dt).max + 1)
    if not (float(low).is_integer() and float(high).is_integer() and lo <= low < high <= top):
        raise InputError(f"{name} is {dtype}: its range [{_num(low)}, {_num(high)}) must be "
                         f"whole numbers within [{lo}, {top}); fix --input-range or choose "
                         "a wider --input-dtype")
    return InputArray(name, rng.integers(int(low), int(high), shape, dtype=dt),
                      f"generated integers {span}", "integers", (low, high))


def generate_inputs(
    shapes: Sequence[tuple[int, ...]],
    *,
    batch: int = 1,
    seed: int = 0,
    dtypes: Sequence[str] = ("float32",),
    ranges: Sequence[tuple[float, float] | None] = (None,),
) -> list[InputArray]:
    """Draw one input per shape, in order, all from one ``numpy.random.default_rng(seed)``.

    Floats are standard normal (range ``None``) or uniform in ``[low, high)``; integers and
    bool uniform in ``[low, high)`` (bool defaults to ``[0, 2)``). A first float32 input
    equals ``default_rng(seed).standard_normal((batch, *shape)).astype(np.float32)``, the
    draw ms-port always made; later inputs depend on the sizes drawn before them.

    Args:
        shapes: one sample's shape per input, without the batch axis.
        batch: the batch size put in front of every shape.
        seed: the generator's seed.
        dtypes: one dtype for all inputs, or one per input.
        ranges: one range (or ``None``) for all inputs, or one per input.

    Returns:
        The inputs, named ``input0``, ``input1``…

    Example:
        >>> generate_inputs([(3, 8, 8)], batch=2)[0].describe()
        'input0 float32 [2, 3, 8, 8] generated normal(seed=0)'
    """
    if not shapes:
        raise InputError("no input shape given; pass --input-shape (e.g. 3,224,224) or --input")
    if type(batch) is not int or type(seed) is not int or batch < 1 or seed < 0:
        raise InputError(f"batch must be a whole number >= 1 and seed one >= 0; got "
                         f"batch={batch!r}, seed={seed!r}")
    dts = _per_input(dtypes, len(shapes), "--input-dtype")
    bounds = _per_input(ranges, len(shapes), "--input-range")
    unknown = [d for d in dts if d not in INPUT_DTYPES]
    if unknown:
        raise InputError(f"unknown --input-dtype {unknown[0]!r}; known: {', '.join(INPUT_DTYPES)}")
    full = [(batch, *map(int, s)) for s in shapes]
    total = sum(int(np.prod(s, dtype=object)) * NUMPY_DTYPES[d].itemsize
                for s, d in zip(full, dts))
    if total > MAX_INPUT_BYTES:
        raise InputError(f"the inputs would take {total} bytes (at most {MAX_INPUT_BYTES}); "
                         "lower --batch or --input-shape")
    rng = np.random.default_rng(seed)
    return [_draw(rng, f"input{i}", s, d, r, seed)
            for i, (s, d, r) in enumerate(zip(full, dts, bounds))]


def _another_sample(inp: InputArray, rng: np.random.Generator, seed: int) -> InputArray:
    """A different sample like a file's array (see :func:`second_draw`)."""
    a, src = inp.array, inp.origin.removeprefix("file ")
    if dtype_name(a.dtype) not in FLOAT_DTYPES:
        low, high = a.min(), a.max()
        return InputArray(inp.name, rng.integers(low, high, a.shape, a.dtype, endpoint=True),
                          f"integers [{_num(low)}, {_num(high)}] like {src}, seed={seed}")
    rolled = np.roll(a, 1, axis=0)
    if a.shape[0] >= 2 and not np.array_equal(rolled, a, equal_nan=True):
        return InputArray(inp.name, rolled, f"{src} rolled by one sample")
    finite = a[np.isfinite(a)].astype(np.float64)
    mean, std = (float(finite.mean()), float(finite.std())) if finite.size else (0.0, 0.0)
    std = std if std > 0 else 1.0
    return InputArray(inp.name, (mean + std * rng.standard_normal(a.shape)).astype(a.dtype),
                      f"normal(mean={mean:.4g}, std={std:.4g}) like {src}, seed={seed}")


def second_draw(inputs: list[InputArray], *, seed: int) -> list[InputArray]:
    """Another input of the same kind, to measure how much the output depends on the input.

    Every input takes its turn, in order, at one ``default_rng(seed + SECOND_SEED_OFFSET)``.
    Drawn inputs are drawn again with the same shapes, dtypes and ranges. A file's float
    batch of 2+ samples that differ is rolled by one sample (real samples stay real); other
    file floats become normal noise with the array's mean and std (std 1 for a constant
    array); file integers and bool are drawn uniformly in the array's ``[min, max]`` (token
    ids stay valid ids), so a constant integer array comes back equal.

    Args:
        inputs: what :func:`load_inputs` or :func:`generate_inputs` returned.
        seed: the seed the first inputs were made with.

    Returns:
        New inputs with the same names, shapes and dtypes.
    """
    seed += SECOND_SEED_OFFSET
    rng = np.random.default_rng(seed)
    return [_another_sample(x, rng, seed) if x.kind == "file" else
            _draw(rng, x.name, x.array.shape, dtype_name(x.array.dtype), x.params or None, seed)
            for x in inputs]


def _checked(where: str, shape: tuple[int, ...], dtype: np.dtype, room: int) -> np.dtype:
    """The native dtype of a declared array, after refusing what cannot be an input."""
    if dtype.hasobject:
        raise InputError(f"{where} holds an object array, which would need unpickling; "
                         "save numeric arrays only (np.savez(path, ids=ids))")
    native = dtype.newbyteorder("=") if dtype.byteorder in "<>" else dtype
    if not any(native == NUMPY_DTYPES[n] for n in INPUT_DTYPES):
        raise InputError(f"{where} has dtype {dtype}; save a real numeric array "
                         f"({', '.join(INPUT_DTYPES)})")
    if not shape or shape[0] == 0:
        raise InputError(f"{where} is a scalar; an input needs a batch axis (save x[None])"
                         if not shape else f"{where} has an empty batch axis ({list(shape)})")
    nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if nbytes > min(MAX_INPUT_BYTES, room):
        raise InputError(f"{where} declares shape {list(shape)} ({nbytes} bytes), more than "
                         f"the file holds or {MAX_INPUT_BYTES} bytes; it is truncated, "
                         "corrupt or too large — save a smaller sample")
    return native


def _read_numpy(path: Path) -> list[tuple[str | None, str, np.ndarray]]:
    """``.npy`` or ``.npz``: every header checked before any data is read."""
    try:
        if path.suffix.lower() == ".npy":
            members = [(None, str(path), partial(open, path, "rb"), path.stat().st_size)]
            return _read_members(members, path)
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
            names = [i.filename.removesuffix(".npy") for i in infos]
            if len(set(names)) != len(names) or len(names) > MAX_INPUTS or \
                    not all(i.filename.endswith(".npy") for i in infos):
                raise InputError(f"{path}: not an np.savez archive (repeated names, members "
                                 f"other than .npy, or over {MAX_INPUTS} arrays); re-save it")
            positional = sorted(names) == sorted(f"arr_{i}" for i in range(len(names)))
            order = sorted(range(len(names)), key=lambda i: int(names[i][4:])) \
                if positional else range(len(names))
            return _read_members([(None if positional else names[i], f"{path}:{names[i]}",
                                   lambda i=i: zf.open(infos[i]), infos[i].file_size)
                                  for i in order], path)
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError, NotImplementedError,
            ValueError) as exc:
        raise InputError(f"{path}: cannot read it ({type(exc).__name__}: {exc}); it is "
                         "truncated or corrupt — re-save it with np.save / np.savez") from None


def _read_members(members: list, path: Path) -> list[tuple[str | None, str, np.ndarray]]:
    fmt, checked = np.lib.format, []
    for name, where, open_, size in members:
        with open_() as fp:
            try:
                header = fmt.read_array_header_1_0 if fmt.read_magic(fp) == (1, 0) \
                    else fmt.read_array_header_2_0
                shape, _, dtype = header(fp)
            except Exception as exc:  # numpy parsing untrusted bytes: any failure is corrupt
                raise InputError(f"{where}: not a valid .npy array ({type(exc).__name__}: "
                                 f"{exc}); re-save it with np.save / np.savez") from None
            checked.append((name, where, open_, _checked(where, shape, dtype, size - fp.tell()),
                            int(np.prod(shape)) * dtype.itemsize))
    if sum(c[-1] for c in checked) > MAX_INPUT_BYTES:
        raise InputError(f"{path}: its arrays exceed {MAX_INPUT_BYTES} bytes together; "
                         "save a smaller sample")
    out = []
    for name, where, open_, native, _ in checked:
        with open_() as fp:
            out.append((name, where, fmt.read_array(fp, allow_pickle=False).astype(native,
                                                                              copy=False)))
    return out


def _read_tensors(path: Path) -> list[tuple[str | None, str, np.ndarray]]:
    """``.safetensors``/``.pt``/``.pth`` through ms-port's own safe reader."""
    source = read_source(path, strip_prefixes=False)
    if source.skipped:
        s = source.skipped[0]
        raise InputError(f"{path} holds {s.name!r} ({s.kind}: {s.reason}); save only the "
                         "input tensors, e.g. torch.save({'x': x, 'ids': ids}, path)")
    if len(source) > MAX_INPUTS or sum(t.nbytes for t in source) > MAX_INPUT_BYTES:
        raise InputError(f"{path}: more than {MAX_INPUTS} arrays or {MAX_INPUT_BYTES} bytes; "
                         "save a smaller sample")
    where = {t.name: f"{path}:{t.name}" for t in source}
    for t in source:
        _checked(where[t.name], t.shape, NUMPY_DTYPES[t.dtype], t.nbytes)
    return [(t.name, where[t.name], np.array(t.load(), copy=True)) for t in source]


def load_inputs(path: str | Path) -> list[InputArray]:
    """Read the inputs saved in ``path``, one array per positional input.

    A file holds one array per positional input, batch axis first, in this order:
    ``.npz`` as ``arr_0, arr_1, …`` in numeric order when those are all its names
    (``np.savez(p, x, y)``), else the archive's order; ``.pt``/``.pth`` the saved dict's
    order; ``.safetensors`` name order (the format keeps no other).

    Args:
        path: a ``.npy`` (one input), ``.npz``, ``.safetensors``, ``.pt`` or ``.pth`` file.

    Returns:
        The inputs, named as in the file (``input0``… for ``.npy`` and ``arr_N`` names).

    Example:
        >>> np.savez("x.npz", np.zeros((1, 3), np.float32))
        >>> load_inputs("x.npz")[0].describe()
        'input0 float32 [1, 3] from x.npz:arr_0'
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in SUPPORTED_SUFFIXES:
        raise InputError(f"{path}: unsupported input file; use one of "
                         f"{', '.join(SUPPORTED_SUFFIXES)}")
    if not path.is_file():
        raise InputError(f"{path}: no such file; check the --input path")
    arrays = _read_numpy(path) if suffix in (".npy", ".npz") else _read_tensors(path)
    if not arrays:
        raise InputError(f"{path} holds no arrays; save one array per positional input")
    return [InputArray(name or f"input{i}", arr, f"file {where}")
            for i, (name, where, arr) in enumerate(arrays)]
