"""The verify report as a picture: the HTML page and the terminal curve.

``python tests/test_html_report.py OUT.html`` writes the example report, to look at.
"""

from __future__ import annotations

import math
import re
import sys
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

import pytest

from ms_port.check.html import MAX_POINTS, render_html, terminal_curve

SVG_NS = "{http://www.w3.org/2000/svg}"
HOSTILE = ["<script>alert(1)</script>", '"onmouseover=alert(1) x="', "a\x1b[2Jb", "c\u202ed",
           "e\x00f"]
VOID = {"meta", "br", "hr", "img", "input", "link", "wbr", "col"}


def layer(i: int, *, error: float | None = 1e-6, noise: float | None = 1e-7,
          bound: float | None = 1e-5, status: str = "ok", name: str | None = None) -> dict:
    name = name or f"block{i // 10}.conv{i % 10}"
    return {"index": i, "ms": name, "torch": name, "kind": "Conv2d", "error": error,
            "noise": noise, "bound": bound, "sensitivity": 1.0, "status": status,
            "paired_by": "name"}


def report(layers: list[dict], **extra) -> dict:
    bad = [x for x in layers if x["status"] in ("fail", "nonfinite")]
    first = {"ms": bad[0]["ms"], "torch": bad[0]["torch"], "error": bad[0]["error"],
             "bound": bad[0]["bound"], "tensors": [bad[0]["ms"] + ".weight"]} if bad else None
    return {"verdict": "FAIL" if bad else "PASS", "message": f"{len(bad)} layers fail",
            "reasons": [], "notes": [], "tol": 1e-5, "k": 16.0,
            "inputs": [{"name": "x", "dtype": "float32", "shape": [1, 3, 8, 8],
                        "origin": "seed 0"}],
            "layers": layers, "first_failure": first,
            "outputs": [{"index": 0, "error": 1e-6, "noise": 1e-7, "bound": 1e-5,
                         "sensitivity": 1.0, "status": "ok", "shape": [1, 10]}],
            "tensors": [{"target": "fc.weight", "source": "fc.weight", "status": "identical",
                         "max_abs": 0.0, "cosine": 1.0, "holds": True, "holds_how": "equal"}],
            "timings": {"torch_forward": 0.1}, **extra}


def example_report() -> dict:
    layers = [layer(i, error=1e-7 * 1.04 ** i, noise=5e-8 * 1.04 ** i,
                    bound=max(1e-5, 16 * 5e-8 * 1.04 ** i)) for i in range(120)]
    layers[0]["error"] = 0.0
    layers[70].update(error=3e-3, status="fail", ms="layer3.1.conv2", torch="layer3.1.conv2")
    layers[71].update(error=1e-3, status="fail")
    layers[100].update(error=None, status="nonfinite")
    return report(layers, reasons=["2 layers exceed their bound", "1 layer gave NaN/Inf"])


def svg_of(page: str) -> ET.Element:
    found = re.findall(r"<svg\b.*?</svg>", page, re.S)
    assert len(found) == 1, f"{len(found)} <svg> elements"
    return ET.fromstring(found[0])


def titles(svg: ET.Element) -> list[str]:
    return [t.text or "" for t in svg.iter(f"{SVG_NS}title")]


class Balance(HTMLParser):
    """Every non-void tag closed in order; collects tags and attribute names."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.tags: set[str] = set()
        self.attrs: set[str] = set()

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        self.attrs.update(name for name, _ in attrs)
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags.add(tag)
        self.attrs.update(name for name, _ in attrs)

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes {self.stack[-3:]}"
        self.stack.pop()


def parse(page: str) -> Balance:
    parser = Balance()
    parser.feed(page)
    parser.close()
    assert parser.stack == [], parser.stack
    return parser


def test_page_is_well_formed_self_contained_and_has_no_script():
    page = render_html(example_report())
    assert page.startswith("<!DOCTYPE html>")
    parsed = parse(page)
    assert "script" not in parsed.tags and not any(a.startswith("on") for a in parsed.attrs)
    assert re.findall(r"https?://[^\s\"'<>]*", page) == ["http://www.w3.org/2000/svg"]
    assert "@import" not in page and "url(" not in page and "<link" not in page
    svg = svg_of(page)
    assert svg.findall(f".//{SVG_NS}polyline")
    assert "FAIL" in page and "2 layers exceed their bound" in page


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_names_are_escaped_everywhere(name):
    layers = [layer(0), layer(1, error=1e-2, status="fail", name=name), layer(2)]
    hostile = report(layers, message=name, notes=[name], reasons=[name],
                     timings={name: 1.0}, verdict=name)
    hostile["tensors"][0].update(target=name, status=name)
    hostile["inputs"][0]["name"] = name
    page = render_html(hostile)
    parsed = parse(page)
    assert "script" not in parsed.tags and "onmouseover" not in parsed.attrs
    assert "<script>" not in page and '"onmouseover' not in page
    for raw in ("\x1b", "\u202e", "\x00"):
        assert raw not in page
    svg = svg_of(page)  # parses as XML: no raw control characters or stray markup
    assert any(name.replace("\x1b", "\\x1b").replace("\u202e", "\\u202e")
               .replace("\x00", "\\x00") in t for t in titles(svg))


def test_failing_layer_is_named_in_tooltip_and_tables():
    page = render_html(example_report())
    failing_tips = [t for t in titles(svg_of(page)) if "layer3.1.conv2" in t]
    assert failing_tips and "3.00e-03" in failing_tips[0] and "bound" in failing_tips[0]
    assert page.count("<td>layer3.1.conv2</td>") == 4  # MindSpore and PyTorch, both tables
    assert re.search(r'<tr class="bad" id="L70">', page)
    assert "first failure: layer3.1.conv2" in page  # the vertical line's label


@pytest.mark.parametrize("value", [0.0, math.nan, math.inf, None])
def test_zero_nan_inf_and_missing_errors(value):
    status = "ok" if value in (0.0, None) else "nonfinite"
    layers = [layer(0), layer(1, error=value, status=status), layer(2)]
    page = render_html(report(layers))
    svg = svg_of(page)
    labels = [t.text for t in svg.iter(f"{SVG_NS}text")]
    if value == 0.0:
        assert "0" in labels and "labelled 0" in page
    elif value is None:
        assert "NaN/inf" not in labels
    else:
        assert "NaN/inf" in labels and "labelled NaN/inf" in page
        triangles = [p for p in svg.iter(f"{SVG_NS}path") if p.get("class") == "bad"]
        assert len(triangles) >= 2  # the marker and the legend's swatch
    assert "nan" not in "".join(p.get("points", "") for p in svg.iter()).lower()


def test_nonfinite_error_from_json_is_a_marker_at_the_top():
    page = render_html(report([layer(0), layer(1, error=None, status="nonfinite")]))
    tips = titles(svg_of(page))
    assert any("block0.conv1" in t and "inf" in t for t in tips)


def test_one_layer_and_no_layers():
    one = render_html(report([layer(0)]))
    assert len(svg_of(one).findall(f".//{SVG_NS}circle")) >= 1
    none = render_html(report([]))
    assert "no layers compared" in none and "<svg" not in none
    parse(none)


def test_two_thousand_layers_stay_small_and_keep_every_failing_point():
    layers = [layer(i, error=1e-7 * (1 + i % 13)) for i in range(2000)]
    failing = list(range(5, 2000, 37))
    for i in failing:
        layers[i].update(error=1e-3, status="fail")
    page = render_html(report(layers))
    svg_text = re.search(r"<svg\b.*?</svg>", page, re.S).group(0)
    assert len(svg_text.encode()) < 300_000
    svg = svg_of(page)
    for line in svg.iter(f"{SVG_NS}polyline"):
        assert len(line.get("points").split()) <= MAX_POINTS
    tips = "\n".join(titles(svg))
    assert all(f"#{i} " in tips for i in failing)
    assert "Lines show" in page


def test_two_thousand_failing_layers_stay_small_and_all_counted():
    layers = [layer(i, error=1e-3 * (1 + i % 7), status="fail") for i in range(2000)]
    page = render_html(report(layers))
    svg_text = re.search(r"<svg\b.*?</svg>", page, re.S).group(0)
    assert len(svg_text.encode()) < 300_000
    named = more = 0
    for tip in titles(svg_of(page)):
        named += len(re.findall(r"^#\d+ ", tip, re.M))
        more += sum(int(n) for n in re.findall(r"and (\d+) more", tip))
    assert named + more == 2000


@pytest.mark.parametrize("garbage", [
    {}, {"layers": "abc", "tol": "x", "k": None, "verdict": None, "tensors": [1, None],
         "timings": [], "notes": "text", "first_failure": "x", "inputs": {}},
    {"layers": [None, 3, {"error": "1e-3", "bound": "oops", "index": "7"}, {}],
     "first_failure": {"tensors": "abc"}, "timings": {"t": "x"}},
])
def test_malformed_reports_still_render(garbage):
    page = render_html(garbage)
    parse(page)
    if "<svg" in page:
        svg_of(page)


def test_terminal_curve_width_markers_and_plain_text():
    layers = [layer(i, error=1e-7 * (1 + i % 5)) for i in range(2000)]
    layers[1234].update(error=5e-3, status="fail", ms="a\x1b[2J<b>", torch="a\x1b[2J<b>")
    for width in (20, 40, 72, 150):
        lines = terminal_curve(layers, width=width, height=6)
        assert len(lines) == 6 + 3
        assert all(len(line) <= width for line in lines), width
        assert not any("\x1b" in line for line in lines)
        marks = lines[-2]
        plot_start = marks.index("└") + 1
        col = marks.index("▲") - plot_start
        cols = width - plot_start
        assert marks.count("▲") == 1 and col == 1234 * cols // 2000
    assert "a\\x1b[2J<b>" in terminal_curve(layers, width=100)[-1]


def test_terminal_curve_small_and_empty():
    assert terminal_curve([]) == []
    assert terminal_curve([layer(0, error=None), {"ms": "x"}]) == []
    one = terminal_curve([layer(0)], width=30, height=3)
    assert "▲" not in one[-2] and "1 layer, 0 above 1" in one[-1]
    nonfinite = terminal_curve([layer(0), layer(1, error=None, status="nonfinite")], width=30)
    axis = nonfinite[-2].split("└")[1]
    assert axis == "─" * (len(axis) // 2) + "▲" * (len(axis) - len(axis) // 2)
    with pytest.raises(ValueError, match="width >= 20"):
        terminal_curve([layer(0)], width=10)


if __name__ == "__main__":
    with open(sys.argv[1], "w", encoding="utf-8") as f:
        f.write(render_html(example_report()))
    print("\n".join(terminal_curve(example_report()["layers"])))
