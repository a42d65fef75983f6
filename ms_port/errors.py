"""One small error hierarchy. Every error carries its data and says what to do.

The CLI maps :class:`MsPortError` to one red line and an exit code
(:attr:`MsPortError.exit_code`: 2 for bad input, 1 for a check that failed);
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: a name read from a file (a tensor, a key, a path) is shown whole up to this length: it
#: is what the user must act on; past it (a crafted name), its head and its distinguishing
#: tail are kept
NAME_LIMIT = 256


def shown(value: Any, limit: int = 40) -> str:
    """``repr(value)``, bounded: a value read from a file, quoted in a message (its control
    characters escaped by repr). A string (a name) is shown whole up to
    :data:`NAME_LIMIT` characters; anything longer keeps its head and its tail
    (``'decoder.layers.0…linear_qkv.weight'``), since names differ at the end."""
    text = repr(value)
    if isinstance(value, str):
        limit = max(limit, NAME_LIMIT)
    if len(text) <= limit:
        return text
    head = limit // 3
    return f"{text[:head]}...{text[len(text) - (limit - head - 3):]}"


class MsPortError(Exception):
    """Base class: a failure ms-port understands and can explain.

    Attributes:
        message: what failed, where, and what to do.
        path: the file involved, when there is one.
        exit_code: the CLI exit status (2 bad input, 1 failed check).
    """

    exit_code = 2

    def __init__(self, message: str, *, path: str | Path | None = None, **data: Any):
        super().__init__(message)
        self.message = message
        self.path = None if path is None else str(path)
        self.data = data

    def __str__(self) -> str:
        return self.message


class SourceError(MsPortError):
    """A checkpoint could not be read: missing, unreadable, corrupt or of unknown format."""


class HubError(SourceError):
    """A Hugging Face Hub id could not be resolved: not in the cache (offline), not on the
    Hub, or its download failed. ``data`` holds ``repo_id``, ``revision`` and ``cache``."""


class UnsafePickleError(SourceError):
    """A pickle asked for something beyond plain tensors; nothing was executed."""


class MappingError(MsPortError):
    """A mapping YAML file is invalid: names the file, the entry and the fix."""


class TargetError(MsPortError):
    """The MindSpore target (architecture, Cell factory or template) could not be built."""


class ArchError(TargetError):
    """An architecture name is unknown or registered twice."""


class WriteError(MsPortError):
    """An output could not be written, or its read-back did not match."""


class OutputExistsError(WriteError):
    """The output exists and ``force`` was not given."""


class ReadbackError(WriteError):
    """The written file does not hold exactly what was planned."""

    exit_code = 1


class ParityError(MsPortError):
    """Verification could not run (a network failed to build or to load weights)."""


class ForwardUnavailable(ParityError):
    """The MindSpore network cannot compile or run here (a kernel this machine lacks):
    verify falls back to the tensors' proof and INCONCLUSIVE for the forward."""

    @classmethod
    def of(cls, exc: BaseException) -> ForwardUnavailable:
        """From MindSpore's compile or run error: its first line says what failed."""
        text = str(exc).strip()
        line = text.splitlines()[0] if text else type(exc).__name__
        return cls(f"MindFormers' network did not run here ({line[:300]})")


class DeviceError(MsPortError):
    """A requested device is not available on one side; the message says which."""


class NonFiniteError(MsPortError):
    """Weights hold NaN or Inf and ``check_finite`` was asked for."""

    exit_code = 1
