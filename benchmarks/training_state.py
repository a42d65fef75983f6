"""A training run moved, measured: a 1.1B LLaMA's Trainer ``checkpoint-N/`` with its AdamW
state (bfloat16 weights, float32 moments: 4× the weights' bytes) converted into MindFormers
with ``--training-state``, and exported back into a Trainer folder, beside ``cp`` + ``sync``
of the same bytes.

    python benchmarks/training_state.py [--layers 22] [--runs 3] \
        [--out benchmarks/results/training-state.json]

Setup (untimed, cached under benchmarks/.cache/training/): the seeded bfloat16 model of
``cluster.py``, and beside it ``optimizer.pt`` in the Trainer's grouping (written a tensor
at a time by ms-port's own streamed writer: 8.8 GB), ``scheduler.pt``, ``trainer_state.json``.
Each contender runs as a fresh process through ``_launch.py`` (its wall and peak RSS),
inputs warm in the page cache; what a run wrote is fsynced and dropped from the cache
before the next one (untimed). Disk: ~45 GB at the peak (input, a copy, both outputs).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
CACHE = HERE / ".cache" / "training"
STEP = 100
RUN_YAML = """optimizer: {type: AdamW, betas: [0.9, 0.95], eps: 1.0e-8, weight_decay: 0.1}
lr_schedule: {type: CosineWithWarmUpLR, learning_rate: 3.0e-4, warmup_steps: 20,
              total_steps: 1000}
"""


def trainer_folder(root: Path, layers: int) -> Path:
    """A Trainer checkpoint of the 1.1B model at step 100, its moments seeded."""
    import torch
    from cluster import SIZES, hf_model

    from ms_port.read.trainer import DECAY_RULES, parameter_order
    from ms_port.write.torch_stream import Later, save_path

    folder = root / f"checkpoint-{STEP}"
    if (folder / "trainer_state.json").exists():
        return folder
    size = list(SIZES["1.1b"])
    size[5] = layers
    hf = hf_model(root / "hf", tuple(size))
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("model.safetensors", "config.json"):
        shutil.copy(hf / name, folder / name)
    config = json.loads((folder / "config.json").read_text())
    order, decays = parameter_order(config, str(folder))
    decayed = dict(decays)[DECAY_RULES[0][0]]
    groups = [[n for n in order if n in decayed], [n for n in order if n not in decayed]]
    from safetensors import safe_open

    with safe_open(folder / "model.safetensors", "np") as f:
        shapes = {n: tuple(f.get_slice(n).get_shape()) for n in order}

    def moment(shape: tuple[int, ...], seed: int, square: bool) -> Later:
        def make() -> np.ndarray:
            x = np.random.default_rng(seed).standard_normal(shape, dtype=np.float32) * 1e-3
            return x * x if square else x
        return Later("float32", shape, make)

    state, positions = {}, []
    for names in groups:
        positions.append(list(range(len(state), len(state) + len(names))))
        for name in names:
            i = len(state)
            state[i] = {"step": Later("float32", (), lambda: np.array(STEP, np.float32)),
                        "exp_avg": moment(shapes[name], 2 * i, False),
                        "exp_avg_sq": moment(shapes[name], 2 * i + 1, True)}
    base = {"lr": 2.9e-4, "betas": (0.9, 0.95), "eps": 1e-8, "amsgrad": False,
            "maximize": False, "foreach": None, "capturable": False, "differentiable": False,
            "fused": None, "decoupled_weight_decay": True, "initial_lr": 3e-4}
    save_path({"state": state, "param_groups": [
        {"weight_decay": 0.1, **base, "params": positions[0]},
        {"weight_decay": 0.0, **base, "params": positions[1]}]}, folder / "optimizer.pt")
    torch.save({"base_lrs": [3e-4] * 2, "last_epoch": STEP, "_step_count": STEP + 1,
                "_is_initial": False, "_get_lr_called_within_step": False,
                "_last_lr": [2.9e-4] * 2, "lr_lambdas": [None, None]},
               folder / "scheduler.pt")
    (folder / "trainer_state.json").write_text(json.dumps(
        {"global_step": STEP, "epoch": 0.5, "max_steps": 1000, "log_history": []}))
    return folder


def _memory_gib() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def _bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in (path.rglob("*") if path.is_dir() else [path])
               if f.is_file())


def main() -> None:
    from cluster import _ms_port, measure, settle, warm

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=22)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--out", type=Path, help="also write the figures here (JSON)")
    args = ap.parse_args()
    root = CACHE / f"1.1b-{args.layers}l"
    folder = trainer_folder(root, args.layers)
    (root / "run.yaml").write_text(RUN_YAML)
    ckpt, back, copy = root / "out.ckpt", root / "back", root / "copy"
    inputs = [folder / n for n in ("model.safetensors", "optimizer.pt")]
    runs: dict[str, list[dict[str, float]]] = {"cp + sync": [], "convert": [], "export": []}
    for _ in range(args.runs):
        warm(inputs)
        runs["cp + sync"].append(measure(["/bin/sh", "-c", 'cp -r "$1" "$2" && sync', "sh",
                                          str(folder), str(copy)], "cp + sync"))
        settle(copy)
        shutil.rmtree(copy)
        warm(inputs)
        ckpt.unlink(missing_ok=True)
        runs["convert"].append(measure(
            [_ms_port(), "convert", str(folder), "--ms-model", "mindformers:llama",
             "--training-state", "-o", str(ckpt), "-q"], "convert"))
        settle(ckpt)
        warm([ckpt])
        shutil.rmtree(back, ignore_errors=True)
        runs["export"].append(measure(
            [_ms_port(), "export", str(ckpt), "--config", str(folder / "config.json"),
             "--ms-model", "mindformers:llama", "--training-state", "--train-config",
             str(root / "run.yaml"), "-o", str(back), "-q"], "export"))
        settle(back)
    rows = {"case": root.name, "input_bytes": sum(_bytes(p) for p in inputs),
            "ckpt_bytes": _bytes(ckpt), "back_bytes": _bytes(back),
            "tools": {k: {"wall": statistics.median(r["wall"] for r in v),
                          "rss_mib": statistics.median(r["rss"] for r in v)}
                      for k, v in runs.items()}}
    durable = rows["tools"]["cp + sync"]["wall"]
    for v in rows["tools"].values():
        v["x_cp_sync"] = v["wall"] / durable
    rows["machine"] = f"{os.cpu_count()} cores, {_memory_gib():.0f} GiB"
    print(json.dumps(rows, indent=2))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2) + "\n")
    shutil.rmtree(back, ignore_errors=True)
    ckpt.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
