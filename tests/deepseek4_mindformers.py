"""MindFormers' own view of a DeepSeek-V4 conversion (a test helper for
tests/test_deepseek4.py, run in its own process: it installs a stand-in ``hyper_parallel``).

Usage:
    python tests/deepseek4_mindformers.py HUB.safetensors CONFIG.json MODEL.yaml OUT_DIR

Writes
    OUT_DIR/converted.npz   MindFormers' ``weight_converters`` (models/deepseek4/utils.py)
                            applied to the Hub-named file: what MindFormers itself makes of it
    OUT_DIR/network.json    [name, shape, dtype] of every parameter of MindFormers'
                            ``PyNativeDeepseekV4ForCausalLM`` built, without weights, from
                            MODEL.yaml's model_config (the YAML ``--model-config`` wrote)
    OUT_DIR/transformer.json  what MindFormers' TransformerConfig holds from it (HELD)

MindFormers' DeepSeek-V4 imports ``hyper_parallel`` (not on the package index). Building
the network under ``no_init_parameters`` needs only its names: the stand-in below answers
every import from it with do-nothing classes. Nothing of MindFormers is replaced.
"""
import importlib.abc
import importlib.machinery
import json
import os
import re
import sys
import tempfile
import types

os.environ.setdefault("LOCAL_DEFAULT_PATH", os.path.join(
    os.path.abspath(sys.argv[4]) if len(sys.argv) > 4 else tempfile.mkdtemp(), "mf_log"))
os.environ.setdefault("GLOG_v", "3")


class _Any:
    def __init__(self, *a, **k):
        pass

    def __call__(self, *a, **k):
        return _Any()

    def __getattr__(self, name):
        return _Any()

    def __class_getitem__(cls, item):
        return cls

    def __iter__(self):
        return iter(())

    def __bool__(self):
        return False


class _Module(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        cls = type(name, (_Any,), {})
        setattr(self, name, cls)
        return cls


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname == "hyper_parallel" or fullname.startswith("hyper_parallel."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Module(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())

import numpy as np  # noqa: E402
import yaml  # noqa: E402
from mindformers.checkpoint.converter.convert_op import ExpertsConvertOp  # noqa: E402
from mindformers.models.deepseek4.configuration_deepseek_v4 import DeepseekV4Config  # noqa: E402
from mindformers.models.deepseek4.modeling_deepseek_v4_pynative import (  # noqa: E402
    PyNativeDeepseekV4ForCausalLM,
)
from mindformers.models.deepseek4.utils import DeepseekV4PreTrainedModel  # noqa: E402
from mindspore.nn.utils import no_init_parameters  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402


def converted(hub: dict, config: dict) -> dict:
    """Every op of MindFormers' weight_converters applied to the Hub-named tensors; the
    experts' ops get the per-expert tensors joined along rows, as MindFormers' loader
    hands them over."""
    out = {}
    for op in DeepseekV4PreTrainedModel.weight_converters:
        if isinstance(op, ExpertsConvertOp):
            op.num_moe_experts, op.hidden_size = config["n_routed_experts"], config["hidden_size"]
            op.moe_ffn_hidden_size = config["moe_intermediate_size"]
            op.expert_parallel_size = op.optimizer_parallel_size = 1
        first = re.compile(op._name_to_pattern(op.hf_names[0]) + "$")
        layers = sorted({m.groups()[:1] for n in hub if (m := first.match(n))})
        for layer in layers:
            if isinstance(op, ExpertsConvertOp):
                parts = []
                for h in op.hf_names:
                    each = re.compile(re.escape(h.replace("{}", layer[0], 1)).replace(
                        r"\{\}", r"(\d+)") + "$")
                    names = sorted((n for n in hub if each.match(n)),
                                   key=lambda n: int(each.match(n).group(1)))
                    parts.append(np.concatenate([hub[n] for n in names], 0))
                out[op.mf_names[0].replace("{}", layer[0], 1)] = op._hf_to_mf(parts)[0]
            else:
                names = [h.format(*layer) if "{}" in h else h for h in op.hf_names]
                out.update(op({n: hub[n] for n in names}))
    return out


#: what the network is built with, read back from MindFormers' TransformerConfig
HELD = ("csa_compress_ratios", "moe_n_hash_layers", "qk_pos_emb_head_dim",
        "activation_func_clamp_value", "hidden_act", "qk_layernorm", "v_head_dim",
        "original_max_position_embeddings", "mtp_num_layers", "csa_compress_rotary_base")


def network(model_yaml: str) -> tuple[list, dict]:
    with open(model_yaml) as f:
        model_config = yaml.safe_load(f)["model"]["model_config"]
    model_config.pop("type")
    held = DeepseekV4Config(**model_config).convert_to_transformer_config()
    with no_init_parameters():
        net = PyNativeDeepseekV4ForCausalLM(DeepseekV4Config(**model_config))
    return ([[p.name, list(p.shape), str(p.dtype)] for _, p in net.parameters_and_names()],
            {k: getattr(held, k) for k in HELD})


def main() -> None:
    hub_file, config_file, model_yaml, out = sys.argv[1:5]
    with open(config_file) as f:
        config = json.load(f)
    np.savez(os.path.join(out, "converted.npz"), **converted(load_file(hub_file), config))
    parameters, held = network(model_yaml)
    with open(os.path.join(out, "network.json"), "w") as f:
        json.dump(parameters, f)
    with open(os.path.join(out, "transformer.json"), "w") as f:
        json.dump(held, f)


if __name__ == "__main__":
    main()
