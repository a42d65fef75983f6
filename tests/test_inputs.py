"""Inputs fed by ``verify``: files read safely and in order, generated inputs seeded."""

from __future__ import annotations

import os
import pickle
import zipfile

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file

from ms_port.check.inputs import (
    MAX_INPUT_BYTES,
    InputArray,
    InputError,
    generate_inputs,
    load_inputs,
    parse_range,
    parse_shape,
    second_draw,
)
from ms_port.errors import MsPortError

# -- generated ----------------------------------------------------------------------


def test_generated_float_is_the_draw_ms_port_always_made():
    [x] = generate_inputs([(3, 8, 8)], batch=2, seed=7)
    old = np.random.default_rng(7).standard_normal((2, 3, 8, 8)).astype(np.float32)
    assert x.array.dtype == np.float32
    assert np.array_equal(x.array, old)
    assert x.name == "input0"
    assert x.describe() == "input0 float32 [2, 3, 8, 8] generated normal(seed=7)"
    assert x.to_dict() == {"name": "input0", "dtype": "float32", "shape": [2, 3, 8, 8],
                           "origin": "generated normal(seed=7)", "kind": "normal"}


def test_generated_inputs_are_reproducible_and_seeded():
    a = generate_inputs([(4,), (2, 3)], seed=1, dtypes=("float64",))
    b = generate_inputs([(4,), (2, 3)], seed=1, dtypes=("float64",))
    c = generate_inputs([(4,), (2, 3)], seed=2, dtypes=("float64",))
    for x, y in zip(a, b):
        assert np.array_equal(x.array, y.array)
    assert not np.array_equal(a[0].array, c[0].array)
    # several inputs come from one generator, in order
    rng = np.random.default_rng(1)
    rng.standard_normal((1, 4))
    assert np.array_equal(a[1].array, rng.standard_normal((1, 2, 3)))


def test_generated_integers_stay_in_range():
    [ids] = generate_inputs([(64,)], batch=4, dtypes=("int64",), ranges=((5, 9),))
    assert ids.array.dtype == np.int64 and ids.array.shape == (4, 64)
    assert ids.array.min() >= 5 and ids.array.max() <= 8
    assert set(np.unique(ids.array)) == {5, 6, 7, 8}
    assert ids.origin == "generated integers [5, 9) seed=0"


def test_dtype_and_range_per_input():
    x, ids, mask = generate_inputs(
        [(3, 4), (16,), (16,)], batch=2, dtypes=("float16", "int32", "bool"),
        ranges=((-1.0, 1.0), (0, 100), None))
    assert (x.array.dtype, ids.array.dtype, mask.array.dtype) == (
        np.float16, np.int32, np.bool_)
    assert x.array.min() >= -1 and x.array.max() <= 1
    assert ids.array.min() >= 0 and ids.array.max() < 100
    assert [i.name for i in (x, ids, mask)] == ["input0", "input1", "input2"]
    assert x.origin == "generated uniform [-1, 1) seed=0"


@pytest.mark.parametrize("kw, match", [
    ({"dtypes": ("float32", "int64")}, "3 input shapes but 2 --input-dtype values"),
    ({"ranges": ((0, 1), (0, 2))}, "3 input shapes but 2 --input-range values"),
])
def test_per_input_options_must_match_the_shapes(kw, match):
    with pytest.raises(InputError, match=match):
        generate_inputs([(2,), (2,), (2,)], **kw)


def test_integer_inputs_need_a_range():
    with pytest.raises(InputError, match=r"--input-range LOW,HIGH is needed for integer "
                                         r"inputs, e.g. token ids 0,VOCAB"):
        generate_inputs([(8,)], dtypes=("int64",))


@pytest.mark.parametrize("kw, match", [
    ({"dtypes": ("uint8",), "ranges": ((0, 300),)}, r"within \[0, 256\)"),
    ({"dtypes": ("int64",), "ranges": ((0, 2.5),)}, "whole numbers"),
    ({"dtypes": ("complex64",)}, "unknown --input-dtype 'complex64'; known: float64"),
    ({"batch": 0}, "batch must be a whole number >= 1"),
    ({"seed": -1}, "seed=-1"),
])
def test_bad_generation_options(kw, match):
    with pytest.raises(InputError, match=match):
        generate_inputs([(8,)], **kw)


def test_generation_is_bounded_in_size():
    with pytest.raises(InputError, match=f"at most {MAX_INPUT_BYTES}"):
        generate_inputs([(1 << 20, 1 << 20)])


# -- files --------------------------------------------------------------------------


def test_npy_is_one_input(tmp_path):
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    np.save(tmp_path / "x.npy", x)
    [inp] = load_inputs(tmp_path / "x.npy")
    assert inp.name == "input0" and np.array_equal(inp.array, x)
    assert inp.describe() == f"input0 float32 [2, 6] from {tmp_path / 'x.npy'}"


def test_npz_positional_arrays_in_numeric_order(tmp_path):
    arrays = [np.full((1, 2), i, np.int64) for i in range(12)]  # arr_10 sorts before arr_2
    np.savez(tmp_path / "x.npz", *arrays)
    got = load_inputs(tmp_path / "x.npz")
    assert [int(g.array[0, 0]) for g in got] == list(range(12))
    assert [g.name for g in got] == [f"input{i}" for i in range(12)]
    assert got[10].origin == f"file {tmp_path / 'x.npz'}:arr_10"


def test_npz_named_arrays_keep_names_and_file_order(tmp_path):
    ids = np.array([[3, 1, 4]], np.int32)
    x = np.ones((1, 3), np.float32)
    np.savez_compressed(tmp_path / "x.npz", zeta=ids, alpha=x)
    zeta, alpha = load_inputs(tmp_path / "x.npz")
    assert (zeta.name, alpha.name) == ("zeta", "alpha")
    assert np.array_equal(zeta.array, ids) and zeta.array.dtype == np.int32
    assert zeta.describe().endswith("x.npz:zeta")


def test_big_endian_npy_becomes_native(tmp_path):
    np.save(tmp_path / "x.npy", np.arange(4, dtype=">f4").reshape(1, 4))
    [inp] = load_inputs(tmp_path / "x.npy")
    assert inp.array.dtype == np.float32 and inp.array.tolist() == [[0, 1, 2, 3]]


def test_safetensors_names_kept_in_name_order(tmp_path):
    tensors = {"b_ids": np.array([[1, 2]], np.int64), "a_x": np.zeros((1, 2), np.float32)}
    save_file(tensors, str(tmp_path / "x.safetensors"))
    got = load_inputs(tmp_path / "x.safetensors")
    assert [g.name for g in got] == ["a_x", "b_ids"]
    assert np.array_equal(got[1].array, tensors["b_ids"]) and got[1].array.dtype == np.int64


@pytest.mark.parametrize("suffix", [".pt", ".pth"])
def test_pt_dict_order_and_names_kept(tmp_path, suffix):
    state = {"pixels": torch.randn(2, 3), "ids": torch.tensor([[5, 6], [7, 8]]),
             "mask": torch.tensor([[True, False], [True, True]])}
    torch.save(state, tmp_path / f"x{suffix}")
    got = load_inputs(tmp_path / f"x{suffix}")
    assert [g.name for g in got] == ["pixels", "ids", "mask"]
    for g in got:
        assert np.array_equal(g.array, state[g.name].numpy())
        assert g.origin == f"file {tmp_path / f'x{suffix}'}:{g.name}"


def test_pt_with_non_tensors_is_refused(tmp_path):
    torch.save({"x": torch.zeros(1, 2), "note": "hello"}, tmp_path / "x.pt")
    with pytest.raises(InputError, match=r"holds 'note'.*save only the input tensors"):
        load_inputs(tmp_path / "x.pt")


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("container", ["zip", "legacy"])
def test_hostile_pt_is_refused_and_nothing_runs(tmp_path, container):
    marker = tmp_path / "pwned"
    path = tmp_path / "x.pt"
    if container == "zip":
        torch.save({"x": torch.zeros(1, 2), "y": _Evil(marker)}, path)
        assert zipfile.is_zipfile(path)
    else:  # a plain pickle: torch.save's legacy format starts the same way
        path.write_bytes(pickle.dumps({"y": _Evil(marker)}, protocol=2))
    with pytest.raises(MsPortError, match=r"system.*Nothing was executed"):
        load_inputs(path)
    assert not marker.exists()


def test_object_npy_refused_without_unpickling(tmp_path, monkeypatch):
    marker = tmp_path / "pwned"
    arr = np.empty((1,), dtype=object)
    arr[0] = _Evil(marker)
    np.save(tmp_path / "x.npy", arr, allow_pickle=True)
    monkeypatch.setattr(pickle, "load", lambda *a, **k: pytest.fail("unpickled"))
    with pytest.raises(InputError, match=r"object array.*save numeric arrays only"):
        load_inputs(tmp_path / "x.npy")
    assert not marker.exists()


def test_object_array_in_npz_refused(tmp_path):
    np.savez(tmp_path / "x.npz", a=np.array([[1, "s"]], dtype=object))
    with pytest.raises(InputError, match=r"x.npz:a holds an object array"):
        load_inputs(tmp_path / "x.npz")


def test_npy_claiming_more_than_the_file_holds(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.zeros((4, 1024), np.float32))
    data = path.read_bytes()
    path.write_bytes(data[:len(data) - 1024])
    with pytest.raises(InputError, match=r"declares shape \[4, 1024\].*truncated"):
        load_inputs(path)


def test_npz_bomb_is_refused_before_decompressing(tmp_path):
    path = tmp_path / "x.npz"
    header = b"\x93NUMPY\x01\x00" + b"v\x00" + (
        b"{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2147483648), }"
        .ljust(117) + b"\n")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("x.npy", header + b"\0" * 1024)
    with pytest.raises(InputError, match="declares shape"):
        load_inputs(path)


@pytest.mark.parametrize("make, match", [
    (lambda p: np.save(p / "x.npy", np.float32(3)), "a scalar; an input needs a batch axis"),
    (lambda p: np.save(p / "x.npy", np.zeros((0, 3))), "empty batch axis"),
    (lambda p: np.savez(p / "x.npz"), "holds no arrays"),
    (lambda p: np.save(p / "x.npy", np.zeros((1, 2), np.complex64)), "dtype complex64"),
    (lambda p: (p / "x.npy").write_bytes(b"not numpy"), "not a valid .npy"),
    (lambda p: (p / "x.npz").write_bytes(b"PK\x03\x04junk"), "cannot read it.*BadZipFile"),
])
def test_bad_files(tmp_path, make, match):
    make(tmp_path)
    [path] = [p for p in tmp_path.iterdir() if p.suffix in (".npy", ".npz")]
    with pytest.raises(InputError, match=match):
        load_inputs(path)


def test_scalar_tensor_in_safetensors_refused(tmp_path):
    save_file({"x": np.zeros((), np.float32)}, str(tmp_path / "x.safetensors"))
    with pytest.raises(InputError, match=r"x\.safetensors:x is a scalar"):
        load_inputs(tmp_path / "x.safetensors")


def test_unsupported_suffix_lists_the_supported(tmp_path):
    (tmp_path / "x.csv").write_text("1,2")
    with pytest.raises(InputError, match=r"\.npy, \.npz, \.safetensors, \.pt, \.pth"):
        load_inputs(tmp_path / "x.csv")


def test_missing_file(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        load_inputs(tmp_path / "x.npy")


# -- second draw --------------------------------------------------------------------


def _same_kind(a: InputArray, b: InputArray) -> None:
    assert a.name == b.name
    assert a.array.shape == b.array.shape and a.array.dtype == b.array.dtype
    assert not np.array_equal(a.array, b.array)


def test_second_draw_of_generated_inputs():
    first = generate_inputs([(3, 4), (32,)], batch=2, seed=3, dtypes=("float32", "int64"),
                            ranges=(None, (10, 20)))
    second = second_draw(first, seed=3)
    for a, b in zip(first, second):
        _same_kind(a, b)
    assert second[1].array.min() >= 10 and second[1].array.max() < 20
    again = generate_inputs([(3, 4), (32,)], batch=2, seed=3 + 1_000_003,
                            dtypes=("float32", "int64"), ranges=(None, (10, 20)))
    assert np.array_equal(second[0].array, again[0].array)
    assert np.array_equal(second_draw(first, seed=3)[1].array, second[1].array)


def test_second_draw_rolls_a_file_batch(tmp_path):
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    np.save(tmp_path / "x.npy", x)
    [first] = load_inputs(tmp_path / "x.npy")
    [second] = second_draw([first], seed=0)
    _same_kind(first, second)
    assert np.array_equal(second.array, x[[2, 0, 1]])
    assert "rolled" in second.origin


def test_second_draw_of_a_single_file_sample_keeps_its_statistics(tmp_path):
    x = (5 + 2 * np.random.default_rng(0).standard_normal((1, 4096))).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    [first] = load_inputs(tmp_path / "x.npy")
    [second] = second_draw([first], seed=0)
    _same_kind(first, second)
    assert abs(second.array.mean() - 5) < 0.2 and abs(second.array.std() - 2) < 0.2


def test_second_draw_of_identical_samples_is_noise(tmp_path):
    x = np.ones((2, 8), np.float32)
    np.save(tmp_path / "x.npy", x)
    [second] = second_draw(load_inputs(tmp_path / "x.npy"), seed=0)
    assert not np.array_equal(second.array, x) and second.array.dtype == np.float32


def test_second_draw_of_file_token_ids_stays_in_range(tmp_path):
    ids = np.random.default_rng(0).integers(100, 200, (2, 64)).astype(np.int32)
    np.savez(tmp_path / "x.npz", ids=ids)
    [first] = load_inputs(tmp_path / "x.npz")
    [second] = second_draw([first], seed=0)
    _same_kind(first, second)
    assert ids.min() <= second.array.min() and second.array.max() <= ids.max()


# -- options ------------------------------------------------------------------------


@pytest.mark.parametrize("text, shape", [
    ("3,224,224", (3, 224, 224)), ("3x224x224", (3, 224, 224)), ("16", (16,)),
    (" (3, 8) ", (3, 8)), ("3×8", (3, 8)),
])
def test_parse_shape(text, shape):
    assert parse_shape(text) == shape


@pytest.mark.parametrize("text, match", [
    ("", "not a shape"), ("3,,4", "not a shape"), ("a,b", "not a shape"),
    ("3,-1", "not a shape"), ("3,0", "at least 1"), ("1.5", "not a shape"),
    (",".join(["1"] * 17), "not a shape"), ("３", "not a shape"),
])
def test_parse_shape_errors(text, match):
    with pytest.raises(InputError, match=match):
        parse_shape(text)


def test_parse_range():
    assert parse_range("0,32000") == (0, 32000)
    assert isinstance(parse_range("0,32000")[1], int)
    assert parse_range("-1.5, 1") == (-1.5, 1)


@pytest.mark.parametrize("text, match", [
    ("5,5", "LOW must be below HIGH"), ("3,1", "LOW must be below HIGH"),
    ("0", "not LOW,HIGH"), ("0,1,2", "not LOW,HIGH"), ("a,b", "not LOW,HIGH"),
    ("0,inf", "not LOW,HIGH"), ("nan,1", "not LOW,HIGH"),
])
def test_parse_range_errors(text, match):
    with pytest.raises(InputError, match=match):
        parse_range(text)


def test_input_error_is_bad_input():
    assert issubclass(InputError, MsPortError) and InputError.exit_code == 2


def test_second_draw_of_a_file_mask_and_bfloat16(tmp_path):
    import ml_dtypes

    mask = np.array([[True, False, True, True] * 8], np.bool_)
    x = np.random.default_rng(0).standard_normal((1, 64)).astype(ml_dtypes.bfloat16)
    save_file({"a_mask": mask, "b_x": x}, str(tmp_path / "x.safetensors"))
    first = load_inputs(tmp_path / "x.safetensors")
    assert first[1].describe() == f"b_x bfloat16 [1, 64] from {tmp_path / 'x.safetensors'}:b_x"
    second = second_draw(first, seed=0)
    for a, b in zip(first, second):
        _same_kind(a, b)
    assert np.isfinite(second[1].array.astype(np.float32)).all()


def test_corrupt_compressed_npz_member(tmp_path):
    path = tmp_path / "x.npz"
    np.savez_compressed(path, x=np.arange(4096, dtype=np.float32).reshape(1, -1))
    data = bytearray(path.read_bytes())
    data[200:260] = bytes(60)  # inside the deflate stream, past the local header
    path.write_bytes(bytes(data))
    with pytest.raises(InputError, match=r"x\.npz"):
        load_inputs(path)


@pytest.mark.parametrize("name, save", [
    ("x.npy", lambda p: np.save(p, np.arange(64, dtype=np.float32).reshape(2, 32))),
    ("x.npz", lambda p: np.savez(p, a=np.arange(8).reshape(1, 8), b=np.ones((1, 2)))),
    ("x.npz", lambda p: np.savez_compressed(p, np.arange(512, dtype=np.int32).reshape(1, -1))),
])
def test_every_damaged_byte_gives_an_input_error_or_a_valid_array(tmp_path, name, save):
    path = tmp_path / name
    save(path)
    good = path.read_bytes()
    for i in range(0, len(good), max(1, len(good) // 300)):
        for cut in (False, True):
            path.write_bytes(good[:i] if cut else good[:i] + bytes([good[i] ^ 0xA5]) + good[i + 1:])
            try:
                got = load_inputs(path)
            except InputError:
                continue
            assert got and all(g.array.ndim >= 1 and g.array.shape[0] >= 1 for g in got)
