"""verify block by block (``--mode layers``): the same verdicts as the whole networks, one
block per side in memory, chosen automatically when the whole networks would not fit.

Every verdict is tested where it must say no: wrong layouts and a wrong layer deep in the
network FAIL naming the layer and the tensor, on the same inputs that PASS the right
conversion. Skipped where transformers / mindformers (the test extra) are absent.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")

import ms_port  # noqa: E402
from ms_port.check.blocks import WHOLE_SHARE, choose_mode  # noqa: E402
from ms_port.errors import ParityError  # noqa: E402
from ms_port.testing import rewrite_checkpoint, tiny_hf_lm  # noqa: E402

pytestmark = pytest.mark.skipif(importlib.util.find_spec("mindformers") is None,
                                reason="mindformers not installed (test extra)")
GIB = 2**30


def test_auto_goes_by_layers_only_when_the_whole_networks_would_not_fit():
    fits = int(WHOLE_SHARE * 10 * GIB / 16) - 1  # parameters whose networks take < 60 %
    mode, why = choose_mode("auto", fits, None, available=10 * GIB)
    assert mode == "whole" and "fit" in why
    mode, why = choose_mode("auto", 7_240_000_000, None, available=22 * GIB)
    assert mode == "layers" and "107.9 GiB" in why and "22.0 GiB available" in why
    # a run that cannot go by layers runs whole whatever the size, and says why
    mode, why = choose_mode("auto", 7_240_000_000, "no blocks", available=22 * GIB)
    assert mode == "whole" and "no blocks" in why
    assert choose_mode("whole", 7_240_000_000, None, available=GIB)[0] == "whole"
    with pytest.raises(ParityError, match="cannot run here: no blocks"):
        choose_mode("layers", 10, "no blocks")
    with pytest.raises(ParityError, match="unknown mode"):
        choose_mode("blocks", 10, None)


_FREED = """
import sys
from dataclasses import replace
import numpy as np
from ms_port.check.blocks import unmap_large_arrays
def rss():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmRSS:"))
if sys.argv[1] == "unmap":
    assert unmap_large_arrays()
warm = np.ones((8 << 20) // 8)  # one 8 MiB mapped block, freed: glibc's threshold rises
del warm
arrays = [np.ones((8 << 20) // 8) for _ in range(64)]
keep = arrays[-1]  # the heap's top stays in use: nothing below it is trimmed on free
before = rss()
del arrays
print((before - rss()) >> 20)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc and /proc: Linux")
@pytest.mark.parametrize("how, freed", [("unmap", True), ("as-is", False)])
def test_a_blocks_freed_arrays_go_back_to_the_system(how, freed):
    """verify by layers frees each block's arrays before the next: with glibc's moving
    threshold, 8 MiB arrays (a per-expert tensor's size) come from its heap after one
    is freed, and 504 MiB of them stay resident once freed; unmapped, they go back."""
    run = subprocess.run([sys.executable, "-c", _FREED, how], capture_output=True,
                         text=True, check=True)
    released = int(run.stdout.split()[-1])
    assert (released > 400) is freed, released


_POOL = """
import gc, sys
import numpy as np
import mindspore as ms
from mindspore import ops
from ms_port.check.devices import release_ms_pool
def rss():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) >> 10 for line in f if line.startswith("VmRSS:"))
w = ms.Parameter(ms.Tensor(np.ones((8192, 16384), np.float32)))  # 512 MiB, run once
y = ops.matmul(ms.Tensor(np.ones((4, 8192), np.float32)), w)
del w, y
gc.collect()
before = rss()
if sys.argv[1] == "release":
    assert release_ms_pool()
print(before - rss())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc: Linux")
@pytest.mark.parametrize("how, freed", [("release", True), ("as-is", False)])
def test_mindspores_pool_gives_a_blocks_memory_back(how, freed):
    """A block's MindSpore tensors, freed, stay in MindSpore's memory pool (512 MiB here)
    until the pool is emptied, as verify by layers does after each block."""
    run = subprocess.run([sys.executable, "-c", _POOL, how], capture_output=True,
                         text=True, check=True)
    released = int(run.stdout.split()[-1])
    assert (released > 400) is freed, released


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("blocks")
    cache = {}

    def get(kind, tied, dtype, qkv):
        key = (kind, tied, dtype, qkv)
        if key not in cache:
            src = tiny_hf_lm(kind, root / f"{kind}-{tied}-{dtype}", tied=tied, dtype=dtype,
                             layers=3)
            out = root / f"{kind}-{tied}-{dtype}-{qkv}.ckpt"
            ms_port.convert(src, ms_model="mindformers:llama", ms_options={"qkv_concat": qkv},
                            output=out)
            cache[key] = src, out
        return cache[key]

    return get


VARIANTS = [("llama", False, "float32", False), ("qwen2", True, "bfloat16", True),
            ("mistral", False, "bfloat16", True)]


@pytest.mark.parametrize("kind,tied,dtype,qkv", VARIANTS)
def test_layers_pass_where_the_whole_networks_pass(made, kind, tied, dtype, qkv):
    src, out = made(kind, tied, dtype, qkv)
    args = dict(ms_model="mindformers:llama", ms_options={"qkv_concat": qkv})
    whole = ms_port.verify(src, out, mode="whole", **args)
    layers = ms_port.verify(src, out, mode="layers", **args)
    assert whole.verdict == layers.verdict == "PASS", layers.message
    assert layers.mode == "layers" and whole.mode == "whole"
    # the same function computed: the logits agree as closely either way
    assert layers.error < 3 * whole.error + 1e-7
    assert layers.tensors.counts["identical"] == whole.tensors.counts["identical"]
    fed = [c for c in layers.layers if c.paired_by == "fed"]
    assert [c.torch for c in fed] == ["model.layers.0", "model.layers.1", "model.layers.2",
                                      "head"]
    assert {"read", "build", "torch", "mindspore", "total"} <= set(layers.timings)


def test_a_block_that_cannot_fit_is_inconclusive_not_killed(made, monkeypatch):
    """Before a block is read, its PyTorch step's memory (its tensors in float64, plus a
    margin) is set against what is available: a block that cannot fit gives the tensors'
    proof and INCONCLUSIVE, naming the block and the sizes, not an OOM kill."""
    from ms_port.check import blocks

    src, out = made(*VARIANTS[0])
    args = dict(ms_model="mindformers:llama", ms_options={"qkv_concat": False}, mode="layers")
    # enough for the embedding (a lookup: float32 only), short for a decoder layer
    monkeypatch.setattr(blocks, "available_memory", lambda: blocks.BLOCK_MARGIN + 40_000)
    short = ms_port.verify(src, out, **args)
    assert short.verdict == "INCONCLUSIVE" and short.mode == "tensors", short.reasons
    assert "block model.layers.0 needs ~1.0 GiB" in short.reasons[0]
    assert "--no-noise-floor" in short.reasons[0]
    assert short.tensors.counts["identical"] == len(short.tensors.deltas)
    # a wrong tensor still FAILs where no forward can run
    bad = rewrite_checkpoint(out, out.with_name("bad-fit.ckpt"),
                             _swap(1, "attention.wk.weight", "attention.wv.weight"))
    assert ms_port.verify(src, bad, **args).verdict == "FAIL"
    monkeypatch.setattr(blocks, "available_memory", lambda: 64 << 30)
    assert ms_port.verify(src, out, **args).verdict == "PASS"


_NETWORKS_FREED = """
import gc, sys, weakref
import ms_port
from ms_port.archs.llama import blocks as llama_blocks
built = []
original = llama_blocks.LlamaBlocks.ms_network
def ms_network(self, piece, tensors):
    net = original(self, piece, tensors)
    built.append(weakref.ref(net))
    return net
llama_blocks.LlamaBlocks.ms_network = ms_network
report = ms_port.verify(sys.argv[1], sys.argv[2], ms_model="mindformers:llama", mode="layers")
gc.collect()
print(report.verdict, len(built), sum(ref() is not None for ref in built))
"""


def test_no_mindspore_network_outlives_its_block(made, tmp_path):
    """In a fresh process, where verify imports MindFormers first: every block's network
    is freed. MindFormers' first import kept the frames importing it alive, and with them
    the first block's network, for the rest of the process."""
    import os

    src, out = made(*VARIANTS[0])
    run = subprocess.run([sys.executable, "-c", _NETWORKS_FREED, str(src), str(out)],
                         capture_output=True, text=True, timeout=600,
                         env={**os.environ, "LOCAL_DEFAULT_PATH": str(tmp_path)})
    assert run.returncode == 0, run.stderr[-2000:]
    verdict, built, alive = run.stdout.split()[-3:]
    assert (verdict, built, alive) == ("PASS", "5", "0")


def _swap(layer, a, b):
    def edit(tensors):
        x, y = f"model.layers.{layer}.{a}", f"model.layers.{layer}.{b}"
        tensors[x], tensors[y] = tensors[y], tensors[x]
        return tensors
    return edit


def _swap_gate_up(layer):
    def edit(tensors):
        name = f"model.layers.{layer}.feed_forward.w_gate_hidden.weight"
        w = tensors[name]
        tensors[name] = w.reshape(-1, 2, w.shape[1])[:, ::-1].reshape(w.shape).copy()
        return tensors
    return edit


WRONG = {  # case: (variant, edit, the tensor it must name, the layer)
    "kv-swapped-deep": (VARIANTS[0], _swap(2, "attention.wk.weight", "attention.wv.weight"),
                        "model.layers.2.attention.wk.weight", "model.layers.2."),
    "gate-up-swapped": (VARIANTS[1], _swap_gate_up(1),
                        "model.layers.1.feed_forward.w_gate_hidden.weight", "model.layers.1."),
    "norms-swapped": (VARIANTS[2], _swap(1, "attention_norm.weight", "ffn_norm.weight"),
                      "model.layers.1.attention_norm.weight", "model.layers.1."),
}


@pytest.mark.parametrize("case", list(WRONG))
def test_a_wrong_layer_fails_by_layers_naming_it(made, tmp_path, case):
    (kind, tied, dtype, qkv), edit, tensor, layer = WRONG[case]
    src, out = made(kind, tied, dtype, qkv)
    wrong = rewrite_checkpoint(out, tmp_path / "wrong.ckpt", edit)
    report = ms_port.verify(src, wrong, ms_model="mindformers:llama",
                            ms_options={"qkv_concat": qkv}, mode="layers")
    assert report.verdict == "FAIL"
    assert tensor in {d.target for d in report.tensors.deltas if d.status == "differs"}
    assert report.first_divergence.ms_name.startswith(layer), report.first_divergence
    # the block fed PyTorch's own input fails too: the layer is wrong in itself
    fed = next(c for c in report.layers if c.paired_by == "fed"
               and c.torch == layer.rstrip("."))
    assert fed.status == "fail"
    # and every block before it passes
    assert all(c.status != "fail" for c in report.layers
               if c.paired_by == "fed" and c.index < fed.index)


def test_every_token_id_and_a_long_input_by_layers(made, tmp_path):
    src, out = made("qwen2", True, "bfloat16", True)
    ids = np.arange(128, dtype=np.int64)
    np.save(tmp_path / "ids.npy", np.concatenate([ids, ids[::-1], ids])[None])  # 384 tokens
    args = dict(ms_model="mindformers:llama", ms_options={"qkv_concat": True},
                inputs=tmp_path / "ids.npy", mode="layers")
    assert ms_port.verify(src, out, **args).verdict == "PASS"
    wrong = rewrite_checkpoint(out, tmp_path / "w.ckpt", _swap_gate_up(2))
    assert ms_port.verify(src, wrong, **args).verdict == "FAIL"


def test_each_mindspore_network_hands_its_weights_back(made, monkeypatch):
    """Every block's MindSpore network, done with, holds one-element placeholders: its
    weights' memory goes back before the next block reads its own (MindSpore kept a
    deleted PyNative network's parameters' data: 1.5 GiB through each 70B-wide block).
    The verdict is the one the kept weights gave."""
    from ms_port.archs.llama.blocks import LlamaBlocks

    src, out = made("llama", False, "float32", False)
    built, build_ms = [], LlamaBlocks.ms_network

    def ms_network(self, piece, tensors):
        net = build_ms(self, piece, tensors)
        built.append((piece.name, net, {p.name: tuple(p.shape) for p in net.get_parameters()}))
        return net

    monkeypatch.setattr(LlamaBlocks, "ms_network", ms_network)
    assert ms_port.verify(src, out, ms_model="mindformers:llama",
                          mode="layers").verdict == "PASS"
    assert [name for name, _, _ in built] == [
        "embedding", "model.layers.0", "model.layers.1", "model.layers.2", "head"]
    for name, net, shapes in built:
        assert any(len(s) and max(s) > 1 for s in shapes.values()), name  # real weights
        for param in net.get_parameters():
            assert tuple(param.shape) == (1,) * len(shapes[param.name]), (name, param.name)


def test_one_block_per_side_is_ever_loaded(made, monkeypatch):
    """Each PyTorch network built holds real tensors of one block only (the rest stays on
    the meta device), and each MindSpore network is given one block's tensors."""
    from ms_port.archs.llama.blocks import LlamaBlocks

    src, out = made("llama", False, "float32", False)
    seen = []
    build_torch, build_ms = LlamaBlocks.torch_network, LlamaBlocks.ms_network

    def torch_network(self, piece, tensors):
        model = build_torch(self, piece, tensors)
        real = {n for n, p in model.named_parameters() if p.device.type != "meta"}
        # one dtype; none at all for a layer's float64 pass, which reads each module's
        # weights as it runs (check/lazy.py)
        assert len({p.dtype for n, p in model.named_parameters() if n in real}) == bool(real)
        seen.append(("torch", piece.name, real))
        return model

    def ms_network(self, piece, tensors):
        seen.append(("ms", piece.name, set(tensors)))
        return build_ms(self, piece, tensors)

    monkeypatch.setattr(LlamaBlocks, "torch_network", torch_network)
    monkeypatch.setattr(LlamaBlocks, "ms_network", ms_network)
    assert ms_port.verify(src, out, ms_model="mindformers:llama",
                          mode="layers").verdict == "PASS"
    # PyTorch builds each block twice, one after the other: float32, then float64 (noise);
    # the embedding once (a lookup rounds nothing: its float64 output is its float32 one)
    assert [name for side, name, _ in seen if side == "torch"] == ["embedding", *(
        name for name in ("model.layers.0", "model.layers.1", "model.layers.2", "head")
        for _ in range(2))]
    torch_layers = [bool(real) for side, name, real in seen
                    if side == "torch" and name.startswith("model.layers.")]
    assert torch_layers == [True, False] * 3  # float32 loaded; float64 module by module
    for side, name, real in seen:
        if name.startswith("model.layers."):  # every layer runs as layer 0
            assert all(n.startswith("model.layers.0.") for n in real), (side, real)
            assert real or side == "torch"
        elif name == "embedding":
            assert real == {"model.embed_tokens.weight"} or real == {
                "model.tok_embeddings.embedding_weight"}
        else:
            assert not any(".layers." in n for n in real)


def test_cli_says_which_mode_ran_and_why(made, monkeypatch):
    from click.testing import CliRunner

    from ms_port.check import blocks
    from ms_port.cli import main

    src, out = made("llama", False, "float32", False)
    monkeypatch.setattr(blocks, "WHOLE_SHARE", 1e-9)  # the whole networks never fit
    run = CliRunner().invoke(main, ["verify", str(src), str(out), "--ms-model",
                                    "mindformers:llama", "--json"])
    data = json.loads(run.output)
    assert run.exit_code == 0 and data["mode"] == "layers"
    assert "GiB available" in data["mode_reason"]
    text = CliRunner().invoke(main, ["verify", str(src), str(out), "--ms-model",
                                     "mindformers:llama", "--mode", "whole"],
                              env={"COLUMNS": "200"})
    assert text.exit_code == 0 and "mode: whole networks: asked for (--mode whole)" in text.output
    refused = CliRunner().invoke(main, ["verify", str(src), str(out), "--ms-model",
                                        "mindformers:llama", "--mode", "layers", "--dtype",
                                        "float64"])
    assert refused.exit_code == 2
    assert "--dtype float64: the blocks run in float32" in refused.output
    assert len(refused.output.strip().splitlines()) == 2  # one line and the --debug hint


def test_each_mindspore_network_is_built_once_and_reloaded(made, monkeypatch):
    """MindFormers' network is built once per span of the vocabulary, and each block's
    tensors set into it (building took most of a block's MindSpore time): a wrong layer
    still FAILs there, the blocks after it still PASS on their own input."""
    from ms_port.check import blocks
    from ms_port.read import targets

    src, out = made("llama", False, "float32", False)
    builds, without = [], targets.without_weights

    def counted(build):
        builds.append(build)
        return without(build)

    monkeypatch.setattr(targets, "without_weights", counted)
    set_into = _record_set(monkeypatch)
    args = dict(ms_model="mindformers:llama", mode="layers")
    assert ms_port.verify(src, out, **args).verdict == "PASS"
    assert len(builds) == 1  # the embedding, three layers and the head: one network
    # no parameter of it is left to hold another block's weights: the blocks set them all
    assert [set(own) - names for own, names in set_into.values()] == [set()]
    builds.clear()
    monkeypatch.setattr(blocks, "SPAN_NUMEL", 40 * 64)  # spans of 40 rows, and a shorter last
    spanned = ms_port.verify(src, out, **args)
    assert spanned.verdict == "PASS"
    vocab = json.loads((src / "config.json").read_text())["vocab_size"]
    assert len(builds) == 1 + (vocab % 40 != 0) + 1, vocab  # span sizes, and the layers'
    wrong = rewrite_checkpoint(out, out.with_name("built-once-wrong.ckpt"),
                               _swap(1, "attention.wk.weight", "attention.wv.weight"))
    bad = ms_port.verify(src, wrong, **args)
    assert bad.verdict == "FAIL"
    fed = {c.torch: c.status for c in bad.layers if c.paired_by == "fed"}
    assert fed["model.layers.1"] == "fail" and fed["model.layers.2"] == "ok", fed


def _record_set(monkeypatch):
    """{id: (a network's parameters, the names the blocks set into them)}, as
    ``BuiltOnce`` sets them."""
    from ms_port.archs.llama import blocks as llama_blocks

    found, original = {}, llama_blocks.set_parameters

    def recorded(own, tensors, shapes=None):
        found.setdefault(id(own), (own, set()))[1].update(tensors)
        return original(own, tensors, shapes)

    monkeypatch.setattr(llama_blocks, "set_parameters", recorded)
    return found


def test_weights_are_shared_with_mindspore_not_copied():
    """A block's float32 arrays become MindSpore's parameters without a copy (a copy was
    most of a 7B layer's build); an array MindSpore may not share is copied, same values."""
    ms = pytest.importorskip("mindspore")
    from ms_port.archs.llama.blocks import set_parameters
    from ms_port.errors import TargetError

    params = {n: ms.Parameter(ms.Tensor(np.zeros((3, 4), np.float32)), name=n)
              for n in ("a", "b", "c")}
    values = np.arange(12, dtype=np.float32).reshape(3, 4)
    own, frozen = values.copy(), values + 100
    frozen.flags.writeable = False
    set_parameters(params, {"a": own, "b": frozen, "c": values.astype(np.float64)})
    own[0, 0] = 42.0
    assert params["a"].asnumpy()[0, 0] == 42.0  # shared
    del own  # MindSpore keeps the array alive
    gc.collect()
    scratch = [np.full((3, 4), -1.0, np.float32) for _ in range(64)]
    assert params["a"].asnumpy().ravel().tolist() == [42.0, *range(1, 12)], len(scratch)
    assert np.array_equal(params["b"].asnumpy(), frozen)
    # another dtype is cast into the parameter's
    assert params["c"].dtype == ms.float32 and np.array_equal(params["c"].asnumpy(), values)
    with pytest.raises(TargetError, match="does not fit"):
        set_parameters(params, {"a": np.zeros((4, 3), np.float32)})


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_tensor_check_a_block_at_a_time_is_the_whole_one(made, tmp_path, seed):
    """Verify by layers compares each block's tensors through the plan as the block
    starts: whatever the order and grouping, the result is the one-pass comparison's, a
    swapped pair still identified by what each holds, an extra entry still named."""
    from ms_port.check.tensors import PlanCheck, compare_through_plan
    from ms_port.read.sources import read_source

    src, out = made("llama", False, "float32", False)
    plan = ms_port.plan(src, ms_model="mindformers:llama")

    def edit(tensors):
        tensors = _swap(1, "attention.wk.weight", "attention.wv.weight")(tensors)
        tensors["stray.weight"] = np.ones((2, 2), np.float32)
        del tensors["model.layers.2.attention_norm.weight"]
        return tensors

    wrong = read_source(rewrite_checkpoint(out, tmp_path / "w.ckpt", edit),
                        strip_prefixes=False)
    values = {i.name: i.load for i in wrong}
    whole = compare_through_plan(plan, values, a="hf", b="ms", infos=wrong.tensors)
    names = [*wrong.tensors, "not.a.tensor"]
    rng = np.random.default_rng(seed)
    rng.shuffle(names)
    check = PlanCheck(plan, values, a="hf", b="ms", infos=wrong.tensors)
    for group in np.array_split(np.array(names, dtype=object), 5)[:4]:  # one left to result()
        check.check(list(group) * 2)  # a name twice: compared once
    found = check.result()
    assert found.to_dict() == whole.to_dict()
    assert {d.target: d.holds for d in found.problems} == {
        "model.layers.1.attention.wk.weight": "model.layers.1.self_attn.v_proj.weight",
        "model.layers.1.attention.wv.weight": "model.layers.1.self_attn.k_proj.weight",
        "model.layers.2.attention_norm.weight": None, "stray.weight": None}
    assert {d.target: d.status for d in found.problems}["model.layers.2.attention_norm.weight"] \
        == "missing"


def test_each_blocks_tensors_are_checked_before_it_runs(made, monkeypatch):
    """The tensor check reads a block's tensors before the block does (so the block reads
    them from the page cache: each file is read from the disk once): one check per block,
    of that block's MindSpore tensors, on a thread, done before the block's PyTorch network
    is built; the next block's asked for before this one runs."""
    import threading
    from pathlib import Path

    from ms_port.archs.llama.blocks import LlamaBlocks
    from ms_port.check.tensors import PlanCheck
    from ms_port.read.ahead import ReadAhead

    src, out = made("llama", False, "float32", False)
    seen, check, build, lock = [], PlanCheck.check, LlamaBlocks.torch_network, threading.Lock()

    def checked(self, names):
        names = frozenset(names)
        with lock:
            seen.append(("asked", names, threading.current_thread().name))
        check(self, names)
        with lock:
            seen.append(("checked", names))

    def torch_network(self, piece, tensors):
        with lock:
            seen.append(("torch", piece.name, frozenset(piece.ms.values())))
        return build(self, piece, tensors)

    wanted, want = [], ReadAhead.want

    def asked(self, extents):
        extents = list(extents)
        wanted.append({(Path(f).name, n) for f, _, n in extents})
        return want(self, extents)

    monkeypatch.setattr(PlanCheck, "check", checked)
    monkeypatch.setattr(LlamaBlocks, "torch_network", torch_network)
    monkeypatch.setattr(ReadAhead, "want", asked)
    report = ms_port.verify(src, out, ms_model="mindformers:llama", mode="layers")
    assert report.verdict == "PASS" and "tensors" in report.timings
    firsts = {}
    for k, event in enumerate(seen):
        if event[0] == "torch":
            firsts.setdefault(event[1], (k, event[2]))
    assert list(firsts) == ["embedding", "model.layers.0", "model.layers.1",
                            "model.layers.2", "head"]
    asks = [e for e in seen if e[0] == "asked"]
    for name, (k, names) in firsts.items():
        # its own check, once, on the checking thread, finished before it is built
        assert [e for e in asks if e[1] == names] == [("asked", names, "ms-port-tensors_0")]
        assert ("checked", names) in seen[:k], name
    # the blocks' checks in their order, then every name for the result (each compared
    # already, passed over)
    assert [e[1] for e in asks[:5]] == [names for _, names in firsts.values()]
    assert len(asks) == 6 and asks[-1][2] == "MainThread"
    assert asks[-1][1] == frozenset().union(*(names for _, names in firsts.values()))
    # read ahead: the first two blocks as the run starts, then each block the next one,
    # its stretches in both files (the source's shard, the checkpoint)
    assert len(wanted) == 5 and wanted[-1] == set(), wanted
    files = {name for stretch in wanted[:-1] for name, _ in stretch}
    assert files == {"model.safetensors", out.name}, files
    assert all(wanted[:-1]), wanted


def test_weights_cast_into_reused_memory_keep_every_verdict(made, tmp_path, monkeypatch):
    """Each block's float32 weights and each module's float64 ones are cast into memory
    the ones before them used (check/reuse.py; here every array, however small): the right
    conversion still PASSes with the same logits error, a wrong layer still FAILs there."""
    from ms_port.check import reuse

    src, out = made(*VARIANTS[1])  # Qwen2: a bias beside each of q, k and v's weights
    args = dict(ms_model="mindformers:llama", ms_options={"qkv_concat": True}, mode="layers")
    fresh = ms_port.verify(src, out, **args)
    made_buffers, init = [], reuse.Arena.__init__

    def recorded(self):
        init(self)
        made_buffers.append(self)

    monkeypatch.setattr(reuse, "SMALLEST", 0)
    monkeypatch.setattr(reuse.Arena, "__init__", recorded)
    again = ms_port.verify(src, out, **args)
    assert again.verdict == fresh.verdict == "PASS"
    assert again.error == fresh.error  # the same bytes computed
    # and the same float64 noise: each layer's bound is the one fresh arrays gave
    assert [(c.ms, c.noise, c.bound) for c in again.layers] == [
        (c.ms, c.noise, c.bound) for c in fresh.layers]
    assert sum(b.reused for b in made_buffers) > 0
    wrong = rewrite_checkpoint(out, tmp_path / "w.ckpt", _swap_gate_up(2))
    bad = ms_port.verify(src, wrong, **args)
    assert bad.verdict == "FAIL" and "model.layers.2" in bad.message


def test_a_renamed_vocabulary_is_checked_a_span_of_rows_at_a_time(made, tmp_path,
                                                                 monkeypatch):
    """A tensor that is its source's bytes under another name (an embedding, a head) is
    compared a span of rows at a time on both sides, never loaded whole where it holds
    what it should (at 70B widths 2 GiB a side, beside both frameworks); a corrupted row
    still makes it differ, measured whole, and the verdict FAIL."""
    from ms_port.check import tensors
    from ms_port.read.sources import read_source

    src, out = made("llama", False, "float32", False)
    monkeypatch.setattr(tensors, "ROWS_BYTES", 4096)  # 16 rows of 64 float32
    plan = ms_port.plan(src, ms_model="mindformers:llama")
    name = "model.tok_embeddings.embedding_weight"

    def check(path):
        ckpt = read_source(path, strip_prefixes=False)
        whole = ckpt.tensors[name]
        loads = []
        ckpt.tensors[name] = replace(whole, loader=lambda: loads.append(1) or whole.load())
        found = tensors.compare_through_plan(plan, {i.name: i.load for i in ckpt.tensors.values()},
                                             a="hf", b="ms", infos=ckpt.tensors)
        return found, loads

    found, loads = check(out)
    assert found.ok and loads == []

    def corrupt(t):
        t[name] = t[name].copy()
        t[name][77] += 1.0
        return t

    bad, loads = check(rewrite_checkpoint(out, tmp_path / "row.ckpt", corrupt))
    delta = next(d for d in bad.deltas if d.target == name)
    assert delta.status == "differs" and delta.max_abs == pytest.approx(1.0, rel=1e-5)
    assert loads  # measured whole
    assert [d.target for d in bad.problems] == [name]
    report = ms_port.verify(src, tmp_path / "row.ckpt", ms_model="mindformers:llama",
                            mode="layers")
    assert report.verdict == "FAIL" and name in report.message


def test_mindspore_computes_on_pytorchs_arrays_where_its_bytes_are_the_sources(
        made, tmp_path, monkeypatch):
    """A MindSpore tensor the tensor check found to be its source's bytes under another
    name is given PyTorch's float32 array of it, not cast again from the checkpoint: every
    figure of the report is the one the checkpoint's own arrays give, a joined tensor
    (q/k/v, gate/up) is read from the checkpoint, and a tensor that differs (two norms
    swapped) is read from the checkpoint and FAILs."""
    from ms_port.check import blocks

    src, out = made(*VARIANTS[2])  # bfloat16, q/k/v and gate/up joined
    args = dict(ms_model="mindformers:llama", ms_options={"qkv_concat": True}, mode="layers")
    shared, shareable = [], blocks._shareable

    def recorded(state, piece, arrays):
        found = shareable(state, piece, arrays)
        shared.append({piece.ms[k] for k in found})
        return found

    monkeypatch.setattr(blocks, "_shareable", recorded)
    fast = ms_port.verify(src, out, **args)
    names = set().union(*shared)
    assert "model.layers.1.attention.wo.weight" in names
    assert "model.layers.1.ffn_norm.weight" in names
    assert not any("w_qkv" in n or "w_gate_hidden" in n for n in names), names
    monkeypatch.setattr(blocks, "_shareable", lambda state, piece, arrays: {})
    read = ms_port.verify(src, out, **args)
    assert fast.verdict == read.verdict == "PASS"
    assert fast.error == read.error  # the same arrays computed, to the bit
    assert [(c.ms, c.error, c.noise, c.bound, c.status) for c in fast.layers] == [
        (c.ms, c.error, c.noise, c.bound, c.status) for c in read.layers]
    assert fast.nonfinite_weights == read.nonfinite_weights

    monkeypatch.setattr(blocks, "_shareable", recorded)
    shared.clear()
    wrong = rewrite_checkpoint(out, tmp_path / "w.ckpt",
                               _swap(1, "attention_norm.weight", "ffn_norm.weight"))
    bad = ms_port.verify(src, wrong, **args)
    assert bad.verdict == "FAIL" and bad.first_divergence.ms_name.startswith("model.layers.1.")
    names = set().union(*shared)
    assert "model.layers.1.ffn_norm.weight" not in names
    assert "model.layers.2.ffn_norm.weight" in names


def test_a_shared_tensors_nan_and_inf_are_counted_on_both_sides():
    from ms_port.check.blocks import _Found

    found = _Found()
    found.add("PyTorch", "w", np.array([np.nan, np.inf, 1.0, np.nan], np.float32))
    found.same("MindSpore", "m.w", "PyTorch", "w")
    found.same("MindSpore", "m.w", "PyTorch", "w")  # counted once
    assert found.lines() == ["PyTorch w: 2 NaN, 1 Inf", "MindSpore m.w: 2 NaN, 1 Inf"]


def _noise_rows(report):
    return [(c.ms, c.torch, c.call, c.status, c.shape, c.noise is None,
             c.sensitivity is None) for c in report.layers]


def assert_same_noise(stacked, apart):
    """Two reports measured the same: every layer's status and shape, its float32 noise
    and sensitivity to float64's rounding, its error to float32's (a batch of two may
    sum its rows in another order)."""
    assert stacked.verdict == apart.verdict
    assert stacked.error == pytest.approx(apart.error, rel=0.5)
    assert _noise_rows(stacked) == _noise_rows(apart)
    for a, b in zip(stacked.layers, apart.layers):
        # float32 rounding moves an error at the rounding's size by tens of percent
        assert a.error == pytest.approx(b.error, rel=0.5, abs=(b.bound or 0) / 2), a.ms
        if b.noise is not None:
            assert a.noise == pytest.approx(b.noise, rel=1e-6, abs=1e-300), a.ms
            assert a.bound == pytest.approx(b.bound, rel=1e-6), a.ms
        if b.sensitivity is not None:
            assert a.sensitivity == pytest.approx(b.sensitivity, rel=1e-6), a.ms


@pytest.mark.parametrize("variant", [VARIANTS[1], VARIANTS[2]])
def test_both_inputs_stacked_in_one_pass_measure_what_two_passes_do(
        made, monkeypatch, variant):
    """Each side's two inputs run stacked on the batch axis in one pass over the weights
    (LLaMA's blocks say they may): PyTorch's float32 main and second input, its float64
    own and fed input (each module's float64 weights cast once), MindSpore's own and fed
    input. Every layer's error, noise, sensitivity and bound are the two passes' (to
    rounding), none lost."""
    import torch

    from ms_port.archs.llama.blocks import LlamaBlocks

    kind, tied, dtype, qkv = variant
    src, out = made(kind, tied, dtype, qkv)
    args = dict(ms_model="mindformers:llama", ms_options={"qkv_concat": qkv}, mode="layers")
    passes, step, ms_step = [], LlamaBlocks.torch_step, LlamaBlocks.ms_step

    def counted(self, model, piece, state, ids):
        passes.append(("torch", piece.name, state is not None and state.dtype == torch.float64,
                       ids.shape[0]))
        return step(self, model, piece, state, ids)

    def ms_counted(self, net, piece, state, ids):
        passes.append(("ms", piece.name, False, ids.shape[0]))
        return ms_step(self, net, piece, state, ids)

    monkeypatch.setattr(LlamaBlocks, "torch_step", counted)
    monkeypatch.setattr(LlamaBlocks, "ms_step", ms_counted)
    stacked = ms_port.verify(src, out, **args)
    # one pass a block per side and precision, each of both inputs; but MindSpore's
    # embedding (no input before it to feed)
    assert len(passes) == len(set(passes)), passes
    assert [p for p in passes if p[3] != 2] == [("ms", "embedding", False, 1)], passes
    passes.clear()
    monkeypatch.setattr(LlamaBlocks, "stacks", False)
    apart = ms_port.verify(src, out, **args)
    assert all(rows == 1 for *_, rows in passes) and len(passes) == 2 * len(set(passes)) - 1
    assert stacked.verdict == "PASS"
    assert_same_noise(stacked, apart)


def record_checks(monkeypatch):
    """Events of a verify by layers, in order: ("check", heavy, thread) as a block's tensor
    check starts; ("start" | "end", block) around each block's run."""
    import threading

    from ms_port.check import blocks
    from ms_port.check.tensors import PlanCheck

    seen, lock, check, run_piece = [], threading.Lock(), PlanCheck.check, blocks._run_piece

    def checked(self, names):
        names = list(names)
        with lock:
            seen.append(("check", self.heavy(names), threading.current_thread().name))
        return check(self, names)

    def ran(state, piece, groups=None):
        with lock:
            seen.append(("start", piece.name))
        try:
            return run_piece(state, piece, groups)
        finally:
            with lock:
                seen.append(("end", piece.name))

    monkeypatch.setattr(PlanCheck, "check", checked)
    monkeypatch.setattr(blocks, "_run_piece", ran)
    return seen


def assert_heavy_checks_alone(seen, blocks):
    """Each of ``blocks`` heavy checks (then the result's) ran with no block running."""
    heavy = [k for k, e in enumerate(seen) if e[:2] == ("check", True)]
    assert len(heavy) >= blocks + 1, seen
    for k in heavy[:-1]:
        before = [e for e in seen[:k] if e[0] in ("start", "end")]
        assert not before or before[-1][0] == "end", seen


def test_a_block_whose_check_holds_much_is_checked_as_it_starts(made, monkeypatch):
    """A joined tensor (q/k/v, gate/up) is compared whole: where it is larger than a span
    of rows (here: any), its block's check waits until the block before it is done, not
    beside it; the blocks of renamed tensors only are still checked on the thread."""
    from ms_port.check import tensors

    src, out = made(*VARIANTS[2])  # q/k/v and gate/up joined
    monkeypatch.setattr(tensors, "ROWS_BYTES", 4096)
    seen = record_checks(monkeypatch)
    report = ms_port.verify(src, out, ms_model="mindformers:llama",
                            ms_options={"qkv_concat": True}, mode="layers")
    assert report.verdict == "PASS"
    assert_heavy_checks_alone(seen, blocks=3)
    assert ("check", False, "ms-port-tensors_0") in seen  # the embedding and the head
