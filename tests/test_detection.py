"""Detection: ultralytics checkpoints into MindYOLO (``--ms-model mindyolo:CONFIG.yaml``).

The ultralytics file is read as data (a whole pickled DetectionModel in float16, never run);
MindYOLO's network is built from the config file its users train with (``__BASE__`` files
merged, every layer-table string checked before MindYOLO evals it). The conversion takes no
mapping file: the structure aligns. MindYOLO's forward, loaded with the conversion, computes
ultralytics' output (B×84×N there, B×N×84 here) within float32 rounding, with BatchNorm
statistics estimated on data; a swapped pair of head convolutions does not.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from yolo_configs import YOLOV8, write_config

import ms_port
from ms_port.archs.yolo import mindyolo as mindyolo
from ms_port.errors import TargetError

# -- the config file, without MindYOLO -------------------------------------------------------


def test_base_files_merge_as_mindyolo_merges_them(tmp_path):
    model = write_config(tmp_path)
    config = mindyolo.read_config(model)
    assert config["data"]["nc"] == 80 and config["epochs"] == 1
    # the model file's keys over its bases', dicts merged key by key
    assert config["network"]["width_multiple"] == 0.25
    assert config["network"]["model_name"] == "yolov8"
    assert config["network"]["head"][-1][2] == "YOLOv8Head"
    network, nc = mindyolo.network_of(config, "x")
    assert nc == 80 and network is config["network"]


def _variant(tmp_path: Path, **changes) -> Path:
    network = copy.deepcopy(YOLOV8)
    network.update(changes)
    return write_config(tmp_path, network)


@pytest.mark.parametrize("where, bad, says", [
    ("args", "__import__('os').system('touch x')", "expression MindYOLO would eval"),
    ("args", "nc*2", "expression MindYOLO would eval"),
    ("args", "k=open('x')", "expression MindYOLO would eval"),
    # an activation of numbers is MindYOLO's own (yolox-darknet53); nothing else that looks so
    ("args", "act=nn.LeakyReLU(__import__('os').system('touch x'))",
     "expression MindYOLO would eval"),
    ("args", "act=os.system(0)", "expression MindYOLO would eval"),
    ("args", "act=nn.LeakyReLU(alpha=0.1)", "expression MindYOLO would eval"),
    ("args", "act=nn.Dense(4, 4)", "expression MindYOLO would eval"),
    ("args", "act=nn.LeakyReLU(True)", "expression MindYOLO would eval"),
    ("module", "__import__('os').getcwd()", "is not a name"),
])
def test_a_layer_table_string_mindyolo_would_eval_as_code_is_refused(tmp_path, where, bad,
                                                                       says):
    network = copy.deepcopy(YOLOV8)
    row = network["head"][0]
    if where == "args":
        row[3] = [bad, 2, "nearest"]
    else:
        row[2] = bad
    model = write_config(tmp_path, network)
    with pytest.raises(TargetError, match=says):
        mindyolo.network_of(mindyolo.read_config(model), "cfg")
    # the same refusal before anything is imported, from the --ms-model spec
    torch.save({"w": torch.zeros(1)}, tmp_path / "w.pt")
    with pytest.raises(TargetError, match=says):
        ms_port.convert(tmp_path / "w.pt", ms_model=f"mindyolo:{model}",
                        output=tmp_path / "o.ckpt")
    assert not (tmp_path / "o.ckpt").exists() and not (tmp_path / "x").exists()


def test_an_activation_made_of_numbers_is_read_as_mindyolo_writes_it(tmp_path):
    network = copy.deepcopy(YOLOV8)
    network["backbone"][0][3] = [64, 3, 2, "act=nn.LeakyReLU(0.1)"]
    model = write_config(tmp_path, network)
    built, _ = mindyolo.network_of(mindyolo.read_config(model), "cfg")
    assert built["backbone"][0][3][-1] == "act=nn.LeakyReLU(0.1)"


def test_layer_indices_must_be_integers(tmp_path):
    network = copy.deepcopy(YOLOV8)
    network["head"][1][0] = [-1, "6"]
    with pytest.raises(TargetError, match="must be integers"):
        mindyolo.network_of(mindyolo.read_config(write_config(tmp_path, network)), "cfg")


def test_plain_names_and_keyword_names_pass(tmp_path):
    network = copy.deepcopy(YOLOV8)
    network["head"][0][3] = ["None", 2, "nearest", "align_corners=False", "scale=2.0"]
    mindyolo.network_of(mindyolo.read_config(write_config(tmp_path, network)), "cfg")


def test_config_errors_are_one_line(tmp_path):
    loop = tmp_path / "a.yaml"
    loop.write_text("__BASE__: ['./b.yaml']\n")
    (tmp_path / "b.yaml").write_text("__BASE__: ['./a.yaml']\n")
    with pytest.raises(TargetError, match="leads back to itself"):
        mindyolo.read_config(loop)
    with pytest.raises(TargetError, match=r"cannot read the MindYOLO config .*missing.yaml.* "
                                          r"not in its wheel"):
        mindyolo.read_config(tmp_path / "missing.yaml")
    aliased = tmp_path / "alias.yaml"
    aliased.write_text("a: &x [1]\nb: *x\n")
    with pytest.raises(TargetError, match="anchors and aliases"):
        mindyolo.read_config(aliased)
    (tmp_path / "nonc.yaml").write_text(yaml.safe_dump({"network": {"model_name": "yolov8"}}))
    with pytest.raises(TargetError, match=r"data\.nc is None"):
        mindyolo.network_of(mindyolo.read_config(tmp_path / "nonc.yaml"), "nonc.yaml")
    with pytest.raises(TargetError, match="expected a MindYOLO config file"):
        mindyolo.read_config(tmp_path / "x.json")


def test_without_mindyolo_the_target_says_what_to_install(tmp_path, monkeypatch):
    import importlib

    real = importlib.import_module

    def absent(name, *args):
        if name.startswith("mindyolo"):
            raise ImportError("No module named 'cv2'")
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", absent)
    with pytest.raises(TargetError, match=r"needs MindYOLO .*opencv-python-headless"):
        mindyolo.build(write_config(tmp_path))


# -- ultralytics' file into MindYOLO's network ---------------------------------------------


def _estimated(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """BatchNorm statistics estimated on data (a few seeded batches in train mode)."""
    gen = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.momentum = None  # the cumulative average
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.rand(2, 3, 64, 64, generator=gen))
    return model.eval()


@pytest.fixture(scope="module")
def yolov8(tmp_path_factory):
    """A seeded yolov8n saved as ultralytics saves a released best.pt, the MindYOLO config
    for it, and the float32 reference built from the float16 weights it holds."""
    pytest.importorskip("mindyolo")
    pytest.importorskip("cv2")
    ultralytics = pytest.importorskip("ultralytics")
    from ultralytics.nn.tasks import DetectionModel

    root = tmp_path_factory.mktemp("yolov8")
    torch.manual_seed(0)
    model = _estimated(DetectionModel("yolov8n.yaml", nc=80, verbose=False))
    torch.save({"date": "2026-11-28", "version": ultralytics.__version__, "epoch": -1,
                "model": copy.deepcopy(model).half(), "ema": None, "optimizer": None,
                "train_args": {"model": "yolov8n.yaml", "imgsz": 64}}, root / "best.pt")
    reference = copy.deepcopy(model).half().float().eval()
    return root, root / "best.pt", write_config(root), reference


def _mindyolo_output(config: Path, ckpt: Path, x: np.ndarray) -> np.ndarray:
    import mindspore as ms

    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    net = mindyolo.build(config)
    net.set_train(False)
    missing, _ = ms.load_param_into_net(net, ms.load_checkpoint(str(ckpt)))
    assert not missing
    return net(ms.Tensor(x))[0].asnumpy()


def test_yolov8_converts_with_no_mapping_file_and_computes_ultralytics_outputs(yolov8):
    root, best, config, reference = yolov8
    ckpt = root / "yolov8n.ckpt"
    report = ms_port.convert(best, ms_model=f"mindyolo:{config}", output=ckpt)
    assert report.ok
    summary = report.to_dict()
    assert summary["filled"] == summary["total"] == 299 and not summary["unused"]
    # no mapping file: the structure aligns; the head's stride is the network's own
    assert summary["counts"]["aligned"] == 298 and summary["counts"]["initialised"] == 1
    assert {d["reason"] for d in summary["dropped"]} == {
        "known drop: BatchNorm step counter; MindSpore's BatchNorm has none"}
    assert any("whole pickled" in n for n in report.plan.source.notes)
    x = np.random.default_rng(0).random((1, 3, 96, 96), dtype=np.float32)
    with torch.no_grad():
        want = reference(torch.from_numpy(x))[0].numpy()  # B x 84 x N
    got = _mindyolo_output(config, ckpt, x)  # B x N x 84
    assert got.shape == want.transpose(0, 2, 1).shape == (1, 189, 84)  # 144 + 36 + 9
    error = np.linalg.norm(got - want.transpose(0, 2, 1)) / np.linalg.norm(want)
    assert error < 3e-5, error


_CONVERT_AGAIN = """
import sys, ms_port
report = ms_port.convert(sys.argv[1], ms_model="mindyolo:" + sys.argv[2], output=sys.argv[3])
print(report.ok, sorted({m.split(".")[0] for m in sys.modules} & {"mindspore", "mindyolo"}))
"""


def test_a_configs_network_is_recorded_once_then_converted_without_mindspore(
        yolov8, tmp_path, monkeypatch):
    """The first conversion of a config records what alignment reads of MindYOLO's network
    (the head's stride, a constant, among it); a later one, in a fresh process, reads the
    record and imports neither MindSpore nor MindYOLO, and writes the same bytes. A
    record tampered with is not used: the network is built again and recorded over."""
    import os
    import subprocess
    import sys

    _, best, config, _ = yolov8
    cache = tmp_path / "cache"
    monkeypatch.setenv("MS_PORT_CACHE", str(cache))
    first = ms_port.convert(best, ms_model=f"mindyolo:{config}", output=tmp_path / "a.ckpt")
    assert any("recorded in" in n for n in first.plan.notes), first.plan.notes
    [record] = list((cache / "mindyolo").glob("*.json"))

    def again(out):
        run = subprocess.run([sys.executable, "-c", _CONVERT_AGAIN, str(best), str(config),
                              str(out)], capture_output=True, text=True, timeout=300,
                             env={**os.environ, "MS_PORT_CACHE": str(cache)})
        assert run.returncode == 0, run.stderr[-2000:]
        return run.stdout.split(None, 1)

    assert again(tmp_path / "b.ckpt") == ["True", "[]\n"]
    assert (tmp_path / "b.ckpt").read_bytes() == (tmp_path / "a.ckpt").read_bytes()
    held = json.loads(record.read_text())
    held["tensors"][0][1] = [-1]  # a shape no network has
    record.write_text(json.dumps(held))
    assert again(tmp_path / "c.ckpt")[0] == "True"  # built again (MindSpore imported)
    assert (tmp_path / "c.ckpt").read_bytes() == (tmp_path / "a.ckpt").read_bytes()
    assert json.loads(record.read_text())["tensors"][0][1] != [-1]  # recorded over


@pytest.mark.parametrize("bad", [
    "[" * 100_000 + "]" * 100_000,  # nested past the parser's recursion
    '{"format": 1, "cls": "x", "constants": {}, "tensors": [["w", [268435457], "float32", '
    'null, [], null]]}',  # more elements than any detector holds
    '{"format": 1, "cls": "x", "constants": {"w": [100000000000000000000]}, "tensors": '
    '[["w", [1], "int32", null, [], null]]}',  # a value no int32 holds
    '{"format": 1, "cls": "x", "constants": {}, "tensors": [["w", [2, -1], "float32", '
    'null, [], null]]}',
    '{"format": 1, "cls": "x", "constants": [], "tensors": []}',
])
def test_a_record_that_does_not_check_out_is_not_used(tmp_path, monkeypatch, bad):
    """The cache's record of a MindYOLO network is data read from disk: whatever it holds,
    it is used only as a record (else the network is built), never a traceback."""
    pytest.importorskip("mindyolo")
    from ms_port.archs.yolo import record

    monkeypatch.setenv("MS_PORT_CACHE", str(tmp_path / "cache"))
    config = write_config(tmp_path)
    path = record._path(str(config))
    path.parent.mkdir(parents=True)
    path.write_text(bad)
    assert record.recorded(f"mindyolo:{config}") is None


def test_swapped_head_convolutions_change_mindyolos_outputs(yolov8):
    """The twin: the same check is far off for a wrong conversion (two levels' box
    convolutions swapped), so the agreement above could have failed."""
    from ms_port.testing import rewrite_checkpoint

    root, best, config, reference = yolov8
    ckpt = root / "yolov8n-ok.ckpt"
    ms_port.convert(best, ms_model=f"mindyolo:{config}", output=ckpt)
    a, b = "model.model.22.cv2.0.2.weight", "model.model.22.cv2.1.2.weight"

    def swap(arrays: dict) -> None:
        arrays[a], arrays[b] = arrays[b], arrays[a]

    bad = rewrite_checkpoint(ckpt, root / "yolov8n-bad.ckpt", swap)
    x = np.random.default_rng(1).random((1, 3, 96, 96), dtype=np.float32)
    with torch.no_grad():
        want = reference(torch.from_numpy(x))[0].numpy().transpose(0, 2, 1)
    got = _mindyolo_output(config, bad, x)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) > 1e-3


def test_convert_on_the_command_line_names_the_module_read(yolov8, tmp_path):
    from click.testing import CliRunner

    from ms_port.cli import main

    _, best, config, _ = yolov8
    done = CliRunner().invoke(main, ["convert", str(best), "--ms-model", f"mindyolo:{config}",
                                     "-o", str(tmp_path / "o.ckpt"), "--json"])
    assert done.exit_code == 0, done.output
    report = json.loads(done.output)
    assert report["filled"] == 299 and report["ok"]
    human = CliRunner().invoke(main, ["convert", str(best), "--ms-model", f"mindyolo:{config}",
                                      "-o", str(tmp_path / "o.ckpt"), "--force"])
    assert human.exit_code == 0
    assert "whole pickled 'ultralytics.nn.tasks.DetectionModel'" in " ".join(human.output.split())
    assert "Parse Model" not in human.output and "uninitialized" not in human.output


# -- verify: the outputs paired across layouts ------------------------------------------------

#: inputs of 96x96: 189 anchors, not the 84 channels (at 64x64 both are 84: no layout shows)
SHAPE = (3, 96, 96)


def _verify(best: Path, ckpt: Path, config: Path, **kw):
    kw.setdefault("input_shape", SHAPE)
    return ms_port.verify(best, ckpt, ms_model=f"mindyolo:{config}",
                          torch_model="ultralytics", **kw)


def test_verify_passes_pairing_the_detectors_outputs_across_layouts(yolov8):
    """ultralytics' B×84×N against MindYOLO's B×N×84, and its boxes and scores (B×64×N,
    B×80×N) against MindYOLO's three per-level maps (B×144×Hᵢ×Wᵢ): compared, and said how;
    the PyTorch side built by ultralytics from the architecture the file describes."""
    root, best, config, _ = yolov8
    ckpt = root / "verify.ckpt"
    ms_port.convert(best, ms_model=f"mindyolo:{config}", output=ckpt)
    report = _verify(best, ckpt, config)
    assert report.verdict == "PASS", report.message
    by_name = {o.name: o for o in report.outputs}
    assert by_name["0"].layout == "MindSpore 1×189×84 compared transposed with PyTorch 1×84×189"
    joined = by_name["1.{boxes,scores}"]
    assert joined.torch_shape == (1, 144, 189) and "flattened and joined" in joined.layout
    assert all(o.error < o.bound and o.sensitivity > 10 * o.bound for o in report.outputs)
    assert report.layers_checked > 150
    assert any("outputs compared in another layout" in n for n in report.notes)


@pytest.mark.parametrize("edit, layer", [
    (("model.model.22.cv2.0.2.weight", "model.model.22.cv2.1.2.weight"), "model.model.22.cv2.0.2"),
    (("model.model.3.bn.moving_mean", "model.model.3.bn.moving_variance"), "model.model.3.bn"),
])
def test_a_wrong_conversion_fails_naming_the_layer(yolov8, tmp_path, edit, layer):
    from ms_port.testing import rewrite_checkpoint

    root, best, config, _ = yolov8
    ckpt = root / "verify.ckpt"
    if not ckpt.exists():
        ms_port.convert(best, ms_model=f"mindyolo:{config}", output=ckpt)
    a, b = edit

    def swap(arrays: dict) -> None:
        arrays[a], arrays[b] = np.abs(arrays[b]), arrays[a]

    report = _verify(best, rewrite_checkpoint(ckpt, tmp_path / "bad.ckpt", swap), config)
    assert report.verdict == "FAIL"
    assert f"first divergence at {layer} " in report.message and a in report.message


def test_a_randomly_initialised_detector_is_inconclusive_saying_why(yolov8, tmp_path):
    from ultralytics.nn.tasks import DetectionModel

    _, _, config, _ = yolov8
    torch.manual_seed(0)
    fresh = DetectionModel("yolov8n.yaml", nc=80, verbose=False).eval()
    torch.save({"model": fresh.half(), "ema": None}, tmp_path / "fresh.pt")
    ms_port.convert(tmp_path / "fresh.pt", ms_model=f"mindyolo:{config}",
                    output=tmp_path / "fresh.ckpt")
    report = _verify(tmp_path / "fresh.pt", tmp_path / "fresh.ckpt", config)
    assert report.verdict == "INCONCLUSIVE"
    assert "barely depends on the input" in report.message
    assert "estimate BatchNorm statistics" in report.message


def test_the_input_size_is_the_configs_img_size(tmp_path):
    from ms_port.read.targets import zoo_input_shape

    model = write_config(tmp_path)
    assert zoo_input_shape(f"mindyolo:{model}") == ((3, 64, 64), f"img_size 64 in '{model}'")


def _images(folder: Path, count: int = 2) -> Path:
    """Seeded synthetic photographs (gradients and noise), saved as JPEG files."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:120, 0:160]
    for i in range(count):
        img = np.stack([(x * (i + 1)) % 255, (y * 2) % 255, ((x + y) * 3 + 50 * i) % 255], -1)
        img = np.clip(img + rng.normal(0, 20, img.shape), 0, 255).astype(np.uint8)
        Image.fromarray(img).save(folder / f"img{i}.jpg")
    return folder


def test_verify_feeds_real_images_resized_and_scaled_for_the_detector(yolov8, tmp_path):
    root, best, config, _ = yolov8
    ckpt = root / "verify.ckpt"
    if not ckpt.exists():
        ms_port.convert(best, ms_model=f"mindyolo:{config}", output=ckpt)
    report = _verify(best, ckpt, config, inputs=_images(tmp_path / "photos"))
    assert report.verdict == "PASS", report.message
    assert report.batch == 2 and report.input_shape == SHAPE
    origin = report.inputs[0]["origin"]
    assert "img0.jpg, img1.jpg" in origin and "resized to 96×96, scaled to [0, 1]" in origin


def test_image_inputs_are_checked_and_prepared_per_target(tmp_path):
    from ms_port.check.images import ImageError, load_images, preparation

    photos = _images(tmp_path / "p", 1)
    detector = preparation((3, 32, 48), "mindyolo:x.yaml")
    batch, names = load_images(photos, detector)
    assert batch.shape == (1, 3, 32, 48) and names == ["img0.jpg"]
    assert batch.dtype == np.float32 and batch.min() >= 0.0 and batch.max() <= 1.0
    classifier = preparation((3, 32, 48), "mindcv:resnet18")
    normalised, _ = load_images(photos / "img0.jpg", classifier)
    assert np.allclose(normalised[0, 0], (batch[0, 0] - 0.485) / 0.229, atol=1e-5)
    (tmp_path / "fake.jpg").write_bytes(b"not an image")
    with pytest.raises(ImageError, match=r"fake\.jpg: not an image Pillow can decode"):
        load_images(tmp_path / "fake.jpg", detector)
    with pytest.raises(ImageError, match="3-channel input shape"):
        preparation((1, 28, 28), "mindcv:x")


def test_with_unsafe_pickle_the_checkpoints_own_module_is_the_pytorch_side(yolov8):
    """The user trusts the file (and has ultralytics): its own DetectionModel runs as the
    PyTorch side, said in a note."""
    root, best, config, _ = yolov8
    ckpt = root / "verify.ckpt"
    if not ckpt.exists():
        ms_port.convert(best, ms_model=f"mindyolo:{config}", output=ckpt)
    with pytest.warns(UserWarning, match="without weights_only"):
        report = ms_port.verify(best, ckpt, ms_model=f"mindyolo:{config}", unsafe_pickle=True,
                                input_shape=SHAPE)
    assert report.verdict == "PASS", report.message
    assert any("the checkpoint's own ultralytics.nn.tasks.DetectionModel, unpickled with its "
               "code" in n for n in report.notes)
