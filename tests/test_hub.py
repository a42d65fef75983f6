"""Hugging Face Hub ids as SOURCE (ms_port.read.hub), with no network.

Each test lays a Hugging Face cache out by hand in tmp_path (refs/<branch>, blobs, and
snapshots/<commit>/ of links to them), points huggingface_hub at it, and turns the Hub
off: HF_HUB_OFFLINE=1, and any call that would reach it fails the test. The online path
is tested with snapshot_download replaced by a fake that records what was asked for.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner
from safetensors.numpy import save

import ms_port
from ms_port import api
from ms_port.cli import main
from ms_port.errors import HubError, MsPortError
from ms_port.read import hub
from ms_port.read.sources import read_source

hf = pytest.importorskip("huggingface_hub")
from huggingface_hub import constants  # noqa: E402

A, B, C = (hashlib.sha1(x).hexdigest() for x in (b"A", b"B", b"C"))


def weights(seed: int, names: tuple[str, ...] = ("embed.weight", "head.bias")) -> bytes:
    """A seeded safetensors file: one (4, 3) float32 tensor per name."""
    rng = np.random.default_rng(seed)
    return save({n: rng.standard_normal((4, 3)).astype(np.float32) for n in names})


def lay(cache: Path, repo_id: str, commit: str, files: dict[str, bytes],
        refs: tuple[str, ...] = ("main",)) -> Path:
    """One snapshot of a Hugging Face cache: blobs, links to them, refs naming the commit."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    for name, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / name).symlink_to(os.path.relpath(blob, snapshot))
    for ref in refs:
        (repo / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty cache in tmp_path, offline, the working folder empty (no local 'org/')."""
    home = tmp_path / "hf"
    cache = home / "hub"
    cache.mkdir(parents=True)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # huggingface_hub read the variables when it was imported: set what it reads now
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)

    def no_network(*args, **kwargs):
        raise AssertionError("a test reached for the Hub")

    monkeypatch.setattr(hf.HfApi, "repo_info", no_network)
    monkeypatch.setattr(hf.HfApi, "list_repo_tree", no_network)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return cache


def cli(*args: str):
    return CliRunner().invoke(main, list(args), env={"COLUMNS": "250"})


def one_error(result) -> str:
    """The CLI's refusal: exit 2, nothing on stdout, one error line and the --debug hint."""
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert result.stdout == "", result.stdout
    assert len(lines) == 2 and lines[0].startswith("error: "), result.stderr
    assert lines[1] == "(run with --debug for the traceback)"
    return lines[0]


def test_an_id_reads_its_snapshot(hub_cache):
    snapshot = lay(hub_cache, "org/name", A, {"config.json": b'{"model_type": "llama"}',
                                              "model.safetensors": weights(0)})
    result = cli("inspect", "org/name", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["path"] == str(snapshot / "model.safetensors")
    assert [t["name"] for t in data["tensors"]] == ["embed.weight", "head.bias"]
    assert data["hub"] == {"repo_id": "org/name", "revision": None, "commit": A,
                           "folder": str(snapshot)}
    assert data["config"]["model_type"] == "llama"  # config.json beside the weights
    shown = cli("inspect", "org/name")
    assert shown.exit_code == 0, shown.output
    assert f"hub: org/name@{A[:7]} (Hugging Face cache)" in shown.stdout
    # the same tensors, bit for bit, as reading the snapshot's file by its path
    by_path = read_source(snapshot / "model.safetensors")
    by_id = read_source("org/name")
    assert by_id.hub.commit == A and by_path.hub is None
    assert all(np.array_equal(by_id[n].load(), by_path[n].load()) for n in by_path.tensors)


@pytest.mark.parametrize(("revision", "tensor", "commit"), [
    (None, "main.weight", A),
    ("v2", "branch.weight", B),  # a branch (refs/v2)
    (C, "commit.weight", C),     # a commit hash no ref names
])
def test_revision_picks_the_snapshot(hub_cache, revision, tensor, commit):
    lay(hub_cache, "org/name", A, {"model.safetensors": weights(1, ("main.weight",))})
    lay(hub_cache, "org/name", B, {"model.safetensors": weights(2, ("branch.weight",))},
        refs=("v2",))
    lay(hub_cache, "org/name", C, {"model.safetensors": weights(3, ("commit.weight",))},
        refs=())
    result = cli("inspect", "org/name", "--json", *(["--revision", revision] if revision else []))
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [t["name"] for t in data["tensors"]] == [tensor]
    assert data["hub"]["commit"] == commit and data["hub"]["revision"] == revision
    assert f"/snapshots/{commit}/model.safetensors" in data["path"]
    report = ms_port.inspect("org/name", revision=revision)
    assert str(report.hub) == f"org/name@{commit[:7]}" + (
        " (revision v2)" if revision == "v2" else "")


def test_an_absent_id_offline_is_one_line(hub_cache):
    line = one_error(cli("inspect", "org/absent"))
    assert "'org/absent' (revision 'main') is no local path" in line
    assert f"nor in the Hugging Face cache {hub_cache}" in line
    assert "HF_HUB_OFFLINE is set" in line and "`hf download org/absent`" in line
    line = one_error(cli("convert", "org/absent", "--ms-model", "mindformers:llama", "-o",
                         "out.ckpt", "--json", "--revision", "v9"))
    assert "(revision 'v9')" in line and "`hf download org/absent --revision v9`" in line
    assert not Path("out.ckpt").exists()
    with pytest.raises(HubError, match="'org/absent'") as info:
        ms_port.plan("org/absent", ms_model="mindformers:llama")
    assert info.value.data == {"repo_id": "org/absent", "revision": None,
                               "cache": str(hub_cache)}
    # a snapshot without weights names what it lacks, and how to get it
    lay(hub_cache, "org/bare", A, {"config.json": b"{}"})
    line = one_error(cli("inspect", "org/bare"))
    assert "holds none of model.safetensors" in line and "`hf download org/bare`" in line


def test_a_local_path_named_like_an_id_wins(hub_cache):
    lay(hub_cache, "org/name", A, {"model.safetensors": weights(0, ("cached.weight",))})
    Path("org/name").mkdir(parents=True)
    Path("org/name/model.safetensors").write_bytes(weights(0, ("local.weight",)))
    result = cli("inspect", "org/name", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [t["name"] for t in data["tensors"]] == ["local.weight"]
    assert data["path"] == "org/name/model.safetensors" and data["hub"] is None
    line = one_error(cli("inspect", "org/name", "--revision", "v2"))
    assert "org/name is a local path, which wins" in line and "--revision 'v2'" in line


@pytest.mark.parametrize("given", ["no/such/file.pth", "org/", "./org/name", "org/na me",
                                   "org--x/name", "org/name.git", "org/..name"])
def test_a_string_that_is_no_id_keeps_the_not_found_error(hub_cache, monkeypatch, given):
    def never(*args, **kwargs):
        raise AssertionError(f"{given!r} was taken for a Hub id")

    monkeypatch.setattr(hub, "resolve", never)
    assert not hub.is_hub_id(given)
    line = one_error(cli("inspect", given))
    assert "no such file; check the path" in line and "Hugging Face" not in line


def test_control_characters_are_escaped(hub_cache):
    result = cli("inspect", "org/na\x1b[2Jme")
    line = one_error(result)
    assert "org/na\\x1b[2Jme: no such file" in line and "\x1b" not in result.output
    lay(hub_cache, "org/name", A, {"model.safetensors": weights(0)})
    result = cli("inspect", "org/name", "--revision", "\x1b]8;;http://x\x07main")
    line = one_error(result)
    assert "--revision '\\x1b]8;;http://x\\x07main' is not a branch, tag or commit" in line
    assert "\x1b" not in result.output and "\x07" not in result.output


def test_without_huggingface_hub_an_id_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("huggingface_hub", "huggingface_hub.utils"):
        monkeypatch.setitem(sys.modules, name, None)  # import raises ImportError
    with pytest.raises(HubError, match=r"^'org/name' is no local path; to read it as a "
                                       r"Hugging Face id, pip install huggingface_hub$"):
        ms_port.inspect("org/name")


def test_revision_given_where_no_id_is_refused(hub_cache):
    Path("a.safetensors").write_bytes(weights(0))
    line = one_error(cli("diff", "a.safetensors", "a.safetensors", "--revision", "v2"))
    assert "neither a.safetensors nor a.safetensors is one" in line
    with pytest.raises(MsPortError, match="arch= reads no checkpoint"):
        ms_port.inspect(arch="resnet18", revision="v2")


def test_diff_reads_an_id(hub_cache):
    lay(hub_cache, "org/name", A, {"model.safetensors": weights(5)})
    Path("same.safetensors").write_bytes(weights(5))
    Path("other.safetensors").write_bytes(weights(6))
    assert ms_port.diff("org/name", "same.safetensors").ok
    assert not ms_port.diff("org/name", "other.safetensors").ok


@pytest.mark.parametrize("command", ["convert", "verify", "diff", "inspect"])
def test_the_cli_passes_revision_through(hub_cache, monkeypatch, command):
    seen = {}

    def record(*args, **kwargs):
        seen.update(kwargs)
        raise MsPortError("recorded")

    monkeypatch.setattr(api, command, record)
    args = {"convert": ["org/name", "--ms-model", "mindformers:llama", "-o", "o.ckpt"],
            "verify": ["org/name", "o.ckpt", "--ms-model", "mindformers:llama"],
            "diff": ["org/name", "o.ckpt"], "inspect": ["org/name"]}[command]
    assert "recorded" in one_error(cli(command, *args, "--revision", "v2"))
    assert seen["revision"] == "v2"


# -- online, with snapshot_download replaced ------------------------------------------


@pytest.fixture
def online(hub_cache, monkeypatch):
    """Online, with a fake snapshot_download serving ``repo`` (name -> bytes) at commit A
    and recording what each call asked for; calls for the cache alone go to the real one."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    from huggingface_hub.utils import are_progress_bars_disabled

    real = hf.snapshot_download
    state = SimpleNamespace(repo={}, listing_error=None, asked=[], quiet=[])

    def fake(repo_id, *, revision=None, cache_dir=None, allow_patterns=None, dry_run=False,
             local_files_only=False, **kwargs):
        if local_files_only:
            return real(repo_id, revision=revision, cache_dir=cache_dir,
                        allow_patterns=allow_patterns, local_files_only=True)
        if dry_run:
            if state.listing_error is not None:
                raise state.listing_error
            return [SimpleNamespace(filename=name) for name in state.repo]
        names = sorted(n for n in state.repo
                       if any(fnmatch.fnmatchcase(n, p) for p in allow_patterns))
        state.asked.append(names)
        state.quiet.append(are_progress_bars_disabled())
        repo = Path(cache_dir) / ("models--" + repo_id.replace("/", "--"))
        folder = repo / "snapshots" / A
        folder.mkdir(parents=True, exist_ok=True)
        for name in names:
            (folder / name).write_bytes(state.repo[name])
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / (revision or "main")).write_text(A)
        _list_files(repo, state.repo)
        return str(folder)

    monkeypatch.setattr(hf, "snapshot_download", fake)
    return state


def _list_files(repo: Path, files: dict[str, bytes]) -> None:
    """Record the repository's whole listing, as a real download does: offline, a
    snapshot is then incomplete if it lacks a file asked for."""
    try:
        from huggingface_hub._tree_cache import TreeCacheEntry, write_tree_cache
    except ImportError:  # a huggingface_hub without the listing, or the check
        return
    write_tree_cache(str(repo), A, {name: TreeCacheEntry(
        size=len(data), blob_id=hashlib.sha1(data).hexdigest()) for name, data in files.items()})


def test_online_fetches_config_and_the_weights_only(online, hub_cache):
    from huggingface_hub.utils import are_progress_bars_disabled

    index = {"metadata": {}, "weight_map": {"embed.weight": "model-00001-of-00002.safetensors",
                                            "head.bias": "model-00002-of-00002.safetensors"}}
    rng = np.random.default_rng(0)
    online.repo = {
        "config.json": b'{"model_type": "llama"}',
        "model.safetensors.index.json": json.dumps(index).encode(),
        "model-00001-of-00002.safetensors": save({"embed.weight": rng.random((2, 2))}),
        "model-00002-of-00002.safetensors": save({"head.bias": rng.random(2)}),
        "consolidated.safetensors": b"not for transformers", "pytorch_model.bin": b"older",
        "tokenizer.json": b"{}", "generation_config.json": b"{}", "README.md": b"",
    }
    report = ms_port.inspect("org/sharded")
    assert online.asked == [["config.json", "model.safetensors.index.json"],
                            ["model-00001-of-00002.safetensors",
                             "model-00002-of-00002.safetensors"]]
    assert [t.name for t in report.tensors] == ["embed.weight", "head.bias"]
    assert report.format == "safetensors-sharded" and report.hub.commit == A
    # no progress bars while the library downloads; the caller's setting comes back after
    assert online.quiet == [True, True] and not are_progress_bars_disabled()
    # the cache now serves it offline (refs/main written by the download), though it
    # holds fewer files than the repository's listing names
    online.asked.clear()
    assert hub.resolve("org/sharded", local_files_only=True).commit == A
    assert online.asked == [] and not (Path(report.hub.folder) / "tokenizer.json").exists()


def test_online_takes_pytorch_bin_only_without_safetensors(online):
    online.repo = {"config.json": b"{}", "pytorch_model.bin": b"PK", "tokenizer.json": b"{}",
                   "flax_model.msgpack": b""}
    ref = hub.resolve("org/old", revision="v1")
    assert online.asked == [["config.json", "pytorch_model.bin"]]
    assert ref.revision == "v1" and Path(ref.folder, "pytorch_model.bin").is_file()
    online.repo = {"config.json": b"{}", "model.gguf": b""}
    with pytest.raises(HubError, match=r"'org/gguf' \(revision 'main'\) on the Hugging Face "
                                       r"Hub holds none of model.safetensors"):
        hub.resolve("org/gguf")


def test_offline_as_the_environment_says_at_call_time(online, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # set after huggingface_hub read it
    with pytest.raises(HubError, match="HF_HUB_OFFLINE is set, so the Hub was not asked"):
        hub.resolve("org/absent")
    assert online.asked == []


def test_an_unreachable_hub_falls_back_to_the_cache(online, hub_cache):
    from huggingface_hub.errors import DryRunError

    lay(hub_cache, "org/cached", B, {"model.safetensors": weights(0)})
    cause = ConnectionError("network is down")
    online.listing_error = DryRunError("cannot list")
    online.listing_error.__cause__ = cause
    assert hub.resolve("org/cached").commit == B
    with pytest.raises(HubError, match=r"'org/absent' \(revision 'main'\) is no local path, "
                                       r"nor in the Hugging Face cache .*, and the Hub could "
                                       r"not be reached \(ConnectionError\)"):
        hub.resolve("org/absent")
    assert online.asked == []


def test_the_hub_says_no_such_repository_or_revision(online):
    from huggingface_hub.errors import HfHubHTTPError

    httpx = pytest.importorskip(HfHubHTTPError.__bases__[0].__module__.split(".")[0])
    from huggingface_hub.errors import DryRunError, RepositoryNotFoundError, RevisionNotFoundError

    response = httpx.Response(404, request=httpx.Request("GET", "https://huggingface.co/api"))
    online.listing_error = DryRunError("cannot list")
    online.listing_error.__cause__ = RepositoryNotFoundError("404", response=response)
    with pytest.raises(HubError, match=r"nor on the Hub \(or it is private or gated: "
                                       r"`hf auth login`\); check the path or the id$"):
        hub.resolve("no-such/model")
    online.listing_error = RevisionNotFoundError("404", response=response)
    with pytest.raises(HubError, match=r"^'org/name' has no revision 'v9' on the Hugging Face "
                                       r"Hub; check --revision"):
        hub.resolve("org/name", revision="v9")


# -- a language model by its id ---------------------------------------------------------


def test_convert_a_tiny_llama_by_its_id(hub_cache, tmp_path):
    pytest.importorskip("transformers")
    from ms_port.testing import tiny_hf_lm

    local = tiny_hf_lm("llama", tmp_path / "tiny-llama")
    snapshot = lay(hub_cache, "org/tiny-llama", A,
                   {p.name: p.read_bytes() for p in local.iterdir() if p.is_file()})
    result = cli("convert", "org/tiny-llama", "--ms-model", "mindformers:llama",
                 "-o", "out.ckpt")
    assert result.exit_code == 0, result.output
    assert f"hub:     org/tiny-llama@{A[:7]} (Hugging Face cache)" in result.stdout
    assert f"{snapshot}/model.safetensors" in result.stdout
    # the same checkpoint as converting the model directory by its path
    ms_port.convert(str(local), ms_model="mindformers:llama", output=tmp_path / "ref.ckpt")
    by_id, by_path = read_source(Path("out.ckpt")), read_source(tmp_path / "ref.ckpt")
    assert list(by_id.tensors) == list(by_path.tensors) and len(by_id) > 10
    assert all(np.array_equal(by_id[n].load(), by_path[n].load()) for n in by_id.tensors)
    data = json.loads(cli("convert", "org/tiny-llama", "--ms-model", "mindformers:llama",
                          "--dry-run", "--json").stdout)
    assert data["source_info"]["hub"]["commit"] == A
    assert data["config"] == str(snapshot / "config.json")
