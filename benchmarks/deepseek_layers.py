"""Verify by layers at DeepSeek-V3's widths: one dense layer and one mixture-of-experts
layer of ``--experts`` routed experts (64 by default; the Hub model has 256), with the
embedding, the head and the shared expert.

    python benchmarks/deepseek_layers.py [--experts 64] [--runs 1] [--baseline COMMIT]
        [--v32 | --v4 | --stacked] [--convert]

``--v32``: DeepSeek-V3.2 (``model_type`` ``deepseek_v32``, ``mindformers:deepseek32``): the
same layers, each with its lightning indexer (64 heads of 128). ``--v4``: DeepSeek-V4-Flash's
widths (``mindformers:deepseek4``; hidden 4096, 64 heads of 512, ``o_groups`` 8,
hyper-connections of 4, 2048-wide experts), two layers (an HCA and a CSA one with its
indexer), as ``save_pretrained`` names them; convert only (no forward runs for it).
``--stacked`` (with ``--convert``): DeepSeek-V3 with each layer's experts stacked as
transformers 5 holds them in memory (``mlp.experts.gate_up_proj [E, 2F, H]``, what
``torch.save(model.state_dict())`` writes). ``--convert``: measure the conversion instead,
beside ``cp`` + ``sync`` of the same file and a Python loop ``write``-ing its bytes +
``fsync`` (the floor of a writer that holds what it writes; fresh processes, the file
warm, medians of ``--runs``).

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


#: DeepSeek-V3.2's indexer per layer (transformers' DeepseekV32Indexer, the Hub's sizes)
INDEX_HEADS, INDEX_DIM = 64, 128


def _indexer(layer: int, h: int, q_lora: int) -> list[tuple[str, tuple[int, ...]]]:
    p = f"model.layers.{layer}.self_attn.indexer"
    return [(f"{p}.wq_b.weight", (INDEX_HEADS * INDEX_DIM, q_lora)),
            (f"{p}.wk.weight", (INDEX_DIM, h)), (f"{p}.k_norm.weight", (INDEX_DIM,)),
            (f"{p}.k_norm.bias", (INDEX_DIM,)), (f"{p}.weights_proj.weight", (INDEX_HEADS, h))]


def _stacked(shapes: list[tuple[str, tuple[int, ...]]], experts: int, f: int, h: int
             ) -> list[tuple[str, tuple[int, ...]]]:
    """``shapes`` with each layer's per-expert tensors as transformers 5 holds them in
    memory (and ``torch.save(model.state_dict())`` writes them), where the first was:
    ``mlp.experts.gate_up_proj`` ``[E, 2F, H]`` and ``mlp.experts.down_proj`` ``[E, H, F]``."""
    out, done = [], set()
    for name, shape in shapes:
        layer, sep, tail = name.partition(".mlp.experts.")
        if not sep or not tail.split(".")[0].isdigit():
            out.append((name, shape))
        elif layer not in done:
            done.add(layer)
            out += [(f"{layer}.mlp.experts.gate_up_proj", (experts, 2 * f, h)),
                    (f"{layer}.mlp.experts.down_proj", (experts, h, f))]
    return out


def model(folder: Path, experts: int, v32: bool = False, stacked: bool = False) -> Path:
    """The directory (made once): config.json and one bfloat16 safetensors file (the
    experts stacked as transformers 5 holds them where ``stacked``)."""
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
    if v32:
        layers += [t for i in range(2) for t in _indexer(i, h, config["q_lora_rank"])]
        config.update(model_type="deepseek_v32", architectures=["DeepseekV32ForCausalLM"],
                      index_n_heads=INDEX_HEADS, index_head_dim=INDEX_DIM, index_topk=2048)
    shapes = [("model.embed_tokens.weight", (VOCAB, h)), *layers,
              ("model.norm.weight", (h,)), ("lm_head.weight", (VOCAB, h))]
    if stacked:
        shapes = _stacked(shapes, experts, cut["moe_intermediate_size"], h)
    folder.mkdir(parents=True, exist_ok=True)
    inputs._write_bf16(folder / "model.safetensors", shapes, np.random.default_rng(11))
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


#: DeepSeek-V4-Flash's config (transformers' DeepseekV4Config defaults), cut to two layers
V4 = {"model_type": "deepseek_v4", "architectures": ["DeepseekV4ForCausalLM"],
      "vocab_size": VOCAB, "hidden_size": 4096, "moe_intermediate_size": 2048,
      "num_hidden_layers": 2, "num_attention_heads": 64, "num_key_value_heads": 1,
      "head_dim": 512, "q_lora_rank": 1024, "num_experts_per_tok": 6, "n_shared_experts": 1,
      "o_groups": 8, "o_lora_rank": 1024, "index_n_heads": 64, "index_head_dim": 128,
      "hc_mult": 4, "layer_types": ["heavily_compressed_attention",
                                    "compressed_sparse_attention"],
      "mlp_layer_types": ["moe", "moe"], "num_nextn_predict_layers": 0, "dtype": "bfloat16"}


def model_v4(folder: Path, experts: int) -> Path:
    """DeepSeek-V4's directory (made once): the names and shapes ``save_pretrained``
    writes for the config (ms-port's export computes them with transformers on the meta
    device), seeded bfloat16."""
    if (folder / "config.json").exists():
        return folder
    import numpy as np

    from ms_port.match.inversion import _from_config

    config = {**V4, "n_routed_experts": experts}
    source, _ = _from_config(config, "config.json")
    shapes = [(name, info.shape) for name, info in source.tensors.items()]
    folder.mkdir(parents=True, exist_ok=True)
    inputs._write_bf16(folder / "model.safetensors", shapes, np.random.default_rng(11))
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--baseline", metavar="COMMIT",
                    help="also verify (or convert) with ms-port at COMMIT (a git worktree), "
                         "side by side")
    ap.add_argument("--v32", action="store_true", help="DeepSeek-V3.2 (an indexer per layer)")
    ap.add_argument("--v4", action="store_true", help="DeepSeek-V4 (convert only)")
    ap.add_argument("--convert", action="store_true",
                    help="measure convert beside cp + sync instead of verify")
    ap.add_argument("--stacked", action="store_true",
                    help="DeepSeek-V3 with its experts stacked as transformers 5 holds them "
                         "(convert only)")
    args = ap.parse_args()
    version = "v4" if args.v4 else "v3.2" if args.v32 else "v3"
    if args.stacked and (version != "v3" or not args.convert):
        ap.error("--stacked measures DeepSeek-V3's convert only (--convert)")
    root = CACHE / (f"{args.experts}e{'' if version == 'v3' else '-' + version.replace('.', '')}"
                    f"{'-stacked' if args.stacked else ''}")
    family = {"v4": "mindformers:deepseek4", "v3.2": "mindformers:deepseek32"}.get(
        version, "mindformers:deepseek3")
    src = (model_v4(root / "hf", args.experts) if args.v4 else
           model(root / "hf", args.experts, args.v32, args.stacked))
    out = root / "m.ckpt"
    ms = str(Path(PY).parent / "ms-port")
    name = (f"deepseek-{version}-widths-2-layers-{args.experts}-experts"
            f"{'-stacked' if args.stacked else ''}")
    if args.v4 and not args.convert:
        ap.error("--v4 measures convert only (--convert): no forward of it runs")
    if args.convert:
        print(json.dumps(convert_side_by_side(src, out, family, args.runs, name,
                                              args.baseline), indent=2))
        return
    if not out.exists():
        subprocess.run([ms, "convert", str(src), "--ms-model", family, "-o",
                        str(out), "-q"], check=True, stdout=subprocess.DEVNULL)  # the JSON alone
    verify = ["verify", str(src), str(out), "--ms-model", family, "--mode",
              "layers", "--json"]
    row = {"case": f"{name}-verify-layers",
           "model_bytes": (src / "model.safetensors").stat().st_size, "runs": args.runs,
           "tools": verify_side_by_side(verify, [src, out], args.runs, args.baseline)}
    print(json.dumps(row, indent=2))


#: a file copied by plain ``write`` calls of 256 KiB (ms-port's ``WRITE_STEP``) from a map
#: of the source, then ``fsync``: the floor for any writer that holds the bytes it writes
WRITE_ONLY = """
import mmap, os, sys
with open(sys.argv[1], 'rb') as f, open(sys.argv[2], 'wb') as g:
    m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    view = memoryview(m)
    for at in range(0, len(m), 1 << 18):
        g.write(view[at:at + (1 << 18)])
    g.flush()
    os.fsync(g.fileno())
    view.release()
"""


def convert_side_by_side(src: Path, out: Path, family: str, runs: int, name: str,
                         baseline: str | None = None) -> dict:
    """convert into ``family`` beside ``cp`` + ``sync`` of the same file (and beside the
    ``baseline`` commit's convert): medians of ``runs`` fresh processes (wall, peak RSS),
    each output settled and removed after."""
    import statistics

    from cluster import measure, settle, warm
    from glm4 import worktree

    st, copy = src / "model.safetensors", out.with_name("copy.safetensors")
    tools = {"cp + fsync": ["/bin/sh", "-c", 'cp "$1" "$2" && sync "$2"', "sh", str(st),
                            str(copy)],
             # the same bytes through a process's own write() calls, as ms-port's writer
             # makes them (cp's copy_file_range never copies them into the process)
             "python write + fsync": [PY, "-c", WRITE_ONLY, str(st), str(copy)],
             "ms-port convert": [str(Path(PY).parent / "ms-port"), "convert", str(src),
                                 "--ms-model", family, "-o", str(out), "--force", "-q"]}
    if baseline:
        tools[f"ms-port convert at {baseline}"] = [
            "/usr/bin/env", f"PYTHONPATH={worktree(baseline)}", PY, "-P", "-m", "ms_port",
            *tools["ms-port convert"][1:]]
    found: dict[str, list[dict[str, float]]] = {k: [] for k in tools}
    for _ in range(runs):
        for tool, cmd in tools.items():
            warm([st])
            found[tool].append(measure(cmd, tool))
            written = out if tool.startswith("ms-port") else copy
            settle(written)
            # both write a new file each run: replacing the last run's output would time
            # ext4 freeing its blocks (3 s for 8.5 GiB) in ms-port's rename, not in cp's
            written.unlink()
    row: dict = {"case": f"{name}-convert", "model_bytes": st.stat().st_size, "runs": runs,
                 **({"baseline": baseline} if baseline else {}),
                 "tools": {k: {"wall": statistics.median(r["wall"] for r in v),
                               "rss_mib": statistics.median(r["rss"] for r in v)}
                           for k, v in found.items()}}
    for v in row["tools"].values():
        v["x_cp_fsync"] = v["wall"] / row["tools"]["cp + fsync"]["wall"]
    return row


if __name__ == "__main__":
    main()
