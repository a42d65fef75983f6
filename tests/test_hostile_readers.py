"""Every reader-side attack class of the hostile-files issue, built by a generator.

Each case is run as ``ms-port inspect`` (and ``convert`` where an output is at stake) in
a child process: one line on stderr, exit 2, no traceback, nothing written — and, for the
bombs, the child's peak memory and time measured with generous margins.
"""

from __future__ import annotations

import json
import os
import pickle
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hostile import Archive, T, floats, pickle_state, zip_checkpoint

from ms_port.errors import SourceError
from ms_port.read.sources import read_source

SECRET = b"ms-port-secret-token-0123456789"


LAUNCH = Path(__file__).resolve().parents[1] / "benchmarks" / "_launch.py"


def _run(*args: str, cwd: Path) -> tuple[subprocess.CompletedProcess, float, float]:
    """Run the CLI in a child: (result, the child's own peak RSS in MiB, seconds).

    Through the benchmarks' tiny launcher: a child forked from this big test process
    would report this process's peak RSS as its own (see benchmarks/_launch.py).
    """
    out, err = cwd / ".stdout", cwd / ".stderr"
    launched = subprocess.run(
        [sys.executable, "-I", "-S", str(LAUNCH), str(out), str(err), "--",
         sys.executable, "-m", "ms_port", *args],
        cwd=cwd, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(LAUNCH.parents[1])})
    stats = json.loads(launched.stdout)
    result = subprocess.CompletedProcess(args, stats["rc"], out.read_text(), err.read_text())
    out.unlink()
    err.unlink()
    return result, stats["maxrss_mib"], stats["wall"]


#: generous bounds for a child that refuses a tiny hostile file: interpreter start-up and
#: imports are most of it (measured here: 0.5-2 s, 60-110 MiB)
REFUSAL_SECONDS, REFUSAL_MIB = 30, 300


def _bounded(rss: float, wall: float, what: str) -> None:
    assert rss < REFUSAL_MIB, f"{what}: {rss:.0f} MiB peak"
    assert wall < REFUSAL_SECONDS, f"{what}: {wall:.1f} s"


def _refused(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-500:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) <= 2, proc.stderr  # the error, maybe a wrapped hint
    for needle in needles:
        assert needle in proc.stderr, (needle, proc.stderr)


# -- exfiltration: state set on the reader's own objects -------------------------------

def _exfiltrating(tmp_path: Path, secret: Path) -> Path:
    """BUILD right after a storage/tensor sets its path to a local file."""
    state = (b"}" + b"X" + struct.pack("<I", 4) + b"path" + b"X"
             + struct.pack("<I", len(str(secret))) + str(secret).encode() + b"sb")
    return zip_checkpoint(tmp_path / "exfil.pth", [T("w", numel=8, size=(8,), after=state)])


def test_build_cannot_point_a_tensor_at_a_local_file(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_bytes(SECRET)
    path = _exfiltrating(tmp_path, secret)
    try:
        source = read_source(path)
        data = b"".join(np.ascontiguousarray(t.load()).tobytes() for t in source)
        assert SECRET[:8] not in data
    except SourceError:
        pass  # refused is the other acceptable outcome (torch refuses this BUILD too)
    proc, _, _ = _run("convert", str(path), "--target", str(path), "-o", "out.ckpt",
                      cwd=tmp_path)
    out = tmp_path / "out.ckpt"
    assert not out.exists() or SECRET not in out.read_bytes()
    assert "Traceback" not in proc.stderr


# -- geometry: every field checked before a byte is read -------------------------------

GEOMETRY = {
    "negative stride": T("w", numel=16, size=(4, 4), stride=(-4, 1)),
    "offset past storage": T("w", numel=4, offset=100, size=(4,)),
    "span past storage": T("w", numel=4, size=(4, 4), stride=(4, 1)),
    "huge stride": T("w", numel=4, size=(2,), stride=(2**40,)),
    "negative offset": T("w", numel=4, offset=-1, size=(2,)),
    "stride-0 expansion": T("w", numel=1, size=(1 << 15, 1 << 15), stride=(0, 0)),
    "33 dimensions": T("w", numel=1, size=(1,) * 33, stride=(1,) * 33),
    "[0, 2^62]": T("w", numel=4, size=(0, 2**62), stride=(1, 1)),
    "rank mismatch": T("w", numel=4, size=(2, 2), stride=(1,)),
    "missing storage": T("w", key="7", numel=4, size=(4,)),
}


@pytest.mark.parametrize("case", list(GEOMETRY))
def test_bad_geometry_is_one_line_exit_2(tmp_path, case):
    t = GEOMETRY[case]
    storages = {"0": floats(t.numel)} if t.key == "0" else {"0": floats(4)}
    path = zip_checkpoint(tmp_path / "g.pth", [t], storages)
    proc, rss, wall = _run("inspect", str(path), cwd=tmp_path)
    _bounded(rss, wall, case)
    if case == "[0, 2^62]" and proc.returncode == 0:
        return  # an empty tensor: torch accepts it, and so may we (no byte is read)
    _refused(proc, "g.pth")


def test_template_expansion_cannot_inflate_an_output(tmp_path):
    """A 600-byte file once became a 1 GiB output through a template; now it is refused."""
    path = zip_checkpoint(tmp_path / "tiny.pth", [T("w", numel=1, size=(1 << 14, 1 << 14),
                                                    stride=(0, 0))], {"0": floats(1)})
    assert path.stat().st_size < 2048
    proc, rss, _ = _run("convert", str(path), "--target", str(path), "-o", "o.ckpt",
                        cwd=tmp_path)
    _refused(proc, "stride-0")
    assert not (tmp_path / "o.ckpt").exists() and rss < 400


# -- the torch.load fallback -----------------------------------------------------------

def _pickle_with(global_: bytes, call: bytes) -> bytes:
    """{'w': <tensor>, 'x': global(call)} — the global reached through REDUCE or NEWOBJ."""
    body = pickle_state([T("w", numel=4, size=(4,))])[:-2]
    return body + b"X\x01\x00\x00\x00x" + global_ + call + b"u."


@pytest.mark.parametrize("global_,call", [
    (b"ctorch\nTensor\n", b"J\x00\x00\x10\x00\x85R"),  # torch.Tensor(1M): uninitialised
    (b"ctorch\nFloatTensor\n", b"K\x40\x85R"),
    (b"ctorch\nTensor\n", b"(J\x00\x00\x10\x00t\x81"),  # NEWOBJ
    (b"ctorch\nUntypedStorage\n", b"J\x00\x00\x00\x40\x85R"),  # 1 GiB of nothing
    (b"cbuiltins\nbytearray\n", b"\x8a\x05\x00\x00\x00\x00\x01\x85R"),  # 4 GiB bytearray
], ids=["Tensor(n)", "FloatTensor(n)", "NEWOBJ Tensor", "UntypedStorage(n)", "bytearray"])
def test_fallback_never_hands_out_uninitialised_memory(tmp_path, global_, call):
    path = Archive(_pickle_with(global_, call), {"0": floats(4)}).write(tmp_path / "u.pth")
    proc, rss, _ = _run("convert", str(path), "--target", str(path), "-o", "o.ckpt",
                        "--allow-unused", cwd=tmp_path)
    _refused(proc, "u.pth")
    assert not (tmp_path / "o.ckpt").exists() and rss < 600


class _Calls:
    """Pickles as a call of ``print``: what a hostile file asks for (never called here)."""

    def __reduce__(self):
        return (print, ("ran",))


def _protocol5(path: Path, *, zipped: bool, torchscript: bool = False) -> Path:
    torch.save({"w": torch.ones(2), "x": _Calls()}, path, pickle_protocol=5,
               _use_new_zipfile_serialization=zipped)
    if torchscript:  # torch.load takes a zip holding constants.pkl for TorchScript
        with zipfile.ZipFile(path, "a", compression=zipfile.ZIP_STORED) as zf:
            root = zf.namelist()[0].split("/")[0]
            zf.writestr(f"{root}/constants.pkl", pickle.dumps([], protocol=2))
    return path


@pytest.mark.parametrize(("build", "message"), [
    (lambda p: _protocol5(p, zipped=True), "refused to unpickle"),
    (lambda p: _protocol5(p, zipped=False), "refused to unpickle"),
    (lambda p: _protocol5(p, zipped=True, torchscript=True), "TorchScript archives"),
], ids=["zip", "legacy", "TorchScript-looking zip"])
def test_torch_load_warnings_never_precede_the_refusal(tmp_path, build, message):
    """torch.load warns about a pickle protocol other than its own 2 (and about a zip that
    looks like TorchScript) before it refuses the file; the user sees ms-port's line and
    its hint, nothing of torch's."""
    path = build(tmp_path / "p5.pth")
    proc, _, _ = _run("inspect", str(path), cwd=tmp_path)
    _refused(proc, message)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("error: "), proc.stderr
    assert lines[1] == "(run with --debug for the traceback)", proc.stderr
    assert "ran" not in proc.stdout


def test_legacy_storage_declared_but_never_filled_is_refused(tmp_path):
    """A legacy file whose pickle declares a storage that its data section never fills."""
    torch.save({"w": torch.ones(3)}, tmp_path / "ok.pth", _use_new_zipfile_serialization=False)
    raw = (tmp_path / "ok.pth").read_bytes()
    # the storage-key list is the pickle after the main one: make it empty
    import pickle
    import pickletools

    pos, ends = 0, []
    for _ in range(4):
        for _op, _arg, at in pickletools.genops(raw[pos:]):
            end = pos + at
        pos = end + 1
        ends.append(pos)
    keys_end = ends[3]
    for _op, _arg, at in pickletools.genops(raw[keys_end:]):
        last = keys_end + at
    crafted = raw[:keys_end] + pickle.dumps([], protocol=2) + raw[last + 1:]
    path = tmp_path / "unfilled.pth"
    path.write_bytes(crafted)
    with pytest.raises(SourceError, match="never filled"):
        read_source(path)


def test_meta_tensor_is_skipped_with_a_reason(tmp_path):
    path = tmp_path / "meta.pth"
    torch.save({"w": torch.ones(2), "m": torch.empty(3, device="meta")}, path)
    source = read_source(path)
    assert list(source.tensors) == ["w"]
    assert [(s.name, s.kind) for s in source.skipped] == [("m", "tensor (meta)")]


# -- compressed members and bombs ------------------------------------------------------

@pytest.mark.parametrize("method", [zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2],
                         ids=["deflate", "bzip2"])
def test_compressed_members_are_refused_before_decompressing(tmp_path, method):
    """A bomb: a few KB on disk, 256 MiB once expanded. Refused with nothing expanded."""
    n = 64 << 20  # float32 elements: 256 MiB of zeros
    pkl = pickle_state([T("w", numel=n, size=(n,))])
    with zipfile.ZipFile(tmp_path / "bomb.pth", "w") as zf:
        zf.writestr("archive/data.pkl", pkl)
        zf.writestr("archive/version", b"3\n")
        zf.writestr(zipfile.ZipInfo("archive/data/0"), bytes(n * 4), compress_type=method,
                    compresslevel=9)
    assert (tmp_path / "bomb.pth").stat().st_size < 1 << 20
    proc, rss, wall = _run("inspect", str(tmp_path / "bomb.pth"), cwd=tmp_path)
    _refused(proc, "compressed")
    _bounded(rss, wall, "a refused bomb")


@pytest.mark.parametrize("member", ["data.pkl", "data/0"])
def test_a_member_claiming_more_bytes_than_the_file_is_refused_before_reading(
        tmp_path, member):
    """A stored member whose directory entry claims 2.4 GB in a file of a few KB (found by
    fuzzing): zipfile sized its first read by the claim, a 2.4 GB allocation that under an
    address-space limit ended in a MemoryError traceback. Refused, one line, nothing read."""
    path = tmp_path / "lying.pth"
    torch.save({"w": torch.ones(4)}, path)
    data = bytearray(path.read_bytes())
    name = next(i.filename for i in zipfile.ZipFile(path).infolist()
                if i.filename.endswith(member))
    entry = data.index(b"PK\x01\x02")
    while not data[entry + 46:].startswith(name.encode()):  # this member's directory entry
        entry = data.index(b"PK\x01\x02", entry + 4)
    struct.pack_into("<I", data, entry + 20, 2_432_696_735)  # its compressed size
    path.write_bytes(bytes(data))
    proc, rss, wall = _run("inspect", str(path), cwd=tmp_path)
    _refused(proc, "claims more bytes")
    _bounded(rss, wall, "a refused lying member")


def test_deeply_nested_pickle_is_one_line(tmp_path):
    """5,000 nested dicts, each holding a tensor: refused without a RecursionError."""
    from hostile import tensor_ops, value

    level = b"}(" + value("w") + tensor_ops(T("w", numel=4, size=(4,))) + value("n")
    ops = b"\x80\x02" + level * 5000 + b"}" + b"u" * 5000 + b"."
    path = Archive(ops, {"0": floats(4)}).write(tmp_path / "deep.pth")
    proc, rss, wall = _run("inspect", str(path), cwd=tmp_path)
    _refused(proc, "deep.pth", "nested")
    _bounded(rss, wall, "5,000-deep nesting")


# -- sharded indexes -------------------------------------------------------------------

@pytest.mark.parametrize("shard", ["../outside.safetensors", "/etc/passwd", "sub/../x",
                                   "model.safetensors.index.json", 7, None, ""])
def test_index_shards_stay_inside_the_folder(tmp_path, shard):
    from safetensors.numpy import save_file

    folder = tmp_path / "model"
    folder.mkdir()
    save_file({"w": np.ones(2, np.float32)}, str(tmp_path / "outside.safetensors"))
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"w": shard}}))
    proc, _, _ = _run("inspect", str(index), cwd=tmp_path)
    _refused(proc, "index")


def test_index_nesting_and_size_are_bounded(tmp_path):
    index = tmp_path / "deep.safetensors.index.json"
    index.write_text("[" * 100_000 + "]" * 100_000)
    proc, rss, wall = _run("inspect", str(index), cwd=tmp_path)
    _refused(proc, "deep.safetensors.index.json")
    _bounded(rss, wall, "a 100,000-deep index")


# -- shapes in every format ------------------------------------------------------------

def _safetensors_with_shape(path: Path, shape: list[int]) -> Path:
    header = json.dumps({"w": {"dtype": "F32", "shape": shape, "data_offsets": [0, 0]}})
    raw = header.encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)
    return path


@pytest.mark.parametrize("shape", [[0, 2**62], [1] * 33 + [0]], ids=["0x2^62", "34 dims"])
def test_absurd_safetensors_shapes(tmp_path, shape):
    path = _safetensors_with_shape(tmp_path / "s.safetensors", shape)
    proc, rss, wall = _run("inspect", str(path), cwd=tmp_path)
    _refused(proc, "s.safetensors")
    _bounded(rss, wall, str(shape[:3]))


def test_ckpt_with_33_dimensions(tmp_path):
    from ms_port.read.ckpt import _record_header

    raw = _record_header(b"w", (1,) * 33, b"Float32", 4) + np.ones(1, np.float32).tobytes()
    (tmp_path / "bad.ckpt").write_bytes(raw)
    proc, _, _ = _run("inspect", str(tmp_path / "bad.ckpt"), cwd=tmp_path)
    _refused(proc, "bad.ckpt")


# -- linear time on attacker-sized inputs ----------------------------------------------

def test_prefix_stripping_is_linear(tmp_path):
    from safetensors.numpy import save_file

    deep = "module." * 150_000  # a 1 MB name
    save_file({deep + "w": np.ones(1, np.float32), deep + "b": np.ones(1, np.float32)},
              str(tmp_path / "p.safetensors"))
    start = time.perf_counter()
    source = read_source(tmp_path / "p.safetensors")
    assert time.perf_counter() - start < 10  # quadratic took minutes
    assert sorted(source.tensors) == ["b", "w"] and len(source.stripped) == 150_000


def test_ckpt_duplicate_check_is_linear(tmp_path):
    from ms_port.read.ckpt import CkptWriter

    with open(tmp_path / "many.ckpt", "wb") as f, CkptWriter(f) as w:
        for i in range(30_000):
            w.write(f"t{i}", np.ones(1, np.float32))
    start = time.perf_counter()
    assert len(read_source(tmp_path / "many.ckpt")) == 30_000
    assert time.perf_counter() - start < 20


def test_memory_of_inspect_is_bounded_by_the_file(tmp_path):
    """A legitimate 64 MiB checkpoint: inspect never loads the data (peak well below it)."""
    torch.save({"w": torch.zeros(16 << 20)}, tmp_path / "big.pth")
    proc, rss, _ = _run("inspect", str(tmp_path / "big.pth"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert rss < 300, f"{rss:.0f} MiB"


_ = os  # the children inherit os.environ as is
