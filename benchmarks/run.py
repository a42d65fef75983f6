"""ms-port against the migration guide's recipe, side by side, as whole processes.

    python benchmarks/run.py [--runs 3]
        [--cases resnet50,synth-1g,synth-3g,help,inspect,verify,verify-vgg16]
        [--big] [--write-readme] [--json FILE] [--from-json FILE]
    python benchmarks/run.py --cases llm-1b [--runs 3] [--write-readme]
    python benchmarks/run.py --cases llm-7b [--runs 3] [--write-readme]
    python benchmarks/run.py --cases llm-1b-verify-modes,llm-70b-layers,llm-7b-verify
        [--runs 3] [--heavy-runs 1] [--phases] [--write-readme]
    python benchmarks/run.py --cases qwen3-moe-layers,fp8-dequant [--runs 3]
        [--heavy-runs 1] [--write-readme]

Each conversion case runs the recipe (``benchmarks/recipe.py``) and the ``ms-port`` CLI
on the same input, alternating (recipe first on even rounds, ms-port first on odd ones),
``--runs`` times each. Every run is a fresh process started by ``benchmarks/_launch.py``,
which reports that process's own wall time and peak RSS (see there for why a launcher).
Medians are reported, with ratios ms-port / recipe and the goals' verdicts.

``llm-1b`` (not a default case: 3–4 minutes, 2 GiB of input and ~9 GiB of outputs) is
a case of several tools rather than two: ``cp`` of the safetensors file (the floor), ms-port
to MindFormers' fused and separate layouts, and MindFormers' own two-step converter
(``benchmarks/mindformers_llama.py``); ratios are to ``cp`` and to MindFormers.

The ``verify`` cases at language-model sizes (``llm-1b-verify-modes``, ``llm-70b-layers``,
``llm-7b-verify``; not default cases) are in ``benchmarks/verify_cases.py``; a Qwen3-MoE at
Qwen3-30B-A3B's widths cut in depth (``qwen3-moe-layers``) and DeepSeek-V3's float8
dequantized (``fp8-dequant``) in ``benchmarks/moe_fp8_cases.py``.

Inputs are generated once into ``benchmarks/.cache`` (``benchmarks/inputs.py``; seeded,
no downloads). See ``benchmarks/README.md`` for the definitions.
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
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import inputs  # benchmarks/inputs.py: paths only at import time
import moe_fp8_cases  # qwen3-moe-layers, fp8-dequant (paths only at import)
import verify_cases  # the verify cases at language-model sizes (paths only at import)

HERE = Path(__file__).resolve().parent
CACHE = inputs.CACHE
OUT = CACHE / "out"
PY = sys.executable
GIB = 2**30
DEFAULT_CASES = "resnet50,synth-1g,synth-3g,help,inspect,verify,verify-vgg16"
EXTRA_CASES = ("llm-1b,llm-7b,llm-1b-verify-modes,llm-70b-layers,"
               "llm-7b-verify,qwen3-moe-layers,fp8-dequant")  # known, not run by default
# MindFormers writes its logs under $LOCAL_DEFAULT_PATH (./output when unset)
MF_LOG = Path(tempfile.gettempdir()) / "ms-port-bench-mindformers-log"
HEAVY = ("torch", "mindspore")


def ms_port_script() -> str:
    """The installed ``ms-port`` console script: the CLI exactly as a user runs it."""
    beside = Path(PY).parent / "ms-port"
    found = str(beside) if beside.exists() else shutil.which("ms-port")
    if not found:
        raise SystemExit("no `ms-port` script next to this Python or on PATH; "
                         "run `make env` (pip install -e .) first")
    return found


# -- measuring ----------------------------------------------------------------------


@dataclass
class Run:
    wall: float
    rss: float  # MiB
    user: float
    sys: float


def measure(cmd: list[str], label: str) -> Run:
    """One fresh process, through the launcher: its own wall time and peak RSS."""
    OUT.mkdir(parents=True, exist_ok=True)
    out, err = OUT / "stdout.txt", OUT / "stderr.txt"
    launcher = [PY, "-I", "-S", str(HERE / "_launch.py"), str(out), str(err), "--", *cmd]
    done = subprocess.run(launcher, capture_output=True, text=True, check=True)
    result = json.loads(done.stdout)
    if result["rc"] != 0:
        tail = err.read_text(errors="replace")[-3000:] if err.exists() else ""
        raise SystemExit(f"{label} failed (exit {result['rc']}): {' '.join(cmd)}\n{tail}")
    return Run(result["wall"], result["maxrss_mib"], result["user"], result["sys"])


def median_run(runs: list[Run]) -> dict[str, float]:
    return {"wall": statistics.median(r.wall for r in runs),
            "rss": statistics.median(r.rss for r in runs),
            "wall_min": min(r.wall for r in runs), "wall_max": max(r.wall for r in runs),
            "rss_min": min(r.rss for r in runs), "rss_max": max(r.rss for r in runs)}


def record_modules(script: str, args: list[str], name: str) -> list[str]:
    """The modules ``python SCRIPT ARGS`` has imported when it ends (an untimed run)."""
    path = OUT / f"modules-{name}.json"
    path.unlink(missing_ok=True)  # never a previous run's list
    subprocess.run([PY, str(HERE / "_modules.py"), "record", str(path), script, *args],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return json.loads(path.read_text())["modules"]


_IMPORT_BASELINES: dict[tuple[str, ...], dict[str, float]] = {}


def imports_baseline(modules: list[str], name: str, runs: int) -> dict[str, float]:
    """Peak RSS and wall of a process that only imports ``modules`` (memoised)."""
    key = tuple(modules)
    if key not in _IMPORT_BASELINES:
        path = OUT / f"imports-{name}.json"
        path.write_text(json.dumps({"modules": modules}))
        cmd = [PY, str(HERE / "_modules.py"), "import", str(path)]
        _IMPORT_BASELINES[key] = median_run([measure(cmd, f"imports of {name}")
                                             for _ in range(runs)])
    return _IMPORT_BASELINES[key]


def heavy_imports(modules: list[str]) -> list[str]:
    return [m for m in HEAVY if m in modules]


# -- cases ---------------------------------------------------------------------------


@dataclass
class Case:
    name: str
    size: int  # input bytes (0: not a conversion)
    ms_port: list[str]
    recipe: list[str] | None = None
    outputs: tuple[Path, Path] | None = None  # (recipe's, ms-port's) for the output check
    warm: list[Path] = field(default_factory=list)  # read once before timing
    # (script, args) per tool for the untimed module-recording run
    record: dict[str, tuple[str, list[str]]] = field(default_factory=dict)
    # verify: read the JSON report's own timings (the forward passes) after each run
    timings: bool = False


@dataclass
class Tool:
    """One contender of a several-tool case: one or more processes run one after another
    (a conversion in steps, as its user runs it). A run's wall, user and sys times are the
    sum over its steps, its peak RSS the largest step's."""

    steps: list[list[str]]
    outputs: list[Path] = field(default_factory=list)  # kept for the output checks
    scratch: list[Path] = field(default_factory=list)  # deleted after every run


@dataclass
class ToolsCase:
    name: str
    size: int
    tools: dict[str, Tool]
    floor: str  # the tool every wall time is divided by (``cp``)
    # (tool, reference tool, its step count): ratios "to the reference"; a step count
    # takes only the reference's first steps (MindFormers' separate layout is its step 1)
    versus: dict[str, tuple[str, int]]
    checks: list[tuple[Path, Path]]  # (reference output, ms-port output), compared after
    warm: list[Path] = field(default_factory=list)
    record: tuple[str, str, list[str]] | None = None  # (tool, script, args) to record


def llm_case(name: str) -> ToolsCase:
    ms, mf = ms_port_script(), str(HERE / "mindformers_llama.py")
    src = inputs.llm_dir("1b")
    st = src / "model.safetensors"
    fused, sep = OUT / "llm-ms-port-fused.ckpt", OUT / "llm-ms-port-separate.ckpt"
    mf_sep, mf_fused = OUT / "llm-mindformers-separate.ckpt", OUT / "llm-mindformers-fused.ckpt"
    copy = OUT / "llm-cp.safetensors"
    ms_args = ["convert", str(src), "--ms-model", "mindformers:llama", "-o"]
    mf_env = ["/usr/bin/env", f"LOCAL_DEFAULT_PATH={MF_LOG}", PY, mf]
    tools = {
        "cp": Tool([["/bin/cp", str(st), str(copy)]], scratch=[copy]),
        "cp + fsync": Tool([["/bin/sh", "-c", 'cp "$1" "$2" && sync "$2"', "sh", str(st),
                             str(copy)]], scratch=[copy]),
        # what ms-port's guarantees cost with standard tools: durable, then read back
        "cp + fsync + cmp": Tool([["/bin/sh", "-c", 'cp "$1" "$2" && sync "$2" && cmp "$1" "$2"',
                                   "sh", str(st), str(copy)]], scratch=[copy]),
        "ms-port fused": Tool([[ms, *ms_args, str(fused), "--ms-option", "qkv_concat=true",
                                "--force", "-q"]], [fused]),
        "ms-port separate": Tool([[ms, *ms_args, str(sep), "--force", "-q"]], [sep]),
        "MindFormers": Tool([[*mf_env, "hf2ms", str(src), str(mf_sep)],
                             [*mf_env, "qkv-concat", str(mf_sep), str(mf_fused),
                              str(inputs.llm_mf_yaml("1b"))]], [mf_sep, mf_fused]),
    }
    tiny = inputs.llm_dir("tiny")
    return ToolsCase(
        name, inputs.llm_bytes("1b"), tools, "cp",
        {"ms-port fused": ("MindFormers", 2), "ms-port separate": ("MindFormers", 1)},
        [(mf_fused, fused), (mf_sep, sep)], [st],
        ("ms-port fused", ms, [*ms_args[:1], str(tiny), *ms_args[2:], str(OUT / "tiny.ckpt"),
                               "--ms-option", "qkv_concat=true", "--force", "-q"]))


def llm_7b_case(name: str) -> ToolsCase:
    """A 7B-shaped model: ms-port against ``cp`` of its shards. MindFormers' converter is
    left out: it held 2.8x the 1.1B model's size (5.9 GiB for 2.05 GiB), which for 13.5 GiB
    is more than this machine's 24 GiB."""
    ms, src = ms_port_script(), inputs.llm_dir("7b")
    shards = [src / file for file, _ in inputs.llm_files("7b")]
    copies = OUT / "llm-7b-cp"
    ms_args = ["convert", str(src), "--ms-model", "mindformers:llama", "-o"]
    fused, sep = OUT / "llm-7b-fused.ckpt", OUT / "llm-7b-separate.ckpt"
    return ToolsCase(name, inputs.llm_bytes("7b"), {
        "cp": Tool([["/bin/sh", "-c", 'mkdir -p "$0" && cp "$@" "$0"', str(copies),
                     *map(str, shards)]], scratch=[copies / s.name for s in shards]),
        "ms-port fused": Tool([[ms, *ms_args, str(fused), "--ms-option", "qkv_concat=true",
                                "--force", "-q"]], scratch=[fused]),
        "ms-port separate": Tool([[ms, *ms_args, str(sep), "--force", "-q"]], scratch=[sep]),
    }, "cp", {}, [], shards)


def build_cases(names: list[str]) -> list[Case | ToolsCase]:
    ms = ms_port_script()
    recipe = str(HERE / "recipe.py")
    r_out, m_out = OUT / "recipe.ckpt", OUT / "ms-port.ckpt"
    cases = []
    for name in names:
        if name == "resnet50":
            src = inputs.resnet50_path()
            r_args = [str(src), str(r_out), "--resnet"]
            m_args = ["convert", str(src), "--arch", "resnet50", "-o", str(m_out),
                      "--force", "-q"]
            cases.append(Case(name, src.stat().st_size, [ms, *m_args], [PY, recipe, *r_args],
                              (r_out, m_out), [src],
                              {"recipe": (recipe, r_args), "ms-port": (ms, m_args)}))
        elif name == "mindcv-resnet50":  # the recorded MindCV target: no MindSpore import
            src = inputs.resnet50_path()
            r_args = [str(src), str(r_out), "--resnet"]
            m_args = ["convert", str(src), "--ms-model", "mindcv:resnet50", "-o", str(m_out),
                      "--force", "-q"]
            cases.append(Case(name, src.stat().st_size, [ms, *m_args], [PY, recipe, *r_args],
                              None, [src],
                              {"recipe": (recipe, r_args), "ms-port": (ms, m_args)}))
        elif name in ("synth-1g", "synth-3g"):
            size = name.removeprefix("synth-")
            src, tpl = inputs.synth_path(size), inputs.template_path(size)
            tiny, tiny_tpl = inputs.synth_path("tiny"), inputs.template_path("tiny")
            cases.append(Case(
                name, src.stat().st_size,
                [ms, "convert", str(src), "--target", str(tpl), "-o", str(m_out), "--force",
                 "-q"],
                [PY, recipe, str(src), str(r_out)], (r_out, m_out), [src, tpl],
                {"recipe": (recipe, [str(tiny), str(OUT / "tiny-r.ckpt")]),
                 "ms-port": (ms, ["convert", str(tiny), "--target", str(tiny_tpl), "-o",
                                  str(OUT / "tiny-m.ckpt"), "--force", "-q"])}))
        elif name == "help":
            cases.append(Case(name, 0, [ms, "--help"], record={"ms-port": (ms, ["--help"])}))
        elif name == "inspect":
            src = inputs.safetensors_path()
            cases.append(Case(name, 0, [ms, "inspect", str(src)], warm=[src],
                              record={"ms-port": (ms, ["inspect", str(src)])}))
        elif name == "verify":
            pth, ckpt = inputs.verify_paths()
            cases.append(Case(name, pth.stat().st_size,
                              [ms, "verify", str(pth), str(ckpt), "--arch", "resnet50",
                               "--tol", "1e-5", "--json", "-q"], warm=[pth, ckpt],
                              timings=True))
        elif name == "verify-vgg16":  # torchvision's VGG16 into MindCV's (zoo extra)
            pth, ckpt = inputs.verify_vgg16_paths()
            cases.append(Case(name, pth.stat().st_size,
                              [ms, "verify", str(pth), str(ckpt), "--torch-model",
                               "torchvision.models:vgg16", "--ms-model", "mindcv.models:vgg16",
                               "--input-shape", "3,224,224", "--tol", "1e-5", "--json", "-q"],
                              warm=[pth, ckpt], timings=True))
        elif name == "llm-1b":
            cases.append(llm_case(name))
        elif name == "llm-7b":
            cases.append(llm_7b_case(name))
        elif name.startswith("big"):
            shards = inputs.big_shards(name)
            index = inputs.big_index(shards)
            # the index itself is the template: names and shapes unchanged
            m_args = ["convert", str(index), "--target", str(index), "-o",
                      str(OUT / "big.ckpt"), "--force", "-q"]
            cases.append(Case(name, inputs.big_bytes(shards), [ms, *m_args]))
        else:
            raise SystemExit(f"unknown case {name!r}; known: {DEFAULT_CASES},"
                             f"{EXTRA_CASES},big")
    return cases


def missing_inputs(name: str) -> int:
    """Bytes of input files a case still has to generate."""
    if verify_cases.is_verify_case(name):
        return verify_cases.missing_inputs(name)
    if moe_fp8_cases.is_case(name):
        return moe_fp8_cases.missing_inputs(name)
    if name in ("resnet50", "mindcv-resnet50"):
        return 0 if inputs.resnet50_path().exists() else 100 << 20
    if name == "inspect":
        return 0 if inputs.safetensors_path().exists() else 200 << 20
    if name == "verify":
        return 0 if inputs.verify_paths()[1].exists() else 200 << 20
    if name == "verify-vgg16":
        return 0 if inputs.verify_vgg16_paths()[1].exists() else 1100 << 20
    if name.startswith("synth-"):
        size = name.removeprefix("synth-")
        n = int(size.removesuffix("g")) * GIB
        return sum(n for p in (inputs.synth_path(size), inputs.template_path(size))
                   if not p.exists())
    if name.startswith("big"):
        shards = inputs.big_shards(name)
        return 0 if inputs.big_index(shards).exists() else inputs.big_bytes(shards)
    if name in ("llm-1b", "llm-7b"):
        size = name.removeprefix("llm-")
        return 0 if (inputs.llm_dir(size) / "config.json").exists() else inputs.llm_bytes(size)
    return 0


def output_bytes(name: str) -> int:
    """Bytes a case writes while it runs (deleted before the next case), with a margin."""
    if verify_cases.is_verify_case(name):
        return verify_cases.output_bytes(name)
    if moe_fp8_cases.is_case(name):
        return moe_fp8_cases.output_bytes(name)
    if name == "resnet50":
        return 300 << 20
    if name.startswith("synth-"):
        n = int(name.removeprefix("synth-").removesuffix("g")) * GIB
        return 2 * n + n // 10  # both tools' outputs are kept for the output check
    if name.startswith("big"):
        return inputs.big_bytes(inputs.big_shards(name)) * 11 // 10
    if name == "llm-1b":  # four outputs kept for the checks, one copy at a time
        return inputs.llm_bytes("1b") * 5 + (1 << 30)
    if name == "llm-7b":  # one output at a time, deleted after its run
        return inputs.llm_bytes("7b") + (1 << 30)
    return 0


def select_by_disk(names: list[str]) -> list[str]:
    """Drop the cases that the free disk cannot hold, saying so."""
    free = shutil.disk_usage(CACHE).free
    generated, kept = 0, []
    for name in names:
        need = missing_inputs(name) + output_bytes(name)
        if generated + need > free:
            print(f"skipping {name}: it needs {need / GIB:.1f} GiB of free disk, "
                  f"{(free - generated) / GIB:.1f} GiB are left", file=sys.stderr)
            continue
        generated += missing_inputs(name)
        kept.append(name)
    return kept


def remove_stale_cache() -> None:
    """Synthetic inputs of an older layout are never used again: free their disk."""
    for path in CACHE.glob("synth-*"):
        if f".{inputs.LAYOUT}." not in path.name:
            print(f"removing {path.name} (an older synthetic layout)", file=sys.stderr)
            path.unlink()


def clean_outputs(only: Path | None = None) -> None:
    """Delete outputs (``only``: that one file and its temporaries) before a run."""
    pattern = only.name if only else "*.ckpt"
    for path in [*OUT.glob(pattern), *OUT.glob(f".{pattern}*.tmp")]:
        path.unlink()


def flush_to_disk(path: Path) -> None:
    """fsync a finished output. ms-port fsyncs before it exits, the recipe does not: left
    dirty, the recipe's gigabytes would be written back during the next run, and charged
    to it."""
    if path.exists():
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def settle(path: Path) -> None:
    """fsync a finished output and drop it from the page cache (untimed): the next run
    pays neither for its writeback nor for the memory it holds. The llm case writes
    ~10 GiB; left cached, it would push the input out of the cache, and MindSpore's
    ``load_checkpoint`` judges free memory by ``MemFree`` (see README)."""
    if path.exists():
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def warm(paths: list[Path]) -> None:
    """Read inputs once so that neither tool pays for a cold page cache first."""
    buf = bytearray(8 << 20)
    for path in paths:
        with open(path, "rb") as f:
            while f.readinto(buf):
                pass


def compare_outputs(a: Path, b: Path) -> dict:
    """Are the two tools' checkpoints the same bytes, or at least the same tensors?"""
    done = subprocess.run([PY, __file__, "--compare", str(a), str(b)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        return {"verdict": "check failed", "detail": done.stderr.strip()[-500:]}
    return json.loads(done.stdout)


def _compare(a: str, b: str) -> None:
    """Child: compare two .ckpt files (bytes, then tensor by tensor)."""
    import numpy as np

    from ms_port.read.ckpt import CkptReader

    ra, rb = CkptReader(a), CkptReader(b)
    n = len(ra.entries)
    if _same_file_bytes(a, b):
        print(json.dumps({"verdict": "byte-identical", "tensors": n}))
        return
    names_a, names_b = [e.name for e in ra.entries], [e.name for e in rb.entries]
    if sorted(names_a) != sorted(names_b):
        only = sorted(set(names_a) ^ set(names_b))
        print(json.dumps({"verdict": "DIFFERENT NAMES", "tensors": n, "detail": only[:5]}))
        return
    bad = [e.name for e in ra.entries
           if not np.array_equal(ra.load(e.name).view(np.uint8).reshape(-1),
                                 rb.load(e.name).view(np.uint8).reshape(-1))]
    verdict = "same tensors, other order" if not bad else "DIFFERENT DATA"
    print(json.dumps({"verdict": verdict, "tensors": n, "detail": bad[:5]}))


def _same_file_bytes(a: str, b: str) -> bool:
    if os.path.getsize(a) != os.path.getsize(b):
        return False
    bufs = bytearray(8 << 20), bytearray(8 << 20)
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            na, nb = fa.readinto(bufs[0]), fb.readinto(bufs[1])
            if na != nb or bufs[0][:na] != bufs[1][:nb]:
                return False
            if not na:
                return True


# -- the run -------------------------------------------------------------------------


def run_case(case: Case, runs: int, baseline: dict[str, float]) -> dict:
    print(f"{case.name}:", file=sys.stderr)
    row: dict = {"case": case.name, "size_mib": case.size / 2**20,
                 "python_mib": baseline["rss"]}
    tools = {"ms-port": case.ms_port}
    if case.recipe:
        tools = {"recipe": case.recipe, **tools}
    for tool, (script, args) in case.record.items():
        clean_outputs()
        modules = record_modules(script, args, f"{case.name}-{tool}")
        row[f"{tool}_heavy_imports"] = heavy_imports(modules)
        row[f"{tool}_imports"] = imports_baseline(modules, f"{case.name}-{tool}", runs)
    warm(case.warm)
    results: dict[str, list[Run]] = {tool: [] for tool in tools}
    for i in range(runs):
        order = list(tools) if i % 2 == 0 else list(reversed(tools))
        for tool in order:
            # each tool replaces only its own output; the other's stays for the check
            clean_outputs(case.outputs[tool == "ms-port"] if case.outputs else None)
            run = measure(tools[tool], f"{case.name} / {tool}")
            if case.timings:
                report = json.loads((OUT / "stdout.txt").read_text())
                forwards = sum(v for k, v in report["timings"].items() if "forward" in k)
                row.setdefault("forward_s", []).append(forwards)
                row["verdict"] = report["verdict"]
            if case.outputs:  # untimed: no run may pay for the last one's disk writeback
                flush_to_disk(case.outputs[tool == "ms-port"])
            results[tool].append(run)
            print(f"  run {i + 1} {tool:8s} {run.wall:7.2f} s {run.rss:8.0f} MiB",
                  file=sys.stderr)
    for tool, rs in results.items():
        row[tool] = median_run(rs)
        row[f"{tool}_runs"] = [r.__dict__ for r in rs]
    if case.outputs:
        row["output_check"] = compare_outputs(*case.outputs)
        print(f"  outputs: {row['output_check']['verdict']}", file=sys.stderr)
    clean_outputs()
    row["goals"] = judge(row)
    return row


def run_tools_case(case: ToolsCase, runs: int) -> dict:
    print(f"{case.name}:", file=sys.stderr)
    row: dict = {"case": case.name, "kind": "tools", "size_mib": case.size / 2**20,
                 "floor": case.floor, "versus": case.versus, "tools": {}}
    if case.record:
        tool, script, args = case.record
        tag = f"{case.name}-{tool}".replace(" ", "-")  # a file name
        clean_outputs()
        modules = record_modules(script, args, tag)
        row["record"] = {"tool": tool, "heavy_imports": heavy_imports(modules),
                         "imports": imports_baseline(modules, tag, runs)}
    clean_outputs()
    warm(case.warm)
    steps: dict[str, list[list[Run]]] = {t: [] for t in case.tools}
    for i in range(runs):
        order = list(case.tools) if i % 2 == 0 else list(reversed(case.tools))
        for name in order:
            tool = case.tools[name]
            for path in tool.outputs + tool.scratch:
                path.unlink(missing_ok=True)
            done = [measure(cmd, f"{case.name} / {name} step {k + 1}")
                    for k, cmd in enumerate(tool.steps)]
            for path in tool.outputs + tool.scratch:  # untimed
                settle(path)
            for path in tool.scratch:
                path.unlink(missing_ok=True)
            steps[name].append(done)
            total = _total(done)
            print(f"  run {i + 1} {name:16s} {total.wall:7.2f} s {total.rss:8.0f} MiB"
                  + ("" if len(done) == 1 else "  (" + " + ".join(
                      f"{r.wall:.2f} s {r.rss:.0f} MiB" for r in done) + ")"), file=sys.stderr)
    for name, rs in steps.items():
        n = len(case.tools[name].steps)
        # every prefix of the steps: [:1] is MindFormers' separate layout, [:n] the tool
        row["tools"][name] = {
            "steps": n,
            "prefix": [_median_cpu([_total(r[:k]) for r in rs]) for k in range(1, n + 1)],
            "per_step": [_median_cpu([r[k] for r in rs]) for k in range(n)],
            "runs": [[r.__dict__ for r in done] for done in rs]}
    row["output_check"] = []
    for ref, mine in case.checks:
        check = compare_outputs(ref, mine)
        check["pair"] = f"{ref.name} vs {mine.name}"
        row["output_check"].append(check)
        print(f"  {check['pair']}: {check['verdict']}", file=sys.stderr)
    clean_outputs()
    row["goals"] = judge_tools(row)
    return row


def _median_cpu(runs: list[Run]) -> dict[str, float]:
    """median_run, plus the median CPU time (user + sys): steadier than wall time on a
    busy machine, and the share of the wall time the process itself worked."""
    return {**median_run(runs), "cpu": statistics.median(r.user + r.sys for r in runs)}


def _total(done: list[Run]) -> Run:
    return Run(sum(r.wall for r in done), max(r.rss for r in done),
               sum(r.user for r in done), sum(r.sys for r in done))


def _tool(row: dict, name: str, steps: int | None = None) -> dict[str, float]:
    """A tool's medians over its first ``steps`` steps (default: all of them)."""
    t = row["tools"][name]
    return t["prefix"][(steps or t["steps"]) - 1]


#: peak RSS goals of the tools cases: llm-1b the issue's 600 MiB; llm-7b "far below its
#: size", taken as a fifteenth of its 13.5 GiB
RSS_GOAL_MIB = {"llm-1b": 600, "llm-7b": 920}


def judge_tools(row: dict) -> list[tuple[str, bool]]:
    """Each ms-port conversion within 3× cp's wall time and the case's peak RSS goal."""
    floor, limit = _tool(row, row["floor"]), RSS_GOAL_MIB[row["case"]]
    out: list[tuple[str, bool]] = []
    for name in row["tools"]:
        if not name.startswith("ms-port"):
            continue
        m = _tool(row, name)
        wall = m["wall"] / floor["wall"]
        out.append((f"{name}: wall {wall:.2f}× {row['floor']} ≤ 3×", wall <= 3))
        out.append((f"{name}: peak RSS {m['rss']:.0f} MiB ≤ {limit} MiB", m["rss"] <= limit))
    return out


def judge(row: dict) -> list[tuple[str, bool]]:
    """(statement, met) for each goal of the case."""
    case, m = row["case"], row["ms-port"]
    r = row.get("recipe")
    out: list[tuple[str, bool]] = []
    if r:
        wall, rss = m["wall"] / r["wall"], m["rss"] / r["rss"]
        out.append((f"wall {wall:.2f}× ≤ 0.5×", wall <= 0.5))
        if case == "resnet50":
            out.append((f"RSS {rss:.2f}× ≤ 0.6×", rss <= 0.6))
        if case == "synth-1g":
            out.append((f"RSS {rss:.2f}× ≤ 0.35×", rss <= 0.35))
        if case == "synth-3g":
            above = (m["rss"] - row["python_mib"]) / row["size_mib"]
            out.append((f"above python {above:.2f}× size ≤ 0.25×", above <= 0.25))
    if case == "help":
        out.append((f"wall {m['wall']:.2f} s ≤ 0.3 s", m["wall"] <= 0.3))
    if case == "mindcv-resnet50":  # issue #44: the recorded target
        out.append((f"wall {m['wall'] / r['wall']:.2f}× ≤ 0.2×", m["wall"] / r["wall"] <= 0.2))
        heavy = [x for x in row.get("ms-port_heavy_imports", []) if "mindspore" in x]
        out.append(("imports " + (", ".join(heavy) if heavy else "no MindSpore"), not heavy))
    if case == "inspect":
        heavy = row.get("ms-port_heavy_imports", [])
        out.append(("imports " + (", ".join(heavy) if heavy else "neither torch nor MindSpore"),
                    not heavy))
    if case.startswith("big"):
        out.append((f"converted in {m['rss']:.0f} MiB peak RSS", True))
    if case.startswith("verify"):
        forwards = statistics.median(row["forward_s"])
        ratio = m["wall"] / forwards
        out.append((f"{row['verdict']}; wall {ratio:.2f}× its forward passes "
                    f"({forwards:.1f} s) ≤ 1.5×", ratio <= 1.5 and row["verdict"] == "PASS"))
    if case == "verify-vgg16":
        out.append((f"wall {m['wall']:.1f} s < 40 s", m["wall"] < 40))
    return out


# -- reporting -----------------------------------------------------------------------


def _s(x: float) -> str:
    return f"{x:.2f} s"


def _mib(x: float) -> str:
    return f"{max(x, 0):.0f} MiB"  # a difference of two peaks can dip below 0 by noise


#: row kinds with a README block of their own (``<!-- results:CASE -->``)
OWN_BLOCK = ("tools", "verify", *moe_fp8_cases.KINDS.values())


def render(rows: list[dict], baseline: dict[str, float]) -> str:
    """The recipe-vs-ms-port table (if such cases ran), then one table per tools case."""
    pairs = [row for row in rows if row.get("kind") not in OWN_BLOCK]
    parts = [render_pairs(pairs, baseline)] if pairs else []
    parts += [render_tools(row) for row in rows if row.get("kind") == "tools"]
    parts += [verify_cases.render(row) for row in rows if row.get("kind") == "verify"]
    parts += [moe_fp8_cases.render(row) for row in rows
              if row.get("kind") in moe_fp8_cases.KINDS.values()]
    return "\n\n".join(parts)


def render_tools(row: dict) -> str:
    """One line per tool (and MindFormers' separate layout, its first step), with ratios
    to the floor and to the reference."""
    floor, with_ref = _tool(row, row["floor"]), bool(row["versus"])
    head = (f"| {row['case']} ({row['size_mib']:.0f} MiB bfloat16) | wall | CPU | peak RSS | "
            f"wall / {row['floor']} | peak RSS / {row['floor']} | "
            + ("wall / MindFormers | peak RSS / MindFormers | " if with_ref else "")
            + "runs (wall) |")
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    shown: list[tuple[str, str, int]] = []  # (label, tool, steps)
    for name, t in row["tools"].items():
        if t["steps"] > 1:
            shown.append((f"{name}, step 1 (separate layout)", name, 1))
            shown.append((f"{name}, both steps (fused layout)", name, t["steps"]))
        else:
            shown.append((name, name, 1))
    for label, name, steps in shown:
        m = _tool(row, name, steps)
        versus = row["versus"].get(name)
        ref = _tool(row, versus[0], versus[1]) if versus else None
        lines.append("| " + " | ".join([
            label, _s(m["wall"]), _s(m["cpu"]) if "cpu" in m else "", _mib(m["rss"]),
            f"{m['wall'] / floor['wall']:.2f}×",
            f"{m['rss'] / floor['rss']:.0f}×",
            *([f"{m['wall'] / ref['wall']:.3f}×" if ref else "",
               f"{m['rss'] / ref['rss']:.3f}×" if ref else ""] if with_ref else []),
            f"{m['wall_min']:.2f}–{m['wall_max']:.2f} s"]) + " |")
    mf = row["tools"].get("MindFormers")
    if mf and mf["steps"] > 1:
        s2 = mf["per_step"][1]
        lines += ["", f"MindFormers' step 2 alone (`convert_to_qkv_concat`): {_s(s2['wall'])}, "
                      f"{_mib(s2['rss'])} peak RSS."]
    rec = row.get("record")
    if rec:
        heavy = ", ".join(rec["heavy_imports"]) or "neither torch nor MindSpore"
        lines += ["", f"{rec['tool']} imports {heavy}; a process importing only its modules: "
                      f"{_s(rec['imports']['wall'])}, {_mib(rec['imports']['rss'])} peak RSS."]
    checks = "; ".join(f"{c['pair']}: {c['verdict']} ({c.get('tensors', '?')} tensors)"
                       for c in row["output_check"])
    if checks:
        lines += ["", f"MindFormers' output vs ms-port's: {checks}."]
    goals = "; ".join(f"{text}: {'met' if ok else 'MISSED'}" for text, ok in row["goals"])
    lines += ["", f"Goals: {goals}."]
    return "\n".join(lines)


def render_pairs(rows: list[dict], baseline: dict[str, float]) -> str:
    head = ("| case | input | wall: recipe | ms-port | ratio | peak RSS: recipe | ms-port | "
            "ratio | above python: recipe | ms-port | above imports: recipe | ms-port | "
            "goals |")
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    py = baseline["rss"]
    for row in rows:
        m, r = row["ms-port"], row.get("recipe")
        mi = row.get("ms-port_imports")
        ri = row.get("recipe_imports")
        goals = "; ".join(f"{text}: {'met' if ok else 'MISSED'}" for text, ok in row["goals"])
        cells = [
            row["case"], f"{row['size_mib']:.0f} MiB" if row["size_mib"] else "",
            _s(r["wall"]) if r else "", _s(m["wall"]),
            f"{m['wall'] / r['wall']:.2f}×" if r else "",
            _mib(r["rss"]) if r else "", _mib(m["rss"]),
            f"{m['rss'] / r['rss']:.2f}×" if r else "",
            _mib(r["rss"] - py) if r else "", _mib(m["rss"] - py),
            _mib(r["rss"] - ri["rss"]) if r and ri else "",
            _mib(m["rss"] - mi["rss"]) if mi else "",
            goals,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    spread = [f"{row['case']} " + ", ".join(
        f"{tool} {row[tool]['wall_min']:.2f}–{row[tool]['wall_max']:.2f} s"
        for tool in ("recipe", "ms-port") if tool in row) for row in rows]
    lines += ["", "Wall time spread (min–max): " + "; ".join(spread) + "."]
    lines += ["", "Baselines (same launcher, medians):", "",
              "| process | wall | peak RSS | imports torch / MindSpore |", "|---|---|---|---|",
              f"| bare `python -c pass` | {_s(baseline['wall'])} | {_mib(py)} | no |"]
    seen: dict[str, str] = {}  # one line per distinct baseline (they are memoised)
    for row in rows:
        for tool in ("recipe", "ms-port"):
            b = row.get(f"{tool}_imports")
            if not b:
                continue
            key = f"{tool} {json.dumps(b, sort_keys=True)}"
            if key in seen:
                lines[seen[key]] = lines[seen[key]].replace(" imports only", f", {row['case']}"
                                                            " imports only", 1)
                continue
            seen[key] = len(lines)
            heavy = row.get(f"{tool}_heavy_imports") or []
            lines.append(f"| {tool} {row['case']} imports only | {_s(b['wall'])} | "
                         f"{_mib(b['rss'])} | {', '.join(heavy) or 'no'} |")
    checks = [f"{row['case']}: {row['output_check']['verdict']} "
              f"({row['output_check'].get('tensors', '?')} tensors)"
              for row in rows if "output_check" in row]
    if checks:
        lines += ["", "Recipe output vs ms-port output: " + "; ".join(checks) + "."]
    return "\n".join(lines)


def machine(load_before: str, load_after: str, commit_before: str | None = None) -> str:
    cpu = "unknown CPU"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem = int(re.search(r"MemTotal:\s+(\d+)", f.read()).group(1)) / 2**20
    from importlib.metadata import version

    now = verify_cases.commit()
    tree = (now if commit_before in (None, now)
            else f"{commit_before} at the start, {now} at the end")
    return (f"commit {tree}; {os.cpu_count()} cores ({cpu}), {mem:.0f} GiB RAM, "
            f"{platform.system()} {platform.release()}; Python {platform.python_version()}, "
            f"torch {version('torch')}, MindSpore {version('mindspore')}, "
            f"numpy {version('numpy')}, ms-port {version('ms-port')}; "
            f"{time.strftime('%Y-%m-%d %H:%M')}; load average {load_before} before, "
            f"{load_after} after")


def write_readme(data: dict) -> None:
    """Rewrite the README's blocks this run has results for: ``<!-- results -->`` for
    the recipe-vs-ms-port cases, ``<!-- results:CASE -->`` for each tools case."""
    readme = HERE / "README.md"
    body = readme.read_text()
    pairs = [row for row in data["rows"] if row.get("kind") not in OWN_BLOCK]
    blocks = [("results", pairs)] if pairs else []
    # a verify case's block is named without its ``:depths`` (llm-70b-layers:2)
    blocks += [(f"results:{row['case'].partition(':')[0]}", [row]) for row in data["rows"]
               if row.get("kind") in OWN_BLOCK]
    for tag, rows in blocks:
        text = header(data, rows) + render(rows, data["baseline"])
        block = f"<!-- {tag} -->\n{text}\n<!-- /{tag} -->"
        body, n = re.subn(rf"<!-- {re.escape(tag)} -->.*<!-- /{re.escape(tag)} -->",
                          lambda _m, block=block: block, body, flags=re.S)
        if n != 1:
            raise SystemExit(f"{readme}: no <!-- {tag} --> ... <!-- /{tag} --> block to fill")
    readme.write_text(body)


def header(data: dict, rows: list[dict] | None = None) -> str:
    rows = data["rows"] if rows is None else rows
    if rows and all(row.get("kind") == "verify" for row in rows):
        heavy = data.get("heavy_runs", 1)
        runs = "; ".join(
            f"{row['case']}: " + (f"median of {data['runs']} runs per mode"
                                  if row["case"] == "llm-1b-verify-modes" else
                                  f"{heavy} run{'s' if heavy > 1 else ''} per command"
                                  + (" (median)" if heavy > 1 else ""))
            for row in rows)
        return f"Machine: {data['machine']}. {runs}.\n\n"
    heavy = data.get("heavy_runs", 1)
    mf = (f"; MindFormers: {heavy} run{'s' * (heavy > 1)} per depth"
          if any(row.get("kind") == "qwen3-moe" for row in rows) else "")
    return (f"Machine: {data['machine']}. Median of {data['runs']} runs per tool and case"
            f"{mf}.\n\n")


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per tool and case")
    parser.add_argument("--cases", default=DEFAULT_CASES,
                        help=f"comma-separated, from {DEFAULT_CASES},{EXTRA_CASES},big "
                             "(big:N: N shards of 2 GiB instead of 7; llm-1b: a 1.1B bfloat16 "
                             "LLaMA against cp and MindFormers' converter, 3-4 min, ~13 GiB "
                             "of disk; llm-7b: a 7B-shaped one against cp, ~5 min, ~29 GiB; "
                             "qwen3-moe-layers: Qwen3-30B-A3B's widths at 2 and 4 layers, "
                             "~13 GiB; fp8-dequant: 2.9 GiB of DeepSeek-V3 float8, ~16 GiB)")
    parser.add_argument("--heavy-runs", type=int, default=1,
                        help="runs of each verify of llm-7b-verify and llm-70b-layers (each "
                             "takes minutes; llm-1b-verify-modes takes --runs), and of "
                             "MindFormers' loader per depth in qwen3-moe-layers")
    parser.add_argument("--phases", action="store_true",
                        help="verify cases: also run each verify command once through "
                             "verify_phases.py (where the time goes; not in the medians)")
    parser.add_argument("--big", action="store_true",
                        help="add the 14 GiB bfloat16 sharded case (ms-port only; needs "
                             "~30 GiB of free disk)")
    parser.add_argument("--write-readme", action="store_true",
                        help="rewrite the results blocks of benchmarks/README.md that "
                             "this run has cases for")
    parser.add_argument("--json", metavar="FILE", help="also write every run as JSON")
    parser.add_argument("--from-json", metavar="FILE",
                        help="run nothing: render (and --write-readme) a saved --json file")
    parser.add_argument("--compare", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.compare:
        _compare(*args.compare)
        return
    if args.from_json:
        data = json.loads(Path(args.from_json).read_text())
    else:
        data = measure_all(args)
        if args.json:
            Path(args.json).write_text(json.dumps(data, indent=1))
    print(header(data) + render(data["rows"], data["baseline"]))
    failed = [text for row in data["rows"] if row.get("kind") == "verify"
              for text, ok in row["goals"] if not ok]
    if failed:  # said last, where it is seen
        print("\nMISSED: " + "; ".join(failed), file=sys.stderr)
    if args.write_readme:
        write_readme(data)


def measure_all(args: argparse.Namespace) -> dict:
    names = [n for n in args.cases.split(",") if n]
    if args.big and not any(n.startswith("big") for n in names):
        names.append("big")
    CACHE.mkdir(parents=True, exist_ok=True)
    remove_stale_cache()
    names = select_by_disk(names)
    if not names:
        raise SystemExit("nothing to run")
    print(f"preparing inputs in {CACHE} (once) ...", file=sys.stderr)
    subprocess.run([PY, str(HERE / "inputs.py"), *names], check=True)
    OUT.mkdir(exist_ok=True)
    clean_outputs()
    load_before, commit_before = loadavg(), verify_cases.commit()
    cases = build_cases([n for n in names if not verify_cases.is_verify_case(n)
                         and not moe_fp8_cases.is_case(n)])
    baseline = median_run([measure([PY, "-c", "pass"], "bare python") for _ in range(args.runs)])
    rows = [run_tools_case(case, args.runs) if isinstance(case, ToolsCase)
            else run_case(case, args.runs, baseline) for case in cases]
    rows += [verify_cases.run_case(n, ms_port_script(), args.runs, args.heavy_runs, args.phases)
             for n in names if verify_cases.is_verify_case(n)]
    rows += [moe_fp8_cases.run_case(n, ms_port_script(), args.runs, args.heavy_runs)
             for n in names if moe_fp8_cases.is_case(n)]
    return {"machine": machine(load_before, loadavg(), commit_before), "runs": args.runs,
            "heavy_runs": args.heavy_runs, "baseline": baseline, "rows": rows}


if __name__ == "__main__":
    main()
