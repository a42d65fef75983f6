"""Differential fuzzing: our PyTorch reader against ``torch.load(weights_only=True)``.

For every generated or mutated file both readers must agree: both refuse, or both return
the same tree with identical names, shapes, dtypes and bytes. Where ours refuses a file
torch accepts, the refusal must be one of the documented narrowings (:data:`NARROWER`);
ours accepting what torch refuses is always a failure.

``FUZZ_CASES`` sets the number of cases per family (default 60, 660 cases in all, for
``make test``; ``make fuzz`` runs 2,000 per family, 22,000 cases). Every case is seeded: a
failure names its seed. The outcome counts are printed at the end of the run.
"""

from __future__ import annotations

import os
import random
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hostile import Archive, T, floats, pickle_state, zip_checkpoint

from ms_port.errors import SourceError
from ms_port.read import torchzip
from ms_port.read.sources import _torch_load, detect_format, torch_to_numpy

CASES = int(os.environ.get("FUZZ_CASES", "60"))
#: torch's tensors larger than this are compared by shape and dtype only (every file
#: here is a few KB; ours refuses tensors of more than 16x the file)
MATERIALIZE_BYTES = 64 << 20
#: refusals of ours that torch does not share, each a documented choice (SECURITY.md, "Narrowings")
NARROWER = {
    "compressed": "compressed zip members (torch.save writes none; bomb-proof)",
    "stride-0 expansion": "a tensor holding more bytes than its storage",
    "allocate memory": "globals that allocate memory the file does not fill",
    "never filled": "legacy storages the data section does not fill",
    "dimensions": "more than 16 dimensions",
    "outside 0..2^40": "a dimension of 2^40 or more",
    "on disk": "tensors totalling more than 16x the file",
    "not a checkpoint ms-port can read": "files that do not start like a checkpoint",
}
_OPS = b"(tRbsueaQhqjrKMJXUN\x88\x89)]}\x85\x86\x87\x8a\x8f.c"


def _leaf(v: Any) -> Any:
    if isinstance(v, torchzip.LazyTensor):
        a = v.load()
        return ("tensor", a.shape, str(a.dtype), np.ascontiguousarray(a).tobytes())
    if isinstance(v, torch.Tensor):
        if v.is_meta or v.layout != torch.strided or v.is_quantized:
            return ("other-tensor", tuple(v.shape), str(v.dtype))
        if v.numel() * v.element_size() > MATERIALIZE_BYTES:
            # a small storage viewed with stride 0 as gigabytes: torch accepts it, ours
            # refuses it (a narrowing), and making it contiguous here took 5-24 GB
            return ("expanded-tensor", tuple(v.shape), str(v.dtype))
        a = torch_to_numpy(v.detach().contiguous())
        return ("tensor", a.shape, str(a.dtype), np.ascontiguousarray(a).tobytes())
    if isinstance(v, (torchzip._Storage, torch.storage.TypedStorage)):
        return ("storage",)  # a bare storage is not a tensor: read_source skips it
    if isinstance(v, (torchzip._StorageType, torch.serialization.StorageType)):
        return ("storage-type",)
    if callable(v):
        return ("callable",)  # an allow-listed function left as a value, both sides
    if isinstance(v, dict):
        return ("dict", [(_leaf(k), _leaf(x)) for k, x in v.items()])
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, [_leaf(x) for x in v])
    return ("value", repr(v))


def ours(path: Path) -> tuple[str, Any]:
    try:
        obj = _torch_load(path, detect_format(path), unsafe_pickle=False)
        if isinstance(obj, dict):  # what read_source then checks, tensor by tensor
            from ms_port.read.sources import _tensor_leaf

            for k, v in obj.items():
                _tensor_leaf(str(k), v)
        return "ok", _leaf(obj)
    except (SourceError, torchzip.Refused) as exc:
        return "refused", str(exc)


def theirs(path: Path) -> tuple[str, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return "ok", _leaf(torch.load(path, map_location="cpu", weights_only=True,
                                          mmap=False))
        except Exception as exc:
            return "refused", f"{type(exc).__name__}: {exc}"


#: every case's outcome, summed over the session; conftest prints it after the run
TOTAL: Counter = Counter()


def check(path: Path, seed: Any, tally: Counter) -> None:
    TOTAL["cases"] += 1
    (a, va), (b, vb) = ours(path), theirs(path)
    if a == b == "ok":
        assert va == vb, f"case {seed}: both read {path.name} but differ:\n{va}\n{vb}"
        tally["agree-ok"] += 1
        TOTAL["agree-ok"] += 1
    elif a == b:
        tally["agree-refused"] += 1
        TOTAL["agree-refused"] += 1
    elif a == "ok":
        pytest.fail(f"case {seed}: ours accepts what torch.load(weights_only) refuses "
                    f"({vb[:200]})")
    else:
        why = next((k for k in NARROWER if k in va), None)
        assert why, f"case {seed}: ours refuses what torch accepts, undocumented: {va}"
        tally[f"narrower: {why}"] += 1
        TOTAL[f"narrower: {why}"] += 1


def _geometry(rng: random.Random) -> T:
    pick = [0, 1, 2, 3, 4, 7, 8, 63, 64, 65, -1, -8, 2**31, 2**62, 2**63, True]
    rank = rng.choice([0, 1, 1, 2, 2, 3, 17, 33])
    size = tuple(rng.choice(pick) for _ in range(rank))
    stride = tuple(rng.choice(pick) for _ in range(rank if rng.random() < .9 else rank + 1))
    return T("w", numel=rng.choice([0, 4, 64, 64, 65]), offset=rng.choice(pick),
             size=size, stride=stride, requires_grad=rng.random() < .1,
             storage=rng.choice(["FloatStorage", "FloatStorage", "HalfStorage",
                                 "LongStorage", "BoolStorage"]))


def _storage_sized(t: T) -> dict[str, bytes]:
    item = {"FloatStorage": 4, "HalfStorage": 2, "LongStorage": 8, "BoolStorage": 1}
    n = t.numel if isinstance(t.numel, int) and 0 <= t.numel < 4096 else 0
    return {"0": bytes(np.random.default_rng(n).integers(0, 2, n * item[t.storage],
                                                       dtype=np.uint8))}


def test_generated_geometry_agrees(tmp_path):
    """Sizes, strides, offsets, ranks and storage sizes drawn from edge values."""
    tally: Counter = Counter()
    for i in range(CASES * 4):
        rng = random.Random(f"geometry-{i}")
        t = _geometry(rng)
        check(zip_checkpoint(tmp_path / f"g{i}.pth", [t], _storage_sized(t)), i, tally)
    assert tally["agree-ok"] and tally["agree-refused"], tally


def _real(tmp_path: Path, legacy: bool = False) -> Path:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3), torch.nn.BatchNorm2d(3),
                              torch.nn.Linear(4, 2))
    state = net.state_dict()
    state["half"] = torch.randn(3).half()
    state["view"] = torch.randn(4, 4)[1:3, ::2]
    path = tmp_path / ("legacy.pth" if legacy else "real.pth")
    torch.save(state, path, _use_new_zipfile_serialization=not legacy)
    return path


def _archive_of(path: Path) -> Archive:
    import zipfile

    with zipfile.ZipFile(path) as zf:
        root = zf.infolist()[0].filename.split("/")[0]
        storages = {i.filename.split("/data/")[1]: zf.read(i) for i in zf.infolist()
                    if "/data/" in i.filename}
        return Archive(zf.read(f"{root}/data.pkl"), storages, root=root)


def _mutate(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    kind = rng.choice(["flip", "opcode", "insert", "delete", "build", "key"])
    at = rng.randrange(2, max(3, len(b) - 1))
    if kind == "flip":
        b[at] ^= 1 << rng.randrange(8)
    elif kind == "opcode":
        b[at] = rng.choice(_OPS)
    elif kind == "insert":
        b[at:at] = bytes([rng.choice(_OPS)])
    elif kind == "delete":
        del b[at]
    elif kind == "build":  # set state on whatever is on top of the stack
        b[at:at] = rng.choice([b"}b", b"}X\x04\x00\x00\x00pathX\x0b\x00\x00\x00/etc/passwdsb",
                               b"(}N\x86b", b"N\x85b"])
    else:  # storage keys: a neighbour, a path, a number
        key = rng.choice([b"0", b"1", b"../0", b"/etc/passwd", b"data/0", b"9"])
        i = b.find(b"X\x01\x00\x00\x00", at) if rng.random() < .5 else b.find(b"X\x01")
        if i >= 0:
            b[i:i + 6] = b"X" + len(key).to_bytes(4, "little") + key
    return bytes(b)


def test_mutated_real_checkpoints_agree(tmp_path):
    """Byte flips, opcode substitutions, inserted BUILDs and storage keys in real files."""
    base = _archive_of(_real(tmp_path))
    tally: Counter = Counter()
    for i in range(CASES * 4):
        rng = random.Random(f"mutate-{i}")
        data = base.pickle
        for _ in range(rng.choice([1, 1, 2, 3])):
            data = _mutate(data, rng)
        arc = Archive(data, dict(base.storages), root=base.root)
        check(arc.write(tmp_path / f"m{i}.pth"), i, tally)
    assert tally["agree-ok"] and tally["agree-refused"], tally


def test_mutated_legacy_checkpoints_agree(tmp_path):
    raw = _real(tmp_path, legacy=True).read_bytes()
    tally: Counter = Counter()
    for i in range(CASES):
        rng = random.Random(f"legacy-{i}")
        b = bytearray(raw)
        for _ in range(rng.choice([1, 2])):
            at = rng.randrange(len(b))
            b[at] = rng.choice(_OPS) if rng.random() < .5 else b[at] ^ (1 << rng.randrange(8))
        path = tmp_path / f"l{i}.pth"
        path.write_bytes(bytes(b))
        check(path, i, tally)
    assert tally["agree-ok"] + tally["agree-refused"] >= CASES // 2, tally


def test_grammar_pickles_agree(tmp_path):
    """Whole pickles generated from opcodes: containers, values, globals, tensors."""
    tally: Counter = Counter()
    globals_ = [(b"collections", b"OrderedDict"), (b"torch._utils", b"_rebuild_tensor_v2"),
                (b"torch._utils", b"_rebuild_parameter"), (b"torch", b"FloatStorage"),
                (b"torch", b"Size"), (b"torch", b"Tensor"), (b"builtins", b"set"),
                (b"torch", b"device"), (b"builtins", b"bytearray")]
    for i in range(CASES * 2):
        rng = random.Random(f"grammar-{i}")
        tensors = [T(f"t{j}", key=str(j), numel=4, size=(2, 2), stride=(2, 1),
                     parameter=rng.random() < .3) for j in range(rng.randrange(1, 4))]
        body = pickle_state(tensors)[:-2]  # without the final SETITEMS u and STOP
        for _ in range(rng.randrange(0, 6)):
            op = rng.choice(["value", "global", "op"])
            if op == "value":
                body += rng.choice([b"N", b"K\x07", b")", b"]", b"}", b"X\x01\x00\x00\x00k"])
            elif op == "global":
                m, n = rng.choice(globals_)
                body += b"c" + m + b"\n" + n + b"\n" + rng.choice([b")R", b"K\x05\x85R", b""])
            else:
                body += bytes([rng.choice(_OPS)])
        body += b"u."
        storages = {str(j): floats(4, j) for j in range(len(tensors))}
        check(Archive(body, storages).write(tmp_path / f"p{i}.pth"), i, tally)
    assert tally["agree-ok"] and tally["agree-refused"], tally
