"""MindFormers 2.1's own parallel_core networks (Qwen3, Qwen3-MoE, DeepSeek-V3) computing
on a CPU.

MindFormers' ``TrainingQwen3ForCausalLM``, ``TrainingQwen3MoeForCausalLM`` and
``TrainingDeepseekV3ForCausalLM`` are written for Ascend: they compile only in GRAPH mode,
and kernels they call have no CPU implementation in MindSpore 2.10 ("Unsupported op
[RmsNorm] on CPU": also ``FlashAttentionScore``, ``Outer``; for MoE ``TopkExt``,
``CumsumExt``, ``SortExt``, ``FmodScalar``, ``IndexSelect``, ``MoveTo``, ``GroupedMatmul``,
``Swiglu``), and attention rounds q/k/v to float16 for its flash kernel where the network
asks for float32. To prove a conversion by forward, ms-port runs MindFormers' own network,
float32, eval mode, with a stand-in for each such kernel (:data:`STANDINS`), and says which
stand-ins ran.

DeepSeek-V3 needs no kernel of its own beyond these: its multi-latent attention reaches
the same flash kernel, with value heads narrower than query/key heads and its own softmax
scale (the attention stand-in reads both from the call and the kernel), and its
sigmoid, group-limited router with the correction bias is MindFormers' ``TopKRouter``
(``TopkExt`` again). Its Multi-Token Prediction layer is built and loaded but not run
(``mtp-not-run``: it yields only a training loss, and needs labels). The network is built
in the layout the checkpoint was converted with (``options``: ``mla_qkv_concat``,
``mtp``). :func:`network_config` refuses, in one line, what MindFormers computes otherwise
than transformers: RoPE other than plain or yarn, yarn with ``mscale`` unequal to
``mscale_all_dim`` (MindFormers scales the rotary angles, transformers cos and sin), a
group score from other than each group's best two experts, one expert per token with
``norm_topk_prob``. One difference no config shows: MindFormers masks the experts of
groups not chosen with 0, transformers with -inf, so they differ where a chosen expert's
biased score (sigmoid + ``e_score_correction_bias``) is below 0: verify's forward then
FAILs, as it should.

Use::

    with cpu_standins() as standins:
        net = build_network(config, seq_length=16)      # config: a config.json dict
        report = load_arrays(net, arrays)               # name -> numpy, Parameter.name
        logits = forward(net, input_ids)                # [B, S, V] float32 numpy
    lines = standins.lines(net)                         # the stand-ins that ran

Everything happens inside the ``with``: some stand-ins are built into the network, the
others are read when it compiles (its first call), and the network runs in GRAPH mode,
which the block sets and restores. Nothing here prints or writes files; MindFormers' own
log lines go to stderr (:func:`~ms_port.archs.llama.family.contained`).

Measured (tiny seeded models: 2 layers, hidden 64, GQA 8/2 heads of 16; 4 experts, top 2;
16 tokens; 2 CPU cores): the logits match transformers' to 5.2e-7 (Qwen3) and 4.6e-7
(Qwen3-MoE) relative L2; with MindFormers' float16 cast kept, Qwen3 is off by 2.4e-4. The
first forward compiles (5-15 s), later ones take 7 ms (Qwen3) and 37 ms (Qwen3-MoE).
DeepSeek-V3 (3 layers, the first dense; hidden 64, 4 MLA heads, q/kv ranks 24/16, head
dims 8+4 and 8; 4 experts in 2 groups, top 2, a shared expert; 16 tokens): 5.9e-7 with the
fused ``linear_qkv`` and the MTP layer, 6.7e-7 with one tensor per projection and yarn
RoPE (mscale 0.8), two sequences; the first forward compiles (12-18 s), later ones
take 29 ms.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import TargetError
from ..llama.family import contained
from .config import (  # what callers read from here
    FAMILIES,
    MOE_RUN_SETTINGS,
    RUN_SETTINGS,
    Family,
    family_of,
    import_spec,
    network_config,
)

_TRAINING_GRAPH = "mindformers.parallel_core.training_graph"
_KERNELS = "ms_port.archs.parallel_core._kernels"


@dataclass(frozen=True)
class Patch:
    """One attribute replaced for the duration: ``module.attr`` (``attr`` may be dotted,
    ``Class.method``) becomes ``replacement`` (an attribute of
    :mod:`ms_port.archs.parallel_core._kernels`), or, with ``wraps``, what that
    attribute makes of the original."""

    module: str
    attr: str
    replacement: str
    wraps: bool = False  # the replacement is a function of the original


@dataclass(frozen=True)
class StandIn:
    """A CPU stand-in for a kernel MindFormers' network calls.

    Attributes:
        name: short name (``rms-norm``).
        replaces: what is replaced, and in which MindFormers file.
        why: why it cannot run as MindFormers wrote it.
        computes: what the stand-in computes instead.
        patches: the attributes replaced.
        cells: MindFormers classes; the stand-in runs in a network holding one of them.
    """

    name: str
    replaces: str
    why: str
    computes: str
    patches: tuple[Patch, ...]
    cells: tuple[str, ...]

    def describe(self) -> str:
        """One line: ``rms-norm: FusedRMSNorm.construct (…/norm.py): no CPU kernel …``."""
        return f"{self.name}: {self.replaces}: {self.why}; stand-in {self.computes}"


def _patch(module: str, attr: str, replacement: str, *, wraps: bool = False) -> Patch:
    return Patch(f"{_TRAINING_GRAPH}.{module}", attr, replacement, wraps)


#: every stand-in, in the order they are applied
STANDINS: tuple[StandIn, ...] = (
    StandIn("rms-norm", "FusedRMSNorm.construct (parallel_core/training_graph/transformer/"
            "norm.py)", "P.RmsNorm has no CPU kernel",
            "x*rsqrt(mean(x^2,-1)+eps)*w in the layer's compute dtype (MindFormers' own "
            "unfused RMSNorm)",
            (_patch("transformer.norm", "FusedRMSNorm.construct", "rms_norm_construct"),),
            ("FusedRMSNorm",)),
    StandIn("rope-outer", "Outer in RotaryEmbedding (parallel_core/training_graph/base_models/"
            "common/embeddings/rotary_pos_embedding.py)", "ops.Outer has no CPU kernel",
            "a[:, None] * b",
            (_patch("base_models.common.embeddings.rotary_pos_embedding", "Outer", "Outer"),),
            ("RotaryEmbedding",)),
    StandIn("attention", "FlashAttention.construct (parallel_core/training_graph/transformer/"
            "flash_attention.py)", "FlashAttentionScore has no CPU kernel",
            "float32 softmax attention, BNSD, each KV head shared by its group of query "
            "heads, the kernel's own scale (1/sqrt(head_dim), or MLA's softmax_scale), value "
            "heads of their own width, MindFormers' causal mask",
            (_patch("transformer.flash_attention", "FlashAttention.__init__", "attention_init",
                    wraps=True),
             _patch("transformer.flash_attention", "FlashAttention.construct",
                    "attention_construct")),
            ("FlashAttention",)),
    StandIn("qkv-float16-cast", "the float16 cast of q/k/v before the flash kernel in "
            "Attention.construct (parallel_core/training_graph/transformer/attention.py)",
            "it rounds float32 activations to float16 (2e-4 to 3e-4 on tiny models' logits)",
            "none: q/k/v stay float32 (that module's mstype.float16 reads as float32)",
            (_patch("transformer.attention", "mstype", "DtypesWithoutFloat16"),),
            ("Attention",)),
    StandIn("router-topk", "TopkExt in TopKRouter (parallel_core/training_graph/transformer/"
            "moe/router.py)", "TopkExt has no CPU kernel", "ops.topk",
            (_patch("transformer.moe.router", "TopkExt", "TopkExt"),),
            ("TopKRouter",)),
    StandIn("dispatch-cumsum", "CumsumExt in MoEAlltoAllTokenDispatcher (parallel_core/"
            "training_graph/transformer/moe/token_dispatcher.py)",
            "CumsumExt has no CPU kernel", "ops.cumsum",
            (_patch("transformer.moe.token_dispatcher", "CumsumExt", "CumsumExt"),),
            ("FFNGroupedGEMM",)),
    StandIn("dispatch-sort", "SortExt in the MoE token dispatcher (parallel_core/"
            "training_graph/transformer/moe/token_dispatcher.py: permute, "
            "MoEAlltoAllTokenDispatcher)", "SortExt has no CPU kernel",
            "ops.sort (ties may order differently; the unsort map inverts whichever order)",
            (_patch("transformer.moe.token_dispatcher", "SortExt", "SortExt"),),
            ("FFNGroupedGEMM",)),
    StandIn("dispatch-fmod", "FmodScalar in permute (parallel_core/training_graph/transformer/"
            "moe/token_dispatcher.py)", "FmodScalar has no CPU kernel",
            "ops.fmod, cast back to the index dtype",
            (_patch("transformer.moe.token_dispatcher", "FmodScalar", "FmodScalar"),),
            ("FFNGroupedGEMM",)),
    StandIn("dispatch-index-select", "IndexSelect in the MoE token dispatcher (parallel_core/"
            "training_graph/transformer/moe/token_dispatcher.py: permute, unpermute, "
            "MoEAlltoAllTokenDispatcher)", "IndexSelect has no CPU kernel", "ops.gather",
            (_patch("transformer.moe.token_dispatcher", "IndexSelect", "IndexSelect"),),
            ("FFNGroupedGEMM",)),
    StandIn("dispatch-move-to", "MoETokenDispatcher.d2h, an ops.MoveTo to the host "
            "(parallel_core/training_graph/transformer/moe/token_dispatcher.py)",
            "MoveTo has no CPU kernel", "the identity (a CPU tensor is on the host)",
            (_patch("transformer.moe.token_dispatcher", "MoETokenDispatcher.__init__",
                    "token_dispatcher_init", wraps=True),),
            ("FFNGroupedGEMM",)),
    StandIn("experts-grouped-matmul", "GroupedMatmul in FFNGroupedGEMM.experts_forward "
            "(parallel_core/training_graph/transformer/moe/ffn.py)",
            "GroupedMatmul has no CPU kernel",
            "each expert's matmul on its own rows, on the host (a pyfunc Custom op)",
            (_patch("transformer.moe.ffn", "GroupedMatmul", "GroupedMatmul"),),
            ("FFNGroupedGEMM",)),
    StandIn("experts-swiglu", "Swiglu in FFNGroupedGEMM (parallel_core/training_graph/"
            "transformer/moe/ffn.py)", "Swiglu has no CPU kernel",
            "silu(first half) * second half of the last axis",
            (_patch("transformer.moe.ffn", "Swiglu", "Swiglu"),),
            ("FFNGroupedGEMM",)),
    StandIn("mtp-not-run", "MultiTokenPredictionBlock.construct (parallel_core/training_graph/"
            "transformer/multi_token_prediction.py)",
            "it raises with no labels ('labels should not be None for calculating multi token "
            "prediction loss'); it gives only the MTP loss, which an eval forward does not "
            "return, and never changes the logits",
            "none: the MTP layer is loaded (its names and shapes checked), not run; the "
            "logits are the main model's",
            (_patch("transformer.multi_token_prediction",
                    "MultiTokenPredictionBlock.construct", "mtp_block_construct"),),
            ("MultiTokenPredictionBlock",)),
    # DeepSeek-V3.2 (experimental_attention_variant: dsa)
    StandIn("dsa-absorb-matmul", "BatchMatMul in MultiLatentAttention.construct's sparse "
            "path (parallel_core/training_graph/transformer/multi_latent_attention.py: "
            "linear_kvb absorbed into the query and the output)",
            "BatchMatMul does not broadcast [S, B, N, 1, D] against [N, D, L] on a CPU",
            "ops.matmul, which broadcasts the leading axes",
            (_patch("transformer.multi_latent_attention", "BatchMatMul", "BatchMatMul"),),
            ("DSAttention",)),
    StandIn("dsa-indexer-kernels", "BatchMatMul, TopkExt and SliceExt in DSAIndexer and "
            "its Hadamard rotation (parallel_core/training_graph/transformer/dsa/"
            "dsa_indexer.py)", "BatchMatMul does not broadcast there on a CPU; TopkExt and "
            "SliceExt have no CPU kernel",
            "ops.matmul; ops.topk (the k largest index scores: the set transformers' "
            "torch.topk chooses, but for exactly equal scores at the k-th place); "
            "ops.narrow",
            (_patch("transformer.dsa.dsa_indexer", "aclnn_ops", "IndexerOps"),),
            ("DSAIndexer",)),
    StandIn("dsa-sparse-attention", "DSAttention.construct (parallel_core/training_graph/"
            "transformer/dsa/dsa_attention.py)",
            "sparse_flash_attention is an Ascend kernel",
            "float32 softmax attention of each query over the tokens the indexer chose for "
            "it (its top-k indices; -1 none), the layer's softmax scale, MLA's absorbed "
            "latent key and value",
            (_patch("transformer.dsa.dsa_attention", "DSAttention.construct",
                    "dsa_attention_construct"),),
            ("DSAttention",)),
    StandIn("dsa-indexer-loss-not-run", "DSAIndexerLoss.construct (parallel_core/"
            "training_graph/transformer/dsa/dsa_indexer_loss.py)",
            "it gives only the indexer's training loss, which an eval forward does not "
            "return, and never changes the logits", "none: 0",
            (_patch("transformer.dsa.dsa_indexer_loss", "DSAIndexerLoss.construct",
                    "dsa_indexer_loss_construct"),),
            ("DSAIndexerLoss",)),
)

_BY_NAME = {s.name: s for s in STANDINS}
if len(_BY_NAME) != len(STANDINS):
    raise RuntimeError("two stand-ins share a name in STANDINS")


def _resolve(obj: Any, dotted: str) -> tuple[Any, str]:
    """The object holding the last part of ``dotted``, and that part's name."""
    *outer, last = dotted.split(".")
    for part in outer:
        obj = getattr(obj, part)
    return obj, last


@dataclass
class StandIns:
    """What :func:`cpu_standins` applied (``applied``), and which of those a network runs
    (:meth:`used_by`)."""

    applied: tuple[StandIn, ...]
    omitted: tuple[StandIn, ...] = ()
    _restore: list[tuple[Any, str, Any]] = field(default_factory=list, repr=False)

    def used_by(self, net: Any) -> list[StandIn]:
        """The applied stand-ins ``net`` runs: those whose MindFormers class it holds."""
        held = {klass.__name__ for _, cell in net.cells_and_names()
                for klass in type(cell).__mro__}
        return [s for s in self.applied if held.intersection(s.cells)]

    def lines(self, net: Any) -> list[str]:
        """One line per stand-in ``net`` runs (:meth:`StandIn.describe`)."""
        return [s.describe() for s in self.used_by(net)]


_ACTIVE: list[StandIns] = []
_INHERITED = object()  # marks a patched attribute its class had only by inheritance


def _select(omit: Iterable[str]) -> tuple[tuple[StandIn, ...], tuple[StandIn, ...]]:
    omit = tuple(omit)
    unknown = [n for n in omit if n not in _BY_NAME]
    if unknown:
        raise ValueError(f"unknown stand-in {unknown[0]!r}; known: {', '.join(_BY_NAME)}")
    return (tuple(s for s in STANDINS if s.name not in omit),
            tuple(s for s in STANDINS if s.name in omit))


@contextlib.contextmanager
def _graph_mode() -> Iterator[None]:
    """GRAPH mode and MindFormers' ``use_legacy: False`` (which its parallel_core networks
    build under) for the duration; the previous mode, flag and environment after.

    MindFormers' context is built once per process, by ``build_context`` on the CPU, and
    kept: MindSpore refuses to set its CPU affinity a second time. A failed compile writes
    its ``analyze_fail.ir`` into a temporary folder, not ``./``.
    """
    import mindspore as ms

    with contained():
        from mindformers import build_context
        from mindformers.core.context.build_context import Context, MFContextOperator

    before = dict(os.environ)
    changed = {"MS_OM_PATH"}  # the environment variables to restore
    mode = ms.get_context("mode")
    scratch = tempfile.mkdtemp(prefix="ms-port-graphs-")
    flags = None
    legacy = True  # what MindFormers assumes with no context
    try:
        if not Context.is_exists():
            with contained():
                build_context({"use_legacy": False, "parallel": {},
                               "context": {"device_target": "CPU", "mode": ms.GRAPH_MODE}})
            changed |= {k for k in set(os.environ) | set(before)
                        if os.environ.get(k) != before.get(k)}
        else:
            legacy = getattr(MFContextOperator.get_mf_ctx_instance(), "use_legacy", True)
        flags = MFContextOperator.get_mf_ctx_instance()
        flags.use_legacy = False
        ms.set_context(mode=ms.GRAPH_MODE)
        os.environ["MS_OM_PATH"] = scratch
        yield
    finally:
        ms.set_context(mode=mode)
        if flags is not None:
            flags.use_legacy = legacy
        for key in changed:
            if key in before:
                os.environ[key] = before[key]
            else:
                os.environ.pop(key, None)
        shutil.rmtree(scratch, ignore_errors=True)


@contextlib.contextmanager
def cpu_standins(*, omit: Iterable[str] = ()) -> Iterator[StandIns]:
    """Run MindFormers' parallel_core networks on a CPU for the duration: the kernel
    stand-ins of :data:`STANDINS` patched into MindFormers, GRAPH mode, MindFormers'
    ``use_legacy: False`` context. Everything is restored on leaving, in reverse order.

    Build, load and run the network inside the block: some stand-ins are built into the
    network, the others are read when it compiles at its first call.

    Args:
        omit: names of stand-ins not to apply (to measure what one changes; a kernel with
            no CPU implementation then fails the compile).

    Yields:
        :class:`StandIns`: what was applied; ``used_by(net)`` says which a network runs.

    Raises:
        TargetError: MindFormers is not installed, or no longer has an attribute a
            stand-in replaces (its version changed: the stand-in would not run).

    Example::

        with cpu_standins() as standins:
            net = build_network(config, seq_length=16)
            logits = forward(net, ids)
    """
    applied, omitted = _select(omit)
    if _ACTIVE:
        raise RuntimeError("cpu_standins() is already active; nest none")
    try:
        with contained():
            kernels = importlib.import_module(_KERNELS)
            modules = {p.module: importlib.import_module(p.module)
                       for s in applied for p in s.patches}
    except ImportError as err:
        raise TargetError(f"MindFormers' parallel_core networks need MindFormers 2.1 ({err}); "
                          "pip install --no-deps mindformers==2.1.0 "
                          "(see docs/development.md)") from None
    record = StandIns(applied, omitted)
    with _graph_mode():
        try:
            for standin in applied:
                for p in standin.patches:
                    try:
                        holder, name = _resolve(modules[p.module], p.attr)
                        original = getattr(holder, name)
                    except AttributeError:
                        raise TargetError(
                            f"stand-in {standin.name}: {p.module} has no {p.attr}; this "
                            "MindFormers is not the 2.1 the stand-ins were written for") from None
                    replacement = getattr(kernels, p.replacement)
                    # an attribute a class inherits is restored by removing ours
                    own = not isinstance(holder, type) or name in vars(holder)
                    setattr(holder, name, replacement(original) if p.wraps else replacement)
                    record._restore.append((holder, name, original if own else _INHERITED))
            _ACTIVE.append(record)
            yield record
        finally:
            if _ACTIVE and _ACTIVE[-1] is record:
                _ACTIVE.pop()
            for holder, name, original in reversed(record._restore):
                if original is _INHERITED:
                    delattr(holder, name)
                else:
                    setattr(holder, name, original)
            record._restore.clear()


def _require_active(what: str) -> None:
    if not _ACTIVE:
        raise RuntimeError(f"{what} inside `with cpu_standins():` (the stand-ins are built "
                           "into the network and read when it compiles)")


def build_network(config: Mapping[str, Any], *, seq_length: int,
                  options: Mapping[str, Any] | None = None) -> Any:
    """MindFormers' training network for the model a config.json describes, built on a
    CPU for float32 inference (eval mode) of ``[B, seq_length]`` token ids, in the layout
    the checkpoint was converted with (``options``, :func:`network_config`), its
    parameters uninitialised (``no_init_parameters``: the weights come from a checkpoint,
    :func:`load_arrays`). Call inside ``with cpu_standins():``.

    Example::

        with cpu_standins():
            net = build_network(json.load(open("config.json")), seq_length=16)
    """
    _require_active("build_network(): build")
    from mindspore.nn.utils import no_init_parameters

    mf_config = network_config(config, seq_length=seq_length, options=options)
    network_class = import_spec(family_of(config).network_class)
    with contained(), no_init_parameters():
        net = network_class(mf_config)
    net.set_train(False)
    return net


# ---- weights --------------------------------------------------------------------------

@dataclass(frozen=True)
class LoadReport:
    """What :func:`load_arrays` did, both ways.

    Attributes:
        loaded: names set.
        missing: the network's parameters no array was given for (left uninitialised).
        unexpected: arrays given for no parameter of the network.
        mismatched: ``(name, parameter shape, array shape)`` for arrays not loaded.
    """

    loaded: tuple[str, ...]
    missing: tuple[str, ...]
    unexpected: tuple[str, ...]
    mismatched: tuple[tuple[str, tuple[int, ...], tuple[int, ...]], ...]

    @property
    def complete(self) -> bool:
        """Every parameter set, every array used."""
        return not (self.missing or self.unexpected or self.mismatched)


def load_arrays(net: Any, arrays: Mapping[str, np.ndarray]) -> LoadReport:
    """Set ``net``'s parameters from ``arrays`` (name -> numpy array), by ``Parameter.name``
    as a parallel_core checkpoint names them (``decoder.layers.0…``, no ``model.``
    prefix), each cast to its parameter's dtype. Reports, never raises, what did not fit.

    Example::

        report = load_arrays(net, dict(np.load("weights.npz")))
        assert report.complete, report
    """
    import mindspore as ms

    params = {p.name: p for p in net.get_parameters()}
    loaded, mismatched = [], []
    for name in sorted(set(params) & set(arrays)):
        param, array = params[name], np.asarray(arrays[name])
        if tuple(array.shape) != tuple(param.shape):
            mismatched.append((name, tuple(param.shape), tuple(array.shape)))
            continue
        param.set_data(ms.Tensor(np.ascontiguousarray(array), dtype=param.dtype))
        loaded.append(name)
    return LoadReport(tuple(loaded), tuple(sorted(set(params) - set(arrays))),
                      tuple(sorted(set(arrays) - set(params))), tuple(mismatched))


def forward(net: Any, input_ids: np.ndarray) -> np.ndarray:
    """Run the network on ``[B, S]`` token ids (S the ``seq_length`` it was built for);
    its logits as float32 numpy ``[B, S, vocab]``. Call inside ``with cpu_standins():``
    (the first call compiles the graph)."""
    _require_active("forward(): run the network")
    import mindspore as ms

    ids = np.asarray(input_ids)
    if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
        raise TargetError(f"input ids of shape {ids.shape} and dtype {ids.dtype}: expected "
                          "[batch, seq_length] integers")
    with contained():
        logits = net(ms.Tensor(ids.astype(np.int32))).asnumpy()
    return logits.reshape(ids.shape[0], ids.shape[1], -1).astype(np.float32, copy=False)


__all__ = ["FAMILIES", "MOE_RUN_SETTINGS", "RUN_SETTINGS", "STANDINS", "Family", "LoadReport",
           "Patch", "StandIn", "StandIns", "build_network", "cpu_standins", "forward",
           "load_arrays", "network_config"]
