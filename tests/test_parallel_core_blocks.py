"""verify one block at a time for MindFormers' parallel_core Qwen3 / Qwen3-MoE: its own
network in GRAPH mode with CPU stand-ins, one cell per block; and every wrong layout the
issue names FAILs, naming its tensor and the layer where the forward parts.

Skipped where transformers / mindformers (the test extra) are absent.
"""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("torch")
if importlib.util.find_spec("mindformers") is None:
    pytest.skip("mindformers not installed (test extra)", allow_module_level=True)

from test_parallel_core import QWEN3, tiny_qwen3, tiny_qwen3_moe  # noqa: E402

import ms_port  # noqa: E402
from ms_port.testing import rewrite_checkpoint, with_reversed  # noqa: E402

H, HEADS, KV, D, E, F = QWEN3["hidden_size"], 8, 2, 16, 4, 32


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """Each family's tiny model and its conversion, made once."""
    made = {}
    for family, make in (("mindformers:qwen3", tiny_qwen3),
                         ("mindformers:qwen3_moe", tiny_qwen3_moe)):
        root = tmp_path_factory.mktemp(family.split(":")[1])
        src = make(root / "hf")
        out = root / "m.ckpt"
        assert ms_port.convert(src, ms_model=family, output=out).ok
        made[family] = (src, out)
    return made


@pytest.mark.parametrize("family", ["mindformers:qwen3", "mindformers:qwen3_moe"])
def test_layers_pass_block_by_block_with_the_whole_networks_verdict(converted, family):
    """Every block compared (its output, and fed PyTorch's input), the logits within the
    bound; the same logits error as the whole network's run, to rounding."""
    src, out = converted[family]
    layers = ms_port.verify(src, out, ms_model=family, mode="layers")
    assert layers.verdict == "PASS", layers.reasons
    assert layers.mode == "layers" and "--mode layers" in layers.mode_reason
    assert [c.ms for c in layers.layers if c.paired_by == "name"] == [
        "embedding.word_embeddings", "decoder.layers.0", "decoder.layers.1", "output_layer"]
    assert [c.torch for c in layers.layers if c.paired_by == "fed"] == [
        "model.layers.0", "model.layers.1", "head"]
    assert all(c.error < 1e-5 for c in layers.layers)
    ran = next(n for n in layers.notes if "CPU stand-ins" in n)
    assert "rms-norm" in ran and ("experts-grouped-matmul" in ran) == family.endswith("moe")
    whole = ms_port.verify(src, out, ms_model=family, mode="whole")
    assert whole.verdict == "PASS" and whole.mode == "whole"
    assert layers.outputs[0].error == pytest.approx(whole.outputs[0].error, rel=0.2, abs=2e-7)


def test_a_tied_head_runs_by_layers_with_the_embeddings_weight(tmp_path):
    """Tied: MindFormers' head is ``output_layer`` given the embedding's weight (the
    checkpoint has no ``output_layer.weight``); the head block reads it from there."""
    src = tiny_qwen3(tmp_path / "tied", tied=True)
    out = tmp_path / "tied.ckpt"
    assert ms_port.convert(src, ms_model="mindformers:qwen3", output=out).ok
    report = ms_port.verify(src, out, ms_model="mindformers:qwen3", mode="layers")
    assert report.verdict == "PASS", report.reasons
    head = next(c for c in report.layers if c.ms == "output_layer")
    assert head.status == "ok" and head.error < 1e-5


def test_auto_goes_by_layers_when_the_whole_networks_do_not_fit(converted, monkeypatch):
    from ms_port.check import blocks

    monkeypatch.setattr(blocks, "WHOLE_SHARE", 1e-9)  # the whole networks never fit
    src, out = converted["mindformers:qwen3"]
    report = ms_port.verify(src, out, ms_model="mindformers:qwen3")
    assert report.verdict == "PASS" and report.mode == "layers"
    assert "GiB available" in report.mode_reason


def test_a_network_that_cannot_run_by_layers_is_inconclusive_never_pass(converted, monkeypatch):
    from ms_port.archs.parallel_core import cpu as parallel_core_cpu

    def no_kernel(*_a, **_k):
        raise RuntimeError("Unsupported op [SomeKernel] on CPU")

    monkeypatch.setattr(parallel_core_cpu, "build_network", no_kernel)
    src, out = converted["mindformers:qwen3"]
    report = ms_port.verify(src, out, ms_model="mindformers:qwen3", mode="layers")
    assert report.verdict == "INCONCLUSIVE" and report.mode == "tensors"
    assert "SomeKernel" in report.reasons[0]


# --- each wrong layout FAILs, naming its tensor ------------------------------------------

def _plain_qkv(grouped: np.ndarray) -> np.ndarray:
    """[q; k; v] from the grouped layout (per KV group: its query heads, k, v)."""
    per = grouped.reshape(KV, (HEADS // KV + 2) * D, H)
    q, k, v = per[:, :-2 * D], per[:, -2 * D:-D], per[:, -D:]
    return np.concatenate([q.reshape(-1, H), k.reshape(-1, H), v.reshape(-1, H)])


def _halves(interleaved: np.ndarray) -> np.ndarray:
    """[gate; up] from rows interleaved gate/up."""
    return np.concatenate([interleaved[0::2], interleaved[1::2]])


def _untransposed(weight1: np.ndarray) -> np.ndarray:
    """Each expert's [H, 2F] block as its transpose's bytes: what a table without the
    transpose would write."""
    return weight1.reshape(E, H, 2 * F).transpose(0, 2, 1).reshape(E * H, 2 * F)


def _experts_reversed(weight1: np.ndarray) -> np.ndarray:
    return weight1.reshape(E, H, 2 * F)[::-1].reshape(E * H, 2 * F)


WRONG = [
    ("mindformers:qwen3", "plain qkv", "self_attention.linear_qkv.weight", _plain_qkv),
    ("mindformers:qwen3", "fc1 halves", "mlp.linear_fc1.weight", _halves),
    ("mindformers:qwen3_moe", "experts untransposed", "mlp.experts.weight1", _untransposed),
    ("mindformers:qwen3_moe", "experts reversed", "mlp.experts.weight1", _experts_reversed),
]


@pytest.mark.parametrize("family,why,suffix,wrong", WRONG, ids=[w[1] for w in WRONG])
def test_each_wrong_layout_fails_naming_its_tensor_and_layer(converted, tmp_path, family, why,
                                                             suffix, wrong):
    src, out = converted[family]
    name = f"decoder.layers.1.{suffix}"
    bad = rewrite_checkpoint(out, tmp_path / "wrong.ckpt",
                             lambda t: t.update({name: wrong(t[name])}) or t)
    report = ms_port.verify(src, bad, ms_model=family, mode="layers")
    assert report.verdict == "FAIL", why
    assert name in " ".join(report.reasons), report.reasons
    assert report.first_divergence is not None
    assert report.first_divergence.ms_name == "decoder.layers.1", report.first_divergence
    assert not report.outputs[0].ok
    fed = next(c for c in report.layers if c.paired_by == "fed" and c.torch == "model.layers.1")
    assert fed.status == "fail"  # fed PyTorch's own input, the layer itself is wrong


def test_the_plain_layouts_really_differ_from_ours(converted):
    """The wrong layouts above are other bytes, not the same tensor by accident."""
    from ms_port.read.sources import read_source

    for family, _why, suffix, wrong in WRONG:
        ours = {i.name: np.asarray(i.load()) for i in read_source(converted[family][1])}
        tensor = ours[f"decoder.layers.1.{suffix}"]
        assert wrong(tensor).shape == tensor.shape
        assert not np.array_equal(wrong(tensor), tensor)


def test_the_cli_says_which_mode_ran(converted):
    from click.testing import CliRunner

    from ms_port.cli import main

    src, out = converted["mindformers:qwen3"]
    run = CliRunner().invoke(main, ["verify", str(src), str(out), "--ms-model",
                                    "mindformers:qwen3", "--mode", "layers", "--json"])
    data = json.loads(run.output)
    assert run.exit_code == 0 and data["verdict"] == "PASS" and data["mode"] == "layers"


# --- DeepSeek-V3: dense and mixture-of-experts layers --------------------------------------

@pytest.mark.parametrize("options", [{}, {"mla_qkv_concat": False},
                                     {"use_interleaved_weight_layout_mlp": False}])
def test_deepseek_by_layers_runs_each_layer_as_the_one_of_its_kind(tmp_path, options):
    """The small networks hold a dense layer and an MoE layer; each layer runs as the one
    of its kind. The Hub's MTP layer is converted and proven by tensors, not run."""
    from test_parallel_core_deepseek import FAMILY, tiny_deepseek

    src = tiny_deepseek(tmp_path / "ds", mtp=1, mtp_weights=True)
    out = tmp_path / "ds.ckpt"
    assert ms_port.convert(src, ms_model=FAMILY, output=out, ms_options=options or None).ok
    report = ms_port.verify(src, out, ms_model=FAMILY, mode="layers",
                            ms_options=options or None)
    assert report.verdict == "PASS", report.reasons
    assert [c.ms for c in report.layers if c.paired_by == "name"] == [
        "embedding.word_embeddings", "decoder.layers.0", "decoder.layers.1", "decoder.layers.2",
        "output_layer"]
    assert report.tensors.counts["identical"] == len(report.tensors.deltas)
    assert any(d.target.startswith("mtp.") for d in report.tensors.deltas)
    assert [n for n in report.notes if "Multi-Token Prediction layer (the Hub's "
            "model.layers.3, MindFormers' mtp.*) not run" in n]
    if not options:  # the whole network in each layout: test_parallel_core_deepseek
        whole = ms_port.verify(src, out, ms_model=FAMILY, mode="whole")
        assert whole.verdict == "PASS"
        assert report.outputs[0].error == pytest.approx(whole.outputs[0].error, rel=0.2,
                                                        abs=2e-7)


@pytest.mark.parametrize("layer", [0, 2])  # the dense layer, an MoE layer
def test_deepseek_wrong_layer_fails_there(tmp_path, layer):
    from test_parallel_core_deepseek import FAMILY, tiny_deepseek

    src = tiny_deepseek(tmp_path / "ds")
    out = tmp_path / "ds.ckpt"
    assert ms_port.convert(src, ms_model=FAMILY, output=out).ok
    name = f"decoder.layers.{layer}.self_attention.linear_qkv.weight"
    bad = with_reversed(out, tmp_path / "wrong.ckpt", name)
    report = ms_port.verify(src, bad, ms_model=FAMILY, mode="layers")
    assert report.verdict == "FAIL" and name in " ".join(report.reasons)
    assert report.first_divergence.ms_name == f"decoder.layers.{layer}"
    assert not [n for n in report.notes if "Multi-Token" in n]  # this model has none


def test_a_released_parameter_takes_new_data_checked_against_its_built_shape():
    """release() leaves a one-element placeholder (a GRAPH-compiled network keeps its
    parameters' data resident otherwise); set_parameters then checks new data against
    the shape the network was built with, and refuses one that does not fit, naming it."""
    import mindspore as ms

    from ms_port.archs.llama.blocks import set_parameters
    from ms_port.archs.parallel_core.blocks import release
    from ms_port.errors import TargetError

    param = ms.Parameter(ms.Tensor(np.ones((4, 3), np.float32)), name="w")
    release([param])
    assert tuple(param.shape) == (1, 1)
    new = np.arange(12, dtype=np.float32).reshape(4, 3)
    set_parameters({"w": param}, {"w": new.copy()}, {"w": (4, 3)})
    assert np.array_equal(param.asnumpy(), new)
    release([param])
    with pytest.raises(TargetError, match=r"w \(3, 4\) does not fit .*\(4, 3\)"):
        set_parameters({"w": param}, {"w": new.reshape(3, 4)}, {"w": (4, 3)})
