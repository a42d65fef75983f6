"""Write a Plan as a directory: safetensors shards plus a name -> file index.

Two layouts, one writer:

- ``mindspore``: ``model-00001-of-00003.safetensors``… and ``param_name_map.json``
  (``{"metadata": {"total_size"}, "weight_map": {name: shard}}``), what MindSpore's
  ``load_parallel_checkpoint`` and MindFormers' safetensors loading read from a folder;
  each shard also loads on its own with ``mindspore.load_checkpoint(f, format="safetensors")``.
- ``hf``: ``model.safetensors`` (or shards and ``model.safetensors.index.json``) with
  ``{"format": "pt"}`` metadata and the model's ``config.json``: a directory
  ``transformers.AutoModelForCausalLM.from_pretrained`` loads.

Every shard is written like any output (temporary file, fsync, read back bit for bit,
rename) into a directory assembled under a temporary name, renamed into place at the end:
the model appears whole or not at all. ``force`` replaces a directory holding only a
model's files (shards, index, ``config.json``), swapped out whole; anything else in it is
never touched — such a directory is refused.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from ..errors import OutputExistsError, WriteError
from ..match.plan import Match, Plan
from .writers import Progress, write_plan, write_text

LAYOUTS = ("mindspore", "hf")
_SHARD = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")
_UNITS = {"": 1, "B": 1, "KB": 1000, "MB": 1000**2, "GB": 1000**3, "KIB": 2**10,
          "MIB": 2**20, "GIB": 2**30}


def parse_size(text: str | int) -> int:
    """``"2GB"`` -> 2_000_000_000 (``KB/MB/GB`` decimal, ``KiB/MiB/GiB`` binary)."""
    if isinstance(text, int) and not isinstance(text, bool):
        size = text
    else:
        m = re.fullmatch(r"\s*([0-9]{1,15}(?:\.[0-9]{1,9})?)\s*([A-Za-z]*)\s*", str(text))
        unit = m.group(2).upper() if m else None
        if m is None or unit not in _UNITS:
            raise WriteError(f"shard size {text!r}: expected a number with KB, MB, GB, KiB, "
                             "MiB or GiB (e.g. 2GB)")
        size = int(float(m.group(1)) * _UNITS[unit])
    if size < 1:
        raise WriteError(f"shard size {text!r} must be positive")
    return size


@dataclass(frozen=True)
class DirectoryResult:
    """A written directory: its shards, index and how they were checked."""

    path: str
    layout: str
    shards: list[str]
    index: str | None
    tensors: int
    nbytes: int
    readback: str
    replaced: bool
    seconds: float
    config: str | None = None
    nonfinite: dict[str, int] = field(default_factory=dict)
    format: str = "safetensors"
    crc: bool = False
    #: the other files written beside the shards and config.json (a Trainer's)
    others: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "nonfinite": dict(self.nonfinite)}


def shard_groups(matches: list[Match], max_bytes: int | None) -> list[list[Match]]:
    """Consecutive groups of at most ``max_bytes`` (a larger tensor gets a shard alone)."""
    if max_bytes is None:
        return [list(matches)]
    groups: list[list[Match]] = [[]]
    size = 0
    for m in matches:
        n = m.nbytes
        if groups[-1] and size + n > max_bytes:
            groups.append([])
            size = 0
        groups[-1].append(m)
        size += n
    return groups


#: the files a model directory of ours holds; ``--force`` replaces a directory of only these
_OURS = ("model.safetensors", "model.safetensors.index.json", "param_name_map.json",
         "config.json", "optimizer.pt", "scheduler.pt", "trainer_state.json")


def _ours(name: str) -> bool:
    return name in _OURS or _SHARD.fullmatch(name) is not None


def check_directory(output: str | Path, *, force: bool,
                    inputs: list[Any] | tuple[Any, ...] = ()) -> Path:
    """Fail early if ``output`` cannot become the output directory: a file, a link, a
    directory holding an input (writing beside a source could replace its shards), or one
    holding anything but a model's files (``--force`` replaces the model, nothing else)."""
    path = Path(output)
    if path.is_symlink():
        raise WriteError(f"{path} is a symbolic link; give the directory itself", path=path)
    if path.exists() and not path.is_dir():
        raise WriteError(f"{path} is a file; a sharded or Hugging Face output is a directory "
                         "— give a directory name", path=path)
    if not path.parent.is_dir():
        raise WriteError(f"{path.parent}: no such directory for the output; create it first",
                         path=path)
    for given in inputs:
        if given is None or not path.is_dir():
            continue
        inside = Path(given).resolve()
        if inside == path.resolve() or path.resolve() in inside.parents:
            raise WriteError(f"{path} holds an input of this run ({given}); write the "
                             "output into another directory", path=path)
    if path.is_dir():
        names = sorted(p.name for p in path.iterdir())
        foreign = [n for n in names if not _ours(n)]
        if foreign:
            raise OutputExistsError(
                f"{path} holds files that are not a model's ({', '.join(foreign[:3])}"
                f"{', …' if len(foreign) > 3 else ''}); write into a new or empty directory",
                path=path)
        if names and not force:
            raise OutputExistsError(f"{path} holds a model; pass --force (force=True) to "
                                    "replace it", path=path)
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


#: a file written beside the shards, before the directory is published: its name -> what
#: writes it (given the path to write; the writer owns its own checks)
Extra = Callable[[Path], None]


def write_directory(plan: Plan, output: str | Path, *, layout: str = "mindspore",
                    max_shard_size: str | int | None = None, force: bool = False,
                    check_finite: bool = False, progress: Progress | None = None,
                    extra: dict[str, Extra] | None = None) -> DirectoryResult:
    """Write ``plan`` as a directory of safetensors shards with an index (see module doc).

    The directory is assembled under a temporary name beside ``output`` and renamed into
    place only once every shard is read back bit for bit; a model already there (``force``)
    is swapped out whole, so a failure at any point leaves the old one untouched.

    Args:
        layout: ``mindspore`` (``param_name_map.json``) or ``hf`` (transformers' names;
            its ``config.json`` one of ``extra``: :func:`json_file`).
        max_shard_size: bytes per shard (``"2GB"``); ``None``: one file.
        extra: more files the directory holds (``config.json``, a Trainer's
            ``optimizer.pt``…), written into it before it is published.
    """
    if layout not in LAYOUTS:
        raise WriteError(f"unknown directory layout {layout!r}; choose {' or '.join(LAYOUTS)}")
    start = time.perf_counter()
    final = check_directory(output, force=force)
    groups = shard_groups(plan.matches, None if max_shard_size is None
                          else parse_size(max_shard_size))
    names = (["model.safetensors"] if len(groups) == 1 and layout == "hf" else
             [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))])
    index_name = ("param_name_map.json" if layout == "mindspore" else
                  None if len(groups) == 1 else "model.safetensors.index.json")
    metadata = {"format": "pt"} if layout == "hf" else None
    replaced = final.exists()
    prefix = f".ms-port-{os.getpid()}-"
    work = Path(tempfile.mkdtemp(dir=final.parent, prefix=prefix))
    old: Path | None = None
    nonfinite: dict[str, int] = {}
    try:
        os.chmod(work, 0o777 & ~_umask())  # mkdtemp's 0700 ignores the umask
        total = sum(m.nbytes for m in plan.matches)
        done = 0
        for name, group in zip(names, groups):
            def step(phase: str, d: int, _t: int, base: int = done) -> None:
                if progress:
                    progress(phase, base + d, total)

            part = replace(plan, matches=group)
            written = write_plan(part, work / name, format="safetensors",
                                 check_finite=check_finite, progress=step, metadata=metadata)
            nonfinite.update(written.nonfinite)
            done += sum(m.nbytes for m in group)
        for name, write in (extra or {}).items():
            write(work / name)
        if index_name is not None:
            weight_map = {m.target: name for name, group in zip(names, groups) for m in group}
            index = {"metadata": {"total_size": total}, "weight_map": weight_map}
            write_text(work / index_name, json.dumps(index, indent=2) + "\n")
        if replaced:  # swap: the old model out, the new one in, then the old one gone
            old = Path(tempfile.mkdtemp(dir=final.parent, prefix=prefix))
            os.rename(final, old / "old")
        os.rename(work, final)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        if old is not None and not final.exists() and (old / "old").exists():
            os.rename(old / "old", final)  # put the old model back
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    nbytes = sum((final / n).stat().st_size for n in names)
    return DirectoryResult(str(final), layout, names, index_name, len(plan.matches), nbytes,
                           "bit-exact", replaced, time.perf_counter() - start,
                           "config.json" if "config.json" in (extra or {}) else None,
                           nonfinite, others=[n for n in extra or {} if n != "config.json"])


def json_file(data: Any) -> Extra:
    """An :data:`Extra` writing ``data`` as indented JSON (a model's ``config.json``)."""
    return lambda path: write_text(path, json.dumps(data, indent=2) + "\n")


__all__ = ["LAYOUTS", "DirectoryResult", "Extra", "check_directory", "json_file", "parse_size",
           "shard_groups", "write_directory"]
