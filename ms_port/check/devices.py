"""Devices, dtypes and forward passes for both frameworks, with failures that say where.

A forward that fails is run again with hooks on every layer to name the innermost one
that raised. An operator MindSpore has no kernel for on the chosen device ("Unsupported
op [InstanceNorm] on CPU", "The kernel Conv2DExt unregistered") is bad input, not a
mismatch: it becomes a :class:`~ms_port.errors.DeviceError` (exit 2) naming the op, the
cell and the device, with MindSpore's own reason.
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ..errors import DeviceError, ParityError

if TYPE_CHECKING:
    from collections.abc import Iterator

#: user-facing device name -> torch device type (None: PyTorch cannot run there)
TORCH_DEVICES: dict[str, str | None] = {"cpu": "cpu", "gpu": "cuda", "cuda": "cuda",
                                         "ascend": None}
#: user-facing device name -> MindSpore device target
MS_DEVICES = {"cpu": "CPU", "gpu": "GPU", "ascend": "Ascend"}
#: how MindSpore says it has no kernel for an operator (the op is the first group)
_NO_KERNEL = (re.compile(r"Unsupported op \[(\w+)\] on (\w+)"),
              re.compile(r"[Tt]he kernel (\w+) unregistered"),
              re.compile(r"kernel for (\w+) is not (?:registered|supported)"))


#: oneDNN (MindSpore's and PyTorch's CPU kernels) reads one of these once, at its first
#: operation; the ONEDNN_ name wins over the older DNNL_ one
ISA_VARS = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")
ONEDNN_ISA = ISA_VARS[0]
#: ``dnnl_cpu_isa_avx2`` in oneDNN 3's ``dnnl_cpu_isa_t``, a bit mask: higher levels add bits
_ISA_AVX2 = 0x7


def _isa_choice() -> tuple[str, str] | None:
    """(variable, value) of the instruction-set limit set in the environment, if any."""
    for var in ISA_VARS:
        if os.environ.get(var):
            return var, os.environ[var]
    return None


def prefer_fast_cpu_kernels() -> bool:
    """Cap oneDNN at AVX2 for this process unless an instruction-set limit is already set
    (``ONEDNN_MAX_CPU_ISA`` or ``DNNL_MAX_CPU_ISA``); True if this call set it.

    MindSpore 2.10 hands oneDNN its convolutions in the plain NCHW layout. On an AVX-512
    CPU oneDNN 3.10 then picks ``jit_uni_ncsp:conv+ref:any``, its reference kernel: a
    3×3 convolution of 64 channels at 56×56 takes 400 ms. Capped at AVX2 it picks a GEMM
    kernel: 4 ms, and a float32 result of the same quality (ResNet50's MindSpore forward
    5.3 s -> 0.7 s, VGG16's 26 s -> 0.3 s; PyTorch's forward 61 -> 76 ms). The cap only
    takes effect if set before the process's first oneDNN operation, so the CLI sets it
    at start; in a notebook call this before anything runs MindSpore on the CPU (the
    report says whether it took effect)."""
    if _isa_choice():
        return False
    os.environ[ONEDNN_ISA] = "AVX2"
    return True


def effective_isa() -> int | None:
    """The instruction set MindSpore's oneDNN uses (a ``dnnl_cpu_isa_t``), asked of its own
    library; None where it cannot be asked."""
    import ctypes
    from pathlib import Path

    try:
        import mindspore

        library = ctypes.CDLL(str(Path(mindspore.__file__).parent / "lib" / "libdnnl.so.3"))
        query = library.dnnl_get_effective_cpu_isa
    except (ImportError, OSError, AttributeError):
        return None
    query.restype, query.argtypes = ctypes.c_int, []
    return int(query())


def _avx512() -> bool:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            return any(line.startswith("flags") and " avx512f" in line for line in f)
    except OSError:  # not Linux: say nothing rather than guess
        return False


def cpu_kernels_note() -> str | None:
    """What the report says about the CPU kernels' instruction set, where it matters:
    the limit in force, or that it came too late to apply, or how to set one."""
    choice = _isa_choice()
    if choice:
        var, value = choice
        effective = effective_isa()
        if value.upper() == "AVX2" and effective is not None and effective & ~_ISA_AVX2:
            return (f"{var}={value} was set after oneDNN's first operation in this "
                    "process, so MindSpore's CPU kernels ignored it (its convolutions may "
                    "have run oneDNN's reference kernel, up to 100x slower): set it before "
                    "MindSpore's first CPU operation")
        return f"MindSpore's CPU kernels: oneDNN limited to {value} ({var})"
    if _avx512():
        return (f"MindSpore's CPU convolutions may have run oneDNN's reference kernel on "
                f"this AVX-512 CPU (up to 100x slower): set {ONEDNN_ISA}=AVX2 before "
                "MindSpore's first operation, as the ms-port command does")
    return None


def first_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip() and set(ln.strip()) != {"-"}]
    text = lines[0].rstrip(".") if lines else ""
    return f"{type(exc).__name__}: {text}".rstrip(": ")


def torch_device(device: str) -> Any:
    import torch

    key = device.lower()
    if key not in TORCH_DEVICES:
        raise DeviceError(f"PyTorch side: unknown device {device!r}; choose one of: cpu, gpu",
                          side="torch", device=device)
    kind = TORCH_DEVICES[key]
    if kind is None:
        raise DeviceError(
            f"PyTorch side: device {device!r} is not supported for the PyTorch reference "
            "(PyTorch runs on cpu or a CUDA gpu here); pass torch_device='cpu' or 'gpu' and "
            "keep ms_device='ascend' for the MindSpore side", side="torch", device=device)
    if kind == "cuda" and not torch.cuda.is_available():
        raise DeviceError(
            "PyTorch side: no CUDA device available (torch.cuda.is_available() is False; "
            f"torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'}); "
            "pass torch_device='cpu'", side="torch", device=device)
    return torch.device(kind)


def set_ms_device(device: str) -> None:
    import mindspore

    key = device.lower()
    if key not in MS_DEVICES:
        raise DeviceError(f"MindSpore side: unknown device {device!r}; choose one of: "
                          f"{', '.join(MS_DEVICES)}", side="mindspore", device=device)
    target = MS_DEVICES[key]
    if mindspore.get_context("device_target") == target:
        return
    set_device = getattr(mindspore, "set_device", None)
    try:
        if set_device is not None:
            set_device(target)
        else:  # MindSpore < 2.5
            mindspore.set_context(device_target=target)
    except (RuntimeError, ValueError) as exc:
        found = re.search(r"supports one of the \[([^\]]*)\]", str(exc))
        supported = found.group(1).replace("'", "") if found else "see the MindSpore error"
        raise DeviceError(
            f"MindSpore side: device {target} not supported by this MindSpore build (it "
            f"supports {supported}); install a MindSpore build for {target} "
            f"(https://www.mindspore.cn/install) or pass ms_device='cpu'",
            side="mindspore", device=device) from exc


def release_ms_pool() -> bool:
    """Hand the memory MindSpore's pool keeps after its tensors are freed back to the
    system (``mindspore.runtime.empty_cache``); True where it could. Measured on a CPU: a
    512 MiB weight run once and deleted stayed resident until this was called."""
    import mindspore as ms

    empty = getattr(getattr(ms, "runtime", None), "empty_cache", None)
    if empty is None:  # pragma: no cover - MindSpore < 2.5
        return False
    try:
        empty()
    except RuntimeError:  # pragma: no cover - a backend without a pool to empty
        return False
    return True


def ms_device_name() -> str:
    import mindspore

    return str(mindspore.get_context("device_target"))


def torch_variant(model: Any, dtype: Any, device: Any) -> Any:
    """``model`` itself if already in ``dtype`` on ``device``, else a converted copy (the
    caller's model is never cast or moved behind their back)."""
    floats = [t for t in [*model.parameters(), *model.buffers()] if t.is_floating_point()]
    if all(t.dtype == dtype and t.device.type == device.type for t in floats):
        return model
    return copy.deepcopy(model).to(device=device, dtype=dtype)


@contextlib.contextmanager
def strict_fp32(device: Any) -> Iterator[None]:
    """TF32 off on CUDA while comparing: cuDNN uses it by default (~1e-3 error alone)."""
    import torch

    if device.type != "cuda":
        yield
        return
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@contextlib.contextmanager
def ms_params_as(ms_model: Any, dtype: Any) -> Iterator[None]:
    """Cast the cell's floating-point parameters to ``dtype``, restored afterwards
    (float32 -> float64 -> float32 is exact; bf16/fp16 checkpoints compute in float32)."""
    import mindspore

    floats = set(mindspore.common.dtype.float_type)
    changed = []
    try:
        for _, param in ms_model.parameters_and_names():
            if param.dtype in floats and param.dtype != dtype:
                changed.append((param, param.dtype))
                param.set_dtype(dtype)
        yield
    finally:
        for param, original in changed:
            param.set_dtype(original)


@contextlib.contextmanager
def ms_pynative() -> Iterator[None]:
    """Cell hooks run only in PyNative mode; switch there for the duration."""
    import mindspore

    mode = mindspore.get_context("mode")
    if mode == mindspore.PYNATIVE_MODE:
        yield
        return
    mindspore.set_context(mode=mindspore.PYNATIVE_MODE)
    try:
        yield
    finally:
        mindspore.set_context(mode=mode)


def torch_forward(model: Any, inputs: list[np.ndarray], device: Any, dtype: Any = None) -> Any:
    import torch

    with torch.no_grad():
        # fresh tensors per run: a model may modify its input in place
        args = [torch.tensor(x, device=device) for x in inputs]
        if dtype is not None:
            args = [a.to(dtype) if a.is_floating_point() else a for a in args]
        return model(*args)


def ms_forward(model: Any, inputs: list[np.ndarray]) -> Any:
    import mindspore

    return model(*[mindspore.Tensor(x) for x in inputs])


def _innermost_failing(named: list[tuple[str, Any]], register: Callable[[Any, Any, Any], Any],
                       run: Callable[[], Any]) -> str | None:
    """Re-run with pre/post hooks everywhere; the innermost open layer when it raised."""
    names = {id(m): n for n, m in named}
    stack: list[str] = []
    handles = []

    def pop(_layer: Any, _args: Any, _output: Any) -> None:  # None keeps the output as is
        stack.pop()

    for _, layer in named:
        handles += register(layer, lambda m, args: stack.append(names.get(id(m), "?")), pop)
    try:
        run()
    except Exception:  # the failure being located; its message is reported by the caller
        return stack[-1] if stack else None
    finally:
        for handle in handles:
            handle.remove()
    return None


def _place(side: str, name: str | None) -> str:
    if name is None:
        return ""
    return f" in {side} {'the top-level network' if name == '' else repr(name)}"


def run_torch(model: Any, inputs: list[np.ndarray], device: Any, what: str,
              convert: Callable[[Any], Any], dtype: Any = None) -> Any:
    """Forward and convert the output; a failure names the innermost module."""
    try:
        return convert(torch_forward(model, inputs, device, dtype))
    except Exception as exc:
        place = _innermost_failing(
            list(model.named_modules()),
            lambda m, pre, post: [m.register_forward_pre_hook(pre), m.register_forward_hook(post)],
            lambda: torch_forward(model, inputs, device, dtype))
        raise ParityError(f"PyTorch {what} failed{_place('module', place)}: {first_line(exc)}; "
                          "check that the model matches the inputs and the checkpoint",
                          side="torch") from exc


def run_ms(model: Any, inputs: list[np.ndarray], dtype: str,
           convert: Callable[[Any], Any]) -> Any:
    """Forward and convert the output (MindSpore reports kernel errors lazily, on first
    use of the result); a failure names the innermost cell, and a missing kernel is a
    :class:`DeviceError`."""
    try:
        return convert(ms_forward(model, inputs))
    except DeviceError:
        raise
    except Exception as exc:
        text = str(exc)
        with ms_pynative():
            place = _innermost_failing(
                list(model.cells_and_names()),
                lambda c, pre, post: [c.register_forward_pre_hook(pre),
                                      c.register_forward_hook(post)],
                lambda: convert(ms_forward(model, inputs)))
        where = _place("cell", place)
        device = ms_device_name()
        for pattern in _NO_KERNEL:
            found = pattern.search(text)
            if found:
                op = found.group(1)
                if dtype == "float64" and "Float64" in text:
                    break
                raise DeviceError(
                    f"MindSpore has no {device} kernel for {op}{where}: "
                    f"{first_line(exc).split(': ', 1)[-1]}; run on a device that has one "
                    "(--ms-device), or use a layer with a kernel here (mindspore.nn rather "
                    "than mindspore.mint on CPU)", side="mindspore", device=device, op=op,
                    cell=place) from exc
        if dtype == "float64" and "Float64" in text:
            found = re.search(r"primitive\[(\w+)\]", text) or re.search(r"\[(\w+)\]", text)
            op = found.group(1) if found else "an operator"
            raise ParityError(
                f"dtype float64: MindSpore's {device} kernel for {op} has no float64 "
                f"implementation{where}; run the comparison with dtype='float32'",
                side="mindspore", op=op, cell=place) from exc
        raise ParityError(f"MindSpore forward failed{where}: {first_line(exc)}; check that "
                          "the network matches the inputs and the checkpoint",
                          side="mindspore", cell=place) from exc
