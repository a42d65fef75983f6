"""Interrupted runs, full disks and random state dicts: nothing lost, nothing half-written."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ms_port
from ms_port.errors import MsPortError, WriteError
from ms_port.read.sources import read_source
from ms_port.read.targets import from_infos

TORCH_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64,
                torch.int32, torch.int8, torch.uint8, torch.bool]


def _identity_target(path: Path):
    """A template target with exactly the source's (unwrapped) names and shapes."""
    return from_infos(read_source(path).tensors.values(), "identity")


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


@pytest.fixture
def big_pth(tmp_path) -> Path:
    """~96 MiB of float32 in 24 tensors: long enough to be killed mid-write."""
    gen = torch.Generator().manual_seed(0)
    state = {f"layers.{i}.weight": torch.randn(1024, 1024, generator=gen) for i in range(24)}
    path = tmp_path / "big.pth"
    torch.save(state, path)
    return path


def _convert_cmd(src: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "ms_port", "convert", str(src), "--target", str(src),
            "-o", str(out), "--quiet", *extra]


def _temps(out: Path) -> list[Path]:
    return list(out.parent.glob(".ms-port-*.tmp"))


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_interrupted_run_keeps_old_output(big_pth, tmp_path, sig):
    out = tmp_path / "out.ckpt"
    out.write_bytes(b"previous output")
    for delay in (0.5, 1.5, 3.0):
        proc = subprocess.Popen(_convert_cmd(big_pth, out, "--force"),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        proc.send_signal(sig)
        proc.wait(timeout=120)
        # either the new file is complete and verified, or the old one is untouched
        data = out.read_bytes()
        if data != b"previous output":
            assert ms_port.inspect(out).total_tensors == 24
            out.write_bytes(b"previous output")
        if sig == signal.SIGINT:
            assert not _temps(out), "SIGINT must clean its temporary file"
    # a following run (even one that refuses) removes what killed runs left behind
    result = subprocess.run(_convert_cmd(big_pth, out), capture_output=True, text=True)
    assert result.returncode == 2 and "exists" in result.stderr
    assert not _temps(out)
    assert out.read_bytes() == b"previous output"


def test_full_disk_is_a_clean_error(big_pth, tmp_path, monkeypatch):
    out = tmp_path / "out.ckpt"
    out.write_bytes(b"previous output")
    from ms_port.read import ckpt

    real_put = ckpt.CkptWriter._put
    written = {"n": 0}

    def filling_put(self, data):
        written["n"] += len(data)
        if written["n"] > 20 << 20:
            raise WriteError("disk full", path=str(out)) from OSError(errno.ENOSPC, "No space")
        return real_put(self, data)

    monkeypatch.setattr(ckpt.CkptWriter, "_put", filling_put)
    with pytest.raises(MsPortError, match="disk full"):
        ms_port.convert(big_pth, target=_identity_target(big_pth), output=out, force=True)
    assert out.read_bytes() == b"previous output"
    assert not _temps(out)
    assert not _preparing_threads()  # the worker preparing the next tensor stopped too


def test_oserror_while_writing_names_the_output(big_pth, tmp_path, monkeypatch):
    out = tmp_path / "out.ckpt"
    import ms_port.write.writers as writers

    def no_space(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(writers, "fsynced", no_space)
    with pytest.raises(WriteError, match=r"out\.ckpt: cannot write \(No space left on device\)"):
        ms_port.convert(big_pth, target=_identity_target(big_pth), output=out)
    assert not out.exists() and not _temps(out)


def _preparing_threads() -> list[str]:
    import threading

    return [t.name for t in threading.enumerate() if t.name.startswith("ms-port-")]


def test_a_tensor_failing_to_read_while_the_last_is_written_is_a_clean_error(tmp_path):
    """Tensors are read in a worker thread while the one before is written: its error
    reaches the caller, nothing is put in place and the worker does not outlive it."""
    from ms_port.errors import SourceError
    from ms_port.match.plan import make_plan
    from ms_port.read.sources import Source
    from ms_port.read.tensors import TensorInfo
    from ms_port.write.writers import write_plan

    def loader(i: int):
        def load():
            if i == 5:
                raise SourceError("mem.safetensors: tensor 't5' lies past the end of the file",
                                  path="mem.safetensors")
            return np.full((256, 256), i, np.float32)
        return load

    infos = [TensorInfo(f"t{i}", (256, 256), "float32", loader(i)) for i in range(9)]
    source = Source("mem.safetensors", "safetensors", {t.name: t for t in infos})
    plan = make_plan(source, from_infos(infos, "same"))
    out = tmp_path / "out.ckpt"
    out.write_bytes(b"previous output")
    with pytest.raises(SourceError, match="'t5' lies past the end"):
        write_plan(plan, out, force=True)
    assert out.read_bytes() == b"previous output" and not _temps(out)
    assert not _preparing_threads()


@pytest.mark.parametrize("fmt", ["safetensors", "ckpt"])
def test_readback_sees_the_whole_file_however_late_the_fsync_starts(tmp_path, monkeypatch, fmt):
    """The readback opens the file anew while the fsync runs in a worker: the writer's
    buffered tail must be in the file before either starts (a late worker, here)."""
    import ms_port.write.writers as writers
    from ms_port.match.plan import make_plan
    from ms_port.read.sources import Source
    from ms_port.read.tensors import TensorInfo

    real = writers.fsynced
    monkeypatch.setattr(writers, "fsynced", lambda f: (time.sleep(0.05), real(f)))
    arrays = {"big": np.ones((1024, 1024), np.float32), "small": np.arange(16, dtype=np.float32)}
    infos = [TensorInfo(n, a.shape, "float32", lambda a=a: a) for n, a in arrays.items()]
    source = Source(f"mem.{fmt}", fmt, {t.name: t for t in infos})
    result = writers.write_plan(make_plan(source, from_infos(infos, "same")),
                                tmp_path / f"out.{fmt}", format=fmt)
    assert result.readback == "bit-exact"
    assert result.nbytes == (tmp_path / f"out.{fmt}").stat().st_size


@pytest.mark.parametrize("fmt", ["safetensors", "ckpt"])
@pytest.mark.parametrize("refused", [False, True, "raises"],
                         ids=["started", "unsupported", "failing"])
def test_writeback_is_started_behind_the_writer(tmp_path, monkeypatch, fmt, refused):
    """While a file is written, the kernel is asked, from the fsync thread and not the
    writing one, to start putting it on the disk, from its first byte; a system that
    refuses (or a call that fails) is asked once and then left to the fsync. Bit-exact
    either way."""
    import threading

    import ms_port.write.writers as writers
    from ms_port.match.plan import make_plan
    from ms_port.read.sources import Source
    from ms_port.read.tensors import TensorInfo

    asked: list[tuple[int, int, int, str]] = []

    def sync_file_range(fd, offset, nbytes, flags):
        asked.append((offset, nbytes, flags, threading.current_thread().name))
        if refused == "raises":
            raise OSError("no such call here")
        return -1 if refused else 0

    monkeypatch.setattr(writers, "_SYNC_FILE_RANGE", sync_file_range)
    monkeypatch.setattr(writers, "WRITE_BEHIND", 50_000)
    arrays = {f"t{i}": np.full((64, 96 + i), i, np.float32) for i in range(12)}
    infos = [TensorInfo(n, a.shape, "float32", lambda a=a: a) for n, a in arrays.items()]
    source = Source(f"mem.{fmt}", fmt, {t.name: t for t in infos})
    out = tmp_path / f"out.{fmt}"
    result = writers.write_plan(make_plan(source, from_infos(infos, "same")), out,
                                format=fmt)
    assert result.readback == "bit-exact"
    assert asked[0][:3] == (0, asked[0][1], 2) and asked[0][1] >= 50_000
    assert all(thread.startswith("ms-port-fsync") for *_, thread in asked)
    assert len(asked) == 1 if refused else asked[-1][0] + asked[-1][1] <= out.stat().st_size


def test_writeback_requests_follow_each_other_and_wait_for_the_last(tmp_path, monkeypatch):
    """Each request starts where the last ended and covers at least WRITE_BEHIND bytes;
    none is made while the last is still running (the next then covers all since)."""
    from concurrent.futures import Future

    import ms_port.write.writers as writers

    asked, seen, running = [], [], []

    class Pool:
        def submit(self, fn, fd, offset, nbytes, flags):
            asked.append((offset, nbytes))
            future = running.pop() if running else Future()
            if not future.running():
                future.set_result(0)
            return future

    step = 1000
    monkeypatch.setattr(writers, "WRITE_BEHIND", step)
    with open(tmp_path / "out", "wb") as f:
        behind = writers._WriteBehind(f, Pool(), lambda *a: seen.append(a))
        behind._fn = object()  # called only through the pool above
        for i, n in enumerate([step // 2, step // 2, step * 3, 10, step, step]):
            if i == 4:
                slow = Future()
                slow.set_running_or_notify_cancel()  # the request made now keeps running
                running.append(slow)
            f.write(b"x" * n)
            behind("write", f.tell(), 0)
        assert asked == [(0, step), (step, 3 * step), (4 * step, step + 10)]
        slow.set_result(0)
        f.write(b"x")
        behind("write", f.tell(), 0)
    assert asked[-1] == (5 * step + 10, step + 1) and len(seen) == 7


def _change_file(path: Path, where: float, size: int) -> None:
    """Flip the byte at ``where`` of ``size`` bytes in ``path``, or cut the file there
    when ``where`` is negative."""
    at = int(size * abs(where))
    with open(path, "r+b") as f:
        if where < 0:
            f.truncate(at)
        else:
            f.seek(at)
            byte = f.read(1)[0]
            f.seek(at)
            f.write(bytes([byte ^ 0x01]))


def _corrupt_output(monkeypatch, where: float, when: str, size: int) -> None:
    """Change the temporary output (see :func:`_change_file`; ``size``: its full length):
    once the byte is written, just before the check of the tensor holding it
    (``"check"``); once every tensor was compared, just before the framing is read
    (``"finish"``); or just before a whole-file read-back (``"readback"``, a ``.pth``)."""
    import ms_port.write.proof as proof
    import ms_port.write.writers as writers

    if when == "readback":
        real_readback = writers.readback

        def corrupted(plan, path, **kwargs):
            _change_file(Path(path), where, size)
            return real_readback(plan, path, **kwargs)

        monkeypatch.setattr(writers, "readback", corrupted)
    elif when == "check":
        real_written, changed = proof.Checks.written, []

        def written(self, match, spans):
            self._file.flush()
            if not changed and spans[-1][0] + spans[-1][1] > int(size * where):
                _change_file(self._path, where, size)
                changed.append(match.target)
            return real_written(self, match, spans)

        monkeypatch.setattr(proof.Checks, "written", written)
    else:
        real_finish = proof.Checks.finish

        def finish(self):
            for *_, compared in self._checks:
                compared.result()  # no comparison is reading the file while it changes
            _change_file(self._path, where, size)
            return real_finish(self)

        monkeypatch.setattr(proof.Checks, "finish", finish)


def _four_tensors_plan(values=(0, 1, 2, 3)):
    from ms_port.match.plan import make_plan
    from ms_port.read.sources import Source
    from ms_port.read.tensors import TensorInfo

    arrays = {f"t{i}": np.full((64, 64), v, np.float32) for i, v in enumerate(values)}
    infos = [TensorInfo(n, a.shape, "float32", lambda a=a: a) for n, a in arrays.items()]
    return make_plan(Source("mem.safetensors", "safetensors", {t.name: t for t in infos}),
                     from_infos(infos, "same"))


@pytest.mark.parametrize("fmt, crc, where, when, says", [
    ("ckpt", False, 0.9, "check", r"1 tensors differ from their source after writing: t3"),
    ("ckpt", True, 0.9, "finish", r"fails its own CRC check"),  # after t3 was compared
    ("ckpt", False, -0.6, "finish", r"cannot be read back"),  # cut inside a record
    ("ckpt", False, -0.5, "finish", r"read back 2 tensors, expected 4 \(missing \['t2', 't3'\]"),
    ("safetensors", False, 0.9, "check", r"1 tensors differ from their source after writing: t3"),
    ("safetensors", False, -0.5, "finish", r"cannot be read back"),
    ("pth", False, 0.9, "readback", r"cannot be read back .*'archive/data/3' is corrupt"),
    ("pth", False, -0.5, "readback", r"cannot be read back"),
])
def test_readback_says_no_to_a_file_changed_after_writing(tmp_path, monkeypatch, fmt, crc,
                                                          where, when, says):
    """The readback is the claim "bit-exact": a flipped bit in a tensor's data as it is
    compared, a broken CRC or a cut file once all were compared each fail it, naming the
    tensor, and nothing is put in place."""
    from ms_port.errors import ReadbackError
    from ms_port.write.writers import write_plan

    plan = _four_tensors_plan()
    out = tmp_path / f"out.{fmt}"
    write_plan(plan, out, format=fmt, crc=crc)  # untouched: bit-exact
    size = out.stat().st_size
    out.unlink()
    _corrupt_output(monkeypatch, where, when, size)
    with pytest.raises(ReadbackError, match=says):
        write_plan(plan, out, format=fmt, crc=crc)
    assert not out.exists() and not _temps(out)


@pytest.mark.parametrize("fmt", ["ckpt", "safetensors"])
@pytest.mark.parametrize("fault", ["elsewhere", "unreported"])
def test_a_tensor_the_file_lists_elsewhere_than_its_compared_bytes_fails(
        tmp_path, monkeypatch, fmt, fault):
    """Each tensor is compared where the writer says it wrote it; the finished file's
    framing must then put it exactly there. A writer that reports a twin's bytes (equal
    data, so the comparison passes) or that never reports a tensor is caught, by name."""
    import ms_port.write.proof as proof
    from ms_port.errors import ReadbackError
    from ms_port.write.writers import write_plan

    plan = _four_tensors_plan(values=(0, 1, 1, 3))  # t1 and t2 hold the same values
    real_written, seen = proof.Checks.written, {}

    def written(self, match, spans):
        seen[match.target] = spans
        if match.target == "t2":
            if fault == "unreported":
                return None
            spans = seen["t1"]
        return real_written(self, match, spans)

    monkeypatch.setattr(proof.Checks, "written", written)
    out = tmp_path / f"out.{fmt}"
    with pytest.raises(ReadbackError, match=r"1 tensors differ from their source after "
                                            r"writing: t2;"):
        write_plan(plan, out, format=fmt)
    assert not out.exists() and not _temps(out)


def test_each_tensor_is_compared_beside_the_writer(tmp_path, monkeypatch):
    """The comparisons run in their own thread while the writer goes on: the first is
    done before the second tensor is written (a check deferred to the end would time out
    here)."""
    import threading

    import ms_port.write.proof as proof
    from ms_port.write.writers import write_plan

    events: list[tuple[str, str, str]] = []
    real_same, real_written = proof.Checks._same, proof.Checks.written

    def same(self, match, spans):
        events.append(("compared", match.target, threading.current_thread().name))
        return real_same(self, match, spans)

    def written(self, match, spans):
        events.append(("written", match.target, threading.current_thread().name))
        real_written(self, match, spans)
        if match.target == "t0":
            assert self._checks[0][2].result(timeout=30)  # before t1 is written

    monkeypatch.setattr(proof.Checks, "_same", same)
    monkeypatch.setattr(proof.Checks, "written", written)
    result = write_plan(_four_tensors_plan(), tmp_path / "out.ckpt")
    assert result.readback == "bit-exact"
    compared = [(t, thread) for kind, t, thread in events if kind == "compared"]
    assert [t for t, _ in compared] == ["t0", "t1", "t2", "t3"]
    assert all(thread.startswith("ms-port-check") for _, thread in compared)
    assert [e[:2] for e in events].index(("compared", "t0")) < \
        [e[:2] for e in events].index(("written", "t1"))


@pytest.mark.parametrize("fmt", ["ckpt", "safetensors"])
def test_the_check_compares_with_the_plan_not_with_what_the_writer_was_handed(
        tmp_path, monkeypatch, fmt):
    """A fault between the plan and the writer (a value changed in the array handed to
    it, as a reused buffer overwritten too early would) is caught: the checks load the
    plan's data themselves, so they never agree with the writer's copy by construction."""
    import ms_port.write.writers as writers
    from ms_port.errors import ReadbackError

    real = writers._prepared

    def faulty(plan, nonfinite, digests):
        def arrays():
            with real(plan, nonfinite, digests) as items:
                for match, data in items:
                    if match.target == "t2":
                        raw = np.concatenate([np.array(c) for c in data.chunks])
                        raw[7] += 1  # one byte off
                        data = writers._Data(data.shape, data.dtype, [raw])
                    yield match, data
        return contextlib.closing(arrays())

    monkeypatch.setattr(writers, "_prepared", faulty)
    out = tmp_path / f"out.{fmt}"
    with pytest.raises(ReadbackError, match=r"1 tensors differ from their source after "
                                            r"writing: t2;"):
        writers.write_plan(_four_tensors_plan(), out, format=fmt)
    assert not out.exists() and not _temps(out)


_names = st.lists(
    st.from_regex(r"[a-z][a-z0-9_]{0,6}(\.[a-z0-9_]{1,6}){0,3}", fullmatch=True),
    min_size=1, max_size=6, unique=True)
_shapes = st.lists(st.integers(1, 5), min_size=0, max_size=4).map(tuple)


@st.composite
def state_dicts(draw):
    names = draw(_names)
    state = {}
    for name in names:
        dtype = draw(st.sampled_from(TORCH_DTYPES))
        shape = draw(_shapes)
        seed = draw(st.integers(0, 2**16))
        gen = torch.Generator().manual_seed(seed)
        if dtype.is_floating_point:
            value = torch.randn(shape, generator=gen).to(dtype)
        elif dtype == torch.bool:
            value = torch.randint(0, 2, shape, generator=gen).bool()
        else:
            value = torch.randint(0, 100, shape, generator=gen).to(dtype)
        state[name] = value
    wrapper = draw(st.sampled_from(["none", "state_dict", "module", "model+epoch"]))
    return state, wrapper


def _wrap(state: dict, wrapper: str):
    if wrapper == "state_dict":
        return {"state_dict": state}
    if wrapper == "module":
        return {f"module.{k}": v for k, v in state.items()}
    if wrapper == "model+epoch":
        return {"model": state, "epoch": 3}
    return state


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=state_dicts(), fmt=st.sampled_from(["ckpt", "safetensors"]))
def test_random_state_dicts_round_trip_bit_exactly(tmp_path, case, fmt):
    state, wrapper = case
    src = tmp_path / f"src-{os.getpid()}-{time.monotonic_ns()}.pth"
    torch.save(_wrap(state, wrapper), src)
    out = src.with_suffix(f".{fmt}")
    try:
        report = ms_port.convert(src, target=_identity_target(src), output=out, format=fmt)
    except MsPortError:
        assert not out.exists()  # a clean refusal leaves nothing behind
        return
    assert report.ok and report.written.readback == "bit-exact"
    written = read_source(out)
    assert set(written.tensors) == set(state)
    for name, tensor in state.items():
        want = ms_port.read.sources.torch_to_numpy(tensor)
        assert _same_bits(written[name].load(), want), name


def _mutations(data: bytes, count: int, seed: int):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        buf = bytearray(data)
        kind = rng.integers(3)
        if kind == 0:  # flip bytes
            for pos in rng.integers(0, len(buf), size=rng.integers(1, 8)):
                buf[pos] ^= int(rng.integers(1, 256))
        elif kind == 1:  # truncate
            del buf[int(rng.integers(0, len(buf))):]
        else:  # splice a random block
            pos = int(rng.integers(0, len(buf)))
            buf[pos:pos] = rng.bytes(int(rng.integers(1, 64)))
        yield bytes(buf)


def _small_files(tmp_path: Path) -> dict[str, Path]:
    gen = torch.Generator().manual_seed(7)
    state = {"a.weight": torch.randn(4, 3, generator=gen),
             "a.bias": torch.randn(4, generator=gen).half(),
             "b.running_var": torch.rand(4, generator=gen).bfloat16(), "n": torch.tensor(7)}
    files = {"zip": tmp_path / "s.pth", "legacy": tmp_path / "s_legacy.pth",
             "safetensors": tmp_path / "s.safetensors", "ckpt": tmp_path / "s.ckpt"}
    torch.save(state, files["zip"])
    torch.save(state, files["legacy"], _use_new_zipfile_serialization=False)
    from safetensors.torch import save_file

    save_file(state, files["safetensors"])
    assert ms_port.convert(files["zip"], target=_identity_target(files["zip"]),
                           output=files["ckpt"]).ok
    return files


@pytest.mark.parametrize("fmt", ["zip", "legacy", "safetensors", "ckpt"])
def test_fuzzed_readers_return_or_refuse(tmp_path, fmt):
    """Mutated real checkpoints: every outcome is a Source or an MsPortError."""
    original = _small_files(tmp_path)[fmt].read_bytes()
    outcomes = {"read": 0, "refused": 0}
    # a seed per format that is the same in every run (str's hash() is not)
    seed = zlib.crc32(fmt.encode()) % 1000
    for i, data in enumerate(_mutations(original, count=150, seed=seed)):
        path = tmp_path / f"m{i}{'.safetensors' if fmt == 'safetensors' else ''}"
        path.write_bytes(data)
        try:
            source = read_source(path)
            for info in source:
                info.load()
            outcomes["read"] += 1
        except MsPortError as exc:
            assert str(path) in exc.message or path.name in exc.message, exc.message
            outcomes["refused"] += 1
        path.unlink()
    assert outcomes["refused"] > 0  # the mutations did break files


def test_nonfinite_weights_are_named_and_check_finite_refuses(tmp_path):
    state = {"ok": torch.ones(3), "bad": torch.tensor([1.0, float("nan"), float("inf")]),
             "half": torch.tensor([float("nan")]).bfloat16(), "count": torch.tensor(3)}
    src = tmp_path / "nan.pth"
    torch.save(state, src)
    out = tmp_path / "nan.ckpt"
    report = ms_port.convert(src, target=_identity_target(src), output=out)
    assert report.ok and report.nonfinite == {"bad": 2, "half": 1}
    out2 = tmp_path / "strict.ckpt"
    with pytest.raises(MsPortError, match=r"nan\.pth: NaN/Inf values in 2 tensors: bad \(2\)"):
        ms_port.convert(src, target=_identity_target(src), output=out2, check_finite=True)
    assert not out2.exists() and not _temps(out2)


class _Payload:
    """Pickles to a call of ``func(*args)``: what a hostile checkpoint smuggles in."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return (self.func, self.args)


def _hostile(kind: str, marker: Path) -> object:
    import builtins

    touch = f"open({str(marker)!r}, 'w').close()"
    return {
        "os.system": _Payload(os.system, f"touch {marker}"),
        "eval": _Payload(builtins.eval, touch),
        "builtins.exec": _Payload(builtins.exec, touch),
        "__import__": _Payload(builtins.__import__, "this"),  # prints the Zen on import
    }[kind]


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
@pytest.mark.parametrize("kind", ["os.system", "eval", "builtins.exec", "__import__"])
def test_hostile_pickles_are_refused_and_never_run(tmp_path, kind, legacy, capfd):
    marker = tmp_path / "ran"
    path = tmp_path / "hostile.pth"
    torch.save({"w": torch.ones(2), "x": _hostile(kind, marker)}, path,
               _use_new_zipfile_serialization=not legacy)
    result = subprocess.run([sys.executable, "-m", "ms_port", "inspect", str(path)],
                            capture_output=True, text=True)
    assert result.returncode == 2
    assert "refused to unpickle" in result.stderr and "--unsafe-pickle" in result.stderr
    assert "Nothing was executed" in result.stderr
    assert not marker.exists() and "Beautiful is better" not in result.stdout
    out = tmp_path / "o.ckpt"
    result = subprocess.run([sys.executable, "-m", "ms_port", "convert", str(path), "--target",
                             str(path), "-o", str(out)], capture_output=True, text=True)
    assert result.returncode == 2 and not out.exists() and not marker.exists()


def test_crc_trailer_on_request(tmp_path):
    import mindspore as ms

    src = _save_small(tmp_path)
    out = tmp_path / "crc.ckpt"
    report = ms_port.convert(src, target=_identity_target(src), output=out, crc=True)
    assert report.ok and report.written.crc
    assert out.read_bytes()[-17:-10] == b"crc_num"
    assert set(ms.load_checkpoint(str(out), crc_check=True)) == {"a", "b"}
    damaged = bytearray(out.read_bytes())
    damaged[40] ^= 0x01
    out.write_bytes(bytes(damaged))
    with pytest.raises(MsPortError, match=r"crc\.ckpt: CRC check failed"):
        read_source(out)


def test_unreadable_source_is_named(tmp_path, monkeypatch):
    src = _save_small(tmp_path)
    real_access = os.access
    monkeypatch.setattr(os, "access",
                        lambda p, mode: False if Path(p) == src else real_access(p, mode))
    with pytest.raises(MsPortError, match=r"small\.pth: permission denied; make the file"):
        read_source(src)


def _save_small(tmp_path: Path) -> Path:
    path = tmp_path / "small.pth"
    torch.save({"a": torch.randn(3, 3), "b": torch.arange(4)}, path)
    return path


def test_renameat2_publishes_without_replacing(tmp_path):
    """Where a filesystem has no hard links, renameat2(RENAME_NOREPLACE) publishes: it
    moves the temporary file into a free name, and refuses a taken one, leaving both."""
    import ms_port.write.writers as writers
    from ms_port._libc import libc_function
    from ms_port.errors import OutputExistsError

    assert libc_function("no_such_function_in_any_libc", None) is None
    if libc_function("renameat2", None) is None:  # types set on a copy of its own
        pytest.skip("no renameat2 in this C library")
    tmp, out = tmp_path / ".ms-port-1.tmp", tmp_path / "out.ckpt"
    tmp.write_bytes(b"new")
    writers._renameat2_noreplace(tmp, out)
    assert out.read_bytes() == b"new" and not tmp.exists()
    tmp.write_bytes(b"newer")
    with pytest.raises(OutputExistsError, match=r"out\.ckpt exists"):
        writers._renameat2_noreplace(tmp, out)
    assert out.read_bytes() == b"new" and tmp.read_bytes() == b"newer"


def _open_on(path_part: str) -> list[str]:
    """This process's open descriptors and mappings whose file name contains ``path_part``."""
    fds = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
           if os.path.exists(f"/proc/self/fd/{fd}")]
    with open("/proc/self/maps") as f:
        maps = [line.split(None, 5)[-1].strip() for line in f]
    return [name for name in fds + maps if path_part in name]


def test_a_check_that_fails_leaves_no_map_or_descriptor_on_the_temporary_file(
        tmp_path, monkeypatch):
    """A comparison interrupted halfway (here an error from inside it): the error comes
    through, and even while it is held (cyclic garbage collection off) nothing keeps the
    deleted temporary file open: the failed frames' views of the map are cleared."""
    import gc

    import ms_port.write.proof as proof
    from ms_port.write.writers import write_plan

    real, calls = proof.same_bits, []

    def interrupted(a, b):
        calls.append(a.size)
        if len(calls) == 3:
            raise MemoryError("interrupted in the middle of a comparison")
        return real(a, b)

    monkeypatch.setattr(proof, "same_bits", interrupted)
    gc.disable()
    try:
        with pytest.raises(MemoryError, match="interrupted in the middle") as caught:
            write_plan(_four_tensors_plan(), tmp_path / "out.ckpt")
        assert caught.value is not None and not _open_on(".ms-port-")
    finally:
        gc.enable()
    assert not list(tmp_path.iterdir())


def test_closing_the_checks_closes_their_descriptor_even_when_interrupted(tmp_path):
    from ms_port.write.proof import Checks

    path = tmp_path / "out.ckpt"
    with open(path, "w+b") as f:
        checks = Checks(_four_tensors_plan(), f, path, format="ckpt")
        fd = checks._fd

        def interrupted(**kwargs):
            raise KeyboardInterrupt

        checks._pool.shutdown, real = interrupted, checks._pool.shutdown
        with pytest.raises(KeyboardInterrupt):
            checks.close()
        real()
    with pytest.raises(OSError):
        os.fstat(fd)


@pytest.mark.parametrize("fmt", ["ckpt", "safetensors"])
def test_each_check_maps_only_its_tensor_and_lets_its_pages_go_as_it_goes(
        tmp_path, monkeypatch, fmt):
    """A check maps its tensor's bytes only (not the file from byte 0: an address-space
    limit would refuse that for late tensors of a large file), and a tensor split into
    records is compared piece by piece, a release step at a time, no joined copy made;
    a flipped bit in any record is still seen."""
    import mmap

    import ms_port.write.proof as proof
    from ms_port.errors import ReadbackError
    from ms_port.read.ckpt import CkptWriter
    from ms_port.write.writers import write_plan

    monkeypatch.setitem(CkptWriter.__init__.__kwdefaults__, "slice_bytes", 4096)
    monkeypatch.setattr(proof, "_RELEASE_BYTES", 3000)
    maps, steps = [], []
    real_map, real_mapped = mmap.mmap, proof._mapped

    def recording_map(fd, length, **kwargs):
        if length:  # the framing check's whole-file map (length 0) is not a check's
            maps.append((kwargs.get("offset", 0), length))
        return real_map(fd, length, **kwargs)

    def recording_mapped(buf, base, spans):
        for step in real_mapped(buf, base, spans):
            steps.append(step.size)
            yield step

    monkeypatch.setattr(proof.mmap, "mmap", recording_map)
    monkeypatch.setattr(proof, "_mapped", recording_mapped)
    plan = _four_tensors_plan()  # 16 KiB each: 4 records each in a .ckpt
    out = tmp_path / f"out.{fmt}"
    assert write_plan(plan, out, format=fmt).readback == "bit-exact"
    tensor = 64 * 64 * 4
    assert len(maps) == 4 and maps[-1][0] >= 3 * tensor - mmap.ALLOCATIONGRANULARITY
    assert all(length <= tensor + 4 * 64 + mmap.ALLOCATIONGRANULARITY for _, length in maps)
    assert max(steps) <= 3000 and sum(steps) == 4 * tensor
    if fmt == "ckpt":
        size = out.stat().st_size
        out.unlink()
        for where in (0.3, 0.55, 0.99):  # in t1's first record, t2's middle one, t3's last
            _corrupt_output(monkeypatch, where, "check", size)
            with pytest.raises(ReadbackError, match=r"1 tensors differ .*: t[123];"):
                write_plan(plan, out, format=fmt)


@pytest.mark.parametrize("fmt", ["safetensors", "pth"])
def test_a_config_json_beside_the_output_is_not_the_outputs_business(tmp_path, fmt):
    """The read-back reads the written file alone: an unreadable config.json in the
    output's folder (a Hugging Face directory being edited) is not read."""
    (tmp_path / "config.json").write_text("{ not json")
    result = ms_port.write.writers.write_plan(_four_tensors_plan(), tmp_path / f"out.{fmt}",
                                              format=fmt)
    assert result.readback == "bit-exact"


def _fake_fallocate(err: int, calls: list):
    import ctypes

    def fallocate(fd, mode, offset, nbytes):
        calls.append(nbytes)
        ctypes.set_errno(err)
        return -1
    return fallocate


@pytest.mark.parametrize("fmt, crc", [("ckpt", False), ("ckpt", True), ("safetensors", False)])
def test_the_outputs_blocks_are_reserved_exactly_and_no_room_fails_before_writing(
        tmp_path, monkeypatch, fmt, crc):
    """The output's size is known before it is written, and that much is reserved on the
    disk (fallocate): exactly the finished file's size, so nothing reserved is left past
    its end. A disk without room fails at once, naming the bytes needed, nothing left
    behind; a filesystem refusing fallocate only means writing without it."""
    import errno

    import ms_port.write.writers as writers
    from ms_port.errors import WriteError

    if writers._FALLOCATE is None:
        pytest.skip("no fallocate in this C library")
    real, asked = writers._FALLOCATE, []

    def recording(fd, mode, offset, nbytes):
        asked.append(nbytes)
        return real(fd, mode, offset, nbytes)

    monkeypatch.setattr(writers, "_FALLOCATE", recording)
    out = tmp_path / f"out.{fmt}"
    result = writers.write_plan(_four_tensors_plan(), out, format=fmt, crc=crc)
    assert out.stat().st_size == result.nbytes and asked == [result.nbytes]
    assert out.stat().st_blocks * 512 < result.nbytes + (64 << 10)

    calls: list[int] = []
    monkeypatch.setattr(writers, "_FALLOCATE", _fake_fallocate(errno.ENOSPC, calls))
    full = tmp_path / f"full.{fmt}"
    with pytest.raises(WriteError, match=rf"full\.{fmt}: cannot write \(No space left on "
                                         rf"device: the output needs {result.nbytes} bytes\)"):
        writers.write_plan(_four_tensors_plan(), full, format=fmt, crc=crc)
    assert calls == [result.nbytes] and not full.exists() and not _temps(full)

    monkeypatch.setattr(writers, "_FALLOCATE", _fake_fallocate(errno.EOPNOTSUPP, calls))
    plain = tmp_path / f"plain.{fmt}"
    writers.write_plan(_four_tensors_plan(), plain, format=fmt, crc=crc)
    assert plain.read_bytes() == out.read_bytes() and len(calls) == 2


def test_blocks_reserved_past_the_written_end_are_given_back(tmp_path, monkeypatch):
    import ms_port.write.writers as writers

    if writers._FALLOCATE is None:
        pytest.skip("no fallocate in this C library")
    real = writers._reserve
    monkeypatch.setattr(writers, "_reserve", lambda f, nbytes: real(f, nbytes + (8 << 20)))
    out = tmp_path / "out.ckpt"
    result = writers.write_plan(_four_tensors_plan(), out)
    assert out.stat().st_size == result.nbytes
    assert out.stat().st_blocks * 512 < result.nbytes + (1 << 20)  # not the extra 8 MiB


@pytest.mark.parametrize("fmt", ["ckpt", "safetensors"])
def test_a_big_endian_source_is_written_little_endian_and_proven(tmp_path, fmt):
    """Arrays a caller hands over in big-endian order are written as the files store them
    (little-endian) and the read-back agrees (it compared native bytes, and failed a
    right .ckpt while passing a safetensors file holding big-endian bytes)."""
    from ms_port.match.plan import make_plan
    from ms_port.read.sources import Source
    from ms_port.read.tensors import TensorInfo
    from ms_port.write.writers import write_plan

    values = np.arange(12, dtype=np.float32).reshape(3, 4)
    big = values.astype(">f4")
    info = TensorInfo("w", big.shape, "float32", lambda: big)
    plan = make_plan(Source("mem.safetensors", "safetensors", {"w": info}),
                     from_infos([info], "same"))
    out = tmp_path / f"out.{fmt}"
    assert write_plan(plan, out, format=fmt).readback == "bit-exact"
    assert _same_bits(read_source(out).tensors["w"].load(), values)


def test_a_chunk_size_that_splits_values_still_cuts_between_them(tmp_path, monkeypatch):
    import ms_port.write.writers as writers

    monkeypatch.setattr(writers, "CHUNK_BYTES", 6)  # not a multiple of float32's 4 bytes
    out = tmp_path / "out.ckpt"
    assert writers.write_plan(_four_tensors_plan(), out).readback == "bit-exact"
