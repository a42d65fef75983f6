"""DeepSeek-V4 into MindFormers' ``DeepseekV4ForCausalLM`` (``--ms-model
mindformers:deepseek4``) and back, on a tiny model transformers builds from seeded init:

- the target from either config layout (the Hub's ``compress_ratios`` / ``num_hash_layers``
  / ``qk_rope_head_dim``, transformers 5's ``layer_types`` / ``mlp_layer_types`` /
  ``rope_parameters``) is the same, and is the parameter list of MindFormers' own network
  built from the YAML ``--model-config`` writes (tests/deepseek4_mindformers.py, a stand-in
  ``hyper_parallel``);
- a conversion of the Hub-named copy is MindFormers' own ``weight_converters`` applied to
  it, bit for bit; the save_pretrained-named copy converts to the same tensors; the Hub's
  FP8 / MXFP4 copy converts to the conversion of its dequantized tensors;
- export gives back each naming scheme bit for bit (transformers loads the save_pretrained
  one and computes the same logits);
- verify proves the tensors and says INCONCLUSIVE, naming what the forward needs; a swapped
  expert or a wrong hash table FAILs naming the tensor.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ms_port
from ms_port.errors import MsPortError
from ms_port.read.targets import from_family

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("transformers.models.deepseek_v4")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

FAMILY = "mindformers:deepseek4"
#: the compressed branches' yarn (DeepSeek-V4's: factor 16 of 65536; here of 64)
YARN = {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 64,
        "beta_fast": 32.0, "beta_slow": 1.0}
#: 4 layers: two HCA (ratio 128) with hash routing, one CSA (ratio 4, with an indexer), one
#: sliding-window only
SIZES = dict(vocab_size=256, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=1, head_dim=32, q_lora_rank=48,
             num_experts_per_tok=2, n_routed_experts=4, n_shared_experts=1, o_groups=2,
             o_lora_rank=16, index_n_heads=2, index_head_dim=16, hc_mult=2, sliding_window=8,
             index_topk=4, layer_types=["heavily_compressed_attention"] * 2 + [
                 "compressed_sparse_attention", "sliding_attention"],
             mlp_layer_types=["hash_moe"] * 2 + ["moe"] * 2,
             rope_parameters={"main": {"rope_type": "default", "rope_theta": 10000.0,
                                       "partial_rotary_factor": 0.25},
                              "compress": {**YARN, "rope_theta": 160000.0,
                                           "partial_rotary_factor": 0.25}})
#: the same model in the Hub's config layout (with its MTP layer's ratio)
HUB_KEYS = {"compress_ratios": [128, 128, 4, 0, 0], "num_hash_layers": 2,
            "qk_rope_head_dim": 8, "compress_rope_theta": 160000.0,
            "rope_scaling": {k: v for k, v in YARN.items() if k != "rope_type"} | {
                "type": "yarn"}}


def _hub_name(name: str) -> str:
    """save_pretrained's name -> the Hub's (as MindFormers' converters key them)."""
    name = name.replace("model.embed_tokens.weight", "embed.weight")
    name = re.sub(r"^model\.hc_head\.hc_(\w+)$", r"hc_head_\1", name)
    name = re.sub(r"^model\.", "", name)
    return re.sub(r"\.attn\.norm\.weight$", ".attn.kv_norm.weight", name)


@pytest.fixture(scope="module")
def v4(tmp_path_factory):
    """(save_pretrained folder, Hub-named folder with an MTP layer, the model)."""
    torch.manual_seed(0)
    model = transformers.DeepseekV4ForCausalLM(transformers.DeepseekV4Config(**SIZES)).eval()
    gen = torch.Generator().manual_seed(1)
    for i in (0, 1):  # the hash layers' token -> experts tables (init leaves zeros)
        table = torch.stack([torch.randperm(4, generator=gen)[:2] for _ in range(256)])
        model.get_buffer(f"model.layers.{i}.mlp.gate.tid2eid").copy_(table)
    root = tmp_path_factory.mktemp("v4")
    saved = root / "saved"
    model.save_pretrained(saved)
    tensors = safetensors_numpy.load_file(str(saved / "model.safetensors"))
    hub = {_hub_name(k): v for k, v in tensors.items()}
    rng = np.random.default_rng(0)
    for k, v in list(hub.items()):  # an MTP layer laid out as the Hub's: layer 3's kinds
        if k.startswith("layers.3."):
            hub["mtp.0." + k[len("layers.3."):]] = v + rng.standard_normal(v.shape).astype(
                v.dtype)
    hub["mtp.0.ffn.gate.bias"] = rng.standard_normal(4).astype(np.float32)
    for name, shape in (("e_proj.weight", (64, 64)), ("h_proj.weight", (64, 64)),
                        ("enorm.weight", (64,)), ("hnorm.weight", (64,)),
                        ("norm.weight", (64,)), ("hc_head_base", (2,)),
                        ("hc_head_fn", (2, 128)), ("hc_head_scale", (1,))):
        hub[f"mtp.0.{name}"] = rng.standard_normal(shape).astype(np.float32)
    for k in [k for k in hub if k.endswith("tid2eid")]:
        hub[k] = hub[k].astype(np.int32)  # as the Hub's files hold it
    folder = root / "hub"
    folder.mkdir()
    safetensors_numpy.save_file(hub, str(folder / "model.safetensors"))
    config = json.loads((saved / "config.json").read_text())
    for key in ("layer_types", "mlp_layer_types", "compress_rates", "rope_parameters",
                "partial_rotary_factor"):
        config.pop(key, None)
    (folder / "config.json").write_text(json.dumps({**config, **HUB_KEYS}))
    return saved, folder, model


def _load(path: Path) -> dict[str, np.ndarray]:
    return safetensors_numpy.load_file(str(path))


def _same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.size == b.size and np.array_equal(
        np.ascontiguousarray(a).reshape(-1).view(np.uint8),
        np.ascontiguousarray(b).reshape(-1).view(np.uint8))


def _same_files(written: Path, original: Path) -> dict[str, np.ndarray]:
    """Assert ``written`` holds ``original``'s tensors, names, dtypes and bytes; return them."""
    want, have = _load(original), _load(written)
    assert set(have) == set(want)
    assert all(_same_bytes(have[n], want[n]) for n in want)
    return want


def test_both_config_layouts_give_one_target(v4):
    saved, hub, _ = v4
    five = json.loads((saved / "config.json").read_text())
    old = json.loads((hub / "config.json").read_text())
    assert from_family(FAMILY, five, {"mtp": False}).tensors == \
        from_family(FAMILY, old, {"mtp": False}).tensors
    target = from_family(FAMILY, old)
    assert target["decoder.layers.0.mlp.router.tid2eid"].dtype == "int32"
    assert target["decoder.layers.0.mlp.router.tid2eid"].shape == (256, 2)
    # hash layers have no expert bias; only the CSA layer has an indexer
    assert "decoder.layers.1.mlp.expert_bias" not in target
    assert "decoder.layers.2.mlp.expert_bias" in target
    indexed = {n.split(".")[2] for n in target.tensors if ".indexer." in n}
    assert indexed == {"2"}
    assert target["decoder.layers.2.self_attention.core_attention.compressor.ape"].shape == \
        (4, 64)  # CSA: overlapping windows, two heads' width
    assert target["decoder.layers.0.self_attention.core_attention.compressor.ape"].shape == \
        (128, 32)
    assert target["decoder.layers.2.mlp.experts.weight1"].shape == (4, 64, 64)


def test_a_hub_config_without_mtp_may_list_the_mtp_layers_ratio(v4):
    """compress_ratios holds one ratio per layer and the MTP layer's; a config counting no
    MTP layer (or a conversion without it) ignores that last one, as transformers does."""
    config = json.loads((v4[1] / "config.json").read_text())
    with_mtp = from_family(FAMILY, config)
    assert from_family(FAMILY, {**config, "num_nextn_predict_layers": 0}).tensors == {
        n: t for n, t in with_mtp.tensors.items() if not n.startswith("mtp.")}


@pytest.mark.parametrize("change, says", [
    ({"compress_ratios": [128, 128, 8, 0, 0]}, "compression ratio.*8.*builds 0, 4, 128"),
    ({"mlp_layer_types": ["moe", "hash_moe", "moe", "moe"], "num_hash_layers": None},
     "hash-routed layers after others"),
    ({"num_key_value_heads": 2}, "one K=V head"),
    ({"o_groups": 3}, "o_groups 3 does not divide"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ({"num_nextn_predict_layers": 2}, "one Multi-Token Prediction layer"),
])
def test_what_mindformers_cannot_build_is_refused_in_one_line(v4, change, says):
    config = {**json.loads((v4[1] / "config.json").read_text()), **change}
    config = {k: v for k, v in config.items() if v is not None}
    with pytest.raises(MsPortError, match=says):
        from_family(FAMILY, config)


@pytest.fixture(scope="module")
def converted(v4, tmp_path_factory):
    """The Hub-named copy converted, with its --model-config, and MindFormers' own view."""
    _, hub, _ = v4
    out = tmp_path_factory.mktemp("converted")
    report = ms_port.convert(hub, output=out / "hub.safetensors", ms_model=FAMILY,
                             format="safetensors", model_config=out / "model.yaml")
    assert report.ok, report.message
    return out


@pytest.fixture(scope="module")
def mindformers_view(v4, converted):
    """MindFormers' weight_converters on the Hub-named copy, and its network built from the
    YAML (a subprocess with a stand-in hyper_parallel)."""
    if importlib.util.find_spec("mindformers") is None:  # not imported here: it loads
        pytest.skip("mindformers not installed (test extra)")  # MindSpore in this process
    _, hub, _ = v4
    helper = Path(__file__).with_name("deepseek4_mindformers.py")
    done = subprocess.run([sys.executable, str(helper), str(hub / "model.safetensors"),
                           str(hub / "config.json"), str(converted / "model.yaml"),
                           str(converted)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return (dict(np.load(converted / "converted.npz")),
            json.loads((converted / "network.json").read_text()))


def test_conversion_is_mindformers_weight_converters_bit_for_bit(converted, mindformers_view):
    ours = _load(converted / "hub.safetensors")
    theirs, _ = mindformers_view
    assert len(theirs) == 161
    for name, array in theirs.items():
        assert _same_bytes(ours[name], array), name  # experts: same bytes, held 3-D
    sourceless = sorted({n.rsplit(".", 1)[-1] for n in set(ours) - set(theirs)})
    assert sourceless == ["q_rms_gamma", "rms_weight", "tokens_per_expert"]
    for name in set(ours) - set(theirs):
        value = 0.0 if name.endswith("tokens_per_expert") else 1.0
        assert np.all(ours[name] == value), name


def test_the_target_is_mindformers_network_built_from_the_yaml(v4, converted,
                                                               mindformers_view):
    _, network = mindformers_view
    held = json.loads((converted / "transformer.json").read_text())
    # what MindFormers' TransformerConfig holds from the YAML: the layers' kinds, the
    # clamp transformers applies, and the compressed branches' yarn from its own length
    assert held == {"csa_compress_ratios": [128, 128, 4, 0, 0], "moe_n_hash_layers": 2,
                    "qk_pos_emb_head_dim": 8, "activation_func_clamp_value": 10.0,
                    "hidden_act": "fusedswiglu", "qk_layernorm": True, "v_head_dim": 32,
                    "original_max_position_embeddings": 64, "mtp_num_layers": 1,
                    "csa_compress_rotary_base": 160000.0}
    target = from_family(FAMILY, json.loads((v4[1] / "config.json").read_text()))
    assert [n for n, _, _ in network] == list(target.tensors)
    assert all(tuple(shape) == target[n].shape for n, shape, _ in network)
    ints = {n for n, _, dtype in network if "Int" in dtype}
    assert ints == {n for n, t in target.tensors.items() if t.dtype == "int32"}
    written = _load(converted / "hub.safetensors")
    assert all(written[n].dtype == np.int32 for n in ints)
    assert all(written[n].shape == tuple(shape) for n, shape, _ in network)


def test_the_yaml_is_the_same_from_either_layout(v4, converted, tmp_path):
    import yaml

    saved, _, _ = v4
    report = ms_port.convert(saved, output=tmp_path / "s.safetensors", ms_model=FAMILY,
                             format="safetensors", ms_options={"mtp": False},
                             model_config=tmp_path / "s.yaml")
    assert report.ok, report.message
    ours = yaml.safe_load((tmp_path / "s.yaml").read_text())["model"]["model_config"]
    hub = yaml.safe_load((converted / "model.yaml").read_text())["model"]["model_config"]
    assert hub.pop("num_nextn_predict_layers") == 1 and ours.pop("num_nextn_predict_layers") == 0
    assert hub.pop("compress_ratios") == [128, 128, 4, 0, 0]
    assert ours.pop("compress_ratios") == [128, 128, 4, 0]
    assert ours == hub
    # what MindFormers' config converter would not set, and DeepSeek-V4-Pro's defaults
    assert (hub["qk_layernorm"], hub["hidden_act"], hub["v_head_dim"]) == (True, "fusedswiglu", 32)
    assert (hub["routed_scaling_factor"], hub["index_topk"], hub["qk_rope_head_dim"]) == \
        (1.5, 4, 8)


def test_save_pretrained_names_convert_to_the_same_tensors(v4, converted, tmp_path):
    saved, _, _ = v4
    report = ms_port.convert(saved, output=tmp_path / "s.safetensors", ms_model=FAMILY,
                             format="safetensors", ms_options={"mtp": False})
    assert report.ok, report.message
    ours, hub = _load(tmp_path / "s.safetensors"), _load(converted / "hub.safetensors")
    assert set(ours) == {n for n in hub if not n.startswith("mtp.")}
    for name, array in ours.items():  # tid2eid: int64 in the file, int32 written
        assert _same_bytes(array, hub[name]), name
    # without the option, the missing MTP layer is said, and nothing is written
    refused = ms_port.convert(saved, output=tmp_path / "t.safetensors", ms_model=FAMILY,
                              format="safetensors")
    assert not refused.ok and not (tmp_path / "t.safetensors").exists()
    (line,) = refused.plan.problems()  # one line for the absent layer, with its remedy
    assert "no Multi-Token Prediction layer (mtp.0)" in line and "--ms-option mtp=false" in line


def test_a_hash_table_that_does_not_fit_int32_is_refused_naming_it(v4, tmp_path):
    saved, _, _ = v4
    folder = tmp_path / "big"
    folder.mkdir()
    tensors = _load(saved / "model.safetensors")
    tensors["model.layers.1.ffn.gate.tid2eid"] = tensors[
        "model.layers.1.ffn.gate.tid2eid"] + (1 << 33)
    safetensors_numpy.save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text((saved / "config.json").read_text())
    with pytest.raises(MsPortError, match=r"'model\.layers\.1\.ffn\.gate\.tid2eid' holds "
                                          r"values outside int32"):
        ms_port.convert(folder, output=tmp_path / "o.safetensors", ms_model=FAMILY,
                        format="safetensors", ms_options={"mtp": False})
    assert not (tmp_path / "o.safetensors").exists()


def test_the_hubs_fp8_and_mxfp4_copy_converts_as_its_dequantized_tensors(v4, converted,
                                                                         tmp_path):
    """The Hub ships attention weights as float8_e4m3fn with e8m0 block scales and routed
    experts as MXFP4: converted, they are the conversion of transformers' dequantization."""
    finegrained = pytest.importorskip("transformers.integrations.finegrained_fp8")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    _, hub, _ = v4
    rng = np.random.default_rng(5)
    tensors = {k: torch.from_numpy(v) for k, v in _load(hub / "model.safetensors").items()}
    quantized, plain = dict(tensors), dict(tensors)
    for name, w in tensors.items():
        if re.search(r"\.attn\.(wq_a|wq_b|wkv|wo_b)\.weight$", name):
            q = w.to(torch.float8_e4m3fn)
            scale = torch.from_numpy(rng.integers(120, 130, (-(-w.shape[0] // 128),
                                                             -(-w.shape[1] // 128)),
                                                  dtype=np.uint8)).view(torch.float8_e8m0fnu)
        elif re.search(r"\.experts\.\d+\.w[123]\.weight$", name):
            q = torch.from_numpy(rng.integers(-128, 128, (w.shape[0], w.shape[1] // 2),
                                              dtype=np.int8))
            scale = torch.from_numpy(rng.integers(120, 130, (w.shape[0], w.shape[1] // 32),
                                                  dtype=np.uint8)).view(torch.float8_e8m0fnu)
        else:
            continue
        quantized[name], quantized[name[:-len("weight")] + "scale"] = q, scale
        plain[name] = finegrained.Fp8Dequantize(None)._dequantize_one(q, scale, torch.bfloat16)
    config = json.loads((hub / "config.json").read_text())
    config["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3",
                                     "quant_method": "fp8", "scale_fmt": "ue8m0",
                                     "weight_block_size": [128, 128]}
    for kind, state in (("quantized", quantized), ("plain", plain)):
        folder = tmp_path / kind
        folder.mkdir()
        safetensors_torch.save_file(state, str(folder / "model.safetensors"))
        (folder / "config.json").write_text(json.dumps(config))
        report = ms_port.convert(folder, output=tmp_path / f"{kind}.safetensors",
                                 ms_model=FAMILY, format="safetensors")
        assert report.ok, report.message
    a, b = _load(tmp_path / "quantized.safetensors"), _load(tmp_path / "plain.safetensors")
    assert set(a) == set(b)
    assert all(_same_bytes(a[n], b[n]) for n in a)
    assert str(a["decoder.layers.2.mlp.experts.weight1"].dtype) == "bfloat16"


def test_export_gives_back_either_naming_scheme(v4, converted, tmp_path):
    saved, hub, model = v4
    # the Hub's names: its own file as the template
    back = ms_port.export(converted / "hub.safetensors", output=tmp_path / "hub",
                          target=hub / "model.safetensors", config=hub / "config.json",
                          format="safetensors")
    assert back.ok, back.message
    _same_files(tmp_path / "hub" / "model.safetensors", hub / "model.safetensors")
    # save_pretrained's names, computed from the config (tid2eid back to int64)
    mine = tmp_path / "mine.safetensors"
    assert ms_port.convert(saved, output=mine, ms_model=FAMILY, format="safetensors",
                           ms_options={"mtp": False}).ok
    back = ms_port.export(mine, output=tmp_path / "saved", config=saved / "config.json",
                          format="safetensors")
    assert back.ok, back.message
    original = _same_files(tmp_path / "saved" / "model.safetensors",
                           saved / "model.safetensors")
    # with --dtype the floating-point tensors are cast, tid2eid stays the int64 it was
    cast = ms_port.export(mine, output=tmp_path / "half", config=saved / "config.json",
                          format="safetensors", dtype="bfloat16")
    assert cast.ok, cast.message
    half = _load(tmp_path / "half" / "model.safetensors")
    assert half["model.layers.0.ffn.gate.tid2eid"].dtype == np.int64
    assert np.array_equal(half["model.layers.0.ffn.gate.tid2eid"],
                          original["model.layers.0.ffn.gate.tid2eid"])
    assert str(half["model.layers.0.attn.wq_a.weight"].dtype) == "bfloat16"
    # transformers loads it and computes the same logits
    loaded = transformers.DeepseekV4ForCausalLM.from_pretrained(tmp_path / "saved").eval()
    ids = torch.arange(0, 256, 16).reshape(1, 16)
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_verify_proves_the_tensors_and_says_inconclusive(v4, converted, tmp_path):
    from ms_port.archs.parallel_core import deepseek4

    _, hub, _ = v4
    report = ms_port.verify(hub, converted / "hub.safetensors", ms_model=FAMILY)
    assert report.verdict == "INCONCLUSIVE" and report.exit_code == 3
    assert report.tensors.deltas and all(d.status == "identical"
                                         for d in report.tensors.deltas)
    if deepseek4.hyper_parallel_missing():
        assert "hyper_parallel" in report.reasons[0]
    # a swapped pair of experts, and a wrong hash table, FAIL naming the tensor
    for name, broken in (("decoder.layers.2.mlp.experts.weight1", lambda w: w[[1, 0, 2, 3]]),
                         ("decoder.layers.0.mlp.router.tid2eid", lambda w: w[::-1])):
        tensors = _load(converted / "hub.safetensors")
        tensors[name] = np.ascontiguousarray(broken(tensors[name]))
        bad = tmp_path / "bad.safetensors"
        safetensors_numpy.save_file(tensors, str(bad))
        report = ms_port.verify(hub, bad, ms_model=FAMILY)
        assert report.verdict == "FAIL", name
        assert name in report.reasons[0]


def test_deepseek3_handed_a_v4_config_names_the_v4_target(v4):
    config = json.loads((v4[1] / "config.json").read_text())
    with pytest.raises(MsPortError, match="pass --ms-model mindformers:deepseek4"):
        from_family("mindformers:deepseek3", config)


def test_a_fault_after_an_expert_group_is_made_is_caught_by_the_read_back(v4, tmp_path,
                                                                          monkeypatch):
    """Experts are compared with the digests of their groups taken as each was made (not
    made again): a byte changed between the making and the writer, as a buffer reused too
    early would, is still caught, naming the tensor, and nothing is put in place."""
    import contextlib

    import ms_port.write.writers as writers
    from ms_port.errors import ReadbackError

    real = writers._prepared
    broken = "decoder.layers.2.mlp.experts.weight1"

    def faulty(plan, nonfinite, digests):
        def arrays():
            with real(plan, nonfinite, digests) as items:
                for match, data in items:
                    if match.target == broken:
                        assert match.groups == 4
                        raw = np.concatenate([np.array(c) for c in data.chunks])
                        raw[1000] ^= 1  # one bit off
                        data = writers._Data(data.shape, data.dtype, [raw])
                    yield match, data
        return contextlib.closing(arrays())

    monkeypatch.setattr(writers, "_prepared", faulty)
    out = tmp_path / "out.safetensors"
    with pytest.raises(ReadbackError, match=rf"1 tensors differ .*{re.escape(broken)}"):
        ms_port.convert(v4[1], output=out, ms_model=FAMILY)
    assert not out.exists()
