"""Packaging: every folder and data file the code reads is declared, and a build of the
wheel prints no warning and ships them all (a fresh install once printed ~40 lines of
setuptools' "Package would be ignored" for ``ms_port/archs/manifests``)."""

from __future__ import annotations

import fnmatch
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

REPO = Path(__file__).resolve().parents[1]
#: what a build needs besides the package folders
BUILD_FILES = ("pyproject.toml", "README.md")


def _setuptools() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]


def _folder(package: str, package_dir: dict[str, str]) -> Path:
    """Where a package's files live: its nearest ``package-dir`` entry, else its dotted path."""
    parts = package.split(".")
    for i in range(len(parts), 0, -1):
        base = package_dir.get(".".join(parts[:i]))
        if base is not None:
            return REPO / base / Path(*parts[i:])
    return REPO / Path(*parts)


def _files(folder: Path) -> list[Path]:
    """A package folder's own files, compiled bytecode left out."""
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix != ".pyc")


def _layout() -> dict[str, Path]:
    cfg = _setuptools()
    return {p: _folder(p, cfg.get("package-dir", {})) for p in cfg["packages"]}


def test_every_importable_folder_and_data_file_is_declared():
    """What setuptools checks at build time, without a build: a subfolder Python could
    import must be a listed package, and each of a package's non-.py files must match
    its package-data globs (else the wheel silently lacks it)."""
    cfg, layout = _setuptools(), _layout()
    data = cfg.get("package-data", {})
    problems = []
    for package, folder in layout.items():
        for sub in sorted(p for p in folder.iterdir() if p.is_dir()):
            name = f"{package}.{sub.name}"
            if sub.name.isidentifier() and sub.name != "__pycache__" and name not in layout:
                problems.append(f"{sub.relative_to(REPO)} is importable as {name!r} but not "
                                "in [tool.setuptools] packages")
        for file in _files(folder):
            if file.suffix != ".py" and not any(
                    fnmatch.fnmatch(file.name, g) for g in data.get(package, ())):
                problems.append(f"{file.relative_to(REPO)} matches no package-data glob "
                                f"of {package!r}")
    assert not problems, "pyproject.toml:\n" + "\n".join(problems)


def test_wheel_builds_without_warnings_and_ships_every_file(tmp_path):
    """setuptools' own verdict: a wheel built from a copy of the tree (nothing written
    into the repository) warns about nothing and holds each package folder's files."""
    pytest.importorskip("setuptools", minversion="77")  # pyproject's build requirement
    layout = _layout()
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in BUILD_FILES:
        shutil.copy(REPO / name, tree / name)
    for folder in {f.relative_to(REPO).parts[0] for f in layout.values()}:
        shutil.copytree(REPO / folder, tree / folder,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path / "wheel"
    script = "import sys; from setuptools import build_meta as b; print(b.build_wheel(sys.argv[1]))"
    build = subprocess.run([sys.executable, "-c", script, str(out)], cwd=tree,
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    said = build.stdout + build.stderr
    warned = [ln for ln in said.splitlines() if "Warning" in ln or "would be ignored" in ln]
    assert not warned, "\n".join(warned) + "\n\n" + build.stderr[-4000:]
    with zipfile.ZipFile(out / build.stdout.split()[-1]) as whl:
        shipped = {n for n in whl.namelist() if ".dist-info/" not in n}
    expected = {f"{package.replace('.', '/')}/{f.name}"
                for package, folder in layout.items() for f in _files(folder)
                if "__pycache__" not in f.parts}
    assert expected - shipped == set(), "the wheel lacks files of the tree"
    assert {"ms_port/archs/manifests/resnet50.json", "ms_port/mappings/resnet.yaml"} <= shipped
