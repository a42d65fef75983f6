"""MindYOLO's zoo from the checkpoints people have: every MindYOLO 0.5.0 config paired with
the PyTorch network its users train (ultralytics', the original YOLOv5's), saved as its own
code saves it, converted with no mapping file, then verified.

    python benchmarks/mindyolo_zoo.py --configs ~/mindyolo/configs        # every pair
    python benchmarks/mindyolo_zoo.py --configs DIR --only yolov8n,yolo11n
    python benchmarks/mindyolo_zoo.py --from-json FILE --write-docs        # re-render a run

MindYOLO's configs are in its repository (``configs/``), not in its wheel: ``--configs``
names a clone's folder. A config is a model file where, with its ``__BASE__`` files, it
names ``network.model_name``.

**Twins are chosen by name, as data** (:data:`TWINS`): MindYOLO's yolov8, yolov9, yolov10
and yolov11 files are ultralytics' yolov8, yolov9, yolov10 and yolo11 at the same scale.
ultralytics' ``yolov3``/``yolov5`` are its anchor-free "u" versions, not MindYOLO's
anchor-based ones: paired, they must be refused naming the difference. MindYOLO's yolov4,
yolov7 and yolox have no twin here (listed); the original YOLOv5 (``yolov5`` 7.0 on the
package index, ``pip install --no-deps yolov5==7.0.14`` with matplotlib, pandas and seaborn)
is the twin of MindYOLO's yolov5 and, through its ``hub/yolov3.yaml``, of its yolov3: the
anchor-based networks they were ported from. Where it is not importable, its rows say so.

**Each pair** runs in a fresh process (``--one``): the PyTorch network built with seeded
weights and BatchNorm statistics estimated on 16 seeded synthetic scenes (:func:`scenes`:
shapes on smooth backgrounds), saved as its own code saves it (a whole pickled
``DetectionModel`` in float16; the original YOLOv5's head biases zeroed: its prior
objectness and class biases swamp what a random network sees); ``ms_port.convert(best.pt,
ms_model="mindyolo:CONFIG")`` with no mapping file; where it converted, ``ms_port.verify``
with ``--torch-model ultralytics`` (the original YOLOv5: its own module, ``--unsafe-pickle``)
at ``--size`` (160: more anchors than channels, and the
300 YOLOv10's head takes; a P6 network's input rounded up to a multiple of 64). A pair's
process is stopped after ``--timeout`` seconds.

No downloads: every weight is generated.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DOCS = ROOT / "docs" / "detection.md"
PY = sys.executable
BEGIN, END = "<!-- yolo-table:begin -->", "<!-- yolo-table:end -->"

#: MindYOLO config file name -> the PyTorch model yaml its users hold (the scale is in the
#: name): a regex on the file's stem, and how its twin is named from the match. A plain name
#: is ultralytics'; ``yolov5:`` names a file of the original YOLOv5's package (``yolov5``
#: 7.0 on the package index: ``models/`` and ``models/hub/``)
TWINS = (
    (r"yolov8([nslmx])", "yolov8{0}.yaml"),
    (r"yolov8([nslmx])6", "yolov8{0}6.yaml"),
    (r"yolov9-([tsmce])", "yolov9{0}.yaml"),
    (r"yolov10([nsmblx])", "yolov10{0}.yaml"),
    (r"yolov11-([nsmlx])", "yolo11{0}.yaml"),
    (r"yolov8([nslmx])-seg", "yolov8{0}-seg.yaml"),
    # anchor-free "u" versions of anchor-based MindYOLO networks: must be refused
    (r"yolov3", "yolov3u.yaml"),
    (r"yolov5([nslmx])", "yolov5{0}u.yaml"),
    (r"yolov5([nslmx])6", "yolov5{0}-p6u.yaml"),
    # the anchor-based originals MindYOLO's yolov3 and yolov5 were ported from
    (r"yolov3", "yolov5:hub/yolov3.yaml"),
    (r"yolov5([nslmx])", "yolov5:yolov5{0}.yaml"),
    (r"yolov5([nslmx])6", "yolov5:hub/yolov5{0}6.yaml"),
    # Megvii's YOLOX, by its experiment names (``yolox`` 0.3.0's exps/default)
    (r"yolox-(nano|tiny|s|m|l|x)", "yolox:yolox-{0}"),
    (r"yolox-darknet53", "yolox:yolov3"),
)
#: the original YOLOv5's twins' prefix, and YOLOX's
YOLOV5, YOLOX = "yolov5:", "yolox:"
#: how each kind of twin is named in the table
KINDS = {YOLOV5: "YOLOv5 7.0", YOLOX: "YOLOX 0.3.0"}


def configs(folder: Path) -> list[Path]:
    """The model files: those that (with their bases) name network.model_name."""
    sys.path.insert(0, str(ROOT))
    from ms_port.archs.yolo.mindyolo import read_config

    found = []
    for path in sorted(folder.rglob("*.yaml")):
        if "hyp" in path.name or "base" in path.stem:
            continue
        try:
            config = read_config(path)
        except Exception:  # a data or hyper-parameter file: no network
            continue
        network = config.get("network") or {}
        if isinstance(network, dict) and network.get("model_name") and network.get("head"):
            found.append(path)
    return found


def twins(path: Path) -> list[str]:
    found = []
    for pattern, name in TWINS:
        m = re.fullmatch(pattern, path.stem)
        if m:
            found.append(name.format(*m.groups()))
    return found


def scenes(n, size, seed):
    """Synthetic photos: a smooth background and 3-8 filled rectangles and discs of random
    colours, values in [0, 1], N×3×H×W float32."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size] / size
    out = np.empty((n, 3, size, size), np.float32)
    for i in range(n):
        a, b, c = rng.uniform(-1, 1, (3, 3))
        img = (0.5 + 0.25 * (a[:, None, None] * xx + b[:, None, None] * yy)
               + 0.1 * c[:, None, None]).astype(np.float32)
        for _ in range(rng.integers(3, 9)):
            colour = rng.uniform(0, 1, 3)[:, None]
            x0, y0 = rng.uniform(0, 0.8, 2)
            w, h = rng.uniform(0.08, 0.5, 2)
            if rng.random() < 0.5:
                m = (xx >= x0) & (xx < x0 + w) & (yy >= y0) & (yy < y0 + h)
            else:
                m = ((xx - x0 - w / 2) / (w / 2)) ** 2 + ((yy - y0 - h / 2) / (h / 2)) ** 2 <= 1
            img[:, m] = colour
        img += rng.normal(0, 0.02, img.shape).astype(np.float32)
        out[i] = np.clip(img, 0, 1)
    return out


def _build(twin_name: str) -> tuple[object, Callable[[object, Path], None], dict]:
    """The PyTorch network, seeded; how its own code saves it; and verify's PyTorch side."""
    import copy

    import torch

    torch.manual_seed(0)
    if twin_name.startswith(YOLOV5):  # the original YOLOv5, as its train.py saves it
        import yolov5
        from yolov5.models.yolo import DetectionModel

        cfg = Path(yolov5.__file__).parent / "models" / twin_name.removeprefix(YOLOV5)
        model = DetectionModel(str(cfg), nc=80)
        with torch.no_grad():  # its head's prior biases swamp the input at random weights
            for conv in model.model[-1].m:
                conv.bias.zero_()
        return model, lambda m, path: torch.save(
            {"epoch": -1, "best_fitness": None, "model": copy.deepcopy(m).half(), "ema": None,
             "updates": None, "optimizer": None, "opt": {}, "git": None, "date": "2026"},
            path), {"unsafe_pickle": True}  # its own pickled module: this run's own file
    if twin_name.startswith(YOLOX):  # Megvii's YOLOX, as its trainer saves it
        from yolox.exp import get_exp

        def built() -> object:
            torch.manual_seed(0)
            return get_exp(exp_name=twin_name.removeprefix(YOLOX)).get_model()

        model = built()

        def side() -> object:
            twin = built()
            twin.load_state_dict(model.state_dict())
            return twin.eval()

        return model, lambda m, path: torch.save(
            {"start_epoch": 300, "model": m.state_dict(), "optimizer": None}, path), {
                "torch_model": side}
    from ultralytics.nn import tasks

    cls = tasks.SegmentationModel if "-seg" in twin_name else tasks.DetectionModel
    return cls(twin_name, nc=80, verbose=False), lambda m, path: torch.save(
        {"model": copy.deepcopy(m).half(), "ema": None, "train_args": {}, "version": "8.4"},
        path), {"torch_model": "ultralytics"}  # built from the description the file holds


def one(config: str, twin_name: str, size: int, work: str) -> dict:
    """One pair, in this process: build, save, convert, verify."""
    import torch

    import ms_port

    started = time.perf_counter()
    model, save, theirs = _build(twin_name)
    model.eval()
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.momentum = None  # the cumulative average of the batches below
            m.train()  # only the BatchNorms: the heads' training forwards want labels
    with torch.no_grad():  # BatchNorm statistics estimated on data (synthetic scenes)
        for k in range(4):
            model(torch.from_numpy(scenes(4, size, seed=100 + k)))
    model.eval()
    best = Path(work) / "best.pt"
    save(model, best)
    out = {"config": config, "twin": twin_name,
           "parameters": sum(p.numel() for p in model.parameters())}
    try:
        report = ms_port.convert(best, ms_model=f"mindyolo:{config}",
                                 output=Path(work) / "out.ckpt")
    except ms_port.MsPortError as exc:
        out.update(outcome="refused", why=str(exc).splitlines()[0][:300])
        return out
    summary = report.to_dict()
    out.update(filled=summary["filled"], total=summary["total"],
               convert_s=round(time.perf_counter() - started, 1))
    if not report.ok:
        problems = report.plan.problems()
        out.update(outcome="refused",
                   why=(problems[0] if problems else report.message).splitlines()[0][:300])
        return out
    t0 = time.perf_counter()
    # images in [0, 1], as MindYOLO and ultralytics feed their detectors
    verified = ms_port.verify(best, Path(work) / "out.ckpt", ms_model=f"mindyolo:{config}",
                              input_shape=(3, size, size), input_range=[(0.0, 1.0)], **theirs)
    out.update(outcome="converted", verdict=verified.verdict, error=verified.error,
               message=verified.message[:300], verify_s=round(time.perf_counter() - t0, 1))
    return out


def run(folder: Path, only: set[str] | None, size: int, timeout: int) -> list[dict]:
    rows = []
    for path in configs(folder):
        names = twins(path)
        if only and path.stem not in only and not any(
                n.removesuffix(".yaml") in only for n in names):
            continue
        if not names:
            rows.append({"config": str(path.relative_to(folder)), "outcome": "no twin"})
            continue
        for name in names:
            rows.append(_pair(folder, path, name, size, timeout))
    return rows


def _pair(folder: Path, path: Path, name: str, size: int, timeout: int) -> dict:
    """One pair in a fresh process (``--one``)."""
    # a P6 network's largest stride is 64: its input a multiple of it
    side = -(-size // 64) * 64 if path.stem.endswith("6") else size
    with tempfile.TemporaryDirectory() as work:
        try:
            done = subprocess.run([PY, __file__, "--one", str(path), name, str(side), work],
                                  capture_output=True, text=True, timeout=timeout)
            line = [x for x in done.stdout.splitlines() if x.startswith("{")]
            row = json.loads(line[-1]) if line else {
                "outcome": "error", "why": done.stderr.strip().splitlines()[-1][:300]}
        except subprocess.TimeoutExpired:
            row = {"outcome": "timeout"}
    row.update(config=str(path.relative_to(folder)), twin=name)
    print(json.dumps(row), flush=True)
    return row


def table(rows: list[dict]) -> str:
    lines = ["| MindYOLO config | PyTorch twin | convert | verify |", "|---|---|---|---|"]
    for r in rows:
        if r["outcome"] == "no twin":
            lines.append(f"| `{r['config']}` | none | — | — |")
            continue
        if r["outcome"] in ("error", "timeout"):  # the harness's, not a verdict
            convert = f"not run: {r.get('why', r['outcome'])[:140]}"
        else:
            convert = (f"{r['filled']}/{r['total']}" if r["outcome"] == "converted"
                       else f"refused: {r.get('why', r['outcome'])[:140]}")
        verify = (f"{r['verdict']} {r['error']:.1e}" if r.get("verdict") else "—")
        kind = next((k for k in KINDS if r["twin"].startswith(k)), None)
        theirs = (f"{KINDS[kind]} `{r['twin'].removeprefix(kind)}`" if kind
                  else f"ultralytics `{r['twin']}`")
        lines.append(f"| `{r['config']}` | {theirs} | {convert} | {verify} |")
    return "\n".join(lines)


def write_docs(rows: list[dict]) -> None:
    text = DOCS.read_text()
    start, stop = text.index(BEGIN) + len(BEGIN), text.index(END)
    DOCS.write_text(text[:start] + "\n" + table(rows) + "\n" + text[stop:])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", type=Path, help="MindYOLO's configs/ folder")
    p.add_argument("--only", help="comma-separated config stems or twin names")
    p.add_argument("--size", type=int, default=160)
    p.add_argument("--timeout", type=int, default=900)
    p.add_argument("--json", type=Path, default=HERE / ".cache" / "mindyolo-zoo.json")
    p.add_argument("--from-json", type=Path)
    p.add_argument("--write-docs", action="store_true")
    p.add_argument("--one", nargs=4, metavar=("CONFIG", "TWIN", "SIZE", "WORK"))
    args = p.parse_args()
    if args.one:
        config, name, size, work = args.one
        print(json.dumps(one(config, name, int(size), work)))
        return
    if args.from_json:
        rows = json.loads(args.from_json.read_text())
    else:
        if args.configs is None:
            p.error("--configs DIR (MindYOLO's configs/ folder) or --from-json FILE")
        only = set(args.only.split(",")) if args.only else None
        rows = run(args.configs.expanduser(), only, args.size, args.timeout)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1))
    if args.write_docs:
        write_docs(rows)
    print(table(rows))


if __name__ == "__main__":
    main()
