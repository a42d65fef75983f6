"""One config reader for every family: the rotary settings (``rope_theta``,
``partial_rotary_factor``, the scaling) read the same from both layouts people's files hold.

A config saved by transformers 5 keeps them inside ``rope_parameters``; the Hub's files
(saved before) have ``rope_theta`` and ``partial_rotary_factor`` at the top and the scaling
as ``rope_scaling``. Each family's target, the settings its network is built with and its
``--model-config`` YAML must be the same from either, and equal to what transformers reads.
GLM-4's family read the top level only: a GLM-4 saved by transformers 5 got ``rope_ratio:
1.0`` where the model needs 500.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest

from ms_port.archs.config_values import read_rope
from ms_port.errors import MsPortError
from ms_port.read.targets import from_family

transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}

#: family -> (transformers config class, its sizes, rope_theta, scaling or None, the
#: partial_rotary_factor the network rotates with)
FAMILIES: dict[str, tuple[str, dict[str, Any], float, dict | None, float]] = {
    "mindformers:llama": ("LlamaConfig", {**SMALL, "head_dim": 16}, 5e5, LLAMA3, 1.0),
    "mindformers:qwen3": ("Qwen3Config", {**SMALL, "head_dim": 16}, 1e6, None, 1.0),
    "mindformers:qwen3_moe": ("Qwen3MoeConfig", {**SMALL, "head_dim": 16, "num_experts": 4,
                                                 "num_experts_per_tok": 2,
                                                 "moe_intermediate_size": 32}, 1e6, None, 1.0),
    "mindformers:deepseek3": ("DeepseekV3Config", {
        **SMALL, "num_key_value_heads": 4, "moe_intermediate_size": 32, "q_lora_rank": 24,
        "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8,
        "first_k_dense_replace": 1, "n_routed_experts": 4, "num_experts_per_tok": 2,
        "n_shared_experts": 1, "n_group": 2, "topk_group": 1}, 1e4, YARN, 1.0),
    # DeepSeek-V3.2: MindFormers' DSA takes kv_lora_rank 512 and a rotary head of 64 only
    "mindformers:deepseek32": ("DeepseekV32Config", {
        **SMALL, "num_key_value_heads": 4, "moe_intermediate_size": 32, "q_lora_rank": 24,
        "kv_lora_rank": 512, "qk_nope_head_dim": 8, "qk_rope_head_dim": 64, "v_head_dim": 8,
        "first_k_dense_replace": 1, "n_routed_experts": 4, "num_experts_per_tok": 2,
        "n_shared_experts": 1, "n_group": 2, "topk_group": 1}, 1e4, YARN, 1.0),
    # GLM-4-9B: 10000 x rope_ratio 500, half of each head rotated
    "mindformers:glm4": ("GlmConfig", {**SMALL, "head_dim": 16}, 5e6, None, 0.5),
}


def _layouts(family: str, tmp_path: Path) -> tuple[dict, dict]:
    """The family's config as transformers 5 saves it, and the same in the Hub's layout."""
    cls, sizes, theta, scaling, partial = FAMILIES[family]
    rope = {"rope_theta": theta, **(scaling or {"rope_type": "default"})}
    if partial != 1.0:
        rope["partial_rotary_factor"] = partial
    getattr(transformers, cls)(**sizes, rope_parameters=rope).save_pretrained(tmp_path)
    five = json.loads((tmp_path / "config.json").read_text())
    assert five["rope_parameters"]["rope_theta"] == theta and "rope_theta" not in five
    hub = {k: v for k, v in five.items() if k != "rope_parameters"}
    inside = dict(five["rope_parameters"])
    hub["rope_theta"] = inside.pop("rope_theta")
    if "partial_rotary_factor" in inside:
        hub["partial_rotary_factor"] = inside.pop("partial_rotary_factor")
    if inside.get("rope_type", "default") != "default":
        hub["rope_scaling"] = inside
    return five, hub


def _settings(family: str, config: dict) -> Any:
    """What the family builds its network with (its YAML where it writes one)."""
    if family in ("mindformers:llama", "mindformers:glm4"):
        from ms_port.write.model_config import family_yaml

        return family_yaml(family, config, None).text
    from ms_port.archs.parallel_core.config import family_of

    return family_of(config).settings(config)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_both_layouts_give_the_same_target_settings_and_yaml(family, tmp_path):
    five, hub = _layouts(family, tmp_path)
    _, _, theta, scaling, partial = FAMILIES[family]
    for config in (five, hub):
        rope = read_rope(config)
        assert rope.theta == theta
        assert rope.kind == (scaling or {}).get("rope_type", "default")
        # what transformers itself reads from the same file
        held = transformers.AutoConfig.for_model(**config).rope_parameters
        assert held["rope_theta"] == rope.theta
        assert held.get("partial_rotary_factor", 1.0) == (rope.partial or 1.0) == partial
    assert read_rope(five).scaling == read_rope(hub).scaling
    # the same target; its notes name the key the scaling was read from
    targets = [from_family(family, c) for c in (five, hub)]
    for target in targets:
        target.notes = [n.replace("(rope_scaling)", "(rope_parameters)") for n in target.notes]
    assert targets[0] == targets[1]
    assert _settings(family, five) == _settings(family, hub)


@pytest.mark.parametrize("layout", ["five", "hub"])
def test_glm4_reads_its_rotary_base_from_either_layout(layout, tmp_path):
    """The bug this file is for: rope_ratio 500, not 1.0, from a transformers-5 config."""
    import yaml

    from ms_port.archs.glm.family import glm_sizes

    config = dict(zip(("five", "hub"), _layouts("mindformers:glm4", tmp_path)))[layout]
    assert glm_sizes(config).rope_ratio == 500
    doc = yaml.safe_load(_settings("mindformers:glm4", config))
    assert doc["model"]["model_config"]["rope_ratio"] == 500
    notes = from_family("mindformers:glm4", config).notes
    assert any("rotary base is 10000 × rope_ratio = 5e+06" in n for n in notes)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("layout", ["five", "hub"])
def test_a_partial_rotary_factor_the_network_does_not_rotate_is_refused(family, layout,
                                                                        tmp_path):
    five, hub = _layouts(family, tmp_path)
    config = json.loads(json.dumps(five if layout == "five" else hub))
    if layout == "five":
        config["rope_parameters"]["partial_rotary_factor"] = 0.25
        where = "rope_parameters.partial_rotary_factor is 0.25"
    else:
        config["partial_rotary_factor"] = 0.25
        where = "config.json: partial_rotary_factor is 0.25"
    with pytest.raises(MsPortError, match=where):
        from_family(family, config)
    with pytest.raises(MsPortError, match=where):
        _settings(family, config)


def test_inside_the_mapping_wins_and_rope_scaling_wins_over_rope_parameters():
    """As transformers reads them: a value inside the RoPE mapping before the top-level one,
    and ``rope_scaling`` before ``rope_parameters`` where a config holds both."""
    base = {"model_type": "llama", **SMALL}
    inside = {**base, "rope_theta": 1e4, "partial_rotary_factor": 0.5,
              "rope_parameters": {"rope_type": "default", "rope_theta": 5e5,
                                  "partial_rotary_factor": 1.0}}
    rope = read_rope(inside)
    held = transformers.LlamaConfig(**inside).rope_parameters
    assert (rope.theta, rope.partial) == (held["rope_theta"], held["partial_rotary_factor"])
    both = {**base, "rope_theta": 5e5, "rope_parameters": {"rope_type": "default"},
            "rope_scaling": dict(LLAMA3)}
    rope = read_rope(both)
    held = transformers.LlamaConfig(**both).rope_parameters
    assert rope.kind == held["rope_type"] == "llama3" and rope.theta == held["rope_theta"]
    for bad, says in ((1.5, "at most 1"), (0, "positive finite"), ("half", "positive finite")):
        with pytest.raises(MsPortError, match=f"rope_parameters.partial_rotary_factor.*{says}"):
            read_rope({**base, "rope_parameters": {"partial_rotary_factor": bad}})


#: the keys only the one reader (match/rope.py) reads from a config
ROTARY_KEYS = {"rope_theta", "partial_rotary_factor", "rope_scaling", "rope_parameters"}
PACKAGE = Path(__file__).resolve().parent.parent / "ms_port"


def _is_config(node: ast.expr) -> bool:
    """The families name the config.json they read ``config`` (ms-port's own dicts of
    settings, written from it, have other names)."""
    return isinstance(node, ast.Name) and node.id == "config"


def _reads(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, key) of each ``config.get("key")``, ``config["key"]`` and
    ``read_*(config, "key")``."""
    found = []
    for node in ast.walk(tree):
        keys: list[ast.expr] = []
        if isinstance(node, ast.Subscript) and _is_config(node.value):
            keys = [node.slice]
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in ("get", "pop", "setdefault"):
                keys = node.args[:1] if _is_config(func.value) else []
            elif node.args and _is_config(node.args[0]):
                keys = node.args[1:2]
        found += [(node.lineno, k.value) for k in keys
                  if isinstance(k, ast.Constant) and k.value in ROTARY_KEYS]
    return found


def test_no_family_reads_a_rotary_key_by_itself():
    """Each family reads the rotary settings through read_rope, which knows both layouts
    (a second reader of them is how GLM-4's family came to read the top level only)."""
    readers = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name == "rope.py" and path.parent.name == "match":
            continue
        lines = _reads(ast.parse(path.read_text(), str(path)))
        if lines:
            readers[str(path.relative_to(PACKAGE))] = lines
    assert not readers, readers
    # the check finds what it is for: GLM-4's old reading
    old = ('theta = read_float(config, "rope_theta", 10000.0)\n'
           'p = config.get("partial_rotary_factor")')
    assert [key for _, key in _reads(ast.parse(old))] == ["rope_theta", "partial_rotary_factor"]


def test_glm4_with_a_rope_scaling_converts_and_its_network_is_refused(tmp_path):
    """MindFormers' ChatGLM2 has no RoPE scaling: the weights convert (they do not depend on
    it), the target says so, and the YAML (and the network verify builds) are refused."""
    five, _ = _layouts("mindformers:glm4", tmp_path)
    config = json.loads(json.dumps(five))
    config["rope_parameters"].update(YARN)
    target = from_family("mindformers:glm4", config)
    assert any("yarn" in n and "ChatGLM2 has none" in n for n in target.notes)
    with pytest.raises(MsPortError, match=r"yarn.*ChatGLM2 has no RoPE scaling"):
        _settings("mindformers:glm4", config)
    from ms_port.archs.glm.family import glm_sizes

    with pytest.raises(MsPortError, match="ChatGLM2 has no RoPE scaling"):
        glm_sizes(config).require_plain_rope()


@pytest.mark.parametrize("model_type, family, says", [
    ("deepseek_v32", "mindformers:deepseek3", "it is mindformers:deepseek32's: pass "
                                              "--ms-model mindformers:deepseek32"),
    ("deepseek_v3", "mindformers:deepseek32", "it is mindformers:deepseek3's: pass "
                                              "--ms-model mindformers:deepseek3"),
    ("deepseek_v4", "mindformers:deepseek3", "it is mindformers:deepseek4's: pass "
                                             "--ms-model mindformers:deepseek4"),
    ("deepseek_v3", "mindformers:deepseek4", "it is mindformers:deepseek3's"),
    ("qwen3", "mindformers:deepseek3", "it is mindformers:qwen3's: pass --ms-model "
                                       "mindformers:qwen3"),
    ("qwen2", "mindformers:qwen3", "it is mindformers:llama's"),
    ("glm", "mindformers:llama", "it is mindformers:glm4's"),
    ("llama", "mindformers:glm4", "it is mindformers:llama's"),
])
def test_a_family_handed_another_model_type_says_which_takes_it(model_type, family, says):
    with pytest.raises(MsPortError, match=says):
        from_family(family, {"model_type": model_type, "hidden_size": 64})


def test_a_model_type_nobody_takes_gets_no_invented_advice():
    with pytest.raises(MsPortError) as refused:
        from_family("mindformers:qwen3", {"model_type": "mamba", "hidden_size": 64})
    assert "it is" not in str(refused.value) and "pass --ms-model" not in str(refused.value)


def test_a_planned_model_type_is_said_to_be_planned(monkeypatch):
    """A model type no table takes yet, listed as planned, is named with what it is."""
    from ms_port.match import mapping

    monkeypatch.setitem(mapping.PLANNED_MODEL_TYPES, "deepseek_v9", "DeepSeek-V9, not built")
    with pytest.raises(MsPortError, match="deepseek_v9 is DeepSeek-V9, not built"):
        from_family("mindformers:deepseek3", {"model_type": "deepseek_v9", "hidden_size": 64})


def test_inspect_says_which_target_takes_the_model_type(tmp_path, monkeypatch):
    """inspect of a Hugging Face folder names the family that converts it, or says there is
    none yet (a DeepSeek-V4 had been listed with no word)."""
    import numpy as np
    from safetensors.numpy import save_file

    import ms_port
    from ms_port.match import mapping

    monkeypatch.setitem(mapping.PLANNED_MODEL_TYPES, "deepseek_v9", "DeepSeek-V9, not built")
    for model_type, says in (("qwen3", "mindformers:qwen3"),
                             ("deepseek_v4", "mindformers:deepseek4"),
                             ("deepseek_v9", "none yet (DeepSeek-V9"), ("mamba", None)):
        folder = tmp_path / model_type
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"model_type": model_type}))
        save_file({"w": np.zeros(2, np.float32)}, str(folder / "model.safetensors"))
        target = ms_port.inspect(folder).config.get("ms_port_target")
        assert (target is None) if says is None else target.startswith(says)
