"""C library functions that Python's standard library does not wrap, through ctypes.

Each is looked up once; where the platform has no such function (or no C library that
``ctypes.CDLL(None)`` reaches, as on Windows) the lookup gives None and the caller does
without it.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any, Callable


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except (OSError, TypeError):  # TypeError: Windows wants a library name
        return None


def libc_function(name: str, restype: Any, *argtypes: Any) -> Callable[..., Any] | None:
    """The C library's ``name`` with its argument and result types set, or None.

    Calls release the GIL; after a failing call ``ctypes.get_errno()`` holds its errno.
    """
    libc = _libc()
    if libc is None:
        return None
    try:
        fn = libc[name]  # a function object of its own (getattr would share one per name)
    except AttributeError:
        return None
    fn.argtypes, fn.restype = argtypes, restype
    return fn
