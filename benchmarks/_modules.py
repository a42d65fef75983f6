"""Which modules a command imports, and a process that imports only those.

    python benchmarks/_modules.py record OUT.json SCRIPT [ARGS...]
    python benchmarks/_modules.py import OUT.json

``record`` runs a Python script (``benchmarks/recipe.py``, or the ``ms-port`` console
script) in this process exactly as ``python SCRIPT ARGS`` would, then writes the names
in ``sys.modules`` at its end. ``import`` imports those modules again, in the same order,
and does nothing else: its peak RSS is the "imports-only" baseline of that command —
what the interpreter plus that tool's libraries cost before any tensor is touched.

These runs are never timed; they answer "did inspect import torch or MindSpore?" and
give the baseline that "above imports" is measured from.
"""

import atexit
import contextlib
import importlib
import json
import runpy
import sys


def record(out: str, script: str, args: list[str]) -> None:
    """Run the script; write the modules at exit. From an atexit handler: the ``ms-port``
    script ends with ``os._exit`` (it skips the interpreter's teardown), after running
    the atexit handlers, so code after the script's run would never be reached."""
    sys.argv = [script, *args]

    def dump() -> None:
        with open(out, "w") as f:
            json.dump({"modules": list(sys.modules)}, f)

    atexit.register(dump)
    runpy.run_path(script, run_name="__main__")


def import_only(path: str) -> None:
    with open(path) as f:
        names = json.load(f)["modules"]
    for name in names:
        if name == "__main__" or name in sys.modules:
            continue
        # a module that imports only as a side effect of another may fail alone
        with contextlib.suppress(BaseException):
            importlib.import_module(name)


if __name__ == "__main__":
    if sys.argv[1:2] == ["record"]:
        record(sys.argv[2], sys.argv[3], sys.argv[4:])
    elif sys.argv[1:2] == ["import"]:
        import_only(sys.argv[2])
    else:
        raise SystemExit(__doc__)
