"""A distributed training output read as one checkpoint (ms_port.read.distributed).

Fixtures are sliced by MindSpore's own ``transform_checkpoints`` from whole arrays, with
strategies written with MindSpore's own protobuf message class and laid out as
MindFormers sets them (tensor parallel on a projection's rows or columns, data-parallel
replicas, the optimizer shard, two pipeline stages, remove_redundancy, bfloat16,
safetensors), and then named as MindFormers names them
(``checkpoint/rank_{i}/{prefix}_rank_{i}-{epoch}_{step}.ckpt``, ``strategy/``). What is
read back must be the whole arrays, bit for bit; each refusal is one line naming what
is wrong.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner

pytest.importorskip("mindspore")

import ms_port
from ms_port.cli import main
from ms_port.errors import MsPortError, SourceError
from ms_port.read.sources import read_source
from ms_port.read.strategy import ParamLayout, read_strategy
from ms_port.testing import rewrite_checkpoint, training_output

RNG = np.random.default_rng(0)
#: a data-parallel 2 × model-parallel 2 grid, as MindFormers sets it for a projection
GRID = [2, 2]
ARRAYS = {
    "model.q.weight": RNG.standard_normal((8, 12)).astype(np.float32),   # column parallel
    "model.o.weight": RNG.standard_normal((12, 8)).astype(np.float32),   # row parallel
    "model.norm.weight": RNG.standard_normal((12,)).astype(np.float32),  # replicated
    "model.emb.weight": RNG.standard_normal((16, 6)).astype(np.float32),  # both axes
    "model.ffn.weight": RNG.standard_normal((8, 4)).astype(np.float32),  # + optimizer shard
    "model.gate.weight": RNG.standard_normal((8, 8)).astype(np.float32),  # layout form
    "adam_m.model.q.weight": RNG.standard_normal((8, 12)).astype(np.float32),
    "global_step": np.array([7], dtype=np.int32),
}
LAYOUTS = {
    "model.q.weight": (GRID, [0, -1]),
    "model.o.weight": (GRID, [-1, 0]),
    "model.emb.weight": (GRID, [1, 0]),
    "model.ffn.weight": (GRID, [0, -1], 2, 2),
    "model.gate.weight": (GRID, [[1, 0], -1]),
}


@pytest.fixture(scope="module")
def output(tmp_path_factory) -> Path:
    """One stage of 4 devices, two saves (epoch 1 steps 9 and 10: 9 holds other values)."""
    return training_output(tmp_path_factory.mktemp("out"), ARRAYS, LAYOUTS,
                           saves=((1, 9), (1, 10)))


@pytest.fixture(scope="module")
def staged(tmp_path_factory) -> Path:
    """Two pipeline stages of 4 devices, bfloat16, safetensors, remove_redundancy."""
    arrays = {n: (a.astype(ml_dtypes.bfloat16) if a.dtype == np.float32 else a)
              for n, a in ARRAYS.items()}
    return training_output(tmp_path_factory.mktemp("staged"), arrays, LAYOUTS,
                           stages={"model.o.weight": 1, "model.gate.weight": 1},
                           fmt="safetensors", remove_redundancy=True)


def _whole(source) -> dict[str, np.ndarray]:
    return {i.name: i.load() for i in [*source, *source.training_state]}


def test_every_layout_reads_back_whole_and_bit_exact(output):
    source = read_source(output)
    got = _whole(source)
    assert set(got) == set(ARRAYS)
    for name, array in ARRAYS.items():
        assert got[name].dtype == array.dtype and np.array_equal(got[name], array), name
    assert source.format == "mindspore-distributed"
    assert source.cluster.devices == 4 and source.cluster.save == "epoch 1, step 10"


def test_matches_mindsporees_own_merge(output, tmp_path):
    """MindSpore's transform_checkpoints back to one .ckpt (its .ckpt output, which is
    right) holds what ms-port joins."""
    import mindspore as ms

    single = tmp_path / "src"
    for rank in range(4):  # the newest save only: MindSpore takes the lexically last file
        (single / f"rank_{rank}").mkdir(parents=True)
        shutil.copy(output / "checkpoint" / f"rank_{rank}" / f"llama_rank_{rank}-1_10.ckpt",
                    single / f"rank_{rank}")
    ms.transform_checkpoints(str(single), str(tmp_path / "merged"), "m", str(
        output / "strategy" / "ckpt_strategy_rank_0.ckpt"), None)
    merged = read_source(next((tmp_path / "merged" / "rank_0").glob("*.ckpt")),
                         strip_prefixes=False)
    ours = read_source(output)
    for name in ("model.q.weight", "model.o.weight", "model.emb.weight", "model.gate.weight"):
        assert np.array_equal(merged[name].load(), ours[name].load()), name


def test_pipeline_stages_bfloat16_safetensors_and_remove_redundancy(staged):
    source = read_source(staged)
    got = _whole(source)
    for name, array in ARRAYS.items():
        want = array.astype(ml_dtypes.bfloat16) if array.dtype == np.float32 else array
        assert got[name].dtype == want.dtype and np.array_equal(got[name], want), name
    assert source.cluster.stages == 2 and source.cluster.devices == 8
    assert source.cluster.single_copies > 0  # each replica set saved once


def test_the_latest_save_by_number_and_another_on_request(output):
    # lexically "-1_9" sorts after "-1_10": the latest by number is step 10
    assert np.array_equal(read_source(output)["model.q.weight"].load(),
                          ARRAYS["model.q.weight"])
    older = read_source(output, step="9")
    assert np.array_equal(older["model.q.weight"].load(), -ARRAYS["model.q.weight"])
    assert older.cluster.save == "epoch 1, step 9"
    assert read_source(output, step="1_10").cluster.save == "epoch 1, step 10"
    with pytest.raises(SourceError, match=r"--step '?11'? names no save.*1_10, 1_9"):
        read_source(output, step="11")


def test_the_checkpoint_folder_and_a_given_strategy_read_alike(output, tmp_path):
    moved = tmp_path / "elsewhere"
    shutil.copytree(output / "strategy", moved)
    a = read_source(output / "checkpoint", strategy=moved)
    b = read_source(output, strategy=moved / "ckpt_strategy_rank_2.ckpt")
    for name in ARRAYS:
        if name in a:
            assert np.array_equal(a[name].load(), b[name].load())


def _copy(output: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(output, dst)
    return dst


def test_a_missing_rank_with_a_unique_slice_is_one_line(output, tmp_path):
    out = _copy(output, tmp_path)
    shutil.rmtree(out / "checkpoint" / "rank_3")
    with pytest.raises(SourceError) as err:
        read_source(out)
    text = str(err.value)
    assert "\n" not in text and "rank 3" in text and "rank_3/" in text
    assert "is held by rank(s)" in text and "copy it back" in text


def test_a_missing_pure_replica_is_a_note(tmp_path):
    # data parallel only: ranks 0 and 1 hold the same tensors
    out = training_output(tmp_path / "dp", {"w": ARRAYS["model.q.weight"]},
                          {"w": ([2], [-1, -1])})
    shutil.rmtree(out / "checkpoint" / "rank_1")
    source = read_source(out)
    assert np.array_equal(source["w"].load(), ARRAYS["model.q.weight"])
    assert source.cluster.missing_ranks == [1]
    assert any("rank(s) 1 missing" in n and "replica" in n for n in source.cluster.notes)


def test_a_hole_left_by_remove_redundancy_is_refused(staged, tmp_path):
    out = _copy(staged, tmp_path)
    # the one copy of the row-parallel slice rank 4 held (stage 1: ranks 4-7)
    target = next((out / "checkpoint" / "rank_4").glob("*.safetensors"))
    from safetensors.numpy import load_file, save_file

    held = {k: v for k, v in load_file(target).items() if k != "model.o.weight"}
    save_file(held, target)
    with pytest.raises(SourceError, match=r"model\.o\.weight.*held by rank\(s\) 4, 6 only, "
                                          r"and ranks 4, 6 hold no copy"):
        read_source(out)


def test_a_slice_of_another_shape_than_its_layout_gives_is_refused(output, tmp_path):
    out = _copy(output, tmp_path)
    # rank 1 holds rows where the strategy splits columns (the others as it says)
    f = next((out / "checkpoint" / "rank_1").glob("*-1_10.ckpt"))
    rewrite_checkpoint(f, f, lambda a: a.__setitem__("model.o.weight",
                                                     ARRAYS["model.o.weight"][6:]))
    with pytest.raises(SourceError, match=r"rank 1 holds 'model\.o\.weight' as 6×8 float32, "
                                          r"its layout \(grid \[2, 2\], tensor map \[-1, 0\]\) "
                                          r"gives 12×4 float32 of the whole 12×8"):
        read_source(out)


def _strategy(tmp_path: Path, **layout) -> Path:
    from mindspore.train import node_strategy_pb2

    sm = node_strategy_pb2.ParallelStrategyMap(current_stage=0)
    item = sm.parallel_layout_item.add(param_name="w")
    lay = item.parallel_layouts
    lay.dev_matrix.add().dim.extend(layout.get("dev", [2]))
    lay.tensor_map.add().dim.extend(layout.get("tmap", [0, -1]))
    lay.param_split_shape.add().dim.extend(layout.get("split", []))
    lay.field = 0
    lay.opt_weight_shard_size = layout.get("opt_size", 0)
    lay.opt_weight_shard_step = layout.get("opt_step", 0)
    path = tmp_path / "s.ckpt"
    path.write_bytes(sm.SerializeToString())
    return path


@pytest.mark.parametrize(("layout", "message"), [
    ({"dev": [1000, 1000, 1000]}, "a device matrix of 1,000,000,000 devices"),
    ({"dev": [2], "tmap": [3, -1]}, "outside the device matrix's 1 axes"),
    ({"dev": [2, 2], "tmap": [0, 0]}, "splits two dimensions over one device axis"),
    ({"dev": [2, 2], "tmap": [1, 0], "split": [3, 5, 4, 4]}, "overlap or leave holes"),
    ({"dev": [2, 2], "tmap": [1, 0], "split": [3, 5]}, "2 sizes for 4 slices"),
    ({"dev": [2, 2], "tmap": [0, -1], "opt_size": 3, "opt_step": 2},
     "does not divide|not a product"),
    ({"dev": [2, 0]}, "device matrix"),
])
def test_a_hostile_strategy_is_one_line(tmp_path, layout, message):
    with pytest.raises(SourceError, match=message) as err:
        read_strategy([_strategy(tmp_path, **layout)])
    assert "\n" not in str(err.value) and "impossible" in str(err.value)


def test_a_file_that_is_no_strategy_is_refused(tmp_path):
    junk = tmp_path / "s.ckpt"
    junk.write_bytes(b"\xff\xff\xff\xff not a protobuf")
    with pytest.raises(SourceError, match="not a MindSpore strategy file"):
        read_strategy([junk])
    (tmp_path / "s.json").write_text(json.dumps([1, 2]))
    with pytest.raises(SourceError, match="parallel_layout_item"):
        read_strategy([tmp_path / "s.json"])


def test_the_json_form_and_uneven_rows(tmp_path):
    """An uneven split (param_split_shape): slices of 3 and 5 rows, written by hand with
    MindSpore's save_checkpoint."""
    import mindspore as ms

    whole = ARRAYS["model.q.weight"]
    root = tmp_path / "uneven"
    for rank, rows in ((0, slice(0, 3)), (1, slice(3, 8))):
        (root / "checkpoint" / f"rank_{rank}").mkdir(parents=True)
        ms.save_checkpoint([{"name": "w", "data": ms.Tensor(whole[rows])}],
                           str(root / "checkpoint" / f"rank_{rank}" / "net.ckpt"))
    (root / "strategy").mkdir()
    (root / "strategy" / "strategy.json").write_text(json.dumps({"parallel_layout_item": {
        "w": {"dev_matrix": [2], "tensor_map": [0, -1], "param_split_shape": [3, 5],
              "field": 0, "opt_weight_shard_step": 0, "opt_weight_shard_size": 0}}}))
    assert np.array_equal(read_source(root)["w"].load(), whole)


def test_layout_boxes_follow_mindspore():
    """The optimizer shard's group as MindSpore builds it: the unsplit grid dimensions
    from the innermost, the last taken in part."""
    lay = ParamLayout("w", (2, 2, 2), ((1,), ()), opt_size=2, opt_step=1)
    # dimension 1 (axis 1) splits rows; axes 0 and 2 replicate: the shard takes axis 0
    boxes = [lay.box(r, (8, 4)) for r in range(8)]
    assert boxes[0] == ((0, 2), (0, 4)) and boxes[1] == ((2, 4), (0, 4))
    assert boxes[2] == ((4, 6), (0, 4)) and boxes[4] == boxes[0]
    assert len(set(boxes)) == 4


def test_inspect_shows_the_layout_and_the_training_state_apart(output):
    result = CliRunner().invoke(main, ["inspect", str(output)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "parallel: 4 devices in 1 pipeline stage; grids 2×2 (5 parameters)" in result.output
    assert "saves: 2 found, read epoch 1, step 10 (others: epoch 1, step 9)" in result.output
    assert "training state (apart, not weights): 2 tensors" in result.output
    assert "adam_m.model.q.weight" not in result.output.split("training state")[0]
    data = json.loads(CliRunner().invoke(main, ["inspect", str(output), "--json"]).output)
    assert data["cluster"]["devices"] == 4 and len(data["training_state"]) == 2
    assert {t["name"] for t in data["training_state"]} == {"adam_m.model.q.weight",
                                                            "global_step"}


def test_strategy_on_one_file_is_bad_input(output, tmp_path):
    one = next((output / "checkpoint" / "rank_0").glob("*-1_10.ckpt"))
    result = CliRunner().invoke(main, ["inspect", str(one), "--strategy", str(
        output / "strategy")])
    assert result.exit_code == 2 and "for a distributed training output" in result.output


def test_diff_the_training_output_against_the_whole_checkpoint(output, tmp_path):
    import mindspore as ms

    whole = tmp_path / "whole.ckpt"
    ms.save_checkpoint([{"name": n, "data": ms.Tensor(a)} for n, a in ARRAYS.items()
                        if n.startswith("model.")], str(whole))
    same = ms_port.diff(output, whole)
    assert same.ok, [d.describe() for d in same.problems]
    older = ms_port.diff(output, whole, step="1_9")
    assert not older.ok and len(older.problems) == 6


#: MindFormers' tensor parallel on the legacy LLaMA: q/k/v and w1/w3 split by output
#: rows, wo and w2 by input columns, the embedding and the head by vocabulary rows;
#: norms replicated; the optimizer shard over the data-parallel axis on the projections
def _llama_layouts(names: list[str]) -> dict[str, tuple]:
    out = {}
    for name in names:
        if name.endswith(("wq.weight", "wk.weight", "wv.weight", "w1.weight", "w3.weight",
                          "w_qkv.weight", "w_gate_hidden.weight")):
            out[name] = (GRID, [0, -1], 2, 2)
        elif name.endswith(("wo.weight", "w2.weight")):
            out[name] = (GRID, [-1, 0])
        elif name.endswith(("embedding_weight", "lm_head.weight")):
            out[name] = (GRID, [0, -1])
    return out


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    """A tiny Qwen2 converted to MindFormers' LLaMA, then sliced over 4 devices with its
    Adam moments, as training on a cluster saves it."""
    from ms_port.testing import tiny_hf_lm

    root = tmp_path_factory.mktemp("llm")
    hf = tiny_hf_lm("qwen2", root / "hf")
    ckpt = root / "whole.ckpt"
    report = ms_port.convert(hf, ms_model="mindformers:llama", output=ckpt)
    assert report.ok
    whole = {i.name: i.load() for i in read_source(ckpt, strip_prefixes=False)}
    rng = np.random.default_rng(1)
    arrays = {**whole, **{f"adam_{m}.{n}": rng.standard_normal(a.shape).astype(np.float32)
                          for n, a in whole.items() for m in "mv"},
              "global_step": np.array([300], dtype=np.int32),
              "scale_sense": np.array([1024.0], dtype=np.float32)}
    out = training_output(root / "output", arrays, _llama_layouts(list(whole)),
                          saves=((1, 90), (1, 100)))
    return hf, ckpt, out


def test_a_cluster_output_exports_to_the_hugging_face_model_bit_exact(llm, tmp_path):
    from safetensors.numpy import load_file

    hf, _ckpt, out = llm
    result = CliRunner().invoke(main, [
        "export", str(out), "--ms-model", "mindformers:llama", "--config",
        str(hf / "config.json"), "-o", str(tmp_path / "back")], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "left out 56 training-state tensors (" in result.output
    assert "slices of 4 ranks joined, epoch 1, step 100" in result.output
    original = load_file(hf / "model.safetensors")
    back = load_file(tmp_path / "back" / "model.safetensors")
    assert set(back) == set(original)
    for name, array in original.items():
        assert np.array_equal(back[name], array), name


def test_a_cluster_output_verifies_whole_and_by_layers(llm):
    hf, _ckpt, out = llm
    for mode in ("whole", "layers"):
        report = ms_port.verify(hf, out, ms_model="mindformers:llama", mode=mode)
        assert report.verdict == "PASS", (mode, report.message)
    older = ms_port.verify(hf, out, ms_model="mindformers:llama", step="90")
    assert older.verdict == "FAIL"  # the older save holds other (negated) weights


# -- checkpoint 2.0 (MindFormers' iteration_* folders) ----------------------------------


@pytest.fixture(scope="module")
def ckpt2(tmp_path_factory) -> Path:
    """Saves made by MindFormers' own save code (tests/ckpt2_maker.py: 4 simulated ranks
    on a 2 × 2 grid, remove_redundancy off and on, and one device), iterations 3 and 5."""
    pytest.importorskip("mindformers")
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("ckpt2")
    maker = Path(__file__).with_name("ckpt2_maker.py")
    for iteration in ("3", "5"):
        done = subprocess.run([sys.executable, str(maker), str(out / iteration), "--iteration",
                               iteration], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
    for kind in ("plain", "dedup", "single"):  # iteration 3 beside 5, as keep_max_num keeps
        shutil.copytree(out / "3" / kind / "iteration_00000003",
                        out / "5" / kind / "iteration_00000003")
    return out


def _reference(root: Path) -> dict[str, np.ndarray]:
    dtypes = json.loads((root / "reference" / "dtypes.json").read_text())
    return {name: np.load(root / "reference" / f"{name}.npy").astype(
        ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype) for name, dtype in dtypes.items()}


@pytest.mark.parametrize("kind", ["plain", "dedup", "single"])
def test_checkpoint_2_reads_back_whole(ckpt2, kind):
    want = _reference(ckpt2 / "5")
    source = read_source(ckpt2 / "5" / kind)
    got = {i.name: i.load() for i in [*source, *source.training_state]}
    for name, array in want.items():
        assert got[name].dtype == array.dtype and np.array_equal(got[name], array), name
    assert {i.name for i in source} == {n for n in want if not n.startswith(("adam_", "global"))}
    assert source.cluster.save == "iteration 5"  # the tracker's, beside iteration 3
    assert read_source(ckpt2 / "5" / kind, step="3").cluster.save == "iteration 3"


def test_checkpoint_2_from_the_iteration_folder_and_its_refusals(ckpt2, tmp_path):
    folder = ckpt2 / "5" / "plain" / "iteration_00000005"
    assert read_source(folder).cluster.save == "iteration 5"
    for step in ("4", "²", "٣", "9" * 5000, "3.0"):  # none a traceback, none taken for 3
        with pytest.raises(SourceError, match="names no iteration; found iteration 5, "
                                              "iteration 3"):
            read_source(ckpt2 / "5" / "plain", step=step)
    broken = tmp_path / "iteration_00000005"
    shutil.copytree(folder, broken)
    (broken / "model-0000003-0000004.safetensors").unlink()
    with pytest.raises(SourceError, match=r"held by model-0000003-0000004\.safetensors \(rank 3\), "
                                          r"which is missing"):
        read_source(broken)
    shutil.copy(folder / "model-0000003-0000004.safetensors", broken)
    meta = json.loads((broken / "metadata.json").read_text())
    key = next(iter(meta["storage_data"]))
    meta["storage_data"][key][0]["file_name"] = "../model-0000000-0000004.safetensors"
    (broken / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(SourceError, match="not a file name in the folder"):
        read_source(broken)
    meta = json.loads((folder / "metadata.json").read_text())
    meta["state_dict_metadata"]["net.w_row"]["axis_fragmentations"] = [4, 2]
    (broken / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(SourceError, match=r"piece 1 of 'net\.w_row' \(\[4, 2\] pieces\) is held "
                                          "by no file|holds it as"):
        read_source(broken)


# -- the other way: per-rank slices for a strategy ---------------------------------------


def test_convert_writes_each_rank_its_slices_as_mindspore_reads_them(llm, tmp_path):
    import mindspore as ms

    hf, ckpt, out = llm
    ranks = tmp_path / "ranks"
    result = CliRunner().invoke(main, [
        "convert", str(hf), "--ms-model", "mindformers:llama", "--strategy",
        str(out / "strategy"), "-o", str(ranks)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "4 rank files, ckpt, with the strategy" in result.output
    assert sorted(p.name for p in ranks.iterdir()) == [*(f"rank_{i}" for i in range(4)),
                                                       "strategy"]
    whole = read_source(ckpt, strip_prefixes=False)
    # MindSpore's own merge of the rank files (transform_checkpoints, .ckpt output)
    ms.transform_checkpoints(str(ranks), str(tmp_path / "merged"), "m", str(
        ranks / "strategy" / "ckpt_strategy_rank_0.ckpt"), None)
    merged = read_source(next((tmp_path / "merged" / "rank_0").glob("*.ckpt")),
                         strip_prefixes=False)
    back = read_source(ranks)
    assert set(merged.tensors) == set(whole.tensors) == set(back.tensors)
    for info in whole:
        assert np.array_equal(merged[info.name].load(), info.load()), info.name
        assert np.array_equal(back[info.name].load(), info.load()), info.name
    # each rank holds exactly its slices: a column-parallel q is a quarter of the rows
    q = "model.layers.0.attention.wq.weight"
    rank1 = read_source(next((ranks / "rank_1").glob("*.ckpt")), strip_prefixes=False)
    assert rank1[q].shape == (whole[q].shape[0] // 4, whole[q].shape[1])
    again = CliRunner().invoke(main, [
        "convert", str(hf), "--ms-model", "mindformers:llama", "--strategy",
        str(out / "strategy"), "-o", str(ranks)])
    assert again.exit_code == 2 and "pass --force" in again.output


def test_a_strategy_that_cannot_cut_the_network_is_refused_before_writing(llm, tmp_path):
    from mindspore.train import node_strategy_pb2

    hf, _ckpt, _out = llm
    sm = node_strategy_pb2.ParallelStrategyMap(current_stage=0)
    lay = sm.parallel_layout_item.add(
        param_name="model.layers.0.attention.wq.weight").parallel_layouts
    lay.dev_matrix.add().dim.extend([3])  # 64 rows do not split in 3
    lay.tensor_map.add().dim.extend([0, -1])
    lay.param_split_shape.add()
    lay.field, lay.opt_weight_shard_size, lay.opt_weight_shard_step = 0, 0, 0
    (tmp_path / "s.ckpt").write_bytes(sm.SerializeToString())
    result = CliRunner().invoke(main, [
        "convert", str(hf), "--ms-model", "mindformers:llama", "--strategy",
        str(tmp_path / "s.ckpt"), "-o", str(tmp_path / "ranks")])
    assert result.exit_code == 2, result.output
    assert "the strategy does not fit this network" in result.output
    assert "cannot cut it" in result.output and not (tmp_path / "ranks").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["s.ckpt"]  # no half-written folder


def test_the_way_back_imports_neither_mindspore_nor_torch(llm, tmp_path):
    """Reading a training output and exporting it to a Hugging Face directory (a computed
    family) needs no framework: a process that does it has imported neither."""
    import subprocess
    import sys

    hf, _ckpt, out = llm
    code = ("import sys, ms_port; r = ms_port.export(sys.argv[1], ms_model='mindformers:llama',"
            " config=sys.argv[2], output=sys.argv[3]); assert r.ok, r.message; "
            "print(sorted(m for m in ('mindspore', 'torch', 'transformers') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code, str(out), str(hf / "config.json"),
                           str(tmp_path / "back")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


# -- what an attack on the readers found (each was a traceback, wrong data or a blow-up) ---


def test_several_ranks_without_a_strategy_are_refused_not_read_as_replicas(output, tmp_path):
    out = _copy(output, tmp_path)
    shutil.rmtree(out / "strategy")  # rank 0's slice would have been taken for the whole
    with pytest.raises(SourceError, match="4 ranks and no strategy") as refused:
        read_source(out)
    # the way on for data parallelism only: one rank's file, named, and readable
    rank0 = refused.value.message.rsplit("read one rank's file: ", 1)[1]
    assert "rank_0" in rank0 and read_source(rank0).tensors


def test_two_folders_of_one_rank_are_refused(output, tmp_path):
    out = _copy(output, tmp_path)
    shutil.copytree(out / "checkpoint" / "rank_1", out / "checkpoint" / "rank_01")
    with pytest.raises(SourceError, match="rank_01/ and rank_1/ are both rank 1"):
        read_source(out)


@pytest.mark.parametrize(("layout", "message"), [
    ({"dev_matrix": [2, 2], "tensor_map": [0, -1], "param_split_shape": [3, 5],
      "opt_weight_shard_size": 2, "opt_weight_shard_step": 1},
     "uneven rows \\(param_split_shape\\) with an optimizer shard"),
])
def test_uneven_rows_with_an_optimizer_shard_are_refused(tmp_path, layout, message):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"parallel_layout_item": {"w": {"field": 0, **layout}}}))
    with pytest.raises(SourceError, match=message):
        read_strategy([path])


def test_devices_over_all_stages_are_bounded(tmp_path):
    items = {f"{s}-p{s}": {"dev_matrix": [65536], "tensor_map": [-1], "field": 0,
                           "opt_weight_shard_size": 0, "opt_weight_shard_step": 0}
             for s in range(4)}
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"parallel_layout_item": items}))
    with pytest.raises(SourceError, match="262,144 devices over all stages"):
        read_strategy([path])


def test_odd_step_values_are_one_line(output):
    for step in ("²", "9" * 5000, "1_x"):
        with pytest.raises(SourceError, match="names no save"):
            read_source(output, step=step)


def test_checkpoint_2_hostile_metadata_is_one_line(ckpt2, tmp_path):
    folder = ckpt2 / "5" / "plain" / "iteration_00000005"
    broken = tmp_path / "iteration_00000005"
    shutil.copytree(folder, broken)
    meta = json.loads((folder / "metadata.json").read_text())
    keys = [k for k in meta["storage_data"] if k.startswith("('net.w_row'")]
    for key in keys:  # every piece pointed at one file: one piece would repeat
        meta["storage_data"][key] = meta["storage_data"][keys[0]]
    (broken / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(SourceError, match=r"is named for pieces 0 and 1 of 'net\.w_row'"):
        read_source(broken)
    (broken / "metadata.json").write_text("[]")
    with pytest.raises(SourceError, match="no state_dict_metadata"):
        read_source(broken)
    (broken / "metadata.json").unlink()
    (broken / "metadata.json").mkdir()
    with pytest.raises(SourceError, match="is not a file"):
        read_source(broken)
    shutil.rmtree(broken / "metadata.json")
    meta = json.loads((folder / "metadata.json").read_text())
    del meta["state_dict_metadata"]["net.bias"]
    (broken / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(SourceError, match=r"hold 'net\.bias', which metadata\.json does "
                                          r"not describe"):  # a weight: never left out
        read_source(broken)
    from ms_port.read.distributed import is_training_state

    meta = json.loads((folder / "metadata.json").read_text())
    state = next(n for n in meta["state_dict_metadata"] if is_training_state(n))
    del meta["state_dict_metadata"][state]
    (broken / "metadata.json").write_text(json.dumps(meta))
    read = read_source(broken)  # training state: left out, with a note naming it
    assert any("training-state name(s)" in n and state in n for n in read.cluster.notes)
    assert state not in {i.name for i in read.training_state}


def test_more_rank_files_than_the_process_may_open_is_one_line(llm, tmp_path, monkeypatch):
    """convert --strategy holds every rank's file open: past the hard limit on open files
    it says so before writing (the writer itself was not attacked by the review)."""
    import resource

    hf, _ckpt, out = llm
    monkeypatch.setattr(resource, "getrlimit", lambda _kind: (8, 16))
    report = CliRunner().invoke(main, ["convert", str(hf), "--ms-model", "mindformers:llama",
                                       "--strategy", str(out / "strategy"), "-o",
                                       str(tmp_path / "ranks")])
    assert report.exit_code == 2, report.output
    assert "needs 68 open files; this process may hold 16" in report.output
    assert not (tmp_path / "ranks").exists()


def test_only_ascii_digits_number_a_rank(output, tmp_path):
    """rank_١ (an Arabic-Indic one) is no rank folder: Python's \\d would have read it as
    rank 1 beside the real one."""
    out = _copy(output, tmp_path)
    shutil.copytree(out / "checkpoint" / "rank_1", out / "checkpoint" / "rank_\u0661")
    assert read_source(out).cluster.ranks_read == 4


def test_a_strategy_that_is_no_file_or_holds_none_is_one_line(output, tmp_path):
    """--strategy is read the same by the reader and by convert --strategy: something that
    is neither a file nor a folder (a FIFO), or a folder with no strategy file, is refused
    naming it, before anything is read or written."""
    import os

    fifo, empty = tmp_path / "fifo", tmp_path / "empty"
    os.mkfifo(fifo)
    empty.mkdir()
    for given, message in ((fifo, "no such file or folder"), (empty, "no strategy file")):
        with pytest.raises(SourceError, match=message):
            read_source(output, strategy=given)
        with pytest.raises(MsPortError, match=message):
            ms_port.convert(output, arch="resnet18", strategy=given, output=tmp_path / "o")
        assert not (tmp_path / "o").exists()
