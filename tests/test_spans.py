"""verify by layers runs the vocabulary a span of rows at a time: the embedding and the
head never need more than a decoder layer, and the report is the whole block's.

The spans are forced small here (``SPAN_NUMEL``: a vocabulary of 128 in spans of 40 or
31 rows) so that the tiny fixtures run them; every family's blocks (LLaMA and GLM-4 in
PyNative, Qwen3 in GRAPH mode) give the report the whole blocks give, field for field,
and a wrong row of the head or of the embedding FAILs there, in whichever span it lies.
Skipped where transformers / mindformers (the test extra) are absent.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from ms_port.check.layers import Event
from ms_port.check.spans import Span, measured, merge_events, merge_output, plan_spans


def test_spans_cover_the_vocabulary_and_put_the_outputs_back_together():
    ids = np.array([[5, 99, 41, 5]])
    # an embedding runs only the spans holding an id (here the second input's 130 too)
    spans = plan_spans(131, 40, embedding=True, ids=[ids, np.array([[130]])])
    assert [(s.start, s.stop) for s in spans] == [(0, 40), (40, 80), (80, 120), (120, 131)]
    assert plan_spans(131, 40, embedding=True, ids=[ids])[-1].stop == 120
    assert [s.rows for s in plan_spans(100, 40, embedding=False, ids=[])] == [40, 40, 20]
    table = np.random.default_rng(0).standard_normal((131, 3))
    # each span looks up its own ids (others at row 0): put back, the whole lookup
    parts = [table[s.start:s.stop][s.ids(ids)] for s in spans]
    assert np.array_equal(merge_output(parts, spans, ids), table[ids])
    # a head's columns side by side; a layer not over the vocabulary taken once
    head = [Span(a, b, False) for a, b in ((0, 2), (2, 5))]
    x, w = np.ones((1, 4, 3)), table[:5]
    per_span = [[Event("norm", 0, 0, "RMSNorm", True, [x]),
                 Event("lm_head", 0, 1, "Linear", True, [x @ w[s.start:s.stop].T])]
                for s in head]
    merged = merge_events(per_span, head, ids, ("lm_head",))
    assert merged[0].arrays[0] is x and np.array_equal(merged[1].arrays[0], x @ w.T)
    # measured as Measure measures: the distance from the recorded pass, per layer
    other = [Event("lm_head", 0, 1, "Linear", True, [merged[1].arrays[0] * (1 + 1e-3)])]
    assert measured(merged, other, "recorded") == {("lm_head", 0): pytest.approx(1e-3)}


def test_a_block_in_spans_is_held_to_one_spans_memory_before_it_is_read():
    """verify refuses a block that cannot fit before reading it; a vocabulary run in spans
    needs one span of it, not the whole (a 70B head is 8 GiB in float64)."""
    from types import SimpleNamespace

    from ms_port.archs.llama.blocks import Piece
    from ms_port.check.blocks import BLOCK_MARGIN, _check_fits
    from ms_port.errors import ForwardUnavailable
    from ms_port.read.tensors import TensorInfo

    head = Piece("head", "head", {"lm_head.weight": "lm_head.weight"}, {},
                 rows=("lm_head.weight",), wide=("lm_head",))
    source = SimpleNamespace(tensors={"lm_head.weight": TensorInfo("lm_head.weight",
                                                                   (1000, 10), "float32")})
    one_span = 100 * 10 * 8 + BLOCK_MARGIN
    _check_fits(head, source, True, available=one_span, span_rows=100)
    with pytest.raises(ForwardUnavailable, match="block head needs"):
        _check_fits(head, source, True, available=one_span)
    with pytest.raises(ForwardUnavailable):
        _check_fits(head, source, True, available=one_span - 1, span_rows=100)


transformers = pytest.importorskip("transformers")
needs_mindformers = pytest.mark.skipif(importlib.util.find_spec("mindformers") is None,
                                       reason="mindformers not installed (test extra)")

import ms_port  # noqa: E402
from ms_port.check import blocks  # noqa: E402
from ms_port.testing import rewrite_checkpoint, tiny_hf_lm  # noqa: E402

FIELDS = ("ms", "torch", "call", "paired_by", "shape", "noise", "bound", "sensitivity",
          "status")


def _fields(report):
    return ([tuple(getattr(c, f) for f in FIELDS) for c in report.layers],
            [(o.noise, o.bound, o.status) for o in report.outputs], report.verdict)


def _same_errors(spans, whole):
    """Each error the same to float32's rounding: a float32 matrix product's rounding
    depends on its output's width (oneDNN's blocking: with AVX2, a head's error 2.05e-7
    whole, 2.20e-7 in spans of 40 columns, its float32 noise 2.1e-7)."""
    pairs = [(a.error, b.error, b.noise) for a, b in zip(spans.layers, whole.layers)]
    pairs += [(a.error, b.error, b.noise) for a, b in zip(spans.outputs, whole.outputs)]
    return all(abs(a - b) <= max(noise or 0.0, 1e-7) for a, b, noise in pairs)


def _made(family, root):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    if family == "mindformers:llama":
        src = tiny_hf_lm("qwen2", root / "hf", tied=True, dtype="bfloat16", layers=2)
    elif family == "mindformers:glm4":
        from test_glm import _hf
        src = _hf(root)
    else:
        from test_parallel_core import tiny_qwen3
        src = tiny_qwen3(root / "hf")
    out = root / "m.ckpt"
    assert ms_port.convert(src, ms_model=family, output=out).ok
    return src, out


def _spans_run(monkeypatch, rows=40):
    """Make the spans ``rows`` rows of the tiny models' width 64, and count what ran."""
    ran = []
    real = blocks.plan_spans

    def plan(*args, **kwargs):
        spans = real(*args, **kwargs)
        ran.append([(s.start, s.stop) for s in spans])
        return spans

    monkeypatch.setattr(blocks, "plan_spans", plan)
    monkeypatch.setattr(blocks, "SPAN_NUMEL", 64 * rows)
    return ran


@needs_mindformers
@pytest.mark.parametrize("family", ["mindformers:glm4", "mindformers:qwen3"])
def test_the_vocabulary_in_spans_gives_the_whole_blocks_report(family, tmp_path, monkeypatch):
    """(LLaMA's blocks: test_spans_and_one_module_at_a_time_give_the_whole_blocks_report.)"""
    src, out = _made(family, tmp_path)
    whole = ms_port.verify(src, out, ms_model=family, mode="layers")
    # GRAPH mode compiles a network per span size: two equal spans compile once
    rows = 64 if family == "mindformers:qwen3" else 40
    ran = _spans_run(monkeypatch, rows)
    spans = ms_port.verify(src, out, ms_model=family, mode="layers")
    # the embedding (only the spans its ids fall in) and the head, each in spans
    assert len(ran) == 2 and ran[1] == [(a, min(a + rows, 128)) for a in range(0, 128, rows)]
    assert spans.verdict == "PASS", spans.reasons
    # the same layers paired, the same noise, sensitivity and bounds: the same verdict
    assert _fields(spans) == _fields(whole)
    assert _same_errors(spans, whole)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return _made("mindformers:llama", tmp_path_factory.mktemp("spans"))


def _rows_swapped(name, a, b):
    def edit(tensors):
        w = tensors[name].copy()
        w[[a, b]] = w[[b, a]]
        tensors[name] = w
        return tensors
    return edit


@needs_mindformers
def test_a_wrong_row_fails_in_its_span_naming_the_layer(llama, tmp_path, monkeypatch):
    """Two rows of the tied embedding swapped inside the second span of four: FAIL, the
    tensor named, the lookup failing at the embedding (every token id is fed, ids 50 and
    51 among them), and the head, fed PyTorch's own input, failing in its own right (its
    columns 50 and 51 swapped), whatever came before it."""
    src, out = llama
    tensor = "model.tok_embeddings.embedding_weight"
    bad = rewrite_checkpoint(out, tmp_path / "bad.ckpt", _rows_swapped(tensor, 50, 51))
    np.save(tmp_path / "ids.npy", np.arange(128, dtype=np.int64)[None])
    ran = _spans_run(monkeypatch)
    report = ms_port.verify(src, bad, ms_model="mindformers:llama", inputs=tmp_path / "ids.npy",
                            mode="layers")
    assert len(ran) == 2 and len(ran[0]) == 4 and report.verdict == "FAIL"
    assert tensor in {d.target for d in report.tensors.deltas if d.status == "differs"}
    assert report.first_divergence.ms_name == "model.tok_embeddings"
    status = {c.ms: c.status for c in report.layers}
    assert status["head (fed PyTorch's input)"] == "fail"
    assert status["model.layers.0 (fed PyTorch's input)"] == "ok"


@needs_mindformers
def test_nan_in_spans_is_counted_once_over_every_row(llama, tmp_path, monkeypatch):
    """NaN in two rows of the tied embedding, in two spans (one of them perhaps no token id
    runs): the report counts both, once, though the embedding and the head each read the
    tensor a span at a time."""
    src, out = llama
    tensor = "model.tok_embeddings.embedding_weight"

    def poison(tensors):
        w = tensors[tensor].copy()
        w[[10, 100], 3] = np.nan
        tensors[tensor] = w
        return tensors

    bad = rewrite_checkpoint(out, tmp_path / "nan.ckpt", poison)
    _spans_run(monkeypatch)
    report = ms_port.verify(src, bad, ms_model="mindformers:llama", mode="layers")
    assert report.verdict == "FAIL"
    found = [r for r in report.reasons if r.startswith("weights hold NaN/Inf")]
    assert len(found) == 1 and f"MindSpore {tensor}: 2 NaN" in found[0], report.reasons
    assert found[0].count(tensor) == 1


@needs_mindformers
def test_spans_and_one_module_at_a_time_give_the_whole_blocks_report(llama, monkeypatch):
    """LLaMA's blocks (tied, bfloat16) with the vocabulary in spans and each decoder layer's
    float64 pass reading a module's weights as it runs and letting them go after (a 70B
    layer is 6.4 GiB in float64), against whole blocks loaded whole: the same report.
    Whenever a module runs in the float64 pass, no other module's weights are in memory."""
    src, out = llama
    args = dict(ms_model="mindformers:llama", mode="layers")
    monkeypatch.setattr(blocks, "on_demand", lambda *a, **k: None)
    whole = ms_port.verify(src, out, **args)
    monkeypatch.undo()
    held, real = [], blocks.on_demand

    def watched(model, *args, **kwargs):
        found = real(model, *args, **kwargs)
        if found is not None:
            def count(module, _args):
                mine = {id(p) for p in module.parameters(recurse=False)}
                held.append(sum(p.device.type != "meta" and id(p) not in mine
                                for p in model.parameters()))
            for module in model.modules():
                module.register_forward_pre_hook(count)
        return found

    monkeypatch.setattr(blocks, "on_demand", watched)
    ran = _spans_run(monkeypatch)
    parts = ms_port.verify(src, out, **args)
    assert held and max(held) == 0, held  # nothing but the running module's own
    assert len(ran) == 2 and ran[1] == [(0, 40), (40, 80), (80, 120), (120, 128)], ran
    assert parts.verdict == "PASS", parts.reasons
    assert _fields(parts) == _fields(whole) and _same_errors(parts, whole)
    # the layers' errors are exactly the whole ones' (only the head's product is split)
    assert [c.error for c in parts.layers if ".layers." in c.ms] == [
        c.error for c in whole.layers if ".layers." in c.ms]


@needs_mindformers
def test_what_mindspore_keeps_of_a_span_is_never_read_again(tmp_path, monkeypatch):
    """MindFormers' GRAPH-compiled span keeps the arrays it was given until it runs
    again: verify hands their pages back after each span's passes. Filled with NaN there
    instead (``handed_back``): the same report, to the bit."""
    import handed_back
    from test_parallel_core import tiny_qwen3

    family = "mindformers:qwen3"
    src = tiny_qwen3(tmp_path / "hf", dtype="bfloat16")  # float32 arrays of verify's own
    out = tmp_path / "m.ckpt"
    assert ms_port.convert(src, ms_model=family, output=out).ok
    ran = _spans_run(monkeypatch, 64)
    clean = ms_port.verify(src, out, ms_model=family, mode="layers")
    poisoning, filled = handed_back.poisoning()
    monkeypatch.setattr(blocks, "HandedBack", poisoning)
    poisoned = ms_port.verify(src, out, ms_model=family, mode="layers")
    assert len(ran) == 4 and clean.verdict == poisoned.verdict == "PASS", poisoned.reasons
    assert handed_back.report_fields(poisoned) == handed_back.report_fields(clean)
    # the head's span of 64 rows (and the embedding's) handed back as each span ran
    assert (64, 64) in filled, set(filled)
