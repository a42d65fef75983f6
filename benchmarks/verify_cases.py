"""``ms-port verify`` at language-model sizes: whole processes, wall time and peak RSS.

    python benchmarks/run.py --cases llm-1b-verify-modes [--runs 3] [--write-readme]
    python benchmarks/run.py --cases llm-70b-layers[:2|:4|:2+4] [--heavy-runs 1]
    python benchmarks/run.py --cases llm-7b-verify [--heavy-runs 1] [--phases]

- ``llm-1b-verify-modes``: the 1.1B input of ``llm-1b`` converted once (separate layout),
  then ``verify --mode whole`` against ``verify --mode layers``, alternated, ``--runs``
  times each: the same verdict is expected, at what cost in time and memory each.
- ``llm-70b-layers``: Llama-3-70B's widths (hidden 8192, 64 heads / 8 KV heads,
  intermediate 28672, vocab 128256) at 2 and 4 decoder layers: convert, then
  ``verify --mode layers``. Its peak RSS should follow one block, not the depth.
- ``llm-7b-verify``: the 7B input of ``llm-7b``: convert, then ``verify`` with no flag
  (``--mode auto`` picks) and the issues' goals (PASS, peak RSS <= 6 GiB, wall <= 15 min,
  wall <= 3x reading both files once from a cold page cache, measured before each run);
  then a conversion whose layer 17 has k and v swapped (a ``--map`` file), verified without
  that map: it must FAIL naming ``model.layers.17`` and the swapped tensor.

Each command is one fresh process through ``_launch.py`` (its own wall time and
``ru_maxrss``); while it runs the harness polls ``/proc`` every second for the machine's
lowest ``MemAvailable`` and the command's RSS over time. A verify's report (``--json``)
gives its verdict, mode and ``timings``; what the report's ``total`` leaves out of the
process's wall time (interpreter, imports, listing both files, the plan and the check of
every tensor through it, exit) is shown as "before/after the report's clock".
``--phases`` adds one run of each verify command through ``verify_phases.py`` (the same
CLI in-process, its steps timed and RSS sampled), not counted in the medians.
Outputs are deleted after their runs; the inputs stay in ``benchmarks/.cache``.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import inputs

HERE = Path(__file__).resolve().parent
OUT = inputs.CACHE / "out"
PY = sys.executable
GIB, MIB = 2**30, 2**20
MF_LOG = Path(tempfile.gettempdir()) / "ms-port-bench-mindformers-log"
CASES = ("llm-1b-verify-modes", "llm-70b-layers", "llm-7b-verify")
MS_LLAMA = ["--ms-model", "mindformers:llama"]
#: llm-7b-verify: the layer whose k and v the wrong conversion swaps
SWAP_LAYER = 17
#: the issue's goals for llm-7b-verify
GOAL_7B_RSS_MIB, GOAL_7B_WALL_S = 6 * 1024, 15 * 60
#: issue 44's goal: the 7B verify within this many times reading both files once
GOAL_7B_READS = 3


def is_verify_case(name: str) -> bool:
    return name in CASES or name.startswith("llm-70b-layers:")


def sizes(name: str) -> list[str]:
    """The inputs.LLM_SIZES keys a case reads."""
    if name == "llm-1b-verify-modes":
        return ["1b"]
    if name == "llm-7b-verify":
        return ["7b"]
    return [f"70b-{d}l" for d in inputs.llm_70b_depths(name)]


def missing_inputs(name: str) -> int:
    return sum(inputs.llm_bytes(s) for s in sizes(name)
               if not (inputs.llm_dir(s) / "config.json").exists())


def output_bytes(name: str) -> int:
    """One output at a time, deleted after its runs; the output's size, plus a margin."""
    return max(inputs.llm_bytes(s) for s in sizes(name)) + GIB


# -- one process --------------------------------------------------------------------


def commit() -> str:
    """``git rev-parse --short HEAD``, and whether ms_port/ differs from it in the tree (the
    library a run imports is the working tree's: an editable install)."""
    root = HERE.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, text=True,
                              capture_output=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "ms_port"], cwd=root,
                               text=True, capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (f" (+{len(dirty.splitlines())} uncommitted under ms_port/)" if dirty else "")


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def _meminfo(key: str) -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) // 1024
    return 0


def _rss_mib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        return None
    return None


def launch(cmd: list[str], label: str) -> dict:
    """One fresh process through the launcher; never raises on the command's exit status
    (a FAIL verdict exits 1, a kill is a finding). Returns its wall, peak RSS, CPU, exit
    status, the lowest MemAvailable seen, its RSS every second, and its stdout's JSON."""
    OUT.mkdir(parents=True, exist_ok=True)
    out, err = OUT / "stdout.txt", OUT / "stderr.txt"
    launcher = [PY, "-I", "-S", str(HERE / "_launch.py"), str(out), str(err), "--", *cmd]
    print(f"  {label}: {' '.join(cmd)}", file=sys.stderr, flush=True)
    tree = commit()
    proc = subprocess.Popen(launcher, stdout=subprocess.PIPE, text=True)
    start, low, timeline, child = time.monotonic(), _meminfo("MemAvailable"), [], None
    while proc.poll() is None:
        time.sleep(1.0)
        low = min(low, _meminfo("MemAvailable"))
        child = child or next(iter(_children(proc.pid)), None)
        rss = _rss_mib(child) if child else None
        t = time.monotonic() - start
        if rss is not None:
            timeline.append((round(t, 1), rss))
    result = json.loads(proc.stdout.read())
    run = {"label": label, "cmd": cmd, "wall": result["wall"], "rss": result["maxrss_mib"],
           "user": result["user"], "sys": result["sys"], "rc": result["rc"],
           "min_available_mib": low, "rss_timeline": timeline, "commit": tree}
    text = out.read_text(errors="replace") if out.exists() else ""
    if text.lstrip().startswith("{"):
        with contextlib.suppress(json.JSONDecodeError):
            run["report"] = json.loads(text)
    if result["rc"] not in (0, 1):
        run["stderr_tail"] = err.read_text(errors="replace")[-3000:] if err.exists() else ""
    print(f"    exit {run['rc']}, {run['wall']:.1f} s, peak RSS {run['rss']:.0f} MiB, "
          f"lowest MemAvailable {low} MiB" + _verdict_line(run), file=sys.stderr, flush=True)
    if "stderr_tail" in run:
        print("    stderr: " + run["stderr_tail"][-1500:], file=sys.stderr, flush=True)
    return run


def _verdict_line(run: dict) -> str:
    rep = run.get("report")
    if not rep or "verdict" not in rep:
        return ""
    t = ", ".join(f"{k} {v:.1f} s" for k, v in rep.get("timings", {}).items())
    return f"; {rep['verdict']} ({rep.get('mode')}: {rep.get('mode_reason')}); {t}"


def summary(run: dict) -> dict:
    """What the README needs of a verify run (the report without its tables)."""
    rep = run.get("report") or {}
    keep = {k: rep.get(k) for k in ("verdict", "mode", "mode_reason", "timings",
                                    "first_divergence", "message", "reasons")}
    tensors = rep.get("tensors") or {}
    keep["tensor_counts"] = tensors.get("counts")
    keep["tensor_differs"] = [d for d in tensors.get("deltas", [])
                              if d.get("status") != "identical"]
    return {**{k: v for k, v in run.items() if k != "report"}, "summary": keep}


def phases_run(cmd: list[str], label: str) -> dict:
    """The verify command once more, through verify_phases.py (not in the medians)."""
    path = OUT / "verify-phases.json"
    path.unlink(missing_ok=True)
    ms_args = cmd[1:]  # cmd[0] is the ms-port script
    run = launch([PY, str(HERE / "verify_phases.py"), str(path), "--", *ms_args],
                 f"{label} (phases)")
    run = summary(run)
    if path.exists():
        run["phases"] = json.loads(path.read_text())
    return run


def record_imports(ms: str, runs: int) -> dict:
    """The modules a layers verify imports (recorded on the tiny LLaMA, untimed), and a
    process that only imports them (median of ``runs``)."""
    tiny, ckpt = inputs.llm_dir("tiny"), OUT / "verify-tiny.ckpt"
    subprocess.run([ms, "convert", str(tiny), *MS_LLAMA, "-o", str(ckpt), "--force", "-q"],
                   check=True, stdout=subprocess.DEVNULL)
    mods = OUT / "modules-verify-layers.json"
    mods.unlink(missing_ok=True)
    subprocess.run([PY, str(HERE / "_modules.py"), "record", str(mods), ms, "verify",
                    str(tiny), str(ckpt), *MS_LLAMA, "--mode", "layers", "--json"],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ckpt.unlink(missing_ok=True)
    modules = json.loads(mods.read_text())["modules"]
    # MindFormers, imported bare, logs into ./output unless told where (as run.py's MF_LOG)
    cmd = ["/usr/bin/env", f"LOCAL_DEFAULT_PATH={MF_LOG}", PY, str(HERE / "_modules.py"),
           "import", str(mods)]
    done = [launch(cmd, "imports only") for _ in range(runs)]
    return {"wall": statistics.median(r["wall"] for r in done),
            "rss": statistics.median(r["rss"] for r in done),
            "heavy": [m for m in ("torch", "transformers", "mindspore", "mindformers")
                      if m in modules]}


def _rm(path: Path) -> None:
    path.unlink(missing_ok=True)
    for tmp in path.parent.glob(f".{path.name}*"):
        tmp.unlink()


# -- the cases ----------------------------------------------------------------------


def run_case(name: str, ms: str, runs: int, heavy_runs: int, phases: bool) -> dict:
    print(f"{name}:", file=sys.stderr, flush=True)
    row: dict = {"case": name, "kind": "verify", "imports": record_imports(ms, 1)}
    if name == "llm-1b-verify-modes":
        row.update(_modes(ms, runs, phases))
    elif name == "llm-7b-verify":
        row.update(_seven(ms, heavy_runs, phases))
    else:
        row.update(_seventy(name, ms, heavy_runs, phases))
    row["goals"] = judge(row)
    for text, ok in row["goals"]:
        print(f"  goal: {text}: {'met' if ok else 'MISSED'}", file=sys.stderr, flush=True)
    return row


def _convert(ms: str, src: Path, out: Path, label: str, extra: list[str] = ()) -> dict:
    _rm(out)
    run = launch([ms, "convert", str(src), *MS_LLAMA, *extra, "-o", str(out), "--force",
                  "-q"], label)
    if run["rc"] != 0:
        raise SystemExit(f"{label} failed (exit {run['rc']}): {run.get('stderr_tail', '')}")
    return summary(run)


def _verify_cmd(ms: str, src: Path, ckpt: Path, mode: str | None) -> list[str]:
    return [ms, "verify", str(src), str(ckpt), *MS_LLAMA, "--json",
            *([] if mode is None else ["--mode", mode])]


def _modes(ms: str, runs: int, phases: bool) -> dict:
    src, ckpt = inputs.llm_dir("1b"), OUT / "llm-1b-verify.ckpt"
    out: dict = {"params": _params("1b"), "bytes": inputs.llm_bytes("1b"),
                 "convert": _convert(ms, src, ckpt, "convert 1b"), "modes": {}}
    modes = ["whole", "layers"]
    found: dict[str, list[dict]] = {m: [] for m in modes}
    try:
        for i in range(runs):
            for mode in modes if i % 2 == 0 else modes[::-1]:
                found[mode].append(summary(launch(_verify_cmd(ms, src, ckpt, mode),
                                                  f"run {i + 1} verify --mode {mode}")))
        if phases:
            out["phases"] = {m: phases_run(_verify_cmd(ms, src, ckpt, m), f"--mode {m}")
                             for m in modes}
    finally:
        _rm(ckpt)
    out["modes"] = found
    return out


def _seventy(name: str, ms: str, runs: int, phases: bool) -> dict:
    out: dict = {"depths": {}}
    for depth in inputs.llm_70b_depths(name):
        size = f"70b-{depth}l"
        src, ckpt = inputs.llm_dir(size), OUT / f"llm-{size}.ckpt"
        d: dict = {"params": _params(size), "bytes": inputs.llm_bytes(size),
                   "layer_params": _layer_params(size), "embed_params": _embed_params(size)}
        d["convert"] = _convert(ms, src, ckpt, f"convert {size}")
        try:
            cmd = _verify_cmd(ms, src, ckpt, "layers")
            d["verify"] = [summary(launch(cmd, f"run {i + 1} verify --mode layers ({size})"))
                           for i in range(runs)]
            if phases:
                d["phases"] = phases_run(cmd, f"--mode layers ({size})")
        finally:
            _rm(ckpt)
        out["depths"][str(depth)] = d
    return out


def swap_map() -> Path:
    """The user mapping that puts layer 17's v_proj into wk and k_proj into wv."""
    path, n = OUT / "swap-kv-17.yaml", SWAP_LAYER
    path.write_text("\n".join([
        "version: 1",
        f"description: layer {n}'s k and v swapped on purpose (a wrong conversion)",
        "tensors:",
        f"  model.layers.{n}.attention.wk.weight: model.layers.{n}.self_attn.v_proj.weight",
        f"  model.layers.{n}.attention.wv.weight: model.layers.{n}.self_attn.k_proj.weight",
        ""]))
    return path


def _seven(ms: str, runs: int, phases: bool) -> dict:
    src, ckpt = inputs.llm_dir("7b"), OUT / "llm-7b-verify.ckpt"
    out: dict = {"params": _params("7b"), "bytes": inputs.llm_bytes("7b"),
                 "layer_params": _layer_params("7b"), "embed_params": _embed_params("7b")}
    out["convert"] = _convert(ms, src, ckpt, "convert 7b")
    both = [*sorted(src.glob("*.safetensors")), ckpt]
    try:
        cmd = _verify_cmd(ms, src, ckpt, None)  # no flag: --mode auto decides
        out["verify"], out["read_both"] = [], []
        for i in range(runs):  # each from a cold page cache, as the reading of both files
            out["read_both"].append(read_cold(both))
            evict(both)
            out["verify"].append(summary(launch(cmd, f"run {i + 1} verify (no flag)")))
        if phases:
            evict(both)
            out["phases"] = phases_run(cmd, "verify (no flag)")
    finally:
        _rm(ckpt)
    swap = swap_map()
    out["swap_map"] = swap.read_text()
    out["convert_swapped"] = _convert(ms, src, ckpt, "convert 7b, k/v of layer 17 swapped",
                                      ["--map", str(swap)])
    try:
        evict(both)
        out["verify_swapped"] = summary(launch(_verify_cmd(ms, src, ckpt, None),
                                               "verify the swapped conversion (no --map)"))
    finally:
        _rm(ckpt)
    return out


def evict(paths: list[Path]) -> None:
    """Drop the files' pages from the page cache (``POSIX_FADV_DONTNEED``: their pages
    are clean, so the kernel lets them go; no root needed)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_cold(paths: list[Path], chunk: int = 8 << 20) -> dict:
    """Seconds to read every byte of ``paths`` once from a cold page cache, one file after
    the other in 8 MiB reads (``cat``'s way): the floor of any tool that reads both."""
    evict(paths)
    buf = memoryview(bytearray(chunk))
    total, t0 = 0, time.perf_counter()
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            while got := os.readv(fd, [buf]):
                total += got
        finally:
            os.close(fd)
    wall = time.perf_counter() - t0
    print(f"  read both files once, cold: {total / GIB:.1f} GiB in {wall:.1f} s",
          file=sys.stderr, flush=True)
    return {"wall": wall, "bytes": total}


def _params(size: str) -> int:
    return sum(inputs._numel(s) for _, s in inputs.llm_shapes(size))


def _layer_params(size: str) -> int:
    return sum(inputs._numel(s) for n, s in inputs.llm_shapes(size)
               if n.startswith("model.layers.0."))


def _embed_params(size: str) -> int:
    return dict(inputs.llm_shapes(size))["model.embed_tokens.weight"][0] * \
        inputs.LLM_SIZES[size]["hidden_size"]


# -- goals ---------------------------------------------------------------------------


def _med(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def _verdicts(runs: list[dict]) -> set:
    return {r["summary"]["verdict"] or _ended(r) for r in runs}


def _ended(run: dict) -> str:
    """How a run without a report ended."""
    if run["rc"] == -9:
        return ("KILLED (SIGKILL; MemAvailable fell to "
                f"{run['min_available_mib']} MiB: the kernel's OOM killer)")
    return f"no report (exit {run['rc']})"


def timeline(run: dict, every: int = 5) -> str:
    """The command's RSS every ``every`` seconds, in GiB (sampled each second)."""
    points = run.get("rss_timeline") or []
    picked, last = [], -every
    for t, rss in points:
        if t - last >= every:
            picked.append(f"{rss / 1024:.1f}")
            last = t
    return " ".join(picked)


def judge(row: dict) -> list[tuple[str, bool]]:
    out: list[tuple[str, bool]] = []
    if "modes" in row:
        w, lay = row["modes"]["whole"], row["modes"]["layers"]
        vw, vl = _verdicts(w), _verdicts(lay)
        out.append((f"same verdict (whole {'/'.join(sorted(map(str, vw)))}, layers "
                    f"{'/'.join(sorted(map(str, vl)))})", vw == vl == {"PASS"}))
        out.append((f"layers' peak RSS {_med(lay, 'rss'):.0f} MiB below whole's "
                    f"{_med(w, 'rss'):.0f} MiB", _med(lay, "rss") < _med(w, "rss")))
    if "depths" in row:
        peaks = {}
        for depth, d in row["depths"].items():
            v = _verdicts(d["verify"])
            out.append((f"{depth} layers: {'/'.join(sorted(map(str, v)))}, exit "
                        f"{'/'.join(str(r['rc']) for r in d['verify'])}",
                        v == {"PASS"} and all(r["rc"] == 0 for r in d["verify"])))
            peaks[int(depth)] = _med(d["verify"], "rss")
        killed = [depth for depth, d in row["depths"].items()
                  if any(r["rc"] != 0 for r in d["verify"])]
        if len(peaks) > 1 and killed:
            out.append((f"peak RSS against depth: not shown ({' and '.join(killed)} layers did "
                        "not finish; a killed run's peak is where it was stopped)", False))
        elif len(peaks) > 1:
            lo, hi = min(peaks), max(peaks)
            ratio = peaks[hi] / peaks[lo]
            out.append((f"peak RSS {lo} → {hi} layers {peaks[lo]:.0f} → {peaks[hi]:.0f} MiB "
                        f"({ratio:.2f}×) ≤ 1.10× (does not grow with depth)", ratio <= 1.10))
    if "verify" in row and "verify_swapped" in row:
        v = row["verify"]
        out.append((f"{'/'.join(sorted(map(str, _verdicts(v))))} (mode "
                    f"{'/'.join(sorted({str(r['summary']['mode']) for r in v}))})",
                    _verdicts(v) == {"PASS"} and all(r["rc"] == 0 for r in v)))
        rss, wall = _med(v, "rss"), _med(v, "wall")
        out.append((f"peak RSS {rss:.0f} MiB ≤ {GOAL_7B_RSS_MIB} MiB", rss <= GOAL_7B_RSS_MIB))
        out.append((f"wall {wall / 60:.1f} min ≤ {GOAL_7B_WALL_S // 60} min",
                    wall <= GOAL_7B_WALL_S))
        if row.get("read_both"):
            read = statistics.median(r["wall"] for r in row["read_both"])
            out.append((f"wall {wall / read:.1f}× reading both files once, cold ({read:.1f} s) "
                        f"≤ {GOAL_7B_READS}×", wall <= GOAL_7B_READS * read))
        s = row["verify_swapped"]
        sm = s["summary"]
        out.append((f"swapped k/v: verdict {sm['verdict']}, exit {s['rc']}",
                    sm["verdict"] == "FAIL" and s["rc"] == 1))
        fd = sm.get("first_divergence") or {}
        layer = f"model.layers.{SWAP_LAYER}"
        where = [fd.get("ms_name"), fd.get("ms_block")]
        out.append((f"first_divergence at {fd.get('ms_name')} (block {fd.get('ms_block')}) "
                    f"names {layer}",
                    any(isinstance(x, str) and x.startswith(layer + ".") for x in where)))
        wk = f"{layer}.attention.wk.weight"
        named = [d["target"] for d in sm.get("tensor_differs") or []]
        out.append((f"tensor check names {wk} (differing: {', '.join(named) or 'none'})",
                    wk in named))
    return out


# -- rendering -----------------------------------------------------------------------


def _s(x: float) -> str:
    return f"{x:.1f} s" if x < 600 else f"{x:.0f} s ({x / 60:.1f} min)"


def _timings(rep: dict, wall: float) -> str:
    """The report's timings, what its blocks' timers leave out of its total, and what the
    process spent outside the report's clock."""
    t = dict(rep.get("timings") or {})
    total = t.pop("total", None)
    parts = [f"{k} {v:.1f}" for k, v in t.items()]
    if total is not None:
        parts.append(f"rest {max(total - sum(t.values()), 0):.1f}")
        parts.append(f"= total {total:.1f}; outside it {max(wall - total, 0):.1f}")
    return ", ".join(parts) + " s" if parts else ""


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def render(row: dict) -> str:
    lines: list[str] = []
    imp = row.get("imports")
    if "modes" in row:
        w = row["modes"]["whole"]
        head = ("| llm-1b, verify | wall | CPU | peak RSS | wall / whole | peak RSS / whole | "
                "lowest MemAvailable | verdict, mode | report's timings | runs (wall) |")
        lines += [head, "|" + "---|" * head.count(" | ") + "---|"]
        c = row["convert"]
        lines.append(f"| convert (once) | {_s(c['wall'])} | {_s(c['user'] + c['sys'])} | "
                     f"{c['rss']:.0f} MiB | | | {c['min_available_mib']} MiB | exit "
                     f"{c['rc']} | | |")
        for mode, runs in row["modes"].items():
            med = sorted(runs, key=lambda r: r["wall"])[len(runs) // 2]
            verdicts = "/".join(sorted({str(r["summary"]["verdict"]) for r in runs}))
            lines.append("| " + " | ".join([
                f"`--mode {mode}`", _s(_med(runs, "wall")),
                _s(statistics.median(r["user"] + r["sys"] for r in runs)),
                f"{_med(runs, 'rss'):.0f} MiB",
                f"{_med(runs, 'wall') / _med(w, 'wall'):.2f}×",
                f"{_med(runs, 'rss') / _med(w, 'rss'):.2f}×",
                f"{min(r['min_available_mib'] for r in runs)} MiB",
                f"{verdicts}, {med['summary']['mode']} ({med['summary']['mode_reason']})",
                _timings(med["summary"], med["wall"]) + " (median-wall run)",
                f"{min(r['wall'] for r in runs):.1f}–{max(r['wall'] for r in runs):.1f} s"])
                + " |")
        lines += ["", f"Input: {row['params']:,} parameters, {_gib(row['bytes'])} bfloat16; "
                      f"`--mode auto` would pick by 16 bytes per parameter "
                      f"({_gib(16 * row['params'])}) against 60% of MemAvailable."]
    if "depths" in row:
        head = ("| Llama-3-70B widths | parameters | bfloat16 | convert: wall | peak RSS | "
                "verify --mode layers: wall | CPU | peak RSS | peak RSS / one layer in float32 "
                "| lowest MemAvailable | verdict | report's timings |")
        lines += [head, "|" + "---|" * head.count(" | ") + "---|"]
        for depth, d in row["depths"].items():
            v = d["verify"]
            med = sorted(v, key=lambda r: r["wall"])[len(v) // 2]
            layer32 = 4 * d["layer_params"] / MIB
            lines.append("| " + " | ".join([
                f"{depth} layers", f"{d['params'] / 1e9:.2f} B", _gib(d["bytes"]),
                _s(d["convert"]["wall"]), f"{d['convert']['rss']:.0f} MiB",
                _s(_med(v, "wall")), _s(statistics.median(r["user"] + r["sys"] for r in v)),
                f"{_med(v, 'rss'):.0f} MiB", f"{_med(v, 'rss') / layer32:.2f}×",
                f"{min(r['min_available_mib'] for r in v)} MiB",
                "/".join(sorted({f"{r['summary']['verdict'] or _ended(r)} (exit {r['rc']})"
                                 for r in v})),
                _timings(med["summary"], med["wall"])]) + " |")
        lines += ["", "RSS of each verify over time (GiB, every 5 s, from 1 s samples of "
                      "`/proc/PID/status`):", ""]
        for depth, d in row["depths"].items():
            for k, r in enumerate(d["verify"]):
                lines.append(f"- {depth} layers, run {k + 1} ({_s(r['wall'])}, exit {r['rc']}): "
                             f"{timeline(r)}")
        d = next(iter(row["depths"].values()))
        lp, ep = d["layer_params"], d["embed_params"]
        lines += ["", f"One decoder layer: {lp:,} parameters = {_gib(2 * lp)} in bfloat16, "
                      f"{_gib(4 * lp)} in float32, {_gib(8 * lp)} in float64; the embedding "
                      f"and the head: {ep:,} each = {_gib(2 * ep)} bfloat16, {_gib(4 * ep)} "
                      f"float32, {_gib(8 * ep)} float64."]
    if "verify" in row and "verify_swapped" in row:
        head = ("| llm-7b | wall | CPU | peak RSS | lowest MemAvailable | exit | verdict, mode "
                "| report's timings |")
        lines += [head, "|" + "---|" * head.count(" | ") + "---|"]
        for k, r in enumerate(row.get("read_both") or []):
            lines.append(f"| reading both files once ({_gib(r['bytes'])}), cold, in 8 MiB "
                         f"reads, before run {k + 1} | {_s(r['wall'])} | | | | | | |")
        steps = [("`convert`", row["convert"]),
                 *[(f"`verify` (no flag), run {i + 1}", r) for i, r in enumerate(row["verify"])],
                 ("`convert --map swap-kv-17.yaml`", row["convert_swapped"]),
                 ("`verify` of that (no flag, no `--map`)", row["verify_swapped"])]
        for label, r in steps:
            sm = r.get("summary") or {}
            lines.append("| " + " | ".join([
                label, _s(r["wall"]), _s(r["user"] + r["sys"]), f"{r['rss']:.0f} MiB",
                f"{r['min_available_mib']} MiB", str(r["rc"]),
                f"{sm['verdict']}, {sm['mode']} ({sm['mode_reason']})"
                if sm.get("verdict") else ("" if "convert" in label else _ended(r)),
                _timings(sm, r["wall"]) if sm.get("verdict") else ""]) + " |")
        lp, ep = row["layer_params"], row["embed_params"]
        lines += ["", f"Input: {row['params']:,} parameters, {_gib(row['bytes'])} bfloat16, "
                      f"three shards. One decoder layer: {lp:,} parameters ({_gib(4 * lp)} "
                      f"float32, {_gib(8 * lp)} float64); embedding and head {ep:,} each."]
        lines += ["", "RSS of each verify over time (GiB, every 10 s, from 1 s samples):", ""]
        for label, r in steps:
            if "verify" in label:
                lines.append(f"- {label.replace('`', '')}: {timeline(r, 10)}")
        sm = row["verify_swapped"]["summary"]
        lines += ["", "The wrong conversion's report (`--json`), as printed:", "",
                  "```",
                  f'"verdict": {json.dumps(sm["verdict"])}',
                  f'"mode": {json.dumps(sm["mode"])}',
                  f'"first_divergence": {json.dumps(sm["first_divergence"])}',
                  f'"message": {json.dumps(sm["message"])}',
                  f'"tensors"."counts": {json.dumps(sm["tensor_counts"])}',
                  *[f'"tensors"."deltas" (not identical): {json.dumps(d)}'
                    for d in sm["tensor_differs"]],
                  "```"]
    if row.get("phases"):
        lines += ["", _render_phases(row["phases"])]
    if "depths" in row:
        for depth, d in row["depths"].items():
            if d.get("phases"):
                lines += ["", _render_phases({f"{depth} layers": d["phases"]})]
    if imp:
        lines += ["", f"A process that only imports what a layers verify imports "
                      f"({', '.join(imp['heavy'])}; recorded on the tiny LLaMA): "
                      f"{_s(imp['wall'])}, {imp['rss']:.0f} MiB peak RSS."]
    goals = "; ".join(f"{text}: {'met' if ok else 'MISSED'}" for text, ok in row["goals"])
    lines += ["", f"Goals: {goals}."]
    return "\n".join(lines)


def _render_phases(ph: dict) -> str:
    """One or several verify_phases.py runs as a fenced block."""
    runs = ph if "phases" not in ph else {"": ph}
    out = ["Where the time goes (`verify_phases.py`, one instrumented run, own time per "
           "phase, peak RSS while it ran):", "", "```"]
    for name, run in runs.items():
        data = run.get("phases")
        if not data:
            out.append(f"== {name}: no phases recorded (exit {run.get('rc')})")
            continue
        out.append(f"== {name or run['label']}: wall {run['wall']:.1f} s, peak RSS "
                   f"{run['rss']:.0f} MiB, exit {run['rc']}, {run['summary'].get('verdict')}")
        if not data.get("finished", True):
            out.append("   NOT FINISHED (killed); running at its last record (2 s before): "
                       + " > ".join(data.get("running", [])))
        for p in sorted(data["phases"], key=lambda p: -p["own_s"]):
            if p["own_s"] < 0.05:
                continue
            out.append(f"{p['phase']:46s} {p['own_s']:8.1f} s {p['calls']:5d}× "
                       f"{p['peak_rss_mib']:7.0f} MiB")
    out.append("```")
    return "\n".join(out)
