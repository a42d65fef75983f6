"""write/torch_stream: torch.save's archive written a tensor at a time, without torch."""

from __future__ import annotations

import subprocess
import sys
import zipfile

import ml_dtypes
import numpy as np
import pytest

from ms_port.write.torch_stream import Later, _crc_back, save_path

torch = pytest.importorskip("torch")


def _obj():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((5, 7)).astype(np.float32)
    b = rng.standard_normal(9).astype(ml_dtypes.bfloat16)
    big = rng.standard_normal((3, 1 << 20)).astype(np.float32)
    obj = {"state": {0: {"step": Later("float32", (), lambda: np.array(7.0, np.float32)),
                         "exp_avg": Later("float32", a.shape, lambda: a)},
                     1: {"exp_avg": Later("bfloat16", b.shape, lambda: b),
                         "big": Later("float32", big.shape, lambda: big[:, :])}},
           "param_groups": [{"lr": 0.1, "betas": (0.9, 0.95), "params": [0, 1],
                             "foreach": None, "fused": True, "name": "ünïcode"}]}
    return obj, {"a": a, "b": b, "big": big}


def test_torch_loads_it_as_written(tmp_path):
    obj, arrays = _obj()
    path = tmp_path / "o.pt"
    save_path(obj, path)
    for mmap in (False, True):
        got = torch.load(path, weights_only=True, mmap=mmap)
        assert got["param_groups"] == obj["param_groups"]
        assert got["state"][0]["step"].item() == 7.0 and got["state"][0]["step"].shape == ()
        np.testing.assert_array_equal(got["state"][0]["exp_avg"].numpy(), arrays["a"])
        assert got["state"][1]["exp_avg"].dtype == torch.bfloat16
        np.testing.assert_array_equal(
            got["state"][1]["exp_avg"].view(torch.int16).numpy(),
            arrays["b"].view(np.int16))
        np.testing.assert_array_equal(got["state"][1]["big"].numpy(), arrays["big"])


def test_a_member_changed_on_disk_is_caught(tmp_path):
    """The read-back holds the file's bytes to the CRC-32 each member was written with
    (zipfile, which checks it as it reads, agrees with it): a byte changed is named."""
    import os

    from ms_port.write.stored_zip import Member

    obj, arrays = _obj()
    path = tmp_path / "o.pt"
    save_path(obj, path)
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo("archive/data/1")
        assert zf.read(info) == arrays["a"].tobytes()  # zipfile checks the CRC-32
        assert zf.testzip() is None
    member = Member(info.filename.encode(), info.CRC, info.file_size, info.header_offset)
    fd = os.open(path, os.O_RDWR)
    try:
        assert _crc_back(fd, member) == ("archive/data/1", True)
        byte = os.pread(fd, 1, member.data + 3)
        os.pwrite(fd, bytes([byte[0] ^ 1]), member.data + 3)
        assert _crc_back(fd, member) == ("archive/data/1", False)
    finally:
        os.close(fd)


def test_the_fast_crc_is_zlibs():
    import zlib

    from ms_port import _crc

    data = np.random.default_rng(0).integers(0, 256, 3 << 20, dtype=np.uint8).tobytes()
    assert _crc.crc32(data) == zlib.crc32(data)
    assert _crc.crc32(data[1000:], _crc.crc32(data[:1000])) == zlib.crc32(data)


def test_a_tensor_made_other_than_declared_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"a tensor made \(3,\), \(4,\) was declared"):
        save_path({"x": Later("float32", (4,), lambda: np.zeros(3, np.float32))},
                  tmp_path / "o.pt")


def test_writing_imports_no_torch(tmp_path):
    code = ("import sys, numpy as np; from pathlib import Path; "
            "from ms_port.write.torch_stream import Later, save_path; "
            "save_path({'x': Later('float32', (2,), lambda: np.ones(2, np.float32))}, "
            f"Path({str(tmp_path / 'o.pt')!r})); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"
