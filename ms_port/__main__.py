"""``python -m ms_port`` runs the CLI."""

from .cli import run

run()
