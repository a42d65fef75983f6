"""Rich renderings of the reports (used by the CLI and by ``__rich__`` in notebooks)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rich.console import Group
from rich.markup import escape as _markup_escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from .read.fp8 import describe
from .read.tensors import format_shape
from .text import size_text, visible


def escape(text: object) -> str:
    """Text from a file, made inert for rich: no markup, no control characters."""
    return _markup_escape(visible(text))


def _text(text: object, **style: str) -> Text:
    return Text(visible(text), **style)


def _size(n: int) -> str:
    return size_text(n)


def render(report: Any, *, limit: int | None = None, show: str = "summary") -> Any:
    """A rich renderable for any ms-port report."""
    for cls, fn in _RENDERERS.items():
        if type(report).__name__ == cls:
            return fn(report, limit=limit, show=show)
    return Text(repr(report))


def _inspect(r: Any, *, limit: int | None, show: str) -> Any:
    table = Table(title=f"{escape(r.path)}  [dim]({r.format})[/]", title_justify="left")
    table.add_column("name", overflow="fold")
    table.add_column("shape")
    table.add_column("dtype")
    table.add_column("elements", justify="right")
    shown = r.tensors if limit is None else r.tensors[:limit]
    for t in shown:
        stored = getattr(t, "stored", None)  # a float8 weight read as bfloat16 (read/fp8.py)
        dtype = t.dtype if stored is None else f"{stored.dtype}→{t.dtype}"
        table.add_row(_text(t.name), format_shape(t.shape), dtype, f"{t.numel:,}")
    parts: list[Any] = [table]
    if len(shown) < len(r.tensors):
        parts.append(Text(f"… {len(r.tensors) - len(shown)} more (use --all or --limit N)",
                          style="dim"))
    dtypes = ", ".join(f"{k} ×{v}" for k, v in r.dtypes.items()) or "none"
    filtered = (f" (matching {escape(repr(r.filter))}, of {r.total_tensors})" if r.filter else "")
    lines = [f"tensors: {len(r.tensors)}{filtered}   parameters: {r.parameters:,}   "
             f"bytes: {r.nbytes:,} ({_size(r.nbytes)})   dtypes: {dtypes}"]
    if getattr(r, "hub", None):
        lines.append(f"hub: {r.hub} (Hugging Face cache)")
    if r.unwrapped:
        lines.append(f"unwrapped container: {' → '.join(r.unwrapped)}")
    lines += [f"note: {n}" for n in getattr(r, "notes", ())]
    if r.stripped:
        lines.append(f"stripped prefix: {', '.join(r.stripped)}")
    if r.metadata:
        lines.append("metadata: " + ", ".join(f"{k}={v}" for k, v in r.metadata.items()))
    if getattr(r, "config", None):
        shown = {k: v for k, v in r.config.items() if k != "path"}
        lines.append(f"config: {r.config['path']}: "
                     + ", ".join(f"{k}={_short(v)}" for k, v in shown.items()))
    lines += _cluster_lines(r) + _state_lines(r)
    parts.append(Text(visible("\n".join(lines), newlines=True)))
    if r.skipped:
        skipped = Table(title="skipped (not tensors)", title_justify="left")
        for col in ("entry", "kind", "why"):
            skipped.add_column(col)
        for s in r.skipped:
            skipped.add_row(_text(s.name), _text(s.kind), _text(s.reason))
        parts.append(skipped)
    return Group(*parts)


def _plan_table(plan: Any, *, limit: int | None) -> Table:
    table = Table(title="tensors", title_justify="left")
    for col in ("target (MindSpore)", "source (PyTorch)", "how", "shape", "dtype"):
        table.add_column(col, overflow="fold")
    rows = plan.matches if limit is None else plan.matches[:limit]
    for m in rows:
        how = f"[yellow]{m.how}[/]" if m.how == "fallback" else m.how
        dtype = m.dtype if m.dtype == m.out_dtype else f"{m.dtype}→{m.out_dtype}"
        extra = f" [{', '.join(map(str, m.transforms))}]" if m.transforms else ""
        table.add_row(_text(m.target), _text(m.source or "—"),
                      f"{how} ({escape(m.detail)}){escape(extra)}", format_shape(m.shape), dtype)
    return table


def _short(value: Any, width: int = 60) -> str:
    """A value read from a file, cut to ``width`` characters for a summary line."""
    text = str(value)
    return text if len(text) <= width else f"{text[:width - 1]}…"


def _conversion(r: Any, *, limit: int | None, show: str) -> Any:
    plan = r.plan
    lines = [*_plan_lines(plan), *_plan_warnings(plan)]
    if r.nonfinite:
        lines.append(f"[yellow]NaN/Inf in {len(r.nonfinite)} tensors: "
                     f"{escape(', '.join(list(r.nonfinite)[:3]))}[/]")
    lines += _written_lines(r)
    parts: list[Any] = []
    if show == "all":
        parts.append(_plan_table(plan, limit=None))
    parts += _problem_parts(plan, limit)
    style = "green" if r.ok else "red"
    done, failed = (("EXPORTED", "NOT EXPORTED") if type(r).__name__ == "ExportReport"
                    else ("CONVERTED", "NOT CONVERTED"))
    title = done if r.ok and not r.dry_run else ("PLAN OK" if r.ok else failed)
    parts.append(Panel("\n".join(lines), title=f"[bold {style}]{title}[/]",
                       title_align="left", border_style=style))
    return Group(*parts)


def _plan_lines(plan: Any) -> list[str]:
    """The plan's header: source, target, what matched and how, the layouts, the config's
    numbers, what the reader unwrapped or dequantized, what was dropped."""
    counts = ", ".join(f"{k} {v}" for k, v in plan.counts.items()
                       if v and k != "state") or "none"
    state = sum(m.how == "state" for m in plan.matches)
    lines = [
        f"source:  {escape(plan.source.path)} ({plan.source.format}, "
        f"{len(plan.source) - state} tensors)",
        f"target:  {escape(plan.target.description)} ({plan.target.kind}, "
        f"{len(plan.target)} tensors)",
        f"matched: {len(plan.matches) - state}/{len(plan.target)} — {counts}",
    ]
    if plan.training_state is not None:
        lines.append(escape(f"state:   {state} tensors beside the weights — "
                            f"{plan.training_state.line()}"))
    hub = getattr(plan.source, "hub", None)
    if hub is not None:  # what the Hub id on the command line resolved to
        lines.insert(1, f"hub:     {escape(hub)} (Hugging Face cache)")
    if plan.mapping.origin != "<empty>":
        lines.append(f"mapping: {escape(plan.mapping.origin)}")
    fused = [m for m in plan.matches if m.parts]
    split = [m for m in plan.matches if m.part is not None]
    if fused or split:
        told = ([f"{len(fused)} fused from {sum(len(m.parts) for m in fused)} sources"]
                if fused else []) + ([f"{len(split)} split out"] if split else [])
        lines.append(escape(f"layouts: {', '.join(told)}" + "".join(
            f"; {lay}" for lay in sorted({str(m.layout) for m in fused + split}))))
    if plan.params:
        where = getattr(plan.source, "config_path", None)
        lines.append(escape("config:  " + (f"{where}: " if where else "") + ", ".join(
            f"{k}={v} ({how})" for k, (v, how) in plan.params.items())))
    if plan.source.unwrapped or plan.source.stripped:
        lines.append(escape(f"source unwrapped {plan.source.unwrapped or '-'}, "
                            f"stripped {plan.source.stripped or '-'}"))
    lines += [escape(f"source:  {n}") for n in getattr(plan.source, "notes", ())]
    dequantized = describe(plan.source)
    if dequantized:
        lines.append(escape(f"float8:  {dequantized}"))
    dropped: dict[str, int] = {}
    for d in plan.dropped:
        dropped[d.reason] = dropped.get(d.reason, 0) + 1
    return lines + [escape(f"dropped: {n} × {reason}") for reason, n in dropped.items()]


def _plan_warnings(plan: Any) -> list[str]:
    """What the plan accepted but the user should look at, and its notes."""
    lines = []
    if plan.fallbacks:
        lines.append(f"[yellow]fallback (shape/order) matches: {len(plan.fallbacks)} — "
                     "check them[/]")
    if plan.lossy_casts:
        lines.append(f"[yellow]lossy casts: {len(plan.lossy_casts)} tensors[/]")
    if plan.missing and plan.allow_missing:
        lines.append(f"[yellow]missing (allowed): {len(plan.missing)}[/]")
    if plan.unused and plan.allow_unused:
        lines.append(f"[yellow]unused (allowed): {len(plan.unused)}[/]")
    return lines + [f"[yellow]note: {escape(n)}[/]" for n in getattr(plan, "notes", [])]


def _written_lines(r: Any) -> list[str]:
    """What was written: the output and its read-back, the saved map, the model YAML."""
    lines = []
    if r.written:
        w = r.written
        shards = getattr(w, "shards", None)
        what = (f"{len(shards)} safetensors file{'s' * (len(shards) > 1)}"
                + (f" + {w.index}" if w.index else "")
                + (f" + {w.config}" if w.config else "")
                + "".join(f" + {n}" for n in getattr(w, "others", ()))) if shards else w.format
        lines.append(f"output:  {escape(w.path)} ({escape(what)}, {_size(w.nbytes)}"
                     f"{', CRC' if w.crc else ''}{', replaced' if w.replaced else ''})")
        lines.append(f"readback: {w.tensors} tensors {w.readback}")
    if r.saved_map:
        lines.append(f"plan saved as mapping: {escape(r.saved_map)}")
    mf = getattr(r, "model_config", None)
    if mf is not None:
        lines.append(f"model config: {escape(mf.path)} (MindFormers YAML, "
                     f"{escape(mf.model_config.get('type'))}{', replaced' if mf.replaced else ''};"
                     f" read back {mf.readback})")
        lines += [f"[yellow]note: {escape(n)}[/]" for n in mf.notes]
    return lines


def _problem_parts(plan: Any, limit: int | None) -> list[Any]:
    """The plan's problems, the leftovers' common pattern first, cut at ``limit``."""
    problems = plan.problems()
    if not problems:
        return []
    from .match.suggest import group_line, leftover_groups

    parts: list[Any] = []
    groups = [] if plan.allow_unused else leftover_groups(plan.unused)
    if groups:  # the pattern first: one rename can explain dozens of lines below
        parts.append(Text.from_markup("\n".join(
            f"[yellow]→[/] {escape(group_line(*g))}" for g in groups)))
    shown = problems if limit is None else problems[:limit]
    parts.append(Text.from_markup("\n".join(f"[red]✗[/] {escape(p)}" for p in shown)))
    if len(shown) < len(problems):
        parts.append(Text(f"… {len(problems) - len(shown)} more (--show all, or --json)"))
    return parts


def _state_lines(r: Any) -> list[str]:
    """The training state inspect found beside the weights: a Trainer folder's optimizer,
    or a MindSpore checkpoint's moments and counters (a training output's are told with
    its layout)."""
    from .read.training_state import mindformers_line

    if getattr(r, "optimizer", None) is not None:
        return [f"training state (apart, not weights): {r.optimizer.line()}"]
    state = getattr(r, "training_state", [])
    if state and getattr(r, "cluster", None) is None:
        return [f"training state (apart, not weights): {mindformers_line(state)}"]
    return []


def _cluster_lines(r: Any) -> list[str]:
    """A training output's layout: devices, grids, stages, saves, ranks, its training
    state apart."""
    c = getattr(r, "cluster", None)
    if c is None:
        return []
    grids = "; ".join(f"{'×'.join(map(str, g))} ({n} parameters)" for g, n in c.grids[:3])
    lines = [f"parallel: {c.devices} devices in {c.stages} pipeline stage"
             f"{'s' * (c.stages > 1)}; grids {grids or 'none (all replicated)'}",
             f"saves: {len(c.saves)} found, read {c.save}" + (
                 f" (others: {', '.join(c.saves[1:4])}{', …' if len(c.saves) > 4 else ''})"
                 if len(c.saves) > 1 else ""),
             f"ranks: {c.ranks_read} read" + (f", missing {c.missing_ranks[:8]}"
                                              if c.missing_ranks else "")
             + (f"; {c.single_copies} slices saved on one rank only (remove_redundancy)"
                if c.single_copies else ""),
             f"strategy: {c.strategy[0]}" + (f" (+{len(c.strategy) - 1} files)"
                                              if len(c.strategy) > 1 else "")
             if c.strategy else "strategy: none (every tensor read as replicated)"]
    state = getattr(r, "training_state", [])
    if state:
        nbytes = sum(t.nbytes for t in state)
        shown = ", ".join(t.name for t in state[:3])
        lines.append(f"training state (apart, not weights): {len(state)} tensors, "
                     f"{_size(nbytes)}: {shown}{', …' if len(state) > 3 else ''}")
    return lines + [f"note: {n}" for n in c.notes]


def _num(x: float | None, spec: str = ".2e") -> str:
    return "n/a" if x is None or x != x or x in (float("inf"), float("-inf")) else f"{x:{spec}}"


_VERDICT_STYLE = {"PASS": "green", "FAIL": "red", "INCONCLUSIVE": "yellow"}


def _parity(r: Any, *, limit: int | None, show: str) -> Any:
    from .check.html import terminal_curve

    verdict = getattr(r, "verdict", "PASS" if r.ok else "FAIL")
    style = _VERDICT_STYLE.get(verdict, "red")
    lines = [escape(r.message), ""]
    for reason in r.reasons[1:]:
        lines.append(f"[{style}]• {escape(reason)}[/]")
    for o in r.outputs:
        top1 = (f"   top-1 {o.top1_agreement:.0%}" if o.top1_agreement is not None else "")
        noise = f"   noise {_num(o.noise)}" if o.noise is not None else ""
        sens = (f"   input sensitivity {_num(o.sensitivity)}"
                if o.sensitivity is not None else "")
        nan = ""
        if o.ms_nan_count or o.ms_inf_count or o.torch_nan_count or o.torch_inf_count:
            nan = (f"   [red]NaN/Inf: MindSpore {o.ms_nan_count}/{o.ms_inf_count}, "
                   f"PyTorch {o.torch_nan_count}/{o.torch_inf_count}[/]")
        lines.append(f"output {escape(o.name)}: {format_shape(tuple(o.torch_shape))}   error "
                     f"{_num(o.error)} (bound {_num(o.bound)}){noise}{sens}   max |Δ| "
                     f"{_num(o.max_abs)}{top1}{nan}")
    if r.noise_floor is not None:
        drift = f" × drift (reached {r.drift:.1f})" if r.k and r.drift > 1.0 else ""
        bound = (f"; bound = max(tol {r.tol:g}, {r.k:g} × noise{drift})" if r.k
                 else "; bound = tol")
        lines.append(f"float32 noise floor (PyTorch float32 vs float64): "
                     f"{_num(r.noise_floor)}{bound}")
    if r.layers:
        by = {how: sum(c.paired_by == how for c in r.layers) for how in ("name", "order")}
        bad = sum(c.status in ("fail", "nonfinite") for c in r.layers)
        lines.append(f"layers: {len(r.layers)} compared ({by['name']} paired by name, "
                     f"{by['order']} by order and shape), {bad} above their bound")
        curve = terminal_curve([c.to_dict() for c in r.layers], width=76, height=5)
        if curve:
            lines += ["[dim]error / bound along the network (log scale):[/]"]
            lines += [escape(c) for c in curve]
    if r.first_divergence is not None:
        lines.append(f"[red]first divergence: {escape(r.first_divergence.describe())}[/]")
        for t in r.first_divergence.tensors[:6]:
            lines.append(f"[red]  {escape(t)}[/]")
    if r.tensors is not None:
        counts = ", ".join(f"{k} {v}" for k, v in r.tensors.counts.items() if v)
        lines.append(f"tensors (compared through the plan before running): {escape(counts)}")
    for w in r.nonfinite_weights:
        lines.append(f"[red]non-finite weights: {escape(w)}[/]")
    if show == "all":
        for c in r.layers:
            lines.append(_layer_row(c))
    for note in r.notes[: limit or 10]:
        lines.append(f"[dim]note: {escape(note)}[/]")
    fed = "; ".join(escape(f"{i['name']} {i['dtype']} {i['shape']} {i['origin']}")
                    for i in r.inputs) or (f"batch {r.batch} × "
                                           f"{format_shape(tuple(r.input_shape))}")
    lines.append(f"inputs: {fed}; {r.dtype}; devices: PyTorch {r.torch_device}, MindSpore "
                 f"{r.ms_device}")
    if r.mode_reason:
        how = {"layers": "layer by layer (one block per side in memory)",
               "tensors": "tensors only, no forward"}.get(r.mode, "whole networks")
        lines.append(f"mode: {how}: {r.mode_reason}")
    if r.timings:
        lines.append("timings: " + ", ".join(f"{k} {v:.2f}s" for k, v in r.timings.items()))
    return Panel("\n".join(lines),
                 title=f"[bold {style}]{verdict}[/]", title_align="left", border_style=style)


#: a layer row's mark by status, and what the row says of a status that is not a pass
_LAYER_MARKS = {"fail": "[red]✗[/]", "nonfinite": "[red]✗[/]", "insensitive": "[yellow]~[/]",
                "boundary": "[yellow]◇[/]", "skipped": "[dim]·[/]", "ok": "[green]✓[/]",
                "amplified": "[yellow]≈[/]"}
_LAYER_SAYS = {"insensitive": "barely depends on the input",
               "amplified": "over its bound through its input only: given MindSpore's "
                            "values before it, its own error is within it",
               "boundary": "over its bound but not counted: the two networks draw this "
                           "block's edge differently",
               "skipped": "not compared"}


def _layer_row(c: Any) -> str:
    """One layer of ``--show all``: its mark, and where it is no plain pass or fail, why."""
    row = (f"{_LAYER_MARKS.get(c.status, '[green]✓[/]')} {c.index:>4} {escape(c.name)} "
           f"[{escape(c.torch_kind)}] error {_num(c.error)} bound {_num(c.bound)} "
           f"({c.paired_by})")
    says = _LAYER_SAYS.get(c.status)
    if says:
        row += f" — {says}" + (f": {escape(c.note)}" if c.note else "")
    return row


@dataclass(frozen=True)
class _PlanOnly:
    """A plan shown as the dry run of a conversion (what :func:`_conversion` reads)."""

    plan: Any
    ok: bool
    written: Any = None
    dry_run: bool = True
    saved_map: str | None = None
    nonfinite: dict[str, int] = field(default_factory=dict)


def _plan(p: Any, *, limit: int | None, show: str) -> Any:
    # a plan is its table: every tensor, where it comes from and how
    return _conversion(_PlanOnly(p, p.ok), limit=limit, show="all")


def _diff(r: Any, *, limit: int | None, show: str) -> Any:
    # problems first, each one line naming what the tensor holds instead
    problems = r.problems
    shown = problems if limit is None else problems[:limit]
    rows = [f"[red]✗[/] {escape(d.describe(r.mode))}" for d in shown]
    if len(shown) < len(problems):
        rows.append(f"[dim]… {len(problems) - len(shown)} more (--all, or --json)[/]")
    if show == "all":
        rows += [f"[green]✓[/] {escape(d.describe(r.mode))}" for d in r.deltas
                 if d.status == "identical"]
    sides = ("A (PyTorch)", "B (MindSpore)") if r.mode == "plan" else ("A", "B")
    counts = ", ".join(f"{k} {v}" for k, v in r.counts.items() if v) or "no tensors"
    lines = [f"{sides[0]}: {escape(r.a)}", f"{sides[1]}: {escape(r.b)}",
             f"compared {'through the plan' if r.mode == 'plan' else 'by name'}: "
             f"{len(r.deltas)} tensors — {counts}"]
    lines += [f"[dim]note: {escape(n)}[/]" for n in r.notes[: limit or len(r.notes)]]
    style = "green" if r.ok else "red"
    parts: list[Any] = [Text.from_markup("\n".join(rows))] if rows else []
    parts.append(Panel("\n".join(lines), title=f"[bold {style}]"
                       f"{'IDENTICAL' if r.ok else 'DIFFERENT'}[/]",
                       title_align="left", border_style=style))
    return Group(*parts)


def _step(r: Any, *, limit: int | None, show: str) -> Any:
    style = "green" if r.ok else "red"
    rows = sorted(r.rows, key=lambda x: -x.of_bound)
    shown = rows if limit is None else rows[:limit]
    table = Table(title="next weights, worst first", title_justify="left")
    for col in ("weight", "of its update", "of its bound"):
        table.add_column(col, justify="left" if col == "weight" else "right")
    for row in shown:
        table.add_row(_text(row.name), _num(row.relative), f"{row.of_bound:.3g}")
    lines = [escape(r.message), f"source: {escape(r.source)}",
             f"checkpoint: {escape(r.checkpoint)}"] + [f"note: {escape(n)}" for n in r.notes]
    return Group(table, Panel("\n".join(lines), title=f"[bold {style}]{r.verdict}[/]",
                              title_align="left", border_style=style))


_RENDERERS = {
    "StepReport": _step,
    "TensorDiff": _diff,
    "Plan": _plan,
    "InspectReport": _inspect,
    "ConversionReport": _conversion,
    "ExportReport": _conversion,
    "ParityReport": _parity,
}
