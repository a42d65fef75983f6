"""Fused tensors: layouts, config params, the mapping sections that use them, and plans.

Layouts are checked against an independent reference (a loop over groups and parts),
round-tripped bit-exactly on random bit patterns (NaN payloads included), and compared
with MindFormers' own converters where MindFormers is installed.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ms_port.errors import MappingError
from ms_port.match.layouts import KINDS, Layout, LayoutError, concat, grouped, interleave
from ms_port.match.mapping import MappingTable, Template, parse_mapping
from ms_port.match.params import (
    ParamError,
    check_alternative,
    check_expression,
    evaluate,
    names_in,
    resolve,
)
from ms_port.match.plan import Conflict, PlanOptions, make_plan
from ms_port.read.sources import Source
from ms_port.read.targets import from_infos
from ms_port.read.tensors import TensorInfo, dtype_name

DTYPES = {"float32": np.uint32, "int32": np.uint32, "bfloat16": np.uint16}


def _random(shape: tuple[int, ...], dtype: str, seed: int) -> np.ndarray:
    """Random bit patterns viewed as ``dtype``: every NaN payload and -0.0 included."""
    bits = np.random.default_rng(seed).integers(0, np.iinfo(DTYPES[dtype]).max, size=shape,
                                                dtype=DTYPES[dtype], endpoint=True)
    wanted = {"float32": np.float32, "int32": np.int32, "bfloat16": ml_dtypes.bfloat16}[dtype]
    return bits.view(wanted)


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _reference_join(parts: list[np.ndarray], groups: int, sizes: list[int],
                    axis: int) -> np.ndarray:
    """The fused array by definition: for each group, ``sizes[i]`` rows of each part."""
    pieces = []
    for g in range(groups):
        for p, size in zip(parts, sizes):
            index = [slice(None)] * p.ndim
            index[axis] = slice(g * size, (g + 1) * size)
            pieces.append(p[tuple(index)])
    return np.concatenate(pieces, axis=axis)


# -- layouts --------------------------------------------------------------------------


@st.composite
def _layouts(draw):
    kind = draw(st.sampled_from(KINDS))
    n = draw(st.integers(2, 4))
    if kind == "concat":
        groups, sizes = 1, [draw(st.integers(1, 5)) for _ in range(n)]
    elif kind == "interleave":
        groups, sizes = draw(st.integers(1, 6)), [1] * n
    else:
        groups, sizes = draw(st.integers(1, 4)), [draw(st.integers(1, 4)) for _ in range(n)]
    rank = draw(st.integers(1, 2))
    axis = draw(st.integers(0, rank - 1))
    other = draw(st.integers(1, 4))
    dtype = draw(st.sampled_from(sorted(DTYPES)))
    seed = draw(st.integers(0, 2**32 - 1))
    return kind, groups, sizes, rank, axis, other, dtype, seed


def _shape(rows: int, rank: int, axis: int, other: int) -> tuple[int, ...]:
    if rank == 1:
        return (rows,)
    return (rows, other) if axis == 0 else (other, rows)


@settings(max_examples=50, deadline=None)
@given(_layouts())
def test_join_then_part_is_bit_exact_and_matches_the_definition(case):
    kind, groups, sizes, rank, axis, other, dtype, seed = case
    layout = Layout(kind, axis, groups, tuple(sizes))
    parts = [_random(_shape(groups * s, rank, axis, other), dtype, seed + i)
             for i, s in enumerate(sizes)]
    fused = layout.join(parts)
    assert fused.dtype == parts[0].dtype
    assert fused.shape == layout.fused_shape([p.shape for p in parts])
    assert _same_bits(fused, _reference_join(parts, groups, sizes, axis))
    for i, p in enumerate(parts):
        assert layout.part_shape(fused.shape, i) == p.shape
        back = layout.part(fused, i)
        assert _same_bits(back, p), (kind, i)
        assert back.flags.c_contiguous


@settings(max_examples=50, deadline=None)
@given(_layouts())
def test_part_then_join_rebuilds_any_fused_array(case):
    kind, groups, sizes, rank, axis, other, dtype, seed = case
    layout = Layout(kind, axis, groups, tuple(sizes))
    fused = _random(_shape(groups * sum(sizes), rank, axis, other), dtype, seed)
    parts = [layout.part(fused, i) for i in range(len(sizes))]
    assert _same_bits(layout.join(parts), fused)


@settings(max_examples=60, deadline=None)
@given(_layouts(), st.booleans())
def test_join_swapped_is_the_join_transposed_bit_for_bit(case, opencv):
    """A group joined and transposed in one pass (OpenCV filling each part's band of the
    output) holds exactly the join's transpose; without OpenCV, or for parts that are
    not 2-D, it declines (None) and the join runs as before."""
    from ms_port.match import transforms

    kind, groups, sizes, rank, axis, other, dtype, seed = case
    layout = Layout(kind, axis, groups, tuple(sizes))
    parts = [_random(_shape(groups * s, rank, axis, other), dtype, seed + i)
             for i, s in enumerate(sizes)]
    cv2, wrote = transforms._opencv(), []

    class Recording:  # OpenCV, each call checked to write into the band it was given
        @staticmethod
        def transpose(src, dst):
            wrote.append(cv2.transpose(src, dst=dst) is dst)
            return dst

    saved = transforms._cv2
    try:
        transforms._cv2 = Recording if opencv else None
        got = layout.join_swapped(parts)
    finally:
        transforms._cv2 = saved
    if rank != 2 or not opencv:
        assert got is None and not wrote
        return
    want = np.ascontiguousarray(_reference_join(parts, groups, sizes, axis).T)
    assert got.flags.c_contiguous and _same_bits(got, want)
    assert wrote == [True] * (groups * len(parts))  # every band by OpenCV, in place


@pytest.mark.parametrize("dtype", [np.uint8, np.bool_, np.int64, np.float64, np.float16])
@pytest.mark.parametrize("axis", [0, 1])
def test_join_swapped_of_strided_parts_of_any_element_size(dtype, axis):
    """Parts that are views (a column slice, reversed rows) of 1-, 2- and 8-byte
    elements; a big-endian part is declined (the join makes it native)."""
    rng = np.random.default_rng(axis)
    base = [rng.integers(0, 255, (12, 20)).astype(dtype) for _ in range(2)]
    parts = [base[0][:, 3:13], base[1][::-1, 5:15]] if axis == 0 else [
        base[0][2:12, :6], base[1][::-1][:10, 4:12]]
    layout = Layout("concat", axis, 1, tuple(p.shape[axis] for p in parts))
    got = layout.join_swapped(parts)
    want = np.ascontiguousarray(layout.join(parts).T)
    assert got is not None and got.flags.c_contiguous and _same_bits(got, want)
    swapped = [p.astype(p.dtype.newbyteorder(">")) for p in parts]
    if swapped[0].dtype.itemsize > 1:
        assert layout.join_swapped(swapped) is None


def test_swap_of_knows_a_transpose_among_unit_reshapes_and_nothing_else():
    from ms_port.match.transforms import Transform, swap_of

    expert = (Transform("reshape", [1, 64, 32]), Transform("transpose", [0, 2, 1]))
    assert swap_of(expert, (64, 32)) == (1, 32, 64)
    down = (Transform("transpose", [1, 0]), Transform("reshape", [1, -1, 64]))
    assert swap_of(down, (64, 48)) == (1, 48, 64)
    assert swap_of((Transform("unsqueeze", 0), Transform("transpose", [2, 1, 0])), (5, 7)) \
        == (7, 5, 1)
    assert swap_of((), (5, 7)) is None                                   # nothing swapped
    assert swap_of((Transform("transpose", [1, 0]),) * 2, (5, 7)) is None  # swapped back
    assert swap_of((Transform("transpose", [0, 2, 1]),), (2, 5, 7)) is None  # 3 axes
    assert swap_of((Transform("reshape", [7, 5]), Transform("transpose", [1, 0])),
                   (5, 7)) is None                                       # not a unit reshape
    assert swap_of((Transform("transpose", [1, 0]), Transform("rope_pairs", [2, 4])),
                   (4, 4)) is None
    assert swap_of((Transform("transpose", [1, 0, 2]),), (1, 5, 7)) is None  # units only


def _rows(name: str, n: int, cols: int = 2) -> np.ndarray:
    """Rows whose values say whose row they are: ``q`` row 3 holds 1030, 1031, ..."""
    base = {"q": 100, "k": 200, "v": 300, "g": 400, "u": 500}[name]
    return ((base + np.arange(n)[:, None]) * 10 + np.arange(cols)[None, :]).astype(np.int32)


def _labels(fused: np.ndarray) -> list[str]:
    names = {1: "q", 2: "k", 3: "v", 4: "g", 5: "u"}
    assert (np.diff(fused, axis=1) == 1).all()  # rows are moved whole
    return [f"{names[int(r[0]) // 1000]}{int(r[0]) // 10 % 100}" for r in fused]


def test_grouped_known_answer_q_k_v_per_kv_head():
    q, k, v = _rows("q", 8), _rows("k", 2), _rows("v", 2)
    fused = grouped(2, [4, 1, 1]).join([q, k, v])
    assert _labels(fused) == ["q0", "q1", "q2", "q3", "k0", "v0",
                              "q4", "q5", "q6", "q7", "k1", "v1"]


def test_interleave_known_answer_gate_up():
    g, u = _rows("g", 3), _rows("u", 3)
    fused = interleave(rows=3, parts=2).join([g, u])
    assert _labels(fused) == ["g0", "u0", "g1", "u1", "g2", "u2"]
    assert np.array_equal(interleave(rows=3, parts=2).part(fused, 1), u)


def test_concat_known_answer_and_axis_one():
    q, k = _rows("q", 2), _rows("k", 3)
    assert _labels(concat([2, 3]).join([q, k])) == ["q0", "q1", "k0", "k1", "k2"]
    # along axis 1 (a transposed Conv1D-style weight): columns, not rows, are fused
    q4, k2 = _rows("q", 4).T, _rows("k", 2).T
    fused = grouped(2, [2, 1], axis=1).join([q4, k2])
    assert fused.shape == (2, 6)
    assert _labels(fused.T) == ["q0", "q1", "k0", "q2", "q3", "k1"]
    assert np.array_equal(grouped(2, [2, 1], axis=1).part(fused, 0), q4)


@pytest.fixture(scope="module")
def mindformers_convert():
    """MindFormers' own hf->mg converters (its logs go where conftest.py points them)."""
    pytest.importorskip("mindformers")
    return pytest.importorskip("mindformers.utils.convert_utils")


@pytest.mark.parametrize("heads,kv,head_dim,cols", [(4, 2, 3, 5), (4, 4, 2, 3), (6, 1, 2, 0)],
                         ids=["gqa", "mha", "mqa-bias"])
def test_grouped_equals_mindformers_qkv_concat_hf2mg(mindformers_convert, heads, kv,
                                                      head_dim, cols):
    hidden = heads * head_dim
    extra = (cols,) if cols else ()
    q = _random((hidden, *extra), "float32", 1)
    k = _random((kv * head_dim, *extra), "float32", 2)
    v = _random((kv * head_dim, *extra), "float32", 3)
    theirs = mindformers_convert.qkv_concat_hf2mg(np.concatenate([q, k, v]), heads, kv, hidden)
    ours = grouped(kv, [heads // kv * head_dim, head_dim, head_dim]).join([q, k, v])
    assert _same_bits(ours, theirs)


def test_interleave_equals_mindformers_ffn_concat_hf2mg(mindformers_convert):
    gate, up = _random((6, 4), "float32", 4), _random((6, 4), "float32", 5)
    theirs = mindformers_convert.ffn_concat_hf2mg(np.concatenate([gate, up]), 6)
    assert _same_bits(interleave(rows=6, parts=2).join([gate, up]), theirs)


def test_layout_errors_name_the_part_and_the_numbers():
    layout = grouped(2, [4, 1, 1], why="kv_heads=2 (num_key_value_heads)")
    q, k, v = np.zeros((8, 3)), np.zeros((2, 3)), np.zeros((2, 3))
    with pytest.raises(LayoutError, match="3 parts, got 2"):
        layout.join([q, k])
    with pytest.raises(LayoutError, match="3 parts, got 4"):
        layout.fused_shape([q.shape, k.shape, v.shape, v.shape])
    with pytest.raises(LayoutError) as exc:
        layout.join([q, np.zeros((3, 3)), v])
    assert "part 2 has 3 rows on axis 0" in str(exc.value)
    assert "2 x 1 = 2" in str(exc.value) and "num_key_value_heads" in str(exc.value)
    with pytest.raises(LayoutError, match=r"part 3 has shape \[2, 4\].*off axis 0"):
        layout.join([q, k, np.zeros((2, 4))])
    with pytest.raises(LayoutError, match=r"part 2 has shape \[2\]"):
        layout.join([q, np.zeros(2), v])
    with pytest.raises(LayoutError, match="no axis 1"):
        grouped(2, [4, 1, 1], axis=1).join([np.zeros(8), np.zeros(2), np.zeros(2)])
    with pytest.raises(LayoutError, match=r"needs 12 rows on axis 0.*\[11, 3\]"):
        layout.part(np.zeros((11, 3)), 0)
    with pytest.raises(LayoutError, match="needs 12 rows"):
        layout.part_shape((12,), 0) and layout.part_shape((13,), 1)
    with pytest.raises(LayoutError, match="unknown layout 'zigzag'"):
        Layout("zigzag", 0, 1, (1,))
    for bad in [dict(groups=0, sizes=(1,)), dict(groups=1, sizes=()),
                dict(groups=1, sizes=(2, 0))]:
        with pytest.raises(LayoutError, match="positive"):
            Layout("grouped", 0, **bad)


def test_layout_to_data_and_str():
    assert grouped(2, [4, 1, 1]).to_data() == {"grouped": 2, "sizes": [4, 1, 1], "axis": 0}
    assert concat([1, 2], axis=1).to_data() == {"concat": 1}
    assert interleave(3, 2).to_data() == {"interleave": 0}
    assert str(grouped(2, [4, 1, 1])) == "grouped(axis=0, groups=2, sizes=[4, 1, 1])"


# -- params ---------------------------------------------------------------------------


def test_evaluate_integer_arithmetic():
    values = {"heads": 32, "kv": 8, "hidden": 4096}
    assert evaluate("hidden / heads", values) == 128
    assert evaluate("heads / kv * (hidden // heads)", values) == 512
    assert evaluate("heads - kv + 2", values) == 26
    assert evaluate("7 // 2", {}) == 3
    assert evaluate(12, {}) == 12
    assert names_in("heads / kv * head_dim") == {"heads", "kv", "head_dim"}


@pytest.mark.parametrize("expr,match", [
    ("7 / 2", "not a whole number"),
    ("heads / 0", "divides by zero"),
    ("heads // (kv - kv)", "divides by zero"),
    ("missing * 2", "needs 'missing'"),
    ("nothing", "needs 'nothing'"),
    ("flt", "not an integer"),
    ("flag", "not an integer"),
    ("text", "not an integer"),
])
def test_evaluate_refuses(expr, match):
    values = {"heads": 6, "kv": 2, "flt": 4.0, "flag": True, "text": "4", "nothing": None}
    with pytest.raises(ParamError, match=match):
        evaluate(expr, values)


@pytest.mark.parametrize("expr", [
    "__import__('os')", "a.b", "a[0]", "1.5", "'four'", "True", "None", "lambda: 1",
    "2 ** 3", "-1", "a % b", "a if b else c", "a < b", "(x := 1)", "[a]", "a; b",
    "x" * 201, "1 +", "", 1.5, True, None, [1], {"a": 1},
])
def test_check_expression_refuses(expr):
    with pytest.raises(ParamError):
        check_expression(expr)
    with pytest.raises(ParamError):
        evaluate(expr, {"a": 1, "b": 2, "c": 3, "x": 4, "open": 5})


def test_check_expression_refuses_a_call_even_to_a_known_name():
    with pytest.raises(ParamError, match="Call"):
        check_expression("__import__('os')")
    with pytest.raises(ParamError, match="Attribute"):
        check_expression("a.b")
    with pytest.raises(ParamError, match="too long"):
        check_expression("a+" * 100 + "a")
    check_expression("a+" * 99 + "a")  # 199 characters: accepted
    # a bare name is a config key, never a Python builtin
    assert evaluate("open", {"open": 5}) == 5
    with pytest.raises(ParamError, match="needs 'open'"):
        evaluate("open", {})


def test_resolve_takes_the_first_alternative_that_works():
    params = {"heads": ("num_attention_heads",),
              "kv_heads": ("num_key_value_heads", "num_attention_heads"),
              "head_dim": ("head_dim", "hidden_size / num_attention_heads"),
              "q_rows": ("heads / kv_heads * head_dim",)}
    mha = resolve(params, {"num_attention_heads": 4, "hidden_size": 64})
    assert mha == {"heads": (4, "num_attention_heads"), "kv_heads": (4, "num_attention_heads"),
                   "head_dim": (16, "hidden_size / num_attention_heads"),
                   "q_rows": (16, "heads / kv_heads * head_dim")}
    nulled = resolve(params, {"num_attention_heads": 4, "num_key_value_heads": None,
                              "hidden_size": 64})
    assert nulled["kv_heads"] == (4, "num_attention_heads")
    gqa = resolve(params, {"num_attention_heads": 4, "num_key_value_heads": 2,
                           "hidden_size": 64, "head_dim": 8})
    assert gqa["kv_heads"] == (2, "num_key_value_heads")
    assert gqa["head_dim"] == (8, "head_dim")
    assert gqa["q_rows"] == (16, "heads / kv_heads * head_dim")


def test_resolve_ignores_nested_config_sections_and_names_the_failing_param():
    params = {"heads": ("num_attention_heads",), "head_dim": ("hidden_size / heads",)}
    with pytest.raises(ParamError) as exc:
        resolve(params, {"num_attention_heads": 3, "hidden_size": 64})
    assert "param 'head_dim'" in str(exc.value) and "64 / 3" in str(exc.value)
    with pytest.raises(ParamError, match=r"param 'heads'.*'num_attention_heads'"):
        resolve(params, {"text_config": {"num_attention_heads": 4}, "hidden_size": 64})
    with pytest.raises(ParamError, match=r"param 'kv'.*'a'.*'b'"):
        resolve({"kv": ("a", "b")}, {})


def test_a_guarded_alternative_holds_only_where_its_switch_is_true():
    """{if: KEY, then: EXPR}: read where config KEY is true; a group count a config
    carries with its switch off (or a switch that is not a bool) is not read."""
    groups = {"kv": ({"if": "multi_query_attention", "then": "multi_query_group_num"},
                     "num_attention_heads")}
    base = {"num_attention_heads": 8, "multi_query_group_num": 2}
    assert resolve(groups, {**base, "multi_query_attention": True})["kv"] == (
        2, "multi_query_group_num, multi_query_attention true")
    for off in (False, None, 1, "true"):
        assert resolve(groups, {**base, "multi_query_attention": off})["kv"][0] == 8
    assert resolve(groups, base)["kv"][0] == 8
    with pytest.raises(ParamError, match="'multi_query_attention' is False"):
        resolve({"kv": groups["kv"][:1]}, {**base, "multi_query_attention": False})
    for bad in ({"if": "x"}, {"if": "x y", "then": "a"}, {"if": "x", "then": "a.b"},
                {"if": "x", "then": "a", "else": "b"}):
        with pytest.raises(ParamError):
            check_alternative(bad)
    with pytest.raises(MappingError, match=r"params\.kv"):
        parse_mapping("params:\n  kv: [{if: x, then: 'import os'}]\n", origin="t.yaml")


# -- mapping sections -----------------------------------------------------------------

GOOD = """
version: 1
select:
  model_type: [llama, mistral]
  architectures: LlamaForCausalLM
  target: [mindformers:llama]
params:
  heads: num_attention_heads
  kv_heads: [num_key_value_heads, num_attention_heads]
  head_dim: [head_dim, hidden_size / num_attention_heads]
fuse:
  - target: 'model.layers.{i}.attention.w_qkv.weight'
    sources: ['model.layers.{i}.q.weight', 'model.layers.{i}.k.weight',
              'model.layers.{i}.v.weight']
    layout: {grouped: kv_heads, sizes: ['heads / kv_heads * head_dim', head_dim, head_dim]}
  - target: 'model.layers.{i}.w_gate_hidden.weight'
    sources: ['model.layers.{i}.gate.weight', 'model.layers.{i}.up.weight']
    layout: interleave
    transforms: [{unsqueeze: 0}]
split:
  - source: 'h.{i}.c_attn.weight'
    targets: ['h.{i}.q.weight', 'h.{i}.k.weight', 'h.{i}.v.weight']
    layout: {concat: 1}
    transforms: [{transpose: [1, 0]}]
  - source: 'blk.{j}.qkv.{i}'
    targets: ['blk.{j}.a.{i}', 'blk.{j}.b.{i}']
    layout: {grouped: 2}
tied:
  - {source: lm_head.weight, same_as: model.embed_tokens.weight, when: tie_word_embeddings}
  - {source: head.w, same_as: emb.w}
implies:
  mistral: {qkv_bias: true, sliding: false}
"""


def test_new_sections_parse():
    table = parse_mapping(GOOD, origin="t.yaml")
    assert table.select == {"model_type": ("llama", "mistral"),
                            "architectures": ("LlamaForCausalLM",),
                            "target": ("mindformers:llama",)}
    assert table.params["kv_heads"] == ("num_key_value_heads", "num_attention_heads")
    assert table.params["heads"] == ("num_attention_heads",)
    assert table.implies == {"mistral": {"qkv_bias": True, "sliding": False}}
    assert table.merged(parse_mapping("select: {model_type: x}\nimplies: {x: {a: true}}",
                                      origin="u.yaml")).implies == {
        "mistral": {"qkv_bias": True, "sliding": False}, "x": {"a": True}}
    qkv, ffn = table.fuse
    assert qkv.target.names == ["i"] and len(qkv.sources) == 3
    assert qkv.layout.kind == "grouped" and qkv.layout.groups == "kv_heads"
    assert qkv.layout.sizes == ("heads / kv_heads * head_dim", "head_dim", "head_dim")
    assert qkv.where == "fuse[0] in t.yaml"
    assert ffn.layout.kind == "interleave" and ffn.layout.axis == 0
    assert [str(t) for t in ffn.transforms] == ["unsqueeze(0)"]
    c_attn, blk = table.split
    assert c_attn.layout.kind == "concat" and c_attn.layout.axis == 1
    assert blk.layout.groups == 2 and blk.layout.sizes is None
    assert blk.source.match("blk.3.qkv.7") == {"j": "3", "i": "7"}
    assert table.tied[0].when == "tie_word_embeddings" and table.tied[1].when is None
    assert table.tied[1].where == "tied[1] in t.yaml"


def test_layout_spec_resolves_numbers_from_values():
    table = parse_mapping(GOOD, origin="t.yaml")
    values = {"heads": 4, "kv_heads": 2, "head_dim": 3}
    layout = table.fuse[0].layout.resolve(values, [12, 6, 6])
    assert (layout.kind, layout.groups, layout.sizes) == ("grouped", 2, (6, 3, 3))
    assert "kv_heads = 2" in layout.why
    assert table.fuse[1].layout.resolve({}, [5, 5]) == interleave(5, 2)
    with pytest.raises(LayoutError, match="equal length"):
        table.fuse[1].layout.resolve({}, [5, 4])
    assert table.split[0].layout.resolve({}, [3, 4, 5]).sizes == (3, 4, 5)
    assert table.split[1].layout.resolve({}, [8, 4]).sizes == (4, 2)
    with pytest.raises(LayoutError, match="5 rows do not split into 2"):
        table.split[1].layout.resolve({}, [8, 5])


def _fuse(**entry):
    base = {"target": "a.{i}.qkv", "sources": ["a.{i}.q", "a.{i}.k", "a.{i}.v"],
            "layout": "concat"}
    return {"fuse": [{**base, **entry}]}


def _split(**entry):
    base = {"source": "a.{i}.qkv", "targets": ["a.{i}.q", "a.{i}.k", "a.{i}.v"],
            "layout": "concat"}
    return {"split": [{**base, **entry}]}


def _yaml(data) -> str:
    import yaml

    return yaml.safe_dump(data)


BAD = {
    "one source": (_fuse(sources=["a.{i}.q"]), "fuse[0].sources"),
    "sources not a list": (_fuse(sources="a.{i}.q"), "fuse[0].sources"),
    "source placeholders differ": (_fuse(sources=["a.{i}.q", "a.{j}.k", "a.{i}.v"]),
                                   "fuse[0].sources (a.{j}.k)"),
    "source lacks placeholder": (_fuse(sources=["a.q", "a.{i}.k", "a.{i}.v"]),
                                 "fuse[0].sources (a.q)"),
    "unknown layout": (_fuse(layout="zigzag"), "fuse[0].layout"),
    "unknown layout key": (_fuse(layout={"zigzag": 0}), "fuse[0].layout"),
    "grouped as a word": (_fuse(layout="grouped"), "fuse[0].layout"),
    "grouped extra key": (_fuse(layout={"grouped": "kv", "sizes": [1, 1, 1], "extra": 1}),
                          "fuse[0].layout"),
    "two kinds": (_fuse(layout={"concat": 0, "interleave": 0}), "fuse[0].layout"),
    "concat with sizes": (_fuse(layout={"concat": 0, "sizes": [1, 1, 1]}), "fuse[0].layout"),
    "sizes count": (_fuse(layout={"grouped": 2, "sizes": [1, 1]}), "fuse[0].layout.sizes"),
    "empty sizes": (_fuse(layout={"grouped": 2, "sizes": []}), "fuse[0].layout.sizes"),
    "call in sizes": (_fuse(layout={"grouped": 2, "sizes": ["__import__('os')", 1, 1]}),
                      "fuse[0].layout"),
    "call in groups": (_fuse(layout={"grouped": "open('x')"}), "fuse[0].layout"),
    "float groups": (_fuse(layout={"grouped": 1.5}), "fuse[0].layout"),
    "bad axis": (_fuse(layout={"concat": -1}), "fuse[0].layout axis"),
    "bool axis": (_fuse(layout={"interleave": True}), "fuse[0].layout axis"),
    "fuse missing layout": ({"fuse": [{"target": "a", "sources": ["b", "c"]}]}, "fuse[0]"),
    "fuse extra key": (_fuse(unless="x"), "fuse[0]"),
    "when a name": ({**_fuse(when="x"), "settings": {"x": True}}, "fuse[0].when"),
    "when undeclared": (_fuse(when={"x": True}), "fuse[0].when"),
    "when wrong type": ({**_fuse(when={"x": 1}), "settings": {"x": True}}, "fuse[0].when"),
    "when empty": ({**_fuse(when={}), "settings": {"x": True}}, "fuse[0].when"),
    "settings a list": ({"settings": ["x"]}, "settings"),
    "settings nested": ({"settings": {"x": {"y": 1}}}, "settings"),
    "settings bad key": ({"settings": {"x-y": True}}, "settings"),
    "adjacent placeholders": (_fuse(target="a.{i}{j}"), "fuse[0].target"),
    "repeated placeholder": (_fuse(target="a.{i}.{i}"), "fuse[0].target"),
    "fuse transforms": (_fuse(transforms=[{"explode": 1}]), "fuse[0]"),
    "fuse not a list": ({"fuse": {"target": "a"}}, "fuse"),
    "split one target": (_split(targets=["a.{i}.q"]), "split[0].targets"),
    "split placeholders": (_split(targets=["a.{i}.q", "a.k", "a.{i}.v"]),
                           "split[0].targets (a.k)"),
    "split sizes count": (_split(layout={"grouped": 2, "sizes": [1, 1]}),
                          "split[0].layout.sizes"),
    "split bad source": (_split(source=""), "split[0].source"),
    "tied missing same_as": ({"tied": [{"source": "lm_head.weight"}]}, "tied[0]"),
    "tied extra key": ({"tied": [{"source": "a", "same_as": "b", "if": "c"}]}, "tied[0]"),
    "tied empty name": ({"tied": [{"source": "a", "same_as": ""}]}, "tied[0]"),
    "params call": ({"params": {"kv_heads": "__import__('os').getpid()"}}, "params.kv_heads"),
    "params float": ({"params": {"kv_heads": 2.5}}, "params.kv_heads"),
    "params empty list": ({"params": {"kv_heads": []}}, "params.kv_heads"),
    "params bad name": ({"params": {"kv-heads": "a"}}, "params.kv-heads"),
    "params lambda": ({"params": {"kv_heads": ["a", "lambda: 1"]}}, "params.kv_heads"),
    "params not a mapping": ({"params": ["a"]}, "params"),
    "select unknown key": ({"select": {"model": "llama"}}, "select"),
    "select empty list": ({"select": {"model_type": []}}, "select.model_type"),
    "select number": ({"select": {"model_type": [1]}}, "select.model_type"),
    "implies without select": ({"implies": {"qwen2": {"qkv_bias": True}}}, "implies"),
    "implies unselected type": ({"select": {"model_type": "llama"},
                                 "implies": {"qwen2": {"qkv_bias": True}}}, "implies.'qwen2'"),
    "implies a list": ({"select": {"model_type": "qwen2"},
                        "implies": {"qwen2": [{"qkv_bias": True}]}}, "implies.'qwen2'"),
    "implies nested value": ({"select": {"model_type": "qwen2"},
                              "implies": {"qwen2": {"qkv_bias": {"a": 1}}}}, "implies.'qwen2'"),
    "implies a number": ({"select": {"model_type": "qwen2"},
                          "implies": {"qwen2": {"qkv_bias": 1}}}, "implies.'qwen2'"),
    "implies a word": ({"select": {"model_type": "qwen2"},
                        "implies": {"qwen2": {"qkv_bias": "yes"}}}, "implies.'qwen2'"),
    "implies bad key": ({"select": {"model_type": "qwen2"},
                         "implies": {"qwen2": {"qkv-bias": True}}}, "implies.'qwen2'"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_invalid_entries_are_refused_naming_the_entry(case):
    data, entry = BAD[case]
    with pytest.raises(MappingError) as exc:
        parse_mapping(_yaml(data), origin="t.yaml")
    message = str(exc.value)
    assert message.startswith((f"t.yaml: invalid {entry}: ", f"t.yaml: {entry}: ")), message
    assert "\n" not in message


def test_second_entry_is_named_by_its_index():
    data = {"split": [_split()["split"][0], {**_split()["split"][0], "targets": ["x", "y"]}]}
    with pytest.raises(MappingError, match=r"split\[1\]\.targets"):
        parse_mapping(_yaml(data), origin="t.yaml")


def test_template_matches_and_fills():
    t = Template("a.{i}.b")
    assert t.match("a.12.b") == {"i": "12"}
    assert t.match("a.x.b") is None
    assert t.match("a.1.b.c") is None and t.match("xa.1.b") is None
    assert t.match("a..b") is None
    assert t.fill({"i": "7"}) == "a.7.b"
    two = Template("{l}.x.{i}")
    assert two.match("3.x.04") == {"l": "3", "i": "04"}
    assert two.fill(two.match("3.x.04")) == "3.x.04"
    assert Template("a.b").match("a.b") == {} and Template("a.b").match("aXb") is None
    with pytest.raises(ValueError, match="separated"):
        Template("a.{i}{j}.b")
    with pytest.raises(ValueError, match="twice"):
        Template("a.{i}.b.{i}")


def test_selects_by_model_type_architecture_and_target():
    table = parse_mapping(GOOD, origin="t.yaml")
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}
    assert table.selects(config, "mindformers:llama")
    assert not table.selects(config, "mindformers:gpt2")
    assert not table.selects({**config, "model_type": "gpt2"}, "mindformers:llama")
    assert not table.selects({**config, "architectures": ["Other"]}, "mindformers:llama")
    assert not table.selects({"model_type": "llama"}, "mindformers:llama")
    assert not table.selects({**config, "architectures": "LlamaForCausalLM"},
                             "mindformers:llama")
    assert not table.selects(None, "mindformers:llama")
    assert not MappingTable.empty().selects(config, "mindformers:llama")
    by_type = parse_mapping("select: {model_type: qwen2}", origin="t.yaml")
    assert by_type.selects({"model_type": "qwen2"}, "anything")


# -- plans ----------------------------------------------------------------------------

QKV = """
params:
  heads: num_attention_heads
  kv_heads: [num_key_value_heads, num_attention_heads]
  head_dim: [head_dim, hidden_size / num_attention_heads]
  q_rows: heads / kv_heads * head_dim
fuse:
  - target: 'layers.{i}.qkv.weight'
    sources: ['layers.{i}.q.weight', 'layers.{i}.k.weight', 'layers.{i}.v.weight']
    layout: {grouped: kv_heads, sizes: [q_rows, head_dim, head_dim]}
"""
CONFIG = {"num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 12}


def _source(arrays: dict[str, np.ndarray], config=None) -> Source:
    def loader(a):
        return lambda: a

    return Source("mem.safetensors", "safetensors",
                  {n: TensorInfo(n, a.shape, dtype_name(a.dtype), loader(a))
                   for n, a in arrays.items()}, config=config)


def _target(shapes: dict[str, tuple[int, ...]], dtype: str = "float32"):
    return from_infos([TensorInfo(n, s, dtype) for n, s in shapes.items()], "t")


def _qkv_arrays(layers=(0, 1), dtype="float32"):
    out = {}
    for i in layers:
        out[f"layers.{i}.q.weight"] = _random((12, 5), dtype, 10 * i)
        out[f"layers.{i}.k.weight"] = _random((6, 5), dtype, 10 * i + 1)
        out[f"layers.{i}.v.weight"] = _random((6, 5), dtype, 10 * i + 2)
    return out


def _qkv_target(layers=(0, 1), dtype="float32"):
    return _target({f"layers.{i}.qkv.weight": (24, 5) for i in layers}, dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fuse_fills_one_target_from_three_sources(dtype):
    arrays = _qkv_arrays(dtype=dtype)
    plan = make_plan(_source(arrays, CONFIG), _qkv_target(dtype=dtype),
                     parse_mapping(QKV, origin="t.yaml"), options=PlanOptions(dtype=dtype))
    assert plan.ok, plan.problems()
    assert plan.params == {"heads": (4, "num_attention_heads"),
                           "kv_heads": (2, "num_key_value_heads"),
                           "head_dim": (3, "hidden_size / num_attention_heads"),
                           "q_rows": (6, "heads / kv_heads * head_dim")}
    assert len(plan.matches) == 2
    for i, m in enumerate(plan.matches):
        names = tuple(f"layers.{i}.{p}.weight" for p in "qkv")
        assert m.target == f"layers.{i}.qkv.weight"
        assert m.parts == names and m.sources == names and m.source == names[0]
        assert m.layout == Layout("grouped", 0, 2, (6, 3, 3), m.layout.why)
        assert "fuse[0] in t.yaml" in m.detail
        parts = [arrays[n] for n in names]
        got = plan.expected(m)
        assert _same_bits(got, grouped(2, [6, 3, 3]).join(parts))
        assert _same_bits(got, _reference_join(parts, 2, [6, 3, 3], 0))
        # per KV head g: query heads 2g and 2g+1, then key head g, then value head g
        assert _same_bits(got[6:9], parts[1][:3]) and _same_bits(got[21:24], parts[2][3:])
    assert not plan.unused and not plan.missing and not plan.dropped


GATE_UP = """
settings:
  interleaved: true
fuse:
  - target: 'layers.{i}.fc1.weight'
    sources: ['layers.{i}.gate.weight', 'layers.{i}.up.weight']
    layout: interleave
    when: {interleaved: true}
  - target: 'layers.{i}.fc1.weight'
    sources: ['layers.{i}.gate.weight', 'layers.{i}.up.weight']
    layout: concat
    when: {interleaved: false}
"""


@pytest.mark.parametrize("settings, kind", [({}, "interleave"), ({"interleaved": True},
                                            "interleave"), ({"interleaved": False}, "concat"),
                                            ({"interleaved": 0}, None)])
def test_a_fuse_entry_applies_where_the_target_networks_setting_holds(settings, kind):
    """Two layouts of one target, chosen by the network's setting: the table's default
    where the target says nothing, the target's own where it does; a setting of another
    type (0 for false) holds for neither, and the target is left missing."""
    arrays = {"layers.0.gate.weight": _random((3, 5), "float32", 0),
              "layers.0.up.weight": _random((3, 5), "float32", 1)}
    target = _target({"layers.0.fc1.weight": (6, 5)})
    target.settings = settings
    plan = make_plan(_source(arrays), target, parse_mapping(GATE_UP, origin="t.yaml"),
                     options=PlanOptions(allow_missing=kind is None, allow_unused=kind is None))
    if kind is None:
        assert not plan.matches and [m.name for m in plan.missing] == ["layers.0.fc1.weight"]
        return
    (m,) = plan.matches
    assert m.layout.kind == kind
    gate, up = arrays["layers.0.gate.weight"], arrays["layers.0.up.weight"]
    want = (np.stack([gate, up], 1).reshape(6, 5) if kind == "interleave"
            else np.concatenate([gate, up]))
    assert _same_bits(plan.expected(m), want)


def test_fuse_with_an_mha_config_uses_the_attention_heads():
    arrays = {"layers.0.q.weight": _random((12, 5), "float32", 0),
              "layers.0.k.weight": _random((12, 5), "float32", 1),
              "layers.0.v.weight": _random((12, 5), "float32", 2)}
    config = {"num_attention_heads": 4, "num_key_value_heads": None, "hidden_size": 12}
    plan = make_plan(_source(arrays), _target({"layers.0.qkv.weight": (36, 5)}),
                     parse_mapping(QKV, origin="t.yaml"), config=config)
    assert plan.ok, plan.problems()
    assert plan.params["kv_heads"] == (4, "num_attention_heads")
    assert plan.matches[0].layout.sizes == (3, 3, 3) and plan.matches[0].layout.groups == 4
    assert _same_bits(plan.expected(plan.matches[0]),
                      _reference_join(list(arrays.values()), 4, [3, 3, 3], 0))


def test_fuse_without_the_config_key_it_needs_names_config_json():
    mapping = parse_mapping(QKV, origin="t.yaml")
    with pytest.raises(MappingError) as exc:
        make_plan(_source(_qkv_arrays()), _qkv_target(), mapping,
                  config={"num_attention_heads": 4})
    message = str(exc.value)
    assert "config.json" in message and "head_dim" in message and "hidden_size" in message
    assert message.startswith("t.yaml: ")
    with pytest.raises(MappingError, match=r"no config\.json was found"):
        make_plan(_source(_qkv_arrays()), _qkv_target(), mapping)


def test_fuse_whose_config_disagrees_with_the_tensors_is_one_line_naming_the_numbers():
    config = {**CONFIG, "num_key_value_heads": 1}  # the k/v tensors hold 2 heads of 3 rows
    with pytest.raises(MappingError) as exc:
        make_plan(_source(_qkv_arrays()), _qkv_target(), parse_mapping(QKV, origin="t.yaml"),
                  config=config)
    message = str(exc.value)
    assert "\n" not in message
    assert "fuse[0] in t.yaml" in message and "layers.0.qkv.weight" in message
    assert "part 2 has 6 rows" in message and "1 x 3 = 3" in message
    assert "groups kv_heads = 1" in message


def test_fuse_with_a_missing_source_is_a_parts_conflict_and_fills_nothing():
    arrays = _qkv_arrays()
    del arrays["layers.1.k.weight"]
    plan = make_plan(_source(arrays, CONFIG), _qkv_target(), parse_mapping(QKV, origin="t.yaml"))
    assert not plan.ok
    assert [m.target for m in plan.matches] == ["layers.0.qkv.weight"]
    (conflict,) = plan.conflicts
    assert isinstance(conflict, Conflict) and conflict.kind == "parts"
    assert conflict.targets == ("layers.1.qkv.weight",)
    assert conflict.sources == ("layers.1.q.weight", "layers.1.v.weight")
    assert "'layers.1.k.weight'" in conflict.message.split("has no")[1]
    assert "fuse[0] in t.yaml" in conflict.message
    filled_from = {s for m in plan.matches for s in m.sources}
    assert not filled_from & {"layers.1.q.weight", "layers.1.v.weight"}
    assert conflict.message in plan.problems()


def test_fuse_with_a_shape_that_does_not_fit_the_target_is_a_shape_conflict():
    plan = make_plan(_source(_qkv_arrays((0,)), CONFIG), _target({"layers.0.qkv.weight": (24, 6)}),
                     parse_mapping(QKV, origin="t.yaml"))
    assert not plan.matches
    (conflict,) = plan.conflicts
    assert conflict.kind == "shape" and "24×5" in conflict.message


SPLIT = """
split:
  - source: 'h.{i}.c_attn.weight'
    targets: ['h.{i}.q.weight', 'h.{i}.k.weight', 'h.{i}.v.weight']
    layout: {concat: 1}
    transforms: [{transpose: [1, 0]}]
"""


def test_split_fills_three_targets_each_with_its_part():
    c_attn = _random((4, 9), "float32", 7)  # GPT-2 Conv1D: in x (3 * out)
    names = ["h.0.q.weight", "h.0.k.weight", "h.0.v.weight"]
    plan = make_plan(_source({"h.0.c_attn.weight": c_attn}),
                     _target({n: (3, 4) for n in names}), parse_mapping(SPLIT, origin="t.yaml"))
    assert plan.ok, plan.problems()
    assert [m.target for m in plan.matches] == names
    for k, m in enumerate(plan.matches):
        assert m.part == k and m.source == "h.0.c_attn.weight" and not m.parts
        assert m.layout == concat([3, 3, 3], axis=1)
        assert _same_bits(plan.expected(m), np.ascontiguousarray(c_attn[:, 3 * k:3 * k + 3].T))


def test_split_into_a_partial_target_is_a_parts_conflict():
    plan = make_plan(_source({"h.0.c_attn.weight": _random((4, 9), "float32", 7)}),
                     _target({"h.0.q.weight": (3, 4), "h.0.v.weight": (3, 4)}),
                     parse_mapping(SPLIT, origin="t.yaml"))
    assert not plan.matches
    (conflict,) = plan.conflicts
    assert conflict.kind == "parts" and "'h.0.k.weight'" in conflict.message


TIED = """
tied:
  - {source: lm_head.weight, same_as: embed.weight, when: tie_word_embeddings}
"""


def test_tied_duplicate_with_equal_values_is_dropped_as_tied():
    embed = _random((10, 4), "float32", 3)
    source = _source({"embed.weight": embed, "lm_head.weight": embed.copy()},
                     {"tie_word_embeddings": True})
    plan = make_plan(source, _target({"embed.weight": (10, 4)}),
                     parse_mapping(TIED, origin="t.yaml"))
    assert plan.ok, plan.problems()
    (dropped,) = plan.dropped
    assert dropped.name == "lm_head.weight" and dropped.reason.startswith("tied")
    assert "embed.weight" in dropped.reason
    # the table is not applied where the config says the weights are not tied
    untied = make_plan(source, _target({"embed.weight": (10, 4)}),
                       parse_mapping(TIED, origin="t.yaml"),
                       config={"tie_word_embeddings": False})
    assert not untied.dropped and [u.name for u in untied.unused] == ["lm_head.weight"]


def test_tied_target_is_filled_from_its_twin_when_the_duplicate_is_absent():
    embed = _random((10, 4), "bfloat16", 3)
    plan = make_plan(_source({"embed.weight": embed}, {"tie_word_embeddings": True}),
                     _target({"embed.weight": (10, 4), "lm_head.weight": (10, 4)}, "bfloat16"),
                     parse_mapping(TIED, origin="t.yaml"))
    assert plan.ok, plan.problems()
    by_target = {m.target: m for m in plan.matches}
    head = by_target["lm_head.weight"]
    assert head.how == "tied" and head.source == "embed.weight"
    assert _same_bits(plan.expected(head), embed)
    assert by_target["embed.weight"].how == "exact"
    assert plan.counts["tied"] == 1


def test_tied_duplicate_with_other_values_is_kept_with_a_note():
    embed, head = _random((10, 4), "float32", 3), _random((10, 4), "float32", 4)
    plan = make_plan(_source({"embed.weight": embed, "lm_head.weight": head},
                             {"tie_word_embeddings": True}),
                     _target({"embed.weight": (10, 4), "lm_head.weight": (10, 4)}),
                     parse_mapping(TIED, origin="t.yaml"))
    assert plan.ok, plan.problems()
    assert not plan.dropped
    assert any("lm_head.weight" in n and "other values" in n for n in plan.notes)
    by_target = {m.target: m for m in plan.matches}
    assert by_target["lm_head.weight"].source == "lm_head.weight"
    assert _same_bits(plan.expected(by_target["lm_head.weight"]), head)


def test_tied_duplicate_fills_an_untied_target_instead_of_being_dropped():
    embed = _random((10, 4), "float32", 3)
    plan = make_plan(_source({"embed.weight": embed, "lm_head.weight": embed.copy()},
                             {"tie_word_embeddings": True}),
                     _target({"embed.weight": (10, 4), "lm_head.weight": (10, 4)}),
                     parse_mapping(TIED, origin="t.yaml"))
    assert not plan.missing, plan.problems()
    head = next(m for m in plan.matches if m.target == "lm_head.weight")
    assert _same_bits(plan.expected(head), embed)


def test_a_table_layered_on_itself_drops_a_tied_duplicate_once():
    embed = _random((10, 4), "float32", 3)
    table = parse_mapping(TIED, origin="t.yaml")
    plan = make_plan(_source({"embed.weight": embed, "lm_head.weight": embed.copy()},
                             {"tie_word_embeddings": True}),
                     _target({"embed.weight": (10, 4)}), table.merged(table))
    assert plan.ok, plan.problems()
    assert [d.name for d in plan.dropped] == ["lm_head.weight"]


def test_saved_plan_with_fuse_split_and_tied_gives_the_same_plan_back():
    arrays = {**_qkv_arrays(), "h.0.c_attn.weight": _random((4, 9), "float32", 7),
              "embed.weight": _random((10, 4), "float32", 3)}
    target = _target({"layers.0.qkv.weight": (24, 5), "layers.1.qkv.weight": (24, 5),
                      "embed.weight": (10, 4), "lm_head.weight": (10, 4),
                      **{f"h.0.{p}.weight": (3, 4) for p in "qkv"}})
    source = _source(arrays, {**CONFIG, "tie_word_embeddings": True})
    plan = make_plan(source, target, parse_mapping(QKV + SPLIT + TIED, origin="t.yaml"))
    assert plan.ok, plan.problems()
    assert plan.counts["tied"] == 1 and sum(bool(m.parts) for m in plan.matches) == 2
    saved = plan.to_yaml()
    again = make_plan(source, target, parse_mapping(saved, origin="saved.yaml"))
    assert again.ok, again.problems()

    def key(m):
        return m.target, m.sources, m.part, m.how, m.layout and m.layout.to_data()

    assert [key(m) for m in again.matches] == [key(m) for m in plan.matches]
    for a, b in zip(plan.matches, again.matches):
        assert _same_bits(plan.expected(a), again.expected(b))


def test_a_part_index_out_of_range_is_a_layout_error():
    layout = Layout("concat", 0, 1, (2, 3))
    with pytest.raises(LayoutError, match="not 2"):
        layout.part(np.zeros((5, 4), np.float32), 2)
    with pytest.raises(LayoutError, match="not -1"):
        layout.part_shape((5, 4), -1)


def _fused_equals(got: np.ndarray, layout, parts: list[np.ndarray]) -> bool:
    """The read-back's verdict on a fused tensor: its bytes against its parts, joined a
    few groups at a time where the layout puts them."""
    from ms_port.read.tensors import flat_bytes
    from ms_port.write.proof import _joined_bytes, _same_stream

    return _same_stream([flat_bytes(got)], _joined_bytes(got.shape, layout, parts))


def test_readback_compares_a_fused_tensor_part_by_part_and_sees_one_wrong_bit():
    import ml_dtypes

    from ms_port.read.tensors import same_bits
    from ms_port.write.writers import _count_nonfinite

    rng = np.random.default_rng(0)
    parts = [rng.standard_normal((n, 6)).astype(ml_dtypes.bfloat16) for n in (8, 2, 2)]
    layout = grouped(2, [4, 1, 1])
    fused = layout.join(parts)
    assert _fused_equals(fused, layout, parts)
    for flat_index in (0, fused.size // 2, fused.size - 1):
        broken = fused.copy()
        bits = broken.reshape(-1).view(np.uint16)
        bits[flat_index] ^= 1  # one bit of one value
        assert not _fused_equals(broken, layout, parts)
        assert not same_bits(broken, fused)
    assert not _fused_equals(layout.join([parts[0], parts[2], parts[1]]), layout, parts)
    nan = fused.copy()
    nan[0, 0], nan[3, 1] = np.nan, np.inf
    assert _count_nonfinite(nan, "bfloat16") == 2 and _count_nonfinite(fused, "bfloat16") == 0
    half = np.array([1.0, np.nan, -np.inf, 65504.0], np.float16)
    assert _count_nonfinite(half, "float16") == 2


@pytest.mark.parametrize("memcmp", [True, False], ids=["memcmp", "numpy"])
def test_same_bits_at_any_alignment_sees_one_flipped_bit_anywhere(memcmp, monkeypatch):
    """A checkpoint's tensors start at any byte offset: every misalignment compares
    equal when equal and unequal for one bit flipped at the first, a middle or the last
    byte, with the C library's memcmp and without it (numpy, in several chunks)."""
    import ms_port.read.tensors as tensors

    if not memcmp:
        monkeypatch.setattr(tensors, "_MEMCMP", None)
        monkeypatch.setattr(tensors, "COMPARE_BYTES", 48)
    elif tensors._MEMCMP is None:
        pytest.skip("no C library memcmp reachable through ctypes here")
    values = _random((37, 5), "bfloat16", 11)
    raw = values.view(np.uint8).reshape(-1)
    for shift in range(8):
        buf = np.zeros(raw.size + 8, np.uint8)
        buf[shift:shift + raw.size] = raw
        moved = buf[shift:shift + raw.size].view(ml_dtypes.bfloat16).reshape(values.shape)
        assert tensors.same_bits(moved, values) and tensors.same_bits(values, moved)
        for at in (0, raw.size // 2, raw.size - 1):
            buf[shift + at] ^= 0x10
            assert not tensors.same_bits(moved, values), (shift, at)
            buf[shift + at] ^= 0x10
    assert not tensors.same_bits(values[:-1], values)
    assert tensors.same_bits(values[:0], values[:0])
    assert tensors.same_bits(values.T, np.ascontiguousarray(values.T))


@pytest.mark.parametrize("layout", [grouped(3, [4, 1, 1]), interleave(rows=7, parts=2),
                                    concat([5, 2]), grouped(2, [2, 1], axis=1)],
                         ids=["grouped", "interleave", "concat", "axis1"])
def test_readback_joins_a_few_groups_at_a_time_and_sees_one_wrong_bit_in_any_part(
        layout, monkeypatch):
    """The readback joins a fused tensor's parts a few groups at a time (here less than
    one group's bytes, and chunks that do not divide the groups) and compares them with
    what was written: a bit flipped in any part's first or last value is seen."""
    import ms_port.write.proof as proof

    monkeypatch.setattr(proof, "_JOIN_BYTES", 40)
    sizes = [layout.groups * s for s in layout.sizes]
    if layout.axis == 0:
        parts = [_random((n, 3), "float32", i) for i, n in enumerate(sizes)]
    else:
        parts = [_random((2, n, 3), "float32", i) for i, n in enumerate(sizes)]
    fused = layout.join(parts)
    assert _fused_equals(fused, layout, parts)
    for i, part in enumerate(parts):
        for at in (0, part.size - 1):
            changed = [p.copy() for p in parts]
            changed[i].reshape(-1).view(np.uint32)[at] ^= 1
            assert not _fused_equals(fused, layout, changed), (i, at)
    assert not _fused_equals(fused[:-1], layout, parts)
    assert not _fused_equals(fused, layout, [parts[0][:-1], *parts[1:]])
    empty = [p[..., :0] for p in parts]
    assert _fused_equals(layout.join(empty), layout, empty)
    reshaped = parts[-1].reshape(1, -1) if layout.axis == 0 else parts[-1].reshape(1, 2, -1)
    assert reshaped.nbytes == parts[-1].nbytes  # the right size in the wrong shape
    assert not _fused_equals(fused, layout, [*parts[:-1], reshaped])
    assert not _fused_equals(fused, layout, parts[:-1])


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32", "float64"])
def test_nonfinite_count_from_bits_equals_isfinite_on_every_edge(dtype, monkeypatch):
    """Every NaN and Inf pattern counts, nothing finite does (the largest finite values,
    subnormals, -0), also across chunk ends, in chunks with none, in big-endian data."""
    import ml_dtypes

    import ms_port.write.writers as writers

    monkeypatch.setattr(writers, "_SCAN", 7)
    np_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    word = np.dtype(f"u{np_dtype.itemsize}")
    bits = np.random.default_rng(5).integers(0, np.iinfo(word).max, 300, dtype=word,
                                             endpoint=True)
    info = ml_dtypes.finfo(np_dtype) if dtype == "bfloat16" else np.finfo(np_dtype)
    edges = np.array([info.max, -info.max, info.tiny, info.smallest_subnormal, -0.0,
                      np.inf, -np.inf, np.nan, -np.nan], np_dtype).view(word)
    exponent = int(np.array(np.inf, np_dtype).view(word))
    payloads = np.array([exponent | 1, exponent | (exponent >> 1) | 1,
                         exponent | (1 << (8 * word.itemsize - 1)) | 2], word)
    bits = np.concatenate([bits, edges, payloads, np.zeros(20, word)])
    values = bits.view(np_dtype)
    with np.errstate(invalid="ignore"):  # NaN payloads cast to float64 stay NaN
        want = int(np.count_nonzero(~np.isfinite(values.astype(np.float64))))
    assert want > 5
    assert writers._count_nonfinite(values, dtype) == want
    assert writers._count_nonfinite(values.astype(values.dtype.newbyteorder(">")), dtype) \
        == want
    assert writers._count_nonfinite(values[-20:], dtype) == 0
    assert writers._count_nonfinite(values.reshape(-1, 2)[:, ::-1], dtype) == want


def test_join_into_a_reused_buffer_equals_a_fresh_join():
    rng = np.random.default_rng(3)
    layout = grouped(2, [4, 1, 1])
    buffer = np.empty(10_000, np.uint8)
    for _ in range(3):  # one buffer, several tensors in turn
        parts = [rng.standard_normal((n, 5)).astype(np.float32) for n in (8, 2, 2)]
        fresh = layout.join(parts)
        reused = layout.join(parts, out=buffer)
        assert reused.shape == fresh.shape and np.array_equal(reused, fresh)
        assert np.shares_memory(reused, buffer)
    small = np.empty(8, np.uint8)  # too small: a fresh array, never a truncated one
    assert not np.shares_memory(layout.join(parts, out=small), small)


def test_a_target_being_written_is_never_overwritten_by_the_next_one_prepared(monkeypatch):
    """Adjacent fused targets: the writer takes one a few groups at a time (here one
    group per chunk, through one reused buffer) while the next is prepared meanwhile;
    every chunk holds the planned bytes when the writer takes it."""
    import time

    import ms_port.write.writers as writers

    monkeypatch.setattr(writers, "CHUNK_BYTES", 1)  # one group per chunk
    layers = (0, 1, 2, 3)
    arrays = _qkv_arrays(layers)
    plan = make_plan(_source(arrays, CONFIG), _qkv_target(layers),
                     parse_mapping(QKV, origin="t.yaml"))
    assert plan.ok and all(m.layout is not None for m in plan.matches)
    seen = []
    with writers._prepared(plan, {}, {}) as stream:
        for m, data in stream:
            taken = []
            for chunk in data.chunks:
                time.sleep(0.01)  # the next target is prepared meanwhile, in the worker
                taken.append(chunk.copy())
            assert len(taken) == m.layout.groups > 1
            assert (data.shape, data.dtype) == (m.shape, m.out_dtype)
            assert np.concatenate(taken).tobytes() == plan.expected(m).tobytes(), m.target
            seen.append(m.target)
    assert seen == [f"layers.{i}.qkv.weight" for i in layers]




@settings(max_examples=60, deadline=None)
@given(groups=st.integers(1, 6), sizes=st.lists(st.integers(1, 4), min_size=1, max_size=3),
       lead=st.sampled_from([(), (1,), (2,)]), tail=st.integers(1, 4),
       nbytes=st.integers(1, 300), dtype=st.sampled_from(["float32", "bfloat16", "int32"]))
def test_chunks_of_a_fused_tensor_are_its_join_in_order_and_stay_valid_for_two_turns(
        groups, sizes, lead, tail, nbytes, dtype):
    """A writer's chunks of a fused tensor, joined a few groups at a time through two
    buffers in turn, are the whole join's bytes in order, whole values each; a chunk is
    still intact after the next one is made (one-ahead). With a dimension of more than
    one before the axis the groups are not contiguous: one chunk, the whole join."""
    axis = len(lead)
    layout = Layout("grouped", axis, groups, tuple(sizes))
    parts = [_random((*lead, groups * s, tail), dtype, i) for i, s in enumerate(sizes)]
    want = layout.join(parts).tobytes()
    chunks = layout.chunks(parts, nbytes, buffers=2)
    got, previous = [], None
    for chunk in chunks:
        if previous is not None:
            assert previous[0].tobytes() == previous[1]  # untouched by the next chunk
        got.append(chunk.tobytes())
        assert chunk.dtype == np.uint8 and chunk.size % np.dtype(parts[0].dtype).itemsize == 0
        previous = (chunk, got[-1])
    assert b"".join(got) == want
    if math.prod(lead) > 1:
        assert len(got) == 1
    else:
        group = sum(sizes) * tail * np.dtype(parts[0].dtype).itemsize
        assert all(len(c) == max(1, nbytes // group) * group for c in got[:-1])


@pytest.mark.parametrize("fmt", ["ckpt", "safetensors"])
def test_nan_in_any_part_of_a_fused_target_written_in_chunks_is_counted(tmp_path, monkeypatch,
                                                                        fmt):
    """NaN/Inf are counted chunk by chunk as a fused target is written: in the first
    part, in the last, across chunks; reported under the fused target's name."""
    import ms_port.write.writers as writers

    monkeypatch.setattr(writers, "CHUNK_BYTES", 64)  # several chunks per target
    arrays = {k: np.ones_like(v) for k, v in _qkv_arrays().items()}  # finite but for these
    arrays["layers.0.q.weight"][0, 0] = np.nan
    arrays["layers.1.v.weight"][[0, 5], [1, 4]] = [np.inf, -np.nan]
    plan = make_plan(_source(arrays, CONFIG), _qkv_target(), parse_mapping(QKV, origin="t.yaml"))
    result = writers.write_plan(plan, tmp_path / f"out.{fmt}", format=fmt)
    assert result.nonfinite == {"layers.0.qkv.weight": 1, "layers.1.qkv.weight": 2}
