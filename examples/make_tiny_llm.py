"""Write a seeded tiny Hugging Face causal LM directory (no download), for trying the LLM path.

    python examples/make_tiny_llm.py demo/tiny-qwen2 [--kind llama|mistral|qwen2] [--tied]
                                     [--dtype float32|bfloat16]

GQA (8 heads, 2 KV heads), hidden 64, 2 layers, vocab 128; norms and biases moved off
their defaults so a swapped tensor shows in the logits.
"""

from __future__ import annotations

import argparse

from ms_port.testing import tiny_hf_lm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output")
    parser.add_argument("--kind", choices=["llama", "mistral", "qwen2"], default="qwen2")
    parser.add_argument("--tied", action="store_true", help="tie the LM head to the embedding")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    args = parser.parse_args()
    path = tiny_hf_lm(args.kind, args.output, tied=args.tied, dtype=args.dtype)
    print(f"wrote {path} ({args.kind}, {args.dtype}{', tied' if args.tied else ''})")


if __name__ == "__main__":
    main()
