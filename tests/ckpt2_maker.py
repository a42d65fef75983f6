# ruff: noqa: E501  (a fixture maker whose comments cite MindFormers lines at length)
"""Write tiny MindFormers "checkpoint 2.0" directories with MindFormers' OWN save code
(a test fixture maker for tests/test_cluster.py, run in its own process).

Usage:
    python tests/ckpt2_maker.py OUT_DIR [--iteration N] [--prefix NAME]

Produces
    OUT_DIR/plain/   4 simulated ranks, save_checkpoint(..., remove_redundancy=False)
                     (every rank writes all its local slices; replicas are stored once per rank)
    OUT_DIR/dedup/   4 simulated ranks, save_checkpoint(..., remove_redundancy=True)
                     (each distinct shard written once, by a load-balanced choice of rank)
    OUT_DIR/single/  world size 1 (no metadata.json at all; whole tensors)
    OUT_DIR/reference/<param name>.npy   full (unsliced) arrays; bfloat16 arrays are stored as
                     float32 .npy (values are exactly representable) plus a `dtypes.json` index.

A 4-rank Graph-mode semi-auto-parallel job is *simulated* in ONE process, rank 0 first, by calling
`mindformers.checkpoint.checkpoint.save_checkpoint` once per rank.  Nothing in MindFormers'
writing logic is replaced; only the communication / environment queries are faked (see PATCHES
below):

  * RANK_ID / RANK_SIZE env vars  -> `mindformers.tools.utils.get_real_rank/get_real_group_size`
    fall back to them because `mindspore.communication.get_rank()` raises RuntimeError without
    `init()` (tools/utils.py:424-453).  Every checkpoint module imports those two functions.
  * metadata.get_group_size           -> lambda: WORLD   (metadata.py:24,375 calls MindSpore's directly)
  * checkpoint.barrier_world          -> no-op           (checkpoint.py:38,363,386,518,551)
  * mindformers context mode set to GRAPH_MODE (its default is PyNative, which needs hyper_parallel).
  * LayoutAdapter._get_layout_from_graph -> returns the simulated compiler strategy metadata
    {rank: {name: [ms.Layout, dtype, global_shape]}} (layout_adapter.py:404-422 normally calls
    mindspore.parallel.strategy.get_strategy_metadata on a compiled network).
  * fully_parallel.scatter_object_list / all_gather_object / synchronize (dedup variant only):
    rank 0's scatter payloads are recorded and replayed to ranks 1..3; the all_gather of
    "what each file holds" returns what is on disk so far (None for ranks not yet written, which
    makes save_balanced_metadata record the shard distribution as-is, fully_parallel.py:408-416).
"""
import argparse
import json
import os
import sys
import tempfile

import numpy as np

WORLD = 4
os.environ.setdefault("RANK_SIZE", str(WORLD))
os.environ.setdefault("RANK_ID", "0")
os.environ.setdefault("GLOG_v", "3")
# MindFormers' logger writes under $LOCAL_DEFAULT_PATH/log (default ./output/log): keep the
# working folder clean, beside the output or in a temporary folder (never the repository)
os.environ.setdefault("LOCAL_DEFAULT_PATH", os.path.join(
    os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else tempfile.mkdtemp(), "mf_log"))

import mindformers.checkpoint.checkpoint as mf_ckpt  # noqa: E402
import mindformers.checkpoint.fully_parallel as mf_fp  # noqa: E402
import mindformers.checkpoint.metadata as mf_meta  # noqa: E402
import mindspore as ms  # noqa: E402
from mindformers.checkpoint.layout_adapter import LayoutAdapter  # noqa: E402
from mindformers.checkpoint.sharded_tensor import get_all_sharded_tensor_on_rank0  # noqa: E402
from mindformers.core.context.build_context import Context  # noqa: E402
from mindformers.core.optim.adamw import AdamW  # noqa: E402
from mindspore import Parameter, Tensor, nn  # noqa: E402
from mindspore.parallel import Layout  # noqa: E402

# --------------------------------------------------------------------------------------------
# Toy model: device matrix (dp=2, tp=2), ranks 0..3;  rank r -> (dp, tp) = (r // 2, r % 2)
# --------------------------------------------------------------------------------------------
DEV_MATRIX = (2, 2)
ALIAS = ("dp", "tp")
BASE_LAYOUT = Layout(DEV_MATRIX, ALIAS, list(range(WORLD)))

# name: (global_shape, ms dtype, tensor_map for BASE_LAYOUT(*tensor_map))
PARAMS = {
    # axis 0 split 4 ways (dp and tp both on axis 0), no replication
    "net.w_row": ((8, 6), ms.float32, (("dp", "tp"), "None")),
    # axis 1 split 2 ways (tp), replicated over dp, bfloat16
    "net.w_col": ((4, 8), ms.bfloat16, ("None", "tp")),
    # 2x2 grid with a "transposed" mapping: axis0 <- tp, axis1 <- dp
    "net.w_grid": ((4, 6), ms.float32, ("tp", "dp")),
    # axis 0 split 2 ways over dp, replicated over tp, float16
    "net.w_half": ((6, 4), ms.float16, ("dp", "None")),
    # fully replicated (layout with all-None tensor map), bfloat16
    "net.bias": ((6,), ms.bfloat16, ("None",)),
}

NP_OF = {ms.float32: np.float32, ms.float16: np.float16, ms.bfloat16: np.float32}


def _dev_coords(rank):
    """rank -> coordinate per alias (row-major over DEV_MATRIX, last dim fastest)."""
    coords = {}
    rest = rank
    for alias, size in reversed(list(zip(ALIAS, DEV_MATRIX))):
        coords[alias] = rest % size
        rest //= size
    return coords


def local_box(global_shape, tensor_map, rank):
    """Element box of `rank`'s slice -- computed independently of MindFormers, for the reference."""
    coords = _dev_coords(rank)
    sizes = dict(zip(ALIAS, DEV_MATRIX))
    box = []
    for dim, m in zip(global_shape, tensor_map):
        names = () if m == "None" else ((m,) if isinstance(m, str) else tuple(m))
        nfrag, idx = 1, 0
        for name in names:          # first name is the most significant
            idx = idx * sizes[name] + coords[name]
            nfrag *= sizes[name]
        step = dim // nfrag
        box.append((idx * step, (idx + 1) * step))
    return tuple(box)


def make_full_arrays():
    """Deterministic global arrays: value = flat index + per-parameter offset (moments: scaled + offset)."""
    full = {}
    for i, (name, (shape, dtype, _)) in enumerate(PARAMS.items()):
        base = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
        # keep bfloat16 values exactly representable (integers < 256)
        offset = 10 * (i + 1) if dtype == ms.bfloat16 else 100 * (i + 1)
        full[name] = (base + offset).astype(NP_OF[dtype])
        # AdamW moments are float32 with the parameter's shape (core/optim/adamw.py:167-191)
        full["adam_m." + name] = (base * 0.5 + 10000 * (i + 1)).astype(np.float32)
        full["adam_v." + name] = (base * 0.25 + 20000 * (i + 1)).astype(np.float32)
    return full


class ToyNet(nn.Cell):
    """Holds one rank's local slices as Parameters named exactly like the global parameters."""

    def __init__(self, rank, full, whole=False):
        super().__init__()
        self._names = []
        for name, (shape, dtype, tmap) in PARAMS.items():
            sl = (tuple(slice(None) for _ in shape) if whole
                  else tuple(slice(a, b) for a, b in local_box(shape, tmap, rank)))
            arr = np.ascontiguousarray(full[name][sl])
            p = Parameter(Tensor(arr, dtype=dtype), name=name)
            attr = name.replace(".", "_")
            setattr(self, attr, p)
            self._names.append(name)

    def construct(self, x):
        return x


def strategy_metadata():
    """What Graph-mode `get_strategy_metadata(train_network)` returns: {rank: {name: [Layout, dtype, shape]}}.

    Model parameters are reported with their layouts; the optimizer's `global_step` is reported as
    replicated.  AdamW's moments are NOT reported here on purpose: MindFormers' own
    `complete_optimizer_layout_index` (sharded_tensor.py:845-935) adds them from the parameter's
    layout with the state's own dtype (float32), exactly as it does when the compiler omits them.
    """
    per_rank = {}
    for rank in range(WORLD):
        infos = {}
        for name, (shape, dtype, tmap) in PARAMS.items():
            infos[name] = [BASE_LAYOUT(*tmap), dtype, list(shape)]
        infos["global_step"] = [BASE_LAYOUT("None"), ms.int32, [1]]
        per_rank[rank] = infos
    return per_rank


# --------------------------------------------------------------------------------------------
# PATCHES (communication / environment only)
# --------------------------------------------------------------------------------------------

_SCATTER_LOG = []      # payload lists recorded on rank 0, in call order
_SCATTER_CALL = [0]    # per-rank call counter
_CUR_RANK = [0]


def _fake_scatter(recv, payloads, src=0):
    k = _SCATTER_CALL[0]
    _SCATTER_CALL[0] += 1
    if _CUR_RANK[0] == 0:
        _SCATTER_LOG.append(payloads)
    recv[0] = _SCATTER_LOG[k][_CUR_RANK[0]]


def _fake_all_gather(gathered, obj):
    """Fill with what every rank's file of this type holds *so far*; None = not written yet."""
    for r in range(len(gathered)):
        gathered[r] = obj if r == _CUR_RANK[0] else None


def install_patches():
    """All monkeypatches, in one place (called from main(); importing this module patches nothing)."""
    # Graph mode: the MindFormers context defaults to PyNative, whose save path needs hyper_parallel
    # DTensors (not installed). LayoutAdapter.is_pynative_mode() (layout_adapter.py:48-55) reads this.
    Context().ms_ctx_opr.set_context(mode=ms.GRAPH_MODE)
    strategy = strategy_metadata()
    # layout_adapter.py:404-422 -- normally get_strategy_metadata(compiled train network)
    LayoutAdapter._get_layout_from_graph = staticmethod(lambda network: strategy)
    # metadata.py:24,375 -- calls mindspore.communication.management.get_group_size directly
    mf_meta.get_group_size = lambda *a, **k: WORLD
    # checkpoint.py:38 (used at 363,386,518,551) -- would call mint.distributed.barrier
    mf_ckpt.barrier_world = lambda *a, **k: None
    # fully_parallel.py:26-27 (used at 784 and 331-332) -- remove_redundancy=True path only
    mf_fp.scatter_object_list = _fake_scatter
    mf_fp.all_gather_object = _fake_all_gather
    mf_fp.synchronize = lambda: None


def set_rank(rank):
    os.environ["RANK_ID"] = str(rank)
    os.environ["RANK_SIZE"] = str(WORLD)
    _CUR_RANK[0] = rank
    _SCATTER_CALL[0] = 0


# --------------------------------------------------------------------------------------------
def build_rank(rank, full):
    net = ToyNet(rank, full)
    opt = AdamW(net.trainable_params(), learning_rate=1e-3)
    # give the moments deterministic, checkable values (their local slice of the global moment)
    for p in opt.exp_avg + opt.exp_avg_sq:
        base = p.name.split(".", 1)[1]
        shape, _, tmap = PARAMS[base]
        sl = tuple(slice(a, b) for a, b in local_box(shape, tmap, rank))
        p.set_data(Tensor(np.ascontiguousarray(full[p.name][sl]), dtype=ms.float32))
    opt.global_step.set_data(Tensor(np.array([7], np.int32)))
    return net, opt


def save_all_ranks(root, iteration, full, remove_redundancy, user_prefix):
    set_rank(0)
    net0, opt0 = build_rank(0, full)
    # rank 0 builds the global ShardedTensor metadata exactly like the training callback does
    # (core/callback/callback.py:2174-2191)
    metas = get_all_sharded_tensor_on_rank0(network=net0, filter_func=None, optimizer=opt0,
                                            saved_cells=[net0, opt0])
    _SCATTER_LOG.clear()
    for rank in range(WORLD):
        set_rank(rank)
        net, opt = (net0, opt0) if rank == 0 else build_rank(rank, full)
        common = mf_ckpt.CommonInfo(epoch_num=1, step_num=iteration, global_step=iteration,
                                    loss_scale=1.0, global_batch_size=8, consumed_samples=8 * iteration,
                                    ckpt_status=0)
        mf_ckpt.save_checkpoint(
            iteration=iteration, network=net, optimizer=opt, async_save_manager=None,
            common_info=common, keep_max_num=5, user_prefix=user_prefix,
            save_checkpoint_path=root,
            sharded_tensor_metas=metas if rank == 0 else None,
            remove_redundancy=remove_redundancy,
        )
    set_rank(0)


def save_single_card(root, iteration, full, user_prefix):
    """World size 1: the callback passes sharded_tensor_metas=None (core/callback/callback.py:2192),
    so NO metadata.json is written (checkpoint.py:538-540); every tensor is stored whole."""
    os.environ["RANK_ID"] = "0"
    os.environ["RANK_SIZE"] = "1"
    _CUR_RANK[0] = 0
    net = ToyNet(0, full, whole=True)
    opt = AdamW(net.trainable_params(), learning_rate=1e-3)
    for p in opt.exp_avg + opt.exp_avg_sq:
        p.set_data(Tensor(full[p.name], dtype=ms.float32))
    opt.global_step.set_data(Tensor(np.array([7], np.int32)))
    common = mf_ckpt.CommonInfo(epoch_num=1, step_num=iteration, global_step=iteration, loss_scale=1.0,
                                global_batch_size=8, consumed_samples=8 * iteration, ckpt_status=0)
    mf_ckpt.save_checkpoint(iteration=iteration, network=net, optimizer=opt, common_info=common,
                            user_prefix=user_prefix, save_checkpoint_path=root, sharded_tensor_metas=None)
    os.environ["RANK_SIZE"] = str(WORLD)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--iteration", type=int, default=3)
    ap.add_argument("--prefix", default=None, help="user_prefix for file names (default none)")
    args = ap.parse_args()
    out = os.path.abspath(args.out_dir)
    os.makedirs(out, exist_ok=True)
    install_patches()

    full = make_full_arrays()
    ref = os.path.join(out, "reference")
    os.makedirs(ref, exist_ok=True)
    dtypes = {}
    for name, arr in full.items():
        np.save(os.path.join(ref, name + ".npy"), arr)
        base = name.split(".", 1)[1] if name.startswith("adam_") else name
        dtypes[name] = "float32" if name.startswith("adam_") else str(PARAMS[base][1]).lower()
    np.save(os.path.join(ref, "global_step.npy"), np.array([7], np.int32))
    dtypes["global_step"] = "int32"
    with open(os.path.join(ref, "dtypes.json"), "w") as f:
        json.dump(dtypes, f, indent=1)
    boxes = {name: {r: local_box(shape, tmap, r) for r in range(WORLD)}
             for name, (shape, _, tmap) in PARAMS.items()}
    with open(os.path.join(ref, "rank_boxes.json"), "w") as f:
        json.dump(boxes, f, indent=1)

    save_all_ranks(os.path.join(out, "plain"), args.iteration, full, False, args.prefix)
    save_all_ranks(os.path.join(out, "dedup"), args.iteration, full, True, args.prefix)
    save_single_card(os.path.join(out, "single"), args.iteration, full, args.prefix)
    print("written:", out)


if __name__ == "__main__":
    sys.exit(main())
