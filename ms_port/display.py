"""How reports show themselves: rich (``__rich__``) and Jupyter (``_repr_html_``).

Kept apart from :mod:`ms_port.render` so that importing a report class imports no rich.
"""

from __future__ import annotations

from typing import Any

from .text import visible  # noqa: F401  (where it lived; import it from ms_port.text)


class Renderable:
    """Mixin: rich and Jupyter rendering through :mod:`ms_port.render`."""

    def __rich__(self) -> Any:
        from .render import render

        return render(self)

    def _repr_html_(self) -> str:
        from io import StringIO

        from rich.console import Console

        console = Console(file=StringIO(), record=True, width=110, color_system=None,
                          force_jupyter=False)  # else rich displays it in Jupyter itself
        console.print(self)
        # a fragment: a whole page's <style> would restyle the notebook around it
        return console.export_html(inline_styles=True, code_format=(
            '<pre style="font-family:Menlo,\'DejaVu Sans Mono\',consolas,monospace;'
            'line-height:1.2"><code>{code}</code></pre>'))
