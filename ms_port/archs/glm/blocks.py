"""``mindformers:glm4`` block by block: the pieces verify builds one at a time.

GLM-4 is an embedding, N decoder layers and a head (final norm and output layer) on both
sides: transformers' ``GlmForCausalLM`` (the PyTorch side, :class:`HuggingFaceSide`) and
MindFormers' ``ChatGLM2ForConditionalGeneration`` with its CPU stand-ins
(:func:`~ms_port.archs.glm.family.build_from`). Each is built once with one decoder layer and no
weights; each piece's tensors are put in, run and taken out again, as for LLaMA
(:mod:`ms_port.archs.llama.blocks`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ...errors import TargetError
from ..llama.blocks import LOCAL, BuiltOnce, HuggingFaceSide, Piece, let_go, vocab_of
from .family import glm_config, glm_sizes

#: the MindSpore decoder layer every layer runs as
MS_LOCAL = "transformer.encoder.layers.0"


@dataclass(frozen=True)
class GlmPiece(Piece):
    """A piece whose MindSpore layer is recorded under MindFormers' own prefix."""

    ms_prefix: str | None = None

    def rename(self, path: str) -> str:
        if self.ms_prefix and (path == MS_LOCAL or path.startswith(MS_LOCAL + ".")):
            return self.ms_prefix + path[len(MS_LOCAL):]
        return super().rename(path)


class GlmBlocks(HuggingFaceSide):
    """The pieces of a GLM-4 and of MindFormers' ChatGLM2 built from the same config."""

    family = "mindformers:glm4"
    #: each row of a batch is computed on its own, and every layer of transformers'
    #: network has the batch (or its tokens, batch first) on its outputs' first axis:
    #: verify may run two inputs stacked in one pass over the weights
    stacks = True
    #: MindSpore (PyNative) holds none of a block's arrays once ``ms_done`` gave its
    #: parameters placeholders: verify may cut every block's arrays from one slab
    lets_go = True

    def __init__(self, config: dict[str, Any], build_torch: Callable[[dict[str, Any]], Any], *,
                 seq_length: int = 16, **layouts: Any) -> None:
        super().__init__(config, build_torch)
        self.sizes = glm_sizes(config)
        if self.sizes.layout != "hf":
            raise TargetError("GlmBlocks builds the PyTorch side with transformers' glm "
                              "class, from an -hf config; verify hands it a remote-code "
                              "source in that view (archs/glm_remote.as_hf)")
        self.layouts = layouts  # glm_config's settings (archs.glm.OPTIONS)
        self.seq_length = seq_length
        self.options = dict(self.layouts)
        self.standins: list[str] = []
        self.built = BuiltOnce()

    def pieces(self, source_names: set[str], checkpoint_names: set[str]) -> list[Piece]:
        def under(names: set[str], prefix: str, local: str) -> dict[str, str]:
            return {local + n[len(prefix):]: n for n in sorted(names)
                    if n.startswith(prefix + ".")}

        embedding, output = "transformer.embedding.embedding_weight", \
            "transformer.output_layer.weight"
        found: list[Piece] = [GlmPiece(
            "embedding", "embedding", {"model.embed_tokens.weight": "model.embed_tokens.weight"},
            {embedding: embedding}, exact=True, rows=("model.embed_tokens.weight", embedding))]
        for i in range(self.sizes.layers):
            torch_prefix, ms_prefix = f"model.layers.{i}", f"transformer.encoder.layers.{i}"
            found.append(GlmPiece(torch_prefix, "layer",
                                  under(source_names, torch_prefix, LOCAL),
                                  under(checkpoint_names, ms_prefix, MS_LOCAL), torch_prefix,
                                  i, ms_prefix=ms_prefix))
        head = ("model.embed_tokens.weight" if "lm_head.weight" not in source_names
                else "lm_head.weight")
        found.append(GlmPiece(
            "head", "head", {"model.norm.weight": "model.norm.weight", "lm_head.weight": head},
            {"transformer.encoder.final_layernorm.weight":
             "transformer.encoder.final_layernorm.weight", output: output},
            rows=("lm_head.weight", output), wide=("lm_head", "transformer.output_layer")))
        return found

    def ms_network(self, piece: Piece, tensors: dict[str, Any]) -> Any:
        """ChatGLM2 with one decoder layer and the CPU stand-ins, built without weights
        once per span of the vocabulary (:class:`~ms_port.archs.llama.blocks.BuiltOnce`),
        holding the piece's tensors (float32); ``tensors`` is emptied as they load."""
        from .family import build_from

        def build() -> Any:
            one = {**self.config, "num_hidden_layers": 1, "num_layers": 1, **vocab_of(piece)}
            return build_from(glm_config(one, seq_length=self.seq_length, **self.layouts))

        net = self.built.load(piece, build, tensors)
        self.standins = net.ms_port_notes
        return net

    def ms_done(self, net: Any) -> None:
        """A piece done: its weights go (the network stays for the next piece)."""
        let_go(net)

    def ms_step(self, net: Any, piece: Piece, state: Any, ids: np.ndarray) -> Any:
        import mindspore as ms

        model = net.transformer
        if piece.kind == "embedding":
            return model.embedding(ms.Tensor(np.asarray(ids, dtype=np.int32))).astype(
                ms.float32)
        if piece.kind == "head":
            return model.output_layer(model.encoder.final_layernorm(state)).astype(ms.float32)
        length = ids.shape[1]
        mask = model.get_masks(ids.shape[0], length).astype(ms.uint8)
        return model.encoder.layers[0](state, mask, model.freqs_mgr(length))

    def notes(self) -> list[str]:
        return list(self.standins)


def glm_blocks(config: dict[str, Any], build_torch: Any, *, seq_length: int = 128,
               **settings: Any) -> Any:
    """The network's blocks, for verify one block at a time (:class:`GlmBlocks`);
    ``settings``: the network's (``archs.glm.OPTIONS``)."""
    return GlmBlocks(config, build_torch, seq_length=seq_length, **settings)


__all__ = ["GlmBlocks", "GlmPiece", "glm_blocks"]
