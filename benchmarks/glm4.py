"""GLM-4-9B's widths, a few layers: convert into MindFormers' ChatGLM2 beside ``cp``, and
verify layer by layer.

    python benchmarks/glm4.py                 # 2 layers (3.3 GB bfloat16), 3 runs
    python benchmarks/glm4.py --layers 4 --runs 1
    python benchmarks/glm4.py --runs 1 --baseline 2706d67   # verify beside an earlier commit's

Setup (untimed, cached under benchmarks/.cache/glm4/): a seeded bfloat16 GLM-4 in the
``-hf`` layout (transformers' ``glm`` names and config) at GLM-4-9B's widths: hidden 4096,
ffn 13696, 32 heads of 128 in 2 KV groups, vocabulary 151552. Each contender runs as a
fresh process through ``_launch.py`` (its own wall and peak RSS) with warm inputs; each
output is flushed and dropped from the cache after its run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from cluster import measure, settle, warm  # noqa: E402

CACHE = HERE / ".cache" / "glm4"
PY = sys.executable
HIDDEN, FFN, HEADS, GROUPS, HEAD_DIM, VOCAB = 4096, 13696, 32, 2, 128, 151552


def hf_model(folder: Path, layers: int) -> Path:
    import ml_dtypes
    from safetensors.numpy import save_file

    if (folder / "model.safetensors").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)

    def w(*shape: int, base: float = 0.0) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02 + base).astype(
            ml_dtypes.bfloat16)

    q, kv = HEADS * HEAD_DIM, GROUPS * HEAD_DIM
    tensors = {"model.embed_tokens.weight": w(VOCAB, HIDDEN),
               "model.norm.weight": w(HIDDEN, base=1.0), "lm_head.weight": w(VOCAB, HIDDEN)}
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors.update({
            p + "self_attn.q_proj.weight": w(q, HIDDEN), p + "self_attn.q_proj.bias": w(q),
            p + "self_attn.k_proj.weight": w(kv, HIDDEN), p + "self_attn.k_proj.bias": w(kv),
            p + "self_attn.v_proj.weight": w(kv, HIDDEN), p + "self_attn.v_proj.bias": w(kv),
            p + "self_attn.o_proj.weight": w(HIDDEN, q),
            p + "mlp.gate_up_proj.weight": w(2 * FFN, HIDDEN),
            p + "mlp.down_proj.weight": w(HIDDEN, FFN),
            p + "input_layernorm.weight": w(HIDDEN, base=1.0),
            p + "post_attention_layernorm.weight": w(HIDDEN, base=1.0)})
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["GlmForCausalLM"], "model_type": "glm", "hidden_size": HIDDEN,
        "intermediate_size": FFN, "num_attention_heads": HEADS,
        "num_key_value_heads": GROUPS, "head_dim": HEAD_DIM, "num_hidden_layers": layers,
        "vocab_size": VOCAB, "rms_norm_eps": 1.5625e-07, "attention_bias": True,
        "partial_rotary_factor": 0.5, "rope_theta": 10000.0, "max_position_embeddings": 8192,
        "tie_word_embeddings": False, "pad_token_id": 151329,
        "eos_token_id": [151329, 151336, 151338], "torch_dtype": "bfloat16"}, indent=2))
    return folder


def worktree(commit: str) -> Path:
    """A checkout of ``commit`` under the cache (made once), to run its ms-port (with
    ``python -P``: the working folder, this checkout, is not put before it)."""
    import subprocess

    where = CACHE / f"worktree-{commit}"
    if not where.exists():
        subprocess.run(["git", "-C", str(HERE.parent), "worktree", "add", "--detach",
                        str(where), commit], check=True, capture_output=True)
    return where


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-verify", action="store_true")
    ap.add_argument("--baseline", metavar="COMMIT",
                    help="also verify with ms-port at COMMIT (a git worktree), side by side")
    args = ap.parse_args()
    root = CACHE / f"{args.layers}l"
    hf = hf_model(root / "hf", args.layers)
    st = str(hf / "model.safetensors")
    out, copy = root / "glm4.ckpt", root / "copy.safetensors"
    ms = str(Path(PY).parent / "ms-port")
    tools = {
        "cp": ["/bin/cp", st, str(copy)],
        "cp + fsync": ["/bin/sh", "-c", 'cp "$1" "$2" && sync "$2"', "sh", st, str(copy)],
        "cp + fsync + cmp": ["/bin/sh", "-c", 'cp "$1" "$2" && sync "$2" && cmp "$1" "$2"',
                             "sh", st, str(copy)],
        "ms-port convert": [ms, "convert", str(hf), "--ms-model", "mindformers:glm4", "-o",
                            str(out), "--force", "-q"],
    }
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in tools}
    for _ in range(args.runs):
        for name, cmd in tools.items():
            warm([hf / "model.safetensors"])
            runs[name].append(measure(cmd, name))
            written = out if name.startswith("ms-port") else copy
            settle(written)
            if written == copy:
                copy.unlink()
    row: dict = {"case": f"glm4-9b-widths-{args.layers}l",
                 "model_bytes": (hf / "model.safetensors").stat().st_size}
    row["tools"] = {k: {"wall": statistics.median(r["wall"] for r in v),
                        "rss_mib": statistics.median(r["rss"] for r in v)}
                    for k, v in runs.items()}
    for v in row["tools"].values():
        v["x_cp"] = v["wall"] / row["tools"]["cp"]["wall"]
        v["x_cp_fsync"] = v["wall"] / row["tools"]["cp + fsync"]["wall"]
    if not args.no_verify:
        contenders = {"verify_layers": [ms]}
        if args.baseline:
            contenders["verify_layers_baseline"] = ["/usr/bin/env",
                                                    f"PYTHONPATH={worktree(args.baseline)}",
                                                    PY, "-P", "-m", "ms_port"]
            row["baseline"] = args.baseline
        for key, prog in contenders.items():
            verdict = root / f"{key}.json"
            row[key] = measure(
                ["/bin/sh", "-c", '"$@" > "$0"; test $? -le 1', str(verdict), *prog, "verify",
                 str(hf), str(out), "--ms-model", "mindformers:glm4", "--mode", "layers",
                 "--json"], f"ms-port verify --mode layers ({key})")
            report = json.loads(verdict.read_text())
            row[key].update({"verdict": report["verdict"], "error": report["error"],
                             "timings": report.get("timings")})
    shutil.rmtree(root / "unused", ignore_errors=True)
    print(json.dumps(row, indent=2))


if __name__ == "__main__":
    main()
