"""MindFormers' own LLaMA converter, run the way its documentation runs it (the baseline
of the ``llm-1b`` case).

    python benchmarks/mindformers_llama.py hf2ms HF_DIR OUT.ckpt
    python benchmarks/mindformers_llama.py qkv-concat SEPARATE.ckpt OUT.ckpt MODEL.yaml

``hf2ms`` is what MindFormers' ``convert_weight.py --model llama --input_path HF_DIR
--output_path OUT.ckpt --dtype bf16`` does: that script (in the MindFormers repository,
not in the pip wheel) only looks up ``mindformers.models.llama.convert_weight
.convert_pt_to_ms`` and calls it with ``dtype=mindspore.bfloat16``; so does this. It
loads the model with ``transformers.LlamaForCausalLM.from_pretrained`` (a whole PyTorch
model), converts each tensor (bfloat16 -> float32 numpy -> ``ms.Tensor(bfloat16)``) into
a list, and ``mindspore.save_checkpoint``s it: the separate q/k/v layout. Its
``--qkv_concat`` flag is passed on to ``convert_pt_to_ms``, which ignores it.

``qkv-concat`` is MindFormers' second step to the fused layout,
``convert_to_qkv_concat(pre_ckpt_path, mindspore_ckpt_path, config_path)``:
``mindspore.load_checkpoint`` the separate checkpoint, concatenate q/k/v and gate/up into
``w_qkv`` / ``w_gate_hidden`` (the grouped "hf -> mg" order), ``save_checkpoint``. It
reads the head counts from a MindFormers model yaml.

Neither step is changed here; this file only calls them, with one exception:
``mindspore.load_checkpoint`` (MindSpore 2.10) refuses a ``.ckpt`` larger than the *free*
memory (``SC_AVPHYS_PAGES``, i.e. ``MemFree``, which leaves out reclaimable page cache),
checked once before and once after it has read the whole file. On a machine whose memory
is mostly page cache (after writing a few GiB of checkpoints) step 2 then fails at random
on a 2 GiB file with 20 GiB available. As ``tests/conftest.py`` does, that check is turned
off here (``_get_available_memory`` returns None, which the check reads as "unknown");
it costs nothing to skip, the file is read either way.

MindFormers writes its logs under ``$LOCAL_DEFAULT_PATH`` (``./output`` when unset); the
harness sets it to a /tmp folder.
"""

from __future__ import annotations

import sys


def main() -> None:
    step, *args = sys.argv[1:]
    if step == "hf2ms" and len(args) == 2:
        import mindspore as ms
        from mindformers.models.llama.convert_weight import convert_pt_to_ms

        # convert_weight.py's call, with its default extra kwargs
        convert_pt_to_ms(input_path=args[0], output_path=args[1], dtype=ms.bfloat16,
                         qkv_concat=False, layers=12, is_pretrain=False,
                         telechat_type="telechat_12b")
    elif step == "qkv-concat" and len(args) == 3:
        from mindformers.models.llama.convert_weight import convert_to_qkv_concat
        from mindspore.train import serialization

        if hasattr(serialization, "_get_available_memory"):  # see the docstring
            serialization._get_available_memory = lambda: None
        convert_to_qkv_concat(*args)
    else:
        raise SystemExit(__doc__.split("\n\n")[1])


if __name__ == "__main__":
    main()
