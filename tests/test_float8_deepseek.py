"""A float8 DeepSeek-V3 as the Hub ships it, end to end: convert (dequantized on the fly),
verify, export.

The fixture is the tiny seeded DeepSeek-V3 of ``test_parallel_core_deepseek``, its
projections quantized with the reference formula (``test_float8.quantize``: per block,
scale = amax / 448) into ``float8_e4m3fn`` + ``weight_scale_inv``, with a block size that
is not the Hub's 128×128 (it comes from ``quantization_config.weight_block_size``). What
ms-port writes must equal the conversion of the same weights dequantized by the reference
(``test_float8.reference``: each block times its scale in float32, then bfloat16).
"""

from __future__ import annotations

import importlib.util
import json
import re

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
needs_mindformers = pytest.mark.skipif(importlib.util.find_spec("mindformers") is None,
                                       reason="mindformers not installed (test extra)")

from test_float8 import QUANTIZATION, quantize, reference  # noqa: E402
from test_parallel_core_deepseek import FAMILY, tiny_deepseek  # noqa: E402

import ms_port  # noqa: E402
from ms_port.read.sources import read_source  # noqa: E402

BLOCK = (16, 8)  # not the Hub's 128×128: read from the config
#: what DeepSeek-V3's files hold in float8: every projection (attention, MLPs, experts)
QUANTIZED = re.compile(r".*_proj(_with_mqa)?\.weight$")


@pytest.fixture(scope="module")
def deepseeks(tmp_path_factory):
    """The tiny bf16 DeepSeek-V3 quantized (``fp8``), and the same weights dequantized by
    the reference formula (``ref``)."""
    from safetensors.torch import load_file, save_file

    root = tmp_path_factory.mktemp("float8-deepseek")
    original = tiny_deepseek(root / "bf16", dtype="bfloat16")
    tensors = load_file(original / "model.safetensors")
    fp8, dequantized = {}, {}
    for name, t in tensors.items():
        if QUANTIZED.match(name):
            q, s = quantize(t, BLOCK)
            fp8[name], fp8[name + "_scale_inv"] = q, s
            dequantized[name] = reference(q, s, BLOCK)
        else:
            fp8[name] = dequantized[name] = t
    assert sum(n.endswith("_scale_inv") for n in fp8) > 20
    config = json.loads((original / "config.json").read_text())
    for kind, state in (("fp8", fp8), ("ref", dequantized)):
        (root / kind).mkdir()
        save_file(state, root / kind / "model.safetensors", metadata={"format": "pt"})
        quant = {"quantization_config": {**QUANTIZATION, "weight_block_size": list(BLOCK)}}
        (root / kind / "config.json").write_text(
            json.dumps({**config, **(quant if kind == "fp8" else {})}))
    return root


def _tensors(path):
    return {i.name: np.asarray(i.load()) for i in read_source(path)}


def test_float8_deepseek_converts_to_the_reference_dequantization(deepseeks, tmp_path):
    ours = ms_port.convert(deepseeks / "fp8", ms_model=FAMILY, output=tmp_path / "fp8.ckpt")
    assert ours.ok, ours.plan.problems()[:3]
    assert ms_port.convert(deepseeks / "ref", ms_model=FAMILY, output=tmp_path / "ref.ckpt").ok
    got, want = _tensors(tmp_path / "fp8.ckpt"), _tensors(tmp_path / "ref.ckpt")
    assert list(got) == list(want)
    for name in want:
        assert got[name].dtype == want[name].dtype and got[name].tobytes() == want[name].tobytes(
        ), name
    # the scales were consumed, not carried or left over
    assert not ours.plan.unused and not any("scale_inv" in m.source for m in ours.plan.matches)
    plain = _tensors(deepseeks / "bf16")  # quantizing moved the projections: it shows
    assert not np.array_equal(_tensors(deepseeks / "ref")["model.layers.1.self_attn.o_proj.weight"],
                              plain["model.layers.1.self_attn.o_proj.weight"])


@needs_mindformers
def test_float8_deepseek_verifies_and_exports(deepseeks, tmp_path):
    out = tmp_path / "fp8.ckpt"
    assert ms_port.convert(deepseeks / "fp8", ms_model=FAMILY, output=out).ok
    report = ms_port.verify(deepseeks / "fp8", out, ms_model=FAMILY)
    # the PyTorch side reads the float8 source dequantized, as convert did
    assert report.verdict == "PASS", report.reasons
    assert report.tensors.counts["identical"] == len(report.tensors.deltas)
    back = ms_port.export(out, ms_model=FAMILY, config=deepseeks / "ref" / "config.json",
                          output=tmp_path / "back")
    assert back.ok
    again, ref = _tensors(tmp_path / "back"), _tensors(deepseeks / "ref")
    assert set(again) == set(ref)
    for name in ref:
        assert again[name].tobytes() == ref[name].tobytes(), name
