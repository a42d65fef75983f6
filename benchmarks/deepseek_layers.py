"""Verify by layers at DeepSeek-V3's widths: one dense layer and one mixture-of-experts
layer of ``--experts`` routed experts (64 by default; the Hub model has 256), with the
embedding, the head and the shared expert.

    python benchmarks/deepseek_layers.py [--experts 64] [--runs 1] [--baseline COMMIT]

Setup (untimed, cached under ``benchmarks/.cache/deepseek-layers/``): the Hugging Face
directory (seeded bfloat16, the Hub's names and per-expert keys, its config cut to two
layers) and its conversion into ``mindformers:deepseek3``. Then ``ms-port verify --mode
layers`` of it runs as a fresh process through ``_launch.py`` (wall, peak RSS) ``--runs``
times, beside the baseline's where given; the verdict and the logits' error of each run
are recorded.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import inputs  # noqa: E402
from cluster import verify_side_by_side  # noqa: E402

CACHE = HERE / ".cache" / "deepseek-layers"
PY = sys.executable
VOCAB = 129280


def model(folder: Path, experts: int) -> Path:
    """The directory (made once): config.json and one bfloat16 safetensors file."""
    if (folder / "config.json").exists():
        return folder
    import numpy as np

    cut = {**inputs.FP8_CONFIG, "n_routed_experts": experts, "num_hidden_layers": 2}
    saved = dict(inputs.FP8_CONFIG)
    inputs.FP8_CONFIG.update(cut)
    try:
        layers = [(name, shape) for name, shape, _ in inputs.fp8_weights()]
        config = inputs.fp8_config()
    finally:
        inputs.FP8_CONFIG.clear()
        inputs.FP8_CONFIG.update(saved)
    config.pop("quantization_config")
    config["num_nextn_predict_layers"] = 0  # no MTP layer written
    h = cut["hidden_size"]
    shapes = [("model.embed_tokens.weight", (VOCAB, h)), *layers,
              ("model.norm.weight", (h,)), ("lm_head.weight", (VOCAB, h))]
    folder.mkdir(parents=True, exist_ok=True)
    inputs._write_bf16(folder / "model.safetensors", shapes, np.random.default_rng(11))
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--baseline", metavar="COMMIT",
                    help="also verify with ms-port at COMMIT (a git worktree), side by side")
    args = ap.parse_args()
    root = CACHE / f"{args.experts}e"
    src = model(root / "hf", args.experts)
    out = root / "m.ckpt"
    ms = str(Path(PY).parent / "ms-port")
    if not out.exists():
        subprocess.run([ms, "convert", str(src), "--ms-model", "mindformers:deepseek3", "-o",
                        str(out), "-q"], check=True)
    verify = ["verify", str(src), str(out), "--ms-model", "mindformers:deepseek3", "--mode",
              "layers", "--json"]
    row = {"case": f"deepseek-v3-widths-2-layers-{args.experts}-experts-verify-layers",
           "model_bytes": (src / "model.safetensors").stat().st_size, "runs": args.runs,
           "tools": verify_side_by_side(verify, [src, out], args.runs, args.baseline)}
    print(json.dumps(row, indent=2))


if __name__ == "__main__":
    main()
