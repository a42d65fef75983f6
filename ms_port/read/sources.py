"""Read checkpoints into a :class:`Source`: names, shapes and dtypes now, data on demand.

Formats are recognised by their first bytes, not their extension:

- PyTorch zip (``torch.save`` since 1.6: ``.pth``, ``.pt``, ``.bin``) — read by
  :mod:`ms_port.read.torchzip`, an unpickler no wider than ``weights_only=True`` that
  reads each tensor with pread when asked for; what it cannot read goes to
  ``torch.load(weights_only=True, mmap=False)`` behind the checks of
  :mod:`ms_port.read.torchguard`;
- PyTorch legacy pickle — ``weights_only=True`` (legacy files cannot be memory-mapped);
- safetensors, single files and sharded sets (``*.safetensors.index.json``) — without
  importing torch or MindSpore; sharded PyTorch sets (``pytorch_model.bin.index.json``)
  the same way, shard by shard;
- MindSpore ``.ckpt`` — walked in place by :mod:`ms_port.read.ckpt`.

Pickles never execute code: ``weights_only`` refuses anything but tensors and plain
containers, and the refusal becomes :class:`~ms_port.errors.UnsafePickleError`. The
only way around it is the explicit ``unsafe_pickle=True`` for files the user trusts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import stat
import sys
import warnings
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import SourceError, UnsafePickleError, shown
from ..text import visible
from .modules import ModuleRead, holds_modules, live_modules, read_modules
from .tensors import (
    MAX_DIM,
    MAX_INDEX_BYTES,
    MAX_RANK,
    PACKED_DTYPES,
    Skipped,
    Source,
    TensorInfo,
    numpy_dtype,
)

if TYPE_CHECKING:
    pass

#: container keys unwrapped, most specific first (timm, Lightning, DeiT, MMEngine...)
CONTAINER_KEYS = (
    "state_dict", "model_state_dict", "model", "module", "net", "network",
    "ema", "state_dict_ema", "model_ema", "params", "weights",
)
#: wrapper prefixes stripped when every tensor name carries them (DDP, torch.compile)
WRAPPER_PREFIXES = ("module.", "_orig_mod.")

#: the formats that hold MindSpore's names: a ``.ckpt``, and a distributed training output
MINDSPORE_FORMATS = frozenset({"mindspore-ckpt", "mindspore-distributed"})

SAFETENSORS_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8",
    "U64": "uint64", "U32": "uint32", "U16": "uint16", "U8": "uint8", "BOOL": "bool",
    "C64": "complex64",
}
#: safetensors dtypes MindSpore cannot hold: listed and loaded as stored, never written
#: (``SAFETENSORS_DTYPES`` are what ms-port writes); float8 weights with block scales are
#: dequantized to bfloat16 (:mod:`ms_port.read.fp8`)
SAFETENSORS_STORED_DTYPES = {
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz", "F8_E8M0": "float8_e8m0fnu",
    "F4": "float4_e2m1fn", "F6_E2M3": "float6_e2m3fn", "F6_E3M2": "float6_e3m2fn",
}


# -- format detection ---------------------------------------------------------------


#: what a Hugging Face model directory holds its weights in, most preferred first
HF_WEIGHTS = ("model.safetensors", "model.safetensors.index.json",  # transformers' order
              "pytorch_model.bin", "pytorch_model.bin.index.json",
              "param_name_map.json")  # the last: MindSpore shards (ms-port --max-shard-size)
#: the largest config.json read
MAX_CONFIG_BYTES = 4 << 20


def resolve_directory(path: Path) -> Path:
    """The weights file of a Hugging Face model directory (see :data:`HF_WEIGHTS`)."""
    for name in HF_WEIGHTS:
        if (path / name).is_file():
            return path / name
    raise SourceError(f"{path} is a directory without model weights (none of "
                      f"{', '.join(HF_WEIGHTS)}); pass a checkpoint file or a Hugging Face "
                      "model directory", path=path)


def read_config(path: str | Path) -> dict[str, Any]:
    """A ``config.json``: a JSON object of at most :data:`MAX_CONFIG_BYTES`."""
    path = Path(path)
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            raise SourceError(f"{path} is not a regular file; a config.json is a JSON file",
                              path=path)
        with open(path, "rb") as f:  # bounded: st_size may lie (a file still growing)
            raw = f.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise SourceError(f"{path}: more than {MAX_CONFIG_BYTES} bytes is too large for a "
                              "config.json; refused", path=path)
        data = json.loads(raw.decode("utf-8"))
    except OSError as exc:
        raise SourceError(f"{path}: cannot read config ({exc.strerror})", path=path) from None
    except (ValueError, RecursionError, UnicodeDecodeError) as exc:
        raise SourceError(f"{path}: not a JSON config ({str(exc)[:80]}); fix or re-download "
                          "it", path=path) from None
    if not isinstance(data, dict):
        raise SourceError(f"{path}: a config.json holds a JSON object, this holds a "
                          f"{type(data).__name__}", path=path)
    return data


def _find_config(path: Path) -> Path | None:
    candidate = path.parent / "config.json"
    return candidate if candidate.exists() else None  # read_config refuses a non-file


def _check_file(path: Path) -> None:
    if not path.exists():
        raise SourceError(f"{path}: no such file; check the path", path=path)
    if path.is_dir():
        raise SourceError(
            f"{path} is a directory; pass a checkpoint file (or the *.index.json "
            "for a sharded set, or a Hugging Face model directory)", path=path)
    if not os.access(path, os.R_OK):
        raise SourceError(f"{path}: permission denied; make the file readable", path=path)
    if path.stat().st_size == 0:
        raise SourceError(f"{path} is empty (0 bytes); re-create or re-download it", path=path)


def detect_format(path: str | Path) -> str:
    """The checkpoint format of ``path``, from its first bytes.

    Raises:
        SourceError: the file is missing, unreadable, empty or of no known format.
    """
    path = Path(path)
    _check_file(path)
    with open(path, "rb") as f:
        head = f.read(16)
    if path.name.endswith(".index.json") or path.name == "param_name_map.json":
        return "sharded"
    if head.startswith(b"PK"):
        return "torch-zip"
    # safetensors before pickle: a header length of 640+ bytes also starts with 0x80
    if len(head) >= 9 and head[8:9] == b"{":
        return "safetensors"
    if head[:1] == b"\x80" and len(head) > 1 and head[1] in range(2, 6):
        return "torch-legacy"
    if head[:1] == b"\x0a":
        return "mindspore-ckpt"
    raise SourceError(
        f"{path}: not a checkpoint ms-port can read (neither a PyTorch zip or pickle, "
        "safetensors, nor a MindSpore .ckpt); check that the file is complete", path=path)


def read_source(
    path: str | Path,
    *,
    key: str | None = None,
    strip_prefixes: bool = True,
    unsafe_pickle: bool = False,
    config: bool = True,
    revision: str | None = None,
    strategy: str | Path | None = None,
    step: str | None = None,
) -> Source:
    """Open a checkpoint and list its tensors without loading their data.

    Args:
        path: a ``.pth``/``.pt``/``.bin``, ``.safetensors``, ``*.safetensors.index.json``
            or MindSpore ``.ckpt`` file, or a Hugging Face model directory; or, as a
            string naming no local path, a Hugging Face Hub id (``"Qwen/Qwen2.5-0.5B"``)
            read from the Hugging Face cache (see :mod:`ms_port.read.hub`).
        key: the container to take the state dict from (dotted for nesting, e.g.
            ``"ema"``); by default the usual keys are tried in :data:`CONTAINER_KEYS` order.
        strip_prefixes: remove ``module.`` / ``_orig_mod.`` when every name has it.
        unsafe_pickle: allow arbitrary unpickling for a trusted legacy file. This runs
            whatever code the file contains; never use it on a file from elsewhere.
        config: read the Hugging Face ``config.json`` beside the file, if any, into
            ``Source.config``; where it has ``quantization_config.weight_block_size``,
            float8 weights are read as bfloat16 with their block scales
            (:func:`ms_port.read.fp8.dequantized_view`).
        revision: a Hub id's branch, tag or commit hash (default: ``main``); refused
            with a local path.
        strategy / step: for a distributed training output (a folder of ``rank_N/``
            folders, or one holding ``checkpoint/``): its strategy file or folder (default
            ``strategy/`` beside ``checkpoint/``) and the save to read (default the
            latest); see :mod:`ms_port.read.distributed`.

    Returns:
        A :class:`Source`.

    Raises:
        SourceError: unreadable, corrupt or unknown input; UnsafePickleError for a
            pickle that asks for more than tensors; HubError for a Hub id that cannot
            be resolved.

    Example:
        >>> src = read_source("resnet50.pth")
        >>> src["conv1.weight"].shape
        (64, 3, 7, 7)
    """
    from .hub import locate

    path, hub = locate(path, revision=revision)
    if path.is_dir():
        from .distributed import find_training_output, read_distributed

        if find_training_output(path) is not None:
            return read_distributed(path, _file_tensors, strategy=strategy, step=step)
        path = resolve_directory(path)
    if strategy is not None or step is not None:
        raise SourceError(f"{path} is one checkpoint file; --strategy and --step are for a "
                          "distributed training output (a folder of rank_N/ folders)",
                          path=path)
    source = _read(path, key=key, strip_prefixes=strip_prefixes, unsafe_pickle=unsafe_pickle)
    _check_sizes(source, path)
    found = _find_config(path) if config else None
    if found is not None:
        source.config, source.config_path = read_config(found), str(found)
        from .fp8 import dequantized_view

        source = dequantized_view(source)
    source.hub = hub
    return source


def _file_tensors(path: Path) -> dict[str, TensorInfo]:
    """One file's tensors, names as saved, its training state with them (a rank's or a
    piece's: read/distributed.py keeps the state apart itself)."""
    source = read_source(path, strip_prefixes=False, config=False)
    return {**source.tensors, **{t.name: t for t in source.training_state}}


def _read(path: Path, *, key: str | None, strip_prefixes: bool, unsafe_pickle: bool) -> Source:
    fmt = detect_format(path)
    if fmt.startswith("torch"):
        obj = _torch_load(path, fmt, unsafe_pickle=unsafe_pickle)
        try:
            whole = live_modules(obj) if unsafe_pickle else (
                read_modules(obj, str(path)) if holds_modules(obj) else None)
            if whole is not None:
                return _whole_module_source(path, fmt, whole, key=key, strip=strip_prefixes)
            return _from_tree(path, fmt, obj, key=key, strip=strip_prefixes,
                              leaf=_tensor_leaf)
        except SourceError as exc:
            if exc.path is None:  # raised below the file level: name the file
                raise SourceError(f"{path}: {exc}", path=path, **exc.data) from None
            raise
    if fmt == "safetensors":
        tensors, metadata = _safetensors_tensors(path)
        skipped = []
    elif fmt == "sharded":
        source = _sharded(path, key=key, unsafe_pickle=unsafe_pickle)
        return _strip(source) if strip_prefixes else source
    else:
        tensors, metadata, skipped = _ckpt_tensors(path)
    tensors, state = _state_apart(tensors, fmt)
    source = Source(str(path), fmt, tensors, skipped=skipped, metadata=metadata)
    source.training_state = state
    return _strip(source) if strip_prefixes else source


#: a safetensors file holds a training state where it has MindFormers' AdamW moments (a
#: model's own tensors may well be called ``momentum.*`` or ``learning_rate``)
_MINDFORMERS_STATE = ("adam_m.", "adam_v.")


def _state_apart(tensors: dict[str, TensorInfo], fmt: str
                 ) -> tuple[dict[str, TensorInfo], list[TensorInfo]]:
    """A MindSpore checkpoint's weights, and its training state (optimizer moments,
    counters: :func:`~ms_port.read.distributed.is_training_state`) apart. Only where it
    holds moments (a ``.ckpt``: any optimizer's; safetensors: MindFormers' AdamW's): a file
    of weights alone keeps every name it has."""
    from .distributed import TRAINING_STATE_PREFIXES, is_training_state

    prefixes = TRAINING_STATE_PREFIXES if fmt == "mindspore-ckpt" else _MINDFORMERS_STATE
    if not any(n.startswith(prefixes) for n in tensors):
        return tensors, []
    state = [i for n, i in tensors.items() if is_training_state(n)]
    return {n: i for n, i in tensors.items() if not is_training_state(n)}, state


#: all tensors together may hold this many times the file's bytes: several names can
#: share one storage (tied weights, views), which torch itself expands
MAX_EXPANSION = 16


def _check_sizes(source: Source, path: Path) -> None:
    """Refuse shapes no network has, and totals no file of this size can hold."""
    total = 0
    for info in source.tensors.values():
        shape = info.shape
        if len(shape) > MAX_RANK or any(type(d) is not int or not 0 <= d < MAX_DIM
                                        for d in shape):
            raise SourceError(
                f"{path}: tensor {info.name!r} claims shape {list(shape)[:MAX_RANK + 1]} — "
                f"more than {MAX_RANK} dimensions or a dimension outside 0..2^40; the file "
                "is corrupt or crafted", path=path, tensor=info.name)
        total += info.nbytes
    files = source.shard_bytes if source.shard_bytes else path.stat().st_size
    if total > MAX_EXPANSION * files + (1 << 20):
        raise SourceError(
            f"{path}: its tensors would hold {total} bytes, more than {MAX_EXPANSION}× the "
            f"{files} bytes on disk; refused (many names sharing one storage?) — re-save "
            "the checkpoint with distinct tensors", path=path)


# -- PyTorch -------------------------------------------------------------------------


#: torch.load's warnings about a file it then loads or refuses (a newer pickle protocol, a
#: TorchScript-looking zip): our one line says what matters, they only crowd stderr
TORCH_LOAD_NOISE = (
    (UserWarning, r"Detected pickle protocol \d+ in the checkpoint"),
    (UserWarning, r"'torch\.load' received a zip file that looks like a TorchScript archive"),
)


@contextlib.contextmanager
def _torch_load_noise_ignored() -> Iterator[None]:
    """Ignore the :data:`TORCH_LOAD_NOISE` warnings inside; every other one passes."""
    with warnings.catch_warnings():
        for category, message in TORCH_LOAD_NOISE:
            warnings.filterwarnings("ignore", message, category)
        yield


def _torch_load(path: Path, fmt: str, *, unsafe_pickle: bool) -> Any:
    """The unpickled checkpoint: torch-free where possible, else torch.load(weights_only)."""
    import pickle

    calls: str | None = None  # what the whole-module pass found the file calls, if it ran
    if fmt == "torch-zip":
        _check_zip(path)
        if not unsafe_pickle:
            from . import torchzip

            try:
                return torchzip.load(path)
            except torchzip.Unsupported:
                pass  # something only torch.load(weights_only=True) may judge
            except (torchzip.Refused, zipfile.BadZipFile, OSError, ValueError, EOFError,
                    KeyError, RuntimeError, MemoryError) as exc:
                raise SourceError(
                    f"{path}: cannot read this PyTorch checkpoint ({type(exc).__name__}: "
                    f"{exc}); it is truncated or corrupt — re-download or re-save it",
                    path=path) from None
            whole, calls = _whole_modules(path)
            if whole is not None:
                return whole
    if not unsafe_pickle:
        from .torchguard import prescan

        prescan(path, fmt)
    import torch

    if unsafe_pickle:
        warnings.warn(
            f"unpickling {visible(path)} without weights_only: any code inside the file runs now. "
            "Only do this for files you created or fully trust.", stacklevel=3)
    try:
        # mmap=False: a member torch would map must be stored as-is, and _check_zip has
        # refused compressed ones; reading copies keeps values right whatever the layout
        with _torch_load_noise_ignored():
            return torch.load(path, map_location="cpu", weights_only=not unsafe_pickle,
                              mmap=False)
    except pickle.UnpicklingError as exc:
        if unsafe_pickle:
            raise SourceError(f"{path}: cannot unpickle ({exc}); the file is corrupt",
                              path=path) from None
        culprit = _first_line_mentioning(
            str(exc), ("Unsupported global", "GLOBAL", "Unsupported operand"))
        if calls:
            culprit = (f"it pickles whole modules, which ms-port reads as data, but {calls}; "
                       f"torch says: {culprit}")
        raise UnsafePickleError(
            f"{path}: refused to unpickle — the file asks for more than tensors "
            f"({culprit}). Nothing was executed. If you created this file yourself or "
            "trust its origin, re-run with --unsafe-pickle (unsafe_pickle=True); better, "
            "re-save it as safetensors", path=path, detail=str(exc)) from None
    except Exception as exc:  # torch.load parses untrusted bytes: any failure is "corrupt"
        if unsafe_pickle and isinstance(exc, (ModuleNotFoundError, AttributeError)):
            missing = getattr(exc, "name", None) or str(exc).strip().splitlines()[0]
            raise SourceError(
                f"{path}: unpickling it needs Python code that is not importable here "
                f"({shown(missing)}: {type(exc).__name__}); the file itself is not at fault. "
                "Install the package that saved it, or drop --unsafe-pickle: ms-port then "
                "reads a whole pickled module's tensors as data, without its code",
                path=path) from None
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SourceError(
            f"{path}: cannot read this PyTorch checkpoint ({msg}); it is truncated, "
            "corrupt or not a checkpoint — re-download or re-save it", path=path) from None


def _check_zip(path: Path) -> None:
    """Refuse damaged archives and compressed members before anything decompresses."""
    from .torchzip import compressed_members, oversized_members

    try:
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
            packed = compressed_members(infos)
            if packed:
                raise SourceError(
                    f"{path}: member {packed[0]!r} is compressed; torch.save never compresses "
                    "and a compressed member can hide a decompression bomb — re-save the "
                    "checkpoint with torch.save", path=path)
            size = path.stat().st_size
            lying = oversized_members(infos, size)
            if lying:
                raise SourceError(
                    f"{path}: member {lying[0]!r} claims more bytes than the {size}-byte file "
                    "holds; the file is truncated or corrupt — re-download or re-save it",
                    path=path)
            # stored members only: the CRC pass reads each byte once, nothing expands
            bad = zf.testzip() if size < (64 << 20) else None
    # zipfile raises more than BadZipFile on damaged directories (found by fuzzing)
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, NotImplementedError,
            RuntimeError, UnicodeDecodeError) as exc:
        raise SourceError(
            f"{path}: damaged zip archive ({type(exc).__name__}: {exc}); the file is "
            "truncated or corrupt, re-download or re-save it", path=path) from None
    if bad is not None:
        raise SourceError(f"{path}: member {bad!r} is corrupt (CRC mismatch); "
                          "re-download or re-save it", path=path)


def _first_line_mentioning(text: str, needles: Iterable[str]) -> str:
    for line in text.splitlines():
        if any(n in line for n in needles):
            return line.strip().rstrip(".")
    return text.strip().splitlines()[0] if text.strip() else "unknown reason"


_TORCH_DTYPE_NAMES = {
    "float64": "float64", "float32": "float32", "float16": "float16",
    "bfloat16": "bfloat16", "int64": "int64", "int32": "int32", "int16": "int16",
    "int8": "int8", "uint8": "uint8", "uint16": "uint16", "uint32": "uint32",
    "uint64": "uint64", "bool": "bool", "complex64": "complex64",
    "complex128": "complex128",
}


def torch_to_numpy(t: Any) -> np.ndarray:
    """A CPU torch tensor as a numpy array, sharing memory; bfloat16 via ml_dtypes."""
    import torch

    t = t.detach()
    if any(s < 0 for s in t.stride()):  # allowed by torch on size-1 dims, not by numpy
        t = t.clone(memory_format=torch.contiguous_format)
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(numpy_dtype("bfloat16"))
    return t.numpy()


def read_torch_tree(path: str | Path) -> Any:
    """A PyTorch file's unpickled objects (an optimizer's or a scheduler's state dict), read
    no wider than ``torch.load(weights_only=True)``; tensors as :func:`tensor_leaf` takes
    them."""
    path = Path(path)
    fmt = detect_format(path)
    if not fmt.startswith("torch"):
        raise SourceError(f"{path}: a {fmt} file, where a PyTorch pickle was expected",
                          path=path)
    return _torch_load(path, fmt, unsafe_pickle=False)


def tensor_leaf(name: str, value: Any) -> TensorInfo | None:
    """``value`` as a tensor named ``name``, or None where it is no tensor ms-port reads."""
    leaf = _tensor_leaf(name, value)
    return leaf if isinstance(leaf, TensorInfo) else None


def _whole_module_source(path: Path, fmt: str, whole: ModuleRead, *, key: str | None,
                         strip: bool) -> Source:
    """A whole-module checkpoint's tensors: the module taken (``ema`` over ``model``, or
    ``key``) as its state dict, the rest of the file listed as skipped, and notes that say
    what was read and how."""
    key = key or whole.preferred
    source = _from_tree(path, fmt, whole.tree, key=key, strip=strip, leaf=_tensor_leaf)
    source.notes = whole.notes
    source.described = whole.described.get(key.split(".")[0] if key else None)
    if key is not None and isinstance(whole.tree, Mapping):
        top = key.split(".")[0]
        source.skipped[:0] = [Skipped(str(k), type(v).__name__,
                                      f"outside the unwrapped {top!r} container")
                              for k, v in whole.tree.items() if k != top]
    return source


def _whole_modules(path: Path) -> tuple[Any, str | None]:
    """The file read by the whole-module pass where it holds a pickled ``nn.Module`` (else
    ``None``: ``torch.load(weights_only=True)`` judges it, as before), and what it calls
    with arguments where that stopped the pass (code, never run)."""
    from . import torchzip

    try:
        tree = torchzip.load(path, modules=True)
    except torchzip.CodeRefused as exc:
        return None, str(exc)
    except (torchzip.Unsupported, torchzip.Refused, zipfile.BadZipFile, OSError, ValueError,
            EOFError, KeyError, RuntimeError, MemoryError):
        return None, None
    return (tree, None) if holds_modules(tree) else (None, None)


def _tensor_leaf(name: str, value: Any) -> TensorInfo | Skipped:
    from .torchzip import Instance, LazyTensor

    if isinstance(value, LazyTensor):
        return TensorInfo(name, value.shape, value.dtype, value.load,
                          value.load_rows if value.shape else None)
    if isinstance(value, Instance):
        return Skipped(name, str(value.cls), "an object kept as data (never constructed)")
    torch = sys.modules.get("torch")  # only a torch.load fallback yields torch tensors
    if torch is None or not isinstance(value, torch.Tensor):
        return Skipped(name, type(value).__name__, "not a tensor")
    if value.is_sparse or value.is_quantized or value.layout != torch.strided:
        return Skipped(name, f"tensor ({value.layout})",
                       "sparse or quantized tensors are not supported; make it dense")
    if value.is_meta:
        return Skipped(name, "tensor (meta)", "a meta tensor has a shape but no data; re-save "
                       "the checkpoint with real tensors (load the weights before saving)")
    if len(value.shape) > MAX_RANK:
        raise SourceError(f"tensor {name!r} has {len(value.shape)} dimensions (at most "
                          f"{MAX_RANK}); the file is corrupt or crafted", tensor=name)
    if any(d < 0 or d >= MAX_DIM for d in value.shape):  # torch allows [0, -8]
        raise SourceError(f"tensor {name!r} claims shape {list(value.shape)}, a dimension "
                          "outside 0..2^40; the file is corrupt or crafted", tensor=name)
    if value.numel() and value.numel() * value.element_size() > \
            value.untyped_storage().nbytes():
        raise SourceError(f"tensor {name!r} of shape {list(value.shape)} repeats its "
                          f"{value.untyped_storage().nbytes()}-byte storage (stride-0 "
                          "expansion); refused — re-save it with .contiguous()")
    dtype = _TORCH_DTYPE_NAMES.get(str(value.dtype).removeprefix("torch."))
    if dtype is None:
        return Skipped(name, f"tensor ({value.dtype})", "dtype has no MindSpore equivalent")
    return TensorInfo(name, tuple(value.shape), dtype, lambda v=value: torch_to_numpy(v))


def _is_tensor_dict(obj: Any, leaf) -> bool:
    return isinstance(obj, Mapping) and any(
        isinstance(leaf("", v), TensorInfo) for v in obj.values())


def _from_tree(path: Path, fmt: str, obj: Any, *, key: str | None, strip: bool,
               leaf) -> Source:
    """Find the state dict inside a loaded checkpoint object and list its tensors."""
    unwrapped: list[str] = []
    skipped: list[Skipped] = []
    if not isinstance(obj, Mapping):
        raise SourceError(
            f"{path} holds a {type(obj).__name__}, not a state dict; save "
            "model.state_dict() rather than the model", path=path)
    if key is not None:
        parent: Any = obj
        for part in key.split("."):
            if not isinstance(obj, Mapping) or part not in obj:
                keys = ", ".join(map(str, obj)) if isinstance(obj, Mapping) else "none"
                raise SourceError(f"{path}: no container {key!r} (keys here: {keys})",
                                  path=path)
            parent, obj = obj, obj[part]
            unwrapped.append(part)
        if not isinstance(obj, Mapping):
            raise SourceError(f"{path}: {key!r} holds {type(obj).__name__}, not tensors; "
                              f"keys beside it: {', '.join(map(str, parent)) or 'none'} — "
                              "pass another --key", path=path)
    else:
        while not _is_tensor_dict(obj, leaf):
            inner = next((k for k in CONTAINER_KEYS
                          if isinstance(obj.get(k), Mapping)), None)
            if inner is None:
                raise SourceError(
                    f"{path} holds no tensors at the top level nor under a known key "
                    f"({', '.join(CONTAINER_KEYS)}); keys here: "
                    f"{', '.join(map(str, obj)) or 'none'} — pass --key NAME", path=path)
            prefix = ".".join(unwrapped)
            for k, v in obj.items():
                if k != inner:
                    where = f"{prefix}.{k}" if prefix else str(k)
                    skipped.append(Skipped(where, type(v).__name__,
                                           f"outside the unwrapped {inner!r} container"))
            obj = obj[inner]
            unwrapped.append(inner)
    tensors: dict[str, TensorInfo] = {}
    for name, item in _flatten(obj, leaf):
        if isinstance(item, Skipped):
            skipped.append(item)
        else:
            tensors[name] = item
    source = Source(str(path), fmt, tensors, unwrapped=unwrapped, skipped=skipped)
    return _strip(source) if strip else source


#: nested state dicts deeper than this are refused (real ones nest 1-3 levels)
MAX_NESTING = 64


def _flatten(obj: Mapping, leaf, prefix: str = "", depth: int = 0):
    """Yield (name, TensorInfo | Skipped); nested dicts of tensors become dotted names."""
    if depth > MAX_NESTING:
        raise SourceError(f"tensors nested more than {MAX_NESTING} dicts deep (at "
                          f"{shown(prefix)}); not a state dict ms-port can read")
    for k, v in obj.items():
        name = f"{prefix}{k}"
        if isinstance(v, Mapping) and _is_tensor_dict(v, leaf):
            yield from _flatten(v, leaf, name + ".", depth + 1)
        else:
            yield name, leaf(name, v)


def _strip(source: Source) -> Source:
    """Remove wrapper prefixes that every name carries, in one linear pass.

    The prefixes every name shares are a prefix of the names' longest common prefix,
    which is the common prefix of the smallest and the largest name.
    """
    names = source.tensors
    if not names:
        return source
    first, last = min(names), max(names)
    common = first[:next((i for i, (a, b) in enumerate(zip(first, last)) if a != b),
                         min(len(first), len(last)))]
    shortest = min(map(len, names))
    cut = 0
    while True:
        prefix = next((p for p in WRAPPER_PREFIXES if common.startswith(p, cut)
                       and cut + len(p) < shortest), None)
        if prefix is None:
            break
        source.stripped.append(prefix)
        cut += len(prefix)
    if cut:
        source.tensors = {n[cut:]: _renamed(info, n[cut:]) for n, info in names.items()}
    return source


def _renamed(info: TensorInfo, name: str) -> TensorInfo:
    return dataclasses.replace(info, name=name)  # every other field carried


# -- safetensors ---------------------------------------------------------------------


def _safetensors_tensors(path: Path) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """List a safetensors file; the library validates the header, numpy maps the data."""
    entries, metadata = safetensors_layout(path)
    tensors: dict[str, TensorInfo] = {}
    for name, (shape, dtype, offset, nbytes) in entries.items():
        tensors[name] = TensorInfo(
            name, shape, dtype,
            lambda p=path, o=offset, n=nbytes, s=shape, d=dtype: _map_region(p, o, n, s, d),
            # a span of rows is a slice of the map: only its pages are read
            (None if not shape or dtype in PACKED_DTYPES else
             lambda a, b, p=path, o=offset, n=nbytes, s=shape, d=dtype:
             _map_region(p, o, n, s, d)[a:b]),
            ((str(path), offset, nbytes),))
    return tensors, metadata


def safetensors_layout(path: str | Path) -> tuple[
        dict[str, tuple[tuple[int, ...], str, int, int]], dict[str, str]]:
    """Where a safetensors file keeps each tensor, once the safetensors library has
    validated its header against the file (offsets tiling the data exactly).

    Returns:
        ``{name: (shape, dtype, file offset, nbytes)}``, and the
        header's ``__metadata__``.

    Raises:
        SourceError: an invalid file, or a dtype this ms-port does not know (every
            dtype of safetensors 0.8 is known; float8 and packed 4/6-bit ones are listed).
    """
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            metadata = dict(f.metadata() or {})
            names = list(f.keys())
    except (SafetensorError, OSError, ValueError) as exc:
        raise SourceError(
            f"{path}: invalid safetensors file ({exc}); the header is corrupt or the "
            "file truncated — re-download or re-save it", path=path) from None
    # safe_open validated offsets against the file; read them to map each tensor lazily
    # (its numpy path copies and has no bfloat16).
    with open(path, "rb") as fh:
        header_len = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(header_len))
    base = 8 + header_len
    entries = {}
    for name in names:
        entry = header[name]
        code = entry["dtype"]
        dtype = SAFETENSORS_DTYPES.get(code) or SAFETENSORS_STORED_DTYPES.get(code)
        if dtype is None:  # a dtype of a safetensors newer than this ms-port knows
            raise SourceError(f"{path}: tensor {name!r} has dtype {shown(code)}, which this "
                              "ms-port does not know; upgrade ms-port", path=path,
                              tensor=name)
        start, end = entry["data_offsets"]
        entries[name] = (tuple(entry["shape"]), dtype, base + start, end - start)
    return entries, metadata


def _map_region(path: Path, offset: int, nbytes: int, shape: tuple[int, ...],
                dtype: str) -> np.ndarray:
    if dtype in PACKED_DTYPES:  # no numpy dtype holds them packed: their bytes
        shape, dtype = (nbytes,), "uint8"
    dt = numpy_dtype(dtype)
    if nbytes == 0:
        return np.zeros(shape, dt)
    return np.memmap(path, dtype=dt, mode="r", offset=offset, shape=shape)


#: the largest index file read (a 100k-tensor index is ~10 MiB)


def _sharded(index: Path, **read: Any) -> Source:
    """A sharded set: safetensors or PyTorch shards listed by an index's ``weight_map``."""
    if index.stat().st_size > MAX_INDEX_BYTES:
        raise SourceError(f"{index}: {index.stat().st_size} bytes is too large for a shard "
                          f"index (at most {MAX_INDEX_BYTES}); refused", path=index)
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        if not isinstance(weight_map, dict):
            raise TypeError("weight_map is not a mapping")
    except RecursionError:
        raise SourceError(f"{index}: JSON nested too deeply; not a shard index",
                          path=index) from None
    except (ValueError, KeyError, TypeError) as exc:
        raise SourceError(f"{index}: not a sharded-checkpoint index (it needs a 'weight_map' "
                          f"of tensor name -> shard file; {exc})", path=index) from None
    for name, shard in weight_map.items():
        _check_shard_path(index, name, shard)
    tensors: dict[str, TensorInfo] = {}
    shards: dict[str, Source] = {}
    for name, shard in weight_map.items():
        if shard not in shards:
            # the index's config is read once, by the caller: a weight's block scales may
            # lie in another shard
            shards[shard] = read_source(index.parent / shard, strip_prefixes=False,
                                        config=False, **read)
        if name not in shards[shard]:
            raise SourceError(f"{index}: lists {name!r} in {shard}, which does not hold it; "
                              "the set is inconsistent — re-download it", path=index)
        tensors[name] = shards[shard][name]
    first = next(iter(shards.values()), None)
    kind = first.format.split("-")[0] if first else "safetensors"
    skipped = [Skipped(f"{shard}:{n}", "tensor", "in a shard but not in the index")
               for shard, src in shards.items() for n in src.tensors if n not in tensors]
    skipped += [s for src in shards.values() for s in src.skipped]
    metadata = {k: v for src in shards.values() for k, v in src.metadata.items()}
    on_disk = sum(Path(src.path).stat().st_size for src in shards.values())
    return Source(str(index), f"{kind}-sharded", tensors, skipped=skipped, metadata=metadata,
                  shard_bytes=on_disk, shards=[str(src.path) for src in shards.values()])


def _check_shard_path(index: Path, name: str, shard: Any) -> None:
    """A shard must be a plain file name inside the index's folder, other than the index."""
    if not isinstance(shard, str) or not shard:
        raise SourceError(f"{index}: tensor {name!r} names shard {shard!r}, which is not a "
                          "file name; the index is corrupt", path=index, tensor=name)
    # a plain name, not a path: '../x', '/etc/x' or 'a/../../x' never leave the folder.
    # (A shard that is itself a symlink is allowed: Hugging Face caches link to blobs.)
    if "/" in shard or "\\" in shard or shard in (".", "..") or "\0" in shard:
        raise SourceError(f"{index}: shard {shard!r} (for {name!r}) is not a file name in "
                          "the index's folder; refused — shards must sit beside their index",
                          path=index, tensor=name)
    if shard == index.name:
        raise SourceError(f"{index}: lists itself as the shard of {name!r}; the index is "
                          "corrupt", path=index, tensor=name)
    if shard.endswith(".index.json") or shard == "param_name_map.json" or \
            (index.parent / shard).is_dir():
        raise SourceError(f"{index}: shard {shard!r} (for {name!r}) is an index or a "
                          "directory, not a weights file; the index is corrupt",
                          path=index, tensor=name)


# -- MindSpore ------------------------------------------------------------------------


def _ckpt_tensors(path: Path) -> tuple[dict[str, TensorInfo], dict[str, str], list[Skipped]]:
    from .ckpt import CkptReader

    reader = CkptReader(path)
    if reader.has_crc and reader.crc_ok is False:
        raise SourceError(f"{path}: CRC check failed — the file was changed or damaged after "
                          "it was written; re-create or re-download it", path=path)
    tensors = {
        e.name: TensorInfo(e.name, e.shape, e.dtype, lambda e=e: reader.load(e.name),
                           lambda a, b, e=e: reader.load(e.name, (a, b)),
                           tuple((str(path), o, n)
                                 for o, n in e.pieces or ((e.offset, e.nbytes),)))
        for e in reader.entries
    }
    skipped = [Skipped(name, kind, reason) for name, kind, reason in reader.skipped]
    metadata = {"crc": "ok"} if reader.has_crc else {}
    return tensors, metadata, skipped
