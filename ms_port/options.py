"""The options of a command, one frozen dataclass each: the single source of truth for
their names, defaults and help. The library's functions keep their keyword arguments
for notebook users and pack them into the object at once; the steps below take the
object, never the options one by one; a test holds the CLI's flags against the fields
(every field a flag, every flag a field, the same default).

Considered: driving click from the dataclass (as Hugging Face's ``HfArgumentParser``
drives argparse from ``TrainingArguments``), and ``click-option-group``/``typer``. The CLI
declares flags with their own parsing (``--input-shape 3,224,224``, repeatable
``--ms-option k=v``, path checks), which a generated flag would lose; so the flags stay
declared, and the test keeps them equal to the fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any


def _opt(default: Any, help: str, flag: str | None = None) -> Any:
    """A field with its default, its help, and its CLI flag where the name is not the
    field's (``None``: ``--field-name``; ``""``: no flag, the library's only)."""
    return field(default=default, metadata={"help": help, "flag": flag})


class _Options:
    @classmethod
    def names(cls) -> list[str]:
        """The fields' names: the library function's keywords."""
        return [f.name for f in fields(cls)]  # type: ignore[arg-type]


@dataclass(frozen=True)
class SourceOptions(_Options):
    """How a PyTorch checkpoint (or a Hugging Face id) is read: shared by every command
    that reads one (flags ``--key``, ``--unsafe-pickle``, ``--revision``)."""

    key: str | None = _opt(None, "the state dict's key inside the checkpoint")
    unsafe_pickle: bool = _opt(False, "unpickle arbitrary objects (trusted files only)")
    revision: str | None = _opt(None, "a Hugging Face id's branch, tag or commit")

    def reading(self) -> dict[str, Any]:
        """The reader's keywords (:func:`ms_port.read.sources.read_source`)."""
        return {"key": self.key, "unsafe_pickle": self.unsafe_pickle,
                "revision": self.revision}


@dataclass(frozen=True)
class ClusterOptions(_Options):
    """How a distributed training output is read (a folder of ``rank_N/`` folders): shared
    by every command that reads a MindSpore checkpoint (``--strategy``, ``--step``)."""

    strategy: Any = _opt(None, "a training output's strategy file or folder (default: "
                               "strategy/ beside checkpoint/)")
    step: str | None = _opt(None, "a training output's save to read: STEP or EPOCH_STEP "
                                  "(default: the latest)")

    def cluster(self) -> dict[str, Any]:
        """The reader's keywords for a training output."""
        return {"strategy": self.strategy, "step": self.step}


@dataclass(frozen=True)
class InspectOptions(ClusterOptions, SourceOptions):
    """What ``inspect`` lists (see :func:`ms_port.inspect`)."""

    arch: str | None = _opt(None, "instead of a file, a registered architecture")
    filter: str | None = _opt(None, "only tensors whose name matches this regex")


@dataclass(frozen=True)
class DiffOptions(ClusterOptions, SourceOptions):
    """What ``diff`` compares through (see :func:`ms_port.diff`)."""

    arch: str | None = _opt(None, "the MindSpore side: a registered architecture")
    ms_model: Any = _opt(None, "the MindSpore side: a Cell factory, or a family")
    mapping: Any = _opt(None, "extra mapping table(s)", "--map")
    config: Any = _opt(None, "the model's config.json (or a dict)")
    ms_options: dict[str, Any] | None = _opt(None, "a known family's options", "--ms-option")


@dataclass(frozen=True)
class ConvertOptions(SourceOptions):
    """What ``convert`` writes and how strictly (see :func:`ms_port.convert`)."""

    output: Any = _opt(None, "the file (or, with max_shard_size, the directory) to write")
    arch: str | None = _opt(None, "the target: a registered architecture")
    target: Any = _opt(None, "the target: a template MindSpore checkpoint")
    ms_model: Any = _opt(None, "the target: a Cell factory, mindcv:NAME, or a family")
    mapping: Any = _opt(None, "extra mapping table(s)", "--map")
    format: str | None = _opt(None, "ckpt or safetensors (default: from the output's suffix, "
                                    "else ckpt)")
    dtype: str | None = _opt(None, "cast floating-point tensors (float32/float16/bfloat16)")
    force: bool = _opt(False, "replace an existing output once the new one is verified")
    dry_run: bool = _opt(False, "stop after the plan; write nothing")
    save_map: Any = _opt(None, "write the plan as a mapping YAML")
    allow_missing: bool = _opt(False, "write even if target tensors are unfilled")
    allow_unused: bool = _opt(False, "write even if source tensors are unused")
    allow_shape_match: bool = _opt(False, "fill leftovers by equal shape, in order")
    check_finite: bool = _opt(False, "refuse weights holding NaN/Inf")
    crc: bool = _opt(False, "append MindSpore's CRC trailer")
    align: bool = _opt(True, "pair the layers names leave unpaired by structure",
                       "--no-align")
    config: Any = _opt(None, "the model's config.json (or a dict)")
    ms_options: dict[str, Any] | None = _opt(None, "a known family's options", "--ms-option")
    max_shard_size: Any = _opt(None, "write shards of at most this size (2GB)")
    strategy: Any = _opt(None, "write the per-rank slices this strategy gives: the output "
                               "is a folder of rank_N/")
    model_config: Any = _opt(None, "also write MindFormers' YAML here")
    training_state: bool = _opt(False, "also write the optimizer's state and counters "
                                       "(a Trainer checkpoint-N/ folder's) for resuming")



@dataclass(frozen=True)
class ExportOptions(ClusterOptions):
    """What ``export`` writes back to PyTorch (see :func:`ms_port.export`)."""

    output: Any = _opt(None, "the .pth or .safetensors file (or model directory) to write")
    arch: str | None = _opt(None, "the PyTorch side: a registered architecture")
    torch_model: Any = _opt(None, "the PyTorch side: module:callable building the network")
    target: Any = _opt(None, "the PyTorch side: a template .pth/.safetensors file")
    ms_model: Any = _opt(None, "the MindSpore network, so rules know its layer types")
    mapping: Any = _opt(None, "extra mapping table(s), written PyTorch -> MindSpore", "--map")
    format: str | None = _opt(None, "pth or safetensors (default: from the output's suffix)")
    dtype: str | None = _opt(None, "cast floating-point tensors")
    force: bool = _opt(False, "replace an existing output once the new one is verified")
    dry_run: bool = _opt(False, "stop after the plan; write nothing")
    allow_missing: bool = _opt(False, "write even if PyTorch tensors are unfilled")
    allow_unused: bool = _opt(False, "write even if checkpoint tensors are unused")
    config: Any = _opt(None, "a Hugging Face model's config.json: write a model directory")
    max_shard_size: Any = _opt(None, "write shards of at most this size")
    ms_options: dict[str, Any] | None = _opt(None, "the options of a known --ms-model "
                                                   "family it was converted with",
                                             "--ms-option")
    training_state: bool = _opt(False, "also write the Trainer's optimizer.pt, scheduler.pt "
                                       "and trainer_state.json from the checkpoint's state")
    train_config: Any = _opt(None, "the MindFormers YAML the run trained with (its "
                                   "optimizer and lr_schedule)")



@dataclass(frozen=True)
class VerifyOptions(ClusterOptions, SourceOptions):
    """What ``verify`` compares and how (see :func:`ms_port.verify`)."""

    arch: str | None = _opt(None, "a registered architecture: both networks")
    torch_model: Any = _opt(None, "the PyTorch network: module:callable, timm:NAME, "
                                  "torchvision:NAME, or a built one")
    ms_model: Any = _opt(None, "the MindSpore network: module:callable, mindcv:NAME, a "
                               "family (mindformers:llama), or a built one")
    mapping: Any = _opt(None, "the mapping table(s) used for the conversion", "--map")
    tol: float = _opt(1e-5, "the smallest bound on each output's and layer's error")
    seed: int = _opt(0, "the seed of generated inputs")
    batch: int = _opt(1, "the batch of generated inputs")
    input_shape: Any = _opt(None, "one input shape, or a list, one per input")
    inputs: Any = _opt(None, "a file of real inputs, or arrays", "--input")
    input_dtype: Any = _opt(None, "the generated inputs' dtypes")
    input_range: Any = _opt(None, "the generated inputs' (low, high) ranges")
    dtype: str = _opt("float32", "float32 or float64, both sides")
    device: str = _opt("cpu", "cpu, gpu or ascend, both sides")
    torch_device: str | None = _opt(None, "the PyTorch side's device, over --device")
    ms_device: str | None = _opt(None, "the MindSpore side's device, over --device")
    noise_floor: bool = _opt(True, "also run PyTorch in float64 for the per-tensor noise",
                             "--no-noise-floor")
    report: Any = _opt(None, "also write a self-contained HTML report there")
    force: bool = _opt(False, "replace an existing report")
    config: Any = _opt(None, "the model's config.json (or a dict)")
    ms_options: dict[str, Any] | None = _opt(None, "a known family's options", "--ms-option")
    mode: str = _opt("auto", "whole, layers or auto (by the memory)")
    training_state: bool = _opt(False, "check the optimizer state instead: one AdamW step "
                                       "on each side from each side's state")



__all__ = ["ClusterOptions", "ConvertOptions", "DiffOptions", "ExportOptions", "InspectOptions",
           "SourceOptions", "VerifyOptions"]
