"""DeepSeek-V4's quantized Hub format read as bfloat16, held to transformers' own
dequantization (``Fp8Dequantize._dequantize_one``, what ``from_pretrained(...,
dequantize=True)`` runs) bit for bit:

- float8_e4m3fn weights with ``<stem>.scale`` block scales in float8_e8m0fnu (128 × 128);
- MXFP4 routed experts: int8 ``[rows, cols / 2]``, two e2m1 values a byte (low nibble
  first), an e8m0 scale per 32 values of a row, found by dtypes and shapes.

The scales are consumed (reported once), a NaN scale (e8m0 code 255) is refused naming it,
and a weight whose scales do not fit is listed as stored.
"""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

from ms_port.errors import SourceError
from ms_port.read.fp8 import Dequantized, dequantize, dequantize_mxfp4
from ms_port.read.sources import read_source

torch = pytest.importorskip("torch")
finegrained = pytest.importorskip("transformers.integrations.finegrained_fp8")
safetensors_torch = pytest.importorskip("safetensors.torch")

QUANT = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
         "scale_fmt": "ue8m0", "weight_block_size": [128, 128]}


def _reference(q: torch.Tensor, s: torch.Tensor) -> np.ndarray:
    out = finegrained.Fp8Dequantize(None)._dequantize_one(q, s, torch.bfloat16)
    return out.view(torch.uint16).numpy()


def _e8m0(shape, rng, low=100, high=150):
    return torch.from_numpy(rng.integers(low, high, shape, dtype=np.uint8)).view(
        torch.float8_e8m0fnu)


def _folder(tmp_path, tensors):
    safetensors_torch.save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "deepseek_v4", "quantization_config": QUANT}))
    return tmp_path


@pytest.mark.parametrize("rows, cols", [(64, 256), (7, 96)])
def test_mxfp4_is_transformers_dequantization_bit_for_bit(rows, cols):
    rng = np.random.default_rng(rows)
    packed = torch.from_numpy(rng.integers(-128, 128, (rows, cols // 2), dtype=np.int8))
    scale = _e8m0((rows, cols // 32), rng)
    ours = dequantize_mxfp4(packed.numpy(), scale.view(torch.uint8).numpy().view(
        ml_dtypes.float8_e8m0fnu))
    assert ours.shape == (rows, cols)
    assert np.array_equal(ours.view(np.uint16), _reference(packed, scale))


def test_float8_with_e8m0_block_scales_is_transformers_dequantization_bit_for_bit():
    rng = np.random.default_rng(1)
    q = torch.from_numpy(rng.standard_normal((256, 384)).astype(np.float32)).to(
        torch.float8_e4m3fn)
    scale = _e8m0((2, 3), rng)
    ours = dequantize(q.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn),
                      scale.view(torch.uint8).numpy().view(ml_dtypes.float8_e8m0fnu),
                      (128, 128))
    assert np.array_equal(ours.view(np.uint16), _reference(q, scale))


def test_a_v4_hub_file_reads_as_bfloat16_its_scales_consumed(tmp_path):
    rng = np.random.default_rng(2)
    w = torch.from_numpy(rng.standard_normal((256, 128)).astype(np.float32)).to(
        torch.float8_e4m3fn)
    experts = torch.from_numpy(rng.integers(-128, 128, (64, 64), dtype=np.int8))
    tensors = {"layers.0.attn.wq_a.weight": w, "layers.0.attn.wq_a.scale": _e8m0((2, 1), rng),
               "layers.0.ffn.experts.0.w1.weight": experts,
               "layers.0.ffn.experts.0.w1.scale": _e8m0((64, 4), rng),
               "layers.0.attn_norm.weight": torch.ones(128, dtype=torch.bfloat16)}
    src = read_source(_folder(tmp_path, tensors))
    assert sorted(src.tensors) == ["layers.0.attn.wq_a.weight", "layers.0.attn_norm.weight",
                                   "layers.0.ffn.experts.0.w1.weight"]
    dense, expert = src["layers.0.attn.wq_a.weight"], src["layers.0.ffn.experts.0.w1.weight"]
    assert isinstance(dense, Dequantized) and dense.kind == "float8"
    assert isinstance(expert, Dequantized) and expert.kind == "mxfp4"
    assert (expert.dtype, expert.shape, expert.block) == ("bfloat16", (64, 128), (1, 32))
    assert np.array_equal(np.asarray(dense.load()).view(np.uint16),
                          _reference(w, tensors["layers.0.attn.wq_a.scale"]))
    assert np.array_equal(np.asarray(expert.load()).view(np.uint16),
                          _reference(experts, tensors["layers.0.ffn.experts.0.w1.scale"]))
    said = " ".join(s.kind + " " + s.reason for s in src.skipped)
    assert "1 float8 weight" in said and "1 MXFP4 weight" in said


def test_a_nan_scale_is_refused_naming_it(tmp_path):
    rng = np.random.default_rng(3)
    scale = np.full((8, 2), 127, np.uint8)
    scale[3, 1] = 255  # e8m0's NaN
    tensors = {"layers.0.ffn.experts.0.w2.weight": torch.from_numpy(
        rng.integers(-128, 128, (8, 32), dtype=np.int8)),
        "layers.0.ffn.experts.0.w2.scale": torch.from_numpy(scale).view(torch.float8_e8m0fnu)}
    src = read_source(_folder(tmp_path, tensors))
    with pytest.raises(SourceError, match=r"layers\.0\.ffn\.experts\.0\.w2\.scale.*NaN"):
        src["layers.0.ffn.experts.0.w2.weight"].load()


def test_int8_whose_scales_do_not_fit_stays_int8(tmp_path):
    rng = np.random.default_rng(4)
    tensors = {"layers.0.ffn.experts.0.w3.weight": torch.from_numpy(
        rng.integers(-128, 128, (8, 32), dtype=np.int8)),
        "layers.0.ffn.experts.0.w3.scale": _e8m0((8, 3), rng)}  # 64 values need 2 a row
    src = read_source(_folder(tmp_path, tensors))
    assert src["layers.0.ffn.experts.0.w3.weight"].dtype == "int8"
