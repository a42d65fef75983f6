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
    try:
        cfg = transformers.AutoConfig.for_model(**config)
    except (ValueError, KeyError, TypeError) as exc:
        raise TargetError(f"{where}: transformers cannot read this config ({exc}); pass "
                          "--torch-model") from None
    cfg.use_cache = False
    try:
        model = transformers.AutoModelForCausalLM.from_config(
            cfg, attn_implementation="eager", dtype=torch.float32)
    except (ValueError, KeyError, TypeError, ImportError) as exc:
        raise TargetError(f"{where}: transformers cannot build {cfg.model_type!r} ({exc}); "
                          "pass --torch-model") from None
    return model.eval()


def token_defaults(config: dict[str, Any]) -> tuple[list[tuple[int, ...]], list[str],
                                                   list[tuple[int, int]]]:
    """(shapes, dtypes, ranges) of one generated token sequence."""
    return [(DEFAULT_TOKENS,)], ["int64"], [(0, int(config["vocab_size"]))]


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


__all__ = ["DEFAULT_TOKENS", "family_builder", "is_language_model", "token_defaults",
           "torch_from_config"]
