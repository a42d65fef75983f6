"""Hugging Face Hub ids as sources: ``Qwen/Qwen2.5-0.5B`` -> a snapshot folder in the cache.

A string of the form ``org/name`` that names no local file or folder is a Hub id (a
local path always wins). It is resolved through huggingface_hub's own cache
(``HF_HUB_CACHE``, ``HF_HOME``):

- with ``HF_HUB_OFFLINE=1``, or when the Hub cannot be reached, from the cache alone;
- otherwise the files a checkpoint needs are downloaded first, and nothing else:
  ``config.json`` and the weights transformers would load — ``model.safetensors``, or
  its index and the shards the index names; ``pytorch_model.bin`` (or its index and
  shards) only where the repository has no safetensors. Never tokenizers or the rest.

huggingface_hub is imported only for an id, and runs without progress bars (the library
prints nothing; ``hf download ID`` shows progress). Every failure is one
:class:`~ms_port.errors.HubError` line naming the id, the revision and the cache.

Example:
    >>> path, ref = locate("Qwen/Qwen2.5-0.5B")  # HF_HUB_OFFLINE=1: the cache alone
    >>> ref.commit == path.name, path.parent.name
    (True, 'snapshots')
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import HubError, shown

#: the weights a model repository may hold, in transformers' order of preference (as
#: :data:`~ms_port.read.sources.HF_WEIGHTS`, less MindSpore's shard map)
WEIGHTS = ("model.safetensors", "model.safetensors.index.json",
           "pytorch_model.bin", "pytorch_model.bin.index.json")
#: an id's shape before huggingface_hub judges it: one slash between word characters
_ID_SHAPE = re.compile(r"[\w.\-]+/[\w.\-]+")
#: a branch, tag or commit: no control characters, spaces, '..' or leading '/'
_REVISION = re.compile(r"[\w.+\-][\w.+\-/]{0,254}")


@dataclass(frozen=True)
class HubRef:
    """What a Hub id resolved to.

    Attributes:
        repo_id: ``org/name``.
        revision: the branch, tag or commit asked for (``None``: the default branch).
        commit: the commit hash of the snapshot read.
        folder: that snapshot's folder in the cache.
    """

    repo_id: str
    revision: str | None
    commit: str
    folder: str

    def __str__(self) -> str:
        asked = "" if self.revision in (None, self.commit) else f" (revision {self.revision})"
        return f"{self.repo_id}@{self.commit[:7]}{asked}"

    def to_dict(self) -> dict[str, Any]:
        return {"repo_id": self.repo_id, "revision": self.revision, "commit": self.commit,
                "folder": self.folder}


def is_hub_id(path: object) -> bool:
    """Whether ``path`` is a Hub id: a string ``org/name`` naming nothing on disk."""
    if not isinstance(path, str) or not _ID_SHAPE.fullmatch(path) or os.path.lexists(path):
        return False
    try:
        from huggingface_hub.utils import HFValidationError, validate_repo_id
    except ImportError:
        return True  # resolve() says how to install it
    try:
        validate_repo_id(path)
    except HFValidationError:
        return False
    return True


def locate(path: str | Path, *, revision: str | None = None) -> tuple[Path, HubRef | None]:
    """The local path as given, or the snapshot folder a Hub id resolves to.

    Args:
        path: a file or folder, or a Hub id (``org/name``) where no such path exists.
        revision: the id's branch, tag or commit hash (default: ``main``).

    Returns:
        ``(path, None)`` for a local path, ``(snapshot folder, HubRef)`` for an id.

    Raises:
        HubError: the id cannot be resolved, or ``revision`` was given with a local path.
    """
    if is_hub_id(path):
        ref = resolve(str(path), revision=revision)
        return Path(ref.folder), ref
    if revision is not None and os.path.lexists(path):
        raise HubError(f"{path} is a local path, which wins over a Hugging Face id of that "
                       f"name; --revision {shown(revision, 80)} is for ids only — drop it, or "
                       "move the local path away", path=path, revision=revision)
    return Path(path), None


def resolve(repo_id: str, *, revision: str | None = None,
            local_files_only: bool = False) -> HubRef:
    """Resolve a Hub id through the cache, downloading what a checkpoint needs if online.

    Args:
        repo_id: ``org/name``.
        revision: a branch, tag or commit hash (default: ``main``).
        local_files_only: never ask the Hub (as ``HF_HUB_OFFLINE=1`` does).

    Returns:
        A :class:`HubRef` naming the commit and its snapshot folder.

    Raises:
        HubError: not in the cache (offline or unreachable), not on the Hub, no weights,
            or the download failed; one line, with what to do.
    """
    _check_revision(revision)
    try:
        import huggingface_hub  # noqa: F401
    except ImportError:
        raise HubError(f"{shown(repo_id, 200)} is no local path; to read it as a Hugging "
                       "Face id, pip install huggingface_hub", repo_id=repo_id,
                       revision=revision) from None
    from huggingface_hub import constants, errors

    # huggingface_hub's own reading of HF_HUB_CACHE / HF_HOME / HF_HUB_OFFLINE (made when
    # it was imported); offline also when the variable was set since
    cache = str(constants.HF_HUB_CACHE)
    where = {"repo_id": repo_id, "revision": revision, "cache": cache}
    offline = local_files_only or bool(constants.HF_HUB_OFFLINE) or \
        os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}
    # the HTTP client's base error (httpx2's, or httpx's before huggingface_hub 2) and
    # xet's: what a transfer may raise besides OSError
    failures = (OSError, errors.HfHubHTTPError.__bases__[0],
                getattr(errors, "XetDownloadError", OSError))
    cause: BaseException | None = None  # why the Hub was not used, for the message
    try:
        with _quiet(constants):
            files, cause = (None, None) if offline else _listing(repo_id, revision, cache)
            folder = _cached(repo_id, revision, cache) if files is None else \
                _download(repo_id, revision, cache, files, where)
    except errors.RevisionNotFoundError:
        raise HubError(f"{shown(repo_id, 200)} has no revision {shown(revision, 80)} on the "
                       "Hugging Face Hub; check --revision (a branch, tag or commit hash)",
                       **where) from None
    except errors.LocalEntryNotFoundError as exc:
        raise HubError(_not_cached(repo_id, revision, cache, exc, cause, offline=offline),
                       **where) from None
    except failures as exc:
        raise HubError(f"downloading {shown(repo_id, 200)} (revision "
                       f"{shown(revision or 'main', 80)}) into {cache} failed "
                       f"({type(exc).__name__}: {_first_line(exc)}); run it again, or "
                       f"`{_download_command(repo_id, revision)}`", **where) from None
    if not any((Path(folder) / name).is_file() for name in WEIGHTS):
        raise HubError(f"the cached snapshot of {shown(repo_id, 200)} (revision "
                       f"{shown(revision or 'main', 80)}) in {cache} holds none of "
                       f"{', '.join(WEIGHTS)}; download them with "
                       f"`{_download_command(repo_id, revision)}`", **where)
    return HubRef(repo_id, revision, Path(folder).name, str(folder))


def _check_revision(revision: str | None) -> None:
    if revision is None:
        return
    if not isinstance(revision, str) or not _REVISION.fullmatch(revision) \
            or ".." in revision:
        raise HubError(f"--revision {shown(revision, 80)} is not a branch, tag or commit "
                       "name (letters, digits and . _ - + /, no '..')", revision=revision)


@contextlib.contextmanager
def _quiet(constants: Any):
    """No progress bars while we download, unless HF_HUB_DISABLE_PROGRESS_BARS=0 asks."""
    if constants.HF_HUB_DISABLE_PROGRESS_BARS is False:
        yield
        return
    from huggingface_hub.utils import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )

    was = are_progress_bars_disabled()
    disable_progress_bars()
    try:
        yield
    finally:
        if not was:
            enable_progress_bars()


def _cached(repo_id: str, revision: str | None, cache: str) -> str:
    """The snapshot folder from the cache alone (raises LocalEntryNotFoundError)."""
    from huggingface_hub import snapshot_download

    # config.json only: asking for every file would call a snapshot incomplete whenever
    # the files we never download (tokenizers, ...) are absent
    return snapshot_download(repo_id, revision=revision, cache_dir=cache,
                             local_files_only=True, allow_patterns=["config.json"])


def _listing(repo_id: str, revision: str | None,
             cache: str) -> tuple[set[str] | None, BaseException | None]:
    """The repository's files, or ``None`` and the reason where the Hub cannot be asked
    (unreachable, unknown or gated id): then the cache alone is used."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import DryRunError

    try:
        listing = snapshot_download(repo_id, revision=revision, cache_dir=cache,
                                    dry_run=True)
    except DryRunError as exc:
        return None, exc.__cause__
    return {info.filename for info in listing}, None


def _download(repo_id: str, revision: str | None, cache: str, files: set[str],
              where: dict[str, Any]) -> str:
    """Download config.json and the weights transformers would load, nothing else."""
    weights = next((name for name in WEIGHTS if name in files), None)
    if weights is None:
        raise HubError(f"{shown(repo_id, 200)} (revision {shown(revision or 'main', 80)}) "
                       f"on the Hugging Face Hub holds none of {', '.join(WEIGHTS)}: no "
                       "transformers weights ms-port can read", **where)
    folder = _fetch(repo_id, revision, cache,
                    [name for name in ("config.json", weights) if name in files])
    if weights.endswith(".index.json"):
        shards = sorted(_shards(Path(folder) / weights) & files)
        if shards:
            folder = _fetch(repo_id, revision, cache, shards)
    return folder


def _fetch(repo_id: str, revision: str | None, cache: str, names: list[str]) -> str:
    from huggingface_hub import snapshot_download

    # exact names: patterns are fnmatch globs, so escape [ ] * ? in them
    return snapshot_download(repo_id, revision=revision, cache_dir=cache,
                             allow_patterns=[glob.escape(n) for n in names])


def _shards(index: Path) -> set[str]:
    """The shard files an index names; empty for an index the reader will refuse."""
    from .tensors import MAX_INDEX_BYTES

    try:
        if index.stat().st_size > MAX_INDEX_BYTES:
            return set()
        weight_map = json.loads(index.read_text())["weight_map"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return set()
    if not isinstance(weight_map, dict):
        return set()
    return {shard for shard in weight_map.values() if isinstance(shard, str)}


def _not_cached(repo_id: str, revision: str | None, cache: str, exc: Exception,
                cause: BaseException | None, *, offline: bool) -> str:
    """One line: what was searched, why the Hub was not asked or failed, what to do."""
    from huggingface_hub import errors

    what = f"{shown(repo_id, 200)} (revision {shown(revision or 'main', 80)})"
    fetch = _download_command(repo_id, revision)
    if isinstance(exc, getattr(errors, "IncompleteSnapshotError", ())):
        return (f"the cached snapshot of {what} in {cache} is incomplete; complete it with "
                f"`{fetch}`" + (" (or unset HF_HUB_OFFLINE)" if offline else ""))
    head = f"{what} is no local path, nor in the Hugging Face cache {cache}"
    cause = cause or exc.__cause__
    if offline or isinstance(cause, errors.OfflineModeIsEnabled):
        return (f"{head}, and HF_HUB_OFFLINE is set, so the Hub was not asked; download it "
                f"with `{fetch}`, or unset HF_HUB_OFFLINE")
    if isinstance(cause, errors.RepositoryNotFoundError):
        return (f"{head}, nor on the Hub (or it is private or gated: `hf auth login`); "
                "check the path or the id")
    reason = f" ({type(cause).__name__})" if cause is not None else ""
    return (f"{head}, and the Hub could not be reached{reason}; connect and run again, or "
            f"`{fetch}` where there is a network and copy the cache")


def _download_command(repo_id: str, revision: str | None) -> str:
    return f"hf download {repo_id}" + (f" --revision {revision}" if revision else "")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:160] if text else "no message"
