"""The verify report as a picture: one self-contained HTML page, and a terminal curve.

Both read the plain dict of the verify report's ``to_dict()``. Reports are read back from
files, so every field may be missing or malformed and every string is escaped: names are
data, never markup. The page has no script and fetches nothing; it opens offline.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable
from typing import Any, Optional

from ..text import visible

__all__ = ["render_html", "terminal_curve"]

#: most points per line in the chart; failing layers are drawn apart and never dropped
MAX_POINTS = 1500
_FAILING = ("fail", "nonfinite")
_VERDICT_CLASS = {"PASS": "pass", "FAIL": "fail", "INCONCLUSIVE": "inconclusive"}
_ROW_CLASS = {"fail": "bad", "nonfinite": "bad", "insensitive": "warn", "amplified": "warn",
              "unpaired": "dim"}
_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")
_NOT_XML = {0xFFFE: "\\ufffe", 0xFFFF: "\\uffff"}  # visible() leaves them; XML forbids them
_BLOCKS = " ▁▂▃▄▅▆▇█"
_TOP_ROWS = 25  # failing layers listed above the full table
_TIP_NAMES = 6  # layers named in one marker's tooltip
_LAYER_HEAD = ["#", "MindSpore", "PyTorch", "kind", "error", "noise", "bound", "error/bound",
               "status", "paired by"]
_W, _H, _LEFT, _RIGHT, _TOP, _BOTTOM = 960, 380, 70, 20, 50, 46  # chart, SVG user units
_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1100px;padding:0 16px;
color:#1f2328}h1{font-size:20px;margin:0 0 12px}h2{font-size:16px;margin:28px 0 8px}
.verdict{padding:12px 16px;border-radius:6px;color:#fff;background:#6e7781}
.verdict b{font-size:18px;margin-right:10px}.verdict ul{margin:6px 0 0;padding-left:20px}
.pass{background:#1a7f37}.fail{background:#cf222e}.inconclusive{background:#9a6700}
.meta,figcaption,.empty{color:#59636e}figure{margin:12px 0}figcaption{font-size:12px}
svg{width:100%;height:auto;border:1px solid #d1d9e0;border-radius:6px}
svg text{font:11px system-ui,sans-serif;fill:#59636e}svg text.first{fill:#cf222e}
.grid{stroke:#eaeef2}.axis{stroke:#8c959f}.allowed{fill:#dafbe1}.dot{fill:#0969da}
.err{fill:none;stroke:#0969da;stroke-width:1.6}.noise{fill:none;stroke:#8c959f;stroke-width:1.2}
.bound{fill:none;stroke:#bc4c00;stroke-width:1.2;stroke-dasharray:5 3}
.bad{fill:#cf222e;stroke:#fff;stroke-width:.8}line.first{stroke:#cf222e;stroke-dasharray:3 3}
table{border-collapse:collapse;font-size:12px;margin:6px 0;width:100%}
th,td{padding:2px 8px;border-bottom:1px solid #eaeef2;text-align:left;vertical-align:top}
th{background:#f6f8fa;position:sticky;top:0}td{font-family:ui-monospace,Menlo,monospace}
.layers td:nth-child(n+5):nth-child(-n+8){text-align:right;white-space:nowrap}
tr.bad td{background:#ffebe9}tr.warn td{background:#fff8c5}tr.dim td{color:#8c959f}
summary{cursor:pointer;margin:10px 0;font-weight:600}.empty{font-style:italic}
"""

Row = tuple[str, str, list[str]]  # (row class, row id, escaped cells)
Values = tuple[Optional[float], Optional[float], Optional[float]]  # error, noise, bound


def _esc(text: object) -> str:
    """Text from a file, safe in HTML and SVG text and attribute values."""
    if text is None:
        return ""
    shown = visible(text).translate(_NOT_XML)
    shown = shown.encode("utf-8", "backslashreplace").decode("utf-8")  # lone surrogates
    return html.escape(shown, quote=True)


def _num(x: object) -> float | None:
    """A float, or None for anything that is not a number (booleans included)."""
    if isinstance(x, bool) or not isinstance(x, (int, float, str)):
        return None
    try:
        return float(x)
    except (ValueError, OverflowError):
        return None


def _list(x: object) -> list[Any]:
    return list(x) if isinstance(x, (list, tuple)) else []


def _dicts(x: object) -> list[dict[str, Any]]:
    return [d for d in _list(x) if isinstance(d, dict)]


def _items(x: object) -> str:
    return "<ul>" + "".join(f"<li>{_esc(t)}</li>" for t in _list(x)) + "</ul>" if _list(x) else ""


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' * (n != 1)}"


def _fmt(x: object, spec: str = ".2e") -> str:
    v = _num(x)
    if v is None:
        return "—"
    if not math.isfinite(v):
        return "NaN" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return "0" if v == 0 else format(v, spec)


def _values(layer: dict[str, Any], tol: float | None, k: float | None) -> Values:
    """An error lost to NaN/Inf (``None`` in JSON) becomes inf; a missing bound is
    max(tol, k·noise) where all three are known."""
    err, noise, bound = (_num(layer.get(f)) for f in ("error", "noise", "bound"))
    if err is None and layer.get("status") == "nonfinite":
        err = math.inf
    if bound is None and None not in (tol, k, noise) and math.isfinite(k * noise):
        bound = max(tol, k * noise)
    return err, noise, bound


def _failing(layer: dict[str, Any], err: float | None, bound: float | None) -> bool:
    status = layer.get("status")
    if status in _FAILING or (err is not None and not math.isfinite(err)):
        return True
    return status is None and err is not None and bound is not None and not err <= bound


def _first_failure(report: dict[str, Any]) -> dict[str, Any] | None:
    """verify's ``first_divergence`` (``ms_name``/``torch_name``), as the page shows it."""
    div = report.get("first_divergence", report.get("first_failure"))
    if not isinstance(div, dict):
        return None
    return {**div, "ms": div.get("ms", div.get("ms_name")),
            "torch": div.get("torch", div.get("torch_name"))}


def _ratio(err: float | None, bound: float | None) -> float | None:
    if err is not None and not math.isfinite(err):
        return math.inf
    if err is None or bound is None or not math.isfinite(bound) or bound <= 0:
        return None
    return err / bound


def _where(layer: dict[str, Any]) -> str:
    ms, torch = layer.get("ms"), layer.get("torch")
    return f"{ms} (PyTorch: {torch})" if torch not in (None, ms) else str(ms)


# ---------------------------------------------------------------------------------------
# chart


class _LogY:
    """log10 axis, with a floor row for exact zeros and a top row for NaN/inf."""

    def __init__(self, values: list[float]) -> None:
        logs = [math.log10(v) for v in values if math.isfinite(v) and v > 0]
        self.hi = math.ceil(max(logs)) if logs else 0
        self.lo = max(math.floor(min(logs)) if logs else -12, self.hi - 24)
        self.hi = max(self.hi, self.lo + 1)
        self.nan_y, self.zero_y = _TOP + 4, _H - _BOTTOM
        self.top, self.bottom = self.nan_y + 18, self.zero_y - 18

    def __call__(self, v: float | None) -> float | None:
        if v is None or not math.isfinite(v):
            return None if v is None else self.nan_y
        if v <= 0:
            return self.zero_y
        t = min(max((math.log10(v) - self.lo) / (self.hi - self.lo), 0.0), 1.0)
        return self.bottom - t * (self.bottom - self.top)


def _keep(errs: list[float | None]) -> list[int]:
    """Indices to draw: all, or the least and largest error of MAX_POINTS/2 stretches."""
    n, buckets, kept = len(errs), MAX_POINTS // 2, []
    if n <= MAX_POINTS:
        return list(range(n))
    for b in range(buckets):
        span = range(b * n // buckets, (b + 1) * n // buckets)
        key = [(e if e == e else math.inf, i) for i in span if (e := errs[i]) is not None]
        kept.extend(sorted({min(key)[1], max(key)[1]}) if key else [span.start])
    return kept


def _runs(points: list[tuple[float, float | None]], y: _LogY) -> list[list[str]]:
    """Runs of plottable points ("x,y"); NaN/inf and missing values break a run, and a
    lone point becomes a short level stroke so that it shows."""
    out, run = [], []
    for x, py in [*points, (0.0, None)]:
        if py is not None and py != y.nan_y:
            run.append((x, py))
            continue
        if len(run) == 1:
            (x1, y1), = run
            run = [(max(x1 - 6, _LEFT), y1), (min(x1 + 6, _W - _RIGHT), y1)]
        if run:
            out.append([f"{rx:.1f},{ry:.1f}" for rx, ry in run])
        run = []
    return out


def _chart(layers: list[dict[str, Any]], vals: list[Values], bad: list[int],
           first: dict[str, Any] | None) -> tuple[str, list[str]]:
    """The SVG, and notes for its caption."""
    errs = [v[0] for v in vals]
    y = _LogY([v for triple in vals for v in triple if v is not None])
    idx = [layer.get("index") for layer in layers]
    if not (all(type(i) is int for i in idx) and all(a < b for a, b in zip(idx, idx[1:]))):
        idx = list(range(len(layers)))
    x0, x1, width, base = idx[0], max(idx[-1], idx[0] + 1), _W - _LEFT - _RIGHT, _H - _BOTTOM

    def px(pos: int) -> float:
        return _LEFT + width / 2 if len(idx) == 1 else _LEFT + (idx[pos] - x0) / (x1 - x0) * width

    def label(x: float, yy: float, text: str, anchor: str = "end", cls: str = "") -> str:
        attr = f' class="{cls}"' if cls else ""
        return f'<text{attr} x="{x:.1f}" y="{yy:.1f}" text-anchor="{anchor}">{text}</text>'

    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_W} {_H}" role="img" '
           f'aria-label="per-layer error against noise and bound">']
    for d in range(y.lo, y.hi + 1, max(1, math.ceil((y.hi - y.lo) / 8))):
        yy = y(10.0 ** d) or 0.0
        svg.append(f'<line class="grid" x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{yy:.1f}" '
                   f'y2="{yy:.1f}"/>' + label(_LEFT - 6, yy + 4,
                                              f"10{str(d).translate(_SUPERSCRIPT)}"))
    step = next((m * 10 ** e for e in range(30) for m in (1, 2, 5)
                 if (x1 - x0) / (m * 10 ** e) <= 10), x1 - x0)  # 1, 2, 5, 10, …: <= 10 ticks
    for t in range(x0 + (-x0) % step, x1 + 1, step) if len(idx) > 1 else [x0]:
        xx = _LEFT + (t - x0) / (x1 - x0) * width if len(idx) > 1 else px(0)
        svg.append(f'<line class="axis" x1="{xx:.1f}" x2="{xx:.1f}" y1="{base}" '
                   f'y2="{base + 4}"/>' + label(xx, base + 16, str(t), "middle"))
    svg.append(f'<line class="axis" x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{base}" y2="{base}"/>'
               + label(_LEFT + width / 2, _H - 8, "layer, in execution order", "middle")
               + f'<text transform="translate(16 {(y.top + y.bottom) / 2:.0f}) rotate(-90)" '
               f'text-anchor="middle">relative L2 error (log scale)</text>')
    notes = []
    if any(v is not None and v <= 0 for t in vals for v in t):
        svg.append(label(_LEFT - 6, y.zero_y + 4, "0"))
        notes.append("Exact zeros are drawn on the bottom row, labelled 0.")
    if any(v is not None and not math.isfinite(v) for t in vals for v in t):
        svg.append(label(_LEFT - 6, y.nan_y + 4, "NaN/inf"))
        notes.append("NaN/Inf errors are drawn on the top row, labelled NaN/inf.")
    kept = _keep(errs)
    if len(kept) < len(layers):
        notes.append(f"Lines show {len(kept)} of {len(layers)} points (the least and largest "
                     f"error of each stretch); every failing layer keeps its marker.")
    for j, cls in ((2, "allowed"), (1, "noise"), (2, "bound"), (0, "err")):
        for run in _runs([(px(i), y(vals[i][j])) for i in kept], y):
            if cls == "allowed":  # the region under the bound
                run = [f"{run[0].split(',')[0]},{base}", *run, f"{run[-1].split(',')[0]},{base}"]
            svg.append(f'<{"polygon" if cls == "allowed" else "polyline"} class="{cls}" '
                       f'points="{" ".join(run)}"/>')
    if len(kept) <= 100:
        svg += [f'<circle class="dot" cx="{px(i):.1f}" cy="{py:.1f}" r="2"/>' for i in kept
                if (py := y(errs[i])) is not None and py != y.nan_y]
    if first is not None and bad:
        at = next((i for i in bad if layers[i].get("ms") == first.get("ms")
                   and layers[i].get("torch") == first.get("torch")), bad[0])
        xf, end = px(at), px(at) > _LEFT + width * 0.7
        svg.append(f'<line class="first" x1="{xf:.1f}" x2="{xf:.1f}" y1="{_TOP - 6}" '
                   f'y2="{base}"/>' + label(xf - 4 if end else xf + 4, _TOP - 8, "first failure: "
                                            f"{_esc(_where(layers[at])[:80])}",
                                            "end" if end else "start", "first"))
    svg += _markers(layers, bad, vals, px, y)
    svg += [_legend(any(e is not None and not math.isfinite(e) for e in errs)), "</svg>"]
    return "\n".join(svg), notes


def _markers(layers: list[dict[str, Any]], bad: list[int], vals: list[Values], px: Any,
             y: _LogY) -> list[str]:
    """A red marker per failing layer, linked to its table row; layers that fall in one
    pixel column share a marker (at the worst) whose tooltip names them."""
    columns: dict[int, list[int]] = {}
    for i in bad:
        columns.setdefault(int(px(i)), []).append(i)
    out = []
    for members in columns.values():
        worst = max(members, key=lambda i: _ratio(vals[i][0], vals[i][2]) or 0.0)
        tip = [f"#{layers[i].get('index', i)} {_where(layers[i])}: error {_fmt(vals[i][0])} "
               f"> bound {_fmt(vals[i][2])}" for i in members[:_TIP_NAMES]]
        if len(members) > _TIP_NAMES:
            tip.append(f"… and {len(members) - _TIP_NAMES} more")
        title = "<title>" + "\n".join(_esc(line) for line in tip) + "</title>"
        x, py = px(worst), y(vals[worst][0])
        out.append(f'<a href="#L{worst}">' + (
            f'<circle class="bad" cx="{x:.1f}" cy="{py:.1f}" r="3.5">{title}</circle></a>'
            if py is not None and py != y.nan_y else
            f'<path class="bad" d="M{x:.1f},{y.nan_y - 5:.1f}l5,9h-10z">{title}</path></a>'))
    return out


def _legend(nonfinite: bool) -> str:
    line = '<line class="{}" x1="0" x2="18" y1="-4" y2="-4"/>'
    items = [(line.format("err"), "error"), (line.format("noise"), "noise"),
             (line.format("bound"), "bound = max(tol, k·noise)"),
             ('<rect class="allowed" x="0" y="-9" width="18" height="10"/>', "allowed"),
             ('<circle class="bad" cx="9" cy="-4" r="3.5"/>', "failing layer")]
    if nonfinite:
        items.append(('<path class="bad" d="M9,-9l5,9h-10z"/>', "NaN/inf"))
    out, x = [], _LEFT
    for swatch, text in items:
        out.append(f'<g transform="translate({x} 16)">{swatch}<text x="23" y="0">{text}</text></g>')
        x += 40 + 6 * len(text)
    return "".join(out)


# ---------------------------------------------------------------------------------------
# page


def _table(head: list[str], rows: list[Row], cls: str = "") -> str:
    body = "".join("<tr" + (f' class="{c}"' if c else "") + (f' id="{r}"' if r else "") + ">"
                   + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>\n"
                   for c, r, cells in rows)
    heads = "".join(f"<th>{h}</th>" for h in head)
    return ("<table" + (f' class="{cls}"' if cls else "") + f"><thead><tr>{heads}</tr></thead>"
            f"<tbody>\n{body}</tbody></table>")


def _layer_rows(layers: list[dict[str, Any]], vals: list[Values], which: Iterable[int], *,
                ids: bool = False) -> list[Row]:
    rows = []
    for i in which:
        layer, (err, noise, bound) = layers[i], vals[i]
        status = str(layer.get("status", ""))
        cls = "bad" if _failing(layer, err, bound) else _ROW_CLASS.get(status, "")
        rows.append((cls, f"L{i}" if ids else "", [
            _esc(layer.get("index", i)), _esc(layer.get("ms")), _esc(layer.get("torch")),
            _esc(layer.get("kind", layer.get("torch_kind"))),
            _fmt(err), _fmt(noise), _fmt(bound), _fmt(_ratio(err, bound), ".3g"), _esc(status),
            _esc(layer.get("paired_by"))]))
    return rows


def _holds(value: Any) -> str:
    """The source tensor a differing target holds (a name), or yes/no, or a dash."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    return _esc(value) if value else "—"


def _tensor_section(tensors: list[dict[str, Any]]) -> list[str]:
    """Tensors that are not identical first; the identical ones collapsed below."""
    head = ["target", "source", "status", "max abs", "cosine", "holds"]

    def rows(ts: list[dict[str, Any]]) -> list[Row]:
        return [("" if t.get("status") in ("identical", "differs") else "warn", "", [
            *(_esc(t.get(f)) for f in ("target", "source", "status")), _fmt(t.get("max_abs")),
            _fmt(t.get("cosine"), ".7f"), _holds(t.get("holds"))
            + (f" ({_esc(t['holds_how'])})" if t.get("holds_how") else "")]) for t in ts]

    same = [t for t in tensors if t.get("status") == "identical"]
    other = [t for t in tensors if t.get("status") != "identical"]
    out = [f"<h2>Tensors ({len(other)} not identical, {len(same)} identical)</h2>"]
    if other:
        out.append(_table(head, rows(other)))
    if same:
        out.append(f"<details><summary>{_plural(len(same), 'identical tensor')}</summary>"
                   + _table(head, rows(same)) + "</details>")
    return out


def render_html(report: dict[str, Any]) -> str:
    """The verify report as one self-contained HTML page (inline CSS and SVG, no script).

    Args:
        report: the verify report's ``to_dict()``; any field may be missing.

    Returns:
        The document, ready to write to a ``.html`` file; it opens offline.

    Example:
        >>> page = render_html({"verdict": "PASS", "message": "all layers agree"})
        >>> page.startswith("<!DOCTYPE html>") and "all layers agree" in page
        True
    """
    report = report if isinstance(report, dict) else {}
    tol, k = _num(report.get("tol")), _num(report.get("k"))
    layers = _dicts(report.get("layers"))
    vals = [_values(layer, tol, k) for layer in layers]
    bad = [i for i, (layer, v) in enumerate(zip(layers, vals)) if _failing(layer, v[0], v[2])]
    verdict = _esc(str(report.get("verdict") or "?").upper())
    first = _first_failure(report)
    parts = ['<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
             '<meta name="viewport" content="width=device-width,initial-scale=1">',
             f"<title>ms-port verify: {verdict}</title><style>{_CSS}</style></head><body>",
             f'<h1>ms-port verify</h1><div class="verdict {_VERDICT_CLASS.get(verdict, "")}">'
             f"<b>{verdict}</b>{_esc(report.get('message'))}{_items(report.get('reasons'))}</div>",
             f'<p class="meta">{_plural(len(layers), "layer")} compared, {len(bad)} failing; tol '
             f"{_fmt(tol, 'g')}, k {_fmt(k, 'g')}; bound per layer = max(tol, k × noise × drift), "
             f"drift reached {_fmt(_num(report.get('drift')) or 1.0, '.1f')}</p>",
             "<h2>Error along the depth of the network</h2>"]
    if not layers:
        parts.append('<p class="empty">no layers compared</p>')
    else:
        svg, notes = _chart(layers, vals, bad, first)
        if bad:
            notes.insert(0, "Hover a red marker for the layer; click it to jump to its row.")
        parts.append(f"<figure>{svg}<figcaption>{' '.join(notes)}</figcaption></figure>")
    if first is not None:
        names = ", ".join(_esc(t) for t in _list(first.get("tensors")))
        err = first.get("error")
        parts.append(f"<h2>First failure</h2><p><code>{_esc(_where(first))}</code>: error "
                     f"{'NaN/Inf' if err is None else _fmt(err)} &gt; bound "
                     f"{_fmt(first.get('bound'))}" + (f"; its tensors: {names}" if names else "")
                     + "</p>")
    if bad:
        parts.append(f"<h2>Failing layers ({min(len(bad), _TOP_ROWS)} of {len(bad)})</h2>"
                     + _table(_LAYER_HEAD, _layer_rows(layers, vals, bad[:_TOP_ROWS]), "layers"))
    if layers:
        rows = _layer_rows(layers, vals, range(len(layers)), ids=True)
        parts.append(f"<details{' open' if len(layers) <= 40 else ''}><summary>All "
                     f"{_plural(len(layers), 'layer')}, in execution order</summary>"
                     + _table(_LAYER_HEAD, rows, "layers") + "</details>")
    outputs = _dicts(report.get("outputs"))
    if outputs:
        parts.append("<h2>Outputs</h2>" + _table(
            ["#", "shape", "error", "noise", "bound", "sensitivity", "status"],
            [(_ROW_CLASS.get(str(o.get("status")), ""), "", [
                _esc(o.get("index")), _esc(o.get("shape", o.get("torch_shape"))),
                *(_fmt(o.get(f)) for f in ("error", "noise", "bound", "sensitivity")),
                _esc(o.get("status"))])
             for o in outputs]))
    tensors = report.get("tensors")
    # verify's report nests the tensor comparison ({"deltas": [...], ...}); accept both
    tensors = _dicts(tensors.get("deltas") if isinstance(tensors, dict) else tensors)
    parts += _tensor_section(tensors) if tensors else []
    inputs, head = _dicts(report.get("inputs")), ["name", "dtype", "shape", "origin"]
    if inputs:
        parts.append("<h2>Inputs</h2>" + _table(head, [
            ("", "", [_esc(i.get(f)) for f in head]) for i in inputs]))
    if _list(report.get("notes")):
        parts.append("<h2>Notes</h2>" + _items(report.get("notes")))
    timings = report.get("timings")
    if isinstance(timings, dict) and timings:
        parts.append('<p class="meta">timings: ' + ", ".join(
            f"{_esc(name)} {_fmt(s, '.2f')} s" for name, s in timings.items()) + "</p>")
    parts.append('<p class="meta">Made by ms-port verify. This page has no script and loads '
                 "nothing.</p></body></html>\n")
    return "\n".join(parts)


# ---------------------------------------------------------------------------------------
# terminal


def terminal_curve(layers: list[dict[str, Any]], *, width: int = 72,
                   height: int = 8) -> list[str]:
    """error / bound per layer, log scale, as plain text lines no wider than ``width``.

    Each column shows the largest ratio of the layers it covers, so a failing layer never
    disappears; a ``▲`` on the axis below marks a column above 1 (a failure).

    Args:
        layers: the verify report's ``layers`` (dicts with ``error``, ``bound``, ``status``).
        width: the most characters per line (at least 20).
        height: rows of the plot (at least 2).

    Returns:
        The lines, or ``[]`` when no layer has an error to show.

    Example:
        >>> lines = terminal_curve([{"error": 1e-7, "bound": 1e-5},
        ...                         {"error": 1e-3, "bound": 1e-5}], width=30, height=3)
        >>> lines[-2].endswith("▲")
        True
    """
    if width < 20 or height < 2:
        raise ValueError(f"terminal_curve needs width >= 20 and height >= 2 "
                         f"(got width={width}, height={height})")
    layers = _dicts(layers)
    # a block the two networks draw differently is not a failure (status "boundary")
    ratios = [None if layer.get("status") == "boundary" else
              _ratio(*_values(layer, None, None)[::2]) for layer in layers]
    if all(r is None for r in ratios):
        return []
    logs = [math.log10(r) for r in ratios if r is not None and 0 < r < math.inf]
    hi = max(math.ceil(max(logs)) if logs else 1, 0)
    lo = min(math.floor(min(logs)) - 1 if logs else -1, hi - 1)  # so the least still shows
    one_row = min(int(-lo / (hi - lo) * height), height - 1)
    labels = {height - 1: f"1e{hi}" if hi else "1", 0: f"1e{lo}", one_row: "1"}
    gutter = max(len(s) for s in labels.values()) + 2
    n, cols = len(ratios), width - gutter
    column = []
    for j in range(cols):
        have = [r for r in ratios[j * n // cols: max(j * n // cols + 1, (j + 1) * n // cols)]
                if r is not None]
        column.append(max(have) if have else None)
    eighths = [None if r is None else max(1, round(height * 8 * (
        1.0 if r == math.inf else 0.0 if r <= 0 else
        min(max((math.log10(r) - lo) / (hi - lo), 0.0), 1.0)))) for r in column]
    lines = ["error/bound, log scale; above 1 fails"[:width]]
    for row in range(height - 1, -1, -1):
        fills = [0 if h is None else min(max(h - row * 8, 0), 8) for h in eighths]
        lines.append(f"{labels.get(row, ''):>{gutter - 2}} ┤" + "".join(
            _BLOCKS[f] if f or row != one_row else "┈" for f in fills))
    lines.append(" " * (gutter - 1) + "└" + "".join(
        "▲" if r is not None and r > 1 else "─" for r in column))
    failing = [i for i, r in enumerate(ratios) if r is not None and r > 1]
    tail = f"{_plural(n, 'layer')}, {len(failing)} above 1"
    if failing:
        tail += f"; first: {visible(_where(layers[failing[0]]))}"
    return [*lines, (" " * gutter + tail)[:width]]
