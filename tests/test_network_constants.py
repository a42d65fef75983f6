"""A PyTorch buffer that the MindSpore network also builds itself, from its config: checked.

YOLOv5's head keeps its anchors in grid units as a buffer; MindYOLO's YOLOv5 head builds
the same ``anchors`` from its config file. The network's value stands, so the checkpoint's
must equal it: YOLOv5's training re-fits anchors to the data set, and a network built with
the config's anchors would draw every box at another size.
"""

from __future__ import annotations

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")
torch = pytest.importorskip("torch")

import ms_port  # noqa: E402

#: YOLOv5's default anchors (pixels) over the strides 8, 16, 32: grid units
ANCHORS = (np.array([[10, 13, 16, 30, 33, 23], [30, 61, 62, 45, 59, 119],
                     [116, 90, 156, 198, 373, 326]], np.float32).reshape(3, 3, 2)
           / np.array([8, 16, 32], np.float32).reshape(3, 1, 1))


class TorchHead(torch.nn.Module):
    def __init__(self, anchors: np.ndarray):
        super().__init__()
        self.m = torch.nn.Conv2d(4, 6, 1)
        self.register_buffer("anchors", torch.from_numpy(anchors.copy()))


class MsHead(ms.nn.Cell):
    def __init__(self):
        super().__init__()
        self.m = ms.nn.Conv2d(4, 6, 1, has_bias=True)
        self.anchors = ms.Parameter(ms.Tensor(ANCHORS), requires_grad=False)


class MsNet(ms.nn.Cell):
    """MindYOLO's nesting: ``model.model.N`` where YOLOv5 has ``model.N``."""

    def __init__(self):
        super().__init__()
        self.model = ms.nn.SequentialCell([ms.nn.Conv2d(3, 4, 3, has_bias=False), MsHead()])


class MsYolo(ms.nn.Cell):
    def __init__(self):
        super().__init__()
        self.model = MsNet()


def saved(tmp_path, anchors: np.ndarray, dtype=torch.float32):
    torch.manual_seed(0)
    path = tmp_path / "yolov5.pt"
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, bias=False), TorchHead(anchors))
    state = {f"model.{k}": v.to(dtype) if v.is_floating_point() else v
             for k, v in net.state_dict().items()}
    torch.save(state, path)
    return path


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_the_same_anchors_are_checked_and_accounted_for(tmp_path, dtype):
    plan = ms_port.plan(saved(tmp_path, ANCHORS, dtype), ms_model=MsYolo())
    assert plan.ok, plan.problems()
    dropped = {d.name: d.reason for d in plan.dropped}
    assert "checked equal to model.model.1.anchors" in dropped["model.1.anchors"]
    assert {m.target: m.how for m in plan.matches}["model.model.1.anchors"] == "initialised"


def test_re_fitted_anchors_are_refused_showing_both(tmp_path):
    fitted = ANCHORS * np.float32(1.25)  # autoanchor: fitted to another data set
    plan = ms_port.plan(saved(tmp_path, fitted), ms_model=MsYolo())
    assert not plan.ok
    (difference,) = [d for d in plan.differences if d.kind == "constant"]
    assert difference.tensors == ("model.1.anchors", "model.model.1.anchors")
    text = difference.text
    assert "PyTorch's 'model.1.anchors' (3×3×2) holds [1.5625, 2.03125" in text
    assert "MindSpore's 'model.model.1.anchors' [1.25, 1.625" in text
    assert "× each level's stride" in text
    # the refusal leads with it, not with a list of tensors
    assert text in plan.problems()[0]
    report = ms_port.convert(saved(tmp_path, fitted), ms_model=MsYolo(),
                             output=tmp_path / "out.ckpt")
    assert not report.ok and "re-fits its anchors" in report.plan.problems()[0]
    assert not (tmp_path / "out.ckpt").exists()
