"""``mindformers:deepseek32``: Hugging Face DeepSeek-V3.2 (DSA: a lightning indexer in every
layer) into MindFormers 2.1's DSA training network (``TrainingDeepseekV3ForCausalLM`` with
``experimental_attention_variant: dsa``), with no mapping file.

What is proven here, on tiny seeded models made with transformers (MindFormers' DSA builds
only kv_lora_rank 512, a rotary head of 64 and an indexer of 64 heads of 128; the rest is
small):

- the computed names and shapes equal the real network's, built under
  ``no_init_parameters`` in a process of its own, with and without the MTP layer;
- the indexer's tensors are transformers' rows ``[64..127; 0, 32, 1, 33, ...]`` per head,
  written out here by hand, and export gives the source back byte for byte;
- MindFormers' own network, run on this CPU with ms-port's stand-ins (the DSA ones named),
  computes transformers' logits (below 1e-5) with the indexer keeping 6 of 16 and of 32
  tokens; the indexer renamed but not reordered is far off, and so are two experts swapped;
- ``verify`` PASSes, whole and by layers, saying the indexer ran with fewer tokens than
  config.json keeps; an unpermuted indexer or two swapped experts FAIL, named;
- ``mindformers:deepseek3`` handed a V3.2 config (and the other way) says which to use.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

import ms_port  # noqa: E402
from ms_port.archs.parallel_core import deepseek as ds  # noqa: E402
from ms_port.archs.parallel_core import deepseek32  # noqa: E402
from ms_port.errors import TargetError  # noqa: E402
from ms_port.read.sources import read_source  # noqa: E402
from tests.test_parallel_core_deepseek import _KEEP, _REAL  # noqa: E402

needs_mindformers = pytest.mark.skipif(importlib.util.find_spec("mindformers") is None,
                                       reason="mindformers not installed (test extra)")
FAMILY = "mindformers:deepseek32"
V32 = dict(vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
           num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
           q_lora_rank=24, kv_lora_rank=512, qk_nope_head_dim=8, qk_rope_head_dim=64,
           v_head_dim=8, first_k_dense_replace=1, n_routed_experts=4, num_experts_per_tok=2,
           n_shared_experts=1, n_group=2, topk_group=1, index_n_heads=64, index_head_dim=128,
           index_topk=6, max_position_embeddings=64, rms_norm_eps=1e-6,
           rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
INDEXER = "self_attention.core_attention.indexer."
#: MindFormers' indexer rows from transformers': per head of 128, the 64 pass rows, then
#: the 64 rotary rows' halves made pairs
PERM = np.concatenate([np.arange(64, 128), np.stack([np.arange(32), np.arange(32, 64)],
                                                     axis=1).reshape(-1)])


def tiny_v32(path, *, seed=0, **changes):
    """A seeded tiny DeepSeek-V3.2 saved by transformers: matrices N(0, 1/fan_in), the
    embedding N(0, 1), norms 1 + N(0, 0.2²) (LayerNorm biases N(0, 0.2²)), the router's
    correction bias N(0, 0.1²), so that attention, the indexer and routing are sharp."""
    config = transformers.DeepseekV32Config(**{**V32, **changes})
    torch.manual_seed(seed)
    model = transformers.DeepseekV32ForCausalLM(config)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            if "norm" in name:
                t.copy_((0 if name.endswith("bias") else 1)
                        + 0.2 * torch.randn(t.shape, generator=g))
            elif "e_score_correction_bias" in name:
                t.copy_(0.1 * torch.randn(t.shape, generator=g))
            elif "embed_tokens" in name:
                t.copy_(torch.randn(t.shape, generator=g))
            elif t.dim() >= 2:
                t.copy_(torch.randn(t.shape, generator=g) / t.shape[-1] ** 0.5)
    model.eval().save_pretrained(path)
    return model


def arrays(path):
    return {i.name: np.asarray(i.load()) for i in read_source(path)}


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("v32")
    model = tiny_v32(root / "hf")
    report = ms_port.convert(root / "hf", ms_model=FAMILY, output=root / "out.ckpt")
    assert report.ok, report.plan.problems()[:5]
    assert report.plan.mapping.origin.endswith("hf_deepseek3_mindformers.yaml")
    return {"root": root, "model": model, "hf": arrays(root / "hf"),
            "ms": arrays(root / "out.ckpt"), "report": report}


# --- names, layouts, the way back ---------------------------------------------------------

@needs_mindformers
def test_computed_target_equals_the_real_network(tmp_path):
    cases = [{}, {"num_nextn_predict_layers": 1}]
    given = []
    for changes in cases:
        config = {**V32, "model_type": "deepseek_v32", **changes}
        given.append({**{k: config[k] for k in _KEEP if k in config},
                      **ds.mindformers_settings(config)})
    run = subprocess.run([sys.executable, "-c", _REAL, json.dumps(given), str(tmp_path)],
                         capture_output=True, text=True, timeout=900)
    names = [json.loads(x[5:]) for x in run.stdout.splitlines() if x.startswith("NAMES")]
    assert len(names) == len(cases), run.stderr[-3000:]
    for changes, real in zip(cases, names):
        config = {**V32, "model_type": "deepseek_v32", **changes}
        computed = [(t.name, t.shape) for t in deepseek32.target(config).tensors.values()]
        assert computed == [(n, tuple(s)) for n, s in real]
        indexers = [n for n, _ in computed if ".indexer." in n]
        assert len(indexers) == 5 * (2 + bool(changes))  # the MTP layer's indexer too


def test_the_indexer_rows_are_reordered_and_the_rest_is_deepseek_v3s(converted):
    hf, ms = converted["hf"], converted["ms"]
    for i in range(2):
        src, dst = f"model.layers.{i}.self_attn.indexer.", f"decoder.layers.{i}.{INDEXER}"
        wq_b = hf[src + "wq_b.weight"].reshape(64, 128, -1)[:, PERM].reshape(8192, -1)
        np.testing.assert_array_equal(ms[dst + "linear_wq_b.weight"], wq_b)
        np.testing.assert_array_equal(ms[dst + "linear_wk.weight"], hf[src + "wk.weight"][PERM])
        np.testing.assert_array_equal(ms[dst + "k_norm.gamma"], hf[src + "k_norm.weight"][PERM])
        np.testing.assert_array_equal(ms[dst + "k_norm.beta"], hf[src + "k_norm.bias"][PERM])
        np.testing.assert_array_equal(ms[dst + "linear_weights_proj.weight"],
                                      hf[src + "weights_proj.weight"])
        assert not np.array_equal(ms[dst + "linear_wk.weight"], hf[src + "wk.weight"])
    assert len(ms) == 39 and not converted["report"].plan.problems()


def test_export_gives_the_source_back_byte_for_byte(converted, tmp_path):
    report = ms_port.export(converted["root"] / "out.ckpt", ms_model=FAMILY,
                            config=converted["root"] / "hf" / "config.json",
                            output=tmp_path / "back")
    assert report.ok
    back = arrays(tmp_path / "back")
    assert set(back) == set(converted["hf"])
    for name, a in converted["hf"].items():
        assert back[name].tobytes() == a.tobytes(), name


# --- MindFormers' own network ---------------------------------------------------------------

def _swapped_experts(ms):
    """Experts 0 and 1 of layer 1 swapped in weight1 and weight2."""
    out = {}
    for name, rows in (("weight1", 64), ("weight2", 32)):
        key = f"decoder.layers.1.mlp.experts.{name}"
        a = ms[key].copy()
        a[:rows], a[rows:2 * rows] = ms[key][rows:2 * rows], ms[key][:rows]
        out[key] = a
    return out


def _unpermuted(hf):
    """The indexer renamed, not reordered (the plausible mistake)."""
    out = {}
    for i in range(2):
        src, dst = f"model.layers.{i}.self_attn.indexer.", f"decoder.layers.{i}.{INDEXER}"
        out.update({dst + "linear_wq_b.weight": hf[src + "wq_b.weight"],
                    dst + "linear_wk.weight": hf[src + "wk.weight"],
                    dst + "k_norm.gamma": hf[src + "k_norm.weight"],
                    dst + "k_norm.beta": hf[src + "k_norm.bias"]})
    return out


@needs_mindformers
@pytest.mark.parametrize("seq", [16, 32])
def test_mindformers_dsa_network_computes_transformers_logits(converted, seq):
    from ms_port.archs.parallel_core import cpu as pc

    ids = np.random.default_rng(seq).integers(0, V32["vocab_size"], (2, seq))
    with torch.no_grad():
        wanted = converted["model"](torch.from_numpy(ids)).logits.numpy()
    config = json.loads((converted["root"] / "hf" / "config.json").read_text())
    errors = {}
    with pc.cpu_standins() as standins:
        net = pc.build_network(config, seq_length=seq)
        for why, change in {"right": {}, "unpermuted indexer": _unpermuted(converted["hf"]),
                            "experts 0 and 1 swapped": _swapped_experts(converted["ms"])
                            }.items():
            loaded = pc.load_arrays(net, {**converted["ms"], **change})
            assert loaded.complete, loaded
            got = pc.forward(net, ids)
            errors[why] = float(np.linalg.norm(got - wanted) / np.linalg.norm(wanted))
        used = [s.name for s in standins.used_by(net)]
    assert errors["right"] < 1e-5, errors
    assert errors["unpermuted indexer"] > 1e-2 and errors["experts 0 and 1 swapped"] > 1e-2, \
        errors
    assert {"dsa-absorb-matmul", "dsa-indexer-kernels", "dsa-sparse-attention",
            "dsa-indexer-loss-not-run"} <= set(used)
    assert "attention" not in used  # DSA never reaches the flash kernel's stand-in


# --- verify ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def v32_2048(tmp_path_factory):
    """The same tiny model with config.json's index_topk 2048 (the Hub's), converted."""
    root = tmp_path_factory.mktemp("v32-2048")
    tiny_v32(root / "hf", index_topk=2048)
    assert ms_port.convert(root / "hf", ms_model=FAMILY, output=root / "out.ckpt").ok
    return root


@needs_mindformers
@pytest.mark.parametrize("mode", ["whole", "layers"])
def test_verify_passes_with_the_indexer_keeping_half_the_tokens(v32_2048, mode):
    report = ms_port.verify(v32_2048 / "hf", v32_2048 / "out.ckpt", ms_model=FAMILY,
                            mode=mode)
    assert report.verdict == "PASS", report.reasons
    assert report.mode == mode
    assert any("the indexer keeps 8 of the run's 16 tokens" in n for n in report.notes)
    assert any("dsa-sparse-attention" in n for n in report.notes)


@needs_mindformers
def test_verify_by_layers_with_routed_experts_two_at_a_time(v32_2048, monkeypatch):
    """The MoE layer's routed experts a group at a time (as at DeepSeek-V3.2's widths): the
    same verdict, each group's worst expert reported."""
    from ms_port.check import routed

    monkeypatch.setattr(routed, "EXPERTS_PER_GROUP", 2)
    report = ms_port.verify(v32_2048 / "hf", v32_2048 / "out.ckpt", ms_model=FAMILY,
                            mode="layers")
    assert report.verdict == "PASS", report.reasons
    grouped = [layer for layer in report.layers if layer.paired_by == "expert"]
    assert len(grouped) == 2  # 4 experts, 2 a group


def _corrupted(root, tmp_path, change):
    from ms_port.testing import rewrite_checkpoint

    return rewrite_checkpoint(root / "out.ckpt", tmp_path / "bad.ckpt",
                              lambda t: t.update(change) or t)


@needs_mindformers
@pytest.mark.parametrize("wrong, named", [
    ("unpermuted", "decoder.layers.0.self_attention.core_attention.indexer.linear_wq_b.weight"),
    ("swapped", "decoder.layers.1.mlp.experts.weight1")])
def test_verify_fails_a_wrong_indexer_or_swapped_experts_naming_it(v32_2048, tmp_path, wrong,
                                                                   named):
    change = (_unpermuted(arrays(v32_2048 / "hf")) if wrong == "unpermuted"
              else _swapped_experts(arrays(v32_2048 / "out.ckpt")))
    bad = _corrupted(v32_2048, tmp_path, change)
    report = ms_port.verify(v32_2048 / "hf", bad, ms_model=FAMILY, mode="whole")
    assert report.verdict == "FAIL" and named in " ".join(report.reasons)
    assert not report.outputs[0].ok  # the forward sees it too


# --- what each target refuses ---------------------------------------------------------------

def test_deepseek3_handed_a_v32_config_says_which_target_to_use():
    config = {**V32, "model_type": "deepseek_v32"}
    with pytest.raises(TargetError, match="pass --ms-model mindformers:deepseek32"):
        ds.deepseek_target(config)
    v3 = {k: v for k, v in config.items() if not k.startswith("index_")}
    with pytest.raises(TargetError, match=r"pass --ms-model mindformers:deepseek3$"):
        deepseek32.target({**v3, "model_type": "deepseek_v3"})


@pytest.mark.parametrize("change, named", [
    ({"kv_lora_rank": 16}, "kv_lora_rank 16"), ({"index_n_heads": 2}, "index_n_heads 2"),
    ({"index_head_dim": 64}, "index_head_dim 64")])
def test_what_mindformers_dsa_cannot_build_is_one_line(change, named):
    with pytest.raises(TargetError, match=f"{named}; MindFormers 2.1's DeepSeek Sparse "
                                          "Attention builds only kv_lora_rank 512"):
        deepseek32.target({**V32, "model_type": "deepseek_v32", **change})


def test_run_config_keeps_half_the_tokens_where_the_config_keeps_more():
    config = {**V32, "model_type": "deepseek_v32", "index_topk": 2048}
    run, said = deepseek32.run_config(config, 16)
    assert run["index_topk"] == 8 and config["index_topk"] == 2048 and len(said) == 1
    small = {**config, "index_topk": 6}
    assert deepseek32.run_config(small, 16) == (small, [])


def test_one_table_pairs_each_model_type_with_its_target():
    """The shipped table serves both targets; select.pairs keeps each to its model type,
    and a pairs entry naming what select does not is refused, naming the key."""
    from ms_port.errors import MappingError
    from ms_port.match.mapping import families_for, select_table, selected_model_types
    from ms_port.match.mapping_yaml import mapping_from_data

    v32 = {**V32, "model_type": "deepseek_v32"}
    assert select_table(v32, (FAMILY,)) is not None
    assert select_table(v32, ("mindformers:deepseek3",)) is None
    assert families_for("deepseek_v32") == [FAMILY]
    assert selected_model_types("mindformers:deepseek3") == ["deepseek_v3"]
    with pytest.raises(MappingError, match=r"select\.pairs"):
        mapping_from_data({"version": 1, "select": {
            "model_type": ["a"], "target": ["x:y"], "pairs": {"x:z": "a"}}}, origin="t")


def test_the_hubs_mtp_layer_converts_with_its_indexer_reordered(converted, tmp_path):
    """The Hub's DeepSeek-V3.2 keeps its MTP layer as ``model.layers.{num_hidden_layers}``
    (transformers drops it): a MoE layer with its own indexer, whose rows take the same
    reordering as the decoder layers'."""
    from safetensors.numpy import save_file

    hf = dict(converted["hf"])
    rng = np.random.default_rng(7)
    for name, array in list(hf.items()):
        if name.startswith("model.layers.1."):  # the MTP layer laid out as the last one
            hf["model.layers.2." + name[len("model.layers.1."):]] = (
                array + rng.standard_normal(array.shape).astype(array.dtype))
    for name, shape in (("enorm.weight", (64,)), ("hnorm.weight", (64,)),
                        ("eh_proj.weight", (64, 128)), ("shared_head.norm.weight", (64,))):
        hf[f"model.layers.2.{name}"] = rng.standard_normal(shape).astype(np.float32)
    hf["model.layers.2.embed_tokens.weight"] = hf["model.embed_tokens.weight"]
    hf["model.layers.2.shared_head.head.weight"] = hf["lm_head.weight"]
    folder = tmp_path / "hub"
    folder.mkdir()
    save_file(hf, str(folder / "model.safetensors"))
    config = json.loads((converted["root"] / "hf" / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_nextn_predict_layers": 1}))
    report = ms_port.convert(folder, ms_model=FAMILY, output=tmp_path / "mtp.ckpt")
    assert report.ok, report.plan.problems()[:5]
    ms = arrays(tmp_path / "mtp.ckpt")
    src, dst = "model.layers.2.self_attn.indexer.", f"mtp.layers.0.transformer_layer.{INDEXER}"
    wq_b = hf[src + "wq_b.weight"].reshape(64, 128, -1)[:, PERM].reshape(8192, -1)
    np.testing.assert_array_equal(ms[dst + "linear_wq_b.weight"], wq_b)
    np.testing.assert_array_equal(ms[dst + "linear_wk.weight"], hf[src + "wk.weight"][PERM])
    np.testing.assert_array_equal(ms[dst + "k_norm.gamma"], hf[src + "k_norm.weight"][PERM])
    np.testing.assert_array_equal(ms[dst + "k_norm.beta"], hf[src + "k_norm.bias"][PERM])
    np.testing.assert_array_equal(ms["mtp.layers.0.eh_proj.weight"],
                                  hf["model.layers.2.eh_proj.weight"])
    # the decoder layers are the ones converted without the MTP layer, bit for bit
    for name, array in converted["ms"].items():
        np.testing.assert_array_equal(ms[name], array)
    assert {n.split(".")[0] for n in set(ms) - set(converted["ms"])} == {"mtp"}
