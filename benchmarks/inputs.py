"""The benchmark inputs: generated once into ``benchmarks/.cache``, seeded, no downloads.

    python benchmarks/inputs.py CASE [CASE...]      # make what those cases need

Importing this module is cheap (paths only); generating imports torch, MindSpore is
never imported. The harness runs generation in a child process of its own.

- ``resnet50.pth``: torchvision ResNet50's state dict, seeded random weights with
  BatchNorm statistics moved off 0/1 (:func:`ms_port.testing.save_reference_checkpoint`).
- ``resnet50.safetensors``: the same tensors as safetensors, for ``inspect``.
- ``synth-{1,3}g.v2.pth``: float32 state dicts of exactly 1 and 3 GiB of weights (plus
  small biases) written by ``torch.save``: per GiB, 8 tensors of 64 MiB, 16 of 16 MiB,
  64 of 4 MiB and 8 biases of 16 KiB, named ``layers.{i}.weight`` / ``layers.{i}.bias``.
- ``synth-*.template.ckpt``: the MindSpore checkpoint a model-zoo user would already
  have for such a model: the same names, shapes and dtypes. Written by ms-port's
  streaming writer, whose output is byte-identical to ``mindspore.save_checkpoint``'s
  (the harness's output check shows it on every run).
- ``synth-tiny.v2.pth`` (+ template): the same names at 1/32 of the size (32 MiB), used only
  to record which modules a synthetic conversion imports.
- ``big-7x2g/``: with ``--big``, 7 safetensors shards of 2 GiB (224 bfloat16 tensors
  of 4096×8192, 14 GiB) and their ``model.safetensors.index.json``; numpy only. Case
  ``big:N`` makes N such shards instead (``big:1``, 2 GiB, checks the path quickly).
- ``llm-1b/``: a Hugging Face LLaMA directory shaped like TinyLlama-1.1B (vocab 32000,
  hidden 2048, 22 layers, 32 heads, 4 KV heads, intermediate 5632, untied ``lm_head``):
  ``config.json`` and one bfloat16 ``model.safetensors`` (1,100,048,384 parameters,
  2.05 GiB) with Hugging Face's names. No model is built: numpy + ml_dtypes write the
  header, then each tensor in chunks of at most 4 Mi values (the generator's memory is
  bounded by a chunk: 81 MiB peak RSS, 17 s). Weights are normal with std 0.02, RMSNorm weights
  1 + 0.02 * normal. ``llm.mf.yaml`` beside it is the minimal MindFormers model config
  its ``convert_to_qkv_concat`` reads (a user would take the repo's ``predict_*.yaml``).
  ``llm-tiny/`` is the same layout at 2 layers of hidden 256 (module recording only).
- ``llm-7b/``: the same at Mistral-7B's shape (vocab 32000, hidden 4096, 32 layers, 32
  heads, 8 KV heads, intermediate 14336; 7,241,732,096 parameters, 13.5 GiB), cut into
  Hugging Face shards of at most 5 GB with ``model.safetensors.index.json``.
- ``llm-70b-2l/``, ``llm-70b-4l/``: the same layout with Llama-3-70B's widths (vocab 128256,
  hidden 8192, 64 heads, 8 KV heads, intermediate 28672, ``rope_theta`` 500000) but only 2
  or 4 decoder layers (3.81e9 / 5.52e9 parameters, 7.1 / 10.3 GiB): one such layer is
  855,654,400 parameters (1.6 GiB in bfloat16), the embedding and the head 1,050,673,152
  each. For ``verify --mode layers``, whose memory should follow one block, not the depth.
- ``qwen3-moe-2l/``, ``qwen3-moe-4l/``: a Hugging Face Qwen3-MoE directory with
  Qwen3-30B-A3B's widths (vocab 151936, hidden 2048, 32 heads / 4 KV heads of 128, 128
  experts of intermediate 768, top-8, untied head) at 2 and 4 of its 48 decoder layers,
  bfloat16, the Hub's per-expert keys (``model.layers.{i}.mlp.experts.{e}.gate_proj.weight``)
  and ``model_type`` qwen3_moe; one decoder layer is 623,120,640 parameters (1.16 GiB), the
  embedding and the head 311,164,928 each. Shards of two decoder layers (the first with the
  embedding, the last shard the final norm and the head) with an index; the shards both
  depths share are one file on disk, hard-linked (``qwen3-moe-shards/``), so the two inputs
  take 5.8 GiB, not 9.3. ``qwen3-moe-tiny/``: the same layout at hidden 64, 4 experts (a 10 s check
  of ``mindformers_qwen3_moe.py``, which fails on it the same way).
- ``fp8-dequant/``: DeepSeek-V3's block-scaled float8 as its Hub checkpoint stores it:
  every Linear weight ``float8_e4m3fn`` with a float32 ``weight_scale_inv`` of one scale per
  128×128 block (``quantization_config.weight_block_size``), quantized from seeded normal
  bfloat16 weights the way DeepSeek's ``bf16_cast_fp8`` does (per block amax / 448),
  norms and the router bfloat16, its ``e_score_correction_bias`` float32. DeepSeek-V3's
  widths (hidden 7168, MLA attention, dense intermediate 18432, experts of 2048) at three
  layers: one dense, two of 24 routed experts and the shared one (the Hub model has 61
  layers of 256); no embedding or head (bfloat16 on the Hub: only copied).
  3,159,687,168 bytes of float8 (2.94 GiB) in shards of at most 1.1 GB.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

CACHE = Path(__file__).resolve().parent / ".cache"
LAYOUT = "v2"  # bump when the synthetic layout changes; old files are then ignored
BIG_SHARDS, BIG_PER_SHARD, BIG_SHAPE = 7, 32, (4096, 8192)
#: the synthetic LLaMA's sizes (``1b``: TinyLlama-1.1B's; ``tiny``: the same layout, small)
LLM_SIZES = {
    "1b": {"vocab_size": 32000, "hidden_size": 2048, "num_hidden_layers": 22,
           "num_attention_heads": 32, "num_key_value_heads": 4, "intermediate_size": 5632},
    "tiny": {"vocab_size": 512, "hidden_size": 256, "num_hidden_layers": 2,
             "num_attention_heads": 8, "num_key_value_heads": 2, "intermediate_size": 704},
    # Mistral-7B's shape (GQA, 7.24B parameters, 13.5 GiB in bfloat16)
    "7b": {"vocab_size": 32000, "hidden_size": 4096, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336},
    # Llama-3-70B's widths at 2 and 4 layers (70B itself has 80)
    **{f"70b-{n}l": {"vocab_size": 128256, "hidden_size": 8192, "num_hidden_layers": n,
                     "num_attention_heads": 64, "num_key_value_heads": 8,
                     "intermediate_size": 28672} for n in (2, 4)},
}
#: config.json keys that differ from the defaults of :func:`llm_config`
LLM_CONFIG = {f"70b-{n}l": {"rope_theta": 500000.0, "max_position_embeddings": 8192,
                            "bos_token_id": 128000, "eos_token_id": 128001} for n in (2, 4)}
#: sizes written as Hugging Face shards of at most this many bytes, with an index
#: (``save_pretrained``'s layout: ``model-00001-of-0000N.safetensors``)
LLM_SHARD_BYTES = {"7b": 5 * 10**9, "70b-2l": 5 * 10**9, "70b-4l": 5 * 10**9}
#: Qwen3-30B-A3B's widths (its config.json on the Hub, which has 48 layers); ``tiny`` is the
#: same layout, small (module recording)
QWEN3_MOE_SIZES = {
    "30b-a3b": {"vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144,
                "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
                "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128},
    "tiny": {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 96,
             "moe_intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2,
             "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 16},
}
#: the depths of ``qwen3-moe-layers`` (``qwen3-moe-2l``, ``qwen3-moe-4l``); ``tiny`` has 2
QWEN3_MOE_DEPTHS = (2, 4)
#: decoder layers per shard (two of the 30B-A3B's: 2.5 GB)
QWEN3_MOE_LAYERS_PER_SHARD = 2
#: DeepSeek-V3's widths (its config.json on the Hub), cut to ``FP8_LAYERS`` with
#: ``n_routed_experts`` instead of 256
FP8_CONFIG = {"hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
              "num_attention_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512,
              "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
              "n_routed_experts": 24, "n_shared_experts": 1, "num_experts_per_tok": 8,
              "first_k_dense_replace": 1, "num_hidden_layers": 3}
FP8_BLOCK = (128, 128)
#: shards of at most this many bytes (weights with their scales, in order)
FP8_SHARD_BYTES = 1_100_000_000


def synth_path(size: str) -> Path:
    """``size`` is ``1g``, ``3g`` or ``tiny``."""
    return CACHE / f"synth-{size}.{LAYOUT}.pth"


def template_path(size: str) -> Path:
    return CACHE / f"synth-{size}.{LAYOUT}.template.ckpt"


def resnet50_path() -> Path:
    return CACHE / "resnet50.pth"


def safetensors_path() -> Path:
    return CACHE / "resnet50.safetensors"


def big_shards(case: str) -> int:
    """``big`` is 7 shards (14 GiB); ``big:N`` is N."""
    return int(case.partition(":")[2] or BIG_SHARDS)


def big_index(shards: int = BIG_SHARDS) -> Path:
    return CACHE / f"big-{shards}x2g" / "model.safetensors.index.json"


def big_bytes(shards: int = BIG_SHARDS) -> int:
    return shards * BIG_PER_SHARD * BIG_SHAPE[0] * BIG_SHAPE[1] * 2


def llm_dir(size: str = "1b") -> Path:
    """``size`` is a key of :data:`LLM_SIZES` (``1b``, ``7b``, ``tiny``, ``70b-2l``...)."""
    return CACHE / f"llm-{size}"


def llm_70b_depths(case: str) -> list[int]:
    """``llm-70b-layers`` is 2 and 4 layers; ``llm-70b-layers:2`` (or ``:2+4``) picks."""
    given = case.partition(":")[2]
    depths = [int(d) for d in given.split("+")] if given else [2, 4]
    for d in depths:
        if f"70b-{d}l" not in LLM_SIZES:
            raise SystemExit(f"{case}: no input of {d} layers (there are 2 and 4)")
    return depths


def llm_mf_yaml(size: str = "1b") -> Path:
    return llm_dir(size) / "llm.mf.yaml"


def llm_config(size: str = "1b") -> dict:
    """The Hugging Face ``config.json`` of the synthetic LLaMA."""
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            **LLM_SIZES[size], "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
            "tie_word_embeddings": False, "hidden_act": "silu", "torch_dtype": "bfloat16",
            "max_position_embeddings": 2048, "bos_token_id": 1, "eos_token_id": 2,
            **LLM_CONFIG.get(size, {})}


def llm_shapes(size: str = "1b") -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of the synthetic LLaMA, Hugging Face names, sorted like safetensors'
    own writer sorts one dtype's tensors (by name)."""
    c = LLM_SIZES[size]
    h, inter, vocab = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    kv = c["num_key_value_heads"] * (h // c["num_attention_heads"])
    out = [("model.embed_tokens.weight", (vocab, h)), ("model.norm.weight", (h,)),
           ("lm_head.weight", (vocab, h))]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}"
        out += [(f"{p}.self_attn.q_proj.weight", (h, h)),
                (f"{p}.self_attn.k_proj.weight", (kv, h)),
                (f"{p}.self_attn.v_proj.weight", (kv, h)),
                (f"{p}.self_attn.o_proj.weight", (h, h)),
                (f"{p}.mlp.gate_proj.weight", (inter, h)),
                (f"{p}.mlp.up_proj.weight", (inter, h)),
                (f"{p}.mlp.down_proj.weight", (h, inter)),
                (f"{p}.input_layernorm.weight", (h,)),
                (f"{p}.post_attention_layernorm.weight", (h,))]
    return sorted(out)


def llm_bytes(size: str = "1b") -> int:
    return sum(2 * _numel(shape) for _, shape in llm_shapes(size))


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def llm_files(size: str = "1b") -> list[tuple[str, list[tuple[str, tuple[int, ...]]]]]:
    """(file name, its tensors) of the synthetic LLaMA: one ``model.safetensors``, or
    shards of at most :data:`LLM_SHARD_BYTES` filled in name order (``save_pretrained``
    fills them in module order; the layout is the same)."""
    shapes, limit = llm_shapes(size), LLM_SHARD_BYTES.get(size)
    if limit is None:
        return [("model.safetensors", shapes)]
    groups: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    used = 0
    for name, shape in shapes:
        n = 2 * _numel(shape)
        if groups[-1] and used + n > limit:
            groups.append([])
            used = 0
        groups[-1].append((name, shape))
        used += n
    return [(f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors", g)
            for i, g in enumerate(groups)]


def make_llm(size: str = "1b") -> Path:
    """Write ``config.json`` + ``model.safetensors`` (or shards and their index; bfloat16)
    + the MindFormers yaml, streaming: header first, then every tensor in chunks (numpy +
    ml_dtypes only)."""
    folder = llm_dir(size)
    config = folder / "config.json"
    if config.exists():  # written last
        return folder
    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1100)
    files = llm_files(size)
    for file, shapes in files:
        _atomic(folder / file, lambda tmp, shapes=shapes: _write_bf16(tmp, shapes, rng))
    if len(files) > 1:
        index = {"metadata": {"total_size": llm_bytes(size)},
                 "weight_map": {name: file for file, shapes in files for name, _ in shapes}}
        _atomic(folder / "model.safetensors.index.json",
                lambda tmp: tmp.write_text(json.dumps(index, indent=2)))
    c, theta = LLM_SIZES[size], llm_config(size)["rope_theta"]
    yaml = "\n".join([
        "# the model section MindFormers' llama convert_to_qkv_concat reads",
        "model:", "  model_config:", "    type: LlamaConfig",
        f"    hidden_size: {c['hidden_size']}", f"    num_layers: {c['num_hidden_layers']}",
        f"    num_heads: {c['num_attention_heads']}",
        f"    n_kv_heads: {c['num_key_value_heads']}",
        f"    intermediate_size: {c['intermediate_size']}",
        f"    vocab_size: {c['vocab_size']}", "    rms_norm_eps: 1.0e-5",
        f"    theta: {theta}", "    qkv_concat: True", "  arch:",
        "    type: LlamaForCausalLM", ""])
    _atomic(llm_mf_yaml(size), lambda tmp: tmp.write_text(yaml))
    _atomic(config, lambda tmp: tmp.write_text(json.dumps(llm_config(size), indent=2)))
    return folder


def qwen3_moe_dir(name: str) -> Path:
    """``name`` is ``2l``, ``4l`` (Qwen3-30B-A3B's widths at that depth) or ``tiny``."""
    return CACHE / f"qwen3-moe-{name}"


def _qwen3_moe_sizes(name: str) -> tuple[dict, int]:
    """(widths, depth) of a Qwen3-MoE input."""
    if name == "tiny":
        return QWEN3_MOE_SIZES["tiny"], 2
    return QWEN3_MOE_SIZES["30b-a3b"], int(name.removesuffix("l"))


def qwen3_moe_config(name: str) -> dict:
    """The Hugging Face ``config.json``: the Hub's Qwen3-30B-A3B, at its depth."""
    widths, depth = _qwen3_moe_sizes(name)
    return {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", **widths,
            "num_hidden_layers": depth, "max_window_layers": depth, "mlp_only_layers": [],
            "decoder_sparse_step": 1, "norm_topk_prob": True, "hidden_act": "silu",
            "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_scaling": None,
            "max_position_embeddings": 40960, "attention_bias": False,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 151643,
            "eos_token_id": 151645, "router_aux_loss_coef": 0.001, "use_sliding_window": False,
            "sliding_window": None,
            **({"bos_token_id": 1, "eos_token_id": 2} if name == "tiny" else {})}


def qwen3_moe_layer(widths: dict, i: int) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of decoder layer ``i``, the Hub's names (experts one by one)."""
    h, d, e = widths["hidden_size"], widths["head_dim"], widths["num_experts"]
    q, kv, f = widths["num_attention_heads"] * d, widths["num_key_value_heads"] * d, \
        widths["moe_intermediate_size"]
    p = f"model.layers.{i}"
    out = [(f"{p}.input_layernorm.weight", (h,)), (f"{p}.post_attention_layernorm.weight", (h,)),
           (f"{p}.self_attn.q_proj.weight", (q, h)), (f"{p}.self_attn.k_proj.weight", (kv, h)),
           (f"{p}.self_attn.v_proj.weight", (kv, h)), (f"{p}.self_attn.o_proj.weight", (h, q)),
           (f"{p}.self_attn.q_norm.weight", (d,)), (f"{p}.self_attn.k_norm.weight", (d,)),
           (f"{p}.mlp.gate.weight", (e, h))]
    for x in range(e):
        out += [(f"{p}.mlp.experts.{x}.gate_proj.weight", (f, h)),
                (f"{p}.mlp.experts.{x}.up_proj.weight", (f, h)),
                (f"{p}.mlp.experts.{x}.down_proj.weight", (h, f))]
    return out


def qwen3_moe_shards(name: str) -> list[tuple[str, list[tuple[str, tuple[int, ...]]]]]:
    """(shared shard, its tensors) in file order: the embedding and the first layers, the
    next layers, then the final norm and the head (the Hub's order). A shared shard's
    content depends only on its key, never on the depth: both depths link the same file."""
    widths, depth = _qwen3_moe_sizes(name)
    h, vocab, n = widths["hidden_size"], widths["vocab_size"], QWEN3_MOE_LAYERS_PER_SHARD
    width = "tiny" if name == "tiny" else "30b-a3b"
    out = []
    for first in range(0, depth, n):
        shapes = [s for i in range(first, min(first + n, depth))
                  for s in qwen3_moe_layer(widths, i)]
        if first == 0:
            shapes.insert(0, ("model.embed_tokens.weight", (vocab, h)))
        out.append((f"{width}-layers-{first}-{first + n - 1}", sorted(shapes)))
    out.append((f"{width}-head", [("lm_head.weight", (vocab, h)), ("model.norm.weight", (h,))]))
    return out


def qwen3_moe_bytes(name: str) -> int:
    return sum(2 * _numel(shape) for _, shapes in qwen3_moe_shards(name) for _, shape in shapes)


def qwen3_moe_layer_params(name: str = "2l") -> int:
    return sum(_numel(shape) for _, shape in qwen3_moe_layer(_qwen3_moe_sizes(name)[0], 0))


def make_qwen3_moe(name: str) -> Path:
    """Write the shards (once, shared, streaming, numpy + ml_dtypes), hard-link them into
    the directory under Hugging Face's shard names, and write the index and config.json."""
    folder = qwen3_moe_dir(name)
    config = folder / "config.json"
    if config.exists():  # written last
        return folder
    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    store = CACHE / "qwen3-moe-shards"
    shards = qwen3_moe_shards(name)
    weight_map = {}
    for k, (key, shapes) in enumerate(shards):
        shared = store / f"{key}.safetensors"
        if not shared.exists():
            rng = np.random.default_rng([1100, *key.encode()])  # the key's values only
            _atomic(shared, lambda tmp, shapes=shapes, rng=rng: _write_bf16(tmp, shapes, rng))
        file = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        (folder / file).unlink(missing_ok=True)
        os.link(shared, folder / file)
        weight_map.update(dict.fromkeys((n for n, _ in shapes), file))
    index = {"metadata": {"total_size": qwen3_moe_bytes(name)}, "weight_map": weight_map}
    _atomic(folder / "model.safetensors.index.json",
            lambda tmp: tmp.write_text(json.dumps(index, indent=2)))
    _atomic(config, lambda tmp: tmp.write_text(json.dumps(qwen3_moe_config(name), indent=2)))
    return folder


def _write_bf16(path: Path, shapes: list[tuple[str, tuple[int, ...]]], rng,
                chunk: int = 4 << 20) -> None:
    """A bfloat16 safetensors file, header first, then each tensor in chunks of ``chunk``
    values (normal × 0.02; norms 1 + that): memory bounded by a chunk."""
    import ml_dtypes
    import numpy as np

    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in shapes:
        n = 2 * _numel(shape)
        header[name] = {"dtype": "BF16", "shape": list(shape),
                        "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(len(blob).to_bytes(8, "little") + blob)
        for name, shape in shapes:
            left = _numel(shape)
            norm = name.endswith("norm.weight")
            while left:
                n = min(left, chunk)
                x = rng.standard_normal(n, dtype=np.float32)
                x *= 0.02
                if norm:
                    x += 1.0
                f.write(x.astype(ml_dtypes.bfloat16).view(np.uint16).data)
                left -= n


def fp8_dir() -> Path:
    return CACHE / "fp8-dequant"


def fp8_config() -> dict:
    """DeepSeek-V3's config.json, cut to :data:`FP8_CONFIG`, with its quantization_config."""
    return {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
            **FP8_CONFIG, "vocab_size": 129280, "num_key_value_heads": 128,
            "hidden_act": "silu", "rms_norm_eps": 1e-6, "topk_method": "noaux_tc",
            "n_group": 8, "topk_group": 4, "moe_layer_freq": 1, "norm_topk_prob": True,
            "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
            "tie_word_embeddings": False, "torch_dtype": "bfloat16",
            "quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
                                    "activation_scheme": "dynamic",
                                    "weight_block_size": list(FP8_BLOCK)}}


def fp8_weights() -> list[tuple[str, tuple[int, int] | tuple[int], str]]:
    """(name, shape, kind) in the Hub's order; kind is ``float8`` (a Linear weight, stored
    with its scales), ``norm`` / ``bf16`` (bfloat16) or ``float32``."""
    c = FP8_CONFIG
    h, heads = c["hidden_size"], c["num_attention_heads"]
    qk = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
    out: list = []
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}"
        out += [(f"{p}.input_layernorm.weight", (h,), "norm"),
                (f"{p}.self_attn.q_a_proj.weight", (c["q_lora_rank"], h), "float8"),
                (f"{p}.self_attn.q_a_layernorm.weight", (c["q_lora_rank"],), "norm"),
                (f"{p}.self_attn.q_b_proj.weight", (heads * qk, c["q_lora_rank"]), "float8"),
                (f"{p}.self_attn.kv_a_proj_with_mqa.weight",
                 (c["kv_lora_rank"] + c["qk_rope_head_dim"], h), "float8"),
                (f"{p}.self_attn.kv_a_layernorm.weight", (c["kv_lora_rank"],), "norm"),
                (f"{p}.self_attn.kv_b_proj.weight",
                 (heads * (c["qk_nope_head_dim"] + c["v_head_dim"]), c["kv_lora_rank"]),
                 "float8"),
                (f"{p}.self_attn.o_proj.weight", (h, heads * c["v_head_dim"]), "float8"),
                (f"{p}.post_attention_layernorm.weight", (h,), "norm")]
        if i < c["first_k_dense_replace"]:
            mlps = [(f"{p}.mlp", c["intermediate_size"])]
        else:
            e, f = c["n_routed_experts"], c["moe_intermediate_size"]
            out += [(f"{p}.mlp.gate.weight", (e, h), "bf16"),
                    (f"{p}.mlp.gate.e_score_correction_bias", (e,), "float32")]
            mlps = [(f"{p}.mlp.experts.{x}", f) for x in range(e)]
            mlps.append((f"{p}.mlp.shared_experts", f * c["n_shared_experts"]))
        for m, f in mlps:
            out += [(f"{m}.gate_proj.weight", (f, h), "float8"),
                    (f"{m}.up_proj.weight", (f, h), "float8"),
                    (f"{m}.down_proj.weight", (h, f), "float8")]
    return out


def fp8_bytes() -> int:
    """Bytes of float8 (the weights alone, not their scales)."""
    return sum(_numel(shape) for _, shape, kind in fp8_weights() if kind == "float8")


def _fp8_units() -> list[list[tuple[str, str, tuple[int, ...], str]]]:
    """(name, safetensors dtype, shape, kind) of every stored tensor, a float8 weight and
    its scales as one unit (never split between shards)."""
    out = []
    for name, shape, kind in fp8_weights():
        if kind == "float8":
            grid = tuple(-(-n // b) for n, b in zip(shape, FP8_BLOCK))
            out.append([(name, "F8_E4M3", shape, kind),
                        (name + "_scale_inv", "F32", grid, "scale")])
        else:
            out.append([(name, "F32" if kind == "float32" else "BF16", shape, kind)])
    return out


def make_fp8() -> Path:
    """Write config.json, the shards and their index (numpy + ml_dtypes). Each Linear weight
    is seeded normal × 0.02, quantized a row of blocks at a time: per 128×128 block
    scale = amax / 448 and weight / scale rounded to float8_e4m3fn (``bf16_cast_fp8``)."""
    folder = fp8_dir()
    config = folder / "config.json"
    if config.exists():  # written last
        return folder
    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    size = {"F8_E4M3": 1, "F32": 4, "BF16": 2}
    groups: list[list[tuple]] = [[]]
    used = 0
    for unit in _fp8_units():
        n = sum(size[t[1]] * _numel(t[2]) for t in unit)
        if groups[-1] and used + n > FP8_SHARD_BYTES:
            groups.append([])
            used = 0
        groups[-1] += unit
        used += n
    rng = np.random.default_rng(3)
    weight_map = {}
    for k, tensors in enumerate(groups):
        file = f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors"
        _atomic(folder / file, lambda tmp, tensors=tensors: _write_fp8(tmp, tensors, size, rng))
        weight_map.update(dict.fromkeys((t[0] for t in tensors), file))
    total = sum(size[t[1]] * _numel(t[2]) for g in groups for t in g)
    _atomic(folder / "model.safetensors.index.json", lambda tmp: tmp.write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)))
    _atomic(config, lambda tmp: tmp.write_text(json.dumps(fp8_config(), indent=2)))
    return folder


def _write_fp8(path: Path, tensors: list[tuple], size: dict[str, int], rng) -> None:
    """One shard: a weight's float8 blocks and their scales are made together, a row of
    blocks at a time, and the scales written after the weight."""
    import ml_dtypes
    import numpy as np

    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype, shape, _ in tensors:
        n = size[dtype] * _numel(shape)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    scales: dict[str, np.ndarray] = {}
    with open(path, "wb") as f:
        f.write(len(blob).to_bytes(8, "little") + blob)
        for name, _, shape, kind in tensors:
            if kind == "scale":  # made with its weight, which came first in this file
                f.write(scales.pop(name).data)
                continue
            if kind != "float8":
                x = rng.standard_normal(_numel(shape), dtype=np.float32) * 0.02
                if kind == "norm":
                    x += 1.0
                f.write(x.data if kind == "float32"
                        else x.astype(ml_dtypes.bfloat16).view(np.uint16).data)
                continue
            rows, cols = shape
            (br, bc), grid_cols = FP8_BLOCK, -(-cols // FP8_BLOCK[1])
            scale = np.empty((-(-rows // br), grid_cols), np.float32)
            for i, top in enumerate(range(0, rows, br)):
                w = rng.standard_normal((min(br, rows - top), cols), dtype=np.float32) * 0.02
                padded = np.zeros((w.shape[0], grid_cols * bc), np.float32)
                padded[:, :cols] = np.abs(w)
                scale[i] = padded.reshape(w.shape[0], grid_cols, bc).max(axis=(0, 2)) / 448
                w /= np.repeat(scale[i], bc)[:cols]
                f.write(w.astype(ml_dtypes.float8_e4m3fn).view(np.uint8).data)
            scales[name + "_scale_inv"] = scale


def synth_shapes(size: str) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of the synthetic state dict; ``tiny`` is 1/32 of a GiB."""
    if size == "tiny":
        blocks, scale = 1, 32  # 4096 -> 128 columns: each weight 1/32 as wide
    else:
        blocks, scale = int(size.removesuffix("g")), 1
    rows = [4096] * 8 + [1024] * 16 + [256] * 64  # x 4096 float32: 64, 16, 4 MiB
    out: list[tuple[str, tuple[int, ...]]] = []
    i = 0
    for _ in range(blocks):
        for n, r in enumerate(rows):
            out.append((f"layers.{i}.weight", (r, 4096 // scale)))
            if n % 11 == 0:  # 8 of the 88 weights of a block carry a bias
                out.append((f"layers.{i}.bias", (4096 // scale,)))
            i += 1
    return out


def make_synth(size: str) -> Path:
    path = synth_path(size)
    if path.exists():
        return path
    import torch

    gen = torch.Generator().manual_seed(1234)
    state = {name: torch.randn(*shape, generator=gen) for name, shape in synth_shapes(size)}
    _atomic(path, lambda tmp: torch.save(state, tmp))
    return path


def make_template(size: str) -> Path:
    path = template_path(size)
    if path.exists():
        return path
    import ms_port
    from ms_port.read.sources import read_source
    from ms_port.read.targets import from_infos

    src = make_synth(size)
    target = from_infos(read_source(src).tensors.values(), "same names and shapes")
    _atomic(path, lambda tmp: ms_port.convert(src, target=target, output=tmp, force=True))
    return path


def make_resnet50() -> Path:
    path = resnet50_path()
    if not path.exists():
        from ms_port.testing import save_reference_checkpoint

        _atomic(path, lambda tmp: save_reference_checkpoint("resnet50", tmp))
    return path


def make_safetensors() -> Path:
    path = safetensors_path()
    if not path.exists():
        import torch
        from safetensors.torch import save_file

        state = torch.load(make_resnet50(), weights_only=True)
        _atomic(path, lambda tmp: save_file(state, str(tmp)))
    return path


def make_big(shards: int = BIG_SHARDS) -> Path:
    """``shards`` × 2 GiB of bfloat16 safetensors, written shard by shard (numpy only)."""
    index = big_index(shards)
    if index.exists():
        return index
    import ml_dtypes
    import numpy as np

    index.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(14)
    numel = BIG_SHAPE[0] * BIG_SHAPE[1]
    # one block of normal values; each tensor is it rolled by a different amount
    block = rng.standard_normal(numel, dtype=np.float32).astype(ml_dtypes.bfloat16)
    nbytes = numel * 2
    weight_map: dict[str, str] = {}
    t = 0
    for s in range(shards):
        shard = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        names = [f"model.layers.{t + k}.mlp.weight" for k in range(BIG_PER_SHARD)]
        header = {"__metadata__": {"format": "pt"}}
        for k, name in enumerate(names):
            header[name] = {"dtype": "BF16", "shape": list(BIG_SHAPE),
                            "data_offsets": [k * nbytes, (k + 1) * nbytes]}
        blob = json.dumps(header, separators=(",", ":")).encode()
        blob += b" " * (-len(blob) % 8)

        def write(tmp: Path, names=names, blob=blob, t=t) -> None:
            with open(tmp, "wb") as f:
                f.write(len(blob).to_bytes(8, "little") + blob)
                for k in range(len(names)):
                    f.write(np.roll(block, 7919 * (t + k) + 1).view(np.uint8).data)

        _atomic(index.parent / shard, write)
        weight_map.update(dict.fromkeys(names, shard))
        t += BIG_PER_SHARD
    _atomic(index, lambda tmp: tmp.write_text(json.dumps(
        {"metadata": {"total_size": big_bytes(shards)}, "weight_map": weight_map},
        indent=1)))
    return index


def _atomic(path: Path, write) -> None:
    """Write through a temporary name (an interrupted generation leaves nothing), and
    fsync it, so that its writeback is not charged to the first timed run."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.partial")
    try:
        write(tmp)
        fd = os.open(tmp, os.O_RDONLY)  # on disk before any timing starts
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        tmp.replace(path)
    finally:
        if tmp.exists():
            tmp.unlink()


def verify_paths() -> tuple[Path, Path]:
    """A ResNet50 with BatchNorm statistics estimated on data, and its conversion."""
    return CACHE / "verify-resnet50.pth", CACHE / "verify-resnet50.ckpt"


def make_verify() -> None:
    import ms_port
    from ms_port.testing import save_reference_checkpoint

    pth, ckpt = verify_paths()
    if not pth.exists():
        _atomic(pth, lambda tmp: save_reference_checkpoint("resnet50", tmp, bn_from_data=True))
    if not ckpt.exists():
        ms_port.convert(pth, arch="resnet50", output=ckpt)


def verify_vgg16_paths() -> tuple[Path, Path]:
    """torchvision's VGG16 (seeded) and its conversion into MindCV's VGG16."""
    return CACHE / "verify-vgg16.pth", CACHE / "verify-vgg16.ckpt"


def make_verify_vgg16() -> None:
    import torch
    import torchvision

    import ms_port

    pth, ckpt = verify_vgg16_paths()
    if not pth.exists():
        torch.manual_seed(0)
        state = torchvision.models.vgg16().state_dict()
        _atomic(pth, lambda tmp: torch.save(state, tmp))
    if not ckpt.exists():
        ms_port.convert(pth, ms_model="mindcv.models:vgg16", output=ckpt)


def prepare(cases: list[str]) -> None:
    for case in cases:
        if case == "verify":
            make_verify()
        if case == "verify-vgg16":
            make_verify_vgg16()
        if case in ("resnet50", "mindcv-resnet50"):
            make_resnet50()
        elif case in ("synth-1g", "synth-3g"):
            make_template(case.removeprefix("synth-"))
            make_template("tiny")
        elif case == "inspect":
            make_safetensors()
        elif case.startswith("big"):
            make_big(big_shards(case))
        elif case == "llm-1b":
            make_llm("tiny")
            make_llm("1b")
        elif case in ("llm-7b", "llm-7b-verify"):
            if case == "llm-7b-verify":  # its record of a layers verify's imports runs on it
                make_llm("tiny")
            make_llm("7b")
        elif case == "llm-1b-verify-modes":
            make_llm("tiny")
            make_llm("1b")
        elif case.startswith("llm-70b-layers"):
            make_llm("tiny")
            for depth in llm_70b_depths(case):
                make_llm(f"70b-{depth}l")
        elif case == "qwen3-moe-layers":
            make_qwen3_moe("tiny")
            for depth in QWEN3_MOE_DEPTHS:
                make_qwen3_moe(f"{depth}l")
        elif case == "fp8-dequant":
            make_fp8()


if __name__ == "__main__":
    prepare(sys.argv[1:])
