"""A state dict holding transformers 5's stacked experts, at Qwen3-30B-A3B's widths:
convert into MindFormers beside ``cp`` + ``fsync``, and beside an earlier commit's convert.

    python benchmarks/stacked_experts.py                       # 2 layers, 3 runs
    python benchmarks/stacked_experts.py --runs 1 --baseline 2706d67
    python benchmarks/stacked_experts.py --verify --runs 1 --baseline cd15a58

``torch.save(model.state_dict())`` of transformers 5's Qwen3-MoE (and ``save_file`` of the
same) writes each layer's experts as they are held in memory: ``mlp.experts.gate_up_proj``
``[128, 1536, 2048]`` and ``mlp.experts.down_proj [128, 2048, 768]``, 805 and 403 MB in
bfloat16, where the Hub's files keep one tensor per expert. Setup (untimed, cached under
``benchmarks/.cache/stacked-experts/``): one seeded bfloat16 safetensors file of 2 such
layers, the embedding and the head (3.7 GB). Each contender runs as a fresh process
through ``_launch.py`` (its wall and peak RSS) with warm inputs; each output is flushed and
dropped from the cache after its run.

``--verify``: the conversion is written once (untimed) and ``verify --mode layers`` of it
is measured instead (wall, peak RSS, the verdict), beside the baseline's where given: the
routed experts a group at a time against the whole layer.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from cluster import measure, settle, verify_side_by_side, warm  # noqa: E402
from glm4 import worktree  # noqa: E402
from inputs import QWEN3_MOE_SIZES, _write_bf16, qwen3_moe_config, qwen3_moe_layer  # noqa: E402

CACHE = HERE / ".cache" / "stacked-experts"
PY = sys.executable


def stacked_model(folder: Path, layers: int) -> Path:
    """The directory (made once): config.json and one safetensors file, experts stacked."""
    if (folder / "config.json").exists():
        return folder
    import numpy as np

    widths = QWEN3_MOE_SIZES["30b-a3b"]
    h, e, f = widths["hidden_size"], widths["num_experts"], widths["moe_intermediate_size"]
    shapes = [("model.embed_tokens.weight", (widths["vocab_size"], h))]
    for i in range(layers):
        p = f"model.layers.{i}.mlp.experts"
        shapes += [s for s in qwen3_moe_layer(widths, i) if ".experts." not in s[0]]
        shapes += [(f"{p}.gate_up_proj", (e, 2 * f, h)), (f"{p}.down_proj", (e, h, f))]
    shapes += [("model.norm.weight", (h,)), ("lm_head.weight", (widths["vocab_size"], h))]
    folder.mkdir(parents=True, exist_ok=True)
    _write_bf16(folder / "model.safetensors", shapes, np.random.default_rng(7))
    config = {**qwen3_moe_config(f"{layers}l"), "transformers_version": "5.0.0"}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--baseline", metavar="COMMIT",
                    help="also convert with ms-port at COMMIT (a git worktree), side by side")
    ap.add_argument("--verify", action="store_true",
                    help="measure verify --mode layers of the conversion instead of convert")
    args = ap.parse_args()
    if args.verify:
        verify_main(args)
        return
    root = CACHE / f"{args.layers}l"
    src = stacked_model(root / "hf", args.layers)
    st = src / "model.safetensors"
    out, copy = root / "out.ckpt", root / "copy.safetensors"
    ms = str(Path(PY).parent / "ms-port")
    convert = ["convert", str(src), "--ms-model", "mindformers:qwen3_moe", "-o", str(out),
               "--force", "-q"]
    tools = {
        "cp + fsync": ["/bin/sh", "-c", 'cp "$1" "$2" && sync "$2"', "sh", str(st), str(copy)],
        "ms-port convert": [ms, *convert],
    }
    if args.baseline:
        tools[f"ms-port convert at {args.baseline}"] = [
            "/usr/bin/env", f"PYTHONPATH={worktree(args.baseline)}", PY, "-P", "-m", "ms_port",
            *convert]
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in tools}
    for _ in range(args.runs):
        for name, cmd in tools.items():
            warm([st])
            runs[name].append(measure(cmd, name))
            written = out if name.startswith("ms-port") else copy
            settle(written)
            written.unlink()
    row: dict = {"case": f"qwen3-30b-a3b-widths-stacked-experts-{args.layers}l",
                 "model_bytes": st.stat().st_size, "runs": args.runs}
    row["tools"] = {k: {"wall": statistics.median(r["wall"] for r in v),
                        "rss_mib": statistics.median(r["rss"] for r in v)}
                    for k, v in runs.items()}
    for v in row["tools"].values():
        v["x_cp_fsync"] = v["wall"] / row["tools"]["cp + fsync"]["wall"]
    print(json.dumps(row, indent=2))


def verify_main(args: argparse.Namespace) -> None:
    """``--verify``: verify by layers of the conversion, now and at the baseline."""
    import subprocess

    root = CACHE / f"{args.layers}l"
    src = stacked_model(root / "hf", args.layers)
    out = root / "verify.ckpt"
    ms = str(Path(PY).parent / "ms-port")
    if not out.exists():
        subprocess.run([ms, "convert", str(src), "--ms-model", "mindformers:qwen3_moe", "-o",
                        str(out), "-q"], check=True, stdout=subprocess.DEVNULL)  # the JSON alone
    verify = ["verify", str(src), str(out), "--ms-model", "mindformers:qwen3_moe", "--mode",
              "layers", "--json"]
    row = {"case": f"qwen3-30b-a3b-widths-stacked-experts-{args.layers}l-verify-layers",
           "runs": args.runs,
           "tools": verify_side_by_side(verify, [src, out], args.runs, args.baseline)}
    print(json.dumps(row, indent=2))


if __name__ == "__main__":
    main()
