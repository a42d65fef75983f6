"""The options objects are the single source of truth for a command's options: every
field has its CLI flag and every flag (but the CLI's own: how to show the result) a
field, with the same default; the library's keyword arguments are the fields."""

from __future__ import annotations

import inspect
from dataclasses import MISSING, fields

import click.core
import pytest

import ms_port
from ms_port.cli import main
from ms_port.options import (
    ConvertOptions,
    DiffOptions,
    ExportOptions,
    InspectOptions,
    SourceOptions,
    VerifyOptions,
)

#: command, its options object, the library's function
COMMANDS = [("verify", VerifyOptions, ms_port.verify),
            ("convert", ConvertOptions, ms_port.convert),
            ("export", ExportOptions, ms_port.export),
            ("inspect", InspectOptions, ms_port.inspect),
            ("diff", DiffOptions, ms_port.diff)]

#: click's "no default" (8.2 and later), else None
UNSET = getattr(click.core, "UNSET", None)

#: the CLI's own flags: how the result is shown, not what verify does
CLI_ONLY = {"--show", "--json", "--quiet", "--limit", "--all"}


def _flags(command) -> dict[str, object]:
    """flag -> the click parameter."""
    found = {}
    for param in command.params:
        for opt in (*getattr(param, "opts", ()), *getattr(param, "secondary_opts", ())):
            if opt.startswith("--"):
                found[opt] = param
    return found


@pytest.mark.parametrize(("command", "options", "function"), COMMANDS)
def test_every_field_has_its_flag_and_default(command, options, function):
    flags = _flags(main.commands[command])
    for f in fields(options):
        flag = f.metadata["flag"] or f"--{f.name.replace('_', '-')}"
        assert flag in flags, f"{options.__name__}.{f.name}: no {flag} on {command}"
        assert f.metadata["help"], f.name
        param = flags[flag]
        cli_default = None if param.default is UNSET else param.default
        if getattr(param, "is_flag", False) and cli_default is None:
            cli_default = False  # a switch left off
        if flag.startswith("--no-"):  # an inverted switch: off means the field's True
            assert f.default is True and not cli_default and param.is_flag, f.name
        elif getattr(param, "multiple", False) or f.default is None:
            assert not cli_default and f.default in (None, ()), (f.name, cli_default)
        else:
            assert cli_default == f.default, (f.name, cli_default, f.default)


@pytest.mark.parametrize(("command", "options", "function"), COMMANDS)
def test_every_flag_has_its_field(command, options, function):
    named = {f.metadata["flag"] or f"--{f.name.replace('_', '-')}" for f in fields(options)}
    for flag, param in _flags(main.commands[command]).items():
        if flag in CLI_ONLY or flag in named:
            continue
        assert any(o in named for o in param.opts), f"{flag} has no {options.__name__} field"


@pytest.mark.parametrize(("command", "options", "function"), COMMANDS)
def test_the_library_keywords_are_the_fields(command, options, function):
    params = inspect.signature(function).parameters
    keywords = {n for n, p in params.items() if p.kind is p.KEYWORD_ONLY} - {"progress"}
    assert keywords == set(options.names())
    for f in fields(options):
        assert f.default is not MISSING and params[f.name].default == f.default, f.name



def test_the_source_options_are_one_object_shared_by_every_reading_command():
    """--key, --unsafe-pickle and --revision mean one thing wherever a PyTorch checkpoint
    is read: the same fields, with the same help, on each command's options."""
    shared = {f.name: f.metadata["help"] for f in fields(SourceOptions)}
    for options in (InspectOptions, DiffOptions, ConvertOptions, VerifyOptions):
        assert issubclass(options, SourceOptions)
        mine = {f.name: f.metadata["help"] for f in fields(options)}
        assert {n: mine[n] for n in shared} == shared
    opts = VerifyOptions(key="model", unsafe_pickle=True, revision="v1")
    assert opts.reading() == {"key": "model", "unsafe_pickle": True, "revision": "v1"}
