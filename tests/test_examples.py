"""Every example runs with no arguments on bundled defaults, and the notebook executes.

Each script runs as its own process with this interpreter, in an empty working directory
that must stay empty, and with a private TMPDIR whose ms-port folders must be gone
afterwards (torch leaves its own ``torchinductor_<user>`` cache there; that is not ours).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _run(script: str, tmp_path: Path, *args: str) -> str:
    cwd, tmp = tmp_path / "cwd", tmp_path / "tmp"
    cwd.mkdir()
    tmp.mkdir()
    result = subprocess.run([sys.executable, str(EXAMPLES / script), *args], cwd=cwd,
                            env={**os.environ, "TMPDIR": str(tmp)}, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert list(cwd.iterdir()) == [], "examples must not write into the working directory"
    assert [p.name for p in tmp.iterdir() if p.name.startswith("ms-port")] == []
    return result.stdout


def test_convert_resnet50(tmp_path):
    out = _run("convert_resnet50.py", tmp_path)
    assert "resnet50.pth  (torch-zip)" in out and "of 320" in out  # inspect
    assert "CONVERTED" in out and "matched: 267/267" in out and "bit-exact" in out
    assert "PASS: 1 output and" in out and "within their bounds" in out


def test_custom_model(tmp_path):
    out = _run("custom_model.py", tmp_path)
    assert "CONVERTED" in out and "matched: 10/10" in out and "bit-exact" in out
    for line in ("stem.conv.weight       <- features.0.weight      mapping (regex",
                 "stem.bn.moving_variance <- features.1.running_var mapping (regex",
                 "pos.embedding_table    <- pos.weight             rule (embedding)",
                 "norm.gamma             <- norm.weight            rule (layernorm)",
                 "head.weight            <- classifier.weight      mapping (segment"):
        assert line in out, line
    assert "PASS" in out and "input0 float32 [2, 3, 8, 8]" in out


def test_custom_model_writes_into_the_given_folder(tmp_path):
    work = tmp_path / "work" / "here"
    _run("custom_model.py", tmp_path, str(work))
    assert sorted(p.name for p in work.iterdir()) == ["tiny.ckpt", "tiny.pth", "tiny.yaml"]


def test_fix_a_mapping(tmp_path):
    out = _run("fix_a_mapping.py", tmp_path)
    assert "first attempt ok: False; written: False" in out
    assert "no source tensor for 'logits.weight' (3×16); closest: 'fc.weight' (3×16)" in out
    assert "# MISSING  no source tensor for 'logits.bias'" in out  # the saved plan
    assert "CONVERTED" in out and "matched: 6/6" in out and "bit-exact" in out
    assert "PASS" in out


def test_make_default_checkpoint(tmp_path):
    subprocess.run([sys.executable, str(EXAMPLES / "make_default_checkpoint.py"),
                    str(tmp_path / "r.pth"), "--arch", "resnet18"], check=True,
                   capture_output=True, cwd=tmp_path)
    import ms_port

    assert ms_port.inspect(tmp_path / "r.pth").total_tensors == 122


# --------------------------------------------------------------------------------------
# the notebook


def _notebook():
    import nbformat

    return nbformat.read(EXAMPLES / "notebook.ipynb", as_version=4)


def test_notebook_is_committed_without_outputs():
    nb = _notebook()
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.outputs == [] and c.execution_count is None for c in code)
    assert nb.metadata.kernelspec.name == "python3"


def test_notebook_executes(tmp_path, monkeypatch):
    import nbformat
    from ipykernel.kernelspec import write_kernel_spec
    from nbclient import NotebookClient

    # "python3" must be this interpreter (the venv with ms_port), not whatever kernel the
    # machine or the user has registered under that name: JUPYTER_PATH is searched first
    write_kernel_spec(tmp_path / "jupyter" / "kernels" / "python3")
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    cwd, tmp = tmp_path / "cwd", tmp_path / "tmp"
    cwd.mkdir()
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))

    nb = _notebook()
    nb.cells.insert(0, nbformat.v4.new_code_cell("import sys; print(sys.executable)"))
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(cwd)}}).execute()

    probe, *cells = [c for c in nb.cells if c.cell_type == "code"]
    assert probe.outputs[0]["text"].strip() == sys.executable
    outputs = [o for c in cells for o in c.outputs]
    # each report shows once, as its cell's result; nothing prints
    assert [o["output_type"] for o in outputs] == ["execute_result"] * 7
    html = [o["data"]["text/html"] for o in outputs]
    expected = [["conv1.weight", "fc.bias", "of 320"],  # inspect
                ["CONVERTED", "bit-exact"],  # convert
                ["PLAN OK", "end_point.weight", "rule (batchnorm)"],  # report.plan
                ["PASS", "within their bounds"],  # verify
                ["NOT CONVERTED", "closest: &#x27;fc.weight&#x27;"],  # strict refusal
                ["CONVERTED", "matched: 4/4"],  # after the fix
                ["PASS"]]  # verify the fix
    for page, facts in zip(html, expected):
        for fact in facts:
            assert fact in page, fact
    assert list(cwd.iterdir()) == []
    assert [p.name for p in tmp.iterdir() if p.name.startswith("ms-port")] == []  # rmtree'd


def test_make_tiny_llm(tmp_path):
    pytest.importorskip("transformers")  # the example saves a transformers model
    out = tmp_path / "tiny"
    subprocess.run([sys.executable, str(EXAMPLES / "make_tiny_llm.py"), str(out), "--kind",
                    "llama", "--dtype", "float32"], check=True, capture_output=True,
                   cwd=tmp_path)
    import ms_port
    from ms_port.read.sources import read_source

    assert ms_port.inspect(out).total_tensors == 21  # 2 layers x 9 + embedding, norm, head
    assert read_source(out).config["model_type"] == "llama"  # a directory, config found
