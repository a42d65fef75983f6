"""MindFormers' model YAML for a converted language model (``convert --model-config``).

After ``--ms-model mindformers:llama`` the user still needs MindFormers' ``model_config``.
ms-port has computed every number of the network from ``config.json``
(:func:`ms_port.archs.llama.family.model_settings`); this module writes them as a
MindFormers YAML that ``run_mindformer.py --config`` takes: ``model.model_config``
(``type: LlamaConfig``, the sizes, RoPE, biases, layout, tied head, token ids, positions),
``model.arch`` (``LlamaForCausalLM``) and ``load_checkpoint`` (the converted file).

Device and run settings (dtypes, fused kernels, lengths, parallelism, the tokenizer) stay
the user's: they are written as commented lines, with the values ms-port tests the file
with (a CPU, float32: :data:`~ms_port.archs.llama.family.CPU_SETTINGS`).

The text is assembled from ``yaml.safe_dump`` of each value, never from formatted values;
comments quoting the config are made single-line and inert. The file is written like any
output (no replacing without ``force``, atomic) and read back: its ``model_config`` must be
exactly the one computed.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..errors import TargetError, WriteError, shown
from ..text import visible
from .writers import check_not_input, check_output, write_text

#: the target of :func:`mindformers_yaml`
FAMILY = "mindformers:llama"
#: the targets whose configuration ms-port writes: spec -> its writer, which takes the
#: config, the family's layout options and where the checkpoint is (imported when used)
YAML_FAMILIES = {"mindformers:llama": "ms_port.write.model_config:mindformers_yaml",
                 "mindformers:glm4": "ms_port.write.model_config_glm:glm4_yaml",
                 "mindformers:deepseek4":
                     "ms_port.write.model_config_deepseek4:deepseek4_yaml"}
#: id range a token id may take in config.json (MindSpore's int32 token ids)
_ID_RANGE = (-(2**31), 2**31 - 1)
#: the run settings' example input length, when config.json allows more
_EXAMPLE_LENGTH = 2048
#: hints beside the commented run settings (the value shown is ms-port's tested one)
_HINTS = {
    "use_past": "true: incremental decoding for generation",
    "use_flash_attention": "Ascend's fused attention",
    "fused_rms_norm": "Ascend's fused kernel",
    "compute_dtype": "bfloat16 or float16 on Ascend",
    "param_init_type": "the dtype the weights load in",
}


@dataclass(frozen=True)
class MindFormersYaml:
    """A MindFormers YAML, ready to write.

    Attributes:
        text: the file's text.
        model_config: what ``model.model_config`` holds once loaded (``type`` included).
        notes: what the conversion report should say about it (a RoPE scaling left out).
    """

    text: str
    model_config: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    #: ``model.arch.type``
    arch: str = "LlamaForCausalLM"


@dataclass(frozen=True)
class ModelConfigFile:
    """A written MindFormers YAML.

    Attributes:
        path: the file.
        model_config: ``model.model_config`` as written (read back equal).
        notes: what it leaves out or changes, and why.
        replaced: an existing file was replaced (``force``).
        readback: ``"identical"`` once the file was loaded back and its model matched.
    """

    path: str
    model_config: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    replaced: bool = False
    readback: str = "identical"

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "model_config": dict(self.model_config),
                "notes": list(self.notes), "replaced": self.replaced,
                "readback": self.readback}


def _comment(text: str, indent: int = 0, width: int = 92) -> list[str]:
    """``# `` lines, wrapped: ``text`` may quote a config (made inert: one line, no
    control characters)."""
    pad = " " * indent
    return textwrap.wrap(visible(text), width=width - indent - 2, initial_indent=f"{pad}# ",
                         subsequent_indent=f"{pad}# ", break_on_hyphens=False)


def _dump(key: str, value: Any, indent: int = 0, note: str | None = None) -> list[str]:
    """``key: value`` as YAML (safe_dump: quoted as needed), indented, with ``note``
    after a scalar on the same line."""
    flow = None if isinstance(value, list) else False  # [1, 2] inline, mappings as blocks
    text = yaml.safe_dump({key: value}, sort_keys=False, default_flow_style=flow,
                          width=4096, allow_unicode=False)
    lines = [" " * indent + line for line in text.rstrip("\n").split("\n")]
    if note and len(lines) == 1:
        lines[0] += f"  # {visible(note)}"
    return lines


def _token_id(config: dict[str, Any], key: str, *, many: bool = False) -> Any:
    """``config[key]``: None, an integer token id or (``many``) a list of them."""
    value = config.get(key)
    ids = value if many and isinstance(value, list) else [value]
    if value is None or all(isinstance(i, int) and not isinstance(i, bool)
                            and _ID_RANGE[0] <= i <= _ID_RANGE[1] for i in ids):
        return value
    raise TargetError(f"config.json: {key} is {shown(value)}; expected a token id (an integer)"
                      + (" or a list of them" if many else ""))


def _positions(config: dict[str, Any]) -> int | None:
    value = config.get("max_position_embeddings")
    if value is None or (isinstance(value, int) and not isinstance(value, bool)
                         and 0 < value <= 2**31):
        return value
    raise TargetError(f"config.json: max_position_embeddings is {shown(value)}; expected a "
                      "positive integer")


def family_yaml(spec: str, config: dict[str, Any], options: dict[str, Any] | None,
                **where: Any) -> MindFormersYaml:
    """MindFormers' YAML for a family's network (:data:`YAML_FAMILIES`), with the layout
    ``options`` the checkpoint was converted with (``--ms-option``; the input length is
    the run's, not the layout's) and ``where`` (``checkpoint``, ``checkpoint_format``,
    ``origin``)."""
    import importlib

    from ..read.targets import family_options

    module, _, name = YAML_FAMILIES[spec].partition(":")
    layout = {k: v for k, v in family_options(spec, options).items() if k != "seq_length"}
    return getattr(importlib.import_module(module), name)(config, **layout, **where)


def mindformers_yaml(config: dict[str, Any], *, qkv_concat: bool = False,
                     checkpoint: str | Path | None = None, checkpoint_format: str = "ckpt",
                     origin: str = "config.json") -> MindFormersYaml:
    """MindFormers' YAML for the ``LlamaForCausalLM`` a Hugging Face config describes.

    Args:
        config: the model's ``config.json``.
        qkv_concat: the checkpoint's layout (``--ms-option qkv_concat=true``).
        checkpoint: the converted checkpoint (``load_checkpoint``; made absolute, since
            MindFormers reads it relative to the folder it runs in).
        checkpoint_format: ``ckpt`` or ``safetensors`` (a file, or a folder of shards).
        origin: where ``config`` was read, for the file's header.

    Returns:
        A :class:`MindFormersYaml`; nothing is written.

    Raises:
        TargetError: the config is not one ``mindformers:llama`` holds, or a token id or
            ``max_position_embeddings`` is not an integer.

    Example:
        >>> built = mindformers_yaml(json.load(open("tiny/config.json")), checkpoint="t.ckpt")
        >>> built.model_config["type"], built.model_config["pad_token_id"]
        ('LlamaConfig', -1)
    """
    from ..archs.llama.family import llama_sizes, model_settings

    sizes = llama_sizes(config)
    section = _Section({"type": "LlamaConfig"})
    notes: list[str] = []
    section.comment("computed by ms-port from config.json: the checkpoint's network. Change "
                    "these and the checkpoint no longer loads, or computes another function.")
    computed = model_settings(sizes, qkv_concat=qkv_concat)
    for key in ("hidden_size", "num_layers", "num_heads", "n_kv_heads", "vocab_size",
                "intermediate_size", "rms_norm_eps"):
        section.put(key, computed[key])
    _rope(section, sizes, computed, _positions(config), notes)
    for key in ("qkv_has_bias", "attn_proj_has_bias", "qkv_concat", "tie_word_embeddings"):
        section.put(key, computed[key])
    _token_ids(section, config, notes)
    _run_settings(section)
    where = Path(checkpoint).absolute() if checkpoint is not None else None
    text = "\n".join(_document(config, section.lines, where, checkpoint_format, origin)) + "\n"
    built = MindFormersYaml(text, section.values, notes)
    _check(text, built, where="the YAML ms-port built")  # a bug here never reaches a file
    return built


def finished(section: _Section, document: Any, *, arch: str, run: dict[str, Any],
             said: str, checkpoint: str | Path | None,
             notes: list[str] | None = None) -> MindFormersYaml:
    """A family's YAML once its computed keys are in ``section``: the run settings
    ``run`` (key -> (value, hint)) commented after ``said``, the whole file around it
    (``document(lines, where)``), and the check that it loads back to what was computed."""
    section.lines.append("")
    section.comment(said)
    for key, (value, hint) in run.items():
        section.lines.extend("    # " + line for line in _dump(key, value, 0, hint))
    where = Path(checkpoint).absolute() if checkpoint is not None else None
    text = "\n".join(document(section.lines, where)) + "\n"
    built = MindFormersYaml(text, section.values, notes or [], arch=arch)
    _check(text, built, where="the YAML ms-port built")  # a bug here never reaches a file
    return built


class _Section:
    """``model_config``'s lines (after ``type``) and the values they hold."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.lines: list[str] = []
        self.values = values

    def comment(self, text: str) -> None:
        self.lines.extend(_comment(text, 4))

    def put(self, key: str, value: Any, note: str | None = None,
            above: str | None = None) -> None:
        if above:
            self.comment(above)
        self.lines.extend(_dump(key, value, 4, note))
        self.values[key] = value


def _rope(section: _Section, sizes: Any, computed: dict[str, Any], longest: int | None,
          notes: list[str]) -> None:
    """The RoPE settings, with a warning where MindFormers cannot compute the scaling, and
    the table's length."""
    from ..archs.llama.family import positions

    rope = sizes.rope
    if rope.problem:
        why = (f"NOT COMPUTED: config.json's RoPE scaling {shown(rope.kind)} ({rope.key}). "
               f"MindFormers cannot compute it exactly ({rope.problem}), so extend_method is "
               "None: this network computes plain RoPE, another function than the "
               "checkpoint's model. The weights are right; the position encoding is not.")
        section.lines.extend(["    #", *_comment(f"WARNING — {why}", 4), "    #"])
        notes.append(f"model config: RoPE scaling {shown(rope.kind)} ({rope.key}) written as "
                     f"extend_method None: MindFormers cannot compute it exactly "
                     f"({rope.problem}); the network this file builds computes another "
                     "function than the checkpoint's model")
    section.put("theta", computed["theta"])
    section.put("extend_method", computed["extend_method"],
                note=None if rope.problem or rope.kind == "default"
                else f"config.json: {rope.kind}")
    section.put("scaling_factor", computed["scaling_factor"])
    if longest is None and rope.original is None:
        section.comment("config.json gives no max_position_embeddings: MindFormers sizes its "
                        "RoPE table to seq_length")
        return
    length = positions(sizes, longest or 0)
    raised = None if length == longest else (
        f"{length}, not config.json's max_position_embeddings ({longest}): MindFormers "
        "needs it above the RoPE scaling's original_max_position_embeddings "
        f"({rope.original}); the table's length does not change its values")
    section.put("max_position_embedding", length, above=raised,
                note=None if raised else "config.json: max_position_embeddings")


def _token_ids(section: _Section, config: dict[str, Any], notes: list[str]) -> None:
    """bos, eos and pad, with what MindFormers does with each where it differs."""
    from ..archs.llama.family import NO_PAD

    pad = _token_id(config, "pad_token_id")
    bos = _token_id(config, "bos_token_id")
    eos = _token_id(config, "eos_token_id", many=True)
    section.put("bos_token_id", bos,
                note="none in config.json (LlamaConfig's default: 1)" if bos is None else None)
    if eos is None:
        section.put("eos_token_id", [], note="none in config.json: generation stops at its "
                                             "length limit (LlamaConfig's default: 2)")
    else:
        section.put("eos_token_id", eos, note="MindFormers' generation stops at any of them"
                    if isinstance(eos, list) else None)
    if pad is None:
        section.put("pad_token_id", NO_PAD, above=(
            "config.json has no pad_token_id. MindFormers masks every token equal to "
            "pad_token_id in attention, transformers masks none: LlamaConfig's default 0 "
            f"would mask token 0, a real token; {NO_PAD} is no token's id, so every input "
            "computes what transformers computes. Padding batches? Put your tokenizer's "
            "pad id here."))
    else:
        section.put("pad_token_id", pad, above=(
            "from config.json. MindFormers masks every token equal to pad_token_id in "
            "attention (transformers masks none unless given an attention mask): an input "
            f"holding id {pad} computes what transformers computes with that mask."))
        notes.append(f"model config: pad_token_id {pad} (config.json): MindFormers masks "
                     "that id in attention, transformers only when given an attention mask")


def _run_settings(section: _Section) -> None:
    """The run settings ms-port tests the file with, commented: they are the user's."""
    from ..archs.llama.family import CPU_SETTINGS

    run = {"batch_size": 1, "seq_length": min(section.values.get("max_position_embedding")
                                              or _EXAMPLE_LENGTH, _EXAMPLE_LENGTH),
           **CPU_SETTINGS}
    section.lines.append("")
    section.comment("run settings: yours (MindFormers' defaults apply to those left "
                    "commented). ms-port tests this file on a CPU in float32 with:")
    for key, value in run.items():
        section.lines.extend("    # " + line for line in _dump(key, value, 0, _HINTS.get(key)))


def _document(config: dict[str, Any], model_lines: list[str], where: Path | None,
              checkpoint_format: str, origin: str) -> list[str]:
    """The whole file around ``model_config``: the header, the run's top-level keys, what
    is the user's (commented), the trainer, the model and the processor."""
    from .. import __version__

    top: list[str] = [
        *_comment(f"MindFormers configuration written by ms-port {__version__} from "
                  f"{origin}" + (f" for {where}" if where else "") + "."),
        *_comment("model.model_config and model.arch are computed: they make MindFormers' "
                  "LlamaForCausalLM the converted checkpoint's network. Everything commented "
                  "out is yours to set (device, dtypes, lengths, parallelism, tokenizer)."),
        *_comment("Use: python run_mindformer.py --config THIS.yaml --run_mode predict "
                  "--predict_data '...' (after setting the device and the processor)."),
        "",
        *_dump("seed", 0),
        *_dump("run_mode", "predict"),
        *_dump("use_legacy", True, note="LlamaForCausalLM is MindFormers' legacy model"),
    ]
    return [
        *top,
        *checkpoint_lines(where, checkpoint_format),
        *_dump("use_parallel", False, note="yours: true with parallel_config below"),
        "",
        *_comment("yours: the device and parallelism (MindFormers' defaults: Ascend, one "
                  "device), e.g."),
        "# context:",
        "#   mode: 0                  # 0 graph, 1 PyNative",
        "#   device_target: CPU       # Ascend on an NPU",
        "#   device_id: 0",
        "# parallel_config:",
        "#   data_parallel: 1",
        "#   model_parallel: 1",
        "#   pipeline_stage: 1",
        "",
        *model_document(config.get("model_type"), "LlamaConfig", "LlamaForCausalLM",
                        model_lines),
        *_comment("yours: the tokenizer (MindFormers' processor), for predict, e.g."),
        "# processor:",
        "#   return_tensors: ms",
        "#   tokenizer:",
        "#     type: LlamaTokenizerFast   # or the one your model's MindFormers YAML names",
        "#     tokenizer_file: /path/to/tokenizer.json",
    ]


def checkpoint_lines(where: Path | None, checkpoint_format: str) -> list[str]:
    """``load_checkpoint`` (the converted checkpoint, where known), its format, and
    ``auto_trans_ckpt``."""
    lines = ([*_dump("load_checkpoint", str(where), note="the converted checkpoint"),
              *_dump("load_ckpt_format", checkpoint_format)] if where is not None
             else _comment("load_checkpoint: the converted checkpoint"))
    return [*lines, *_dump("auto_trans_ckpt", False, note="one complete checkpoint; yours: "
                                                         "true to split it across devices")]


def model_document(model_name: Any, config_type: str, arch: str,
                   model_lines: list[str]) -> list[str]:
    """The ``trainer:`` and ``model:`` sections: ``model_config`` of ``config_type`` holding
    ``model_lines``, and ``arch``."""
    return [
        "trainer:",
        *_dump("type", "CausalLanguageModelingTrainer", 2),
        *_dump("model_name", model_name, 2),
        "",
        "model:",
        "  model_config:",
        *_dump("type", config_type, 4),
        *model_lines,
        "  arch:",
        *_dump("type", arch, 4),
        "",
    ]


def _check(text: str, built: MindFormersYaml, *, where: str, path: Any = None) -> None:
    """Raise unless ``text`` loads to ``built``'s model."""
    try:
        doc = yaml.safe_load(text)
        model = doc["model"]
        ok = model["model_config"] == built.model_config and model["arch"] == {
            "type": built.arch}
    except (yaml.YAMLError, KeyError, TypeError):
        ok = False
    if not ok:
        raise WriteError(f"{where} does not load back to the model_config ms-port computed; "
                         "this is a bug in ms-port — please report it", path=path)


def check_model_config(path: str | Path, *, ms_model: Any, arch: str | None = None,
                       template: Any = None, force: bool, dry_run: bool = False,
                       inputs: tuple[Any, ...] = (), outputs: tuple[Any, ...] = ()) -> None:
    """Fail early, before any work: a target other than :data:`FAMILY`, or (unless
    ``dry_run``, which writes nothing) a ``path`` that exists without ``force``, is an input
    of the run, or is another of its outputs.

    Raises:
        TargetError, OutputExistsError, WriteError.
    """
    if ms_model not in YAML_FAMILIES:
        given = (f"--arch {arch}" if arch else f"--target {template}" if template is not None
                 else f"--ms-model {ms_model}" if isinstance(ms_model, str) else "a Cell")
        raise TargetError(f"--model-config writes MindFormers' model configuration for "
                          f"--ms-model {' or '.join(YAML_FAMILIES)} only (this conversion's "
                          f"target: {visible(given)}); drop --model-config", path=path)
    if dry_run:
        return
    check_output(path, force=force)
    check_not_input(path, *inputs)
    for other in outputs:
        if other is not None and Path(other).absolute() == Path(path).absolute():
            raise WriteError(f"{path} is also this run's checkpoint or saved map; give "
                             "--model-config its own file name", path=path)


def write_model_config(path: str | Path, built: MindFormersYaml, *,
                       force: bool = False) -> ModelConfigFile:
    """Write ``built`` to ``path`` (never replacing a file without ``force``; atomic), then
    load the file back and compare its ``model.model_config`` with the computed one.

    Raises:
        OutputExistsError: ``path`` exists and ``force`` is False.
        WriteError: it cannot be written, or does not load back equal.
    """
    existed = Path(path).exists()
    final = write_text(path, built.text, force=force)
    _check(final.read_text(encoding="utf-8"), built, where=str(final), path=final)
    return ModelConfigFile(str(final), dict(built.model_config), list(built.notes),
                           replaced=existed and force)


__all__ = [
    "FAMILY",
    "YAML_FAMILIES",
    "MindFormersYaml",
    "ModelConfigFile",
    "check_model_config",
    "checkpoint_lines",
    "family_yaml",
    "mindformers_yaml",
    "model_document",
    "write_model_config",
]
