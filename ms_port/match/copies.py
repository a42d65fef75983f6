"""One tensor saved under several names: a module a network reaches by two paths.

PyTorch's ``state_dict`` lists a parameter once per path that reaches its module: timm's
CoaT passes one convolutional position encoding (``crpe1``) to every block of a stage,
and the checkpoint holds ``crpe1.conv_list.0.weight`` and, the same tensor again,
``serial_blocks1.0.factoratt_crpe.crpe.conv_list.0.weight``, ``….1.…``. MindSpore holds a
shared parameter once. Left as they are, the copies are source tensors nothing uses (a
refusal), and they confuse alignment with layers that are not there.

Among the tensors nothing took, a copy is found by what it holds: the same dtype, shape
and bytes as a tensor that was taken, whose name ends the same way (a module's own names
do not change with the path that reaches it: ``conv_list.0.weight``). It is dropped as
``tied`` to that one, and the report says so.
Two tensors that merely hold equal values (a constant one, all zeros) are never taken
for copies: a shared module's tensors are its trained ones.
"""

from __future__ import annotations

import hashlib

import numpy as np

from ..read.tensors import TensorInfo

#: the trailing name segments two copies must share (a module's own names: at least
#: ``conv_list.0.weight`` or ``proj.weight``)
SAME_TAIL = 2
#: bytes read from each end of a tensor for the first comparison
PROBE = 4096


def _tail(name: str) -> str:
    return ".".join(name.split(".")[-SAME_TAIL:])


def _bytes(info: TensorInfo) -> np.ndarray:
    return np.ascontiguousarray(info.load()).reshape(-1).view(np.uint8)


def _probe(info: TensorInfo) -> bytes | None:
    """A digest of a tensor's first and last bytes; ``None`` for a constant tensor, whose
    equal to another proves nothing about identity."""
    values = np.asarray(info.load()).reshape(-1)
    if values.size == 0 or bool(np.all(values == values[0])):
        return None
    flat = _bytes(info)
    return hashlib.blake2b(bytes(flat[:PROBE]) + bytes(flat[-PROBE:])).digest()


def shared_copies(pending: list[TensorInfo], others: list[TensorInfo]
                  ) -> list[tuple[TensorInfo, TensorInfo]]:
    """``(copy, original)`` for each tensor of ``pending`` that holds exactly what a
    tensor of ``others`` holds, with the same name tail.

    Args:
        pending: the source tensors nothing took.
        others: the source tensors taken (the originals a copy repeats).
    """
    pending = [i for i in pending if i.loader is not None]  # a template's: names only
    tails = {_tail(i.name) for i in pending}
    pool = [i for i in others if _tail(i.name) in tails] + list(pending)
    groups: dict[tuple[str, tuple[int, ...], str], list[TensorInfo]] = {}
    for info in pool:
        groups.setdefault((_tail(info.name), info.shape, info.dtype), []).append(info)
    pending_names = {i.name for i in pending}
    found = []
    for members in groups.values():
        if len(members) < 2 or all(m.name in pending_names for m in members):
            continue  # no tensor taken to be a copy of
        firsts: dict[bytes, list[TensorInfo]] = {}
        for info in members:
            digest = _probe(info)
            if digest is None:
                continue
            originals = firsts.setdefault(digest, [])
            same = next((o for o in originals if np.array_equal(_bytes(o), _bytes(info))),
                        None)
            if same is None:
                if info.name not in pending_names:
                    originals.append(info)
            elif info.name in pending_names:
                found.append((info, same))
    return found
