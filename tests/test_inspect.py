"""ms-port inspect: every format, the containers it unwraps, and every bad input."""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import ms_port
from ms_port.cli import main
from ms_port.read.sources import read_source, torch_to_numpy
from ms_port.testing import seeded_torch_model


def _inspect(*args: str):
    return CliRunner().invoke(main, ["inspect", *map(str, args)])


@pytest.fixture(scope="module")
def resnet50_pth(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("inspect") / "resnet50.pth"
    torch.save(seeded_torch_model("resnet50", perturb_bn=False).state_dict(), path)
    return path


def test_resnet50_lists_320_entries(resnet50_pth):
    result = _inspect(resnet50_pth, "--all")
    assert result.exit_code == 0, result.stderr
    assert "layer4.2.bn3.running_var" in result.stdout
    assert "tensors: 320" in result.stdout and "float32 ×267, int64 ×53" in result.stdout


def test_resnet50_json(resnet50_pth):
    result = _inspect(resnet50_pth, "--json")
    data = json.loads(result.stdout)
    state = torch.load(resnet50_pth, weights_only=True)
    assert data["count"] == 320 and data["format"] == "torch-zip"
    assert [t["name"] for t in data["tensors"]] == list(state)
    first = data["tensors"][0]
    assert first == {"name": "conv1.weight", "shape": [64, 3, 7, 7], "dtype": "float32",
                     "numel": 9408, "nbytes": 37632}
    assert data["parameters"] == sum(t.numel() for t in state.values())
    assert data["bytes"] == sum(t.numel() * t.element_size() for t in state.values())
    assert data["dtypes"] == {"float32": 267, "int64": 53}


def test_filter_limit_all(resnet50_pth):
    filtered = json.loads(_inspect(resnet50_pth, "--json", "--filter", r"^fc\.").stdout)
    assert [t["name"] for t in filtered["tensors"]] == ["fc.weight", "fc.bias"]
    assert filtered["total_tensors"] == 320
    limited = _inspect(resnet50_pth, "--limit", "3").stdout
    assert "bn1.bias" in limited and "bn1.running_mean" not in limited
    assert "317 more" in limited


def test_arch_lists_expected_tensors():
    data = json.loads(_inspect("--arch", "resnet50", "--json").stdout)
    names = [t["name"] for t in data["tensors"]]
    assert data["count"] == 267 and "layer1.0.down_sample_layer.1.moving_variance" in names
    assert "end_point.weight" in names and not any("running" in n for n in names)


def test_safetensors_without_torch_or_mindspore(tmp_path):
    from safetensors.torch import save_file

    path = tmp_path / "w.safetensors"
    save_file({"a": torch.ones(2, 3), "b": torch.zeros(4, dtype=torch.bfloat16)}, path,
              metadata={"origin": "test"})
    code = ("import json, sys; from ms_port.cli import main; "
            "sys.argv = ['ms-port', 'inspect', sys.argv[1], '--json']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules and 'mindspore' not in sys.modules")
    result = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                            text=True, check=True)
    data = json.loads(result.stdout)
    assert [(t["name"], t["dtype"]) for t in data["tensors"]] == [("a", "float32"),
                                                                   ("b", "bfloat16")]
    assert data["metadata"] == {"origin": "test"}


def test_command_exits_early_with_its_status_and_all_its_output(tmp_path):
    """``ms-port`` skips the interpreter's teardown (cli.run): its output must still be
    complete when piped, and its exit status the command's."""
    path = tmp_path / "w.pth"
    torch.save({f"layer{i}.weight": torch.ones(i + 1) for i in range(600)}, path)
    command = [sys.executable, "-m", "ms_port"]
    ok = subprocess.run([*command, "inspect", str(path), "--json"], capture_output=True,
                        text=True, timeout=120)
    assert ok.returncode == 0 and len(ok.stdout) > 65536  # more than a pipe holds
    assert len(json.loads(ok.stdout)["tensors"]) == 600
    bad = subprocess.run([*command, "inspect", str(tmp_path / "missing.pth")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "missing.pth" in bad.stderr
    other = tmp_path / "v.pth"
    torch.save({f"layer{i}.weight": torch.ones(i + 1) * (i != 7) for i in range(600)}, other)
    differs = subprocess.run([*command, "diff", str(path), str(other)],
                             capture_output=True, text=True, timeout=120)
    assert differs.returncode == 1 and "layer7.weight" in differs.stdout
    # an atexit handler registered before the command (a coverage hook) still runs
    marker = tmp_path / "atexit-ran"
    code = ("import atexit, pathlib, sys; from ms_port.cli import run\n"
            "atexit.register(pathlib.Path(sys.argv[1]).touch)\n"
            "sys.argv = ['ms-port', 'inspect', sys.argv[2]]\nrun()")
    early = subprocess.run([sys.executable, "-c", code, str(marker), str(path)],
                           capture_output=True, text=True, timeout=120)
    assert early.returncode == 0 and marker.exists()


def test_help_imports_no_framework():
    code = ("import sys; from ms_port.cli import main; sys.argv = ['ms-port', '--help']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules and 'mindspore' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64, torch.int8])
def test_safetensors_and_sharded_data_bit_exact(tmp_path, dtype):
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(0)
    shard1 = {"x.weight": (torch.randn(3, 4, generator=gen) * 10).to(dtype)}
    shard2 = {"y.bias": (torch.randn(5, generator=gen) * 10).to(dtype)}
    save_file(shard1, tmp_path / "m-1.safetensors")
    save_file(shard2, tmp_path / "m-2.safetensors")
    index = tmp_path / "m.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"x.weight": "m-1.safetensors",
                                                "y.bias": "m-2.safetensors"}}))
    source = read_source(index)
    assert source.format == "safetensors-sharded" and list(source.tensors) == ["x.weight",
                                                                                "y.bias"]
    for name, tensor in {**shard1, **shard2}.items():
        assert source[name].load().tobytes() == torch_to_numpy(tensor).tobytes()


def test_mindspore_ckpt(tmp_path):
    import mindspore as ms

    path = tmp_path / "m.ckpt"
    ms.save_checkpoint([
        {"name": "w", "data": ms.Tensor(np.ones((2, 3), np.float32))},
        {"name": "h", "data": ms.Tensor(np.ones(4, np.float32), dtype=ms.bfloat16)},
        {"name": "step", "data": ms.Tensor(np.array(7, np.int64))},
    ], str(path))
    data = json.loads(_inspect(path, "--json").stdout)
    assert data["format"] == "mindspore-ckpt"
    assert [(t["name"], t["shape"], t["dtype"]) for t in data["tensors"]] == [
        ("w", [2, 3], "float32"), ("h", [4], "bfloat16"), ("step", [], "int64")]


@pytest.mark.parametrize(("wrap", "unwrapped", "stripped", "skipped"), [
    (lambda sd: {"state_dict": {f"module.{k}": v for k, v in sd.items()}, "epoch": 3,
                 "optimizer": {"lr": 0.1}},
     ["state_dict"], ["module."], {"epoch", "optimizer"}),
    (lambda sd: {"model_state_dict": sd, "args": {"lr": 0.1}}, ["model_state_dict"], [],
     {"args"}),
    (lambda sd: {"ema": {f"_orig_mod.module.{k}": v for k, v in sd.items()}},
     ["ema"], ["_orig_mod.", "module."], set()),
    (lambda sd: {**sd, "note": "hello"}, [], [], {"note"}),
])
def test_containers_are_unwrapped_and_reported(tmp_path, wrap, unwrapped, stripped, skipped):
    state = {"fc.weight": torch.ones(2, 2), "fc.bias": torch.zeros(2)}
    path = tmp_path / "wrapped.pth"
    torch.save(wrap(state), path)
    data = json.loads(_inspect(path, "--json").stdout)
    assert [t["name"] for t in data["tensors"]] == ["fc.weight", "fc.bias"]
    assert data["unwrapped"] == unwrapped and data["stripped"] == stripped
    assert {s["name"] for s in data["skipped"]} == skipped
    table = _inspect(path).stdout
    for word in unwrapped + stripped + sorted(skipped):
        assert word in table


def test_namespace_args_need_the_unsafe_opt_in(tmp_path):
    """An argparse.Namespace is code-bearing pickle territory: refused by default."""
    path = tmp_path / "ckpt.pth"
    torch.save({"model": {"w": torch.ones(1)}, "args": argparse.Namespace(lr=0.1)}, path)
    result = _inspect(path)
    assert result.exit_code == 2 and "--unsafe-pickle" in result.stderr
    with pytest.warns(UserWarning, match="any code inside the file runs"):
        report = ms_port.inspect(path, unsafe_pickle=True)
    assert [t.name for t in report.tensors] == ["w"]
    assert [s.name for s in report.skipped] == ["args"]


def _corrupt_header(path: Path) -> None:
    path.write_bytes(struct.pack("<Q", 20) + b'{"a": {"dtype": "F3' + b"\0" * 8)


def _offsets_past_end(path: Path) -> None:
    header = json.dumps({"a": {"dtype": "F32", "shape": [1000],
                               "data_offsets": [0, 4000]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 16)


def _gigantic_header(path: Path) -> None:
    path.write_bytes(struct.pack("<Q", 2**62) + b"{" + b"\0" * 64)


def _truncated_zip(path: Path, source: Path) -> None:
    path.write_bytes(source.read_bytes()[: source.stat().st_size // 2])


def _truncated_ckpt(path: Path) -> None:
    import mindspore as ms

    full = path.with_name("full.ckpt")
    ms.save_checkpoint({"w": np.ones((64, 64), np.float32)}, str(full))
    path.write_bytes(full.read_bytes()[:1000])


BAD = {
    "missing": (lambda p, s: None, "no such file"),
    "directory": (lambda p, s: p.mkdir(), "is a directory"),
    "empty": (lambda p, s: p.write_bytes(b""), "is empty"),
    # seeded, and led by a byte no format starts with (0x0A would look like a .ckpt)
    "random-bytes": (lambda p, s: p.write_bytes(b"\xf3" + np.random.default_rng(0).bytes(4095)),
                     "not a checkpoint"),
    "truncated-zip": (_truncated_zip, "truncated or corrupt"),
    "corrupt-safetensors-header": (lambda p, s: _corrupt_header(p), "invalid safetensors"),
    "safetensors-offsets-past-end": (lambda p, s: _offsets_past_end(p), "invalid safetensors"),
    "safetensors-gigantic-header": (lambda p, s: _gigantic_header(p), "invalid safetensors"),
    "truncated-ckpt": (lambda p, s: _truncated_ckpt(p), "truncated"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_line_exit_2(tmp_path, resnet50_pth, case):
    make, message = BAD[case]
    path = tmp_path / ("bad.safetensors" if "safetensors" in case else "bad.bin")
    make(path, resnet50_pth)
    result = _inspect(path)
    assert result.exit_code == 2, (case, result.stdout, result.stderr)
    first, *rest = result.stderr.strip().splitlines()
    assert str(path) in first and message in first, first
    assert rest == ["(run with --debug for the traceback)"]
    assert "Traceback" not in result.stderr
    debug = CliRunner().invoke(main, ["--debug", "inspect", str(path)])
    assert debug.exit_code != 0 and isinstance(debug.exception, ms_port.MsPortError)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_file(tmp_path):
    path = tmp_path / "locked.pth"
    path.write_bytes(b"PK")
    path.chmod(0)
    result = _inspect(path)
    assert result.exit_code == 2 and "permission denied" in result.stderr


def test_zip_member_crc_damage_is_caught(tmp_path):
    path = tmp_path / "s.pth"
    torch.save({"w": torch.arange(1000, dtype=torch.float32)}, path)
    with zipfile.ZipFile(path) as zf:
        info = next(i for i in zf.infolist() if i.filename.endswith("data/0"))
    data = bytearray(path.read_bytes())
    data[info.header_offset + 200] ^= 0xFF  # inside the tensor's bytes
    path.write_bytes(bytes(data))
    result = _inspect(path)
    assert result.exit_code == 2 and "corrupt" in result.stderr


def test_sharded_pytorch_set(tmp_path):
    """pytorch_model.bin.index.json: shards read one by one, strays reported."""
    torch.save({"a.weight": torch.ones(2, 2)}, tmp_path / "pytorch_model-1.bin")
    torch.save({"b.bias": torch.zeros(3), "stray": torch.ones(1)},
               tmp_path / "pytorch_model-2.bin")
    index = tmp_path / "pytorch_model.bin.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": {
        "a.weight": "pytorch_model-1.bin", "b.bias": "pytorch_model-2.bin"}}))
    data = json.loads(_inspect(index, "--json").stdout)
    assert data["format"] == "torch-sharded"
    assert [t["name"] for t in data["tensors"]] == ["a.weight", "b.bias"]
    assert [s["name"] for s in data["skipped"]] == ["pytorch_model-2.bin:stray"]
    broken = tmp_path / "broken.index.json"
    broken.write_text(json.dumps({"weight_map": {"a.weight": "missing.bin"}}))
    result = _inspect(broken)
    assert result.exit_code == 2 and "missing.bin: no such file" in result.stderr
