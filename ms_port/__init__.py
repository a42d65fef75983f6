"""ms-port: move trained PyTorch weights to MindSpore, and prove the move was exact.

>>> import ms_port
>>> report = ms_port.convert("resnet50.pth", arch="resnet50", output="resnet50.ckpt")
>>> ms_port.verify("resnet50.pth", "resnet50.ckpt", arch="resnet50").ok
True

Importing this package imports neither torch nor MindSpore; they load when needed.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it; resolved on first access (PEP 562)
_EXPORTS = {
    "inspect": "api", "plan": "api", "convert": "api", "verify": "api", "export": "api",
    "diff": "api",
    "ExportReport": "match.inversion",
    "list_archs": "archs", "get_arch": "archs", "register_arch": "archs", "Arch": "archs",
    "read_source": "read.sources", "Source": "read.sources",
    "Target": "read.targets", "Plan": "match.plan", "Match": "match.plan",
    "MappingTable": "match.mapping", "load_mapping": "match.mapping",
    "InspectReport": "reports", "ConversionReport": "reports",
    "ParityReport": "check.parity", "prefer_fast_cpu_kernels": "check.devices",
    "MsPortError": "errors", "SourceError": "errors", "HubError": "errors",
    "UnsafePickleError": "errors",
    "MappingError": "errors", "TargetError": "errors", "ArchError": "errors",
    "WriteError": "errors", "OutputExistsError": "errors",
    "ReadbackError": "errors", "ParityError": "errors", "DeviceError": "errors",
    "NonFiniteError": "errors",
}

__all__ = ["__version__", *sorted(_EXPORTS)]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ms_port' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"ms_port.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
