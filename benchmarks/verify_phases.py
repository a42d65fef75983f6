"""Where one ``ms-port verify`` process spends its time and memory, phase by phase.

    python benchmarks/verify_phases.py OUT.json -- verify SRC CKPT --ms-model M --json
    python benchmarks/verify_phases.py --show OUT.json

Runs the CLI in this process exactly as the ``ms-port`` script does (same arguments,
same exit), with the library's steps wrapped by module attribute: each wrapper adds its
time to a phase, and a thread samples ``/proc/self/status`` every 20 ms, charging the
RSS to the innermost phase running. At exit (the CLI's own exit runs the atexit handlers
before ``os._exit``), and every 2 s before it (a process the kernel kills for memory
leaves what it had), the phases are written to OUT.json: per phase its own time (nested
phases taken out), its calls and the highest RSS seen while it was innermost.

Why: the report's own ``timings`` cover the blocks' reading, building and the two
frameworks' runs, but not what comes before them (imports, listing the files, the plan,
the tensor check of every tensor through the plan) nor, inside the blocks, importing
MindSpore, the layer comparisons and the ``gc.collect`` after each block. The harness
(``run.py --cases llm-... --phases``) runs a verify command through this wrapper once,
beside the plain runs it measures; the plain runs stay the numbers of the tables.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import json
import os
import sys
import threading
import time

T0 = time.perf_counter()

#: (module, attribute, phase): what is wrapped. A phase's own time excludes the phases
#: that run inside it, so "verify: rest" is what no other phase accounts for.
PHASES = [
    ("ms_port.api", "verify", "verify: rest (inputs, choosing the mode, ...)"),
    ("ms_port.api", "_source", "list the source (safetensors headers, config)"),
    ("ms_port.api", "read_source", "list the checkpoint"),
    ("ms_port.check.language", "check_size", "size check (imports torch, transformers)"),
    ("ms_port.check.language", "family_builder", "MindSpore family builder"),
    ("ms_port.api", "_family_fits", "does the family fit (plan, rest)"),
    ("ms_port.api", "make_plan", "plan"),
    ("ms_port.api", "resolve_mapping", "mapping table"),
    ("ms_port.check.tensors", "compare_through_plan", "tensor check (every tensor via the plan)"),
    ("ms_port.check.tensors", "PlanCheck.check", "tensor check (a block's)"),
    ("ms_port.api", "_verify_by_layers", "layers: rest (target, checks)"),
    ("ms_port.check.blocks", "run_blocks", "blocks: rest (outputs, ...)"),
    ("ms_port.check.devices", "set_ms_device", "import MindSpore, set its device"),
    ("ms_port.check.blocks", "_run_piece", "blocks: build and run both sides"),
    ("ms_port.check.blocks", "_float32", "blocks: read tensors (as float32)"),
    ("ms_port.check.blocks", "_arrays", "blocks: read tensors (float32 or float64)"),
    ("ms_port.check.blocks", "_torch_float32", "blocks: PyTorch float32 passes (rest)"),
    ("ms_port.check.blocks", "_ms_passes", "blocks: MindSpore passes (rest)"),
    ("ms_port.check.blocks", "_torch_float64", "blocks: PyTorch float64 pass (rest)"),
    ("ms_port.check.reuse", "Arena.cast", "blocks: casts into reused memory"),
    ("ms_port.archs.llama.blocks", "LlamaBlocks.torch_network", "blocks: build the PyTorch block"),
    ("copy", "deepcopy", "blocks: deepcopy (for the float64 copy)"),
    ("torch.nn.modules.module", "Module.to", "torch Module.to (the float64 cast)"),
    ("ms_port.check.blocks", "record_torch", "blocks: PyTorch forward, recorded"),
    ("ms_port.check.blocks", "Measure.run", "blocks: PyTorch float64 / second input"),
    ("ms_port.archs.llama.blocks", "LlamaBlocks.torch_step", "blocks: PyTorch step"),
    ("ms_port.archs.llama.blocks", "LlamaBlocks.ms_network", "blocks: build the MindSpore block"),
    ("ms_port.check.blocks", "record_ms", "blocks: MindSpore forward, recorded"),
    ("ms_port.archs.llama.blocks", "LlamaBlocks.ms_step", "blocks: MindSpore step"),
    ("ms_port.check.blocks", "pair_events", "blocks: pair layers"),
    ("ms_port.check.blocks", "_layer_comparisons", "blocks: compare layers"),
    ("ms_port.check.blocks", "judge", "judge (verdict)"),
    ("gc", "collect", "gc.collect"),
    ("ms_port.api", "_verify_whole", "whole: rest"),
    ("ms_port.check.networks", "build_network", "whole: build a network"),
    ("ms_port.check.networks", "load_torch_weights", "whole: load PyTorch weights"),
    ("ms_port.check.networks", "load_ms_weights", "whole: load MindSpore weights"),
    ("ms_port.check.parity", "run_parity", "whole: forwards and comparisons"),
    ("ms_port.cli", "_finish", "print the report"),
]


def _status() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(rest.split()[0])
    return out


class Recorder:
    def __init__(self) -> None:
        self.stack: list[str] = ["outside the wrapped steps (start, exit)"]
        self.own: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        self.mark = time.perf_counter()
        self.lock = threading.Lock()
        self.path: str | None = None  # where the periodic dumps go, once set
        self.absent: list[str] = []  # wrapped steps this tree does not have
        self._stop = threading.Event()
        threading.Thread(target=self._sample, daemon=True).start()

    def _switch(self, now: float) -> None:
        top = self.stack[-1]
        self.own[top] = self.own.get(top, 0.0) + now - self.mark
        self.mark = now

    def enter(self, phase: str) -> None:
        with self.lock:
            self._switch(time.perf_counter())
            self.stack.append(phase)
            self.calls[phase] = self.calls.get(phase, 0) + 1

    def leave(self) -> None:
        with self.lock:
            self._switch(time.perf_counter())
            self.stack.pop()

    def beside(self, phase: str, seconds: float) -> None:
        """Time spent in ``phase`` on another thread: counted apart, not in the stack."""
        with self.lock:
            self.own[phase] = self.own.get(phase, 0.0) + seconds
            self.calls[phase] = self.calls.get(phase, 0) + 1

    def _sample(self) -> None:
        last = time.perf_counter()
        while not self._stop.wait(0.02):
            rss = _status()["VmRSS"]
            top = self.stack[-1]
            if rss > self.peak.get(top, 0):
                self.peak[top] = rss
            if self.path and time.perf_counter() - last > 2:
                self.dump(self.path, final=False)
                last = time.perf_counter()


    def dump(self, path: str, final: bool = True) -> None:
        with self.lock:
            self._switch(time.perf_counter())
            own = dict(self.own)
            stack = list(self.stack)
        if final:
            self._stop.set()
        phases = [{"phase": p, "own_s": s, "calls": self.calls.get(p, 1),
                   "peak_rss_mib": self.peak.get(p, 0) / 1024}
                  for p, s in own.items()]
        tmp = f"{path}.partial"
        with open(tmp, "w") as f:
            json.dump({"phases": phases, "wrapped_s": time.perf_counter() - T0,
                       "vmhwm_mib": _status()["VmHWM"] / 1024, "finished": final,
                       "running": stack, "not_in_this_tree": self.absent}, f, indent=1)
        os.replace(tmp, path)


def wrap(rec: Recorder) -> list[str]:
    """Wrap what :data:`PHASES` names; returns those this tree does not have (the library
    changes: a step that is gone is left out, not an error)."""
    absent = []
    for module, name, phase in PHASES:
        mod = importlib.import_module(module)
        *owners, name = name.split(".")  # Class.method: patched on the class
        for owner in owners:
            mod = getattr(mod, owner, None)
        fn = getattr(mod, name, None)
        if fn is None:
            absent.append(f"{module}.{'.'.join([*owners, name])}")
            continue

        @functools.wraps(fn)
        def timed(*args, __fn=fn, __phase=phase, **kwargs):
            if threading.current_thread() is not threading.main_thread():
                # on a helper thread (a block's tensor check while the block before it
                # runs): its own total, beside the main thread's phases, not nested in them
                t0 = time.perf_counter()
                try:
                    return __fn(*args, **kwargs)
                finally:
                    rec.beside(f"{__phase} [on a thread, beside the rest]",
                               time.perf_counter() - t0)
            rec.enter(__phase)
            try:
                return __fn(*args, **kwargs)
            finally:
                rec.leave()

        setattr(mod, name, timed)
    return absent


def show(path: str) -> str:
    with open(path) as f:
        data = json.load(f)
    rows = sorted(data["phases"], key=lambda p: -p["own_s"])
    lines = [f"{'phase':46s} {'own time':>9s} {'calls':>6s} {'peak RSS':>10s}"]
    for p in rows:
        lines.append(f"{p['phase']:46s} {p['own_s']:8.1f}s {p['calls']:6d} "
                     f"{p['peak_rss_mib']:7.0f} MiB")
    lines.append(f"{'total (from the wrapper start)':46s} {data['wrapped_s']:8.1f}s "
                 f"{'':6s} VmHWM {data['vmhwm_mib']:.0f} MiB")
    if not data.get("finished", True):
        lines.append("NOT FINISHED (killed?); running at the last dump: "
                     + " > ".join(data.get("running", [])))
    return "\n".join(lines)


def main() -> None:
    if sys.argv[1:2] == ["--show"]:
        print(show(sys.argv[2]))
        return
    out, sep, *args = sys.argv[1:]
    if sep != "--" or not args:
        raise SystemExit(__doc__)
    rec = Recorder()
    rec.enter("import ms_port, torch (the wrapped modules)")
    from ms_port.cli import run as cli  # the console script's entry point

    rec.absent = wrap(rec)
    rec.leave()
    rec.path = out
    atexit.register(rec.dump, out)
    sys.argv = ["ms-port", *args]
    sys.exit(cli())


if __name__ == "__main__":
    main()
