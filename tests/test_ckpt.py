"""ms_port.read.ckpt against MindSpore itself: byte-identical files, bit-identical data, and a
SourceError naming the file for anything that is not a whole checkpoint."""

from __future__ import annotations

import io
import json
import mmap
import os
import stat
import tempfile

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ms_port.errors import SourceError, WriteError
from ms_port.read.ckpt import (
    CANONICAL_DTYPES,
    MS_TENSOR_TYPES,
    WRITABLE_DTYPES,
    WRITE_STEP,
    CkptReader,
    CkptWriter,
    load_entry,
    read_ckpt,
)
from ms_port.read.tensors import NUMPY_DTYPES, numpy_dtype

ms = pytest.importorskip("mindspore")
serialization = pytest.importorskip("mindspore.train.serialization")

SHAPES = [(), (1,), (3, 4), (2, 3, 4)]


def sample(dtype: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Awkward values of ``dtype``: extremes, -0, inf, subnormals, random bit patterns."""
    rng = np.random.default_rng(seed)
    dt, n = numpy_dtype(dtype), int(np.prod(shape))
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        flat = rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)
        flat[: min(n, 2)] = [info.min, info.max][: min(n, 2)]
        return flat.reshape(shape)
    if dtype == "bfloat16":  # finite and inf only: MindSpore builds bf16 from float32
        special = np.array([-0.0, np.inf, -np.inf, 1e-40, 3.0e38], np.float32)
        flat = rng.standard_normal(n).astype(np.float32) * 1e3
        flat[: min(n, 5)] = special[: min(n, 5)]
        return flat.astype(ml_dtypes.bfloat16).reshape(shape)
    # every bit pattern, NaN payloads included
    return rng.integers(0, 256, n * dt.itemsize, dtype=np.uint8).view(dt).reshape(shape)


def make_arrays(dtypes=WRITABLE_DTYPES) -> dict[str, np.ndarray]:
    """One tensor per dtype and shape, some of them non-contiguous views."""
    arrays = {}
    for i, dtype in enumerate(sorted(dtypes)):
        for shape in SHAPES:
            arrays[f"{dtype}.{len(shape)}d"] = sample(dtype, shape, seed=i)
        arrays[f"{dtype}.transposed"] = sample(dtype, (4, 5), seed=i).T
        arrays[f"{dtype}.strided"] = sample(dtype, (11,), seed=i)[::3]
    return arrays


def ms_tensor(array: np.ndarray):
    """A MindSpore tensor holding ``array`` (bfloat16 built from float32, as documented)."""
    if array.dtype == ml_dtypes.bfloat16:
        return ms.Tensor(array.astype(np.float32), dtype=ms.bfloat16)
    return ms.Tensor(array.copy())  # C order; ascontiguousarray would make 0-d into (1,)


def ms_save(path, arrays: dict[str, np.ndarray], **kwargs) -> bytes:
    """mindspore.save_checkpoint of ``arrays``; return the file's bytes."""
    ms.save_checkpoint([{"name": k, "data": ms_tensor(v)} for k, v in arrays.items()],
                       str(path), **kwargs)
    return path.read_bytes()


def our_save(path, arrays: dict[str, np.ndarray], **kwargs) -> bytes:
    """CkptWriter of ``arrays``; return the file's bytes."""
    with open(path, "wb") as f, CkptWriter(f, **kwargs) as writer:
        spans = {name: writer.write(name, array) for name, array in arrays.items()}
    assert writer.bytes_written == path.stat().st_size
    # where the writer says each tensor's data went is where a reader finds it
    assert spans == {e.name: e.pieces for e in read_ckpt(path, verify_crc=False).entries}
    return path.read_bytes()


def ms_array(tensor) -> np.ndarray:
    """A MindSpore tensor's data; bfloat16 re-viewed from MindSpore's own numpy bfloat16
    (a different type from ml_dtypes') without touching the bits."""
    array = tensor.asnumpy()
    if str(array.dtype) == "bfloat16":
        array = array.view(np.uint16).view(ml_dtypes.bfloat16)
    return array


def same_bits(got: np.ndarray, want: np.ndarray) -> bool:
    """Same shape, same dtype, same bytes (NaN payloads and -0 included)."""
    return (got.shape == want.shape and got.dtype == want.dtype
            and got.tobytes() == want.tobytes())


# -- the dtype table --------------------------------------------------------------------


def test_table_covers_every_dtype_both_ways():
    assert set(MS_TENSOR_TYPES) == set(NUMPY_DTYPES)
    assert {CANONICAL_DTYPES[t]: t for t in CANONICAL_DTYPES} == MS_TENSOR_TYPES


@pytest.mark.parametrize("dtype", sorted(NUMPY_DTYPES))
def test_table_matches_mindspore_type_names(dtype):
    assert str(ms_tensor(sample(dtype, (2,))).dtype) == MS_TENSOR_TYPES[dtype]


# -- (a) byte-identical to save_checkpoint; (b) MindSpore loads our files -----------------


@pytest.mark.parametrize("crc", [False, True])
def test_writer_is_byte_identical_to_save_checkpoint(tmp_path, crc):
    arrays = make_arrays()
    ours = our_save(tmp_path / "ours.ckpt", arrays, crc=crc)
    theirs = ms_save(tmp_path / "theirs.ckpt", arrays, crc_check=crc)
    assert ours == theirs
    assert stat.S_IMODE((tmp_path / "theirs.ckpt").stat().st_mode) == 0o400


@pytest.mark.parametrize("crc", [False, True])
def test_mindspore_loads_our_file_bit_identical(tmp_path, crc):
    arrays = make_arrays()
    our_save(tmp_path / "ours.ckpt", arrays, crc=crc)
    loaded = ms.load_checkpoint(str(tmp_path / "ours.ckpt"), crc_check=crc)
    assert list(loaded) == list(arrays)
    for name, array in arrays.items():
        assert same_bits(ms_array(loaded[name]), array), name


def test_large_tensors_split_like_save_checkpoint(tmp_path, monkeypatch):
    # save_checkpoint splits tensors over SLICE_SIZE KiB (512 MiB); shrink it to 1 KiB
    monkeypatch.setattr(serialization, "SLICE_SIZE", 1)
    arrays = {"a": sample("float32", (750,)), "b": sample("int8", (1024,)),
              "c": sample("bfloat16", (3, 700)), "d": sample("float64", (128,)),
              "e": sample("uint8", (1023,)), "f": sample("int64", ())}
    ours = our_save(tmp_path / "ours.ckpt", arrays, crc=True, slice_bytes=1024)
    assert ours == ms_save(tmp_path / "theirs.ckpt", arrays, crc_check=True)
    loaded = ms.load_checkpoint(str(tmp_path / "ours.ckpt"), crc_check=True)
    with CkptReader(tmp_path / "ours.ckpt") as reader:
        assert [len(e.pieces) for e in reader.entries] == [3, 1, 5, 1, 1, 1]
        assert reader.crc_ok is True
        for name, array in arrays.items():
            assert same_bits(reader.load(name), array), name
            assert same_bits(ms_array(loaded[name]), array), name


def test_rows_read_alone_across_pieces(tmp_path):
    """A span of rows is read by itself, also where it straddles the pieces a large
    tensor was split into (export reads one expert's rows of a stacked tensor)."""
    arrays = {"w": sample("bfloat16", (12, 70)), "v": sample("float32", (5, 3)),
              "s": sample("int64", ())}
    our_save(tmp_path / "rows.ckpt", arrays, crc=False, slice_bytes=512)
    with CkptReader(tmp_path / "rows.ckpt") as reader:
        assert [len(e.pieces) for e in reader.entries] == [4, 1, 1]
        for start, stop in [(0, 12), (0, 1), (3, 4), (3, 9), (11, 12), (5, 5)]:
            assert same_bits(reader.load("w", (start, stop)), arrays["w"][start:stop])
        assert same_bits(reader.load("v", (2, 5)), arrays["v"][2:5])
        for bad in [(-1, 2), (4, 3), (0, 13)]:
            with pytest.raises(ValueError, match="outside it"):
                reader.load("w", bad)
        with pytest.raises(ValueError, match="outside it"):
            reader.load("s", (0, 1))


# -- (c) reading what MindSpore wrote -------------------------------------------------------


def test_read_save_checkpoint_file_bit_identical(tmp_path):
    # complex tensors: save_checkpoint writes them even though load_checkpoint cannot read them
    arrays = make_arrays(NUMPY_DTYPES)
    path = tmp_path / "theirs.ckpt"
    ms_save(path, arrays)
    index = read_ckpt(path)
    assert (index.has_crc, index.crc_ok, index.skipped) == (False, None, ())
    assert [e.name for e in index.entries] == list(arrays)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        for entry in index.entries:
            want = arrays[entry.name]
            assert (entry.shape, entry.dtype) == (want.shape, entry.name.split(".")[0])
            assert entry.nbytes == want.nbytes
            assert same_bits(load_entry(path, entry), want)
            got = load_entry(mapped, entry)
            assert same_bits(got, want)
            del got  # a live view would keep the mmap from closing
    with CkptReader(path) as reader:
        kept = {name: reader.load(name) for name in arrays}
        assert "float32.0d" in reader and "nope" not in reader
    for name, array in arrays.items():  # arrays outlive the reader
        assert same_bits(kept[name], array)


def test_append_dict_strings_are_skipped(tmp_path):
    path = tmp_path / "theirs.ckpt"
    ms.save_checkpoint([{"name": "w", "data": ms.Tensor(np.ones(2, np.float32))}], str(path),
                       append_dict={"epoch": 3, "note": "héllo"})
    index = read_ckpt(path)
    assert [(e.name, e.shape, e.dtype) for e in index.entries] == [
        ("w", (2,), "float32"), ("epoch", (), "int64")]
    assert [(s.name, s.kind) for s in index.skipped] == [("note", "string")]
    name, kind, reason = index.skipped[0]  # unpacks like a plain tuple
    assert (name, kind) == ("note", "string") and reason


# -- (d) the CRC trailer --------------------------------------------------------------------


def test_crc_reported_ok_for_both_writers(tmp_path):
    arrays = make_arrays(["float32", "int8"])
    our_save(tmp_path / "ours.ckpt", arrays, crc=True)
    ms_save(tmp_path / "theirs.ckpt", arrays, crc_check=True)
    for path in (tmp_path / "ours.ckpt", tmp_path / "theirs.ckpt"):
        index = read_ckpt(path)
        assert (index.has_crc, index.crc_ok) == (True, True)
        assert read_ckpt(path, verify_crc=False).crc_ok is None


def test_crc_only_file_from_empty_save(tmp_path):
    path = tmp_path / "empty.ckpt"
    assert ms_save(path, {}, crc_check=True) == our_save(tmp_path / "ours.ckpt", {}, crc=True)
    index = read_ckpt(path)
    assert (index.entries, index.has_crc, index.crc_ok) == ((), True, True)


@pytest.mark.parametrize("where", ["data", "crc value"])
def test_flipped_byte_sets_crc_ok_false(tmp_path, where):
    """Decision: a CRC mismatch is reported (crc_ok False), not raised; the structure is
    still valid and the caller chooses whether to refuse the file."""
    path = tmp_path / "ours.ckpt"
    data = bytearray(our_save(path, {"w": sample("float32", (16,))}, crc=True))
    at = read_ckpt(path).entries[0].offset + 5 if where == "data" else len(data) - 1
    data[at] ^= 0x01
    path.write_bytes(bytes(data))
    index = read_ckpt(path)
    assert (index.has_crc, index.crc_ok) == (True, False)
    with pytest.raises(ValueError, match="crc"):  # MindSpore agrees that it is damaged
        ms.load_checkpoint(str(path), crc_check=True)


def test_damaged_crc_magic_is_a_source_error(tmp_path):
    path = tmp_path / "ours.ckpt"
    data = bytearray(our_save(path, {"w": sample("float32", (4,))}, crc=True))
    data[-17] ^= 0x20  # "crc_num" -> "Crc_num"
    path.write_bytes(bytes(data))
    with pytest.raises(SourceError, match=str(path)):
        read_ckpt(path)


# -- (e) anything else is a SourceError naming the file --------------------------------------


@pytest.mark.parametrize("crc", [False, True])
def test_truncation_at_every_offset(tmp_path, crc):
    arrays = {"a": sample("float32", (2, 3)), "b": sample("int64", ()), "c": sample("bool", (5,))}
    full = our_save(tmp_path / "full.ckpt", arrays, crc=crc)
    ends = {e.offset + e.nbytes for e in read_ckpt(tmp_path / "full.ckpt").entries}
    path = tmp_path / "cut.ckpt"
    for size in range(1, len(full)):
        path.write_bytes(full[:size])
        if size in ends:  # a cut between records leaves a shorter valid checkpoint
            names = [e.name for e in read_ckpt(path).entries]
            assert names == list(arrays)[: len(names)]
            continue
        with pytest.raises(SourceError) as info:
            read_ckpt(path)
        assert str(path) in str(info.value) and info.value.path == str(path)


@pytest.mark.parametrize("content", [
    pytest.param(b"", id="empty"),
    pytest.param(json.dumps({"w": [1.0, 2.0]}).encode(), id="json"),
    pytest.param(b"PK\x03\x04" + bytes(60), id="zip"),
    pytest.param(b"\x80\x02}q\x00." + bytes(8), id="pickle"),
    *(pytest.param(np.random.default_rng(seed).bytes(size), id=f"random-{size}")
      for seed, size in enumerate([1, 7, 100, 4096, 100_000])),
])
def test_not_a_checkpoint(tmp_path, content):
    path = tmp_path / "x.ckpt"
    path.write_bytes(content)
    with pytest.raises(SourceError) as info:
        read_ckpt(path)
    assert str(path) in str(info.value)


def test_missing_file_and_directory(tmp_path):
    for path in (tmp_path / "missing.ckpt", tmp_path):
        with pytest.raises(SourceError, match=str(path)):
            read_ckpt(path)


def varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


def ld(key: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return bytes([key]) + varint(len(payload)) + payload


def record(name: bytes = b"x", dims=(2,), ttype: bytes = b"Int8", content: bytes = b"\1\2",
           extra: bytes = b"", tensor: bytes | None = None) -> bytes:
    """One top-level value record built by hand."""
    if tensor is None:
        tensor = b"".join(b"\x08" + varint(d) for d in dims) + ld(0x12, ttype) + ld(0x1A, content)
    return ld(0x0A, ld(0x0A, name) + ld(0x12, tensor + extra))


@pytest.mark.parametrize("content, what", [
    (b"\x10\x01" + record(), "byte 0x10"),
    (ld(0x0A, ld(0x0A, b"x") + b"\x20\x01"), "unknown field 4"),
    (record(extra=b"\x20\x01"), "unknown field 4"),
    (b"\x0a" + b"\xff" * 11, "longer than 10 bytes"),
    (b"\x0a\x80", "past the end"),
    (b"\x0a\x7f" + record(), "past the end"),
    (record(content=b"\1\2\3"), "holds 3 bytes but 2 int8 needs 2"),
    (record(ttype=b"Int4"), "'Int4'"),
    (record(dims=(2**64 - 1,)), "negative dimension"),
    (ld(0x0A, ld(0x12, ld(0x12, b"Int8") + ld(0x1A, b""))), "no name"),
    (ld(0x0A, ld(0x0A, b"x")), "holds no tensor"),
    (record(tensor=ld(0x12, b"Int8")), "lacks"),
    (record(name=b"\xff"), "UTF-8"),
    (record() + b"crc_num" + bytes(10) + record(name=b"y"), "trailer is 36 bytes"),
    (record() + record(name=b"y") + record(), "appears twice"),
    (record() + record(dims=(1, 2)), "changes shape"),
])
def test_malformed_records(tmp_path, content, what):
    path = tmp_path / "bad.ckpt"
    path.write_bytes(content)
    with pytest.raises(SourceError, match=str(path)) as info:
        read_ckpt(path)
    assert what in str(info.value)


def test_unusual_but_valid_records(tmp_path):
    path = tmp_path / "odd.ckpt"
    packed = ld(0x0A, bytes([2, 1])) + ld(0x12, b"Int8") + ld(0x1A, b"\1\2")
    mapped = ld(0x0A, ld(0x0A, b"table") + ld(0x1A, b"\x0a\x00"))
    path.write_bytes(record(name=b"packed", tensor=packed) + mapped + mapped
                     + record(name=b"legacy", dims=(0,), ttype=b"Float32", content=bytes(4))
                     + record(name=b"empty", dims=(2, 0), content=b""))
    with CkptReader(path) as reader:
        assert [(e.name, e.shape) for e in reader.entries] == [
            ("packed", (2, 1)), ("legacy", ()), ("empty", (2, 0))]
        assert [(s.name, s.kind) for s in reader.skipped] == [("table", "maptensor")]
        assert same_bits(reader.load("packed"), np.array([[1], [2]], np.int8))
        assert same_bits(reader.load("empty"), np.zeros((2, 0), np.int8))


# -- the writer ------------------------------------------------------------------------------


@pytest.mark.parametrize("array, what", [
    (np.zeros((0,), np.float32), "empty"),
    (np.zeros((2, 0), np.float32), "empty"),
    (np.zeros(2, np.complex64), "complex64"),
    (np.array(["a"], object), "object"),
    (np.array(["a"]), "<U1"),
])
def test_writer_refuses(array, what):
    with pytest.raises(WriteError) as info:
        CkptWriter(io.BytesIO()).write("x", array)
    assert what in str(info.value) and "'x'" in str(info.value)


def test_writer_refuses_repeats_and_late_writes(tmp_path):
    with open(tmp_path / "o.ckpt", "wb") as f:
        writer = CkptWriter(f, crc=True)
        writer.write("a", np.ones(2, np.float32))
        with pytest.raises(WriteError, match="twice"):
            writer.write("a", np.ones(2, np.float32))
        writer.finish()
        writer.finish()  # idempotent: one trailer only
        with pytest.raises(WriteError, match=f"{tmp_path}.*finished"):
            writer.write("b", np.ones(2, np.float32))
    assert read_ckpt(tmp_path / "o.ckpt").crc_ok is True


def test_writer_leaves_no_trailer_after_an_error():
    buf = io.BytesIO()
    with pytest.raises(RuntimeError), CkptWriter(buf, crc=True) as writer:
        writer.write("a", np.ones(2, np.float32))
        raise RuntimeError
    assert buf.getvalue() and b"crc_num" not in buf.getvalue()


def test_writer_byte_order_and_layout_do_not_matter():
    base = sample("float64", (3, 4))
    variants = [base, base.astype(">f8"), np.asfortranarray(base), base.T.copy().T, base.tolist()]
    outputs = set()
    for array in variants:
        buf = io.BytesIO()
        CkptWriter(buf).write("w", array)
        outputs.add(buf.getvalue())
    assert len(outputs) == 1


class Recorder(io.RawIOBase):
    """A raw stream that accepts at most 7 bytes a call and remembers what it was given."""

    def __init__(self):
        self.data, self.given = bytearray(), []

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        self.given.append(b)
        self.data += bytes(b[:7])
        return min(7, len(b))


def test_writer_handles_short_writes_and_does_not_copy_data():
    array = sample("int32", (5, 6))
    raw = Recorder()
    CkptWriter(raw).write("w", array)
    buf = io.BytesIO()
    CkptWriter(buf).write("w", array)
    assert bytes(raw.data) == buf.getvalue()
    # the tensor's bytes went out as views of the array itself, never as a copy
    assert any(isinstance(b, memoryview) and np.shares_memory(np.asarray(b), array)
               for b in raw.given)


@pytest.mark.parametrize("fmt", ["ckpt", "safetensors"])
def test_large_tensors_reach_the_kernel_in_small_writes(fmt):
    """A write() of 1 MiB or more gets large page-cache folios, which a VM with free page
    reporting must fault back in from its host: 6 s instead of 1 for 2 GiB (WRITE_STEP)."""
    from types import SimpleNamespace

    from ms_port.write.writers import _Data, _write_safetensors

    array = np.arange(3 * WRITE_STEP // 4 + 5, dtype=np.float32)  # 3 steps and a bit
    calls: list[int] = []

    class Counting(io.BytesIO):
        def write(self, b):
            calls.append(memoryview(b).nbytes)
            return super().write(b)

    out = Counting()
    if fmt == "ckpt":
        CkptWriter(out).write("w", array)
    else:
        match = SimpleNamespace(target="w", shape=array.shape, out_dtype="float32",
                                nbytes=array.nbytes)
        data = _Data(array.shape, "float32", [array.view(np.uint8)])
        _write_safetensors(SimpleNamespace(matches=[match]), iter([(match, data)]), out,
                           progress=None, checks=None, metadata=None)
    assert out.getvalue().endswith(array.tobytes())  # every byte, in order, once
    assert sum(calls) == len(out.getvalue())
    assert max(calls) <= WRITE_STEP
    assert sum(c for c in calls if c == WRITE_STEP) >= 3 * WRITE_STEP


def test_listing_lets_go_of_the_pages_it_walked_past(tmp_path, monkeypatch):
    """Listing a checkpoint touches each record's header, and each touch maps a folio of
    up to 2 MiB: the pages walked past are released as it goes (page-aligned, in order,
    from byte 0), and the listing is the same as without releasing them."""
    import ms_port.read.ckpt as ckpt

    path = tmp_path / "many.ckpt"
    with open(path, "wb") as f, CkptWriter(f) as writer:
        for i in range(40):
            writer.write(f"layers.{i}.weight", np.full((32, 100 + i), i, np.float32))
    released: list[tuple[int, int]] = []

    class Recording:
        def __init__(self, buf):
            self._buf = buf

        def __len__(self):
            return len(self._buf)

        def __getitem__(self, index):
            return self._buf[index]

        def madvise(self, option, start, length):
            assert option == mmap.MADV_DONTNEED
            released.append((start, length))
            self._buf.madvise(option, start, length)

    monkeypatch.setattr(ckpt, "_UNMAP_STEP", 3 * mmap.PAGESIZE)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        listed = ckpt._scan(Recording(buf), str(path), True)
    assert listed == ckpt.CkptReader(path).index
    assert len(released) >= 5 and released[0][0] == 0
    for (start, length), nxt in zip(released, [*released[1:], None]):
        assert start % mmap.PAGESIZE == 0 and length % mmap.PAGESIZE == 0
        assert length >= 3 * mmap.PAGESIZE and (nxt is None or nxt[0] == start + length)
    left = path.stat().st_size - sum(length for _, length in released)
    assert left < 4 * mmap.PAGESIZE + 32 * 140 * 4  # under one step and the last record


def test_writer_turns_os_errors_into_write_error(tmp_path):
    class Full(io.BytesIO):
        name = str(tmp_path / "out.ckpt")

        def write(self, b):
            raise OSError(28, "No space left on device")

    with pytest.raises(WriteError, match=r"out\.ckpt.*No space left"):
        CkptWriter(Full()).write("w", np.ones(3))


@settings(max_examples=30, deadline=None)
@given(dtype=st.sampled_from(sorted(WRITABLE_DTYPES)),
       shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=5),
       slice_bytes=st.integers(1, 64), seed=st.integers(0, 2**32 - 1), crc=st.booleans())
def test_roundtrip_property(dtype, shape, slice_bytes, seed, crc):
    array = sample(dtype, shape, seed)
    second = array[..., :1] if array.ndim else array
    buf = io.BytesIO()
    with CkptWriter(buf, crc=crc, slice_bytes=slice_bytes) as writer:
        planned = writer.size_of("t", array.shape, dtype) + writer.size_of(
            "u", second.shape, dtype) + writer.trailer_size
        spans = [writer.write("t", array), writer.write("u", second)]
    assert len(buf.getvalue()) == planned  # what the output's blocks are reserved for
    fd, name = tempfile.mkstemp(suffix=".ckpt")
    try:
        os.write(fd, buf.getvalue())
        os.close(fd)
        with CkptReader(name) as reader:
            assert (reader.has_crc, reader.crc_ok) == (crc, True if crc else None)
            assert same_bits(reader.load("t"), array)
            assert reader.entries[0].nbytes == array.nbytes
            assert [e.pieces for e in reader.entries] == spans
    finally:
        os.unlink(name)


def test_load_entry_notices_a_file_that_shrank(tmp_path):
    path = tmp_path / "ours.ckpt"
    data = our_save(path, {"a": sample("float32", (8,)), "b": sample("int8", (4,))})
    entry = read_ckpt(path).entries[1]
    path.write_bytes(data[:-2])
    with pytest.raises(SourceError, match=f"{path}.*list it again"):
        load_entry(path, entry)


@settings(max_examples=40, deadline=None)
@given(dtype=st.sampled_from(sorted(WRITABLE_DTYPES)),
       shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=6),
       slice_bytes=st.integers(1, 64), cuts=st.lists(st.integers(0, 400), max_size=6),
       seed=st.integers(0, 2**32 - 1), crc=st.booleans())
def test_chunks_cut_anywhere_write_the_same_file_as_one_array(dtype, shape, slice_bytes, cuts,
                                                              seed, crc):
    """A tensor streamed in chunks (cut anywhere: inside a value, across a record's end,
    empty chunks) is written byte for byte as the whole array is, with the same spans."""
    array = sample(dtype, shape, seed)
    raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    edges = sorted({0, raw.size, *(c % (raw.size + 1) for c in cuts)})
    chunks = [raw[a:b] for a, b in zip(edges, edges[1:])] + [raw[:0]]
    whole, streamed = io.BytesIO(), io.BytesIO()
    with CkptWriter(whole, crc=crc, slice_bytes=slice_bytes) as writer:
        want = writer.write("t", array)
    with CkptWriter(streamed, crc=crc, slice_bytes=slice_bytes) as writer:
        got = writer.write_chunks("t", array.shape, dtype, iter(chunks))
    assert got == want and streamed.getvalue() == whole.getvalue()


@pytest.mark.parametrize("held, says", [(11, "fewer"), (13, "more")])
def test_chunks_holding_other_than_the_tensors_bytes_are_refused(held, says):
    with pytest.raises(WriteError, match=rf"'t' \(3 float32\) takes 12 bytes and its data "
                                         rf"held {says}; the file is incomplete"):
        CkptWriter(io.BytesIO()).write_chunks("t", (3,), "float32",
                                              [np.zeros(held, np.uint8)])
