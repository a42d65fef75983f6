"""MindFormers' own parallel_core networks (Qwen3, Qwen3-MoE) computing on a CPU with
ms-port's kernel stand-ins (ms_port/archs/parallel_core/cpu.py), against transformers.

Tiny seeded models (GQA with head_dim != hidden/heads, q/k and layer norms off 1, weights
scaled so attention and routing are sharp; Qwen3 untied on one sequence, Qwen3-MoE tied on
two; token id 0 in each). Their weights are laid into MindFormers'
layout by this file's own helpers, which follow MindFormers' converter
(``mindformers/checkpoint/converter/convert_op.py``: ``QKVConvertOp``,
``ConcatConvertOp``, ``ExpertsConvertOp``; ``mindformers/models/qwen3*/utils.py``) and are
held to it. The right layout must match transformers' logits; each classic wrong layout
must be far off; so must the network without the float16 stand-in. One network is
compiled per case and reloaded for each layout. Skipped where transformers / mindformers
are absent.
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("mindspore")
if importlib.util.find_spec("mindformers") is None:
    pytest.skip("mindformers not installed (test extra)", allow_module_level=True)

from ms_port.archs.parallel_core import cpu as pc  # noqa: E402
from ms_port.errors import TargetError  # noqa: E402

#: relative L2 error of the logits: a right layout is below RIGHT, a wrong one above WRONG
RIGHT, WRONG = 1e-5, 1e-2
SEQ = 16
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, LAYERS, VOCAB = 64, 8, 2, 16, 2, 128
INTERMEDIATE, EXPERTS, TOP_K, MOE_INTERMEDIATE = 96, 4, 2, 32

COMMON = dict(hidden_size=HIDDEN, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
              head_dim=HEAD_DIM, num_hidden_layers=LAYERS, vocab_size=VOCAB,
              intermediate_size=INTERMEDIATE, max_position_embeddings=64,
              tie_word_embeddings=False, rms_norm_eps=1e-6)


# ---- the layout, following MindFormers' converter --------------------------------------

def qkv_grouped(q, k, v, *, groups=KV_HEADS, head_dim=HEAD_DIM):
    """``linear_qkv``: per KV head g, its query heads, then k_g, then v_g
    (``QKVConvertOp._hf_to_mf``)."""
    return np.concatenate([q.reshape(groups, -1, q.shape[1]),
                           k.reshape(groups, head_dim, -1),
                           v.reshape(groups, head_dim, -1)], axis=1).reshape(-1, q.shape[1])


def rows_interleaved(gate, up):
    """``linear_fc1`` with ``use_interleaved_weight_layout_mlp`` (the default): gate row 0,
    up row 0, gate row 1, … (``ConcatConvertOp._hf_to_mf``, interleaved)."""
    return np.stack([gate, up], axis=1).reshape(-1, gate.shape[1])


def experts_weight1(gate_up):
    """``mlp.experts.weight1 [E*H, 2F]`` from transformers 5's fused ``gate_up_proj
    [E, 2F, H]`` (gate rows first): per expert concat([gate_e.T, up_e.T], -1), experts
    stacked (``ExpertsConvertOp._hf_to_mf``)."""
    e, two_f, h = gate_up.shape
    gate, up = gate_up[:, :two_f // 2], gate_up[:, two_f // 2:]
    return np.concatenate([gate.transpose(0, 2, 1), up.transpose(0, 2, 1)],
                          axis=2).reshape(e * h, two_f)


def experts_weight2(down):
    """``mlp.experts.weight2 [E*F, H]`` from ``down_proj [E, H, F]``: down_e.T stacked."""
    e, h, f = down.shape
    return down.transpose(0, 2, 1).reshape(e * f, h)


def to_mindformers(sd, *, tied=False, qkv=qkv_grouped, fc1=rows_interleaved,
                   w1=experts_weight1, w2=experts_weight2):
    """A transformers state dict in MindFormers' names (``Parameter.name``) and layout
    (tied: no ``output_layer``, the network reads the embedding)."""
    out = {"embedding.word_embeddings.weight": sd["model.embed_tokens.weight"],
           "decoder.final_layernorm.weight": sd["model.norm.weight"]}
    if not tied:
        out["output_layer.weight"] = sd["lm_head.weight"]
    for i in range(LAYERS):
        hf, mf = f"model.layers.{i}.", f"decoder.layers.{i}."
        att = hf + "self_attn."
        out[mf + "self_attention.linear_qkv.weight"] = qkv(
            sd[att + "q_proj.weight"], sd[att + "k_proj.weight"], sd[att + "v_proj.weight"])
        out[mf + "self_attention.linear_proj.weight"] = sd[att + "o_proj.weight"]
        out[mf + "self_attention.q_layernorm.weight"] = sd[att + "q_norm.weight"]
        out[mf + "self_attention.k_layernorm.weight"] = sd[att + "k_norm.weight"]
        out[mf + "input_layernorm.weight"] = sd[hf + "input_layernorm.weight"]
        out[mf + "pre_mlp_layernorm.weight"] = sd[hf + "post_attention_layernorm.weight"]
        if hf + "mlp.gate_proj.weight" in sd:
            out[mf + "mlp.linear_fc1.weight"] = fc1(sd[hf + "mlp.gate_proj.weight"],
                                                    sd[hf + "mlp.up_proj.weight"])
            out[mf + "mlp.linear_fc2.weight"] = sd[hf + "mlp.down_proj.weight"]
        else:
            out[mf + "mlp.experts.weight1"] = w1(sd[hf + "mlp.experts.gate_up_proj"])
            out[mf + "mlp.experts.weight2"] = w2(sd[hf + "mlp.experts.down_proj"])
            out[mf + "mlp.router.weight"] = sd[hf + "mlp.gate.weight"]
            out[mf + "mlp.router.fi_accu"] = np.zeros(EXPERTS, np.float32)
    return out


def test_layout_helpers_follow_mindformers_converter():
    """The helpers give what MindFormers' own convert ops give."""
    from mindformers.checkpoint.converter.convert_op import (
        ConcatConvertOp,
        ExpertsConvertOp,
        QKVConvertOp,
    )

    g = np.random.default_rng(1)
    q, k, v = (g.standard_normal((n, HIDDEN)).astype(np.float32)
               for n in (HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM))
    op = QKVConvertOp(hf_names=["q", "k", "v"], mf_names=["qkv"], num_attention_heads=HEADS,
                      num_query_groups=KV_HEADS, kv_channels=HEAD_DIM, hidden_size=HIDDEN,
                      tensor_model_parallel_size=1, optimizer_parallel_size=1)
    np.testing.assert_array_equal(op._hf_to_mf([q, k, v])[0], qkv_grouped(q, k, v))

    gate, up = (g.standard_normal((INTERMEDIATE, HIDDEN)) for _ in range(2))
    op = ConcatConvertOp(hf_names=["gate", "up"], mf_names=["x.linear_fc1.weight"], dim=0)
    np.testing.assert_array_equal(op._hf_to_mf([gate, up])[0], rows_interleaved(gate, up))

    gate_up = g.standard_normal((EXPERTS, 2 * MOE_INTERMEDIATE, HIDDEN))
    down = g.standard_normal((EXPERTS, HIDDEN, MOE_INTERMEDIATE))
    sizes = dict(num_moe_experts=EXPERTS, hidden_size=HIDDEN,
                 moe_ffn_hidden_size=MOE_INTERMEDIATE, expert_parallel_size=1,
                 optimizer_parallel_size=1)
    op = ExpertsConvertOp(hf_names=["gate", "up"], mf_names=["w1"], **sizes)
    per_expert = [gate_up[:, :MOE_INTERMEDIATE].reshape(-1, HIDDEN),
                  gate_up[:, MOE_INTERMEDIATE:].reshape(-1, HIDDEN)]  # Hub files' keys
    np.testing.assert_array_equal(op._hf_to_mf(per_expert)[0], experts_weight1(gate_up))
    op = ExpertsConvertOp(hf_names=["down"], mf_names=["w2"], **sizes)
    np.testing.assert_array_equal(op._hf_to_mf([down.reshape(-1, MOE_INTERMEDIATE)])[0],
                                  experts_weight2(down))


# ---- wrong layouts: each must be far off ----------------------------------------------

def qkv_plain(q, k, v):
    return np.concatenate([q, k, v])


def gate_up_plain(gate, up):
    return np.concatenate([gate, up])


def gate_up_swapped(gate, up):
    return rows_interleaved(up, gate)


def w1_untransposed(gate_up):
    return gate_up.reshape(-1, gate_up.shape[1])  # [E*2F, H]: fits only as 2F == H here


def w1_experts_reversed(gate_up):
    return experts_weight1(gate_up[::-1])


def w2_experts_reversed(down):
    return experts_weight2(down[::-1])


def w1_up_first(gate_up):
    half = gate_up.shape[1] // 2
    return experts_weight1(np.concatenate([gate_up[:, half:], gate_up[:, :half]], axis=1))


def w2_untransposed(down):
    return down.reshape(-1, down.shape[1])  # [E*H, F] read as [E*F, H]: wrong, same size


DENSE_WRONG = {"plain [q;k;v] concat": dict(qkv=qkv_plain),
               "plain [gate;up] where interleaved": dict(fc1=gate_up_plain),
               "interleaved [up;gate]": dict(fc1=gate_up_swapped)}
MOE_WRONG = {"weight1 not transposed": dict(w1=w1_untransposed),
             "experts in reverse order": dict(w1=w1_experts_reversed, w2=w2_experts_reversed),
             "up before gate in weight1": dict(w1=w1_up_first),
             "weight2 not transposed": dict(w2=w2_untransposed)}


# ---- the models -----------------------------------------------------------------------

def _seeded(model):
    """Weights off transformers' tiny defaults: matrices ~ N(0, 1/fan_in), embeddings
    N(0, 1), norms 1 + N(0, 0.3²) (q/k norms included), so a wrong layout shows."""
    g = np.random.default_rng(0)
    sd = {}
    for name, t in model.state_dict().items():
        shape = tuple(t.shape)
        if "norm" in name:
            a = 1 + 0.3 * g.standard_normal(shape)
        elif "embed_tokens" in name:
            a = g.standard_normal(shape)
        else:
            a = g.standard_normal(shape) / np.sqrt(shape[-1])
        sd[name] = a.astype(np.float32)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in sd.items()})
    return {k: v.numpy().copy() for k, v in model.state_dict().items()}  # tied: one of two


def _ids(batch=1):
    """``[batch, SEQ]`` seeded ids, id 0 (MindFormers' default pad id) in each row."""
    ids = np.random.default_rng(2).integers(1, VOCAB, (batch, SEQ))
    ids[:, 0] = 0
    return ids


def _relative(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _run(config_class, model_class, wrong, *, omit=(), batch=1, **extra):
    """Compile MindFormers' network once; its logits error for the right layout and each
    wrong one, what was loaded, which stand-ins ran, and the logits' spread."""
    torch.manual_seed(0)
    config = config_class(**{**COMMON, **extra})
    model = model_class(config).eval()
    sd = _seeded(model)
    ids = _ids(batch)
    with torch.no_grad():
        expected = model(torch.from_numpy(ids)).logits.numpy()
    errors, reports = {}, {}
    with pc.cpu_standins(omit=omit) as standins:
        net = pc.build_network(config.to_dict(), seq_length=SEQ)
        for name, layout in {"right": {}, **wrong}.items():
            reports[name] = pc.load_arrays(
                net, to_mindformers(sd, tied=config.tie_word_embeddings, **layout))
            errors[name] = _relative(pc.forward(net, ids), expected)
        used = [s.name for s in standins.used_by(net)]
    return {"errors": errors, "reports": reports, "used": used,
            "spread": float(expected.std(axis=1).mean() / np.abs(expected).mean())}


@pytest.fixture(scope="module")
def dense():
    return _run(transformers.Qwen3Config, transformers.Qwen3ForCausalLM, DENSE_WRONG)


@pytest.fixture(scope="module")
def dense_float16():
    """The same network with q/k/v cast to float16 before attention, as MindFormers has it."""
    return _run(transformers.Qwen3Config, transformers.Qwen3ForCausalLM, {},
                omit=("qkv-float16-cast",))


@pytest.fixture(scope="module")
def moe():
    """Tied embeddings and two sequences here (the dense case: untied, one)."""
    return _run(transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM, MOE_WRONG,
                num_experts=EXPERTS, num_experts_per_tok=TOP_K,
                moe_intermediate_size=MOE_INTERMEDIATE, norm_topk_prob=True,
                tie_word_embeddings=True, batch=2)


DENSE_STANDINS = ["rms-norm", "rope-outer", "attention", "qkv-float16-cast"]


def test_qwen3_matches_transformers(dense):
    assert all(r.complete for r in dense["reports"].values()), dense["reports"]
    assert dense["errors"]["right"] < RIGHT, dense["errors"]
    assert dense["used"] == DENSE_STANDINS
    assert dense["spread"] > 0.1  # the logits vary along the sequence: not a constant


@pytest.mark.parametrize("wrong", list(DENSE_WRONG))
def test_qwen3_wrong_layout_is_far_off(dense, wrong):
    assert dense["errors"][wrong] > WRONG, dense["errors"]


def test_qwen3_float16_cast_matters(dense, dense_float16):
    """MindFormers' own float16 cast of q/k/v, kept, costs far more than float32 rounding."""
    assert dense_float16["used"] == ["rms-norm", "rope-outer", "attention"]
    rounded = dense_float16["errors"]["right"]
    assert rounded > RIGHT and rounded > 30 * dense["errors"]["right"], (
        rounded, dense["errors"]["right"])


def test_qwen3_moe_matches_transformers(moe):
    assert all(r.complete for r in moe["reports"].values()), moe["reports"]
    assert moe["errors"]["right"] < RIGHT, moe["errors"]
    # DeepSeek-V3.2's sparse attention's stand-ins run only where it is built
    assert moe["used"] == [s.name for s in pc.STANDINS
                           if s.name != "mtp-not-run" and not s.name.startswith("dsa-")]
    assert moe["spread"] > 0.1


def test_grouped_matmul_stand_in_multiplies_each_experts_own_rows():
    """The grouped-matmul stand-in, run as a graph op: each expert's rows times its own
    weight, empty groups skipped, rows past the last group zero; equal to the product
    row by row in float64 to float32 rounding."""
    import mindspore as ms
    from mindspore import Tensor

    from ms_port.archs.parallel_core import _kernels as kernels

    rng = np.random.default_rng(7)
    x = rng.standard_normal((11, 6)).astype(np.float32)
    weight = rng.standard_normal((4, 6, 5)).astype(np.float32)
    ends = np.array([3, 3, 7, 9], np.int64)  # expert 1 empty; rows 9, 10 in no group
    owner = [0, 0, 0, 2, 2, 2, 2, 3, 3]
    expected = np.zeros((11, 5))
    for row, expert in enumerate(owner):
        expected[row] = x[row].astype(np.float64) @ weight[expert].astype(np.float64)

    ms.set_context(mode=ms.GRAPH_MODE)
    call = kernels.GroupedMatmul(split_item=3, group_type=0)

    def grouped(a, b, c):
        return call([a], [b], None, None, None, None, None, c)[0]

    got = ms.jit(grouped)(Tensor(x), Tensor(weight), Tensor(ends)).asnumpy()
    assert got.shape == (11, 5) and got.dtype == np.float32
    assert np.abs(got - expected).max() < 1e-5
    assert not got[9:].any()


@pytest.mark.parametrize("wrong", list(MOE_WRONG))
def test_qwen3_moe_wrong_layout_is_far_off(moe, wrong):
    assert moe["errors"][wrong] > WRONG, moe["errors"]


# ---- the pieces around the forward -----------------------------------------------------

def _moe_json(**changes):
    config = transformers.Qwen3MoeConfig(
        **COMMON, num_experts=EXPERTS, num_experts_per_tok=TOP_K,
        moe_intermediate_size=MOE_INTERMEDIATE, rope_parameters={
            "rope_type": "default", "rope_theta": 5e5}).to_dict()
    config.update(changes)
    return config


def test_moe_config_maps_transformers_5_keys():
    """transformers 5 writes num_local_experts and rope_parameters; MindFormers' own
    Qwen3MoeConfig(**config) takes neither (its defaults: 128 experts, theta 1e4)."""
    config = _moe_json()
    assert "num_local_experts" in config and "rope_theta" not in config
    from mindformers.models.qwen3_moe.configuration_qwen3_moe import Qwen3MoeConfig

    naive = Qwen3MoeConfig(**config)
    assert (naive.num_experts, naive.rope_theta) == (128, 10000.0)  # what we avoid

    held = pc.network_config(config, seq_length=SEQ).convert_to_transformer_config()
    assert (held.num_moe_experts, held.moe_router_topk, held.moe_ffn_hidden_size) == (
        EXPERTS, TOP_K, MOE_INTERMEDIATE)
    assert held.rotary_base == 5e5 and held.kv_channels == HEAD_DIM
    assert held.norm_topk_prob is False  # transformers' default; MindFormers' is True
    assert held.pad_token_id == -1  # no token hidden from attention as padding
    hub = dict(config, num_experts=config.pop("num_local_experts"))  # the Hub's spelling
    assert pc.network_config(hub, seq_length=SEQ).convert_to_transformer_config(
    ).num_moe_experts == EXPERTS


@pytest.mark.parametrize("change, message", [
    ({"model_type": "llama"}, r"model_type 'llama'.*qwen3, qwen3_moe"),
    ({"attention_bias": True}, "attention_bias is true"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4,
                          "original_max_position_embeddings": 32}}, "plain RoPE only"),
    ({"num_local_experts": 0}, "num_local_experts is 0"),
    ({"num_experts_per_tok": 9}, "more than the 4 experts"),
    ({"mlp_only_layers": [1]}, "mlp_only_layers"),
])
def test_config_refusals(change, message):
    with pytest.raises(TargetError, match=message):
        pc.network_config(_moe_json(**change), seq_length=SEQ)


def test_standins_are_restored_and_guarded():
    import mindspore as ms
    from mindformers.core.context.build_context import is_legacy_model
    from mindformers.parallel_core.training_graph.transformer import (
        attention,
        flash_attention,
        norm,
    )
    from mindformers.parallel_core.training_graph.transformer.moe import token_dispatcher

    before = (norm.FusedRMSNorm.construct, attention.mstype, token_dispatcher.SortExt,
              token_dispatcher.MoETokenDispatcher.__init__,
              flash_attention.FlashAttention.__init__)
    mode, environ = ms.get_context("mode"), dict(os.environ)
    with pytest.raises(RuntimeError, match="inside `with cpu_standins"):
        pc.build_network(_moe_json(), seq_length=SEQ)
    with pytest.raises(ValueError, match="unknown stand-in 'rmsnorm'; known: rms-norm"), \
            pc.cpu_standins(omit=["rmsnorm"]):
        pass
    with pc.cpu_standins() as standins:
        assert norm.FusedRMSNorm.construct is not before[0]
        assert token_dispatcher.MoETokenDispatcher.__init__.__wrapped__ is before[3]
        assert flash_attention.FlashAttention.__init__.__wrapped__ is before[4]
        assert ms.get_context("mode") == ms.GRAPH_MODE and not is_legacy_model()
        with pytest.raises(RuntimeError, match="already active"), pc.cpu_standins():
            pass
        net = pc.build_network(_moe_json(), seq_length=SEQ)
        report = pc.load_arrays(net, {"decoder.final_layernorm.weight": np.ones(3),
                                      "output_layer.weight": np.zeros((VOCAB, HIDDEN)),
                                      "model.decoder.final_layernorm.weight": np.ones(HIDDEN)})
    assert report.loaded == ("output_layer.weight",) and not report.complete
    assert report.mismatched == (("decoder.final_layernorm.weight", (HIDDEN,), (3,)),)
    assert report.unexpected == ("model.decoder.final_layernorm.weight",)  # no model. prefix
    assert "decoder.layers.0.mlp.router.fi_accu" in report.missing
    assert len(report.missing) == len(list(net.get_parameters())) - 2
    assert [s.name for s in standins.applied] == [s.name for s in pc.STANDINS]
    assert (norm.FusedRMSNorm.construct, attention.mstype, token_dispatcher.SortExt,
            token_dispatcher.MoETokenDispatcher.__init__,
            flash_attention.FlashAttention.__init__) == before
    assert ms.get_context("mode") == mode and is_legacy_model()
    assert dict(os.environ) == environ
