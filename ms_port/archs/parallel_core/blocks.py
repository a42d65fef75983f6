"""MindFormers' parallel_core Qwen3 / Qwen3-MoE block by block: verify at the size of
one decoder layer.

The blocks are LLaMA's (:mod:`ms_port.archs.llama.blocks`): the embedding, each decoder
layer, the head. The PyTorch side is the same (transformers' own network with one decoder
layer, built on the meta device; a mixture of experts gets its stacked experts from the
file's per-expert tensors). The MindSpore side is MindFormers' own training network,
built once with one decoder layer under ``no_init_parameters``, in GRAPH mode with the
CPU stand-ins of :mod:`ms_port.archs.parallel_core.cpu`; each block runs as one of its
cells, compiled on its own:

- the embedding: ``embedding`` (its ``[S, B, H]`` output transposed to ``[B, S, H]``);
- a decoder layer: ``decoder.layers.0`` given the causal mask and the rotary table the
  whole network computes (``preprocess_labels_and_masks.casual_mask``,
  ``rotary_pos_emb``), with the layer's tensors set into it;
- the head: ``decoder.final_layernorm``, then ``output_layer`` (with the embedding's
  weight where the two are tied).

Each layer's tensors replace the previous layer's in the same parameters: MindSpore holds
the embedding, the head and one decoder layer, and the layer cell compiles once.

Measured (tiny Qwen3, 2 layers, 16 tokens): the blocks run in turn give the whole
network's logits to 4e-8 relative L2. GRAPH mode runs no cell hooks, so the comparison
inside a block is its output (:attr:`Piece.outputs`) and the block fed PyTorch's input;
a wrong tensor is also named by the tensor check.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Callable

import mindspore as ms
import numpy as np
from mindspore import nn

from ...errors import ForwardUnavailable
from ..experts import RoutedExperts, expert_parts
from ..llama.blocks import HuggingFaceSide, Piece, release, set_parameters
from . import cpu
from .cpu import cpu_standins
from .deepseek import deepseek_sizes
from .family import INTERLEAVED, QWEN3, QWEN3_MOE, qwen3_sizes

#: MindFormers' decoder layer every layer runs as
MS_LOCAL = "decoder.layers.0"
#: the errors MindSpore raises when a graph does not compile or run here
_MINDSPORE_ERRORS = (RuntimeError, ValueError, TypeError)


class _Embedding(nn.Cell):
    """Token ids -> hidden states ``[B, S, H]``."""

    def __init__(self, embedding: nn.Cell) -> None:
        super().__init__()
        self.embedding = embedding

    def construct(self, ids: ms.Tensor) -> ms.Tensor:
        return self.embedding(ids, None).transpose(1, 0, 2)


class _Layer(nn.Cell):
    """One decoder layer on ``[B, S, H]``, with the whole network's mask and rotary table."""

    def __init__(self, layer: nn.Cell, mask: nn.Cell, rotary: nn.Cell) -> None:
        super().__init__()
        self.layer, self.mask, self.rotary = layer, mask, rotary

    def construct(self, hidden: ms.Tensor, ids: ms.Tensor) -> ms.Tensor:
        mask = self.mask(ids)
        rotary = self.rotary(ids.shape[1])
        out = self.layer(hidden.transpose(1, 0, 2), mask, rotary_pos_emb=rotary)[0]
        return out.transpose(1, 0, 2)


class _RoutedStandIn(nn.Cell):
    """In place of a mixture of experts' routed experts (``FFNGroupedGEMM``), in GRAPH
    mode: keeps what the layer gives them (the tokens, the router's coefficients and
    expert indices) in parameters, read after the call, and returns the routed sum set
    into :attr:`routed` before it (verify computes it a group of experts at a time)."""

    def __init__(self, tokens: int, hidden: int, topk: int) -> None:
        super().__init__()
        zeros = np.zeros

        def held(shape: tuple[int, ...], dtype: Any, name: str) -> ms.Parameter:
            return ms.Parameter(ms.Tensor(zeros(shape, dtype)), name=f"routed_standin.{name}",
                                requires_grad=False)

        self.tokens = held((1, tokens, hidden), np.float32, "tokens")
        self.probs = held((1, tokens, topk), np.float32, "probs")
        self.index = held((1, tokens, topk), np.int32, "index")
        self.routed = held((1, tokens, hidden), np.float32, "routed")
        self.assign = ms.ops.Assign()

    def construct(self, tokens: ms.Tensor, probs: ms.Tensor, index: ms.Tensor) -> ms.Tensor:
        kept = self.assign(self.tokens, tokens.reshape(self.tokens.shape).astype(ms.float32))
        kept = ms.ops.depend(kept, self.assign(self.probs, probs.reshape(self.probs.shape)
                                               .astype(ms.float32)))
        kept = ms.ops.depend(kept, self.assign(self.index, index.reshape(self.index.shape)
                                               .astype(ms.int32)))
        return ms.ops.depend(self.routed, kept)


class _Head(nn.Cell):
    """Final norm and LM head on ``[B, S, H]``: logits ``[B, S, V]``."""

    def __init__(self, norm: nn.Cell, output: nn.Cell, tied_weight: Any) -> None:
        super().__init__()
        self.norm, self.output = norm, output
        self.tied = tied_weight is not None
        self.weight = tied_weight

    def construct(self, hidden: ms.Tensor) -> ms.Tensor:
        h = self.norm(hidden)
        if self.tied:
            return self.output(h, self.weight)[0]
        return self.output(h)[0]


@dataclass(frozen=True)
class BlockShape:
    """How a family's network is cut into blocks and built small.

    Attributes:
        family: the target (``mindformers:qwen3``…).
        layers: the model's decoder layers.
        tied: MindFormers' head is the embedding's weight (no ``output_layer``).
        seq_length: the input length the small networks are built for.
        slots: per layer, which decoder layer of the small networks runs it (default: all
            the one layer).
        small: the small networks' config keys (default: one decoder layer).
        options: the layout the checkpoint was converted with (its target's).
        build_options: the layout MindFormers' small network is built in.
        not_run: what the checkpoint holds that no block runs, each a line for the report.
    """

    family: str
    layers: int
    tied: bool
    seq_length: int = 16
    slots: tuple[int, ...] | None = None
    small: dict[str, Any] | None = None
    options: dict[str, Any] | None = None
    build_options: dict[str, Any] | None = None
    not_run: tuple[str, ...] = ()
    #: the routed experts of a mixture-of-experts layer, and how many each token takes
    experts: int = 0
    topk: int = 0


class ParallelCoreBlocks(HuggingFaceSide):
    """The pieces of a Hugging Face Qwen3 / Qwen3-MoE and of MindFormers'
    ``TrainingQwen3ForCausalLM`` / ``TrainingQwen3MoeForCausalLM`` built from the same
    config, and one step of each (the five methods :mod:`ms_port.check.blocks` drives,
    and ``session()``, which holds GRAPH mode and the stand-ins across the blocks)."""

    #: a GRAPH-compiled network keeps the arrays its parameters share until it runs
    #: again, even once they are given placeholders: verify hands their pages back once
    #: a block's passes are done (:class:`~ms_port.check.reuse.HandedBack`)
    keeps_data = True

    def __init__(self, config: dict[str, Any], build_torch: Callable[[dict[str, Any]], Any],
                 shape: BlockShape) -> None:
        super().__init__(config, build_torch)
        self.family = shape.family
        self.layers, self.tied = shape.layers, shape.tied
        self.slots = shape.slots if shape.slots is not None else (0,) * shape.layers
        self.small = dict(shape.small or {"num_hidden_layers": 1})
        self.seq_length = shape.seq_length
        self.options: dict[str, Any] = dict(shape.options or {})
        self.build_options: dict[str, Any] = dict(shape.build_options or {})
        self.not_run = tuple(shape.not_run)
        self.experts, self.topk = shape.experts, shape.topk
        self._standins: Any = None
        #: the small networks built in this session, by vocabulary (None: the config's)
        self._sized: dict[Any, tuple[Any, dict[str, Any], dict[str, nn.Cell]]] = {}
        self._ran: list[str] = []
        #: the small networks' routed experts a group at a time, by group size
        self._groups: dict[int, tuple[nn.Cell, dict[str, Any]]] = {}
        #: MindFormers' routed experts as the small network built them (never loaded)
        self._experts: Any = None
        #: each small network's (and group's) parameter shapes as built, by its key
        self._shapes: dict[Any, dict[str, tuple[int, ...]]] = {}

    # --- the pieces -------------------------------------------------------------------
    def pieces(self, source_names: set[str], checkpoint_names: set[str]) -> list[Piece]:
        """Embedding, every decoder layer, head; each with the names it takes and the
        layers whose outputs stand for it."""
        def under(names: set[str], prefix: str, local: str) -> dict[str, str]:
            return {local + n[len(prefix):]: n for n in sorted(names)
                    if n.startswith(prefix + ".")}

        embedding = "embedding.word_embeddings.weight"
        found = [Piece("embedding", "embedding",
                       {"model.embed_tokens.weight": "model.embed_tokens.weight"},
                       {embedding: embedding},
                       outputs=("model.embed_tokens", "embedding.word_embeddings"), exact=True,
                       rows=("model.embed_tokens.weight", embedding))]
        for i in range(self.layers):
            prefix, slot = f"model.layers.{i}", self.slots[i]
            found.append(Piece(prefix, "layer",
                               under(source_names, prefix, f"model.layers.{slot}"),
                               under(checkpoint_names, f"decoder.layers.{i}",
                                     f"decoder.layers.{slot}"),
                               prefix, i, outputs=(prefix, f"decoder.layers.{i}"), slot=slot))
        head_src = ("model.embed_tokens.weight" if "lm_head.weight" not in source_names
                    else "lm_head.weight")
        head_ms = embedding if self.tied else "output_layer.weight"
        found.append(Piece(
            "head", "head", {"model.norm.weight": "model.norm.weight", "lm_head.weight": head_src},
            {"decoder.final_layernorm.weight": "decoder.final_layernorm.weight",
             head_ms: head_ms}, outputs=("lm_head", "output_layer"),
            rows=("lm_head.weight", head_ms), wide=("lm_head",)))
        return found

    # --- MindSpore --------------------------------------------------------------------
    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """GRAPH mode and the CPU stand-ins for the duration, and MindFormers' network
        with one decoder layer, built without weights.

        Raises:
            ForwardUnavailable: the network does not build here.
        """
        with cpu_standins() as standins:
            self._standins = standins
            try:
                net = self._network(None)[0]
                try:
                    yield
                finally:
                    self._ran = standins.lines(net)
            finally:
                for _, params, _ in self._sized.values():
                    release(params.values())
                for _, own in self._groups.values():
                    release(own.values())
                self._sized, self._groups, self._standins = {}, {}, None
                self._shapes = {}
                self._experts = None

    def _network(self, vocab: int | None, routed: int | None = None
                 ) -> tuple[Any, dict[str, Any], dict[str, nn.Cell]]:
        """MindFormers' small network for a vocabulary of ``vocab`` rows (None: the
        config's; a span of it where verify runs the vocabulary in spans), built once:
        (the network, its parameters by name, the blocks' cells). ``routed``: the tokens
        of a forward, for a network whose mixture-of-experts layers' routed experts are
        :class:`_RoutedStandIn` (its cell ``standin{slot}``).

        Raises:
            ForwardUnavailable: the network does not build here.
        """
        key = vocab if routed is None else ("routed", routed)
        if key in self._sized:
            return self._sized[key]
        config = {**self.config, **self.small, **({} if vocab is None else
                                                   {"vocab_size": vocab})}
        try:
            # through the module, looked up at each call (a test's stand-in for it is
            # then undone with it, whichever test first imported this module)
            net = cpu.build_network(config, seq_length=self.seq_length,
                                    options=self.build_options)
        except _MINDSPORE_ERRORS as exc:
            raise ForwardUnavailable.of(exc) from None
        model = net.model
        standins = {}
        if routed is not None:  # before any cell takes the layers in
            for slot in sorted(set(self.slots)):
                mlp = model.decoder.layers[slot].mlp
                if hasattr(mlp, "experts") and hasattr(mlp, "router"):
                    self._experts = mlp.experts  # the template of each group's (no weights)
                    standins[f"standin{slot}"] = _RoutedStandIn(
                        routed, int(self.config["hidden_size"]), self.topk)
                    mlp.experts = standins[f"standin{slot}"]
        # the names before the cells below take the network's layers in (which renames
        # their parameters), and the shapes they were built with (release() lets go of
        # their data between blocks)
        params = {p.name: p for p in net.get_parameters()}
        self._shapes[key] = {n: tuple(p.shape) for n, p in params.items()}
        tied = model.embedding.word_embeddings.weight if self.tied else None
        mask = model.preprocess_labels_and_masks.casual_mask
        cells = {
            "embedding": _Embedding(model.embedding),
            "head": _Head(model.decoder.final_layernorm, model.output_layer, tied),
            **{f"layer{slot}": _Layer(model.decoder.layers[slot], mask, model.rotary_pos_emb)
               for slot in sorted(set(self.slots))},
            **standins,
        }
        self._sized[key] = net, params, cells
        return self._sized[key]

    def ms_network(self, piece: Piece, tensors: dict[str, Any]) -> Any:
        """The piece's cell, its tensors set (float32) into the one network (of the
        piece's span of the vocabulary); ``tensors`` is emptied as they are set."""
        if self._standins is None:
            raise RuntimeError("ParallelCoreBlocks.ms_network() outside session()")
        if piece.kind == "layer":  # the embedding's spans are done: their weights go
            self._keep(lambda k: k is None)
        else:  # no routed layer follows the first span or the head
            self._keep(lambda k: not isinstance(k, tuple))
        key = piece.vocab if piece.kind != "layer" else None
        _, params, cells = self._network(key)
        release(params[n] for n in tensors if n in params)  # the last block's, before
        set_parameters(params, tensors, self._shapes[key])
        return cells[f"layer{piece.slot}" if piece.kind == "layer" else piece.kind]

    def _keep(self, wanted: Callable[[Any], bool]) -> None:
        """Let go of the small networks ``wanted`` rejects (by their key in ``_sized``):
        each holds the last weights set into it (DeepSeek-V3's dense layer, 2.3 GiB in
        float32, held while its MoE layers run in the routed network); the groups'
        experts cells go with the routed network."""
        kept = {k: v for k, v in self._sized.items() if wanted(k)}
        dropped = len(kept) < len(self._sized)
        for key in set(self._sized) - set(kept):
            release(self._sized[key][1].values())
        self._sized = kept
        if not any(isinstance(k, tuple) for k in self._sized):
            dropped = dropped or bool(self._groups)
            for _, own in self._groups.values():
                release(own.values())
            self._groups = {}
        if dropped:
            # a network is a web of reference cycles, and verify by layers freezes what
            # its first block left alive (ms_port.check.blocks): a network built then (the
            # session's, the embedding's spans) is collected only once unfrozen
            gc.unfreeze()
            gc.collect()
            gc.freeze()

    def ms_step(self, cell: Any, piece: Piece, state: Any, ids: np.ndarray) -> Any:
        """One piece on MindSpore: token ids -> hidden states -> … -> logits (float32).

        Raises:
            ForwardUnavailable: the cell does not compile or run here.
        """
        tokens = ms.Tensor(np.asarray(ids).astype(np.int32))
        try:
            if piece.kind == "embedding":
                return cell(tokens)
            if piece.kind == "head":
                return cell(state)
            return cell(state, tokens)
        except _MINDSPORE_ERRORS as exc:
            raise ForwardUnavailable.of(exc) from None

    # --- the routed experts a group at a time (ms_port.check.routed) --------------------
    def routed_of(self, piece: Piece, source_names: set[str]) -> RoutedExperts | None:
        """A mixture-of-experts layer's routed experts (None: the piece is none, or its
        files do not hold its experts whole): transformers' stacked ``gate_up_proj`` /
        ``down_proj``, MindFormers' ``weight1`` / ``weight2``."""
        if piece.kind != "layer" or not self.experts or piece.prefix is None:
            return None
        local, ms_local = f"model.layers.{piece.slot}.mlp.experts", \
            f"decoder.layers.{piece.slot}.mlp.experts"
        ms_names = {f"{ms_local}.{w}": piece.ms.get(f"{ms_local}.{w}")
                    for w in ("weight1", "weight2")}
        torch_names = {f"{local}.{s}": expert_parts(piece.prefix, f"mlp.experts.{s}",
                                                     source_names, self.experts)
                       for s in ("gate_up_proj", "down_proj")}
        if None in ms_names.values() or None in torch_names.values():
            return None
        return RoutedExperts(self.experts, torch_names, ms_names,  # type: ignore[arg-type]
                             piece.prefix, f"decoder.layers.{piece.index}")

    def torch_experts(self, model: Any, piece: Piece, new: Any = None) -> Any:
        """transformers' routed experts module of the piece's layer; ``new``: put in its
        place (the one taken out is returned)."""
        mlp = model.model.layers[piece.slot].mlp
        old = mlp.experts
        if new is not None:
            mlp.experts = new
        return old

    def ms_routed(self, piece: Piece, tensors: dict[str, Any], tokens: int
                  ) -> tuple[Any, Any]:
        """The piece's layer cell in a network whose routed experts are a
        :class:`_RoutedStandIn`, its other tensors set (float32): (the cell, the stand-in)."""
        if self._standins is None:
            raise RuntimeError("ParallelCoreBlocks.ms_routed() outside session()")
        self._keep(lambda k: isinstance(k, tuple))  # a dense layer's weights go
        _, params, cells = self._network(None, routed=tokens)
        release(params[n] for n in tensors if n in params)
        set_parameters(params, tensors, self._shapes[("routed", tokens)])
        return cells[f"layer{piece.slot}"], cells[f"standin{piece.slot}"]

    def ms_group(self, size: int, tensors: dict[str, np.ndarray]) -> Any:
        """MindFormers' routed experts (``FFNGroupedGEMM``) built for ``size`` experts,
        built once per size, holding a group's tensors (``weight1`` / ``weight2``:
        float32, the group's rows): called ``(tokens [1, N, H], coefficients [1, N, k],
        expert indices [1, N, k])``."""
        if size not in self._groups:
            import copy

            if self._experts is None:
                raise RuntimeError("ParallelCoreBlocks.ms_group() before ms_routed()")
            experts = self._experts
            config = copy.copy(experts.config)
            config.num_moe_experts = size
            try:
                cell = type(experts)(config)
            except _MINDSPORE_ERRORS as exc:
                raise ForwardUnavailable.of(exc) from None
            cell.set_train(False)
            self._groups[size] = cell, {"weight1": cell.weight1, "weight2": cell.weight2}
            self._shapes[("group", size)] = {n: tuple(p.shape)
                                             for n, p in self._groups[size][1].items()}
        cell, own = self._groups[size]
        release(own.values())
        set_parameters(own, tensors, self._shapes[("group", size)])
        return cell

    def notes(self) -> list[str]:
        """What the report says of how the MindSpore side ran."""
        return [f"MindSpore ran in GRAPH mode with CPU stand-ins for what has no CPU kernel "
                f"({len(self._ran)}): " + "; ".join(self._ran),
                "layers inside a block not recorded: GRAPH mode runs no cell hooks; each "
                "block's output is compared, and the tensors one by one", *self.not_run]


def qwen3_blocks(config: dict[str, Any], build_torch: Any, *, seq_length: int = 16,
                 family: str = QWEN3, use_interleaved_weight_layout_mlp: bool = True) -> Any:
    """The network's blocks, for verify one block at a time (:class:`ParallelCoreBlocks`):
    every decoder layer of one kind, run as the one layer of the small networks, built
    in the checkpoint's ``linear_fc1`` layout."""
    sizes = qwen3_sizes(config, family)
    # qwen3_moe takes no such option (no dense MLP): the default is left unsaid
    layout = {} if use_interleaved_weight_layout_mlp else {INTERLEAVED: False}
    return ParallelCoreBlocks(config, build_torch, BlockShape(
        family, sizes.layers, sizes.tied, seq_length, options=layout, build_options=layout,
        experts=sizes.experts, topk=int(config.get("num_experts_per_tok") or 0)))


def qwen3_moe_blocks(config: dict[str, Any], build_torch: Any, *, seq_length: int = 16) -> Any:
    """:func:`qwen3_blocks` for ``mindformers:qwen3_moe``."""
    return qwen3_blocks(config, build_torch, seq_length=seq_length, family=QWEN3_MOE)


def deepseek_blocks(config: dict[str, Any], build_torch: Any, *, seq_length: int = 16,
                    mla_qkv_concat: bool = True, mtp: bool | None = None,
                    use_interleaved_weight_layout_mlp: bool = True) -> Any:
    """``mindformers:deepseek3``'s (and ``deepseek32``'s) blocks: its first
    ``first_k_dense_replace`` layers are dense, the rest mixtures of experts, so the small
    networks hold one of each (two layers, the first dense) and each layer runs as the one
    of its kind. They are built in the checkpoint's ``mla_qkv_concat`` layout and without
    the MTP layer, which gives no logits (its tensors are proven one by one)."""
    sizes = deepseek_sizes(config, mtp=mtp)
    kinds = min(sizes.dense, 1) + (sizes.layers > sizes.dense)
    slots = tuple(0 if i < sizes.dense else kinds - 1 for i in range(sizes.layers))
    small = {"num_hidden_layers": kinds, "first_k_dense_replace": min(sizes.dense, 1),
             "num_nextn_predict_layers": 0}
    if "mlp_layer_types" in config:  # transformers 5's per-layer list (DeepSeek-V3.2)
        small["mlp_layer_types"] = (["dense"] * min(sizes.dense, 1)
                                    + ["sparse"] * (sizes.layers > sizes.dense))
    interleaved = {INTERLEAVED: use_interleaved_weight_layout_mlp}
    options = {"mla_qkv_concat": mla_qkv_concat, **({} if mtp is None else {"mtp": mtp}),
               **interleaved}
    not_run = () if not sizes.mtp else (
        f"the Multi-Token Prediction layer{'s' if sizes.mtp > 1 else ''} "
        f"(the Hub's model.layers.{sizes.layers}{'…' if sizes.mtp > 1 else ''}, MindFormers' "
        "mtp.*) "
        "not run: it gives only a training loss, never the logits; its tensors are "
        "compared one by one",)
    return ParallelCoreBlocks(config, build_torch, BlockShape(
        sizes.family, sizes.layers, False, seq_length, slots=slots, small=small, options=options,
        build_options={"mla_qkv_concat": mla_qkv_concat, "mtp": False, **interleaved},
        not_run=not_run, experts=sizes.experts,
        topk=int(config.get("num_experts_per_tok") or 0)))


__all__ = ["MS_LOCAL", "BlockShape", "ParallelCoreBlocks", "deepseek_blocks", "qwen3_blocks",
           "qwen3_moe_blocks", "release"]
