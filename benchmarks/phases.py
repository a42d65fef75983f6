"""Where one conversion spends its time and memory, phase by phase (in one process).

    python benchmarks/phases.py ms-port resnet50|synth-1g|synth-3g [--cprofile N]
    python benchmarks/phases.py ms-port llm-1b|llm-1b-fused [--cprofile N]
    python benchmarks/phases.py recipe  resnet50|synth-1g|synth-3g

Run the harness (or ``python benchmarks/inputs.py CASE``) first: the inputs come from
``benchmarks/.cache``. A thread samples ``/proc/self/status`` every 2 ms and the report
gives, per phase, its wall time, the RSS at its end and the highest RSS seen during it,
split into anonymous memory (arrays, heap) and file-backed pages (mapped files and
shared libraries, which RSS counts too). The process's own ``VmHWM`` closes the report.

ms-port's phases come from the library's own steps: imports, reading the source,
describing the target, planning, then the writer's progress callbacks (``write``,
``readback``: each tensor is read back beside the writer, and this phase is the wait for
the last of them and the check of the file's framing), then the rest (the fsync starts
after ``write``'s last step and runs beside the last read-backs; the rest waits for its
end, then renames). ``llm-1b``
(``-fused``: ``qkv_concat=true``) runs ``api.convert`` with
``ms_model="mindformers:llama"`` on the synthetic 1.1B LLaMA, its first phase
ending at the first tensor written. The recipe's phases are its lines: imports, ``torch.load``, the
``ms.Tensor`` loop, ``save_checkpoint``.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import inputs

OUT = inputs.CACHE / "out"


def status() -> dict[str, int]:
    """VmRSS, RssAnon, RssFile, VmHWM of this process, in KiB."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                out[key] = int(rest.split()[0])
    return out


class Phases:
    """Marks phases and samples RSS in the background."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.marks: list[tuple[str, float]] = []
        self.peaks: dict[str, dict[str, int]] = {}
        self.current = "start"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            s, phase = status(), self.current
            peak = self.peaks.setdefault(phase, {"VmRSS": 0, "RssAnon": 0, "RssFile": 0})
            if s["VmRSS"] > peak["VmRSS"]:
                peak.update(VmRSS=s["VmRSS"], RssAnon=s["RssAnon"], RssFile=s["RssFile"])
            time.sleep(0.002)

    def mark(self, phase: str) -> None:
        """The previous phase ends now; ``phase`` begins."""
        if phase != self.current:
            self.marks.append((self.current, time.perf_counter()))
            self.current = phase

    def report(self) -> str:
        self.mark("end")
        self._stop.set()
        self._thread.join()
        lines = [f"{'phase':28s} {'wall':>8s} {'peak RSS':>10s} {'(anon':>8s} {'file)':>8s}"]
        t0 = self.start
        for phase, t in self.marks:
            if phase == "start":
                t0 = t
                continue
            p = self.peaks.get(phase)
            mem = (f"{p['VmRSS'] / 1024:8.0f} MiB {p['RssAnon'] / 1024:6.0f} M "
                   f"{p['RssFile'] / 1024:6.0f} M" if p else f"{'(too short to sample)':>30s}")
            lines.append(f"{phase:28s} {t - t0:7.2f}s {mem}")
            t0 = t
        s = status()
        lines.append(f"{'total':28s} {t0 - self.start:7.2f}s   VmHWM {s['VmHWM'] / 1024:.0f} MiB")
        return "\n".join(lines)


def case_args(case: str) -> tuple[Path, dict, list[str]]:
    """(source, ms-port target kwargs, recipe flags)."""
    if case == "resnet50":
        return inputs.resnet50_path(), {"arch": "resnet50"}, ["--resnet"]
    size = case.removeprefix("synth-")
    return inputs.synth_path(size), {"target": str(inputs.template_path(size))}, []


def profile_ms_port(case: str, ph: Phases, cprofile: int) -> None:
    ph.mark("import ms_port.api")
    from ms_port import api
    from ms_port.match.plan import make_plan
    from ms_port.write.writers import write_plan

    out = OUT / "phases-ms-port.ckpt"

    def progress(phase: str, done: int, total: int) -> None:
        if phase == "write" and done >= total:  # the last tensor is out
            ph.mark("flush (fsync alongside)")
        elif phase == "write":
            ph.mark("write (next tensor prepared, last ones read back, meanwhile)")
        elif phase == "readback":
            ph.mark("last read-backs, framing")

    if case.startswith("llm-1b"):
        options = {"qkv_concat": True} if case.endswith("-fused") else None
        ph.mark("read, target, plan, 1st tensor")

        def go() -> None:
            api.convert(inputs.llm_dir("1b"), output=out, ms_model="mindformers:llama",
                        ms_options=options, force=True, progress=progress)
    else:
        src_path, target, _ = case_args(case)
        ph.mark("read source (list tensors)")
        src = api.read_source(src_path)
        ph.mark("resolve target")
        tgt = api.resolve_target(**target)
        table = api.resolve_mapping(None, arch=target.get("arch"))
        ph.mark("plan")
        plan = make_plan(src, tgt, table)
        ph.mark("write (next tensor prepared, last ones read back, meanwhile)")

        def go() -> None:
            write_plan(plan, out, force=True, progress=progress)

    if cprofile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.runcall(go)
        ph.mark("rename, report")
        print(ph.report())
        pstats.Stats(prof).sort_stats("tottime").print_stats(cprofile)
    else:
        go()
        ph.mark("rename, report")
        print(ph.report())
    out.unlink(missing_ok=True)


def profile_recipe(case: str, ph: Phases) -> None:
    src_path, _, flags = case_args(case)
    ph.mark("import torch")
    import torch

    ph.mark("import mindspore")
    import mindspore as ms
    from recipe import BN_PT2MS, RESNET

    out = OUT / "phases-recipe.ckpt"
    ph.mark("torch.load")
    par_dict = torch.load(src_path, map_location="cpu")
    ph.mark("rename + ms.Tensor loop")
    params_list = []
    for name in par_dict:
        parameter = par_dict[name]
        if "num_batches_tracked" in name:
            continue
        if flags:
            parts = name.split(".")
            if "bn" in name or "downsample.1" in name:
                parts[-1] = BN_PT2MS[parts[-1]]
            name = ".".join(RESNET.get(p, p) for p in parts)
        params_list.append({"name": name, "data": ms.Tensor(parameter.numpy())})
    ph.mark("save_checkpoint")
    ms.save_checkpoint(params_list, str(out))
    print(ph.report())
    out.chmod(0o600)
    out.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tool", choices=["ms-port", "recipe"])
    parser.add_argument("case", choices=["resnet50", "synth-1g", "synth-3g", "llm-1b",
                                         "llm-1b-fused"])
    parser.add_argument("--cprofile", type=int, default=0, metavar="N",
                        help="also print the N functions with the most own time (ms-port)")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    ph = Phases()
    if args.case.startswith("llm-1b") and args.tool != "ms-port":
        raise SystemExit("llm-1b: ms-port only (MindFormers' converter: run.py --cases llm-1b)")
    if args.tool == "ms-port":
        profile_ms_port(args.case, ph, args.cprofile)
    else:
        profile_recipe(args.case, ph)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
