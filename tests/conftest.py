"""Shared test setup."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile

import pytest

# what the ms-port command sets (ms_port.check.devices.prefer_fast_cpu_kernels): the
# suite's MindSpore forwards then use the same kernels whichever test runs first
os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")

# MindFormers' loggers resolve their folder at each get_logger call, from this variable or
# ./output: a test that imported it without ms-port's containment (or after a fixture had
# unset the variable) left output/log in the working folder, the repository's root. The
# containment itself is tested in a subprocess without it (test_llm.py).
# MindYOLO targets are recorded in a cache folder (ms_port.archs.yolo.record): the tests'
# records go to a folder of their own, never the user's
if "MS_PORT_CACHE" not in os.environ:
    os.environ["MS_PORT_CACHE"] = tempfile.mkdtemp(prefix="ms-port-tests-cache-")
    atexit.register(shutil.rmtree, os.environ["MS_PORT_CACHE"], ignore_errors=True)
if "LOCAL_DEFAULT_PATH" not in os.environ:
    os.environ["LOCAL_DEFAULT_PATH"] = tempfile.mkdtemp(prefix="ms-port-tests-mindformers-")
    atexit.register(shutil.rmtree, os.environ["LOCAL_DEFAULT_PATH"], ignore_errors=True)


def pytest_terminal_summary(terminalreporter):
    """How many differential-fuzzing cases ran and how each ended (the proof's size)."""
    fuzz = sys.modules.get("test_fuzz_differential")
    total = getattr(fuzz, "TOTAL", None)
    if total:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(total.items()) if k != "cases")
        terminalreporter.write_line(f"differential fuzzing: {total['cases']} cases: {counts}")


@pytest.fixture(autouse=True)
def _mindspore_counts_page_cache_as_free(monkeypatch):
    """mindspore.load_checkpoint refuses files larger than *free* memory (SC_AVPHYS_PAGES),
    so on a machine whose memory is mostly reclaimable page cache it fails at random. The
    tests use it to prove MindSpore reads our files, not to test that check."""
    try:
        from mindspore.train import serialization
    except ImportError:  # pragma: no cover
        return
    if hasattr(serialization, "_get_available_memory"):
        monkeypatch.setattr(serialization, "_get_available_memory", lambda: None)
