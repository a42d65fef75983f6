"""The MindCV zoo from the checkpoints people have: every MindCV 0.3.0 model paired with
its timm or torchvision twin, converted with no mapping file, then verified.

    python benchmarks/mindcv_zoo.py                      # every pair, then the docs table
    python benchmarks/mindcv_zoo.py --families regnet,vgg # some families only
    python benchmarks/mindcv_zoo.py --smallest           # each family's smallest model
    python benchmarks/mindcv_zoo.py --verify smallest    # all convert, the smallest verified
    python benchmarks/mindcv_zoo.py --from-json FILE --write-docs   # re-render a run
    python benchmarks/mindcv_zoo.py --resume --write-docs # go on with a stopped run

**Twins are chosen by architecture.** Every MindCV model is built without its weights
(``no_init_parameters``), every torchvision and timm model on PyTorch's ``meta`` device,
and their trainable parameters counted. A twin has exactly MindCV's count; among several,
the one holding as many fixed values (BatchNorm statistics: MindCV's untrainable
parameters, PyTorch's floating-point buffers) wins, then the name closest to MindCV's
(``resnet50`` over ``resnetblur50``, which has the same count; ``resnetv2_50x1_bit``, with
GroupNorm, over ``resnetv2_50`` for MindCV's BiT). Where no model has the same count, a
model within 2 % of the same kind (its name without sizes, :func:`head`, equal), or of the
very same name at any count, is taken as a twin that *differs* (torchvision's VGG holds
convolution biases MindCV's lacks): such a pair must be refused naming the difference,
or converted with verify naming it. At most one torchvision and one timm twin per MindCV
model. MindCV models with no twin are listed.

**Each pair** runs in a fresh process (``--one``): the twin built with seeded weights, every
tensor its initialiser left constant moved off it (:func:`ms_port.testing.as_trained`),
and BatchNorm statistics estimated on seeded data
(:func:`ms_port.testing.estimate_batchnorm`), saved
as a ``.pth``; ``ms_port.convert(pth, ms_model="mindcv:NAME")`` with no mapping
file; then, where it converted, ``ms_port.verify`` at MindCV's default input size,
``tol=1e-5``. The outcome, the counts, the verdict and its first line, and the times are
recorded. A pair's process is stopped after ``--timeout`` seconds.

No downloads: every weight is generated.
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CACHE = HERE / ".cache" / "mindcv-zoo"
DOCS = ROOT / "docs" / "mindcv-zoo.md"
PY = sys.executable
#: a twin of another count is taken only this close, and only from the same family
NEAR = 0.02
BEGIN, END = "<!-- zoo-table:begin -->", "<!-- zoo-table:end -->"


# -- twins, by architecture -------------------------------------------------------------


def mindcv_counts() -> dict[str, dict]:
    """Each MindCV model's trainable parameter count and default input size (or the error
    building it raises)."""
    import mindcv.models as zoo
    from mindspore.nn.utils import no_init_parameters

    out: dict[str, dict] = {}
    for name in zoo.list_models():
        cfg = zoo.get_pretrained_cfg(name) if zoo.is_model_pretrained(name) or \
            name in zoo.registry._model_pretrained_cfgs else {}
        size = list(cfg.get("input_size", (3, 224, 224)))
        try:
            try:
                with no_init_parameters():
                    net = zoo.create_model(name, pretrained=False)
            except RuntimeError:  # a model that reads its weights while building
                net = zoo.create_model(name, pretrained=False)
            params = [p for p in net.get_parameters() if p.requires_grad]
            fixed = [p for p in net.get_parameters() if not p.requires_grad]
            out[name] = {"trainable": sum(math.prod(p.shape) for p in params),
                         "fixed": sum(math.prod(p.shape) for p in fixed),
                         "tensors": len(params), "input_size": size,
                         "family": zoo.registry._model_to_module[name]}
        except Exception as exc:  # MindCV's own failure, recorded as such
            out[name] = {"error": f"{type(exc).__name__}: {_first_line(exc)}",
                         "input_size": size, "family": zoo.registry._model_to_module[name]}
    return out


def torch_counts() -> dict[str, dict]:
    """Trainable parameter counts of every torchvision classifier and timm model, built on
    the meta device (no memory, no initialisation)."""
    import timm
    import torch
    import torchvision

    out: dict[str, dict] = {}

    def count(key: str, build) -> None:
        try:
            with torch.device("meta"):
                model = build()
        except Exception:  # torchvision's RegNets initialise with .item(): on the CPU
            try:
                model = build() if key.startswith("torchvision:") else None
            except Exception:
                model = None
            if model is None:  # a model that cannot be built is no candidate
                return
        params = [p for p in model.parameters() if p.requires_grad]
        fixed = [b for n, b in model.named_buffers() if b.is_floating_point()]
        out[key] = {"trainable": sum(p.numel() for p in params), "tensors": len(params),
                    "fixed": sum(b.numel() for b in fixed)}

    for name in torchvision.models.list_models(module=torchvision.models):
        count(f"torchvision:{name}", lambda n=name: torchvision.models.get_model(n))
    for name in timm.list_models():
        count(f"timm:{name}", lambda n=name: timm.create_model(n, pretrained=False))
    return out


def _plain(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


#: tokens of a name that say its size, not its kind (``b``, ``p16``, ``x0``, ``224``,
#: ``800mf``, ``tiny``); a version (``v2``) is kind
_SIZE = re.compile(r"(?!v\d+$)[a-z]{1,2}\d*|xxs|xxl|\d+[a-z]{0,2}|tiny|small|base|large|"
                   r"xlarge|huge|mini|medium|lite|plus|atto|femto|pico|nano|patch\d+|window\d+|finetune|"
                   r"pretrain|tf|legacy")
#: MindCV's name of a family where the PyTorch zoos use another
_HEADS = {"mlpmixer": "mixer"}


def head(name: str) -> str:
    """A model name's kind, without its sizes: ``vgg11`` -> ``vgg``, ``swin_v2_t`` and
    ``swinv2_tiny_window8`` -> ``swinv2``, ``mlp_mixer_s_p16`` and ``mixer_s16_224`` ->
    ``mixer``, ``resnetv2_50`` -> ``resnetv2`` (not ``resnet``)."""
    kept = [re.sub(r"(?<!v)\d+$", "", tok) for tok in name.lower().split("_")
            if not _SIZE.fullmatch(tok)]
    joined = "".join(kept)
    return _HEADS.get(joined, joined)


def similarity(mindcv: str, twin: str) -> float:
    return difflib.SequenceMatcher(None, _plain(mindcv), _plain(twin.partition(":")[2])).ratio()


def choose_twins(mc: dict[str, dict], candidates: dict[str, dict]) -> list[dict]:
    """Per MindCV model, at most one torchvision and one timm twin (module docstring)."""
    by_count: dict[int, list[str]] = {}
    for key, info in candidates.items():
        by_count.setdefault(info["trainable"], []).append(key)
    pairs = []
    for name, info in sorted(mc.items()):
        common = {"mindcv": name, "family": info["family"], "input_size": info["input_size"]}
        if "error" in info:
            pairs.append({**common, "twin": None, "build_error": info["error"]})
            continue
        chosen = []
        for lib in ("torchvision", "timm"):
            exact = [k for k in by_count.get(info["trainable"], []) if k.startswith(lib)]
            near = [k for k, v in candidates.items() if k.startswith(lib)
                    and v["trainable"] != info["trainable"]
                    and ((abs(v["trainable"] - info["trainable"]) <= NEAR * info["trainable"]
                         and head(k.partition(":")[2]) == head(name))
                         or _plain(k.partition(":")[2]) == _plain(name))]
            pool = exact or near
            if not pool:
                continue
            # the same statistics too (BatchNorm's running ones, where GroupNorm has none),
            # then the closest name
            best = max(pool, key=lambda k: (candidates[k].get("fixed") == info.get("fixed"),
                                            similarity(name, k), -len(k)))
            chosen.append({**common, "twin": best, "same_count": bool(exact),
                           "count_delta": candidates[best]["trainable"] - info["trainable"],
                           "similarity": round(similarity(name, best), 2)})
        pairs += chosen or [{**common, "twin": None}]
    return pairs


def twins_table(refresh: bool = False) -> list[dict]:
    """The twin pairs, computed once into the cache (each side in a process of its own)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    path = CACHE / "twins.json"
    if path.exists() and not refresh:
        return json.loads(path.read_text())
    counts = {}
    for side in ("mindcv", "torch"):
        out = CACHE / f"counts-{side}.json"
        subprocess.run([PY, __file__, "--counts", side, str(out)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        counts[side] = json.loads(out.read_text())
    pairs = choose_twins(counts["mindcv"], counts["torch"])
    path.write_text(json.dumps(pairs, indent=1))
    return pairs


# -- one pair, in a process of its own --------------------------------------------------


def build_twin(twin: str, seed: int | None = 0):
    import torch

    lib, _, name = twin.partition(":")
    if seed is not None:
        torch.manual_seed(seed)
    if lib == "torchvision":
        import torchvision

        kwargs = {"init_weights": True} if name in ("inception_v3", "googlenet") else {}
        if name == "googlenet":
            kwargs["aux_logits"] = False
        return torchvision.models.get_model(name, **kwargs)
    import timm

    return timm.create_model(name, pretrained=False)


def _estimate(model, size: tuple[int, ...]) -> None:
    """BatchNorm statistics from seeded data; at 299 where the twin's training-mode
    forward needs it (Inception's auxiliary head)."""
    import torch

    from ms_port.testing import estimate_batchnorm

    if not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        return
    try:
        estimate_batchnorm(model, size, batches=2, batch=4)
    except RuntimeError:
        estimate_batchnorm(model, (size[0], 299, 299), batches=2, batch=4)


def run_one(pair: dict, work: Path, verify: bool) -> dict:
    """Convert and verify one pair; every failure is recorded, never raised."""
    import ms_port
    from ms_port.errors import MsPortError

    mc, twin, size = pair["mindcv"], pair["twin"], tuple(pair["input_size"])
    out: dict = {"mindcv": mc, "twin": twin}
    pth, ckpt = work / "twin.pth", work / "out.ckpt"
    t0 = time.perf_counter()
    try:
        import torch

        model = build_twin(twin)
        size = _input_size(mc, model, size)
        out["input_size"] = list(size)
        from ms_port.testing import as_trained

        as_trained(model, seed=1)
        _estimate(model, size)
        torch.save(model.state_dict(), pth)
        del model
    except Exception as exc:
        out.update(outcome="twin fails", detail=_first_line(exc))
        return out
    out["twin_seconds"] = round(time.perf_counter() - t0, 2)
    t0 = time.perf_counter()
    try:
        report = ms_port.convert(pth, ms_model=f"mindcv:{mc}", output=ckpt, force=True)
    except MsPortError as exc:
        out.update(outcome="refused", detail=exc.message[:600],
                   convert_seconds=round(time.perf_counter() - t0, 2))
        return out
    plan = report.plan
    out["convert_seconds"] = round(time.perf_counter() - t0, 2)
    out["counts"] = {k: v for k, v in plan.counts.items() if v}
    out["filled"], out["total"] = len(plan.matches), len(plan.target)
    out["differences"] = [d.text for d in getattr(plan, "differences", [])]
    if not report.ok:
        problems = plan.problems()
        out.update(outcome="refused", detail=(problems[0] if problems else "")[:600],
                   problems=len(problems), missing=len(plan.missing),
                   unused=len(plan.unused), conflicts=len(plan.conflicts),
                   notes=[n[:300] for n in plan.notes[:4]])
        return out
    out["outcome"] = "converted"
    if not verify:
        return out
    t0 = time.perf_counter()
    try:
        parity = ms_port.verify(pth, ckpt, torch_model=lambda: build_twin(twin, seed=None),
                                ms_model=f"mindcv:{mc}", input_shape=size, tol=1e-5)
    except MsPortError as exc:
        out.update(verdict="ERROR", verdict_detail=exc.message[:600])
    else:
        fd = parity.first_divergence
        out.update(verdict=parity.verdict, verdict_detail=parity.message[:600],
                   error=parity.error, bound=max((o.bound for o in parity.outputs),
                                                 default=None),
                   first=None if fd is None else fd.describe()[:200],
                   known=list(parity.known_differences)[:2],
                   between="runs between the layers" in parity.message,
                   layers=parity.layers_checked)
    out["verify_seconds"] = round(time.perf_counter() - t0, 2)
    return out


def _input_size(mc: str, twin: object, size: tuple[int, ...]) -> tuple[int, ...]:
    """MindCV's input size where its configuration names one; else the twin's, where
    timm's names one (timm's SwinV2 asserts 256×256: MindCV runs at any size)."""
    from ms_port.read.targets import zoo_input_shape

    named = zoo_input_shape(f"mindcv:{mc}")
    twin_size = (getattr(twin, "pretrained_cfg", None) or {}).get("input_size")
    if named is not None and "names none" in named[1] and twin_size and len(twin_size) == 3:
        return tuple(int(d) for d in twin_size)
    return size


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:400]


# -- the whole run ----------------------------------------------------------------------


def _smallest(pairs: list[dict]) -> set[str]:
    """Each family's MindCV model with the fewest trainable parameters."""
    counts = json.loads((CACHE / "counts-mindcv.json").read_text())
    first: dict[str, str] = {}
    for p in sorted(pairs, key=lambda p: counts[p["mindcv"]]["trainable"]):
        first.setdefault(p["family"], p["mindcv"])
    return set(first.values())


def run_pairs(pairs: list[dict], *, verify: set[str], timeout: int, log,
              done: list[dict] | None = None, save=None) -> list[dict]:
    """Each pair in a process of its own; ``done`` (a saved run's results) are kept, not
    run again, and ``save`` gets the results after every pair (a long run can stop)."""
    results = list(done or [])
    finished = {(r["mindcv"], r["twin"]) for r in results}
    for k, pair in enumerate(pairs, 1):
        if pair.get("twin") is None or (pair["mindcv"], pair["twin"]) in finished:
            continue
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="mindcv-zoo-") as tmp:
            cmd = [PY, __file__, "--one", json.dumps(pair), tmp,
                   *([] if pair["mindcv"] in verify else ["--verify", "none"])]
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                                      env={**os.environ, "GLOG_v": "3"})
                lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
                result = (json.loads(lines[-1]) if lines else
                          {"mindcv": pair["mindcv"], "twin": pair["twin"],
                           "outcome": "crashed", "detail": done.stderr[-600:]})
            except subprocess.TimeoutExpired:
                result = {"mindcv": pair["mindcv"], "twin": pair["twin"],
                          "outcome": "timeout", "detail": f"over {timeout} s"}
        result["seconds"] = round(time.perf_counter() - started, 1)
        result["family"] = pair["family"]
        result["same_count"] = pair.get("same_count")
        result["count_delta"] = pair.get("count_delta")
        results.append(result)
        log(f"[{k}/{len(pairs)}] {pair['mindcv']} <- {pair['twin']}: "
            f"{result['outcome']}{' ' + result.get('verdict', '') if 'verdict' in result else ''}"
            f" ({result['seconds']} s) {result.get('detail', '')[:160]}")
        if save is not None:
            save(results)
    return results


#: how each pair ends, in the order the summary lists them
OUTCOMES = {
    "PASS": "converted, verify PASSes",
    "FAIL, named": "converted, verify FAILs naming the network difference",
    "FAIL, located": "converted, verify FAILs where every layer before agrees and the "
                     "weights are identical: the difference runs between layers",
    "FAIL": "converted, verify FAILs with no cause named",
    "converted": "converted, not verified (--verify smallest verifies each family's "
                 "smallest model)",
    "refused, differs": "refused, naming how the networks differ",
    "refused": "refused otherwise",
    "MindCV fails": "MindCV's network does not build or run on CPU",
    "other": "the twin does not build, or the run crashed or timed out",
}


def classify(r: dict) -> str:
    """One of :data:`OUTCOMES` for a pair's result."""
    if r["outcome"] == "converted":
        verdict = r.get("verdict")
        if verdict == "PASS":
            return "PASS"
        if verdict == "FAIL":
            return ("FAIL, named" if r.get("known") else
                    "FAIL, located" if r.get("between") else "FAIL")
        if verdict == "ERROR" or (verdict is None and "verify_seconds" in r):
            return ("MindCV fails" if "MindSpore" in r.get("verdict_detail", "")
                    else "other")
        return "converted" if verdict is None else "other"
    if r["outcome"] == "refused":
        detail = r.get("detail", "")
        if detail.startswith("the networks differ"):
            return "refused, differs"
        if "MindCV" in detail and ("build" in detail or "factory" in detail):
            return "MindCV fails"
        return "refused"
    return "other"


def summarize(pairs: list[dict], results: list[dict]) -> dict:
    twinned = [r for r in results]
    converted = [r for r in twinned if r["outcome"] == "converted"]
    same = [r for r in twinned if r.get("same_count")]
    families: dict[str, list[dict]] = {}
    for r in twinned:
        families.setdefault(r["family"], []).append(r)
    full = [f for f, rs in families.items() if all(r["outcome"] == "converted" for r in rs)]
    none = [f for f, rs in families.items() if not any(r["outcome"] == "converted" for r in rs)]
    verdicts: dict[str, int] = {}
    for r in converted:
        verdicts[r.get("verdict", "not run")] = verdicts.get(r.get("verdict", "not run"), 0) + 1
    outcomes = {k: 0 for k in OUTCOMES}
    for r in twinned:
        outcomes[classify(r)] += 1
    return {"pairs": len(twinned), "converted": len(converted), "outcomes": outcomes,
            "same_count_pairs": len(same),
            "same_count_converted": sum(r["outcome"] == "converted" for r in same),
            "families": len(families), "families_full": len(full),
            "families_none": sorted(none), "verdicts": verdicts,
            "no_twin": sorted(p["mindcv"] for p in pairs
                              if p.get("twin") is None and "build_error" not in p),
            "build_errors": sorted(p["mindcv"] for p in pairs if "build_error" in p)}


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render(pairs: list[dict], results: list[dict], meta: dict) -> str:
    s = summarize(pairs, results)
    lines = [BEGIN, "",
             f"Run {meta.get('date', '?')} on {meta.get('machine', '?')}, "
             f"{meta.get('minutes', '?')} minutes; "
             f"`python benchmarks/mindcv_zoo.py --verify {meta.get('verify', 'all')} "
             "--write-docs` regenerates it.", "",
             f"- **{s['converted']} of {s['pairs']} pairs convert** with no mapping file "
             f"({100 * s['converted'] / max(s['pairs'], 1):.0f} %); of the "
             f"{s['same_count_pairs']} pairs whose twin has MindCV's parameter count, "
             f"{s['same_count_converted']}.",
             f"- Families: {s['families_full']} of {s['families']} convert completely; "
             f"none at all: {', '.join(s['families_none']) or 'none'}.",
             "- How the pairs end: " + "; ".join(
                 f"{OUTCOMES[k]}: **{v}**" for k, v in s["outcomes"].items() if v) + ".",
             f"- MindCV models with no twin in torchvision or timm ({len(s['no_twin'])}): "
             f"{', '.join(s['no_twin'])}.",
             f"- MindCV models that do not build ({len(s['build_errors'])}): "
             f"{', '.join(s['build_errors'])}.", "",
             "| family | MindCV model | twin | outcome | tensors | verdict | time |",
             "|---|---|---|---|---|---|---|"]
    for r in sorted(results, key=lambda r: (r["family"], r["mindcv"], r["twin"])):
        tensors = (f"{r['filled']}/{r['total']}" + (f" ({r['counts'].get('aligned', 0)} "
                                                     "aligned)" if r.get("counts") else "")
                   if "filled" in r else "")
        outcome = r["outcome"] + ("" if r.get("same_count", True)
                                  else f" (twin: {r.get('count_delta'):+,d} parameters)")
        detail = r.get("detail", "")
        if r["outcome"] != "converted" and detail:
            outcome += f": {detail[:160]}"
        verdict = r.get("verdict", "")
        if verdict:
            verdict = classify(r)
        if verdict and verdict != "PASS":
            verdict += f": {r.get('verdict_detail', '')[6:166]}"
        lines.append(f"| {r['family']} | {r['mindcv']} | {r['twin']} | "
                     f"{_cell(outcome)} | {tensors} | {_cell(verdict)} | {r['seconds']} s |")
    lines += ["", END]
    return "\n".join(lines)


def write_docs(table: str) -> None:
    text = DOCS.read_text() if DOCS.exists() else (
        "# The MindCV zoo from timm and torchvision checkpoints\n\n" + BEGIN + "\n" + END + "\n")
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    DOCS.parent.mkdir(parents=True, exist_ok=True)
    DOCS.write_text(head + table + tail)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", help="comma-separated MindCV families (regnet,vgg)")
    ap.add_argument("--models", help="comma-separated MindCV model names")
    ap.add_argument("--smallest", action="store_true", help="each family's smallest model")
    ap.add_argument("--verify", choices=("all", "smallest", "none"), default="all",
                    help="verify every converted pair, each family's smallest, or none "
                         "(the others convert only)")
    ap.add_argument("--timeout", type=int, default=1200)
    ap.add_argument("--json", default=str(CACHE / "results.json"))
    ap.add_argument("--from-json", help="render a saved run instead of running")
    ap.add_argument("--write-docs", action="store_true", help=f"rewrite the table in {DOCS}")
    ap.add_argument("--refresh-twins", action="store_true")
    ap.add_argument("--resume", action="store_true",
                    help="keep the pairs --json already holds, run the rest")
    # internal: one side's counts, or one pair, in a process of its own
    ap.add_argument("--counts", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.counts:
        side, out = args.counts
        Path(out).write_text(json.dumps(mindcv_counts() if side == "mindcv" else torch_counts()))
        return
    if args.one:
        print(json.dumps(run_one(json.loads(args.one[0]), Path(args.one[1]),
                                 verify=args.verify != "none")), flush=True)
        return
    pairs = twins_table(args.refresh_twins)
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
        results, meta = saved["results"], saved["meta"]
    else:
        chosen = [p for p in pairs if p.get("twin")]
        if args.families:
            wanted = {f.strip() for f in args.families.split(",")}
            chosen = [p for p in chosen if p["family"] in wanted]
        if args.models:
            wanted = {m.strip() for m in args.models.split(",")}
            chosen = [p for p in chosen if p["mindcv"] in wanted]
        smallest = _smallest(chosen)
        if args.smallest:
            chosen = [p for p in chosen if p["mindcv"] in smallest]
        verify = {"all": {p["mindcv"] for p in chosen}, "smallest": smallest,
                  "none": set()}[args.verify]
        import platform

        saved_json = Path(args.json)
        done, minutes = [], 0.0
        if args.resume and saved_json.exists():
            before = json.loads(saved_json.read_text())
            done, minutes = before["results"], before["meta"].get("minutes", 0.0)
        started = time.perf_counter()

        def save(results: list[dict]) -> None:
            meta = {"date": time.strftime("%Y-%m-%d %H:%M"), "verify": args.verify,
                    "machine": f"{os.cpu_count()} cores, {platform.machine()}",
                    "minutes": round(minutes + (time.perf_counter() - started) / 60, 1)}
            saved_json.parent.mkdir(parents=True, exist_ok=True)
            partial = saved_json.with_suffix(".partial")
            partial.write_text(json.dumps({"meta": meta, "results": results}, indent=1))
            partial.replace(saved_json)

        results = run_pairs(chosen, verify=verify, timeout=args.timeout,
                            log=lambda s: print(s, flush=True), done=done, save=save)
        save(results)
        meta = json.loads(saved_json.read_text())["meta"]
    print(json.dumps(summarize(pairs, results), indent=1))
    if args.write_docs:
        write_docs(render(pairs, results, meta))


if __name__ == "__main__":
    main()
