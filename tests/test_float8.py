"""Float8 sources: every safetensors dtype is listed, and DeepSeek-V3's block-scaled float8
weights are read as bfloat16, bit for bit what its reference computes.

Fixtures are made the way DeepSeek's ``bf16_cast_fp8`` makes them: per block of
``quantization_config.weight_block_size``, scale = amax / 448 and the weight divided by it
cast to ``float8_e4m3fn``. The reference they are compared with is the formula of
``fp8_cast_bf16`` / ``weight_dequant``, computed with torch.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

import ms_port
from ms_port.cli import main
from ms_port.errors import SourceError
from ms_port.read.fp8 import Dequantized, dequantize
from ms_port.read.sources import SAFETENSORS_DTYPES, SAFETENSORS_STORED_DTYPES, read_source
from ms_port.testing import tiny_hf_lm

FLOAT8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
QUANTIZATION = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic"}


def quantize(w: torch.Tensor, block: tuple[int, int],
             dtype: torch.dtype = torch.float8_e4m3fn) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference's inverse: per block, scale = amax / max, weight / scale as float8."""
    rows, cols = w.shape
    grid = (-(-rows // block[0]), -(-cols // block[1]))
    padded = torch.zeros(grid[0] * block[0], grid[1] * block[1])
    padded[:rows, :cols] = w.float()
    blocks = padded.view(grid[0], block[0], grid[1], block[1])
    scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / FLOAT8_MAX[dtype]
    q = (blocks / scale[:, None, :, None]).view_as(padded)[:rows, :cols].to(dtype)
    return q.contiguous(), scale


def reference(q: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """DeepSeek-V3's dequantization: float32 weight × its block's scale, then bfloat16."""
    rows, cols = q.shape
    expanded = scale.repeat_interleave(block[0], 0)[:rows].repeat_interleave(block[1], 1)
    return (q.float() * expanded[:, :cols]).to(torch.bfloat16)


def bits(array) -> np.ndarray:
    """bfloat16 bits of a torch tensor or an ml_dtypes array, as uint16."""
    if isinstance(array, torch.Tensor):
        return array.view(torch.int16).numpy().view(np.uint16)
    return np.asarray(array).view(np.uint16)


def weight(shape: tuple[int, int], seed: int = 0) -> torch.Tensor:
    """A bf16 weight growing along both axes (2^-5 to 2^4), so every block's scale differs."""
    gen = torch.Generator().manual_seed(seed)
    rows, cols = (torch.arange(n, dtype=torch.float32) / n for n in shape)
    magnitude = 2 ** (6 * rows[:, None] + 3 * cols[None, :] - 5)
    return (torch.randn(shape, generator=gen) * magnitude).to(torch.bfloat16)


def float8_dir(path: Path, weights: dict[str, tuple[int, int]], block: tuple[int, int] | None,
               *, extra: dict | None = None, config: dict | None = None) -> Path:
    """A model folder: each weight as float8 + ``_scale_inv``, a bf16 norm, config.json."""
    path.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for i, (name, shape) in enumerate(weights.items()):
        q, s = quantize(weight(shape, seed=i), block or (128, 128))
        tensors[name], tensors[name + "_scale_inv"] = q, s
    tensors["norm.weight"] = torch.ones(8, dtype=torch.bfloat16)
    save_file({**tensors, **(extra or {})}, path / "model.safetensors")
    quant = {} if block is None else {"quantization_config": {
        **QUANTIZATION, "weight_block_size": list(block)}}
    (path / "config.json").write_text(json.dumps({"model_type": "x", **quant, **(config or {})}))
    return path


def _cli(*args: object):
    return CliRunner().invoke(main, [str(a) for a in args], env={"COLUMNS": "200"})


def _refused(result, *needles: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = [ln for ln in result.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) <= 2, result.stderr  # the error and the --debug hint
    for needle in needles:
        assert needle in result.stderr, (needle, result.stderr)


# -- listing: every dtype, metadata only ----------------------------------------------


def test_every_safetensors_dtype_is_known(tmp_path):
    """What the installed safetensors reads, ms-port lists (its own error names them)."""
    header = json.dumps({"t": {"dtype": "NOPE", "shape": [1], "data_offsets": [0, 1]}}).encode()
    (tmp_path / "x.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0")
    with pytest.raises(SafetensorError) as caught:
        safe_open(str(tmp_path / "x.safetensors"), framework="numpy")
    known = set(re.findall(r"`([A-Z0-9_]+)`", str(caught.value).split("expected one of")[1]))
    assert "F8_E4M3" in known and known == set(SAFETENSORS_DTYPES) | set(SAFETENSORS_STORED_DTYPES)


def _raw_safetensors(path: Path, entries: dict[str, tuple[str, list[int], bytes]]) -> Path:
    header, offset, blobs = {}, 0, []
    for name, (code, shape, data) in entries.items():
        header[name] = {"dtype": code, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    return path


def test_inspect_lists_every_float8_dtype(tmp_path):
    gen = torch.Generator().manual_seed(0)
    float8 = {f"w_{d}": (torch.randn(3, 5, generator=gen) * 4).to(getattr(torch, d))
              for d in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
                        "float8_e8m0fnu")}
    save_file(float8, tmp_path / "f8.safetensors")
    packed = _raw_safetensors(tmp_path / "packed.safetensors", {
        "f4": ("F4", [2, 3], bytes([0x12, 0x34, 0x56])),
        "f6": ("F6_E2M3", [2, 4], bytes(range(6))), "g6": ("F6_E3M2", [8], bytes(range(6)))})
    for path in (tmp_path / "f8.safetensors", packed):
        result = _cli("inspect", path)
        assert result.exit_code == 0, result.output
    listed = json.loads(_cli("inspect", tmp_path / "f8.safetensors", "--json").stdout)
    assert {t["name"]: t["dtype"] for t in listed["tensors"]} == {
        n: str(t.dtype).removeprefix("torch.") for n, t in float8.items()}
    assert listed["bytes"] == 5 * 15 and "stored" not in listed["tensors"][0]
    src = read_source(tmp_path / "f8.safetensors")
    for name, t in float8.items():  # loads as stored: ml_dtypes arrays of the same bytes
        array = src[name].load()
        assert array.dtype == getattr(ml_dtypes, src[name].dtype) and array.shape == (3, 5)
        assert array.view(np.uint8).tobytes() == t.view(torch.uint8).numpy().tobytes()
    listed = json.loads(_cli("inspect", packed, "--json").stdout)
    assert [(t["dtype"], t["nbytes"]) for t in listed["tensors"]] == [
        ("float4_e2m1fn", 3), ("float6_e2m3fn", 6), ("float6_e3m2fn", 6)]
    assert read_source(packed)["f4"].load().tolist() == [0x12, 0x34, 0x56]  # packed bytes


# -- dequantization, bit for bit ------------------------------------------------------


@pytest.mark.parametrize("shape,block,dtype", [
    ((300, 260), (128, 128), torch.float8_e4m3fn),  # the Hub's block, partial edge blocks
    ((256, 384), (128, 128), torch.float8_e4m3fn),  # whole blocks
    ((10, 13), (4, 8), torch.float8_e4m3fn),        # ragged both ways
    ((7, 30), (16, 4), torch.float8_e4m3fn),        # a block taller than the weight
    ((10, 13), (4, 8), torch.float8_e5m2),
])
def test_dequantize_is_the_reference_bit_for_bit(shape, block, dtype):
    q, s = quantize(weight(shape), block, dtype)
    assert len(set(s.flatten().tolist())) == s.numel()  # a misplaced scale cannot pass
    ours = dequantize(q.view(torch.uint8).numpy().view(getattr(ml_dtypes, str(dtype)[6:])),
                      s.numpy(), block)
    expected = reference(q, s, block)
    assert ours.dtype == ml_dtypes.bfloat16 and ours.shape == shape
    assert np.array_equal(bits(ours), bits(expected))
    shifted = dequantize(q.view(torch.uint8).numpy().view(getattr(ml_dtypes, str(dtype)[6:])),
                         np.roll(s.numpy(), 1, axis=1), block)  # the twin that must differ
    assert not np.array_equal(bits(shifted), bits(expected))


def test_dequantize_specials_as_torch():
    """Zeros, subnormals, the largest float8, a scale that overflows bfloat16, zero scales."""
    codes = torch.arange(256, dtype=torch.uint8)
    codes = codes[(codes & 0x7F) != 0x7F].view(torch.float8_e4m3fn)  # all but NaN
    q = codes.repeat(4, 1)  # 4 × 254
    s = torch.tensor([[1.0, 2.0 ** -120], [7.59e35, 0.0]])  # 448 × 7.59e35: float32, not bf16
    block = (2, 127)
    ours = dequantize(q.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn), s.numpy(), block)
    assert np.array_equal(bits(ours), bits(reference(q, s, block)))
    assert np.isinf(np.asarray(ours, np.float32)).any()  # rounds to inf, as torch's


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1e-3])
def test_bad_scale_value_refused_naming_it(bad):
    q, s = quantize(weight((10, 13)), (4, 8))
    s[2, 1] = bad
    with pytest.raises(SourceError, match=r"'l\.weight_scale_inv' hold .* at block \(2, 1\)"):
        dequantize(q.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn), s.numpy(),
                   (4, 8), name="l.weight_scale_inv")


def test_source_reads_bfloat16_and_consumes_the_scales(tmp_path):
    shapes = {"a.weight": (10, 13), "b.weight": (9, 16)}
    path = float8_dir(tmp_path / "m", shapes, (4, 8))
    stored = load_file(path / "model.safetensors")
    src = read_source(path)
    assert list(src.tensors) == ["a.weight", "b.weight", "norm.weight"]
    for name in shapes:
        info = src[name]
        assert isinstance(info, Dequantized) and info.dtype == "bfloat16"
        assert (info.stored.dtype, info.scale.name, info.block) == (
            "float8_e4m3fn", name + "_scale_inv", (4, 8))
        expected = reference(stored[name], stored[name + "_scale_inv"], (4, 8))
        assert np.array_equal(bits(info.load()), bits(expected))
    [consumed] = src.skipped
    assert consumed.reason == ("consumed: 2 float8 weights dequantized to bfloat16 with their "
                               "4×8 block scales (quantization_config.weight_block_size)")
    result = _cli("inspect", path)
    assert result.exit_code == 0, result.output
    assert "float8_e4m3fn→bfloat16" in result.stdout and "4×8 block scales" in result.stdout
    listed = json.loads(_cli("inspect", path, "--json").stdout)
    entry = listed["tensors"][0]
    assert entry["dtype"] == "bfloat16" and entry["stored"] == {
        "dtype": "float8_e4m3fn", "nbytes": 130, "block": [4, 8], "format": "float8",
        "scale": {"name": "a.weight_scale_inv", "shape": [3, 2], "dtype": "float32",
                  "numel": 6, "nbytes": 24}}


def test_scales_in_another_shard(tmp_path):
    path = float8_dir(tmp_path / "m", {"a.weight": (10, 13)}, (4, 8))
    tensors = load_file(path / "model.safetensors")
    save_file({"a.weight": tensors["a.weight"]}, path / "model-1.safetensors")
    save_file({k: v for k, v in tensors.items() if k != "a.weight"}, path / "model-2.safetensors")
    (path / "model.safetensors").unlink()
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "a.weight": "model-1.safetensors", "a.weight_scale_inv": "model-2.safetensors",
        "norm.weight": "model-2.safetensors"}}))
    info = read_source(path)["a.weight"]
    expected = reference(tensors["a.weight"], tensors["a.weight_scale_inv"], (4, 8))
    assert np.array_equal(bits(info.load()), bits(expected))


def test_without_a_block_size_float8_is_listed_as_stored(tmp_path):
    path = float8_dir(tmp_path / "m", {"a.weight": (10, 13)}, None)
    src = read_source(path)
    assert src["a.weight"].dtype == "float8_e4m3fn" and "a.weight_scale_inv" in src


# -- refusals: one line, naming the tensor or the key -----------------------------------


def _edit(path: Path, drop: str | None = None, **replace: torch.Tensor) -> Path:
    tensors = load_file(path / "model.safetensors")
    tensors.pop(drop, None)
    save_file({**tensors, **replace}, path / "model.safetensors")
    return path


@pytest.mark.parametrize("case,needles", [
    ("missing", ["float8 weight 'a.weight'", "no block scales 'a.weight_scale_inv'"]),
    ("shape", ["'a.weight_scale_inv' are float32 2×2", "needs 3×2"]),
    ("dtype", ["'a.weight_scale_inv' are float64 3×2"]),
    ("rank", ["'c.weight' has shape 2×4×8", "2-D weights only"]),
    ("float8 scale", ["'a.weight_scale_inv' are float8_e4m3fn 3×2"]),
])
def test_unfit_scales_refused(tmp_path, case, needles):
    path = float8_dir(tmp_path / "m", {"a.weight": (10, 13)}, (4, 8))
    if case == "missing":
        _edit(path, drop="a.weight_scale_inv")
    elif case == "shape":
        _edit(path, **{"a.weight_scale_inv": torch.ones(2, 2)})
    elif case == "dtype":
        _edit(path, **{"a.weight_scale_inv": torch.ones(3, 2, dtype=torch.float64)})
    elif case == "rank":
        _edit(path, **{"c.weight": torch.ones(2, 4, 8).to(torch.float8_e4m3fn),
                       "c.weight_scale_inv": torch.ones(1, 1)})
    else:
        _edit(path, **{"a.weight_scale_inv": torch.ones(3, 2).to(torch.float8_e4m3fn)})
    _refused(_cli("inspect", path), *needles)


@pytest.mark.parametrize("block", [[128], [0, 128], [128.0, 128], "128", [True, 128], [-4, 8],
                                   [2 ** 40, 1], None, {"rows": 128}])
def test_bad_block_size_refused_naming_the_key(tmp_path, block):
    path = float8_dir(tmp_path / "m", {"a.weight": (10, 13)}, (4, 8))
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"]["weight_block_size"] = block
    (path / "config.json").write_text(json.dumps(config))
    _refused(_cli("inspect", path), "quantization_config.weight_block_size is",
             "two positive integers")


@pytest.mark.parametrize("quantization,needle", [
    ({"quant_method": "fp8"}, "no quantization_config.weight_block_size, but float8 weight "
                              "'a.weight' has block scales"),
    ([128, 128], "quantization_config is a list, not an object"),
])
def test_unusable_quantization_config_refused(tmp_path, quantization, needle):
    path = float8_dir(tmp_path / "m", {"a.weight": (10, 13)}, None,
                      config={"quantization_config": quantization})
    _refused(_cli("inspect", path), needle)


# -- convert: a tiny float8 LLaMA into MindFormers ------------------------------------

LLAMA_BLOCK = (16, 40)  # ragged: 64 and 96 are no multiples of 40


@pytest.fixture(scope="module")
def llamas(tmp_path_factory):
    """The tiny bf16 LLaMA, its float8 twin, and the float8 twin dequantized by torch."""
    root = tmp_path_factory.mktemp("float8-llama")
    original = tiny_hf_lm("llama", root / "bf16", dtype="bfloat16")
    tensors = load_file(original / "model.safetensors")
    fp8, dequantized = {}, {}
    for name, t in tensors.items():
        if name.endswith("proj.weight"):
            q, s = quantize(t, LLAMA_BLOCK)
            fp8[name], fp8[name + "_scale_inv"] = q, s
            dequantized[name] = reference(q, s, LLAMA_BLOCK)
        else:
            fp8[name] = dequantized[name] = t
    config = json.loads((original / "config.json").read_text())
    for kind, state, quant in (("fp8", fp8, True), ("ref", dequantized, False)):
        (root / kind).mkdir()
        save_file(state, root / kind / "model.safetensors", metadata={"format": "pt"})
        extra = {"quantization_config": {**QUANTIZATION, "weight_block_size": [*LLAMA_BLOCK]}}
        (root / kind / "config.json").write_text(json.dumps({**config, **(extra if quant else {})}))
    return root


def _ckpt(path: Path) -> dict[str, np.ndarray]:
    return {t.name: np.array(t.load()) for t in read_source(path, strip_prefixes=False)}


def test_convert_float8_llama_writes_the_reference_bf16(llamas, tmp_path):
    result = _cli("convert", llamas / "fp8", "--ms-model", "mindformers:llama",
                  "-o", tmp_path / "fp8.ckpt")
    assert result.exit_code == 0, result.output
    assert ("float8:  14 float8 weights dequantized to bfloat16 with their 16×40 block scales "
            "(quantization_config.weight_block_size)") in result.stdout
    report = ms_port.convert(llamas / "ref", ms_model="mindformers:llama",
                             output=tmp_path / "ref.ckpt")
    assert report.ok and not report.plan.unused
    ours, ref = _ckpt(tmp_path / "fp8.ckpt"), _ckpt(tmp_path / "ref.ckpt")
    assert list(ours) == list(ref) and len(ours) == 21
    for name in ref:
        assert ours[name].dtype == ref[name].dtype == ml_dtypes.bfloat16, name
        assert ours[name].tobytes() == ref[name].tobytes(), name
    ms_port.convert(llamas / "bf16", ms_model="mindformers:llama", output=tmp_path / "bf16.ckpt")
    plain = _ckpt(tmp_path / "bf16.ckpt")  # quantization moved the weights: it shows
    assert sum(ours[n].tobytes() != plain[n].tobytes() for n in plain) == 14


def test_convert_refuses_a_bad_scale_value_and_writes_nothing(llamas, tmp_path):
    path = shutil.copytree(llamas / "fp8", tmp_path / "fp8")
    name = "model.layers.1.mlp.down_proj.weight_scale_inv"
    scale = load_file(path / "model.safetensors")[name]
    scale[0, 1] = float("nan")
    _edit(path, **{name: scale})
    result = _cli("convert", path, "--ms-model", "mindformers:llama", "-o", tmp_path / "o.ckpt")
    _refused(result, f"'{name}' hold nan at block (0, 1)")
    assert not (tmp_path / "o.ckpt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fp8"]


def test_convert_without_block_size_refuses_float8(llamas, tmp_path):
    path = shutil.copytree(llamas / "fp8", tmp_path / "fp8")
    config = json.loads((path / "config.json").read_text())
    del config["quantization_config"]
    (path / "config.json").write_text(json.dumps(config))
    result = _cli("convert", path, "--ms-model", "mindformers:llama", "-o", tmp_path / "o.ckpt",
                  "--allow-unused")
    _refused(result, "has dtype float8_e4m3fn, which MindSpore cannot load",
             "quantization_config.weight_block_size")
    assert not (tmp_path / "o.ckpt").exists()


@pytest.mark.parametrize("extra", [["--format", "safetensors"], ["--max-shard-size", "1MB"]])
def test_unscaled_float8_into_safetensors_output_is_one_line(tmp_path, extra):
    """A float8 tensor with no block scales cannot be written for MindSpore in any format:
    one line, exit 2, nothing written (it was a KeyError traceback for safetensors)."""
    import torch
    from click.testing import CliRunner
    from safetensors.torch import save_file

    from ms_port.cli import main

    src = tmp_path / "w.safetensors"
    save_file({"w": torch.ones(4, 4).to(torch.float8_e4m3fn)}, str(src))
    target = tmp_path / "t.ckpt"
    from ms_port.read.ckpt import CkptWriter

    with open(target, "wb") as f, CkptWriter(f) as writer:
        writer.write("w", np.ones((4, 4), np.float32))
    out = tmp_path / ("out" if "--max-shard-size" in extra else "out.safetensors")
    run = CliRunner().invoke(main, ["convert", str(src), "--target", str(target), "-o",
                                    str(out), *extra])
    lines = run.output.strip().splitlines()
    assert run.exit_code == 2, run.output
    assert lines[0].startswith("error: ") and "float8_e4m3fn" in lines[0], run.output
    assert len(lines) == 2 and not out.exists()
