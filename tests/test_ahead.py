"""Reading ahead (:mod:`ms_port.read.ahead`) and where readers say a tensor's bytes lie
(``TensorInfo.extents``): the stretches named are the tensor's stored bytes, in every
format that names them; the thread reads what it is asked, no more than its budget, drops
what a newer request replaces, and never fails the reader."""

from __future__ import annotations

import time

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

from ms_port.read.ahead import ReadAhead
from ms_port.read.ckpt import CkptWriter
from ms_port.read.sources import read_source


def _until(check, seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.01)
    return check()


def _stored(info) -> bytes:
    out = b""
    for path, offset, nbytes in info.extents:
        with open(path, "rb") as f:
            f.seek(offset)
            out += f.read(nbytes)
    return out


ARRAYS = {"a.weight": np.arange(24, dtype=np.float32).reshape(4, 6),
          "b.bias": np.arange(7, dtype=np.int64),
          "c.weight": np.linspace(-2, 2, 60).astype(ml_dtypes.bfloat16).reshape(3, 20),
          "empty": np.zeros((0, 3), np.float32)}


def test_safetensors_extents_are_the_tensors_bytes(tmp_path):
    path = tmp_path / "m.safetensors"
    save_file(ARRAYS, str(path))
    src = read_source(path)
    for name, array in ARRAYS.items():
        info = src.tensors[name]
        assert [(p, n) for p, _, n in info.extents] == [(str(path), array.nbytes)], name
        assert _stored(info) == array.tobytes(), name


def test_ckpt_extents_are_every_pieces_bytes(tmp_path):
    """A tensor split into pieces (MindSpore's 512 MiB records) names each piece."""
    path = tmp_path / "m.ckpt"
    arrays = {k: v for k, v in ARRAYS.items() if v.size}
    with open(path, "wb") as f, CkptWriter(f, slice_bytes=64) as writer:
        for name, array in arrays.items():
            writer.write(name, array)
    src = read_source(path, strip_prefixes=False)
    for name, array in arrays.items():
        info = src.tensors[name]
        assert len(info.extents) == -(-array.nbytes // 64), name
        assert _stored(info) == array.tobytes(), name


def test_a_stripped_prefix_keeps_the_extents(tmp_path):
    path = tmp_path / "m.safetensors"
    save_file({f"module.{k}": v for k, v in ARRAYS.items()}, str(path))
    src = read_source(path)
    assert src.stripped == ["module."]
    assert _stored(src.tensors["a.weight"]) == ARRAYS["a.weight"].tobytes()


def test_it_reads_what_it_is_asked_within_its_budget(tmp_path):
    data = tmp_path / "data.bin"
    data.write_bytes(bytes(range(256)) * 4096)  # 1 MiB
    with ReadAhead(most=300_000, chunk=4096) as ahead:
        ahead.want([(str(data), 0, 100_000), (str(data), 500_000, 150_000),
                    (str(data), 900_000, 150_000)])
        assert _until(lambda: ahead.read == 300_000), ahead.read
        time.sleep(0.05)
        assert ahead.read == 300_000  # the budget: the third stretch read 50 000 bytes
        # a missing file, a stretch past the end, nonsense: skipped, no error
        ahead.want([(str(tmp_path / "gone.bin"), 0, 10), (str(data), 1 << 20, 4096),
                    (str(data), -5, 10), (str(data), 0, 0), (str(data), (1 << 20) - 10, 99)])
        assert _until(lambda: ahead.read == 300_010), ahead.read
    ahead.want([(str(data), 0, 4096)])  # closed: nothing more is read
    time.sleep(0.05)
    assert ahead.read == 300_010


def test_a_new_request_replaces_the_old(tmp_path, monkeypatch):
    """What was asked before and is not yet read is dropped: the reader has moved on."""
    import os
    import threading

    data = tmp_path / "data.bin"
    data.write_bytes(b"x" * (1 << 20))
    reads, original, replaced, started = [], os.preadv, threading.Event(), threading.Event()

    def held(fd, buffers, offset):
        reads.append(offset)
        if offset == 1 << 19:  # the old request's first chunk waits to be replaced
            started.set()
            replaced.wait(10)
        return original(fd, buffers, offset)

    monkeypatch.setattr(os, "preadv", held)
    with ReadAhead(chunk=1 << 16) as ahead:
        ahead.want([(str(data), 0, 1 << 16), (str(data), 1 << 19, 1 << 19)])
        assert started.wait(10)
        ahead.want([(str(data), 1 << 16, 1 << 16)])
        replaced.set()
        assert _until(lambda: (1 << 16) in reads)
    assert [r for r in reads if r >= 1 << 19] == [1 << 19]  # none of its 7 other chunks


def test_what_cannot_be_read_is_dropped_without_a_word(tmp_path, capfd):
    data = tmp_path / "data.bin"
    data.write_bytes(b"z" * 8192)
    with ReadAhead(chunk=4096) as ahead:
        ahead.want([(str(data), (1 << 63) - 10, 5), (str(tmp_path / "a\0b"), 0, 5),
                    (str(tmp_path), 0, 5), (str(data), 0, 8192)])
        assert _until(lambda: ahead.read == 8192), ahead.read
        assert ahead._thread.is_alive()
    assert capfd.readouterr().err == ""


@pytest.mark.parametrize("count", [0, 3])
def test_closing_stops_the_thread(tmp_path, count):
    data = tmp_path / "data.bin"
    data.write_bytes(b"y" * 4096)
    ahead = ReadAhead()
    ahead.want([(str(data), 0, 4096)] * count)
    ahead.close()
    assert ahead._thread is None or not ahead._thread.is_alive()


def test_extents_of_a_file_mindspore_wrote(tmp_path, monkeypatch):
    """A ``.ckpt`` written by MindSpore's own ``save_checkpoint``, its tensors split into
    pieces as it splits them (the slice size shrunk to 1 KiB): each tensor's stretches
    hold its bytes."""
    ms = pytest.importorskip("mindspore")
    serialization = pytest.importorskip("mindspore.train.serialization")
    monkeypatch.setattr(serialization, "SLICE_SIZE", 1)
    arrays = {"a.weight": np.arange(700, dtype=np.float32).reshape(7, 100),
              "b.bias": np.arange(7, dtype=np.int64)}
    path = tmp_path / "ms.ckpt"
    ms.save_checkpoint([{"name": k, "data": ms.Tensor(v)} for k, v in arrays.items()],
                       str(path))
    src = read_source(path, strip_prefixes=False)
    assert len(src.tensors["a.weight"].extents) == 3  # 2800 bytes in 1 KiB pieces
    for name, array in arrays.items():
        assert _stored(src.tensors[name]) == array.tobytes(), name
