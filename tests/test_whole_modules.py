"""Modules pickled whole (ultralytics' best.pt/last.pt, torch.save(model)) read as data.

``torch.load(weights_only=True)`` refuses these files (their classes are globals it does not
allow). ms-port reads them without importing or running anything: a class global is a name,
the state BUILD would set is a plain dict, and the module tree gives the names
``state_dict()`` would. What would call code with arguments is refused, and a planted
``os.system`` never runs.
"""

from __future__ import annotations

import json
import pickle
import random
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from yolo_fakes import Planted, registered, save_ultralytics, tiny_detector

from ms_port.cli import main
from ms_port.errors import MsPortError, SourceError, UnsafePickleError
from ms_port.read import modules as whole
from ms_port.read.sources import read_source


@pytest.fixture(scope="module")
def detector():
    return tiny_detector()


@pytest.fixture(scope="module")
def files(detector, tmp_path_factory):
    root = tmp_path_factory.mktemp("yolo")
    return {form: save_ultralytics(root / f"{form}.pt", detector, form=form)
            for form in ("released", "training", "both")}


def _expected(model: torch.nn.Module, ema: bool = False) -> dict[str, np.ndarray]:
    import copy

    model = copy.deepcopy(model)
    if ema:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01)
    return {k: v.numpy() for k, v in model.half().state_dict().items()}


@pytest.mark.parametrize("form, key", [("released", "model"), ("training", "ema"),
                                       ("both", "ema")])
def test_ultralytics_files_read_as_state_dict_without_their_code(detector, files, form, key):
    """Every name, shape, dtype (float16 as stored) and byte of state_dict(); the report
    says which entry it read and why."""
    source = read_source(files[form])
    want = _expected(detector, ema=key == "ema")
    assert list(source.tensors) == list(want)  # the state_dict's own order
    for name, array in want.items():
        got = source.tensors[name].load()
        assert got.dtype == array.dtype and np.array_equal(got, array), name
    assert "model.2.scratch" not in source.tensors  # a non-persistent buffer
    assert source.unwrapped == [key]
    assert any("whole pickled 'ultralytics.nn.tasks.DetectionModel'" in n
               and "neither imported nor run" in n for n in source.notes)
    if form == "both":
        assert any("read 'ema'" in n and "--key model" in n for n in source.notes)


def test_reading_needs_no_ultralytics_and_imports_none(files):
    """In a process where ultralytics cannot be imported (whether or not it is installed),
    the file reads, and nothing of it was imported."""
    import subprocess

    code = ("import sys; sys.modules['ultralytics'] = None\n"
            "from ms_port.read.sources import read_source\n"
            f"s = read_source({str(files['both'])!r})\n"
            "print(len(s), s.unwrapped, sorted(m for m in sys.modules if 'ultralytics' in m))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "47 ['ema'] ['ultralytics']"  # the blocked entry only

def test_key_picks_the_other_copy_and_never_tracebacks(detector, files):
    other = read_source(files["both"], key="model")
    assert other.unwrapped == ["model"]
    want = _expected(detector)
    assert all(np.array_equal(other.tensors[k].load(), v) for k, v in want.items())
    with pytest.raises(SourceError, match=r"'model' holds NoneType, not tensors; keys beside "
                                          r"it: .*ema.* — pass another --key"):
        read_source(files["training"], key="model")
    with pytest.raises(SourceError, match="no container 'nope'"):
        read_source(files["released"], key="nope")


def test_inspect_lists_it_on_the_command_line(files):
    from click.testing import CliRunner

    done = CliRunner().invoke(main, ["inspect", str(files["training"]), "--json"])
    assert done.exit_code == 0, done.output
    report = json.loads(done.output)
    assert report["total_tensors"] == 47 and report["unwrapped"] == ["ema"]
    assert {t["dtype"] for t in report["tensors"]} == {"float16", "int64"}
    assert any("DetectionModel" in n for n in report["notes"])
    assert {s["name"] for s in report["skipped"]} >= {"train_args", "optimizer", "model"}
    done = CliRunner().invoke(main, ["inspect", str(files["training"]), "--key", "model"])
    assert done.exit_code == 2
    assert "holds NoneType" in done.output and "Traceback" not in done.output


def test_a_module_saved_whole_with_torch_save(tmp_path):
    """torch.save(model): the file is the module itself."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4),
                              torch.nn.Sequential(torch.nn.Linear(4, 2)))
    torch.save(net, tmp_path / "net.pt")
    source = read_source(tmp_path / "net.pt")
    assert list(source.tensors) == list(net.state_dict())
    assert all(np.array_equal(source.tensors[k].load(), v.numpy())
               for k, v in net.state_dict().items())
    assert source.notes and "torch.nn.modules.container.Sequential" in source.notes[0]


def test_a_planted_os_system_never_runs_and_is_refused(detector, tmp_path):
    sentinel = tmp_path / "ran"
    path = save_ultralytics(tmp_path / "planted.pt", detector,
                            train_args={"model": Planted(f"touch {sentinel}")})
    with pytest.raises(UnsafePickleError) as refused:
        read_source(path)
    assert not sentinel.exists()
    message = str(refused.value)
    assert "system" in message and "code, not data" in message
    assert "Nothing was executed" in message


def test_a_call_inside_the_module_tree_is_refused(detector, tmp_path):
    import copy

    model = copy.deepcopy(detector)
    model.model[0].hostile = Planted("true")
    path = save_ultralytics(tmp_path / "inside.pt", model)
    with pytest.raises(UnsafePickleError, match="system"):
        read_source(path)


def _rewrite_pickle(path: Path, out: Path, edit) -> Path:
    """The archive with its data.pkl's loaded-by-us tree edited and re-pickled by torch
    (via a module tree of plain objects)."""
    with zipfile.ZipFile(path) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename.endswith("data.pkl"):
                data = edit(data)
            zout.writestr(info, data)
    return out


def test_a_module_tree_that_contains_itself_or_nests_too_deep_is_one_line(tmp_path):
    net = torch.nn.Sequential(torch.nn.Linear(2, 2))
    net._modules["again"] = net  # a cycle: state_dict() would recurse forever
    torch.save(net, tmp_path / "cycle.pt")
    with pytest.raises(SourceError, match="module tree contains itself"):
        read_source(tmp_path / "cycle.pt")
    deep = torch.nn.Linear(2, 2)
    for _ in range(whole.MAX_DEPTH + 1):
        deep = torch.nn.Sequential(deep)
    torch.save(deep, tmp_path / "deep.pt")
    with pytest.raises(SourceError, match=f"nested more than {whole.MAX_DEPTH} deep"):
        read_source(tmp_path / "deep.pt")


def test_shared_children_are_named_as_state_dict_names_them_and_bounded(tmp_path, monkeypatch):
    shared = torch.nn.Linear(2, 2)
    net = torch.nn.Sequential(shared, shared)
    torch.save(net, tmp_path / "shared.pt")
    assert list(read_source(tmp_path / "shared.pt").tensors) == list(net.state_dict())
    # sharing at every level doubles the names per level: bounded, not 2^30 (the bound
    # lowered here: walking to the real one's 2^20 names took 10 s of the suite)
    monkeypatch.setattr(whole, "MAX_NAMES", 4096)
    tree: torch.nn.Module = torch.nn.Linear(1, 1)
    for _ in range(30):
        tree = torch.nn.Sequential(tree, tree)
    torch.save(tree, tmp_path / "doubling.pt")
    with pytest.raises(SourceError, match=r"more than .* tensor names"):
        read_source(tmp_path / "doubling.pt")


def test_unsafe_pickle_names_the_missing_module_not_corruption(detector, tmp_path):
    path = save_ultralytics(tmp_path / "missing.pt", detector, prefix="yolo_not_installed")
    with pytest.warns(UserWarning, match="without weights_only"), \
            pytest.raises(SourceError) as missing:
        read_source(path, unsafe_pickle=True)
    message = str(missing.value)
    assert "'yolo_not_installed'" in message and "not importable" in message
    assert "corrupt" not in message and "drop --unsafe-pickle" in message
    # and without the flag the same file reads as data
    assert len(read_source(path)) == 47


def test_with_the_module_importable_unsafe_pickle_reads_the_same(detector, files):
    with registered(), pytest.warns(UserWarning):
        trusted = read_source(files["released"], unsafe_pickle=True)
    data = read_source(files["released"])
    assert list(trusted.tensors) == list(data.tensors)
    assert all(np.array_equal(trusted.tensors[k].load(), data.tensors[k].load())
               for k in data.tensors)


def test_real_ultralytics_checkpoint_reads_as_its_own_state_dict(tmp_path):
    """With ultralytics installed (a test extra), its own yolov8n file: the names and bytes
    of its DetectionModel.state_dict(), read without importing it."""
    ultralytics = pytest.importorskip("ultralytics")
    from ultralytics.nn.tasks import DetectionModel

    model = DetectionModel("yolov8n.yaml", nc=80, verbose=False)
    torch.save({"model": model.half(), "ema": None, "train_args": {},
                "version": ultralytics.__version__}, tmp_path / "yolov8n.pt")
    source = read_source(tmp_path / "yolov8n.pt")
    want = model.state_dict()
    assert list(source.tensors) == list(want) and len(want) == 355
    assert all(np.array_equal(source.tensors[k].load(), v.numpy()) for k, v in want.items())


def test_mutated_module_files_are_read_or_refused_never_worse(files, tmp_path):
    """Bytes flipped in a whole-module pickle: ours reads it (a module tree, every tensor's
    geometry checked) or refuses it in one line; never another exception, never a call."""
    import zipfile

    with zipfile.ZipFile(files["released"]) as zf:
        name = next(n for n in zf.namelist() if n.endswith("data.pkl"))
        base = zf.read(name)
    outcomes = {"read": 0, "refused": 0}
    for i in range(60):
        rng = random.Random(f"module-{i}")
        data = bytearray(base)
        for _ in range(rng.choice([1, 2, 4])):
            at = rng.randrange(2, len(data) - 1)
            data[at] = rng.choice(b"(tRbsue.c\x81\x85\x86\x87N}]") if rng.random() < .5 \
                else data[at] ^ (1 << rng.randrange(8))
        out = _rewrite_pickle(files["released"], tmp_path / f"m{i}.pt", lambda _, d=bytes(data): d)
        try:
            source = read_source(out)
            for info in source.tensors.values():
                info.load()
            outcomes["read"] += 1
        except MsPortError:
            outcomes["refused"] += 1
    assert outcomes["refused"], outcomes
    with pytest.raises(pickle.UnpicklingError):  # torch refuses the original outright
        torch.load(files["released"], weights_only=True)


def test_numpy_metrics_as_older_ultralytics_files_keep_them_read_as_data(detector, tmp_path):
    """ultralytics before 8.1 kept train_metrics and best_fitness as numpy floats (pickled
    as numpy.core.multiarray.scalar of a dtype and its bytes): read as numbers, the file's
    tensors as before; an object dtype is still refused."""
    metrics = {"metrics/mAP50(B)": np.float64(0.5), "fitness": np.float32(0.25),
               "epochs": np.int64(3), "ok": np.bool_(True)}
    path = save_ultralytics(tmp_path / "old.pt", detector, train_metrics=metrics,
                            best_fitness=np.float64(0.75))
    source = read_source(path)
    assert len(source) == 47
    from ms_port.read import torchzip

    tree = torchzip.load(path, modules=True)
    assert tree["best_fitness"] == 0.75 and tree["train_metrics"] == metrics
    hostile = save_ultralytics(tmp_path / "objects.pt", detector,
                               train_metrics={"x": np.array([object()], dtype=object)})
    with pytest.raises(UnsafePickleError):
        read_source(hostile)
