"""MindYOLO's zoo from the checkpoints people have: every MindYOLO 0.5.0 config paired with
the ultralytics network its users train, saved as ultralytics saves it, converted with no
mapping file, then verified.

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
yolov7 and yolox have no ultralytics twin (listed); the original YOLOv5 (``yolov5`` 7.0 on
the package index) is MindYOLO's yolov5's twin where it is installed.

**Each pair** runs in a fresh process (``--one``): the ultralytics network built with
seeded weights and BatchNorm statistics estimated on seeded data, saved in ultralytics'
format (a whole pickled ``DetectionModel`` in float16); ``ms_port.convert(best.pt,
ms_model="mindyolo:CONFIG")`` with no mapping file; where it converted, ``ms_port.verify``
with ``--torch-model ultralytics`` at ``--size`` (160: more anchors than channels, and the
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
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DOCS = ROOT / "docs" / "detection.md"
PY = sys.executable
BEGIN, END = "<!-- yolo-table:begin -->", "<!-- yolo-table:end -->"

#: MindYOLO config file name -> ultralytics model yaml (the scale is in the name); a regex
#: on the file's stem, and how its twin is named from the match
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
)


def configs(folder: Path) -> list[Path]:
    """The model files: those that (with their bases) name network.model_name."""
    sys.path.insert(0, str(ROOT))
    from ms_port.archs.mindyolo import read_config

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


def twin(path: Path) -> str | None:
    for pattern, name in TWINS:
        m = re.fullmatch(pattern, path.stem)
        if m:
            return name.format(*m.groups())
    return None


def one(config: str, twin_name: str, size: int, work: str) -> dict:
    """One pair, in this process: build, save, convert, verify."""
    import copy

    import torch
    from ultralytics.nn import tasks

    import ms_port

    started = time.perf_counter()
    cls = tasks.SegmentationModel if "-seg" in twin_name else tasks.DetectionModel
    torch.manual_seed(0)
    model = cls(twin_name, nc=80, verbose=False)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.momentum = None  # the cumulative average of the batches below
    model.train()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _ in range(2):
            model(torch.rand(2, 3, size, size, generator=gen))
    model.eval()
    best = Path(work) / "best.pt"
    torch.save({"model": copy.deepcopy(model).half(), "ema": None, "train_args": {},
                "version": "8.4"}, best)
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
    verified = ms_port.verify(best, Path(work) / "out.ckpt", ms_model=f"mindyolo:{config}",
                              torch_model="ultralytics", input_shape=(3, size, size))
    out.update(outcome="converted", verdict=verified.verdict, error=verified.error,
               message=verified.message[:300], verify_s=round(time.perf_counter() - t0, 1))
    return out


def run(folder: Path, only: set[str] | None, size: int, timeout: int) -> list[dict]:
    rows = []
    for path in configs(folder):
        name = twin(path)
        if only and path.stem not in only and (name or "").removesuffix(".yaml") not in only:
            continue
        if name is None:
            rows.append({"config": str(path.relative_to(folder)), "outcome": "no twin"})
            continue
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
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| MindYOLO config | ultralytics twin | convert | verify |", "|---|---|---|---|"]
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
        lines.append(f"| `{r['config']}` | `{r['twin']}` | {convert} | {verify} |")
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
