"""The way back from a cluster, measured: a tensor-parallel training output (4 ranks, with
its Adam moments) exported to a Hugging Face directory, beside ``cp`` of the model's
bytes, and beside MindSpore's and MindFormers' own route where it fits in memory.

    python benchmarks/cluster.py                       # TinyLlama-1.1B widths, 22 layers
    python benchmarks/cluster.py --layers 4 --official # + transform_checkpoints, unified_
                                                       #   safetensors and the reverse script
    python benchmarks/cluster.py --size 7b --no-moments

Setup (untimed, cached under benchmarks/.cache/cluster/): a seeded bfloat16 LLaMA in
Hugging Face's layout, converted by ms-port to MindFormers' LLaMA, then cut for a
4-device tensor-parallel strategy (q/k/v and w1/w3 by output rows, wo and w2 by input
columns, the embedding and the head by vocabulary rows) into
``checkpoint/rank_{i}/llama_rank_{i}-1_100.ckpt`` with float32 Adam moments beside each
weight, and ``strategy/ckpt_strategy_rank_{i}.ckpt`` (MindSpore's protobuf).

Each contender runs as a fresh process through ``_launch.py`` (its own wall and peak
RSS), inputs warm in the page cache; the figures are medians of ``--runs``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the harness's modules (run.py)
CACHE = HERE / ".cache" / "cluster"
PY = sys.executable
SIZES = {  # hidden, intermediate, heads, kv heads, vocab, layers
    "1.1b": (2048, 5632, 32, 4, 32000, 22),
    "7b": (4096, 14336, 32, 8, 32768, 32),
}
DEVICES = 4


def _ms_port() -> str:
    return str(Path(PY).parent / "ms-port")


def measure(cmd: list[str], label: str) -> dict[str, float]:
    """The harness's own measure (``run.measure``: a fresh process, its wall and peak RSS)."""
    from run import measure as measure_run

    done = measure_run(cmd, label)
    return {"wall": done.wall, "rss": done.rss}


def verify_side_by_side(verify: list[str], paths: list[Path], runs: int,
                        baseline: str | None = None) -> dict[str, dict]:
    """``ms-port VERIFY… --json`` (now, and at ``baseline`` from a git worktree), each run
    a fresh process with ``paths`` warm: per contender the median wall and peak RSS of
    ``runs``, and each run's verdict with the logits' error (and its first reason)."""
    from glm4 import worktree
    from run import OUT as RUN_OUT

    tools = {f"ms-port {verify[0]}": [_ms_port(), *verify]}
    if baseline:
        tools[f"at {baseline}"] = ["/usr/bin/env", f"PYTHONPATH={worktree(baseline)}", PY,
                                   "-P", "-m", "ms_port", *verify]
    found: dict[str, dict] = {k: {"runs": [], "verdicts": []} for k in tools}
    for _ in range(runs):
        for name, cmd in tools.items():
            warm(paths)
            found[name]["runs"].append(measure(cmd, name))
            report = json.loads((RUN_OUT / "stdout.txt").read_text())
            error = report["outputs"][0]["error"] if report.get("outputs") else None
            found[name]["verdicts"].append(
                f"{report['verdict']} (logits {error})"
                + "".join(f"; {r}" for r in report.get("reasons", [])[:1]))
    return {k: {"wall": statistics.median(r["wall"] for r in v["runs"]),
                "rss_mib": statistics.median(r["rss"] for r in v["runs"]),
                "verdicts": v["verdicts"]} for k, v in found.items()}


def warm(paths: list[Path]) -> None:
    """The harness's own warm-up (``run.warm``), over the files of folders too."""
    from run import warm as warm_files

    warm_files([f for path in paths
                for f in ([path] if path.is_file() else sorted(path.rglob("*")))
                if f.is_file()])


def hf_model(folder: Path, size: tuple[int, ...]) -> Path:
    """A seeded bfloat16 LLaMA in transformers' names (no torch: numpy and safetensors)."""
    import ml_dtypes
    from safetensors.numpy import save_file

    if (folder / "model.safetensors").exists():
        return folder
    hidden, inter, heads, kv, vocab, layers = size
    head = hidden // heads
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(ml_dtypes.bfloat16)

    tensors = {"model.embed_tokens.weight": w(vocab, hidden), "model.norm.weight": w(hidden),
               "lm_head.weight": w(vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors.update({
            p + "self_attn.q_proj.weight": w(heads * head, hidden),
            p + "self_attn.k_proj.weight": w(kv * head, hidden),
            p + "self_attn.v_proj.weight": w(kv * head, hidden),
            p + "self_attn.o_proj.weight": w(hidden, heads * head),
            p + "mlp.gate_proj.weight": w(inter, hidden),
            p + "mlp.up_proj.weight": w(inter, hidden),
            p + "mlp.down_proj.weight": w(hidden, inter),
            p + "input_layernorm.weight": w(hidden),
            p + "post_attention_layernorm.weight": w(hidden)})
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
        "intermediate_size": inter, "num_attention_heads": heads, "num_key_value_heads": kv,
        "num_hidden_layers": layers, "vocab_size": vocab, "rms_norm_eps": 1e-5,
        "max_position_embeddings": 2048, "rope_theta": 10000.0, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16"}, indent=2))
    return folder


def _layout(name: str) -> list[int] | None:
    if name.endswith(("wq.weight", "wk.weight", "wv.weight", "w1.weight", "w3.weight",
                      "embedding_weight", "lm_head.weight")):
        return [0, -1]
    if name.endswith(("wo.weight", "w2.weight")):
        return [-1, 0]
    return None


def training_output(folder: Path, whole: Path, moments: bool) -> Path:
    """The converted checkpoint cut for 4 tensor-parallel ranks, as training saves it."""
    from mindspore.train import node_strategy_pb2

    from ms_port.read.ckpt import CkptWriter
    from ms_port.read.sources import read_source
    from ms_port.read.strategy import ParamLayout

    if (folder / "strategy").exists():
        return folder
    source = read_source(whole, strip_prefixes=False)
    sm = node_strategy_pb2.ParallelStrategyMap(current_stage=0)
    layouts = {}
    for info in source:
        tmap = _layout(info.name)
        if tmap is None:
            continue
        item = sm.parallel_layout_item.add(param_name=info.name).parallel_layouts
        item.dev_matrix.add().dim.extend([DEVICES])
        item.tensor_map.add().dim.extend(tmap)
        item.param_split_shape.add()
        item.field, item.opt_weight_shard_step, item.opt_weight_shard_size = 0, 0, 0
        layouts[info.name] = ParamLayout(info.name, (DEVICES,),
                                         tuple((a,) if a >= 0 else () for a in tmap))
    (folder / "strategy").mkdir(parents=True)
    for rank in range(DEVICES):
        (folder / "strategy" / f"ckpt_strategy_rank_{rank}.ckpt").write_bytes(
            sm.SerializeToString())
    with contextlib.ExitStack() as stack:
        writers = []
        for rank in range(DEVICES):
            where = folder / "checkpoint" / f"rank_{rank}"
            where.mkdir(parents=True)
            f = stack.enter_context(open(where / f"llama_rank_{rank}-1_100.ckpt", "wb"))
            writers.append(stack.enter_context(CkptWriter(f)))
        for info in source:
            array = info.load()
            lay = layouts.get(info.name)
            for rank in range(DEVICES):
                part = array if lay is None else array[tuple(
                    slice(a, b) for a, b in lay.box(rank, array.shape))]
                writers[rank].write(info.name, np.ascontiguousarray(part))
                if moments:
                    for m in ("adam_m", "adam_v"):
                        writers[rank].write(f"{m}.{info.name}",
                                            np.full(part.shape, 1e-3, dtype=np.float32))
        for writer in writers:
            writer.write("global_step", np.array([100], dtype=np.int32))
    return folder


def settle(path: Path) -> None:
    """fsync what a run wrote and drop it from the page cache (untimed): the next run pays
    neither for its writeback nor for the memory it holds (cp does not fsync)."""
    from run import settle as settle_file  # the harness's own, one file at a time

    for f in ([path] if path.is_file() else sorted(path.rglob("*")) if path.exists() else []):
        if f.is_file():
            settle_file(f)


def _bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=list(SIZES), default="1.1b")
    ap.add_argument("--layers", type=int, help="fewer layers than the size's")
    ap.add_argument("--no-moments", action="store_true")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--official", action="store_true",
                    help="also MindSpore's transform_checkpoints + MindFormers' reverse "
                         "script, and unified_safetensors (they hold every rank in memory)")
    args = ap.parse_args()
    size = list(SIZES[args.size])
    if args.layers:
        size[5] = args.layers
    tag = f"{args.size}-{size[5]}l-{'w' if args.no_moments else 'wm'}"
    root = CACHE / tag
    hf = hf_model(root / "hf", tuple(size))
    whole = root / "whole.ckpt"
    if not whole.exists():
        subprocess.run([_ms_port(), "convert", str(hf), "--ms-model", "mindformers:llama",
                        "-o", str(whole), "-q"], check=True, capture_output=True)
    out = training_output(root / "output", whole, not args.no_moments)
    model_bytes = (hf / "model.safetensors").stat().st_size
    rows = {"case": tag, "model_bytes": model_bytes, "output_bytes": _bytes(out / "checkpoint")}
    back = root / "back"
    copy = root / "copy.safetensors"
    st = str(hf / "model.safetensors")
    copies = {  # what ms-port's guarantees cost with standard tools: durable, read back
        "cp": ["/bin/cp", st, str(copy)],
        "cp + fsync": ["/bin/sh", "-c", 'cp "$1" "$2" && sync "$2"', "sh", st, str(copy)],
        "cp + fsync + cmp": ["/bin/sh", "-c", 'cp "$1" "$2" && sync "$2" && cmp "$1" "$2"',
                             "sh", st, str(copy)]}
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in [*copies, "ms-port export"]}
    for _ in range(args.runs):
        for name, cmd in copies.items():
            warm([hf / "model.safetensors"])
            runs[name].append(measure(cmd, name))
            settle(copy)
            copy.unlink()
        warm([out / "checkpoint"])
        shutil.rmtree(back, ignore_errors=True)
        runs["ms-port export"].append(measure(
            [_ms_port(), "export", str(out), "--ms-model", "mindformers:llama", "--config",
             str(hf / "config.json"), "-o", str(back), "-q"], "ms-port export"))
        settle(back)
    rows["same_bytes"] = _same(hf / "model.safetensors", back / "model.safetensors")
    if args.official:
        runs.update(official(root, out, hf))
    rows["tools"] = {k: {"wall": statistics.median(r["wall"] for r in v),
                         "rss_mib": statistics.median(r["rss"] for r in v)}
                     for k, v in runs.items() if v}
    cp = rows["tools"]["cp"]["wall"]
    durable = rows["tools"]["cp + fsync"]["wall"]
    for v in rows["tools"].values():
        v["x_cp"] = v["wall"] / cp
        v["x_cp_fsync"] = v["wall"] / durable
    print(json.dumps(rows, indent=2))


def _same(a: Path, b: Path) -> bool:
    from safetensors.numpy import load_file

    x, y = load_file(a), load_file(b)
    return x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)


def official(root: Path, out: Path, hf: Path) -> dict[str, list[dict[str, float]]]:
    """MindSpore's transform_checkpoints to one .ckpt, then MindFormers' reverse script;
    and MindSpore's unified_safetensors (on safetensors rank files, made untimed)."""
    merged, pt = root / "merged", root / "official.pt"
    shutil.rmtree(merged, ignore_errors=True)
    code = ("import mindspore as ms, sys; ms.transform_checkpoints(sys.argv[1], sys.argv[2], "
            "'m', sys.argv[3], None)")
    found = {"transform_checkpoints": [measure(
        [PY, "-c", code, str(out / "checkpoint"), str(merged),
         str(out / "strategy" / "ckpt_strategy_rank_0.ckpt")], "transform_checkpoints")]}
    reverse = ("import sys; from mindformers.models.llama.convert_reversed import "
               "convert_ms_to_pt; convert_ms_to_pt(sys.argv[1], sys.argv[2])")
    merged_file = next((merged / "rank_0").glob("*.ckpt"))
    found["MindFormers reverse script"] = [measure([PY, "-c", reverse, str(merged_file),
                                                    str(pt)], "reverse script")]
    found["transform + reverse"] = [{
        "wall": found["transform_checkpoints"][0]["wall"]
        + found["MindFormers reverse script"][0]["wall"],
        "rss": max(found["transform_checkpoints"][0]["rss"],
                   found["MindFormers reverse script"][0]["rss"])}]
    shutil.rmtree(merged, ignore_errors=True)
    pt.unlink(missing_ok=True)
    st = root / "output-safetensors"
    if not st.exists():
        code = ("import mindspore as ms, sys, pathlib; "
                "[ms.save_checkpoint(ms.load_checkpoint(str(f)), str(f.with_suffix("
                "'.safetensors')).replace('/output/', '/output-safetensors/'), "
                "format='safetensors') for f in sorted(pathlib.Path(sys.argv[1]).rglob("
                "'*.ckpt')) if (pathlib.Path(str(f.parent).replace('/output/', "
                "'/output-safetensors/')).mkdir(parents=True, exist_ok=True) or True)]")
        subprocess.run([PY, "-c", code, str(out / "checkpoint")], check=True)
        shutil.copytree(out / "strategy", st / "strategy")
    unified = root / "unified"
    shutil.rmtree(unified, ignore_errors=True)
    code = ("import sys; from mindspore.parallel import unified_safetensors; "
            "unified_safetensors(sys.argv[1], sys.argv[2], sys.argv[3])")
    found["unified_safetensors"] = [measure(
        [PY, "-c", code, str(st / "checkpoint"), str(st / "strategy" /
                                                     "ckpt_strategy_rank_0.ckpt"),
         str(unified)], "unified_safetensors")]
    shutil.rmtree(unified, ignore_errors=True)
    return found


if __name__ == "__main__":
    main()
