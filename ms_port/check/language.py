"""verify for language models: both networks from the model's ``config.json``.

Given a Hugging Face model directory (or a file beside its config) and no
``--torch-model``, the PyTorch reference is built with ``transformers`` from that config
(no download; eager attention, float32, no KV cache), and a known MindSpore family
(``mindformers:llama``) is built from the same config. Inputs default to token ids drawn
uniformly from the vocabulary.
"""

from __future__ import annotations

from typing import Any

from ..errors import TargetError

#: generated token sequences are this long unless --input-shape says otherwise
DEFAULT_TOKENS = 16
#: the most layers a config may ask to build (the largest published LLaMA has 126)
MAX_LAYERS = 1024


def is_language_model(config: dict[str, Any] | None) -> bool:
    """A Hugging Face causal LM config (``architectures``: ``*ForCausalLM``, GPT-2's
    ``*LMHeadModel``)."""
    archs = (config or {}).get("architectures") or []
    return isinstance(archs, list) and any(isinstance(a, str)
                                           and a.endswith(("ForCausalLM", "LMHeadModel"))
                                           for a in archs) and "vocab_size" in config


def torch_from_config(config: dict[str, Any], where: str) -> Any:
    """transformers' model for this config, float32, eager attention, no cache."""
    try:
        import torch
        import transformers
    except ImportError:
        raise TargetError("building the PyTorch side from config.json needs transformers: "
                          "pip install transformers (or pass --torch-model)") from None
    layers = config.get("num_hidden_layers", config.get("n_layer", 1))
    if not isinstance(layers, int) or isinstance(layers, bool) or not 0 < layers <= MAX_LAYERS:
        raise TargetError(f"{where}: num_hidden_layers is {str(layers)[:40]!r}; expected a "
                          f"positive integer of at most {MAX_LAYERS}")
    try:  # transformers' own validation raises its own exception types
        cfg = transformers.AutoConfig.for_model(**config)
    except Exception as exc:
        raise TargetError(f"{where}: transformers cannot read this config "
                          f"({type(exc).__name__}: {str(exc)[:200]}); fix it or pass "
                          "--torch-model") from None
    cfg.use_cache = False
    try:  # eager attention and experts: the reference loops, which also run in float64
        model = transformers.AutoModelForCausalLM.from_config(
            cfg, attn_implementation="eager", experts_implementation="eager",
            dtype=torch.float32)
    except Exception as exc:
        raise TargetError(f"{where}: transformers cannot build {cfg.model_type!r} "
                          f"({type(exc).__name__}: {str(exc)[:200]}); pass --torch-model"
                          ) from None
    return model.eval()


def check_size(config: dict[str, Any], where: str, elements: int) -> None:
    """Refuse a config describing a model far larger than its checkpoint, before building
    it for real: memory follows the file, not what a config.json says."""
    import torch

    with torch.device("meta"):
        model = torch_from_config(config, where)
    wanted = sum(p.numel() for p in model.parameters())
    if wanted > 2 * elements + 1_000_000:
        raise TargetError(f"{where}: the config describes {wanted:,} parameters, the "
                          f"checkpoint holds {elements:,}; this config is not the "
                          "checkpoint's — check it")


def token_defaults(config: dict[str, Any], where: str = "config.json"
                   ) -> tuple[list[tuple[int, ...]], list[str], list[tuple[int, int]]]:
    """(shapes, dtypes, ranges) of one generated token sequence; ``where`` names the config
    file in errors."""
    vocab = config.get("vocab_size")
    if not isinstance(vocab, int) or isinstance(vocab, bool) or not 0 < vocab <= 2**31:
        raise TargetError(f"{where}: vocab_size is {str(vocab)[:40]!r}; token inputs need "
                          "a positive integer (or pass --input)")
    return [(DEFAULT_TOKENS,)], ["int64"], [(0, vocab)]


def family_builder(spec: str, config: dict[str, Any], options: dict[str, Any] | None,
                   seq_length: int) -> Any:
    """A factory for a known family's real network, sized for ``seq_length`` tokens."""
    from ..read.targets import family_module, family_options

    opts = family_options(spec, options)
    opts.setdefault("seq_length", seq_length)
    module = family_module(spec)

    def build() -> Any:
        return module.build(config, **opts)

    build.__name__ = spec
    return build


__all__ = ["DEFAULT_TOKENS", "MAX_LAYERS", "check_size", "family_builder",
           "is_language_model", "token_defaults", "torch_from_config"]
