"""CPU stand-ins for the kernels MindFormers' parallel_core networks call and MindSpore 2.10
has no CPU implementation of (applied by :mod:`ms_port.archs.parallel_core.cpu`).

MindSpore compiles a GRAPH-mode network from its Python source, so each stand-in is plain
source in a file: a ``construct`` put in a MindFormers class's place, a Cell put where
MindFormers builds a primitive, or a function put where it calls one. Each computes what
the kernel it replaces computes, in float32 where the caller asked for float32.
"""

from __future__ import annotations

import mindspore.common.dtype as mstype
import numpy as np
from mindspore import nn, ops


def rms_norm_construct(self, x):
    """``FusedRMSNorm.construct`` without ``P.RmsNorm``: x·rsqrt(mean(x², -1) + ε)·w in the
    layer's compute dtype (what MindFormers' own unfused ``RMSNorm`` computes)."""
    original_type = x.dtype
    x = ops.cast(x, self.compute_type)
    norm = ops.rsqrt(ops.mean(ops.square(x), -1, True) + self.eps)
    return ops.cast(x * norm * self.weight, original_type)


def attention_construct(self, query, key, value, attention_mask, attn_mask_type=None,
                        attention_bias=None, packed_seq_params=None, alibi_mask=None,
                        prefix=None, padding_mask=None, actual_seq_qlen=None,
                        actual_seq_kvlen=None):
    """``FlashAttention.construct`` without ``FlashAttentionScore``: softmax attention in
    float32 over MindFormers' ``[S, B, N, D]`` query and key and ``[S, B, N_kv, D_v]``
    value (multi-latent attention's value heads are narrower than its query/key heads).

    Query heads share their key/value head in consecutive groups (head h reads KV head
    h // (N / N_kv), as Hugging Face's ``repeat_kv``). The scale is the kernel's own
    ``scale_value`` (:func:`attention_init` keeps it): 1/sqrt(head_dim), or the
    ``softmax_scale`` multi-latent attention gives. ``attention_mask`` is the kernel's: 1
    hides a key from a query (MindFormers' causal mask, which also hides its pad id).
    Returns ``[S, B, N*D_v]``, as the kernel's BNSD path does.
    """
    seq, batch, heads, dim = query.shape
    kv_seq, kv_heads, v_dim = key.shape[0], key.shape[2], value.shape[3]
    group = heads // kv_heads
    q = ops.transpose(ops.cast(query, mstype.float32), (1, 2, 0, 3))
    q = q.reshape((batch, kv_heads, group, seq, dim))
    k = ops.transpose(ops.cast(key, mstype.float32), (1, 2, 0, 3))
    k = k.reshape((batch, kv_heads, 1, kv_seq, dim))
    v = ops.transpose(ops.cast(value, mstype.float32), (1, 2, 0, 3))
    v = v.reshape((batch, kv_heads, 1, kv_seq, v_dim))
    scores = ops.matmul(q, ops.swapaxes(k, -1, -2)) * self.standin_scale
    if attention_mask is not None:
        hidden = ops.cast(attention_mask, mstype.bool_).reshape((-1, 1, 1, seq, kv_seq))
        scores = ops.masked_fill(scores, hidden, -1e30)  # exp underflows to exactly 0
    probs = ops.softmax(scores, -1)
    out = ops.matmul(probs, v).reshape((batch, heads, seq, v_dim))
    return self._merge_heads(ops.cast(out, query.dtype))


def attention_init(original):
    """``FlashAttention.__init__``, then the scale it gave its kernel kept as a float
    (``standin_scale``) for :func:`attention_construct`."""

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.standin_scale = float(self.flash_attention.scale_value)

    __init__.__wrapped__ = original
    return __init__


#: ``mstype`` as ``attention.py`` reads it, with ``float16`` meaning float32: its ``if
#: query.dtype not in (mstype.float16, mstype.bfloat16): cast to float16`` (the flash
#: kernel's input dtype) then leaves float32 queries, keys and values as they are. A class,
#: not a module: MindSpore's graph parser re-imports a module by its name.
DtypesWithoutFloat16 = type(
    "DtypesWithoutFloat16", (),
    {**{k: v for k, v in vars(mstype).items() if not k.startswith("_")},
     "float16": mstype.float32})


class PrimitiveStandIn(nn.Cell):
    """A Cell where MindFormers builds a primitive. It configures primitives as it builds
    them (``shard``, ``add_prim_attr``, ``recompute``, chained); on one device those
    settings mean nothing, so they are accepted and ignored."""

    def shard(self, *args, **kwargs):
        return self

    def add_prim_attr(self, *args, **kwargs):
        return self

    def recompute(self, *args, **kwargs):
        return self


class Outer(PrimitiveStandIn):
    """``ops.auto_generate.Outer``: ``a[:, None] * b``."""

    def construct(self, a, b):
        return ops.expand_dims(a, -1) * b


class TopkExt(PrimitiveStandIn):
    """``ops.auto_generate.TopkExt``: the ``k`` largest along ``dim``, values and int64
    indices, by ``ops.topk``."""

    def construct(self, input, k, dim=-1, largest=True, sorted=True):
        values, indices = ops.topk(input, k, dim, largest, sorted)
        return values, ops.cast(indices, mstype.int64)


class CumsumExt(PrimitiveStandIn):
    """``ops.auto_generate.CumsumExt``: the running sum along ``dim``, by ``ops.cumsum``."""

    def construct(self, input, dim, dtype=None):
        out = ops.cumsum(input, dim)
        if dtype is not None:
            out = ops.cast(out, dtype)
        return out


class Swiglu(PrimitiveStandIn):
    """``ops.auto_generate.Swiglu``: the input's two halves along ``dim``, a and b, give
    silu(a)·b (MindSpore's definition: the first half is the gate)."""

    def construct(self, input, dim=-1):
        a, b = ops.chunk(input, 2, dim)
        return ops.silu(a) * b


def grouped_matmul_host(x, weight, group_list):
    """Rows ``group_list[e-1] <= r < group_list[e]`` of ``x [T, K]`` times ``weight[e]``
    (``weight [E, K, M]``, ``group_list`` the cumulative row counts), on numpy arrays; rows
    past the last group give zeros. Each expert multiplies its own rows only, as the kernel
    does: the output is the only array made, ``[T, M]``."""
    rows = x.shape[0]
    out = np.zeros((rows, weight.shape[2]), dtype=x.dtype)
    start = 0
    for expert, end in enumerate(np.asarray(group_list).reshape(-1)[:weight.shape[0]]):
        end = min(max(int(end), start), rows)  # cumulative: never before the last end
        if end > start:
            np.matmul(x[start:end], weight[expert], out=out[start:end])
        start = end
    return out


def _grouped_shape(x, weight, group_list):
    return [x[0], weight[2]]


def _grouped_dtype(x, weight, group_list):
    return x


#: :func:`grouped_matmul_host` as a graph op: MindSpore's ``pyfunc`` Custom op runs a
#: Python function on the host's arrays inside a compiled graph, so the rows of each
#: expert, a data-dependent shape, are never a shape in the graph. Computing every expert
#: on every row instead (the graph-only way) took E times the work and, at Qwen3-30B-A3B's
#: widths, more than 16 GiB for one layer.
_GROUPED_MATMUL = ops.Custom(grouped_matmul_host, out_shape=_grouped_shape,
                             out_dtype=_grouped_dtype, func_type="pyfunc")


def GroupedMatmul(split_item=3, group_type=0, transpose_a=False, transpose_b=False):
    """``ops.auto_generate.GroupedMatmul`` as ``FFNGroupedGEMM`` calls it (one x, one
    weight per call, grouped along x's rows, ``group_list`` cumulative): a function
    returning the call, so that MindFormers' ``GroupedMatmul(...)(...)`` inside its graph
    compiles."""

    def call(x, weight, bias=None, scale=None, offset=None, antiquant_scale=None,
             antiquant_offset=None, group_list=None):
        return [_GROUPED_MATMUL(x[0], weight[0], group_list)]

    return call


def sort_ext(input, dim=-1, descending=False, stable=False):
    """``SortExt``'s call: values and int64 indices along ``dim``, by ``ops.sort``."""
    values, indices = ops.sort(input, dim, descending)
    return values, ops.cast(indices, mstype.int64)


def SortExt():
    """``ops.auto_generate.SortExt``: built in ``__init__`` and inside graph functions
    alike (``SortExt()(x, dim=1)``), hence a function returning :func:`sort_ext`."""
    return sort_ext


def fmod_scalar(input, other):
    """``FmodScalar``'s call: the remainder of truncated division, in the input's dtype
    (``ops.fmod`` of integers returns floats: exact below 2**24, as token indices are)."""
    return ops.cast(ops.fmod(input, other), input.dtype)


def FmodScalar():
    """``ops.auto_generate.FmodScalar``, built inside graph functions: :func:`fmod_scalar`."""
    return fmod_scalar


def index_select(input, dim, index):
    """``IndexSelect``'s call: the slices ``index`` of ``input`` along ``dim`` (``ops.gather``)."""
    return ops.gather(input, index, dim)


def IndexSelect():
    """``ops.auto_generate.IndexSelect``, built inside graph functions: :func:`index_select`."""
    return index_select


class MoveTo(PrimitiveStandIn):
    """``ops.MoveTo`` (a copy to the host): on a CPU the tensor is there already."""

    def construct(self, x, to="CPU", blocking=True):
        return x


def token_dispatcher_init(original):
    """``MoETokenDispatcher.__init__`` then its ``d2h`` (``ops.MoveTo``, reached through
    ``mindspore.ops`` itself, which is not patched) replaced by :class:`MoveTo`."""

    def __init__(self, config):
        original(self, config)
        self.d2h = MoveTo()

    __init__.__wrapped__ = original
    return __init__


def mtp_block_construct(self, input_ids, position_ids, hidden_states, attention_mask,
                        labels=None, rotary_pos_emb=None, extra_block_kwargs=None,
                        loss_mask=None, word_embeddings_weight=None,
                        position_embeddings_weight=None, tokentype_embeddings_weight=None,
                        output_weight=None, extra_loss=None, attention_loss=None):
    """``MultiTokenPredictionBlock.construct`` not run: it gives only the MTP loss (and the
    auxiliary losses it adds to), which an eval forward does not return, and raises with
    no labels. Returns a zero MTP loss and the losses as given; the logits, which it never
    touches, are the main model's."""
    if extra_loss is None:
        extra_loss = self.init_extra_loss
    if attention_loss is None:
        attention_loss = self.init_attention_loss
    if self.calculate_per_token_loss:
        return 0, 0, extra_loss, attention_loss
    return 0, extra_loss, attention_loss


# ---- DeepSeek-V3.2's sparse attention (DSA) ------------------------------------------

class BatchMatMul(PrimitiveStandIn):
    """``ops.auto_generate.BatchMatMul`` where its operands broadcast (MLA's absorption of
    ``linear_kvb`` into the query and the output ``[S, B, N, 1, D] @ [N, D, L]``; the
    indexer's ``[B, S, H, D] @ [B, 1, D, T]`` and its Hadamard rotation ``[S, B, H, D] @
    [D, D]``): ``ops.matmul``, which broadcasts the leading axes as the kernel does."""

    def __init__(self, transpose_a=False, transpose_b=False):
        super().__init__()
        self.transpose_a = transpose_a
        self.transpose_b = transpose_b

    def construct(self, x, y):
        if self.transpose_a:
            x = ops.swapaxes(x, -1, -2)
        if self.transpose_b:
            y = ops.swapaxes(y, -1, -2)
        return ops.matmul(x, y)


class SliceExt(PrimitiveStandIn):
    """``ops.auto_generate.SliceExt``: elements ``start, start + step, ... < end`` along
    ``dim`` (``ops.narrow`` where the step is 1, as the indexer's is)."""

    def construct(self, input, dim, start, end, step=1):
        out = ops.narrow(input, dim, start, end - start)
        if step != 1:
            idx = ops.arange(0, end - start, step)
            out = ops.gather(out, idx, dim)
        return out


#: ``mindspore.ops.auto_generate`` as ``dsa_indexer.py`` reads it (``aclnn_ops``), with the
#: primitives it builds that a CPU lacks replaced. A class, not a module: MindSpore's
#: graph parser re-imports a module by its name.
def _aclnn_ops_for_indexer():
    from mindspore.ops import auto_generate

    names = {k: v for k, v in vars(auto_generate).items() if not k.startswith("_")}
    return type("IndexerOps", (), {**names, "BatchMatMul": BatchMatMul,
                                   "TopkExt": TopkExt, "SliceExt": SliceExt})


IndexerOps = _aclnn_ops_for_indexer()


def dsa_attention_construct(self, query, key, value, topk_indices, actual_seq_qlen=None,
                            actual_seq_kvlen=None):
    """``DSAttention.construct`` without ``sparse_flash_attention`` (an Ascend kernel):
    softmax attention in float32 over MindFormers' ``[S, B, N, kv_lora + rope]`` query,
    ``[S, B, 1, kv_lora + rope]`` key and ``[S, B, 1, kv_lora]`` value (the one latent
    head MLA's absorbed form shares), each query attending only to the tokens its row of
    ``topk_indices`` ``[B, S, 1, K]`` names (-1: none), scaled by the layer's
    ``softmax_scale``. Returns ``[S, B, N, kv_lora]``, as the kernel's BSND path does."""
    kv_seq = key.shape[0]
    q = ops.transpose(ops.cast(query, mstype.float32), (1, 2, 0, 3))   # [B, N, S, D]
    k = ops.transpose(ops.cast(key, mstype.float32), (1, 2, 0, 3))     # [B, 1, T, D]
    v = ops.transpose(ops.cast(value, mstype.float32), (1, 2, 0, 3))   # [B, 1, T, Dv]
    scores = ops.matmul(q, ops.swapaxes(k, -1, -2)) * self.softmax_scale
    chosen = ops.one_hot(ops.cast(topk_indices, mstype.int32), kv_seq,
                         ops.ones((), mstype.float32), ops.zeros((), mstype.float32))
    chosen = ops.reduce_sum(chosen, 3)                                 # [B, S, 1, T]
    hidden = ops.transpose(chosen, (0, 2, 1, 3)) < 0.5                 # [B, 1, S, T]
    scores = ops.masked_fill(scores, hidden, -1e30)  # exp underflows to exactly 0
    out = ops.matmul(ops.softmax(scores, -1), v)                       # [B, N, S, Dv]
    return ops.cast(ops.transpose(out, (2, 0, 1, 3)), query.dtype)


def dsa_indexer_loss_construct(self, index_scores, topk_indices, query, key, mask,
                               actual_seq_len=None):
    """``DSAIndexerLoss.construct`` not run: the indexer's training loss, which an eval
    forward does not return and which never touches the logits. Returns 0."""
    return ops.zeros((), mstype.float32)
