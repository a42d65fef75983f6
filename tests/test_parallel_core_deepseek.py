"""``mindformers:deepseek3``: Hugging Face DeepSeek-V3 into MindFormers 2.1's parallel_core
training network (``TrainingDeepseekV3ForCausalLM``), with no mapping file.

What is proven here, on tiny seeded models made with transformers:

- the computed names and shapes equal the real network's, built under
  ``no_init_parameters`` in a process of its own, in each layout (fused ``linear_qkv`` or
  one tensor per MLA projection; dense and mixture-of-experts layers; the MTP layer);
- every converted tensor equals the one written out here by hand from the Hugging Face
  tensors, following MindFormers' code; for each fused layout a wrong twin (another order,
  halves for interleaved rows, rows for halves) differs, and computing what the network's
  code computes from the tensors (its splits and reshapes, in numpy) gives Hugging Face's
  result with ours and not with the twins; the experts and the interleaved MLPs also equal
  what MindFormers' own converters for the same classes make (Qwen3-MoE's
  ``ExpertsConvertOp``, ``TrainModelMixin.concat_linear_fc1_interleaved``);
- MindFormers' own network, run on this CPU with ms-port's kernel stand-ins
  (``ms_port/archs/parallel_core/cpu.py``) in each layout, computes transformers' logits
  (relative error below 1e-5; yarn RoPE with mscale; the MTP layer loaded, not run), and
  each plausible mistake (a fused tensor's parts in another order, halves for interleaved
  rows, experts reversed, the router's correction bias dropped) is far off (above 1e-2);
- ``verify`` PASSes by that forward, in the layout the options give; a wrong tensor FAILs,
  named; where the network cannot run, the verdict is INCONCLUSIVE, never PASS.

MindFormers' own converters are no oracle here, and a test says why: ``deepseek3`` has no
``weight_converters`` (its training network has no Hugging Face weight template, so
``load_hf_checkpoint`` cannot fill it), and its ``weight_mapping`` names what the inference
network's loader reads (``mlp.gating``/``mlp.hidden``, which
``parallel_core/inference/model_utils.py`` stacks into ``linear_fc1``; per-expert names;
``decoder.enorm`` for an MTP layer hard-coded as 61) — only its attention names happen to
be the training network's, in the layout its recipes build (``mla_qkv_concat: False``).
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
from ms_port.errors import MappingError, TargetError  # noqa: E402
from ms_port.read.sources import read_source  # noqa: E402

needs_mindformers = pytest.mark.skipif(importlib.util.find_spec("mindformers") is None,
                                       reason="mindformers not installed (test extra)")
FAMILY = "mindformers:deepseek3"
DEEPSEEK = dict(vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
                q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4,
                v_head_dim=8, first_k_dense_replace=1, n_routed_experts=4,
                num_experts_per_tok=2, n_shared_experts=1, n_group=2, topk_group=1,
                max_position_embeddings=64, rms_norm_eps=1e-6)
H, E, F, L = 64, 4, 32, 3


def tiny_deepseek(path, *, dtype="float32", seed=0, mtp=0, mtp_weights=False):
    """A seeded tiny DeepSeek-V3 as transformers saves it (per-expert keys, no MTP layer);
    norms off 1 and the router's correction bias off 0, so that a swap shows. With
    ``mtp_weights``, the Hub's MTP layer ``model.layers.3`` is added: a mixture-of-experts
    layer of its own, ``enorm``, ``hnorm``, ``eh_proj``, ``shared_head.norm``, and copies of
    the embedding and the head, as DeepSeek's files hold them."""
    from safetensors.torch import load_file, save_file

    config = transformers.DeepseekV3Config(**DEEPSEEK, num_nextn_predict_layers=mtp)
    torch.manual_seed(seed)
    model = transformers.DeepseekV3ForCausalLM(config)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            if "norm" in name:
                t.copy_(1 + 0.2 * torch.randn(t.shape, generator=gen))
            elif "e_score_correction_bias" in name:
                t.copy_(0.1 * torch.randn(t.shape, generator=gen))
    model.to(getattr(torch, dtype)).save_pretrained(path)
    if mtp_weights:
        file = path / "model.safetensors"
        state = load_file(file)
        n = f"model.layers.{L}."
        for name, t in list(state.items()):
            if name.startswith("model.layers.1."):  # an MoE layer's names and shapes
                scale = 1 if "norm" in name else 0.05
                state[n + name[len("model.layers.1."):]] = (
                    (1 if "norm" in name else 0) + scale * torch.randn(t.shape, generator=gen)
                ).to(t.dtype)
        for extra, shape in (("enorm", (H,)), ("hnorm", (H,)), ("shared_head.norm", (H,))):
            state[f"{n}{extra}.weight"] = (1 + 0.2 * torch.randn(shape, generator=gen)
                                           ).to(state["model.norm.weight"].dtype)
        state[n + "eh_proj.weight"] = (0.05 * torch.randn((H, 2 * H), generator=gen)).to(
            state["model.norm.weight"].dtype)
        state[n + "embed_tokens.weight"] = state["model.embed_tokens.weight"].clone()
        state[n + "shared_head.head.weight"] = state["lm_head.weight"].clone()
        save_file(state, file, metadata={"format": "pt"})
    return path


def hf_tensors(path):
    return {i.name: np.asarray(i.load()) for i in read_source(path)}


def converted(path, out, **options):
    report = ms_port.convert(path, ms_model=FAMILY, output=out, ms_options=options or None)
    assert report.ok, report.plan.problems()[:5]
    assert report.plan.mapping.origin.endswith("hf_deepseek3_mindformers.yaml")
    return report, {i.name: np.asarray(i.load()) for i in read_source(out)}


def interleave(gate, up):
    """Rows gate_0, up_0, gate_1, ...: what MLPInterleaved reads (reshape (..., F, 2))."""
    return np.stack([gate, up], axis=1).reshape(-1, gate.shape[1])


def expected(hf, *, mla_qkv_concat=True, mtp=False):
    """Every tensor of MindFormers' network, written out from the Hugging Face ones as its
    code reads them (multi_latent_attention.py, mlp.py, moe/ffn.py, moe/router.py)."""
    out = {"embedding.word_embeddings.weight": hf["model.embed_tokens.weight"],
           "decoder.final_layernorm.weight": hf["model.norm.weight"],
           "output_layer.weight": hf["lm_head.weight"]}

    def layer(p, s, moe):
        a, h = f"{p}.self_attention.", f"{s}.self_attn."
        out[f"{p}.input_layernorm.weight"] = hf[f"{s}.input_layernorm.weight"]
        out[f"{p}.pre_mlp_layernorm.weight"] = hf[f"{s}.post_attention_layernorm.weight"]
        out[a + "linear_proj.weight"] = hf[h + "o_proj.weight"]
        out[a + "q_layernorm.weight"] = hf[h + "q_a_layernorm.weight"]
        if mla_qkv_concat:
            # split_3d(linear_qkv(x), [q_lora_rank, kv_lora_rank, qk_rope_head_dim]):
            # q_a_proj's rows, then kv_a_proj_with_mqa's ([compressed kv | k_pe])
            out[a + "linear_qkv.weight"] = np.concatenate(
                [hf[h + "q_a_proj.weight"], hf[h + "kv_a_proj_with_mqa.weight"]])
            out[a + "linear_qb.weight"] = hf[h + "q_b_proj.weight"]
            out[a + "linear_kvb.weight"] = hf[h + "kv_b_proj.weight"]
            out[a + "k_layernorm.weight"] = hf[h + "kv_a_layernorm.weight"]
        else:
            out[a + "linear_q_down_proj.weight"] = hf[h + "q_a_proj.weight"]
            out[a + "linear_q_up_proj.weight"] = hf[h + "q_b_proj.weight"]
            out[a + "linear_kv_down_proj.weight"] = hf[h + "kv_a_proj_with_mqa.weight"]
            out[a + "linear_kv_up_proj.weight"] = hf[h + "kv_b_proj.weight"]
            out[a + "kv_layernorm.weight"] = hf[h + "kv_a_layernorm.weight"]
        m, g = f"{p}.mlp.", f"{s}.mlp."
        if not moe:
            out[m + "linear_fc1.weight"] = interleave(hf[g + "gate_proj.weight"],
                                                      hf[g + "up_proj.weight"])
            out[m + "linear_fc2.weight"] = hf[g + "down_proj.weight"]
            return
        out[m + "router.weight"] = hf[g + "gate.weight"]
        out[m + "router.expert_bias"] = hf[g + "gate.e_score_correction_bias"]
        out[m + "router.expert_load"] = np.zeros(E, np.float32)
        out[m + "router.fi_accu"] = np.zeros(E, np.float32)
        x = g + "experts.{}.{}_proj.weight"
        # FFNGroupedGEMM: weight1 viewed (E, H, 2F), Swiglu on the last axis (halves)
        out[m + "experts.weight1"] = np.concatenate([np.concatenate(
            [hf[x.format(e, "gate")].T, hf[x.format(e, "up")].T], axis=1) for e in range(E)])
        out[m + "experts.weight2"] = np.concatenate([hf[x.format(e, "down")].T
                                                     for e in range(E)])
        out[m + "shared_experts.linear_fc1.weight"] = interleave(
            hf[g + "shared_experts.gate_proj.weight"], hf[g + "shared_experts.up_proj.weight"])
        out[m + "shared_experts.linear_fc2.weight"] = hf[g + "shared_experts.down_proj.weight"]

    for i in range(L):
        layer(f"decoder.layers.{i}", f"model.layers.{i}", moe=i >= 1)
    if mtp:
        p, s = "mtp.layers.0", f"model.layers.{L}"
        for ours, theirs in (("enorm", "enorm"), ("hnorm", "hnorm"), ("eh_proj", "eh_proj"),
                             ("final_layernorm", "shared_head.norm")):
            out[f"{p}.{ours}.weight"] = hf[f"{s}.{theirs}.weight"]
        layer(f"{p}.transformer_layer", s, moe=True)
    return out


def assert_equal_to(ours, wanted):
    assert set(ours) == set(wanted)
    for name, array in wanted.items():
        assert ours[name].dtype == array.dtype and ours[name].tobytes() == array.tobytes(), name


# --- the real network --------------------------------------------------------------------

_REAL = r"""
import json, os, sys
os.environ.setdefault("LOCAL_DEFAULT_PATH", sys.argv[2])
from mindspore.nn.utils import no_init_parameters
from mindformers.core.context import build_context
build_context({'use_legacy': False, 'context': {'device_target': 'CPU', 'mode': 0},
               'parallel': {}})
from mindformers.models.deepseek3.configuration_deepseek_v3 import DeepseekV3Config
from mindformers.models.deepseek3.modeling_deepseek_v3_train import TrainingDeepseekV3ForCausalLM
for given in json.loads(sys.argv[1]):
    with no_init_parameters():
        net = TrainingDeepseekV3ForCausalLM(DeepseekV3Config(**given))
    print("NAMES" + json.dumps([[p.name, list(p.shape)] for _, p in net.parameters_and_names()]))
    print("TEMPLATE" + json.dumps(getattr(net, "template", None) is None))
"""

#: what MindFormers' DeepseekV3Config takes from a Hugging Face config.json (the rest is
#: transformers' own bookkeeping: rope_parameters, head_dim = qk_rope_head_dim, ...)
_KEEP = ("vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size",
         "num_hidden_layers", "num_nextn_predict_layers", "num_attention_heads",
         "num_key_value_heads", "n_shared_experts", "n_routed_experts", "kv_lora_rank",
         "q_lora_rank", "qk_rope_head_dim", "v_head_dim", "qk_nope_head_dim", "n_group",
         "topk_group", "num_experts_per_tok", "first_k_dense_replace", "rms_norm_eps",
         "tie_word_embeddings", "max_position_embeddings")

CASES = {  # name: (config.json changes, target options)
    "fused, MTP": ({"num_nextn_predict_layers": 1}, {}),
    "separate, MTP": ({"num_nextn_predict_layers": 1}, {"mla_qkv_concat": False}),
    "all MoE, 2 shared experts, tied, no MTP": (
        {"first_k_dense_replace": 0, "n_shared_experts": 2, "tie_word_embeddings": True,
         "num_nextn_predict_layers": 1}, {"mtp": False}),
}


def _config(changes):
    return {**DEEPSEEK, "model_type": "deepseek_v3", **changes}


@pytest.fixture(scope="module")
def real_networks(tmp_path_factory):
    """The real networks' (name, shape) lists, one per case, and whether each has a
    Hugging Face weight template; built in one process of their own (parallel_core needs
    MindFormers' global context, which the legacy LLaMA tests must not see)."""
    given = []
    for changes, options in CASES.values():
        config = _config(changes)
        given.append({**{k: config[k] for k in _KEEP if k in config},
                      **ds.mindformers_settings(config, **options)})
    run = subprocess.run([sys.executable, "-c", _REAL, json.dumps(given),
                          str(tmp_path_factory.mktemp("mindformers"))],
                         capture_output=True, text=True, timeout=900)
    names = [json.loads(x[5:]) for x in run.stdout.splitlines() if x.startswith("NAMES")]
    templates = [json.loads(x[8:]) for x in run.stdout.splitlines() if x.startswith("TEMPLATE")]
    assert len(names) == len(CASES), run.stderr[-3000:]
    return {case: ([(n, tuple(s)) for n, s in got], none)
            for case, got, none in zip(CASES, names, templates)}


@needs_mindformers
@pytest.mark.parametrize("case", list(CASES))
def test_computed_target_equals_the_real_network(real_networks, case):
    changes, options = CASES[case]
    computed = [(t.name, t.shape) for t in ds.deepseek_target(_config(changes),
                                                              **options).tensors.values()]
    assert computed == real_networks[case][0]


@needs_mindformers
def test_mindformers_cannot_load_hugging_face_weights_into_this_network_itself(real_networks):
    """load_hf_checkpoint needs the network's weight template, made from weight_converters
    by register_hf_weight_template: TrainingDeepseekV3ForCausalLM has neither."""
    from mindformers.models.deepseek3.utils import DeepseekV3PreTrainedModel

    assert not hasattr(DeepseekV3PreTrainedModel, "weight_converters")
    assert all(none for _, none in real_networks.values())


@needs_mindformers
def test_mindformers_weight_mapping_names_another_network(tmp_path):
    """DeepseekV3PreTrainedModel.weight_mapping, applied as ModelMixin.convert_name applies
    it, names what the inference loader reads: the MLPs' gating/hidden (stacked into
    linear_fc1 on loading), every expert apart, and the MTP layer as decoder.enorm /
    decoder.transformer (hard-coded as layer 61, its shared_head.norm landing on the model's
    own final norm). Only the attention and norms, in the recipes' layout
    (mla_qkv_concat: False), are the training network's names."""
    from mindformers.models.deepseek3.utils import DeepseekV3PreTrainedModel

    def theirs(name):
        for hf_name, mf_name in DeepseekV3PreTrainedModel.weight_mapping:
            name = name.replace(hf_name, mf_name) if hf_name in name else name
        return name

    src = tiny_deepseek(tmp_path / "ds", mtp=1, mtp_weights=True)
    config = json.loads((src / "config.json").read_text())
    names = set(hf_tensors(src))
    mtp = {n for n in names if n.startswith(f"model.layers.{L}.")}
    mlp = ({f"model.layers.0.mlp.{p}_proj.weight" for p in ("gate", "up")}
           | {f"model.layers.{i}.mlp.shared_experts.{p}_proj.weight"
              for i in (1, 2) for p in ("gate", "up")}
           | {f"model.layers.{i}.mlp.experts.{e}.{p}_proj.weight"
              for i in (1, 2) for e in range(E) for p in ("gate", "up", "down")})
    mla = {f"model.layers.{i}.self_attn.{p}.weight" for i in range(L)
           for p in ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "kv_a_layernorm")}
    for options, lost in (({}, mlp | mla | mtp), ({"mla_qkv_concat": False}, mlp | mtp)):
        training = set(ds.deepseek_target(config, **options).tensors)
        assert {n for n in names if theirs(n) not in training} == lost
    assert theirs("model.layers.61.shared_head.norm.weight") == theirs("model.norm.weight")
    assert theirs("model.layers.61.enorm.weight") == "decoder.enorm.weight"
    assert theirs("model.layers.1.mlp.gate_proj.weight") == "decoder.layers.1.mlp.gating.weight"


# --- every tensor ------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("mla_qkv_concat", [True, False])
def test_every_tensor_is_the_layout_the_network_reads(tmp_path, dtype, mla_qkv_concat):
    src = tiny_deepseek(tmp_path / "ds", dtype=dtype)
    report, ours = converted(src, tmp_path / "ds.ckpt", mla_qkv_concat=mla_qkv_concat)
    wanted = expected(hf_tensors(src), mla_qkv_concat=mla_qkv_concat)
    assert_equal_to(ours, wanted)  # the router's statistics: declared zeros, float32
    assert sorted(m.target for m in report.plan.matches if m.how == "initialised") == sorted(
        f"decoder.layers.{i}.mlp.router.{b}" for i in (1, 2) for b in ("expert_load",
                                                                        "fi_accu"))


@needs_mindformers
def test_the_shared_layouts_equal_mindformers_own_code_for_the_same_classes(tmp_path):
    """FFNGroupedGEMM and MLPInterleaved are the classes Qwen3-MoE uses too, and MindFormers
    has converters for those: ExpertsConvertOp (given the experts stacked, as the Qwen3-MoE
    tests give them) and TrainModelMixin.concat_linear_fc1_interleaved. Both agree with ours
    on DeepSeek's tensors; MLA's linear_qkv has no converter anywhere in MindFormers."""
    import copy

    from mindformers.models.qwen3_moe.utils import Qwen3MoePreTrainedModel
    from mindformers.parallel_core.utils.model_mixin import TrainModelMixin

    src = tiny_deepseek(tmp_path / "ds")
    _, ours = converted(src, tmp_path / "ds.ckpt", mtp=False)
    hf = hf_tensors(src)
    ops = [op for op in Qwen3MoePreTrainedModel.weight_converters
           if type(op).__name__ == "ExpertsConvertOp"]
    assert len(ops) == 2
    for shared in ops:
        op = copy.copy(shared)  # class-level and shared: never changed in place here
        op.num_moe_experts, op.hidden_size, op.moe_ffn_hidden_size = E, H, F
        op.expert_parallel_size = op.optimizer_parallel_size = 1
        for i in (1, 2):
            stacked = [np.concatenate([hf[n.format(i, e)] for e in range(E)])
                       for n in op.hf_names]
            (theirs,) = op._hf_to_mf(stacked)
            assert ours[op.mf_names[0].format(i)].tobytes() == theirs.tobytes()
    for ours_name, pre, rows in (("decoder.layers.0.mlp.linear_fc1.weight", "model.layers.0.mlp.",
                                  96),
                                 ("decoder.layers.2.mlp.shared_experts.linear_fc1.weight",
                                  "model.layers.2.mlp.shared_experts.", F)):
        (theirs,) = TrainModelMixin.concat_linear_fc1_interleaved(
            None, hf[pre + "gate_proj.weight"], hf[pre + "up_proj.weight"], "x.gating.weight",
            rows).values()
        assert ours[ours_name].tobytes() == theirs.tobytes(), ours_name


def _silu(x):
    return x / (1 + np.exp(-x))


def _network(ours, p, x):
    """What MindFormers' code computes from the tensors at ``p`` (numpy, float64): the MLA
    split of linear_qkv, the interleaved MLPs, and every expert as FFNGroupedGEMM reshapes
    weight1/weight2 and Swiglu splits halves."""
    w = {k[len(p):]: v.astype(np.float64) for k, v in ours.items() if k.startswith(p)}
    q_a, kv, k_pe = np.split(x @ w["self_attention.linear_qkv.weight"].T, [24, 40], axis=-1)

    def interleaved(fc1, fc2):
        y = (x @ fc1.T).reshape(*x.shape[:-1], -1, 2)
        return (_silu(y[..., 0]) * y[..., 1]) @ fc2.T

    w1 = w["mlp.experts.weight1"].reshape(-1, H, 2 * F)
    w2 = w["mlp.experts.weight2"].reshape(-1, F, H)
    experts = []
    for e in range(E):
        a, b = np.split(x @ w1[e], 2, axis=-1)
        experts.append((_silu(a) * b) @ w2[e])
    shared = interleaved(w["mlp.shared_experts.linear_fc1.weight"],
                         w["mlp.shared_experts.linear_fc2.weight"])
    return (q_a, kv, k_pe), experts, shared


def _hugging_face(hf, s, x):
    w = {k[len(s):]: v.astype(np.float64) for k, v in hf.items() if k.startswith(s)}
    kv = x @ w["self_attn.kv_a_proj_with_mqa.weight"].T
    attention = (x @ w["self_attn.q_a_proj.weight"].T, kv[..., :16], kv[..., 16:])

    def mlp(pre):
        return (_silu(x @ w[pre + "gate_proj.weight"].T) * (x @ w[pre + "up_proj.weight"].T)
                ) @ w[pre + "down_proj.weight"].T

    return attention, [mlp(f"mlp.experts.{e}.") for e in range(E)], mlp("mlp.shared_experts.")


def _twins(ours, hf):
    """Wrong layouts of layer 1's fused tensors, each a plausible mistake."""
    p, s = "decoder.layers.1.", "model.layers.1."
    x = s + "mlp.experts.{}.{}_proj.weight"
    gate_up = [np.concatenate([hf[x.format(e, "gate")].T, hf[x.format(e, "up")].T], axis=1)
               for e in range(E)]
    q_a, kv_a = hf[s + "self_attn.q_a_proj.weight"], hf[s + "self_attn.kv_a_proj_with_mqa.weight"]
    return {
        "kv before q": {p + "self_attention.linear_qkv.weight": np.concatenate([kv_a, q_a])},
        "k_pe before kv": {p + "self_attention.linear_qkv.weight": np.concatenate(
            [q_a, kv_a[16:], kv_a[:16]])},
        "experts gate/up interleaved": {p + "mlp.experts.weight1": np.concatenate(
            [interleave(hf[x.format(e, "gate")], hf[x.format(e, "up")]).T for e in range(E)])},
        "experts in reverse": {p + "mlp.experts.weight1": np.concatenate(gate_up[::-1])},
        "down reshaped, not transposed": {p + "mlp.experts.weight2": np.concatenate(
            [hf[x.format(e, "down")] for e in range(E)], axis=1).reshape(E * F, H)},
        "shared gate/up as halves": {p + "mlp.shared_experts.linear_fc1.weight": np.concatenate(
            [hf[s + "mlp.shared_experts.gate_proj.weight"],
             hf[s + "mlp.shared_experts.up_proj.weight"]])},
    }


def test_what_the_network_computes_from_the_tensors_is_hugging_faces(tmp_path):
    """Ours give Hugging Face's q_a / compressed kv / k_pe, every expert's output and the
    shared expert's; each wrong twin differs as a tensor and in what it computes."""
    src = tiny_deepseek(tmp_path / "ds")
    _, ours = converted(src, tmp_path / "ds.ckpt", mtp=False)
    hf = hf_tensors(src)
    x = np.random.default_rng(0).standard_normal((5, H))
    right = _hugging_face(hf, "model.layers.1.", x)

    def flat(result):
        (q_a, kv, k_pe), experts, shared = result
        return [q_a, kv, k_pe, *experts, shared]

    for a, b in zip(flat(_network(ours, "decoder.layers.1.", x)), flat(right)):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    for why, change in _twins(ours, hf).items():
        (name, twin), = change.items()
        assert not np.array_equal(twin, ours[name]), why
        got = flat(_network({**ours, **change}, "decoder.layers.1.", x))
        assert any(not np.allclose(a, b) for a, b in zip(got, flat(right))), why


def test_dense_mlp_rows_are_interleaved_not_halves(tmp_path):
    src = tiny_deepseek(tmp_path / "ds")
    _, ours = converted(src, tmp_path / "ds.ckpt", mtp=False)
    hf = hf_tensors(src)
    gate, up = hf["model.layers.0.mlp.gate_proj.weight"], hf["model.layers.0.mlp.up_proj.weight"]
    fc1 = ours["decoder.layers.0.mlp.linear_fc1.weight"]
    assert np.array_equal(fc1, interleave(gate, up))
    assert not np.array_equal(fc1, np.concatenate([gate, up]))


def test_mlp_halves_for_a_network_built_without_interleaving(tmp_path):
    """use_interleaved_weight_layout_mlp=false: the dense, shared-expert and MTP
    linear_fc1 are [gate; up] halves (MLP, SharedExpertMLP); the experts do not change."""
    src = tiny_deepseek(tmp_path / "ds", mtp=1, mtp_weights=True)
    report, ours = converted(src, tmp_path / "ds.ckpt", use_interleaved_weight_layout_mlp=False)
    _, inter = converted(src, tmp_path / "inter.ckpt")
    hf = hf_tensors(src)
    for target, hub in [("decoder.layers.0.mlp.linear_fc1.weight", "model.layers.0.mlp"),
                        ("decoder.layers.2.mlp.shared_experts.linear_fc1.weight",
                         "model.layers.2.mlp.shared_experts"),
                        ("mtp.layers.0.transformer_layer.mlp.shared_experts.linear_fc1.weight",
                         f"model.layers.{L}.mlp.shared_experts")]:
        gate, up = hf[f"{hub}.gate_proj.weight"], hf[f"{hub}.up_proj.weight"]
        assert np.array_equal(ours[target], np.concatenate([gate, up])), target
        assert np.array_equal(inter[target], interleave(gate, up)), target
    assert all(np.array_equal(ours[n], inter[n]) for n in ours if "linear_fc1" not in n)
    assert "use_interleaved_weight_layout_mlp: False" in report.plan.notes[0]


# --- Multi-Token Prediction --------------------------------------------------------------

def test_mtp_asked_for_but_absent_is_refused_naming_it(tmp_path):
    """transformers saves num_nextn_predict_layers 1 and no MTP layer (it drops the Hub's):
    the network MindFormers builds from that config has one, so the conversion is refused,
    naming every MTP tensor, and the note says how to convert without it."""
    src = tiny_deepseek(tmp_path / "ds", mtp=1)
    report = ms_port.convert(src, ms_model=FAMILY, output=tmp_path / "ds.ckpt")
    assert not report.ok
    missing = {m.name for m in report.plan.missing}
    mtp = {n for n in ds.deepseek_target(json.loads((src / "config.json").read_text()))
           .tensors if n.startswith("mtp.")}
    assert missing == mtp - {"mtp.layers.0.transformer_layer.mlp.router.expert_load",
                             "mtp.layers.0.transformer_layer.mlp.router.fi_accu"}
    assert any("--ms-option mtp=false" in n for n in report.plan.notes)
    (line,) = report.plan.problems()  # one line for the absent layer, not one per tensor
    assert line.startswith("the checkpoint holds no Multi-Token Prediction layer "
                           "(model.layers.3)") and "--ms-option mtp=false" in line
    assert not (tmp_path / "ds.ckpt").exists()
    report, ours = converted(src, tmp_path / "ds.ckpt", mtp=False)
    assert not any(n.startswith("mtp.") for n in ours)


@pytest.mark.parametrize("mla_qkv_concat", [True, False])
def test_the_hubs_mtp_layer_converts_and_its_copies_are_checked_then_dropped(tmp_path,
                                                                            mla_qkv_concat):
    src = tiny_deepseek(tmp_path / "ds", mtp=1, mtp_weights=True)
    report, ours = converted(src, tmp_path / "ds.ckpt", mla_qkv_concat=mla_qkv_concat)
    assert_equal_to(ours, expected(hf_tensors(src), mla_qkv_concat=mla_qkv_concat, mtp=True))
    dropped = {d.name: d.reason for d in report.plan.dropped}
    assert set(dropped) == {f"model.layers.{L}.embed_tokens.weight",
                            f"model.layers.{L}.shared_head.head.weight"}
    assert all("the same tensor as" in why for why in dropped.values())


def test_mtp_copies_that_differ_from_the_model_are_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    src = tiny_deepseek(tmp_path / "ds", mtp=1, mtp_weights=True)
    state = load_file(src / "model.safetensors")
    state[f"model.layers.{L}.shared_head.head.weight"] *= 2
    save_file(state, src / "model.safetensors", metadata={"format": "pt"})
    report = ms_port.convert(src, ms_model=FAMILY, output=tmp_path / "ds.ckpt")
    assert not report.ok
    assert [u.name for u in report.plan.unused] == [f"model.layers.{L}.shared_head.head.weight"]
    assert any("holds other values" in n for n in report.plan.notes)


def test_an_mtp_layer_the_target_leaves_out_is_refused_not_dropped(tmp_path):
    src = tiny_deepseek(tmp_path / "ds", mtp=1, mtp_weights=True)
    report = ms_port.convert(src, ms_model=FAMILY, output=tmp_path / "ds.ckpt",
                             ms_options={"mtp": False})
    assert not report.ok
    assert {u.name for u in report.plan.unused} >= {f"model.layers.{L}.eh_proj.weight",
                                                    f"model.layers.{L}.self_attn.o_proj.weight"}


# --- the forward: MindFormers' own network on this CPU, against transformers ------------

#: relative L2 error of the logits: a right layout is below RIGHT, a wrong one above WRONG
RIGHT, WRONG = 1e-5, 1e-2
SEQ = 16
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
        "original_max_position_embeddings": 8, "beta_fast": 32.0, "beta_slow": 1.0,
        "mscale": 0.8, "mscale_all_dim": 0.8}


def _seeded_deepseek(**changes):
    """transformers' DeepseekV3ForCausalLM with weights off its tiny defaults (matrices
    N(0, 1/fan_in), embedding N(0, 1), norms 1 + N(0, 0.3²), the router's correction bias
    N(0, 0.1²)) so that attention and routing are sharp and a wrong layout shows; its
    config.json, and its tensors as the Hub names them (one per expert)."""
    torch.manual_seed(0)
    model = transformers.DeepseekV3ForCausalLM(
        transformers.DeepseekV3Config(**{**DEEPSEEK, **changes})).eval()
    g = np.random.default_rng(0)
    state = {}
    for name, t in model.state_dict().items():
        shape = tuple(t.shape)
        if "norm" in name:
            a = 1 + 0.3 * g.standard_normal(shape)
        elif "e_score_correction_bias" in name:
            a = 0.1 * g.standard_normal(shape)
        elif "embed_tokens" in name:
            a = g.standard_normal(shape)
        else:
            a = g.standard_normal(shape) / np.sqrt(shape[-1])
        state[name] = torch.from_numpy(a.astype(np.float32))
    model.load_state_dict(state)
    hf = {}
    for name, t in model.state_dict().items():  # transformers 5 stacks the experts
        a, stem = t.numpy().copy(), name.rsplit(".", 1)[0]
        if name.endswith("experts.gate_up_proj"):
            for e in range(E):
                hf[f"{stem}.{e}.gate_proj.weight"], hf[f"{stem}.{e}.up_proj.weight"] = (
                    a[e, :F], a[e, F:])
        elif name.endswith("experts.down_proj"):
            for e in range(E):
                hf[f"{stem}.{e}.down_proj.weight"] = a[e]
        else:
            hf[name] = a
    return model, model.config.to_dict(), hf


def _heads_value_first(kv_b):
    """``kv_b_proj`` with each head's value rows before its key rows (8 and 8 here)."""
    per_head = kv_b.reshape(4, 16, -1)
    return np.concatenate([per_head[:, 8:], per_head[:, :8]], axis=1).reshape(kv_b.shape)


def _fused_twins(hf):
    """Wrong layouts of the fused network's tensors, each a plausible mistake."""
    p, s = "decoder.layers.1.", "model.layers.1."
    a = s + "self_attn."
    x = s + "mlp.experts.{}.{}_proj.weight"
    gate_up = [np.concatenate([hf[x.format(e, "gate")].T, hf[x.format(e, "up")].T], axis=1)
               for e in range(E)]
    q_a, kv_a = hf[a + "q_a_proj.weight"], hf[a + "kv_a_proj_with_mqa.weight"]
    return {
        "linear_qkv: kv before q": {
            p + "self_attention.linear_qkv.weight": np.concatenate([kv_a, q_a])},
        "linear_qkv: k_pe before the compressed kv": {
            p + "self_attention.linear_qkv.weight": np.concatenate([q_a, kv_a[16:], kv_a[:16]])},
        "linear_kvb: value rows before key rows": {
            p + "self_attention.linear_kvb.weight": _heads_value_first(hf[a + "kv_b_proj.weight"])},
        "experts in reverse order": {
            p + "mlp.experts.weight1": np.concatenate(gate_up[::-1]),
            p + "mlp.experts.weight2": np.concatenate(
                [hf[x.format(e, "down")].T for e in reversed(range(E))])},
        "experts' gate/up interleaved": {p + "mlp.experts.weight1": np.concatenate(
            [interleave(hf[x.format(e, "gate")], hf[x.format(e, "up")]).T for e in range(E)])},
        "shared experts' gate/up as halves": {
            p + "mlp.shared_experts.linear_fc1.weight": np.concatenate(
                [hf[s + "mlp.shared_experts.gate_proj.weight"],
                 hf[s + "mlp.shared_experts.up_proj.weight"]])},
        "dense linear_fc1 as halves": {"decoder.layers.0.mlp.linear_fc1.weight": np.concatenate(
            [hf["model.layers.0.mlp.gate_proj.weight"], hf["model.layers.0.mlp.up_proj.weight"]])},
        "router's correction bias left at zero": {
            p + "mlp.router.expert_bias": np.zeros(E, np.float32)},
    }


def _separate_twins(hf):
    p, a = "decoder.layers.2.self_attention.", "model.layers.2.self_attn."
    kv_a = hf[a + "kv_a_proj_with_mqa.weight"]
    return {
        "linear_kv_down_proj: k_pe first": {
            p + "linear_kv_down_proj.weight": np.concatenate([kv_a[16:], kv_a[:16]])},
        "linear_kv_up_proj: value rows before key rows": {
            p + "linear_kv_up_proj.weight": _heads_value_first(hf[a + "kv_b_proj.weight"])},
    }


def _forward(changes, options, twins, *, batch=1):
    """Compile MindFormers' network once (in the layout ``options`` give); its logits'
    error against transformers' for the right tensors and for each twin, what was
    loaded, which stand-ins ran, and the logits' spread along the sequence."""
    from ms_port.archs.parallel_core import cpu as pc

    model, config, hf = _seeded_deepseek(**changes)
    ids = np.random.default_rng(2).integers(1, DEEPSEEK["vocab_size"], (batch, SEQ))
    ids[:, 0] = 0  # MindFormers' default pad id: no token is hidden as padding here
    with torch.no_grad():
        wanted = model(torch.from_numpy(ids)).logits.numpy()
    mtp = options.get("mtp", config["num_nextn_predict_layers"] > 0)
    right = expected(hf, mla_qkv_concat=options.get("mla_qkv_concat", True))
    if mtp:  # an MTP layer of its own (transformers has none): loaded, never in the logits
        g = np.random.default_rng(3)
        right.update({t.name: g.standard_normal(t.shape).astype(np.float32)
                      for t in ds.deepseek_target(config, **options).tensors.values()
                      if t.name.startswith("mtp.")})
    errors, reports = {}, {}
    with pc.cpu_standins() as standins:
        net = pc.build_network(config, seq_length=SEQ, options=options)
        for why, change in {"right": {}, **twins(hf)}.items():
            reports[why] = pc.load_arrays(net, {**right, **change})
            got = pc.forward(net, ids)
            errors[why] = float(np.linalg.norm(got - wanted) / np.linalg.norm(wanted))
        used = [s.name for s in standins.used_by(net)]
    return {"errors": errors, "reports": reports, "used": used,
            "spread": float(wanted.std(axis=1).mean() / np.abs(wanted).mean())}


@pytest.fixture(scope="module")
def fused():
    """MindFormers' default layout, with the MTP layer; one sequence."""
    return _forward({"num_nextn_predict_layers": 1}, {}, _fused_twins)


@pytest.fixture(scope="module")
def separate():
    """One tensor per MLA projection, no MTP layer, yarn RoPE with mscale; two sequences."""
    return _forward({"num_nextn_predict_layers": 1, "rope_parameters": YARN},
                    {"mla_qkv_concat": False, "mtp": False}, _separate_twins, batch=2)


def _standins(*, mtp):
    from ms_port.archs.parallel_core import cpu as pc

    # MLA casts q/k/v to the compute dtype itself (no Attention class, no float16 cast);
    # DeepSeek-V3.2's sparse attention's stand-ins run only where it is built
    return [s.name for s in pc.STANDINS
            if s.name != "qkv-float16-cast" and (mtp or s.name != "mtp-not-run")
            and not s.name.startswith("dsa-")]


@needs_mindformers
@pytest.mark.parametrize("case", ["fused", "separate"])
def test_mindformers_network_matches_transformers(request, case):
    run = request.getfixturevalue(case)
    assert all(r.complete for r in run["reports"].values()), run["reports"]
    assert run["errors"]["right"] < RIGHT, run["errors"]
    assert run["used"] == _standins(mtp=case == "fused")
    assert run["spread"] > 0.1  # the logits vary along the sequence: not a constant


FUSED_WRONG = ("linear_qkv: kv before q", "linear_qkv: k_pe before the compressed kv",
               "linear_kvb: value rows before key rows", "experts in reverse order",
               "experts' gate/up interleaved", "shared experts' gate/up as halves",
               "dense linear_fc1 as halves", "router's correction bias left at zero")
SEPARATE_WRONG = ("linear_kv_down_proj: k_pe first",
                  "linear_kv_up_proj: value rows before key rows")


@needs_mindformers
@pytest.mark.parametrize("case, wrong", [*(("fused", w) for w in FUSED_WRONG),
                                         *(("separate", w) for w in SEPARATE_WRONG)])
def test_a_wrong_layout_is_far_off(request, case, wrong):
    run = request.getfixturevalue(case)
    assert set(run["errors"]) == {"right", *(FUSED_WRONG if case == "fused" else SEPARATE_WRONG)}
    assert run["errors"][wrong] > WRONG, run["errors"]


@needs_mindformers
def test_the_network_config_holds_every_key_as_transformers_reads_it():
    """Each config.json key, and each option, lands where MindFormers' network reads it."""
    from mindformers.parallel_core.training_graph.base_models.common.embeddings.\
        yarn_rotary_pos_embedding import _yarn_get_mscale

    from ms_port.archs.parallel_core import cpu as pc

    config = _config({"num_nextn_predict_layers": 1, "routed_scaling_factor": 1.7})
    held = pc.network_config(config, seq_length=SEQ).convert_to_transformer_config()
    assert (held.q_lora_rank, held.kv_lora_rank, held.qk_head_dim, held.qk_pos_emb_head_dim,
            held.v_head_dim) == (24, 16, 8, 4, 8)
    assert (held.num_moe_experts, held.moe_router_topk, held.moe_ffn_hidden_size,
            held.moe_shared_expert_intermediate_size) == (E, 2, F, F)
    assert (held.moe_router_num_groups, held.moe_router_group_topk) == (2, 1)
    assert held.moe_router_topk_scaling_factor == 1.7 and held.norm_topk_prob is True
    assert held.moe_router_score_function == "sigmoid" and held.moe_router_enable_expert_bias
    assert held.moe_layer_freq == [0, 1, 1] and held.mtp_num_layers == 1
    assert held.qk_layernorm and held.mla_qkv_concat and held.position_embedding_type == "rope"
    # MLA scales its softmax by yarn's mscale whatever the embedding: 1 here
    assert _yarn_get_mscale(held.rotary_scaling_factor, held.mscale) == 1.0
    held = pc.network_config({**config, "rope_parameters": YARN}, seq_length=SEQ,
                             options={"mla_qkv_concat": False, "mtp": False,
                                      "seq_length": 99}).convert_to_transformer_config()
    assert (held.position_embedding_type, held.rotary_scaling_factor, held.mscale,
            held.mscale_all_dim, held.max_position_embeddings) == ("yarn", 4.0, 0.8, 0.8, 8)
    assert held.mla_qkv_concat is False and held.mtp_num_layers == 0
    assert held.seq_length == SEQ  # the run's own length; the option's is passed over


@pytest.mark.parametrize("change, message", [
    ({"num_key_value_heads": 2}, "num_key_value_heads 2 where num_attention_heads is 4"),
    ({"topk_method": "greedy"}, "topk_method 'greedy'"),
    ({"scoring_func": "softmax"}, "scoring_func 'softmax'"),
    ({"n_group": 3}, "n_group equal groups"),
    ({"num_experts_per_tok": 4}, "transformers by its best two"),
    ({"num_experts_per_tok": 1, "n_group": 1}, "num_experts_per_tok 1 with norm_topk_prob"),
    ({"rope_parameters": {**YARN, "mscale_all_dim": 1.0}}, "mscale 0.8 and mscale_all_dim 1"),
    ({"rope_parameters": {k: v for k, v in YARN.items() if k != "mscale"}},
     "mscale 1 and mscale_all_dim 0"),
    ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}},
     "plain RoPE or yarn only"),
    ({"attention_bias": True}, "attention_bias is set"),
])
def test_what_the_forward_cannot_compute_exactly_is_refused_in_one_line(change, message):
    from ms_port.archs.parallel_core import cpu as pc

    with pytest.raises(TargetError, match=message):
        pc.network_config(_config(change), seq_length=SEQ)


def test_options_the_network_does_not_take_are_refused():
    from ms_port.archs.parallel_core import cpu as pc

    with pytest.raises(TargetError, match="takes no option 'qkv_concat'; it takes "
                                          "mla_qkv_concat, mtp"):
        pc.network_config(_config({}), seq_length=SEQ, options={"qkv_concat": True})
    with pytest.raises(TargetError, match="option mtp='no': expected bool"):
        pc.network_config(_config({}), seq_length=SEQ, options={"mtp": "no"})


# --- verify ------------------------------------------------------------------------------

def _stand_ins(result):
    return next(n for n in result.notes if "CPU stand-ins" in n)


@needs_mindformers
def test_verify_passes_by_mindformers_own_network(tmp_path):
    """MindFormers' network computes transformers' logits on this CPU (GRAPH mode, the
    stand-ins named in the report); a wrong tensor FAILs, named, and the forward sees it."""
    from click.testing import CliRunner

    from ms_port.cli import main
    from ms_port.testing import with_reversed

    src = tiny_deepseek(tmp_path / "ds", mtp=0)
    out = tmp_path / "ds.ckpt"
    converted(src, out)
    run = CliRunner().invoke(main, ["verify", str(src), str(out), "--ms-model", FAMILY,
                                    "--json"])
    data = json.loads(run.output)
    assert run.exit_code == 0 and data["verdict"] == "PASS", data["reasons"]
    assert data["mode"] == "whole" and "GRAPH mode" in data["mode_reason"]
    ran = next(n for n in data["notes"] if "CPU stand-ins" in n)
    assert "attention" in ran and "experts-grouped-matmul" in ran and "mtp-not-run" not in ran
    name = "decoder.layers.2.self_attention.linear_qkv.weight"
    wrong = with_reversed(out, tmp_path / "w.ckpt", name)
    failed = ms_port.verify(src, wrong, ms_model=FAMILY)
    assert failed.verdict == "FAIL" and name in " ".join(failed.reasons)
    assert not failed.outputs[0].ok  # the forward sees it too


@needs_mindformers
@pytest.mark.parametrize("options, hubs_mtp", [
    ({"mtp": False}, False), ({"mla_qkv_concat": False, "mtp": False}, False),
    ({"mla_qkv_concat": False}, True), ({"use_interleaved_weight_layout_mlp": False}, True)])
def test_verify_honours_the_options_the_checkpoint_was_converted_with(tmp_path, monkeypatch,
                                                                      options, hubs_mtp):
    """The network is built in the checkpoint's layout. With the Hub's MTP layer it is
    loaded (every tensor compared through the plan) and not run: transformers leaves it
    out too (DeepSeek-V3's model.layers.61, by _keys_to_ignore_on_load_unexpected; the
    tiny model's is layer 3)."""
    monkeypatch.setattr(transformers.DeepseekV3ForCausalLM,
                        "_keys_to_ignore_on_load_unexpected", [rf"model\.layers\.{L}\."])
    src = tiny_deepseek(tmp_path / "ds", mtp=1, mtp_weights=hubs_mtp)
    out = tmp_path / "ds.ckpt"
    _, ours = converted(src, out, **options)
    result = ms_port.verify(src, out, ms_model=FAMILY, ms_options=options)
    assert result.verdict == "PASS", result.reasons[0]
    assert result.tensors.counts["identical"] == len(ours)
    assert ("mtp-not-run" in _stand_ins(result)) == hubs_mtp
    if "use_interleaved_weight_layout_mlp" in options:  # the network built so reads it
        wrong = ms_port.verify(src, out, ms_model=FAMILY)  # built interleaved
        assert wrong.verdict == "FAIL" and "linear_fc1" in " ".join(wrong.reasons)
        assert not wrong.outputs[0].ok


@needs_mindformers
def test_verify_without_a_forward_is_inconclusive_never_pass(tmp_path, monkeypatch):
    """Where MindFormers' network cannot run here, the verdict is the tensors' proof and
    INCONCLUSIVE for the forward, with the reason; a wrong tensor still FAILs, named."""
    from click.testing import CliRunner

    from ms_port.archs.parallel_core import cpu as parallel_core_cpu
    from ms_port.cli import main
    from ms_port.testing import with_reversed

    def no_kernel(*_a, **_k):
        raise RuntimeError("Unsupported op [SomeKernel] on CPU")

    monkeypatch.setattr(parallel_core_cpu, "build_network", no_kernel)
    src = tiny_deepseek(tmp_path / "ds", mtp=0)
    out = tmp_path / "ds.ckpt"
    converted(src, out)
    run = CliRunner().invoke(main, ["verify", str(src), str(out), "--ms-model", FAMILY,
                                    "--json"])
    data = json.loads(run.output)
    assert run.exit_code == 3 and data["verdict"] == "INCONCLUSIVE"
    assert "no forward ran" in data["reasons"][0] and "SomeKernel" in data["reasons"][0]
    assert data["mode"] == "tensors"
    for name in ("decoder.layers.2.self_attention.linear_qkv.weight",
                 "decoder.layers.1.mlp.experts.weight1"):
        wrong = with_reversed(out, tmp_path / "w.ckpt", name)
        failed = ms_port.verify(src, wrong, ms_model=FAMILY)
        assert failed.verdict == "FAIL" and name in failed.reasons[0]


# --- export ----------------------------------------------------------------------------

def test_export_round_trip_is_bit_identical(tmp_path):
    """Back to the Hub's layout: per-expert keys (transformers 5 holds them stacked in
    memory, saves them one by one), the stacked experts' transforms undone."""
    src = tiny_deepseek(tmp_path / "ds", mtp=0)
    out = tmp_path / "ds.ckpt"
    converted(src, out)
    back = ms_port.export(out, ms_model=FAMILY, config=src / "config.json",
                          output=tmp_path / "back")
    assert back.ok
    assert_equal_to(hf_tensors(tmp_path / "back"), hf_tensors(src))


def test_a_saved_plan_loads_back(tmp_path):
    """A transform argument shared by many entries is written as a copy each time, never as
    a YAML alias (which the loader refuses): the saved plan loads and reproduces the plan."""
    from ms_port.match.mapping import load_mapping

    src = tiny_deepseek(tmp_path / "ds", mtp=0)
    report = ms_port.convert(src, ms_model=FAMILY, output=tmp_path / "ds.ckpt",
                             save_map=tmp_path / "plan.yaml")
    assert report.ok
    assert "&id" not in (tmp_path / "plan.yaml").read_text()
    again = ms_port.plan(src, ms_model=FAMILY, mapping=[load_mapping(tmp_path / "plan.yaml")])
    assert again.ok


# --- what the target refuses, and what it computes for the real DeepSeek-V3 --------------

@pytest.mark.parametrize("change,match", [
    ({"attention_bias": True}, "attention_bias is set"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ({"rope_interleave": False}, "rope_interleave is false"),
    ({"q_lora_rank": None}, "q_lora_rank is null"),
    ({"moe_layer_freq": 2}, "moe_layer_freq 2"),
    ({"num_nextn_predict_layers": 2}, "one Multi-Token Prediction layer at most"),
    ({"first_k_dense_replace": 3, "num_nextn_predict_layers": 1}, "every decoder layer dense"),
    ({"v_head_dim": 16}, "v_head_dim 16"),
    ({"model_type": "qwen3"}, "model_type 'qwen3' is not one mindformers:deepseek3"),
])
def test_what_mindformers_deepseek3_cannot_hold_is_one_line(change, match):
    with pytest.raises(TargetError, match=match):
        ds.deepseek_target({**_config({}), **change})


def test_the_hubs_deepseek_v3_config(tmp_path):
    """DeepSeek-V3's own config.json (671B in the main model, as DeepSeek states; the MTP
    layer adds its 11.6B unique parameters, the embedding and head being shared)."""
    import math

    config = {**_config({}), "vocab_size": 129280, "hidden_size": 7168,
              "intermediate_size": 18432, "moe_intermediate_size": 2048,
              "num_hidden_layers": 61, "num_nextn_predict_layers": 1,
              "num_attention_heads": 128, "num_key_value_heads": 128, "n_routed_experts": 256,
              "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
              "v_head_dim": 128, "qk_nope_head_dim": 128, "n_group": 8, "topk_group": 4,
              "num_experts_per_tok": 8, "moe_layer_freq": 1, "first_k_dense_replace": 3,
              "rope_theta": 10000, "rope_scaling": {
                  "beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                  "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                  "type": "yarn"}}
    target = ds.deepseek_target(config)
    size = {k: math.prod(t.shape) for k, t in target.tensors.items()}
    main = sum(v for k, v in size.items() if not k.startswith("mtp."))
    assert round(main / 1e9, 1) == 671.0
    assert round((sum(size.values()) - main) / 1e9, 1) == 11.6
    assert target["decoder.layers.3.self_attention.linear_qkv.weight"].shape == (2112, 7168)
    assert target["mtp.layers.0.transformer_layer.mlp.experts.weight1"].shape == (
        256 * 7168, 4096)
    assert any("model.layers.61" in n for n in target.notes)
    assert any("yarn" in n and "do not depend" in n for n in target.notes)
    # where config.json is silent, both frameworks' DeepseekV3Config assume DeepSeek-V3
    given = {k: config[k] for k in ("model_type", "vocab_size", "hidden_size",
                                    "intermediate_size", "num_hidden_layers",
                                    "num_attention_heads")}
    assert [(t.name, t.shape) for t in ds.deepseek_target(given).tensors.values()] == [
        (t.name, t.shape) for t in target.tensors.values()]


def test_a_checkpoint_converted_without_ms_model_is_recognised():
    """Each variant's names are recognised as the family, in that variant's layout."""
    from ms_port.read.targets import Target, mark_family

    config = _config({"num_nextn_predict_layers": 1})
    for options in ds.VARIANTS:
        made = ds.deepseek_target(config, **options)
        ckpt = Target("template", "x.ckpt", dict(made.tensors))
        computed = mark_family(ckpt, config, None)
        assert ckpt.family == FAMILY
        assert set(computed.tensors) == set(made.tensors), options  # in that layout


# --- the table's new entries: at:, one-source fuse:, numbered tied: ----------------------

def test_at_numbers_a_source_from_the_config_and_the_targets_placeholders():
    from ms_port.match.mapping import parse_mapping

    text = """
fuse:
  - {target: 'mtp.{k}.w', sources: ['layers.{n}.w'], at: {n: layers + k}}
tied:
  - {source: 'layers.{n}.emb', same_as: emb, at: {n: layers}}
"""
    table = parse_mapping(text, origin="t.yaml")
    assert table.fuse[0].at == (("n", "layers + k"),) and table.fuse[0].layout.kind == "concat"
    assert table.tied[0].at == (("n", "layers"),)
    for bad, why in [
        ("fuse: [{target: 'm.{k}.w', sources: ['l.{n}.w']}]", "expected the placeholders k "),
        ("fuse: [{target: 'm.{k}.w', sources: ['l.{n}.w'], at: {n: 3}}]", "the placeholders"),
        ("fuse: [{target: 'm.{k}.w', sources: ['l.{k}.w'], at: {k: 3}}]",
         "placeholders the target does not have"),
        ("fuse: [{target: 'm.w', sources: ['a.w', 'b.w']}]", "a layout: for several sources"),
        ("fuse: [{target: 'm.w', sources: ['a.w'], layout: concat}]", "two or more source names"),
        ("fuse: [{target: 'm.w', sources: ['a.{e}.w'], over: {e: x}, at: {e: 1}}]",
         "placeholders over: does not count"),
        ("tied: [{source: 'l.{n}.e', same_as: e}]", "placeholders that at: gives a number"),
    ]:
        with pytest.raises(MappingError, match=why):
            parse_mapping(bad, origin="t.yaml")


def test_at_entries_plan_and_save_back(tmp_path):
    """A one-source entry renames only where the target has the tensor; a negative number
    is refused; --save-map writes the numbered tied entry back, and it plans the same."""
    from ms_port.match.mapping import mapping_from_data, parse_mapping
    from ms_port.match.plan import make_plan
    from ms_port.read.sources import Source
    from ms_port.read.targets import Target, TargetTensor
    from ms_port.read.tensors import TensorInfo

    def info(name, value):
        return TensorInfo(name, (2,), "float32", lambda v=value: np.full(2, v, np.float32))

    source = Source("s", "test", {i.name: i for i in (
        info("layers.0.w", 0), info("layers.2.w", 2), info("layers.2.emb", 5),
        info("emb", 5))}, config={"layers": 2})
    target = Target("t", "t", {n: TargetTensor(n, (2,), "float32") for n in (
        "layers.0.w", "mtp.0.w", "emb")})
    data = {"fuse": [{"target": "mtp.{k}.w", "sources": ["layers.{n}.w"],
                      "at": {"n": "layers + k"}},
                     {"target": "absent.{k}.w", "sources": ["layers.{k}.w"]}],
            "tied": [{"source": "layers.{n}.emb", "same_as": "emb", "at": {"n": "layers"}}]}
    plan = make_plan(source, target, mapping_from_data(data))
    assert plan.ok, plan.problems()
    assert {m.target: m.source for m in plan.matches} == {
        "layers.0.w": "layers.0.w", "mtp.0.w": "layers.2.w", "emb": "emb"}
    assert [d.name for d in plan.dropped] == ["layers.2.emb"]
    again = make_plan(source, target, parse_mapping(plan.to_yaml()))
    assert {m.target: m.source for m in again.matches} == {
        m.target: m.source for m in plan.matches} and again.ok
    data["fuse"][0]["at"] = {"n": "k - layers"}
    with pytest.raises(MappingError, match=r"at\.n is -2"):
        make_plan(source, target, mapping_from_data(data))
