"""MindSpore's parallel strategy files: how each parameter is laid out across devices.

Training on N devices writes, besides each rank's checkpoint, a strategy file
(``strategy_ckpt_save_file``; MindFormers: ``output/strategy/ckpt_strategy_rank_{i}.ckpt``),
a protobuf ``ParallelStrategyMap`` (MindSpore's ``node_strategy.proto``) or its JSON form.
Per parameter it holds a :class:`ParamLayout`:

- ``dev_matrix``: the devices of one pipeline stage as a grid, outermost axis first; a
  rank's coordinate is its index in that grid, row-major;
- ``tensor_map``: per tensor dimension, the grid axes it is split over, each numbered from
  the right (axis 0 is the last entry of ``dev_matrix``); ``-1``: not split. The "layout"
  form lists several axes for one dimension (the first the outermost);
- ``opt_weight_shard_size`` / ``opt_weight_shard_step``: the optimizer-parallel split of
  each model-parallel slice along its first axis, over the grid axes the tensor is not
  split on (innermost first, as MindSpore builds the group); size ``-1``: all of them,
  ``0``: none;
- ``param_split_shape``: uneven first-axis sizes, one per slice;
- pipeline stages: one file per stage (``current_stage``), or a merged file whose names
  are ``"{stage}-{name}"``.

The schema is kept here (:func:`_message_class`), read with the ``protobuf`` library; no
MindSpore import. A strategy is untrusted input: every count and size is bounded before
anything is allocated from it (a grid of 10⁹ devices is a one-line refusal).
"""

from __future__ import annotations

import json
import math
import re
import stat
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..errors import SourceError, shown

#: the largest strategy file read (a 1T-parameter network's is a few MiB)
MAX_STRATEGY_BYTES = 256 << 20
#: the most devices one pipeline stage may have, and the most grid axes
MAX_DEVICES = 1 << 16
MAX_AXES = 16
#: the most pipeline stages
MAX_STAGES = 1024
#: the longest parameter name
MAX_NAME = 4096


@dataclass(frozen=True)
class ParamLayout:
    """One parameter's layout on the devices of its pipeline stage (module docstring)."""

    name: str
    dev_matrix: tuple[int, ...]
    #: per tensor dimension, the grid axes it is split over (numbered from the right)
    tensor_map: tuple[tuple[int, ...], ...]
    opt_size: int = 0
    opt_step: int = 0
    split_rows: tuple[int, ...] = ()
    field_size: int = 0
    stage: int = 0

    @property
    def devices(self) -> int:
        return math.prod(self.dev_matrix)

    def grid(self) -> ParamLayout:
        """This layout without its name and stage: what decides the boxes (a cache key)."""
        return ParamLayout("", self.dev_matrix, self.tensor_map, self.opt_size, self.opt_step,
                           self.split_rows, self.field_size)

    def axis_size(self, axis: int) -> int:
        return self.dev_matrix[len(self.dev_matrix) - 1 - axis]

    @property
    def parts(self) -> tuple[int, ...]:
        """Into how many slices each tensor dimension is split (model parallel)."""
        return tuple(math.prod(self.axis_size(a) for a in axes) for axes in self.tensor_map)

    def coordinate(self, rank: int) -> tuple[int, ...]:
        """A stage-local rank's place in the device grid, outermost axis first."""
        coord = []
        for size in reversed(self.dev_matrix):
            coord.append(rank % size)
            rank //= size
        return tuple(reversed(coord))

    def slice_index(self, rank: int) -> tuple[int, ...]:
        """Which model-parallel slice of each dimension ``rank`` holds."""
        coord = self.coordinate(rank)
        index = []
        for axes in self.tensor_map:
            i = 0
            for a in axes:  # the first listed axis the outermost
                i = i * self.axis_size(a) + coord[len(self.dev_matrix) - 1 - a]
            index.append(i)
        return tuple(index)

    def opt_group(self) -> list[tuple[int, int]]:
        """The optimizer shard's grid dimensions, outermost first, as (dimension, size
        taken): the grid dimensions the tensor is not split on, taken from the innermost
        until the shard size is reached (the last one may be taken in part: its inner
        part), as MindSpore builds the group. ``[]``: no optimizer shard."""
        return list(_opt_group(self.dev_matrix, self.tensor_map, self.opt_size,
                               self.opt_step))

    @property
    def opt_parts(self) -> int:
        return math.prod(size for _, size in self.opt_group())

    def opt_index(self, rank: int) -> int:
        """Which part of its model-parallel slice's first axis ``rank`` holds."""
        coord = self.coordinate(rank)
        i = 0
        for d, size in self.opt_group():
            i = i * size + coord[d] % size
        return i

    def box(self, rank: int, shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
        """The (start, stop) per dimension of the global tensor ``rank`` holds."""
        index, parts = self.slice_index(rank), self.parts
        box = []
        for d, (i, n) in enumerate(zip(index, parts)):
            if d == 0 and self.split_rows:
                start = self._row_start(index)
                box.append((start, start + self.split_rows[self._flat(index)]))
            else:
                box.append((i * shape[d] // n, (i + 1) * shape[d] // n))
        opt = self.opt_parts
        if opt > 1 and box:
            start, stop = box[0]
            rows = (stop - start) // opt
            k = self.opt_index(rank)
            box[0] = (start + k * rows, start + (k + 1) * rows)
        return tuple(box)

    def _flat(self, index: tuple[int, ...]) -> int:
        flat = 0
        for i, n in zip(index, self.parts):
            flat = flat * n + i
        return flat

    def _row_start(self, index: tuple[int, ...]) -> int:
        return sum(self.split_rows[self._flat((i, *index[1:]))] for i in range(index[0]))

    def global_shape(self, slice_shape: tuple[int, ...]) -> tuple[int, ...]:
        """The whole tensor's shape from one (even) slice's."""
        parts = self.parts
        shape = [s * n for s, n in zip(slice_shape, parts)]
        if shape:
            shape[0] = (sum(self.split_rows[self._flat((i, *([0] * (len(parts) - 1))))]
                            for i in range(parts[0])) if self.split_rows
                        else shape[0] * self.opt_parts)
        return tuple(shape)

    def describe(self) -> str:
        maps = ", ".join("(" + ",".join(map(str, a)) + ")" if len(a) > 1
                         else str(a[0]) if a else "-1" for a in self.tensor_map)
        opt = f", optimizer shard {self.opt_parts}" if self.opt_parts > 1 else ""
        return f"grid {list(self.dev_matrix)}, tensor map [{maps}]{opt}"


@lru_cache(maxsize=4096)
def _opt_group(dev_matrix: tuple[int, ...], tensor_map: tuple[tuple[int, ...], ...],
               opt_size: int, opt_step: int) -> tuple[tuple[int, int], ...]:
    if opt_size == 0 or opt_step == 0:
        return ()
    used = {len(dev_matrix) - 1 - a for axes in tensor_map for a in axes}
    free = [d for d, v in enumerate(dev_matrix) if d not in used and v > 1]
    want = opt_size if opt_size > 0 else math.prod(dev_matrix[d] for d in free)
    taken: list[tuple[int, int]] = []
    for d in reversed(free):
        if want == 1:
            break
        size = dev_matrix[d]
        if want < size:
            if size % want:
                raise ValueError(f"optimizer shard size {opt_size} does not divide the "
                                 f"device grid's dimension of {size}")
            size = want
        elif want % size:
            unsplit = [dev_matrix[i] for i in free]
            raise ValueError(f"optimizer shard size {opt_size} is not a product of the "
                             f"unsplit device dimensions {unsplit}")
        taken.insert(0, (d, size))
        want //= size
    if want != 1:
        raise ValueError(f"optimizer shard size {opt_size} is larger than the devices the "
                         "tensor is replicated on")
    return tuple(taken)


@dataclass
class Strategy:
    """Every parameter's layout, over all pipeline stages."""

    layouts: dict[str, ParamLayout]
    #: devices per pipeline stage, per stage
    stage_devices: dict[int, int]
    files: list[str] = field(default_factory=list)

    @property
    def stages(self) -> int:
        return max(self.stage_devices, default=0) + 1

    @property
    def devices(self) -> int:
        return sum(self.stage_devices.values())

    def first_rank(self, stage: int) -> int:
        return sum(self.stage_devices.get(s, 0) for s in range(stage))


def strategy_paths(given: str | Path) -> list[Path]:
    """The strategy's files: the one given, or those in the folder given (``.ckpt``,
    ``.json``, ``.pb``), in rank order (``rank_2`` before ``rank_10``).

    Raises:
        SourceError: neither a file nor a folder, or a folder with no strategy file.
    """
    where = Path(given)
    if not (where.is_file() or where.is_dir()):
        raise SourceError(f"--strategy {where}: no such file or folder", path=where)
    paths = ([where] if where.is_file() else
             sorted((p for p in where.iterdir() if p.is_file()
                     and p.suffix in (".ckpt", ".json", ".pb")),
                    key=lambda p: (len(p.name), p.name)))
    if not paths:
        raise SourceError(f"{where}: no strategy file (.ckpt or .json) in it", path=where)
    return paths


def read_strategy(paths: list[Path]) -> Strategy:
    """The strategy in ``paths`` (per-rank files, per-stage files, or one merged file);
    identical files (every rank of a stage writes the same) are read once.

    Raises:
        SourceError: a file is unreadable, not a strategy, or holds an impossible layout.
    """
    layouts: dict[str, ParamLayout] = {}
    stage_devices: dict[int, int] = {}
    seen: set[bytes] = set()
    for path in paths:
        raw = _read_bounded(path)
        if raw in seen:
            continue
        seen.add(raw)
        for layout in _parse(path, raw):
            devices = layout.devices
            known = stage_devices.setdefault(layout.stage, devices)
            if known != devices:
                raise SourceError(f"{path}: {shown(layout.name)} is laid out on {devices} "
                                  f"devices, other parameters of stage {layout.stage} on "
                                  f"{known}; the strategy contradicts itself", path=path)
            layouts.setdefault(layout.name, layout)  # a name in several stages: shared
    if len(stage_devices) > MAX_STAGES or (stage_devices
                                           and max(stage_devices) >= MAX_STAGES):
        raise SourceError(f"{paths[0]}: more than {MAX_STAGES} pipeline stages; refused",
                          path=paths[0])
    if sum(stage_devices.values()) > MAX_DEVICES:
        raise SourceError(f"{paths[0]}: {sum(stage_devices.values()):,} devices over all "
                          f"stages (over {MAX_DEVICES:,}); refused", path=paths[0])
    return Strategy(layouts, stage_devices, [str(p) for p in paths])


def _read_bounded(path: Path) -> bytes:
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            raise SourceError(f"{path} is not a file; a strategy is a file", path=path)
        with open(path, "rb") as f:
            raw = f.read(MAX_STRATEGY_BYTES + 1)
    except OSError as exc:
        raise SourceError(f"{path}: cannot read the strategy ({exc.strerror})",
                          path=path) from None
    if len(raw) > MAX_STRATEGY_BYTES:
        raise SourceError(f"{path}: a strategy file over {MAX_STRATEGY_BYTES >> 20} MiB; "
                          "refused", path=path)
    if not raw:
        raise SourceError(f"{path} is empty; a strategy file holds the layouts", path=path)
    return raw


def _parse(path: Path, raw: bytes) -> list[ParamLayout]:
    if path.suffix == ".json":
        return _from_json(path, raw)
    return _from_protobuf(path, raw)


_STAGED = re.compile(r"^([0-9]{1,4})-(.+)$", re.S)


def _split_stage(name: str, stage: int) -> tuple[int, str]:
    """A merged file's ``"{stage}-{name}"``, else the file's own stage."""
    m = _STAGED.match(name)
    return (int(m.group(1)), m.group(2)) if m else (stage, name)


def _from_protobuf(path: Path, raw: bytes) -> list[ParamLayout]:
    from google.protobuf.message import DecodeError

    message = _message_class()()
    try:
        message.ParseFromString(raw)
    except (DecodeError, RecursionError, ValueError) as exc:
        raise SourceError(f"{path}: not a MindSpore strategy file (protobuf "
                          f"ParallelStrategyMap: {str(exc)[:80]}); pass the strategy "
                          "training wrote (strategy/ckpt_strategy_rank_0.ckpt), or its "
                          ".json", path=path) from None
    stage = int(message.current_stage)
    out = []
    for item in message.parallel_layout_item:
        lay = item.parallel_layouts
        staged, name = _split_stage(item.param_name, stage)
        out.append(_checked(path, name, staged, {
            "dev_matrix": [list(d.dim) for d in lay.dev_matrix],
            "tensor_map": [list(t.dim) for t in lay.tensor_map],
            "param_split_shape": [list(s.dim) for s in lay.param_split_shape],
            "field": lay.field, "opt_weight_shard_step": lay.opt_weight_shard_step,
            "opt_weight_shard_size": lay.opt_weight_shard_size}))
    return out


def _from_json(path: Path, raw: bytes) -> list[ParamLayout]:
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError, UnicodeDecodeError) as exc:
        raise SourceError(f"{path}: not a JSON strategy ({str(exc)[:80]})", path=path) from None
    items = data.get("parallel_layout_item") if isinstance(data, dict) else None
    if not isinstance(items, dict):
        raise SourceError(f"{path}: a JSON strategy holds an object with "
                          "'parallel_layout_item'; this does not", path=path)
    stage = data.get("current_stage", 0)
    stage = stage if isinstance(stage, int) and not isinstance(stage, bool) else 0
    out = []
    for name, item in items.items():
        if not isinstance(item, dict):
            raise SourceError(f"{path}: the layout of {shown(name)} is not an object",
                              path=path)
        staged, plain = _split_stage(str(name), stage)
        tmap = item.get("tensor_map")
        out.append(_checked(path, plain, staged, {
            "dev_matrix": [item.get("dev_matrix")],
            "tensor_map": ([tmap] if isinstance(tmap, list) and all(
                isinstance(t, int) for t in tmap) else tmap),
            "param_split_shape": [item.get("param_split_shape", [])],
            "field": item.get("field", 0),
            "opt_weight_shard_step": item.get("opt_weight_shard_step", 0),
            "opt_weight_shard_size": item.get("opt_weight_shard_size", 0)}))
    return out


def _ints(value: Any, what: str, limit: int) -> list[int]:
    if not isinstance(value, list) or len(value) > limit or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ValueError(f"{what} is not a list of at most {limit} integers")
    return value


def _checked(path: Path, name: str, stage: int, raw: dict[str, Any]) -> ParamLayout:
    """A :class:`ParamLayout` from a file's values, every count and size bounded."""
    try:
        if len(name) > MAX_NAME:
            raise ValueError(f"a name of {len(name)} characters")
        if not 0 <= stage < MAX_STAGES:
            raise ValueError(f"pipeline stage {stage}")
        mats = raw["dev_matrix"]
        if not isinstance(mats, list) or len(mats) != 1:
            raise ValueError("not one device matrix")
        dev = _ints(mats[0], "the device matrix", MAX_AXES)
        if not dev or any(d < 1 for d in dev):
            raise ValueError(f"device matrix {dev[:MAX_AXES]}")
        devices = math.prod(dev)
        if devices > MAX_DEVICES:
            raise ValueError(f"a device matrix of {devices:,} devices (over {MAX_DEVICES:,})")
        tmap = _tensor_map(raw["tensor_map"], len(dev))
        used = [a for axes in tmap for a in axes]
        if len(used) != len(set(used)):
            raise ValueError(f"tensor map {tmap} splits two dimensions over one device axis")
        split_rows = ()
        splits = raw["param_split_shape"]
        if isinstance(splits, list) and splits:
            rows = _ints(splits[0] if isinstance(splits[0], list) else [], "param_split_shape",
                         MAX_DEVICES)
            if rows:
                parts = math.prod(math.prod(dev[len(dev) - 1 - a] for a in axes)
                                  for axes in tmap)
                if len(rows) != parts or any(r < 0 or r > (1 << 40) for r in rows):
                    raise ValueError(f"param_split_shape of {len(rows)} sizes for {parts} "
                                     "slices")
                first = tmap[0] if tmap else ()
                per_row = parts // math.prod(dev[len(dev) - 1 - a] for a in first)
                for k in range(0, parts, per_row):  # slices of one row band: one height
                    if len(set(rows[k:k + per_row])) > 1:
                        raise ValueError(f"param_split_shape {rows[:16]} gives slices of one "
                                         "row band different heights: they would overlap or "
                                         "leave holes")
                split_rows = tuple(rows)
        size, step, fld = (raw["opt_weight_shard_size"], raw["opt_weight_shard_step"],
                           raw["field"])
        for value, what in ((size, "opt_weight_shard_size"), (step, "opt_weight_shard_step"),
                            (fld, "field")):
            if not isinstance(value, int) or isinstance(value, bool) or not (
                    -1 <= value <= MAX_DEVICES):
                raise ValueError(f"{what} {shown(value)}")
        layout = ParamLayout(name, tuple(dev), tmap, size, step, split_rows, fld, stage)
        layout.opt_group()  # raises where the shard cannot be laid out
        if split_rows and layout.opt_parts > 1:
            raise ValueError("uneven rows (param_split_shape) with an optimizer shard")
        return layout
    except (ValueError, KeyError, TypeError) as exc:
        raise SourceError(f"{path}: the layout of {shown(name)} is impossible ({exc}); "
                          "pass the strategy training wrote", path=path) from None


def _tensor_map(value: Any, axes: int) -> tuple[tuple[int, ...], ...]:
    """Either form of the tensor map as axes per dimension: ``[[1, -1]]`` (one entry per
    dimension) or ``[[1, 0], [-1]]`` (the layout form: several axes per dimension)."""
    if not isinstance(value, list) or not value:
        raise ValueError("no tensor map")
    if len(value) == 1:
        dims = [[v] for v in _ints(value[0], "the tensor map", MAX_AXES)]
    else:
        if len(value) > MAX_AXES:
            raise ValueError(f"a tensor map of {len(value)} dimensions")
        # MindSpore drops empty entries of the layout form (_convert_to_list)
        dims = [d for d in (_ints(v, "the tensor map", MAX_AXES) for v in value) if d]
    out = []
    for d in dims:
        if not d or any(a < -1 or a >= axes for a in d):
            raise ValueError(f"tensor map entry {d} outside the device matrix's {axes} axes")
        out.append(tuple(a for a in d if a != -1))
    return tuple(out)


@lru_cache(maxsize=1)
def _message_class() -> Any:
    """``ParallelStrategyMap`` from MindSpore's ``node_strategy.proto`` (proto2, package
    ``mindspore.straspb``), built from the schema below with the ``protobuf`` library."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(name="ms_port_node_strategy.proto",
                                              package="mindspore.straspb", syntax="proto2")

    def message(name: str, *fields: tuple[str, int, int, int, str]) -> None:
        m = file.message_type.add(name=name)
        for fname, number, label, ftype, type_name in fields:
            f = m.field.add(name=fname, number=number, label=label, type=ftype)
            if type_name:
                f.type_name = f".mindspore.straspb.{type_name}"

    rep, req = F.LABEL_REPEATED, F.LABEL_REQUIRED
    msg = F.TYPE_MESSAGE
    message("ParallelStrategy", ("dim", 1, rep, F.TYPE_UINT32, ""))
    message("ParallelStrategys", ("stage", 1, req, F.TYPE_UINT32, ""),
            ("parallel_strategy", 2, rep, msg, "ParallelStrategy"))
    message("ParallelStrategyItem", ("node_name", 1, req, F.TYPE_STRING, ""),
            ("parallel_strategys", 2, req, msg, "ParallelStrategys"))
    message("DevMatrix", ("dim", 1, rep, F.TYPE_UINT32, ""))
    message("TensorMap", ("dim", 1, rep, F.TYPE_INT32, ""))
    message("ParamSplitShape", ("dim", 1, rep, F.TYPE_INT64, ""))
    message("IndicesOffset", ("dim", 1, rep, F.TYPE_INT64, ""))
    message("ParallelLayouts", ("dev_matrix", 1, rep, msg, "DevMatrix"),
            ("tensor_map", 2, rep, msg, "TensorMap"),
            ("param_split_shape", 3, rep, msg, "ParamSplitShape"),
            ("indices_offset", 4, rep, msg, "IndicesOffset"),
            ("field", 5, req, F.TYPE_INT32, ""),
            ("opt_weight_shard_step", 6, req, F.TYPE_INT32, ""),
            ("opt_weight_shard_size", 7, req, F.TYPE_INT32, ""))
    message("ParallelLayoutItem", ("param_name", 1, req, F.TYPE_STRING, ""),
            ("parallel_layouts", 2, req, msg, "ParallelLayouts"))
    message("ParallelStrategyMap", ("current_stage", 1, req, F.TYPE_UINT32, ""),
            ("parallel_strategy_item", 2, rep, msg, "ParallelStrategyItem"),
            ("parallel_layout_item", 3, rep, msg, "ParallelLayoutItem"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName("mindspore.straspb.ParallelStrategyMap"))


__all__ = ["MAX_DEVICES", "ParamLayout", "Strategy", "read_strategy", "strategy_paths"]
