"""A hand-written MindSpore GPT-2 with separate q/k/v Dense layers (Hugging Face's GPT-2
fuses them into one Conv1D, ``c_attn``, stored in x out): the target of the split test."""

from __future__ import annotations

import numpy as np
from mindspore import Tensor, nn, ops

#: the tiny model's sizes (tests/test_llm.py builds the Hugging Face side with the same)
SIZES = {"vocab": 96, "positions": 32, "hidden": 48, "heads": 4, "layers": 2}


class Attention(nn.Cell):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads, self.dim = heads, hidden // heads
        self.q, self.k, self.v = (nn.Dense(hidden, hidden) for _ in range(3))
        self.proj = nn.Dense(hidden, hidden)

    def construct(self, x):
        b, s, h = x.shape

        def split(t):
            return t.reshape(b, s, self.heads, self.dim).transpose(0, 2, 1, 3)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        scores = ops.matmul(q, k.transpose(0, 1, 3, 2)) / np.sqrt(self.dim)
        causal = Tensor(np.triu(np.full((s, s), -1e9, np.float32), 1))
        weights = ops.softmax(scores + causal, axis=-1)
        out = ops.matmul(weights, v).transpose(0, 2, 1, 3).reshape(b, s, h)
        return self.proj(out)


class MLP(nn.Cell):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.fc, self.proj = nn.Dense(hidden, 4 * hidden), nn.Dense(4 * hidden, hidden)
        self.act = nn.GELU(approximate=True)  # GPT-2's gelu_new

    def construct(self, x):
        return self.proj(self.act(self.fc(x)))


class Block(nn.Cell):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm((hidden,), epsilon=1e-5)
        self.attn = Attention(hidden, heads)
        self.ln_2 = nn.LayerNorm((hidden,), epsilon=1e-5)
        self.mlp = MLP(hidden)

    def construct(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Cell):
    def __init__(self, vocab: int, positions: int, hidden: int, heads: int,
                 layers: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(positions, hidden)
        self.h = nn.CellList([Block(hidden, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm((hidden,), epsilon=1e-5)

    def construct(self, ids):
        positions = ops.arange(ids.shape[1]).reshape(1, -1)
        x = self.wte(ids) + self.wpe(positions)
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)
        return ops.matmul(x, self.wte.embedding_table.T)  # the tied head


def build() -> GPT2:
    return GPT2(**SIZES)


#: Hugging Face GPT-2 -> this network: c_attn split into q/k/v, Conv1D weights transposed
MAPPING = """
version: 1
description: Hugging Face GPT-2 -> tests/gpt2_ms.py (separate q/k/v)
rename:
  regex:
    - {from: 'transformer\\.(.*)\\.attn\\.c_proj\\.(.*)', to: '\\1.attn.proj.\\2'}
    - {from: 'transformer\\.(.*)\\.mlp\\.c_fc\\.(.*)', to: '\\1.mlp.fc.\\2'}
    - {from: 'transformer\\.(.*)\\.mlp\\.c_proj\\.(.*)', to: '\\1.mlp.proj.\\2'}
    - {from: 'transformer\\.(.*)', to: '\\1'}
split:
  - source: 'transformer.h.{i}.attn.c_attn.weight'
    targets: ['h.{i}.attn.q.weight', 'h.{i}.attn.k.weight', 'h.{i}.attn.v.weight']
    layout: {concat: 1}                 # Conv1D is in x out: q, k, v side by side
    transforms: [{transpose: [1, 0]}]   # each part becomes a Dense weight, out x in
  - source: 'transformer.h.{i}.attn.c_attn.bias'
    targets: ['h.{i}.attn.q.bias', 'h.{i}.attn.k.bias', 'h.{i}.attn.v.bias']
    layout: concat
transforms:
  - {match: 'h\\.[0-9]+\\.(attn\\.proj|mlp\\.fc|mlp\\.proj)\\.weight', ops: [{transpose: [1, 0]}]}
tied:
  - {source: lm_head.weight, same_as: transformer.wte.weight, when: tie_word_embeddings}
"""
