"""MindYOLO configuration files for the tests, written as MindYOLO's users hold them: a
model file whose ``__BASE__`` names a data file and an architecture file (relative paths).

MindYOLO's own configs are in its repository, not in its wheel. The layer tables here are
the published architectures (YOLOv8's, YOLO11's) in MindYOLO's module names; the model
files set the ``n`` scale.
"""

from __future__ import annotations

from pathlib import Path

import yaml

#: YOLOv8 in MindYOLO's names (ultralytics: Conv, Detect)
YOLOV8 = {
    "model_name": "yolov8", "nc": 80, "reg_max": 16, "stride": [8, 16, 32],
    "backbone": [
        [-1, 1, "ConvNormAct", [64, 3, 2]], [-1, 1, "ConvNormAct", [128, 3, 2]],
        [-1, 3, "C2f", [128, True]], [-1, 1, "ConvNormAct", [256, 3, 2]],
        [-1, 6, "C2f", [256, True]], [-1, 1, "ConvNormAct", [512, 3, 2]],
        [-1, 6, "C2f", [512, True]], [-1, 1, "ConvNormAct", [1024, 3, 2]],
        [-1, 3, "C2f", [1024, True]], [-1, 1, "SPPF", [1024, 5]]],
    "head": [
        [-1, 1, "Upsample", ["None", 2, "nearest"]], [[-1, 6], 1, "Concat", [1]],
        [-1, 3, "C2f", [512]],
        [-1, 1, "Upsample", ["None", 2, "nearest"]], [[-1, 4], 1, "Concat", [1]],
        [-1, 3, "C2f", [256]],
        [-1, 1, "ConvNormAct", [256, 3, 2]], [[-1, 12], 1, "Concat", [1]],
        [-1, 3, "C2f", [512]],
        [-1, 1, "ConvNormAct", [512, 3, 2]], [[-1, 9], 1, "Concat", [1]],
        [-1, 3, "C2f", [1024]],
        [[15, 18, 21], 1, "YOLOv8Head", ["nc", "reg_max", "stride"]]],
}
#: the n scale of each (depth, width, max channels)
SCALE_N = {"depth_multiple": 0.33, "width_multiple": 0.25, "max_channels": 1024}


def write_config(root: Path, network: dict = YOLOV8, *, nc: int = 80,
                 name: str = "yolov8n") -> Path:
    """``root/configs/<model>/<name>.yaml`` with ``__BASE__: [../data.yaml, ./base.yaml]``,
    as MindYOLO's own configs are laid out; returns the model file."""
    folder = root / "configs" / network["model_name"]
    folder.mkdir(parents=True, exist_ok=True)
    (root / "configs" / "data.yaml").write_text(yaml.safe_dump(
        {"data": {"dataset_name": "tiny", "nc": nc, "names": [str(i) for i in range(nc)]}}))
    (folder / "base.yaml").write_text(yaml.safe_dump({"epochs": 1, "img_size": 64,
                                                      "network": network}, sort_keys=False))
    model = folder / f"{name}.yaml"
    model.write_text("__BASE__: [\n  '../data.yaml',\n  './base.yaml'\n]\n"
                     + yaml.safe_dump({"network": SCALE_N}, sort_keys=False))
    return model
