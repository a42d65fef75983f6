"""``mindformers:llama`` block by block: the pieces verify builds one at a time.

A LLaMA-shaped network is an embedding, N decoder layers and a head (final norm and LM
head). Each side is built once with a single decoder layer and no weights (PyTorch on the
meta device, MindSpore under ``no_init_parameters``); for each piece only that piece's
tensors are put in, read from the files, and taken out again after it ran. Every decoder
layer runs as layer 0 of that one-layer network; :class:`Piece` renames what it records
back to the layer's own name.

This module knows LLaMA's blocks and nothing of the verdict
(:mod:`ms_port.check.blocks` drives it). A family of another structure gives its own
pieces and steps with the same five methods.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ...errors import TargetError
from ..experts import stack_experts
from .family import llama_config, llama_sizes

#: the decoder layer every layer runs as
LOCAL = "model.layers.0"


@dataclass(frozen=True)
class Piece:
    """One block: its name, and which tensors it takes on each side.

    Attributes:
        name: ``embedding``, ``model.layers.17`` or ``head``.
        kind: ``embedding``, ``layer`` or ``head``.
        torch: the PyTorch network's parameter name -> the source tensor filling it.
        ms: the MindSpore network's parameter name -> the checkpoint tensor filling it.
        prefix: the layer's own name prefix (``model.layers.17``), recorded as the layer
            of the small network that runs it (``model.layers.{slot}``).
        slot: which decoder layer of the small network runs this one (0; a family whose
            layers are of two kinds, DeepSeek-V3's dense and mixture-of-experts, builds
            one of each).
    """

    name: str
    kind: str
    torch: dict[str, str]
    ms: dict[str, str]
    prefix: str | None = None
    index: int = 0
    #: the layers whose outputs are the block's own, PyTorch's and MindSpore's: compared
    #: where the MindSpore side records no layers (GRAPH mode); None where it does
    outputs: tuple[str, str] | None = None
    #: the block rounds nothing (an embedding lookup): its float32 output is its float64
    #: one, so no float64 pass is run for its noise
    exact: bool = False
    slot: int = 0
    #: the piece's tensors (local names, either side) whose rows are the vocabulary: verify
    #: reads, builds and runs them a span of rows at a time where they outgrow a layer
    rows: tuple[str, ...] = ()
    #: the layers whose outputs run over the vocabulary (the LM head): a span's outputs
    #: are its columns of the whole one
    wide: tuple[str, ...] = ()
    #: the vocabulary the piece's networks are built with: a span's rows (None: the
    #: config's)
    vocab: int | None = None

    def rename(self, path: str) -> str:
        """A recorded layer path under its real name (``model.layers.0.x`` -> ``…17.x``)."""
        local = f"model.layers.{self.slot}"
        if self.prefix and (path == local or path.startswith(local + ".")):
            return self.prefix + path[len(local):]
        return path


def vocab_of(piece: Piece) -> dict[str, Any]:
    """The config keys that build a piece's networks for its span of the vocabulary: the
    span's rows, and no padding, start or end id (an id past the span would not fit an
    embedding, and transformers warns of each; none of them changes a forward's values
    here)."""
    if piece.vocab is None:
        return {}
    return {"vocab_size": piece.vocab, "pad_token_id": None, "bos_token_id": None,
            "eos_token_id": None}


class HuggingFaceSide:
    """The PyTorch side of a Hugging Face causal LM's blocks: transformers' own network
    built from the config with one decoder layer, and one step of it (a family's blocks
    add ``pieces``, ``ms_network`` and ``ms_step``)."""

    def __init__(self, config: dict[str, Any], build_torch: Callable[[dict[str, Any]], Any]
                 ) -> None:
        """``build_torch(config)``: transformers' network for a config (float32, eager
        attention), called on the meta device."""
        self.config = config
        self.build_torch = build_torch
        #: config keys of the small network beyond its one decoder layer
        self.small: dict[str, Any] = {"num_hidden_layers": 1}
        self._rotary: Any = None

    # --- PyTorch ----------------------------------------------------------------------
    def torch_network(self, piece: Piece, tensors: dict[str, Any]) -> Any:
        """transformers' network with one decoder layer (``small``), on the meta device
        but for the piece's tensors (float32)."""
        import torch

        one = {**self.config, **self.small, **vocab_of(piece)}
        kinds = self.config.get("layer_types")
        if isinstance(kinds, list) and len(kinds) > piece.index:  # this layer's own kind
            one["layer_types"] = [kinds[piece.index]] * int(one["num_hidden_layers"])
        with torch.device("meta"):
            model = self.build_torch(one)
        # every name of a tied parameter (a tied head is the embedding under its own name),
        # and the buffers a checkpoint holds (DeepSeek-V3's e_score_correction_bias; not
        # the rotary inv_freq, which transformers does not save)
        own = dict(model.named_parameters(remove_duplicate=False))
        own.update((k, v) for k, v in model.state_dict(keep_vars=True).items() if k not in own)
        # a transformers 5 mixture of experts holds its experts stacked: the file's
        # per-expert tensors are stacked into them
        stack_experts(tensors, own)
        state = {k: v for k, v in tensors.items() if k in own}  # not inv_freq buffers
        model.load_state_dict(state, strict=False, assign=True)
        if self._rotary is None:  # computed once, on the CPU (its buffers are not weights)
            self._rotary = type(model.model.rotary_emb)(config=model.config)
        return model

    def torch_step(self, model: Any, piece: Piece, state: Any, ids: np.ndarray) -> Any:
        """One piece's forward: token ids -> hidden states -> … -> logits."""
        import torch

        with torch.no_grad():
            if piece.kind == "embedding":
                return model.model.embed_tokens(torch.as_tensor(ids))
            if piece.kind == "head":
                return model.lm_head(model.model.norm(state))
            length = state.shape[1]
            positions = torch.arange(length)[None]
            cos, sin = self._rotary(state, positions)
            # transformers' eager attention adds the mask; causal, nothing else masked
            mask = torch.full((length, length), torch.finfo(state.dtype).min,
                              dtype=state.dtype).triu(1)[None, None]
            return model.model.layers[piece.slot](
                state, attention_mask=mask, position_ids=positions,
                position_embeddings=(cos, sin))

class BuiltOnce:
    """A family's small MindSpore networks, each built once (per span of the vocabulary:
    ``piece.vocab``) and given each piece's tensors in turn. Building MindFormers' network
    took 0.05-0.4 s a piece; the parameters' shapes are kept, as :func:`let_go` leaves
    them placeholders between pieces."""

    def __init__(self) -> None:
        self._nets: dict[int | None, tuple[Any, dict[str, Any], dict[str, tuple[int, ...]]]] = {}

    def load(self, piece: Piece, build: Callable[[], Any], tensors: dict[str, Any]) -> Any:
        """The network for ``piece`` (``build()`` the first time, without weights), holding
        ``tensors`` (:func:`set_parameters`; emptied as they are set)."""
        from ...read.targets import without_weights

        if piece.vocab not in self._nets:
            net = without_weights(build)
            net.set_train(False)
            params = {p.name: p for p in net.get_parameters()}
            self._nets[piece.vocab] = net, params, {n: tuple(p.shape) for n, p in params.items()}
        net, params, shapes = self._nets[piece.vocab]
        set_parameters(params, tensors, shapes)
        return net


class LlamaBlocks(HuggingFaceSide):
    """The pieces of a Hugging Face LLaMA / Mistral / Qwen2 and of MindFormers'
    ``LlamaForCausalLM`` built from the same config, and one step of each."""

    family = "mindformers:llama"
    #: each row of a batch is computed on its own, and every layer of transformers'
    #: network has the batch (or its tokens, batch first) on its outputs' first axis:
    #: verify may run two inputs stacked in one pass over the weights
    stacks = True
    #: MindSpore (PyNative) holds none of a block's arrays once ``ms_done`` gave its
    #: parameters placeholders: verify may cut every block's arrays from one slab
    lets_go = True

    def __init__(self, config: dict[str, Any], build_torch: Callable[[dict[str, Any]], Any], *,
                 qkv_concat: bool = False, seq_length: int = 16) -> None:
        """``build_torch(config)``: transformers' network for a config (float32, eager
        attention), called on the meta device."""
        super().__init__(config, build_torch)
        self.sizes = llama_sizes(config)
        self.qkv_concat = qkv_concat
        self.seq_length = seq_length
        self.options = {"qkv_concat": True} if qkv_concat else {}
        self.built = BuiltOnce()

    # --- the pieces -------------------------------------------------------------------
    def pieces(self, source_names: set[str], checkpoint_names: set[str]) -> list[Piece]:
        """Embedding, every decoder layer, head; each with the names it takes."""
        def under(names: set[str], prefix: str, local: str) -> dict[str, str]:
            return {local + n[len(prefix):]: n for n in sorted(names)
                    if n.startswith(prefix + ".")}

        tied = self.sizes.tied
        embedding = "model.tok_embeddings.embedding_weight"
        found = [Piece("embedding", "embedding",
                       {"model.embed_tokens.weight": "model.embed_tokens.weight"},
                       {embedding: embedding}, exact=True,
                       rows=("model.embed_tokens.weight", embedding))]
        for i in range(self.sizes.layers):
            prefix = f"model.layers.{i}"
            found.append(Piece(prefix, "layer", under(source_names, prefix, LOCAL),
                               under(checkpoint_names, prefix, LOCAL), prefix, i))
        head_src = ("model.embed_tokens.weight" if tied or "lm_head.weight" not in source_names
                    else "lm_head.weight")
        head_ms = embedding if tied else "lm_head.weight"
        found.append(Piece(
            "head", "head", {"model.norm.weight": "model.norm.weight", "lm_head.weight": head_src},
            {"model.norm_out.weight": "model.norm_out.weight", head_ms: head_ms},
            rows=("lm_head.weight", head_ms), wide=("lm_head",)))
        return found

    # --- MindSpore --------------------------------------------------------------------
    def ms_network(self, piece: Piece, tensors: dict[str, Any]) -> Any:
        """MindFormers' network with one decoder layer, built without weights once per
        span of the vocabulary (:class:`BuiltOnce`), holding the piece's tensors
        (float32); ``tensors`` is emptied as they are loaded."""
        from .family import contained

        def build() -> Any:
            one = {**self.config, "num_hidden_layers": 1, **vocab_of(piece)}
            cfg = llama_config(one, qkv_concat=self.qkv_concat, seq_length=self.seq_length)
            with contained():
                from mindformers.models.llama import LlamaForCausalLM

                return LlamaForCausalLM(cfg)

        return self.built.load(piece, build, tensors)

    def ms_done(self, net: Any) -> None:
        """A piece done: its weights go (the network stays for the next piece)."""
        let_go(net)

    def ms_step(self, net: Any, piece: Piece, state: Any, ids: np.ndarray) -> Any:
        import mindspore as ms

        tokens = ms.Tensor(np.asarray(ids))
        model = net.model
        if piece.kind == "embedding":
            h = model.tok_embeddings(tokens).astype(ms.float32)
            return h.reshape(ids.shape[0], ids.shape[1], -1)
        if piece.kind == "head":
            return net.lm_head(model.norm_out(state)).astype(ms.float32)
        freqs = model.freqs_mgr(ids.shape[1])
        return model.layers[0](state, freqs, model.casual_mask(tokens))


def set_parameters(own: dict[str, Any], tensors: dict[str, Any],
                   shapes: dict[str, tuple[int, ...]] | None = None) -> None:
    """Set each of ``tensors`` into its parameter in ``own`` (name -> MindSpore
    Parameter, its dtype kept), each checked against it (against ``shapes[name]`` where
    given: the shape the network was built with, where its data was let go since);
    ``tensors`` is emptied one tensor at a time, each array let go once set."""
    for name in list(tensors):
        array = tensors.pop(name)
        param = own.get(name)
        want = None if param is None else (shapes or {}).get(name, tuple(param.shape))
        if param is None or want != array.shape:
            has = want if param is not None else "no such parameter"
            raise TargetError(f"{name} {array.shape} does not fit MindFormers' network "
                              f"({has}); convert again")
        param.set_data(_tensor_of(array, param.dtype))


def _tensor_of(array: Any, dtype: Any) -> Any:
    """``array`` as a MindSpore tensor of ``dtype``: sharing its memory where it is a
    writable array of that dtype (``Tensor.from_numpy``; MindSpore keeps the array alive),
    else a copy. A copy took 0.69 s of a Mistral-7B layer's 0.74 s build, 19 s a verify."""
    import mindspore as ms

    if isinstance(array, np.ndarray) and array.flags.writeable and array.flags.c_contiguous:
        try:
            shared = ms.Tensor.from_numpy(array)
        except (TypeError, ValueError):  # a dtype MindSpore cannot share: copied below
            shared = None
        if shared is not None and shared.dtype == dtype:
            return shared
    return ms.Tensor(array, dtype=dtype)


def release(params: Iterable[Any]) -> None:
    """Hand back the memory of ``params``' data: each is given a one-element placeholder.

    MindSpore keeps a network's parameters' data alive after the network itself is gone,
    and a parameter's old data after new data is set: in GRAPH mode until the graph runs
    again (measured: a 1 GiB parameter, its network deleted and collected, stayed
    resident; ``mindspore.runtime.empty_cache`` and ``ms_memory_recycle`` did not free
    it; setting a placeholder did), and in PyNative the last vocabulary span's and each
    decoder layer's weights until the next network replaced them (Llama-3-70B's widths:
    0.75-1.5 GiB held through the next block). At DeepSeek-V3's widths the dense layer's
    weights and the vocabulary spans' were held so while the MoE layer ran."""
    import mindspore as ms

    for param in params:
        if tuple(param.shape) != (1,) * len(param.shape):
            # (cast by MindSpore: its dtype_to_nptype logs a deprecation on every call)
            param.set_data(ms.Tensor(np.zeros((1,) * len(param.shape), np.float32),
                                     dtype=param.dtype))


def let_go(net: Any) -> None:
    """A block done with its MindSpore network: the parameters' data handed back
    (:func:`release`); the next block sets its own (:class:`BuiltOnce`)."""
    release(net.get_parameters())


def llama_blocks(config: dict[str, Any], build_torch: Any, *, qkv_concat: bool = False,
                 seq_length: int = 128) -> Any:
    """The network's blocks, for verify one block at a time
    (:class:`~ms_port.archs.llama.blocks.LlamaBlocks`)."""
    return LlamaBlocks(config, build_torch, qkv_concat=qkv_concat, seq_length=seq_length)


__all__ = ["LOCAL", "BuiltOnce", "HuggingFaceSide", "LlamaBlocks", "Piece", "let_go",
           "llama_blocks", "release", "set_parameters", "vocab_of"]
