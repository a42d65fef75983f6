"""GLM-4-9B into MindFormers' ChatGLM2 (mindformers:glm4), from both Hugging Face layouts.

A tiny seeded ``GlmForCausalLM`` (transformers' glm: the ``-hf`` repos) and the same
weights in the original remote-code layout (``model_type: chatglm``; ``query_key_value``
and ``dense_h_to_4h`` fused, the derived ``rotary_pos_emb.inv_freq``) convert with no
mapping file into each of the network's four layouts (``qkv_concat``, ``mlp_concat``),
to the same bytes; the computed names and shapes are the real network's; the export back
to the ``-hf`` layout is bit-exact.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("mindspore")

import ms_port
from ms_port.errors import MsPortError
from ms_port.read.sources import read_source

VARIANTS = [(q, m) for q in (True, False) for m in (True, False)]
SIZES = {"vocab": 128, "hidden": 64, "ffn": 96, "layers": 2, "heads": 4, "groups": 2,
         "head_dim": 16}
#: GLM-4-9B's rotary base: 10000 × rope_ratio 500 (transformers 5 saves it inside
#: rope_parameters, the remote code's config as rope_ratio)
RATIO = 500
#: MindFormers' use_rearrange_rope: each head's q and k rows as rotary halves
REARRANGED = {"use_rearrange_rope": True}


def _hf(root: Path, groups: int = SIZES["groups"], name: str = "hf") -> Path:
    import torch
    import transformers

    cfg = transformers.GlmConfig(
        vocab_size=SIZES["vocab"], hidden_size=SIZES["hidden"],
        intermediate_size=SIZES["ffn"], num_hidden_layers=SIZES["layers"],
        num_attention_heads=SIZES["heads"], num_key_value_heads=groups,
        head_dim=SIZES["head_dim"], pad_token_id=0, eos_token_id=1,
        rope_theta=10000.0 * RATIO)
    torch.manual_seed(0)
    model = transformers.GlmForCausalLM(cfg)
    with torch.no_grad():
        for name, param in model.named_parameters():  # norms off 1, biases off 0
            param.copy_(torch.randn(param.shape) * 0.1 + name.endswith("norm.weight"))
    model.save_pretrained(root / name)
    return root / name


def _remote(root: Path, hf: Path, inv_freq_base: float = 10000.0,
            multi_head: bool = False) -> Path:
    """``multi_head``: every head its own k and v, as a config with
    ``multi_query_attention: false`` says (its ``multi_query_group_num`` left at
    ChatGLMConfig's default 1, which is then not read)."""
    """The same weights as the original repo holds them (remote code's names)."""
    from safetensors.numpy import load_file, save_file

    sd = load_file(hf / "model.safetensors")
    out = {"transformer.embedding.word_embeddings.weight": sd["model.embed_tokens.weight"],
           "transformer.encoder.final_layernorm.weight": sd["model.norm.weight"],
           "transformer.output_layer.weight": sd["lm_head.weight"]}
    for i in range(SIZES["layers"]):
        p, t = f"model.layers.{i}.", f"transformer.encoder.layers.{i}."
        for norm in ("input_layernorm", "post_attention_layernorm"):
            out[f"{t}{norm}.weight"] = sd[f"{p}{norm}.weight"]
        for kind in ("weight", "bias"):
            out[f"{t}self_attention.query_key_value.{kind}"] = np.concatenate(
                [sd[f"{p}self_attn.{x}_proj.{kind}"] for x in "qkv"])
        out[f"{t}self_attention.dense.weight"] = sd[f"{p}self_attn.o_proj.weight"]
        out[f"{t}mlp.dense_h_to_4h.weight"] = sd[f"{p}mlp.gate_up_proj.weight"]
        out[f"{t}mlp.dense_4h_to_h.weight"] = sd[f"{p}mlp.down_proj.weight"]
    dim = SIZES["head_dim"] // 2
    out["transformer.rotary_pos_emb.inv_freq"] = (
        1.0 / inv_freq_base ** (np.arange(0, dim, 2, dtype=np.float32) / dim)).astype(np.float32)
    folder = root / f"remote-{inv_freq_base:g}{'-mha' * multi_head}"
    folder.mkdir()
    save_file(out, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps({
        "model_type": "chatglm", "architectures": ["ChatGLMModel"],
        "num_layers": SIZES["layers"], "padded_vocab_size": SIZES["vocab"],
        "hidden_size": SIZES["hidden"], "ffn_hidden_size": SIZES["ffn"],
        "kv_channels": SIZES["head_dim"], "num_attention_heads": SIZES["heads"],
        "multi_query_attention": not multi_head,
        "multi_query_group_num": 1 if multi_head else SIZES["groups"],
        "add_qkv_bias": True, "add_bias_linear": False, "layernorm_epsilon": 1.5625e-07,
        "rmsnorm": True, "rope_ratio": RATIO, "seq_length": 64}))
    return folder


@pytest.fixture(scope="module")
def glm(tmp_path_factory):
    root = tmp_path_factory.mktemp("glm")
    hf = _hf(root)
    return root, hf, _remote(root, hf)


def _options(q: bool, m: bool) -> dict:
    return {"qkv_concat": q, "mlp_concat": m}


@pytest.mark.parametrize(("qkv", "mlp"), VARIANTS)
def test_both_layouts_convert_with_no_mapping_file_to_the_same_bytes(glm, qkv, mlp):
    root, hf, remote = glm
    outs = {}
    for name, src in (("hf", hf), ("remote", remote)):
        report = ms_port.convert(src, ms_model="mindformers:glm4", ms_options=_options(qkv, mlp),
                                 output=root / f"{name}-{qkv}-{mlp}.ckpt")
        assert report.ok, report.message
        assert report.plan.counts["initialised"] == 2 * SIZES["layers"]  # the KV caches
        assert report.plan.counts["fallback"] == 0
        outs[name] = read_source(root / f"{name}-{qkv}-{mlp}.ckpt", strip_prefixes=False)
    a, b = outs["hf"], outs["remote"]
    assert list(a.tensors) == list(b.tensors)
    for n in a.tensors:
        assert np.array_equal(a[n].load(), b[n].load()), n
    from safetensors.numpy import load_file

    sd = load_file(hf / "model.safetensors")
    layer = "transformer.encoder.layers.1."
    if qkv:  # plain [q; k; v], not grouped per KV head
        assert np.array_equal(a[layer + "self_attention.query_key_value.weight"].load(),
                              np.concatenate([sd[f"model.layers.1.self_attn.{x}_proj.weight"]
                                              for x in "qkv"]))
    if mlp:  # [gate; up] halves, as GlmForCausalLM's gate_up_proj holds them
        assert np.array_equal(a[layer + "mlp.dense_h_to_4h.weight"].load(),
                              sd["model.layers.1.mlp.gate_up_proj.weight"])
    else:
        half = SIZES["ffn"]
        assert np.array_equal(a[layer + "mlp.dense_left.weight"].load(),
                              sd["model.layers.1.mlp.gate_up_proj.weight"][:half])
    cache = a[layer + "self_attention.infer_attention.paged_attention_mgr.key_cache"].load()
    assert cache.shape == (128, 16, SIZES["groups"], SIZES["head_dim"]) and not cache.any()


@pytest.mark.parametrize(("qkv", "mlp"), VARIANTS)
def test_export_back_to_the_hf_layout_is_bit_exact(glm, qkv, mlp):
    from safetensors.numpy import load_file

    root, hf, _unused = glm
    ckpt = root / f"x-{qkv}-{mlp}.ckpt"
    assert ms_port.convert(hf, ms_model="mindformers:glm4", ms_options=_options(qkv, mlp),
                           output=ckpt).ok
    back = root / f"back-{qkv}-{mlp}"
    report = ms_port.export(ckpt, config=hf / "config.json", output=back)  # recognised
    assert report.ok, report.message
    want, got = load_file(hf / "model.safetensors"), load_file(back / "model.safetensors")
    assert want.keys() == got.keys()
    for name in want:
        assert np.array_equal(want[name], got[name]), name


def test_the_remote_inv_freq_is_checked_against_its_config(glm, tmp_path):
    _root, hf, _unused = glm
    # the remote code stores the buffer with base 10000 whatever rope_ratio says; a buffer
    # computed another way is another model's
    other = _remote(tmp_path, hf, inv_freq_base=500000.0)
    with pytest.raises(MsPortError, match=r"'transformer\.rotary_pos_emb\.inv_freq' is not "
                                          r"what config\.json implies .*base 10000"):
        ms_port.convert(other, ms_model="mindformers:glm4", output=tmp_path / "o.ckpt")
    assert not (tmp_path / "o.ckpt").exists()


def test_a_config_of_another_network_is_refused_by_name(tmp_path):
    config = {"model_type": "glm4", "architectures": ["Glm4ForCausalLM"], "hidden_size": 64,
              "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 8,
              "intermediate_size": 8}
    from ms_port.read.targets import from_family

    with pytest.raises(MsPortError, match="GLM-4-0414 \\('glm4'\\) is another network"):
        from_family("mindformers:glm4", config)


@pytest.mark.parametrize(("qkv", "mlp"), VARIANTS)
def test_the_computed_names_and_shapes_are_the_real_networks(qkv, mlp, tmp_path, monkeypatch):
    pytest.importorskip("mindformers")
    from ms_port.archs.llama.family import contained
    from ms_port.read.targets import from_family

    config = {"model_type": "glm", "architectures": ["GlmForCausalLM"],
              "vocab_size": SIZES["vocab"], "hidden_size": SIZES["hidden"],
              "intermediate_size": SIZES["ffn"], "num_hidden_layers": SIZES["layers"],
              "num_attention_heads": SIZES["heads"], "num_key_value_heads": SIZES["groups"],
              "head_dim": SIZES["head_dim"], "attention_bias": True}
    computed = from_family("mindformers:glm4", config, _options(qkv, mlp))
    with contained():
        import mindspore as ms
        from mindformers.models.glm2 import ChatGLM2Config, ChatGLM2ForConditionalGeneration

        ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
        net = ChatGLM2ForConditionalGeneration(ChatGLM2Config(
            num_layers=SIZES["layers"], padded_vocab_size=SIZES["vocab"],
            hidden_size=SIZES["hidden"], ffn_hidden_size=SIZES["ffn"],
            kv_channels=SIZES["head_dim"], num_attention_heads=SIZES["heads"],
            multi_query_group_num=SIZES["groups"], seq_length=16, qkv_concat=qkv,
            mlp_concat=mlp, use_flash_attention=False, param_init_type="float32",
            compute_dtype="float32", add_qkv_bias=True, add_bias_linear=False))
    real = [(p.name, tuple(p.shape)) for _, p in net.parameters_and_names()]
    assert real == [(t.name, t.shape) for t in computed.tensors.values()]


@pytest.mark.parametrize(("qkv", "mlp"), [(True, True), (False, False)])
def test_verify_passes_against_transformers_with_the_stand_ins_said(glm, qkv, mlp):
    pytest.importorskip("mindformers")
    root, hf, _unused = glm
    ckpt = root / f"v-{qkv}-{mlp}.ckpt"
    assert ms_port.convert(hf, ms_model="mindformers:glm4", ms_options=_options(qkv, mlp),
                           output=ckpt).ok
    report = ms_port.verify(hf, ckpt, ms_model="mindformers:glm4",
                            ms_options=_options(qkv, mlp))
    assert report.verdict == "PASS", report.message
    assert report.error < 1e-5
    assert any("CPU stand-ins (3)" in n and "uint8 mask" in n for n in report.notes)


def _grouped(whole: np.ndarray) -> np.ndarray:
    """[q; k; v] regrouped per KV group, as the parallel_core networks hold it."""
    q_rows = SIZES["heads"] * SIZES["head_dim"]
    kv_rows = SIZES["groups"] * SIZES["head_dim"]
    q, k, v = np.split(whole, [q_rows, q_rows + kv_rows])
    per = SIZES["heads"] // SIZES["groups"] * SIZES["head_dim"]
    d = SIZES["head_dim"]
    return np.concatenate([np.concatenate([q[g * per:(g + 1) * per], k[g * d:(g + 1) * d],
                                           v[g * d:(g + 1) * d]]) for g in range(SIZES["groups"])])


@pytest.mark.parametrize(("wrong", "tensor"), [
    ("grouped", "transformer.encoder.layers.1.self_attention.query_key_value.weight"),
    ("swapped", "transformer.encoder.layers.0.mlp.dense_h_to_4h.weight"),
])
def test_a_grouped_qkv_or_swapped_gate_up_fails_naming_the_tensor(glm, wrong, tensor):
    pytest.importorskip("mindformers")
    from ms_port.testing import rewrite_checkpoint

    root, hf, _unused = glm
    good = root / "good.ckpt"
    if not good.exists():
        assert ms_port.convert(hf, ms_model="mindformers:glm4", output=good).ok

    def edit(arrays: dict) -> None:
        if wrong == "grouped":
            arrays[tensor] = _grouped(arrays[tensor])
        else:
            gate, up = np.split(arrays[tensor], 2)
            arrays[tensor] = np.concatenate([up, gate])

    bad = rewrite_checkpoint(good, root / f"{wrong}.ckpt", edit)
    report = ms_port.verify(hf, bad, ms_model="mindformers:glm4")
    assert report.verdict == "FAIL"
    assert tensor in report.message


def _chatglm2_logits(model_config: dict, ckpt: Path, ids: np.ndarray) -> np.ndarray:
    """MindFormers' ChatGLM2 built from a YAML's model_config (with ms-port's tested CPU run
    settings), loaded with ``ckpt``: its logits for ``ids``."""
    from ms_port.archs.glm.family import build_from
    from ms_port.archs.llama.family import contained

    with contained():
        import mindspore as ms
        from mindformers.models.glm2 import ChatGLM2Config

        ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
        net = build_from(ChatGLM2Config(**model_config, seq_length=ids.shape[1],
                                        use_past=False, use_flash_attention=False,
                                        compute_dtype="float32", param_init_type="float32",
                                        layernorm_compute_type="float32",
                                        rotary_dtype="float32"))
        missing, _ = ms.load_param_into_net(net, ms.load_checkpoint(str(ckpt)))
        assert not missing
        return net(ms.Tensor(ids, ms.int32))[0].asnumpy()


@pytest.mark.parametrize("layout", ["hf", "remote", "rearranged"])
def test_model_config_builds_the_network_that_computes_transformers_logits(glm, layout):
    """--model-config's model_config (with the run settings ms-port tests with) builds
    MindFormers' ChatGLM2 that, loaded with the converted .ckpt, computes transformers'
    GlmForCausalLM's logits, from either layout's config, and with use_rearrange_rope."""
    pytest.importorskip("mindformers")
    import torch
    import transformers
    import yaml

    root, hf, remote = glm
    src = remote if layout == "remote" else hf
    options = REARRANGED if layout == "rearranged" else {}
    ckpt, conf = root / f"mc-{layout}.ckpt", root / f"mc-{layout}.yaml"
    report = ms_port.convert(src, ms_model="mindformers:glm4", output=ckpt, model_config=conf,
                             ms_options=options)
    assert report.ok and report.model_config.readback == "identical"
    doc = yaml.safe_load(conf.read_text())
    assert doc["model"]["arch"] == {"type": "ChatGLM2ForConditionalGeneration"}
    assert doc["load_checkpoint"] == str(ckpt.absolute())
    model_config = {k: v for k, v in doc["model"]["model_config"].items() if k != "type"}
    assert model_config["apply_query_key_layer_scaling"] is True
    assert model_config["kv_channels"] == SIZES["head_dim"]
    assert model_config["use_rearrange_rope"] is (layout == "rearranged")
    assert model_config["rope_ratio"] == RATIO
    ids = (np.arange(16) * 37 % SIZES["vocab"]).reshape(1, 16)
    reference = transformers.GlmForCausalLM.from_pretrained(hf, attn_implementation="eager")
    with torch.no_grad():
        want = reference.eval()(torch.tensor(ids)).logits.numpy()

    def error(settings: dict) -> float:
        logits = _chatglm2_logits(settings, ckpt, ids)
        return float(np.linalg.norm(logits - want) / np.linalg.norm(want))

    assert error(model_config) < 1e-5
    if layout == "hf":  # the ratio read matters: the network with it misread is far off
        assert error({**model_config, "rope_ratio": 1.0}) > 1e-3


def test_verify_by_layers_passes_and_fails_where_the_whole_does(glm, monkeypatch):
    pytest.importorskip("mindformers")
    from ms_port.archs.glm.blocks import GlmBlocks
    from ms_port.testing import rewrite_checkpoint

    root, hf, _unused = glm
    good = root / "layers.ckpt"
    assert ms_port.convert(hf, ms_model="mindformers:glm4", output=good).ok
    built, build_ms = [], GlmBlocks.ms_network
    monkeypatch.setattr(GlmBlocks, "ms_network",
                        lambda self, piece, tensors: built.append(
                            build_ms(self, piece, tensors)) or built[-1])
    set_into = {}
    from ms_port.archs.llama import blocks as llama_blocks
    original = llama_blocks.set_parameters
    monkeypatch.setattr(llama_blocks, "set_parameters", lambda own, tensors, shapes=None: (
        set_into.setdefault(id(own), (own, set()))[1].update(tensors),
        original(own, tensors, shapes))[1])
    report = ms_port.verify(hf, good, ms_model="mindformers:glm4", mode="layers")
    assert report.verdict == "PASS" and report.mode == "layers", report.message
    # one network, built once: the blocks set every parameter of it (none is left holding
    # another block's weights), and each block's, done with, handed back (placeholders)
    assert [set(own) - names for own, names in set_into.values()] == [set()]
    assert len(built) == 2 + SIZES["layers"]
    assert all(max(p.shape, default=1) == 1 for net in built for p in net.get_parameters())
    assert report.error < 1e-5 and any("CPU stand-ins" in n for n in report.notes)
    # each side's two inputs run stacked: the measures of the passes apart, none lost
    from test_blocks import assert_same_noise

    with monkeypatch.context() as apart:
        apart.setattr(GlmBlocks, "stacks", False)
        assert_same_noise(report, ms_port.verify(hf, good, ms_model="mindformers:glm4",
                                                 mode="layers"))
    tensor = "transformer.encoder.layers.1.self_attention.query_key_value.weight"
    bad = rewrite_checkpoint(good, root / "layers-bad.ckpt",
                             lambda a: a.__setitem__(tensor, _grouped(a[tensor])))
    failed = ms_port.verify(hf, bad, ms_model="mindformers:glm4", mode="layers")
    assert failed.verdict == "FAIL" and tensor in failed.message
    assert "transformer.encoder.layers.1" in failed.first_divergence.describe()


def test_every_token_id_passes_and_a_wrong_conversion_still_fails(glm, tmp_path):
    """The inputs users really feed: every id of the vocabulary (the pad id 0 among them,
    which this network must not mask), 256 tokens."""
    pytest.importorskip("mindformers")
    from ms_port.testing import rewrite_checkpoint

    root, hf, _unused = glm
    ckpt = root / "every.ckpt"
    assert ms_port.convert(hf, ms_model="mindformers:glm4", output=ckpt).ok
    ids = np.arange(SIZES["vocab"], dtype=np.int64)
    np.save(tmp_path / "ids.npy", np.concatenate([ids, ids[::-1]])[None])
    args = {"ms_model": "mindformers:glm4", "inputs": tmp_path / "ids.npy"}
    report = ms_port.verify(hf, ckpt, **args)
    assert report.verdict == "PASS", report.message
    assert report.inputs[0]["shape"] == [1, 256]
    tensor = "transformer.encoder.layers.0.mlp.dense_h_to_4h.weight"

    def swap(arrays: dict) -> None:
        gate, up = np.split(arrays[tensor], 2)
        arrays[tensor] = np.concatenate([up, gate])

    failed = ms_port.verify(hf, rewrite_checkpoint(ckpt, root / "every-bad.ckpt", swap), **args)
    assert failed.verdict == "FAIL" and tensor in failed.message


@pytest.mark.parametrize(("qkv", "mlp"), VARIANTS)
def test_export_back_to_the_remote_layout_is_bit_exact(glm, qkv, mlp):
    """With the remote code's config.json, export writes the original repo's names
    (computed: transformers has no class for it), every tensor as that repo holds it; the
    derived rotary_pos_emb.inv_freq is the remote code's to compute and is not written."""
    from safetensors.numpy import load_file

    root, hf, remote = glm
    ckpt = root / f"r-{qkv}-{mlp}.ckpt"
    assert ms_port.convert(hf, ms_model="mindformers:glm4", ms_options=_options(qkv, mlp),
                           output=ckpt).ok
    back = root / f"remote-back-{qkv}-{mlp}"
    report = ms_port.export(ckpt, ms_model="mindformers:glm4", ms_options=_options(qkv, mlp),
                            config=remote / "config.json", output=back)
    assert report.ok, report.message
    want, got = load_file(remote / "model.safetensors"), load_file(back / "model.safetensors")
    assert set(want) - set(got) == {"transformer.rotary_pos_emb.inv_freq"}
    assert set(got) <= set(want)
    for name in got:
        assert np.array_equal(want[name], got[name]), name


# -- use_rearrange_rope: q and k rows of each head as rotary halves --------------------------

def _mindformers_rearranged(hf: Path, qkv: bool) -> dict[str, np.ndarray]:
    """q/k/v as MindFormers' own convert_weight.py lays them out with use_rearrange_rope:
    its rearrange_w / rearrange_b on q and k, v as it is (the reference the table is held
    to)."""
    from safetensors.numpy import load_file

    pytest.importorskip("mindformers")
    from ms_port.archs.llama.family import contained

    with contained():
        from mindformers.models.glm2.convert_weight import rearrange_b, rearrange_w
    sd, d = load_file(hf / "model.safetensors"), SIZES["head_dim"]
    out = {}
    for i in range(SIZES["layers"]):
        p, t = f"model.layers.{i}.self_attn.", f"transformer.encoder.layers.{i}.self_attention."
        for kind, rearrange in (("weight", rearrange_w), ("bias", rearrange_b)):
            q, k, v = (sd[f"{p}{x}_proj.{kind}"] for x in "qkv")
            q, k = rearrange(q, d), rearrange(k, d)
            if qkv:
                out[f"{t}query_key_value.{kind}"] = np.concatenate([q, k, v])
            else:
                out.update({f"{t}wq.{kind}": q, f"{t}wk.{kind}": k, f"{t}wv.{kind}": v})
    return out


@pytest.mark.parametrize("qkv", [True, False])
def test_rearranged_rope_is_mindformers_own_layout_from_both_layouts(glm, qkv):
    """--ms-option use_rearrange_rope=true writes q and k as MindFormers' converter does,
    from the -hf layout in both qkv layouts and from the remote layout fused; the remote
    layout split and rearranged is refused in one line, nothing written."""
    root, hf, remote = glm
    options = {"qkv_concat": qkv, **REARRANGED}
    want = _mindformers_rearranged(hf, qkv)
    ckpt = root / f"rr-{qkv}.ckpt"
    assert ms_port.convert(hf, ms_model="mindformers:glm4", ms_options=options, output=ckpt).ok
    got = read_source(ckpt)
    for name, array in want.items():
        assert np.array_equal(np.asarray(got.tensors[name].load()), array), name
    from_remote = root / f"rr-remote-{qkv}.ckpt"
    if qkv:
        assert ms_port.convert(remote, ms_model="mindformers:glm4", ms_options=options,
                               output=from_remote).ok
        again = read_source(from_remote)
        for name in got.tensors:
            assert np.array_equal(np.asarray(again.tensors[name].load()),
                                  np.asarray(got.tensors[name].load())), name
    else:
        with pytest.raises(MsPortError, match="qkv_concat=false and use_rearrange_rope=true"):
            ms_port.convert(remote, ms_model="mindformers:glm4", ms_options=options,
                            output=from_remote)
        assert not from_remote.exists()


@pytest.mark.parametrize("qkv", [True, False])
def test_rearranged_rope_verifies_and_each_layout_fails_on_the_others_network(glm, qkv):
    """MindFormers' network built with use_rearrange_rope (its ChatGLM2RotaryEmbedding,
    one more stand-in said) computes transformers' logits from the rearranged checkpoint,
    whole and by layers; the plain checkpoint on that network, or the rearranged one on the
    plain network, FAILs naming q/k's tensor."""
    pytest.importorskip("mindformers")
    root, hf, _unused = glm
    options = {"qkv_concat": qkv, **REARRANGED}
    rearranged, plain = root / f"rrv-{qkv}.ckpt", root / f"rrv-plain-{qkv}.ckpt"
    assert ms_port.convert(hf, ms_model="mindformers:glm4", ms_options=options,
                           output=rearranged).ok
    assert ms_port.convert(hf, ms_model="mindformers:glm4", ms_options={"qkv_concat": qkv},
                           output=plain).ok
    for mode in ("whole", "layers"):
        report = ms_port.verify(hf, rearranged, ms_model="mindformers:glm4", ms_options=options,
                                mode=mode)
        assert report.verdict == "PASS", report.message
        assert report.error < 1e-5
    assert any("CPU stand-ins (4)" in n and "ops.matmul" in n for n in report.notes)
    if qkv:  # every token id over 256 positions: the rearranged rotary path at length
        ids = np.arange(SIZES["vocab"], dtype=np.int64)
        np.save(root / "rr-ids.npy", np.concatenate([ids, ids[::-1]])[None])
        report = ms_port.verify(hf, rearranged, ms_model="mindformers:glm4",
                                ms_options=options, inputs=root / "rr-ids.npy")
        assert report.verdict == "PASS" and report.inputs[0]["shape"] == [1, 256]
    tensor = "query_key_value" if qkv else ".wq."
    for ckpt, opts in ((plain, options), (rearranged, {"qkv_concat": qkv})):
        report = ms_port.verify(hf, ckpt, ms_model="mindformers:glm4", ms_options=opts)
        assert report.verdict == "FAIL"
        assert tensor in report.message


@pytest.mark.parametrize("qkv", [True, False])
def test_rearranged_rope_exports_back_bit_exact(glm, qkv):
    from safetensors.numpy import load_file

    root, hf, remote = glm
    options = {"qkv_concat": qkv, **REARRANGED}
    ckpt = root / f"rre-{qkv}.ckpt"
    assert ms_port.convert(hf, ms_model="mindformers:glm4", ms_options=options, output=ckpt).ok
    for config in (hf, remote) if qkv else (hf,):
        back = root / f"rre-back-{qkv}-{config.name}"
        report = ms_port.export(ckpt, ms_model="mindformers:glm4", ms_options=options,
                                config=config / "config.json", output=back)
        assert report.ok, report.message
        want, got = load_file(config / "model.safetensors"), load_file(back / "model.safetensors")
        assert set(got) <= set(want) and len(want) - len(got) <= 1  # inv_freq: derived
        for name in got:
            assert np.array_equal(want[name], got[name]), name


# -- verify from the remote-code layout ------------------------------------------------------


def test_a_remote_layout_source_verifies_as_transformers_glm_holds_it(glm):
    """transformers has no class for the remote code: verify runs its checkpoint as
    transformers' GlmForCausalLM (query_key_value split, the config read as GlmConfig),
    says so, and PASSes whole and by layers; a wrong conversion FAILs naming the tensor;
    an inv_freq the config does not imply is refused before anything runs."""
    pytest.importorskip("mindformers")
    import transformers
    from safetensors.numpy import load_file, save_file

    from ms_port.archs.glm.remote import hf_config
    from ms_port.testing import rewrite_checkpoint

    root, hf, remote = glm
    translated = transformers.GlmConfig(**hf_config(json.loads((remote / "config.json")
                                                               .read_text())))
    own = transformers.GlmConfig.from_pretrained(hf)
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
                "attention_bias", "rope_parameters", "tie_word_embeddings"):
        assert getattr(translated, key) == getattr(own, key), key
    ratio = {**json.loads((remote / "config.json").read_text()), "rope_ratio": 500}
    assert transformers.GlmConfig(**hf_config(ratio)).rope_parameters["rope_theta"] == 5e6
    ckpt = root / "from-remote.ckpt"
    assert ms_port.convert(remote, ms_model="mindformers:glm4", output=ckpt).ok
    for mode in ("whole", "layers"):
        report = ms_port.verify(remote, ckpt, ms_model="mindformers:glm4", mode=mode)
        assert report.verdict == "PASS", report.message
        assert report.error < 1e-5
        assert any("remote-code layout" in n and "GlmForCausalLM" in n for n in report.notes)
    tensor = "transformer.encoder.layers.1.self_attention.query_key_value.weight"
    bad = rewrite_checkpoint(ckpt, root / "from-remote-bad.ckpt",
                             lambda a: a.__setitem__(tensor, _grouped(a[tensor])))
    failed = ms_port.verify(remote, bad, ms_model="mindformers:glm4")
    assert failed.verdict == "FAIL" and tensor in failed.message
    wrong = root / "remote-wrong-freq"
    wrong.mkdir()
    (wrong / "config.json").write_text((remote / "config.json").read_text())
    arrays = load_file(remote / "model.safetensors")
    arrays["transformer.rotary_pos_emb.inv_freq"] = arrays[
        "transformer.rotary_pos_emb.inv_freq"] * 2
    save_file(arrays, str(wrong / "model.safetensors"))
    with pytest.raises(MsPortError, match=r"inv_freq is not what config\.json implies"):
        ms_port.verify(wrong, ckpt, ms_model="mindformers:glm4")


def test_no_query_key_layer_scaling_is_a_setting_verify_fails_and_says_why(glm):
    """apply_query_key_layer_scaling=false changes no byte but the function: MindFormers'
    core attention (flash attention off, as on a CPU) then applies no 1/sqrt(head_dim).
    verify builds that network, FAILs, and says why; --model-config writes the setting."""
    pytest.importorskip("mindformers")
    import yaml

    root, hf, _unused = glm
    off = {"apply_query_key_layer_scaling": False}
    ckpt, conf = root / "noscale.ckpt", root / "noscale.yaml"
    report = ms_port.convert(hf, ms_model="mindformers:glm4", ms_options=off, output=ckpt,
                             model_config=conf)
    assert report.ok
    assert any("applies no 1/sqrt(head_dim)" in n for n in report.plan.notes)
    model_config = yaml.safe_load(conf.read_text())["model"]["model_config"]
    assert model_config["apply_query_key_layer_scaling"] is False
    assert ms_port.verify(hf, ckpt, ms_model="mindformers:glm4").verdict == "PASS"
    failed = ms_port.verify(hf, ckpt, ms_model="mindformers:glm4", ms_options=off)
    assert failed.verdict == "FAIL"
    assert any("applies no 1/sqrt(head_dim)" in n for n in failed.notes)


def test_multi_head_remote_config_reads_every_head_not_the_unused_group_count(tmp_path):
    """A remote config with multi_query_attention false carries multi_query_group_num 1
    (ChatGLMConfig's default) that nothing reads: the table's kv_groups takes it only where
    the switch is true (a guarded alternative), so the split layout converts and the
    rearranged rows are MindFormers' own in every head of k."""
    pytest.importorskip("mindformers")
    from ms_port.archs.llama.family import contained

    hf = _hf(tmp_path, groups=SIZES["heads"], name="hf-mha")
    remote = _remote(tmp_path, hf, multi_head=True)
    split = tmp_path / "mha-split.ckpt"
    report = ms_port.convert(remote, ms_model="mindformers:glm4",
                             ms_options={"qkv_concat": False}, output=split)
    assert report.ok
    assert report.plan.params["kv_groups"][0] == SIZES["heads"]
    ckpt = tmp_path / "mha-rr.ckpt"
    assert ms_port.convert(remote, ms_model="mindformers:glm4", ms_options=REARRANGED,
                           output=ckpt).ok
    with contained():
        from mindformers.models.glm2.convert_weight import rearrange_w
    from safetensors.numpy import load_file

    sd, d = load_file(hf / "model.safetensors"), SIZES["head_dim"]
    p = "model.layers.0.self_attn."
    want = np.concatenate([rearrange_w(sd[p + "q_proj.weight"], d),
                           rearrange_w(sd[p + "k_proj.weight"], d), sd[p + "v_proj.weight"]])
    got = read_source(ckpt).tensors[
        "transformer.encoder.layers.0.self_attention.query_key_value.weight"].load()
    assert np.array_equal(np.asarray(got), want)


def test_remote_switches_and_stored_buffers_as_real_checkpoints_hold_them(glm, tmp_path):
    """GLM-4's remote code computes rotary_pos_emb.inv_freq in torch_dtype (bfloat16 in the
    published checkpoints, each step rounded): convert and verify take it, while another
    base in bfloat16 is still refused. A switch that changes the function and no tensor
    (apply_residual_connection_post_layernorm) is refused by name; a layer named twice
    (01 and 1) is refused by verify's view, as by convert."""
    import ml_dtypes
    import torch
    from safetensors.numpy import load_file, save_file

    remote = glm[2]
    arrays = load_file(remote / "model.safetensors")
    config = json.loads((remote / "config.json").read_text())
    dim = SIZES["head_dim"] // 2

    def variant(name: str, base: float = 10000.0, **extra: Any) -> Path:
        freq = 1.0 / (base ** (torch.arange(0, dim, 2).to(torch.bfloat16) / dim))
        folder = tmp_path / name
        folder.mkdir()
        held = {**arrays, "transformer.rotary_pos_emb.inv_freq":
                freq.view(torch.int16).numpy().view(ml_dtypes.bfloat16)}
        held.update(extra.pop("tensors", {}))
        save_file(held, str(folder / "model.safetensors"))
        (folder / "config.json").write_text(json.dumps({**config, **extra}))
        return folder

    bf16 = variant("bf16")
    ckpt = tmp_path / "bf16.ckpt"
    assert ms_port.convert(bf16, ms_model="mindformers:glm4", output=ckpt).ok
    if importlib.util.find_spec("mindformers") is not None:
        assert ms_port.verify(bf16, ckpt, ms_model="mindformers:glm4").verdict == "PASS"
    with pytest.raises(MsPortError, match="inv_freq"):
        ms_port.convert(variant("base", base=5e6), ms_model="mindformers:glm4",
                        output=tmp_path / "base.ckpt")
    assert not (tmp_path / "base.ckpt").exists()
    with pytest.raises(MsPortError, match="apply_residual_connection_post_layernorm is true"):
        ms_port.convert(variant("post", apply_residual_connection_post_layernorm=True),
                        ms_model="mindformers:glm4", output=tmp_path / "post.ckpt")
    twice = variant("twice", tensors={
        "transformer.encoder.layers.01.input_layernorm.weight":
            arrays["transformer.encoder.layers.1.input_layernorm.weight"]})
    with pytest.raises(MsPortError, match="names a tensor another one already names"):
        ms_port.verify(twice, ckpt, ms_model="mindformers:glm4")


def test_diff_takes_the_hf_directory_and_recognises_the_family(glm):
    """diff reads a Hugging Face directory with its config.json, recognises a glm4
    checkpoint by its names (its table, as export does) and takes --ms-option for the
    layout names cannot show: without it a rearranged checkpoint's q/k rows differ."""
    root, hf, remote = glm
    plain, rearranged = root / "diff-plain.ckpt", root / "diff-rr.ckpt"
    assert ms_port.convert(hf, ms_model="mindformers:glm4", output=plain).ok
    assert ms_port.convert(hf, ms_model="mindformers:glm4", ms_options=REARRANGED,
                           output=rearranged).ok
    assert ms_port.diff(hf, plain).ok
    assert ms_port.diff(remote, plain, ms_model="mindformers:glm4").ok
    assert ms_port.diff(hf, rearranged, ms_options=REARRANGED).ok
    differs = ms_port.diff(hf, rearranged)
    assert not differs.ok
    assert {d.target for d in differs.problems} == {
        f"transformer.encoder.layers.{i}.self_attention.query_key_value.{k}"
        for i in range(SIZES["layers"]) for k in ("weight", "bias")}
    assert any("use_rearrange_rope=true needs it here too" in n for n in differs.notes)
    # the layout the names show is taken, and an option that contradicts it is refused
    with pytest.raises(MsPortError, match="names are mindformers:glm4's layout with "
                                          "qkv_concat=true"):
        ms_port.diff(hf, plain, ms_options={"qkv_concat": "false"})
    with pytest.raises(MsPortError, match="compared by name; config, ms_options apply"):
        ms_port.diff(plain, rearranged, config=hf / "config.json", ms_options=REARRANGED)
    # a config the family cannot read: compared by names, and the note says why
    # (transformers 5 keeps partial_rotary_factor inside rope_parameters, and a top-level
    # value beside it is not read: the network rotates what the mapping says)
    config = json.loads((hf / "config.json").read_text())
    assert ms_port.diff(hf / "model.safetensors", plain,
                        config={**config, "partial_rotary_factor": 0.25}).ok
    broken = {**config, "rope_parameters": {**config["rope_parameters"],
                                            "partial_rotary_factor": 0.25}}
    unread = ms_port.diff(hf / "model.safetensors", plain, config=broken)
    assert not unread.ok
    assert any("names mindformers:glm4's model type, and mindformers:glm4 cannot read it "
               "(rope_parameters.partial_rotary_factor is 0.25" in n for n in unread.notes)
    with pytest.raises(MsPortError, match="--ms-option is for a known family"):
        ms_port.diff(hf / "model.safetensors", plain, ms_options=REARRANGED,
                     config={"model_type": "other"})


def test_a_tied_remote_checkpoint_fills_the_output_layer_from_the_embedding(glm, tmp_path):
    from safetensors.numpy import load_file, save_file

    remote = glm[2]
    arrays = load_file(remote / "model.safetensors")
    del arrays["transformer.output_layer.weight"]
    tied = tmp_path / "tied"
    tied.mkdir()
    save_file(arrays, str(tied / "model.safetensors"))
    config = {**json.loads((remote / "config.json").read_text()), "tie_word_embeddings": True}
    (tied / "config.json").write_text(json.dumps(config))
    ckpt = tmp_path / "tied.ckpt"
    assert ms_port.convert(tied, ms_model="mindformers:glm4", output=ckpt).ok
    got = read_source(ckpt).tensors
    assert np.array_equal(np.asarray(got["transformer.output_layer.weight"].load()),
                          arrays["transformer.embedding.word_embeddings.weight"])
    back = tmp_path / "tied-back"  # the way back holds the head once, as the repo does
    assert ms_port.export(ckpt, ms_model="mindformers:glm4", config=tied / "config.json",
                          output=back).ok
    written = load_file(back / "model.safetensors")
    assert set(arrays) - set(written) == {"transformer.rotary_pos_emb.inv_freq"}
    assert all(np.array_equal(written[n], arrays[n]) for n in written)
    config["tie_word_embeddings"] = False
    (tied / "config.json").write_text(json.dumps(config))
    assert not ms_port.convert(tied, ms_model="mindformers:glm4",
                               output=tmp_path / "untied.ckpt").ok
