"""ms-port against the migration guide's recipe, side by side, as whole processes.

    python benchmarks/run.py [--runs 3] [--cases resnet50,synth-1g,synth-3g,help,inspect]
                             [--big] [--write-readme]

Each case runs the recipe (benchmarks/recipe.py) and ``ms-port`` on the same input,
alternating, ``--runs`` times each. Every run is a fresh child process; its wall time is
measured around it and its peak RSS comes from ``os.wait4`` (that child's own
``ru_maxrss``). Medians are reported with ratios ms-port / recipe. "Above baseline" is
peak RSS minus the peak RSS of a bare ``python -c pass``.

Inputs are generated once into ``benchmarks/.cache`` (seeded; no downloads).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
CACHE = HERE / ".cache"
PY = sys.executable
MS_PORT = [PY, "-m", "ms_port"]
GOALS = {  # case -> (wall ratio, rss ratio or None, above-baseline / size or None)
    "resnet50": (0.5, 0.6, None),
    "synth-1g": (0.5, 0.35, None),
    "synth-3g": (0.5, None, 0.25),
}


@dataclass
class Run:
    wall: float
    rss_mib: float


def measure(cmd: list[str]) -> Run:
    """Wall time and peak RSS of one child process."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    stderr = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"benchmark command failed ({proc.returncode}): {' '.join(cmd)}\n"
                         f"{stderr[-2000:]}")
    return Run(wall, usage.ru_maxrss / 1024)


def synthetic(size_gib: int) -> Path:
    """A float32 .pth of ``size_gib`` GiB: 64 MiB tensors named like a transformer's."""
    path = CACHE / f"synth-{size_gib}g.pth"
    if not path.exists():
        import torch

        gen = torch.Generator().manual_seed(size_gib)
        n = size_gib * 16
        state = {f"layers.{i}.weight": torch.randn(4096, 4096, generator=gen)
                 for i in range(n)}
        torch.save(state, path)
    return path


def template_for(src: Path) -> Path:
    """The MindSpore-side template a model-zoo user has: same names and shapes."""
    path = src.with_suffix(".template.ckpt")
    if not path.exists():
        import ms_port
        from ms_port.sources import read_source
        from ms_port.targets import from_infos

        target = from_infos(read_source(src).tensors.values(), "identity")
        ms_port.convert(src, target=target, output=path)
    return path


def resnet50() -> Path:
    path = CACHE / "resnet50.pth"
    if not path.exists():
        from ms_port.testing import save_reference_checkpoint

        save_reference_checkpoint("resnet50", path)
    return path


def safetensors_file() -> Path:
    path = CACHE / "resnet50.safetensors"
    if not path.exists():
        import torch
        from safetensors.torch import save_file

        save_file(torch.load(resnet50(), weights_only=True), path)
    return path


def prepare(names: list[str]) -> None:
    """Generate the inputs (run in a child: a forked child's ru_maxrss counts the parent's
    memory from before exec, so the measuring process must stay small)."""
    CACHE.mkdir(exist_ok=True)
    for name in names:
        if name == "resnet50":
            resnet50()
        elif name.startswith("synth-"):
            template_for(synthetic(int(name[6:-1])))
        elif name == "inspect":
            safetensors_file()


def cases(names: list[str], big: bool) -> dict[str, tuple[list[str] | None, list[str], int]]:
    """case -> (recipe command or None, ms-port command, input bytes)."""
    subprocess.run([PY, __file__, "--prepare", "--cases", ",".join(names)], check=True)
    out: dict[str, tuple[list[str] | None, list[str], int]] = {}
    tmp = CACHE / "out"
    tmp.mkdir(exist_ok=True)
    for name in names:
        if name == "resnet50":
            src = resnet50()
            out[name] = ([PY, str(HERE / "recipe.py"), str(src), str(tmp / "r.ckpt"),
                          "--resnet"],
                         [*MS_PORT, "convert", str(src), "--arch", "resnet50", "-o",
                          str(tmp / "m.ckpt"), "--force", "-q"], src.stat().st_size)
        elif name.startswith("synth-"):
            src = synthetic(int(name[6:-1]))
            template = template_for(src)
            out[name] = ([PY, str(HERE / "recipe.py"), str(src), str(tmp / "r.ckpt")],
                         [*MS_PORT, "convert", str(src), "--target", str(template), "-o",
                          str(tmp / "m.ckpt"), "--force", "-q"], src.stat().st_size)
        elif name == "help":
            out[name] = (None, [*MS_PORT, "--help"], 0)
        elif name == "inspect":
            out[name] = (None, [*MS_PORT, "inspect", str(safetensors_file()), "--json"], 0)
    if big:
        print("--big: the 14 GB bf16 sharded case is not automated yet; see README",
              file=sys.stderr)
    return out


def _clean_outputs() -> None:
    for f in (CACHE / "out").glob("*"):
        f.chmod(0o600)
        f.unlink()


def run(names: list[str], runs: int, big: bool) -> list[dict]:
    CACHE.mkdir(exist_ok=True)
    table = cases(names, big)
    baseline = statistics.median(measure([PY, "-c", "pass"]).rss_mib for _ in range(3))
    rows = []
    for name, (recipe_cmd, ms_cmd, size) in table.items():
        recipe_runs: list[Run] = []
        ms_runs: list[Run] = []
        for _ in range(runs):
            if recipe_cmd:
                _clean_outputs()
                recipe_runs.append(measure(recipe_cmd))
            _clean_outputs()
            ms_runs.append(measure(ms_cmd))
            print(f"  {name}: recipe {recipe_runs[-1].wall if recipe_cmd else 0:.2f}s, "
                  f"ms-port {ms_runs[-1].wall:.2f}s", file=sys.stderr)
        row = {"case": name, "size_mib": size / 2**20, "baseline_mib": baseline,
               "ms_wall": statistics.median(r.wall for r in ms_runs),
               "ms_rss": statistics.median(r.rss_mib for r in ms_runs)}
        if recipe_runs:
            row["recipe_wall"] = statistics.median(r.wall for r in recipe_runs)
            row["recipe_rss"] = statistics.median(r.rss_mib for r in recipe_runs)
        rows.append(row)
    _clean_outputs()
    return rows


def render(rows: list[dict]) -> str:
    lines = ["| case | input | recipe wall | ms-port wall | ratio | recipe peak RSS | "
             "ms-port peak RSS | ratio | ms-port above baseline | goal |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        above = r["ms_rss"] - r["baseline_mib"]
        if "recipe_wall" in r:
            wall_ratio = r["ms_wall"] / r["recipe_wall"]
            rss_ratio = r["ms_rss"] / r["recipe_rss"]
            goal = GOALS.get(r["case"])
            verdict = ""
            if goal:
                ok = wall_ratio <= goal[0]
                if goal[1] is not None:
                    ok = ok and rss_ratio <= goal[1]
                if goal[2] is not None:
                    ok = ok and above <= goal[2] * r["size_mib"]
                parts = [f"wall ≤ {goal[0]}×"]
                if goal[1] is not None:
                    parts.append(f"RSS ≤ {goal[1]}×")
                if goal[2] is not None:
                    parts.append(f"above baseline ≤ {goal[2]}× size")
                verdict = f"{'met' if ok else 'MISSED'} ({', '.join(parts)})"
            lines.append(
                f"| {r['case']} | {r['size_mib']:.0f} MiB | {r['recipe_wall']:.2f} s | "
                f"{r['ms_wall']:.2f} s | {wall_ratio:.2f}× | {r['recipe_rss']:.0f} MiB | "
                f"{r['ms_rss']:.0f} MiB | {rss_ratio:.2f}× | {above:.0f} MiB | {verdict} |")
        else:
            goal = "≤ 0.3 s" if r["case"] == "help" else "no torch/MindSpore import (tested)"
            lines.append(f"| {r['case']} | | | {r['ms_wall']:.2f} s | | | {r['ms_rss']:.0f} MiB "
                         f"| | {above:.0f} MiB | {goal} |")
    return "\n".join(lines)


def machine() -> str:
    cpu = "unknown CPU"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem = int(re.search(r"MemTotal:\s+(\d+)", f.read()).group(1)) / 2**20
    from importlib.metadata import version

    return (f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB RAM, Python "
            f"{platform.python_version()}, torch {version('torch')}, MindSpore "
            f"{version('mindspore')}, {time.strftime('%Y-%m-%d')}")


def write_readme(table: str, runs: int) -> None:
    readme = HERE / "README.md"
    text = readme.read_text()
    block = (f"<!-- results -->\nMachine: {machine()}; median of {runs} runs each.\n\n"
             f"{table}\n<!-- /results -->")
    text = re.sub(r"<!-- results -->.*<!-- /results -->", lambda _m: block, text, flags=re.S)
    readme.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cases", default="resnet50,synth-1g,synth-3g,help,inspect")
    parser.add_argument("--big", action="store_true")
    parser.add_argument("--write-readme", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--prepare", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.prepare:
        prepare(args.cases.split(","))
        return
    if shutil.disk_usage(HERE).free < 16 * 2**30:
        raise SystemExit("benchmarks need ~16 GiB free disk (inputs, templates, outputs)")
    rows = run(args.cases.split(","), args.runs, args.big)
    table = render(rows)
    print(json.dumps(rows, indent=2) if args.json else table)
    if args.write_readme:
        write_readme(table, args.runs)


if __name__ == "__main__":
    main()
