"""Two conversions at real widths: a Qwen3-MoE cut in depth, and DeepSeek-V3's float8.

    python benchmarks/run.py --cases qwen3-moe-layers [--runs 3] [--heavy-runs 1]
    python benchmarks/run.py --cases fp8-dequant [--runs 3] [--write-readme]

- ``qwen3-moe-layers``: Qwen3-30B-A3B's widths at 2 and 4 decoder layers
  (``inputs.make_qwen3_moe``): ``ms-port convert DIR --ms-model mindformers:qwen3_moe``
  against ``cp`` of the shards, alternated, ``--runs`` times each per depth; then
  MindFormers' own Hugging Face loader (``mindformers_qwen3_moe.py``) ``--heavy-runs`` times
  per depth. The cost of one decoder layer is the 4-layer median minus the 2-layer one,
  halved. Goals (the issue): wall ≤ 3× ``cp``'s, peak RSS ≤ 1 GiB.
- ``fp8-dequant``: DeepSeek-V3's block-scaled float8 (``inputs.make_fp8``) to bfloat16:
  DeepSeek's own ``fp8_cast_bf16.py`` on the CPU (``fp8_reference.py``) against ``ms-port
  convert DIR --target DIR`` (the same names; each float8 weight dequantized as it is read)
  into MindSpore safetensors shards and into one ``.ckpt``, with ``cp`` of the float8 files
  as the floor; throughput in MiB of float8 per second. Each ms-port output of the last
  round is compared with the reference's output tensor by tensor, bit for bit.

Each command is one fresh process through ``_launch.py`` (``verify_cases.launch``: wall,
peak RSS, CPU, exit status, the lowest MemAvailable while it ran; a command that fails is
recorded, not raised, where failing is a finding). Outputs are fsynced and dropped from
the page cache after each run (untimed), then deleted; the inputs stay in
``benchmarks/.cache``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import inputs
from verify_cases import MF_LOG, launch

HERE = Path(__file__).resolve().parent
OUT = inputs.CACHE / "out"
PY = sys.executable
GIB, MIB = 2**30, 2**20
CASES = ("qwen3-moe-layers", "fp8-dequant")
#: the rows' ``kind``, one per case
KINDS = {"qwen3-moe-layers": "qwen3-moe", "fp8-dequant": "fp8"}
#: qwen3-moe-layers' goals (the issue): wall within this many times cp's, peak RSS below
QWEN_WALL_GOAL, QWEN_RSS_GOAL_MIB = 3.0, 1024
#: an exception's last line in a traceback (``RuntimeError: ...``)
ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt)\b.*")


def is_case(name: str) -> bool:
    return name in CASES


def missing_inputs(name: str) -> int:
    """Bytes the case's inputs still take to generate."""
    if name == "qwen3-moe-layers":
        store = inputs.CACHE / "qwen3-moe-shards"
        shards = {key: shapes for d in inputs.QWEN3_MOE_DEPTHS
                  for key, shapes in inputs.qwen3_moe_shards(f"{d}l")}
        return sum(2 * inputs._numel(shape) for key, shapes in shards.items()
                   if not (store / f"{key}.safetensors").exists() for _, shape in shapes)
    return 0 if (inputs.fp8_dir() / "config.json").exists() else inputs.fp8_bytes() + (1 << 26)


def output_bytes(name: str) -> int:
    """Bytes the case writes while it runs (one output at a time, the fp8 reference's kept
    for the check beside one ms-port output), with a margin."""
    if name == "qwen3-moe-layers":
        return inputs.qwen3_moe_bytes(f"{max(inputs.QWEN3_MOE_DEPTHS)}l") + GIB
    return 2 * (2 * inputs.fp8_bytes()) + GIB


# -- files -------------------------------------------------------------------------


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file())
    return [path] if path.exists() else []


def _settle(path: Path) -> None:
    """fsync an output (a file or a folder of them) and drop it from the page cache
    (untimed): the next run pays neither for its writeback nor for the memory it holds."""
    for file in _files(path):
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _remove(path: Path) -> None:
    """An output and any temporaries its writer left beside it (``.NAME...``)."""
    for p in [path, *path.parent.glob(f".{path.name}*")]:
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink(missing_ok=True)


def _warm(paths: list[Path]) -> None:
    """Read the inputs once so that no tool pays for a cold page cache first."""
    buf = bytearray(8 << 20)
    for path in paths:
        with open(path, "rb") as f:
            while f.readinto(buf):
                pass


def _run(cmd: list[str], label: str, output: Path, *, may_fail: bool = False,
         keep: bool = False) -> dict:
    """One timed run; its output settled and (unless ``keep``) deleted after it. A failure
    raises unless ``may_fail``: then its exception line is recorded as ``error``."""
    _remove(output)
    run = launch(cmd, label)
    run.pop("stderr_tail", None)
    if run["rc"] != 0:
        err = (OUT / "stderr.txt").read_text(errors="replace")
        if not may_fail:
            raise SystemExit(f"{label} failed (exit {run['rc']}): {' '.join(cmd)}\n"
                             f"{err[-3000:]}")
        lines = [ln.strip() for ln in err.splitlines() if ERROR_LINE.match(ln.strip())]
        run["error"] = lines[-1] if lines else (err.strip().splitlines() or ["(no stderr)"])[-1]
        print(f"    error: {run['error']}", file=sys.stderr, flush=True)
    _settle(output)
    if not keep:
        _remove(output)
    return run


def _rounds(tools: dict[str, tuple[list[str], Path]], runs: int, label: str,
            after=None) -> dict[str, list[dict]]:
    """``runs`` rounds of every tool, alternating the order (first round as given).
    ``after(name, output, last)`` is called after each run, before the output is deleted."""
    found: dict[str, list[dict]] = {name: [] for name in tools}
    for i in range(runs):
        for name in list(tools) if i % 2 == 0 else list(tools)[::-1]:
            cmd, output = tools[name]
            run = _run(cmd, f"run {i + 1} {name} ({label})", output, keep=after is not None)
            if after is not None:
                after(name, output, i == runs - 1, run)
            found[name].append(run)
    return found


def _med(runs: list[dict], key: str) -> float:
    if key == "cpu":
        return statistics.median(r["user"] + r["sys"] for r in runs)
    return statistics.median(r[key] for r in runs)


# -- qwen3-moe-layers ---------------------------------------------------------------


def _qwen3_moe(ms: str, runs: int, heavy_runs: int) -> dict:
    out: dict = {"layer_params": inputs.qwen3_moe_layer_params(), "depths": {}}
    for depth in inputs.QWEN3_MOE_DEPTHS:
        name = f"{depth}l"
        src = inputs.qwen3_moe_dir(name)
        shards = sorted(src.glob("*.safetensors"))
        copies, ckpt = OUT / f"qwen3-moe-{name}-cp", OUT / f"qwen3-moe-{name}.ckpt"
        tools = {
            "cp": (["/bin/sh", "-c", 'mkdir -p "$0" && cp "$@" "$0"', str(copies),
                    *map(str, shards)], copies),
            "ms-port": ([ms, "convert", str(src), "--ms-model", "mindformers:qwen3_moe", "-o",
                         str(ckpt), "--force", "-q"], ckpt),
        }
        _warm(shards)
        found = _rounds(tools, runs, f"{depth} layers")
        mf_out = OUT / f"qwen3-moe-{name}-mindformers.ckpt"
        mf = ["/usr/bin/env", f"LOCAL_DEFAULT_PATH={MF_LOG}", PY,
              str(HERE / "mindformers_qwen3_moe.py"), str(src), str(mf_out)]
        _warm(shards)
        found["MindFormers"] = [_run(mf, f"run {i + 1} MindFormers ({depth} layers)", mf_out,
                                     may_fail=True) for i in range(heavy_runs)]
        found.update(_proof_and_back(ms, src, ckpt, depth, heavy_runs))
        out["depths"][str(depth)] = {
            "bytes": inputs.qwen3_moe_bytes(name), "shards": len(shards),
            "params": inputs.qwen3_moe_bytes(name) // 2, "tools": found}
    return out


def _proof_and_back(ms: str, src: Path, ckpt: Path, depth: int, runs: int) -> dict:
    """ms-port's verify by layers of the conversion, and its export back to a Hugging Face
    directory, ``runs`` times each (the conversion written once more, untimed, for them)."""
    convert = [ms, "convert", str(src), "--ms-model", "mindformers:qwen3_moe", "-o", str(ckpt),
               "--force", "-q"]
    _run(convert, f"ms-port convert for verify and export ({depth} layers)", ckpt, keep=True)
    env = ["/usr/bin/env", f"LOCAL_DEFAULT_PATH={MF_LOG}"]
    verify = [*env, ms, "verify", str(src), str(ckpt), "--ms-model", "mindformers:qwen3_moe",
              "--mode", "layers", "--json"]
    back = OUT / f"qwen3-moe-{depth}l-back"
    export = [ms, "export", str(ckpt), "--ms-model", "mindformers:qwen3_moe", "--config",
              str(src / "config.json"), "-o", str(back), "--force", "-q"]
    try:
        found = {
            "verify by layers": [_run(verify, f"run {i + 1} verify by layers ({depth} layers)",
                                      OUT / "verify-writes-nothing", may_fail=True)
                                 for i in range(runs)],
            "export": [_run(export, f"run {i + 1} export ({depth} layers)", back)
                       for i in range(runs)]}
    finally:
        _remove(ckpt)
    for run in found["verify by layers"]:  # the verdict, not the whole report
        report = run.pop("report", None) or {}
        run["verdict"] = report.get("verdict", "no report")
    return found


def _per_layer(row: dict) -> dict[str, dict[str, float]]:
    """Each tool's cost of one decoder layer: the deepest input's medians minus the
    shallowest's, over the layers between them (tools with a failed run left out)."""
    depths = sorted(row["depths"], key=int)
    lo, hi = row["depths"][depths[0]], row["depths"][depths[-1]]
    layers = int(depths[-1]) - int(depths[0])
    out = {}
    for tool, runs in hi["tools"].items():
        if any(r["rc"] for r in runs + lo["tools"][tool]):
            continue
        out[tool] = {k: (_med(runs, k) - _med(lo["tools"][tool], k)) / layers
                     for k in ("wall", "cpu", "rss")}
    out["bytes"] = {"bytes": (hi["bytes"] - lo["bytes"]) / layers}
    return out


def _judge_qwen(row: dict) -> list[tuple[str, bool]]:
    out = []
    for depth, d in row["depths"].items():
        ms, cp = d["tools"]["ms-port"], d["tools"]["cp"]
        ratio = _med(ms, "wall") / _med(cp, "wall")
        out.append((f"{depth} layers: wall {ratio:.2f}× cp ≤ {QWEN_WALL_GOAL:.0f}×",
                    ratio <= QWEN_WALL_GOAL))
        rss = _med(ms, "rss")
        out.append((f"{depth} layers: peak RSS {rss:.0f} MiB ≤ {QWEN_RSS_GOAL_MIB} MiB",
                    rss <= QWEN_RSS_GOAL_MIB))
        verdicts = [r.get("verdict", "no report") for r in d["tools"].get("verify by layers", [])]
        if verdicts:
            out.append((f"{depth} layers: verify by layers {'/'.join(sorted(set(verdicts)))}",
                        set(verdicts) == {"PASS"}))
    return out


# -- fp8-dequant --------------------------------------------------------------------


def _fp8(ms: str, runs: int) -> dict:
    src = inputs.fp8_dir()
    files = sorted(src.glob("*.safetensors"))
    ref = OUT / "fp8-reference"
    ms_args = ["convert", str(src), "--target", str(src), "-o"]
    tools = {
        "cp": (["/bin/sh", "-c", 'mkdir -p "$0" && cp "$@" "$0"', str(OUT / "fp8-cp"),
                *map(str, files)], OUT / "fp8-cp"),
        "reference": ([PY, str(HERE / "fp8_reference.py"), str(src), str(ref)], ref),
        "ms-port → safetensors": ([ms, *ms_args, str(OUT / "fp8-ms-port"), "--max-shard-size",
                                   "2GB", "--force", "-q"], OUT / "fp8-ms-port"),
        "ms-port → ckpt": ([ms, *ms_args, str(OUT / "fp8-ms-port.ckpt"), "--force", "-q"],
                           OUT / "fp8-ms-port.ckpt"),
    }
    checks: dict[str, dict] = {}

    def after(name: str, output: Path, last: bool, run: dict) -> None:
        # the reference's output stays until its next run (the first round runs it before
        # ms-port); every other output goes once compared
        if name.startswith("ms-port") and last:
            checks[name] = compare_fp8(ref, output)
            print(f"    {name} vs reference: {checks[name]['verdict']}", file=sys.stderr,
                  flush=True)
        if name != "reference":
            _remove(output)

    _warm(files)
    try:
        found = _rounds(tools, runs, "fp8", after)
    finally:
        _remove(ref)
    weights = [n for n, _, kind in inputs.fp8_weights() if kind == "float8"]
    return {"float8_bytes": inputs.fp8_bytes(), "weights": len(weights),
            "file_bytes": sum(f.stat().st_size for f in files), "shards": len(files),
            "tools": found, "checks": checks}


def compare_fp8(ref: Path, ours: Path) -> dict:
    """The two outputs, tensor by tensor, bit for bit (in a child process: torch)."""
    done = subprocess.run([PY, __file__, "compare", str(ref), str(ours)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        return {"verdict": "check failed", "detail": done.stderr.strip()[-500:]}
    return json.loads(done.stdout)


def _compare(ref: str, ours: str) -> None:
    """Child: every tensor of the reference's bf16 output against ms-port's (a folder of
    safetensors shards with ``param_name_map.json``, or a ``.ckpt``): the same names,
    dtype, shape and bytes. The reference is read with the safetensors library, never with
    ms-port; a ``.ckpt`` (which it cannot read) with ms-port's reader."""
    import numpy as np
    import torch
    from safetensors import safe_open

    def tensors(folder: Path, by_file: dict[str, list[str]]):
        for file, names in sorted(by_file.items()):
            with safe_open(str(folder / file), framework="pt") as f:
                for name in names:
                    t = f.get_tensor(name)
                    yield name, str(t.dtype).removeprefix("torch."), tuple(t.shape), \
                        t.contiguous().view(torch.uint8).numpy().reshape(-1)

    def grouped(weight_map: dict[str, str]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for name, file in weight_map.items():
            out.setdefault(file, []).append(name)
        return out

    ref_map = json.loads((Path(ref) / "model.safetensors.index.json").read_text())["weight_map"]
    theirs = {n: (d, s, b) for n, d, s, b in tensors(Path(ref), grouped(ref_map))}
    if ours.endswith(".ckpt"):
        from ms_port.read.ckpt import CkptReader

        reader = CkptReader(ours)
        mine = ((e.name, str(a.dtype), a.shape, a.view(np.uint8).reshape(-1))
                for e in reader.entries for a in [np.asarray(reader.load(e.name))])
    else:
        names = json.loads((Path(ours) / "param_name_map.json").read_text())["weight_map"]
        mine = tensors(Path(ours), grouped(names))
    source = json.loads((inputs.fp8_dir() / "model.safetensors.index.json").read_text())
    scaled = {n for n in source["weight_map"] if n + "_scale_inv" in source["weight_map"]}
    seen, bad, compared, nbytes = set(), [], 0, 0
    for name, dtype, shape, data in mine:
        seen.add(name)
        if name not in theirs:
            bad.append(f"{name}: not in the reference")
            continue
        d, s, b = theirs[name]
        if (d, s) != (dtype, shape):
            bad.append(f"{name}: {dtype} {shape} vs the reference's {d} {s}")
        elif not np.array_equal(b, data):
            bad.append(f"{name}: {int((b != data).sum())} of {b.size} bytes differ")
        compared += 1
        nbytes += data.size
    bad += [f"{n}: only in the reference" for n in sorted(set(theirs) - seen)]
    print(json.dumps({"verdict": "DIFFERENT" if bad else "bit-identical", "tensors": compared,
                      "dequantized": len(scaled & seen), "bytes": nbytes,
                      "bfloat16": sum(theirs[n][0] == "bfloat16" for n in seen if n in theirs),
                      "detail": bad[:5]}))


def _judge_fp8(row: dict) -> list[tuple[str, bool]]:
    out = []
    for name in row["tools"]:
        if name.startswith("ms-port"):
            check = row["checks"].get(name, {"verdict": "not compared"})
            out.append((f"{name}: {check['verdict']} to the reference "
                        f"({check.get('tensors', 0)} tensors)",
                        check["verdict"] == "bit-identical"))
    return out


# -- the cases ----------------------------------------------------------------------


def run_case(name: str, ms: str, runs: int, heavy_runs: int) -> dict:
    print(f"{name}:", file=sys.stderr, flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    row: dict = {"case": name, "kind": KINDS[name], "runs": runs}
    if name == "qwen3-moe-layers":
        row.update(_qwen3_moe(ms, runs, heavy_runs))
        row["per_layer"] = _per_layer(row)
        row["goals"] = _judge_qwen(row)
    else:
        row.update(_fp8(ms, runs))
        row["goals"] = _judge_fp8(row)
    for text, ok in row["goals"]:
        print(f"  goal: {text}: {'met' if ok else 'MISSED'}", file=sys.stderr, flush=True)
    return row


# -- rendering ----------------------------------------------------------------------


def _s(x: float) -> str:
    return f"{x:.2f} s"


def _spread(runs: list[dict]) -> str:
    walls = [r["wall"] for r in runs]
    return f"{min(walls):.2f}–{max(walls):.2f} s ({len(walls)})"


def _exit(runs: list[dict]) -> str:
    return "/".join(sorted({str(r["rc"]) for r in runs}))


def render(row: dict) -> str:
    return _render_qwen(row) if row["kind"] == "qwen3-moe" else _render_fp8(row)


def _render_qwen(row: dict) -> str:
    head = ("| qwen3-moe-layers | input | wall | CPU | peak RSS | wall / cp | "
            "lowest MemAvailable | exit | runs (wall) |")
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    labels = {"cp": "`cp` of the shards", "ms-port": "ms-port",
              "MindFormers": "MindFormers `load_hf_checkpoint`",
              "verify by layers": "ms-port verify --mode layers",
              "export": "ms-port export (back to the Hub's layout)"}
    errors = []
    for depth, d in row["depths"].items():
        cp = _med(d["tools"]["cp"], "wall")
        for tool, runs in d["tools"].items():
            failed = [r for r in runs if r["rc"]]
            lines.append("| " + " | ".join([
                f"{depth} layers: {labels[tool]}",
                f"{d['bytes'] / GIB:.2f} GiB, {d['shards']} shards", _s(_med(runs, "wall")),
                _s(_med(runs, "cpu")), f"{_med(runs, 'rss'):.0f} MiB",
                f"{_med(runs, 'wall') / cp:.2f}×",
                f"{min(r['min_available_mib'] for r in runs)} MiB",
                _exit(runs) + (" (failed, see below)" if failed else ""),
                _spread(runs)]) + " |")
            errors += [(depth, r["error"]) for r in failed]
    per = row["per_layer"]
    layer = per["bytes"]["bytes"]
    head = (f"| one decoder layer ({row['layer_params']:,} parameters, {layer / GIB:.2f} GiB "
            "bfloat16; (4 layers − 2 layers) / 2) | wall | CPU | peak RSS growth | MiB/s (wall) |")
    lines += ["", head, "|" + "---|" * head.count(" | ") + "---|"]
    for tool, cost in per.items():
        if tool == "bytes":
            continue
        lines.append(f"| {labels[tool]} | {_s(cost['wall'])} | {_s(cost['cpu'])} | "
                     f"{cost['rss']:+.0f} MiB | {layer / MIB / cost['wall']:.0f} |")
    if errors:
        lines += ["", "MindFormers' error, verbatim (the last line of its traceback):", ""]
        for depth, text in errors:
            lines.append(f"- {depth} layers: `{text}`")
    goals = "; ".join(f"{text}: {'met' if ok else 'MISSED'}" for text, ok in row["goals"])
    lines += ["", f"Goals: {goals}."]
    return "\n".join(lines)


def _render_fp8(row: dict) -> str:
    mib = row["float8_bytes"] / MIB
    head = (f"| fp8-dequant ({mib:.0f} MiB of float8_e4m3fn: {row['weights']} weights, "
            f"{row['shards']} shards) | wall | CPU | peak RSS | float8 MiB/s (wall) | "
            "per CPU second | wall / reference | peak RSS / reference | lowest MemAvailable "
            "| runs (wall) | output vs the reference's |")
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    labels = {"cp": "`cp` of the float8 files (not dequantized)",
              "reference": "reference: `fp8_cast_bf16.py` on the CPU",
              "ms-port → safetensors": "ms-port → MindSpore safetensors shards",
              "ms-port → ckpt": "ms-port → `.ckpt`"}
    ref = row["tools"]["reference"]
    for tool, runs in row["tools"].items():
        check = row["checks"].get(tool)
        lines.append("| " + " | ".join([
            labels.get(tool, tool), _s(_med(runs, "wall")), _s(_med(runs, "cpu")),
            f"{_med(runs, 'rss'):.0f} MiB", f"{mib / _med(runs, 'wall'):.0f}",
            f"{mib / _med(runs, 'cpu'):.0f}",
            f"{_med(runs, 'wall') / _med(ref, 'wall'):.2f}×",
            f"{_med(runs, 'rss') / _med(ref, 'rss'):.2f}×",
            f"{min(r['min_available_mib'] for r in runs)} MiB", _spread(runs),
            "" if check is None else
            f"{check['verdict']}: {check.get('tensors', 0)} tensors, "
            f"{check.get('bfloat16', 0)} bfloat16 ({check.get('dequantized', 0)} dequantized "
            "from float8), " + f"{check.get('bytes', 0) / MIB:.0f} MiB"
            + (f"; {'; '.join(check['detail'])}" if check.get("detail") else "")]) + " |")
    goals = "; ".join(f"{text}: {'met' if ok else 'MISSED'}" for text, ok in row["goals"])
    lines += ["", f"Goals: {goals}."]
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "compare":
        _compare(sys.argv[2], sys.argv[3])
    else:
        raise SystemExit("usage: moe_fp8_cases.py compare REFERENCE_DIR OURS")
