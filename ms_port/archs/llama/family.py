"""MindFormers' ``LlamaForCausalLM`` as a target, from a Hugging Face ``config.json``.

``--ms-model mindformers:llama`` needs no factory: the network's sizes come from the
source's config. For convert, the names and shapes are computed here without importing
MindFormers (``import mindformers`` alone takes 5-11 s and 1.2 GB); a test holds this
manifest against the real network, per variant. verify builds the real network with the
same settings (:func:`build_llama`), its import contained: its log folder goes to a
cache directory, its log lines to stderr, so ``--json`` stays parseable.

LLaMA, Mistral and Qwen2 all load into this one class (Qwen2: q/k/v biases). Options:
``qkv_concat`` (fused ``w_qkv`` and ``w_gate_hidden``), ``seq_length`` (verify's input
length).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import io
import logging
import os
import shutil
import sys
import tempfile
import threading
from dataclasses import dataclass
from typing import Any

from ...errors import TargetError, shown
from ...match.mapping import elsewhere, select_table, selected_model_types
from ...read.targets import Target, TargetTensor
from ..config_values import Rope, read_bool, read_float, read_int, read_layers, read_rope

FAMILY = "mindformers:llama"



@dataclass(frozen=True)
class LlamaSizes:
    """What MindFormers' LlamaConfig needs, read from a Hugging Face config."""

    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    eps: float
    rope: Rope
    qkv_bias: bool
    o_bias: bool
    tied: bool

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def theta(self) -> float:
        return self.rope.theta


# checked readers of config.json values (shared with the parallel_core families)
_int, _float, _bool = read_int, read_float, read_bool


#: what a mapping table's ``implies:`` may say of a model type, and its default
IMPLIED = {"qkv_bias": False}


def _implied(table: Any, model_type: str) -> dict[str, bool]:
    """What ``table`` says ``model_type``'s architecture has (the parser saw to true or
    false). The model's code fixes it (transformers' Qwen2 always has q/k/v biases):
    config.json cannot change it."""
    given = table.implies.get(model_type, {})
    unknown = sorted(set(given) - set(IMPLIED))
    if unknown:
        raise TargetError(f"{table.origin}: implies.{shown(model_type)}.{unknown[0]}: {FAMILY} "
                          f"takes only {', '.join(IMPLIED)} there; remove the entry")
    return {**IMPLIED, **given}


def llama_sizes(config: dict[str, Any]) -> LlamaSizes:
    """Read the sizes; refuse what MindFormers' LlamaForCausalLM cannot hold.

    The model types it holds are those a shipped mapping table selects into it (adding a
    family of this structure is a table); what a model type implies and its config.json
    leaves unsaid (Qwen2's q/k/v biases) comes from that table's ``implies:``.
    """
    model_type = config.get("model_type")
    table = select_table(config, (FAMILY,))
    if table is None:
        raise TargetError(f"config.json: model_type {shown(model_type)} is not one {FAMILY} "
                          f"holds: the mapping tables in mappings/ take "
                          f"{', '.join(selected_model_types(FAMILY))}"
                          + (elsewhere(model_type, FAMILY) or "; a family of LLaMA's "
                             "structure is added as a table (docs/llm.md: 'Adding a family')"))
    implied = _implied(table, model_type)
    heads = _int(config, "num_attention_heads")
    hidden = _int(config, "hidden_size")
    kv_heads = _int(config, "num_key_value_heads", heads)
    # unset: hidden / heads (at least 1, so that too few dimensions fail the check below)
    head_dim = _int(config, "head_dim", max(1, hidden // heads))
    if head_dim * heads != hidden or heads % kv_heads:
        raise TargetError(f"config.json: {heads} heads of {head_dim} with {kv_heads} KV heads "
                          f"and hidden_size {hidden}: MindFormers' LlamaForCausalLM needs "
                          "heads x head_dim = hidden_size and heads divisible by KV heads")
    if _bool(config, "mlp_bias"):
        raise TargetError("config.json: mlp_bias is set; MindFormers' LlamaForCausalLM has no "
                          "MLP biases")
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise TargetError(f"config.json: hidden_act {shown(act)}; MindFormers' LlamaForCausalLM "
                          "computes SiLU")
    rope = read_rope(config)  # a scaling never refused: the weights do not depend on it
    rope.require_partial(1.0, "MindFormers' LlamaForCausalLM")
    bias = _bool(config, "attention_bias")
    layers = read_layers(config)
    return LlamaSizes(
        vocab=_int(config, "vocab_size"), hidden=hidden, layers=layers,
        heads=heads, kv_heads=kv_heads, intermediate=_int(config, "intermediate_size"),
        eps=_float(config, "rms_norm_eps", 1e-6), rope=rope,
        qkv_bias=implied["qkv_bias"] or bias, o_bias=bias,
        tied=_bool(config, "tie_word_embeddings"))


def llama_tensors(sizes: LlamaSizes, *, qkv_concat: bool = False) -> list[TargetTensor]:
    """The network's parameters in its own order (as ``parameters_and_names`` gives them)."""
    h, kv = sizes.hidden, sizes.kv_heads * sizes.head_dim
    out = [TargetTensor("model.tok_embeddings.embedding_weight", (sizes.vocab, h), "float32",
                        "LlamaEmbedding", ("LlamaEmbedding",))]

    def add(name: str, shape: tuple[int, ...], layer: str) -> None:
        out.append(TargetTensor(name, shape, "float32", layer, (layer,)))

    for i in range(sizes.layers):
        p = f"model.layers.{i}"
        add(f"{p}.ffn_norm.weight", (h,), "LlamaRMSNorm")
        add(f"{p}.attention_norm.weight", (h,), "LlamaRMSNorm")
        if qkv_concat:
            add(f"{p}.attention.w_qkv.weight", (h + 2 * kv, h), "Linear")
            if sizes.qkv_bias:
                add(f"{p}.attention.w_qkv.bias", (h + 2 * kv,), "Linear")
        else:
            for w, rows in (("wq", h), ("wk", kv), ("wv", kv)):
                add(f"{p}.attention.{w}.weight", (rows, h), "Linear")
                if sizes.qkv_bias:
                    add(f"{p}.attention.{w}.bias", (rows,), "Linear")
        add(f"{p}.attention.wo.weight", (h, h), "Linear")
        if sizes.o_bias:
            add(f"{p}.attention.wo.bias", (h,), "Linear")
        if qkv_concat:
            add(f"{p}.feed_forward.w_gate_hidden.weight", (2 * sizes.intermediate, h), "Linear")
            add(f"{p}.feed_forward.w2.weight", (h, sizes.intermediate), "Linear")
        else:
            add(f"{p}.feed_forward.w1.weight", (sizes.intermediate, h), "Linear")
            add(f"{p}.feed_forward.w2.weight", (h, sizes.intermediate), "Linear")
            add(f"{p}.feed_forward.w3.weight", (sizes.intermediate, h), "Linear")
    add("model.norm_out.weight", (h,), "LlamaRMSNorm")
    if not sizes.tied:
        add("lm_head.weight", (sizes.vocab, h), "Linear")
    return out


#: options ``mindformers:llama`` takes (``--ms-option KEY=VALUE``)
OPTIONS = {"qkv_concat": bool, "seq_length": int}
#: the layouts a checkpoint of this family may have, to recognise one by its names
VARIANTS = ({"qkv_concat": False}, {"qkv_concat": True})


def llama_target(config: dict[str, Any], *, qkv_concat: bool = False) -> Target:
    """The target's names and shapes from a Hugging Face config, without MindFormers."""
    sizes = llama_sizes(config)
    tensors = llama_tensors(sizes, qkv_concat=qkv_concat)
    variant = "fused qkv" if qkv_concat else "separate q/k/v"
    notes = []
    if sizes.rope.problem:
        notes.append(f"{sizes.rope.describe()}: the weights do not depend on it and are "
                     "converted; MindFormers' network built from them would compute another "
                     "function, so verify refuses it")
    elif sizes.rope.kind != "default":
        notes.append(f"{sizes.rope.describe()} (the weights do not depend on it; "
                     "--model-config writes it)")
    return Target("family", f"mindformers:llama ({variant})", {t.name: t for t in tensors},
                  family="mindformers:llama", notes=notes)


def _first_import() -> None:
    """Import the ``mindformers`` package, once, from a thread of its own.

    Its first import leaves the frames that imported it referenced (measured: the import
    system's frames of ``mindformers/dataset`` stay alive after it returns, and each frame
    holds its caller's). Imported from verify's own stack, that kept the locals of every
    frame below alive: the first MindSpore network built by layers was never freed. A
    thread's stack holds nothing of its caller's. An error is raised here as raised there.
    """
    if "mindformers" in sys.modules:
        return
    failed: list[BaseException] = []

    def run() -> None:
        try:
            importlib.import_module("mindformers")
        except BaseException as exc:  # raised again in the caller's thread
            failed.append(exc)

    worker = threading.Thread(target=run, name="ms-port-mindformers-import")
    worker.start()
    worker.join()
    if failed:
        raise failed[0]


@contextlib.contextmanager
def contained() -> Any:
    """Import and run MindFormers without it writing ``./output/log`` or to the terminal:
    its log folder is a temporary one, removed at exit, unless ``LOCAL_DEFAULT_PATH`` is
    set; what it prints (its 40-line config conversion table for every parallel_core
    network built) is dropped, since ms-port's output, ``--json`` included, is its own.
    Its warnings still reach stderr through its logger."""
    if "LOCAL_DEFAULT_PATH" not in os.environ:  # read once, when MindFormers is imported
        logs = tempfile.mkdtemp(prefix="ms-port-mindformers-")
        atexit.register(shutil.rmtree, logs, ignore_errors=True)
        os.environ["LOCAL_DEFAULT_PATH"] = logs
    with contextlib.redirect_stdout(io.StringIO()):
        with contextlib.suppress(ImportError):  # the caller's own import says what to do
            _first_import()
        yield
        # its INFO lines (pipeline stages, recompute settings) tell a converter's user nothing
        get_logger = getattr(sys.modules.get("mindformers.tools.logger"), "get_logger", None)
        if get_logger is not None:
            get_logger().setLevel(logging.WARNING)


def model_settings(sizes: LlamaSizes, *, qkv_concat: bool = False) -> dict[str, Any]:
    """The ``LlamaConfig`` values that make MindFormers' network the checkpoint's network:
    sizes, epsilon, RoPE (``theta``, ``extend_method``, ``scaling_factor``), biases, the
    layout and the tied head. Device and run settings are not among them
    (:data:`CPU_SETTINGS`)."""
    return {
        "hidden_size": sizes.hidden, "num_layers": sizes.layers, "num_heads": sizes.heads,
        "n_kv_heads": sizes.kv_heads, "vocab_size": sizes.vocab,
        "intermediate_size": sizes.intermediate, "rms_norm_eps": sizes.eps,
        "theta": sizes.theta, "extend_method": sizes.rope.extend_method,
        "scaling_factor": sizes.rope.scaling_factor, "qkv_has_bias": sizes.qkv_bias,
        "attn_proj_has_bias": sizes.o_bias, "qkv_concat": qkv_concat,
        "tie_word_embeddings": sizes.tied}


#: how verify runs the network on a CPU: float32 throughout, no fused or Ascend-only
#: kernels, rotate-half RoPE (Hugging Face's layout; LLAMA3 needs it on CPU)
CPU_SETTINGS: dict[str, Any] = {
    "use_past": False, "use_flash_attention": False, "fused_rms_norm": False,
    "use_rope_slice": True, "compute_dtype": "float32", "layernorm_compute_type": "float32",
    "softmax_compute_type": "float32", "rotary_dtype": "float32",
    "param_init_type": "float32", "embedding_init_type": "float32"}

#: MindFormers masks every token equal to ``pad_token_id`` in attention; transformers
#: masks none. An id no token has makes both compute the same function for every input.
NO_PAD = -1


def positions(sizes: LlamaSizes, seq_length: int) -> int:
    """``max_position_embedding`` for a run of ``seq_length`` tokens: MindFormers' scaled
    RoPE needs it above the pretraining length it extends from (the table's length does
    not change its values)."""
    return max(seq_length, 2, (sizes.rope.original or 0) + 1)


def llama_config(config: dict[str, Any], *, qkv_concat: bool = False,
                 seq_length: int = 128) -> Any:
    """MindFormers' ``LlamaConfig`` for CPU float32 inference of this model, computing the
    same function as transformers' for every token (no pad masking).

    Raises:
        TargetError: a RoPE scaling MindFormers cannot compute exactly (one line, naming
            it): a network built anyway would not be the checkpoint's.
    """
    sizes = llama_sizes(config)
    if sizes.rope.problem:
        raise TargetError(f"config.json: RoPE scaling {shown(sizes.rope.kind)} "
                          f"({sizes.rope.key}): MindFormers cannot compute it exactly "
                          f"({sizes.rope.problem}); the converted weights are right, but "
                          "verify cannot build the same network")
    with contained():
        try:
            from mindformers.models.llama import LlamaConfig
        except ImportError:
            raise TargetError("mindformers:llama needs MindFormers to build the network: pip "
                              "install --no-deps mindformers==2.1.0 "
                              "(see docs/development.md)") from None
        return LlamaConfig(
            batch_size=1, seq_length=seq_length, pad_token_id=NO_PAD,
            max_position_embedding=positions(sizes, seq_length),
            **model_settings(sizes, qkv_concat=qkv_concat), **CPU_SETTINGS)


def build_llama(config: dict[str, Any], *, qkv_concat: bool = False,
                seq_length: int = 128) -> Any:
    """The real MindFormers network (verify's MindSpore side)."""
    cfg = llama_config(config, qkv_concat=qkv_concat, seq_length=seq_length)
    with contained():
        from mindformers.models.llama import LlamaForCausalLM

        net = LlamaForCausalLM(cfg)
    net.set_train(False)
    return net


target = llama_target
build = build_llama
#: the blocks, for verify one block at a time (imported only then)
BLOCKS = "ms_port.archs.llama.blocks:llama_blocks"

__all__ = ["CPU_SETTINGS", "FAMILY", "NO_PAD", "OPTIONS", "LlamaSizes", "build_llama",
           "contained", "llama_config", "llama_sizes", "llama_target",
           "llama_tensors", "model_settings", "positions"]
