"""Text that came from files, made safe to show: no module of ms-port's own is imported
here, so that everything that prints may use it."""

from __future__ import annotations

#: C0 and C1 control characters, DEL, and the bidirectional overrides and isolates that
#: reorder what a terminal shows (CVE-2021-42574, "Trojan Source")
_INVISIBLE = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))}
_INVISIBLE.update({c: f"\\u{c:04x}" for c in (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F),
                                               *range(0x2066, 0x206A))})
_INVISIBLE_KEEP_NL = {c: r for c, r in _INVISIBLE.items() if c != 0x0A}


def visible(text: object, *, newlines: bool = False) -> str:
    """``text`` with every control or bidi character shown as an escape (``\\x1b``).

    Names come from files: an ESC sequence in a tensor name must not clear the screen or
    plant a hyperlink. Use it wherever such text reaches a terminal (JSON stays exact).
    """
    return str(text).translate(_INVISIBLE_KEEP_NL if newlines else _INVISIBLE)


__all__ = ["size_text", "visible"]


def size_text(n: float) -> str:
    """Bytes as a reader says them: ``512 B``, ``1.5 KiB``, ``2.3 GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)
