"""Training state from a Hugging Face Trainer checkpoint into MindFormers (issue 43).

A tiny LLaMA is trained by the Trainer itself on a CPU, on identical batches (so the
gradient of step 5 can be computed again from checkpoint-4). Its ``checkpoint-4/`` is
converted with ``--training-state``; MindFormers' own AdamW, from the converted moments
and counters with that gradient, must reach ``checkpoint-5``'s weights within float32
rounding, and a state one step off, or with two tensors' moments swapped, must not.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # the Trainer's own dependency

import ms_port  # noqa: E402
from ms_port.read.tensors import TensorInfo  # noqa: E402

SEQ, BATCH, VOCAB = 16, 4, 64


def _config() -> transformers.LlamaConfig:
    return transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=False)


def _batch() -> torch.Tensor:
    one = torch.randint(0, VOCAB, (SEQ,), generator=torch.Generator().manual_seed(1))
    return one.repeat(BATCH, 1)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """Six Trainer steps (warm-up 2, cosine, weight decay 0.1, clipping 1.0), every step
    saved: ``checkpoint-1/`` … ``checkpoint-6/``."""
    out = tmp_path_factory.mktemp("trainer")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(_config())
    rows = _batch()[0]
    data = [{"input_ids": rows.clone(), "labels": rows.clone()} for _ in range(8 * BATCH)]
    args = transformers.TrainingArguments(
        output_dir=str(out), per_device_train_batch_size=BATCH, max_steps=6,
        learning_rate=5e-3, warmup_steps=2, lr_scheduler_type="cosine", weight_decay=0.1,
        max_grad_norm=1.0, save_strategy="steps", save_steps=1, report_to=[],
        use_cpu=True, logging_steps=1, dataloader_num_workers=0, seed=0,
        disable_tqdm=True)
    transformers.Trainer(model=model, args=args, train_dataset=data).train()
    assert (out / "checkpoint-5" / "optimizer.pt").is_file()
    return out


@pytest.fixture
def cli():
    from click.testing import CliRunner

    from ms_port.cli import main

    return lambda args: CliRunner().invoke(main, [str(a) for a in args],
                                           env={"COLUMNS": "200"})


def test_inspect_names_the_optimizer_state_apart(run, cli):
    r = cli(["inspect", run / "checkpoint-4", "--limit", "1"])
    assert r.exit_code == 0, r.output
    line = " ".join(r.output.split())
    assert "training state (apart, not weights): torch.optim.AdamW (fused); step 4; " \
           "moments of 21 weights (float32" in line
    assert "lr 0.0025 wd 0.1 (16); lr 0.0025 wd 0 (5)" in line  # decayed, then not
    assert "schedule cosine (warm-up 2, total 6), at step 4 (next lr 0.0025); epoch 0.5; " \
           "no loss scale" in line


@pytest.mark.parametrize("fused", [False, True], ids=["separate", "qkv_concat"])
def test_moments_go_through_the_weights_plan(run, tmp_path, fused):
    out = tmp_path / "c4.ckpt"
    report = ms_port.convert(run / "checkpoint-4", ms_model="mindformers:llama",
                             ms_options={"qkv_concat": fused}, output=out,
                             training_state=True)
    assert report.ok
    from ms_port.read.sources import read_source

    back = read_source(out)
    state = {t.name: t for t in back.training_state}
    weights = [t.name for t in back]
    assert len(weights) == 21 - (6 if fused else 0)  # q/k/v and w1/w3 fused per layer
    assert {f"adam_m.{n}" for n in weights} | {f"adam_v.{n}" for n in weights} \
        | {"global_step", "step_num", "epoch_num"} == set(state)
    assert state["global_step"].load().tolist() == [4]
    assert state["global_step"].dtype == "int32"
    assert (state["step_num"].load().item(), state["epoch_num"].load().item()) == (4, 1)
    opt = torch.load(run / "checkpoint-4" / "optimizer.pt")["state"]
    # position 1 is layer 0's q_proj, 2 its k_proj, 3 its v_proj (named_parameters order)
    q, k, v = (opt[i]["exp_avg_sq"].numpy() for i in (1, 2, 3))
    p = "model.layers.0.attention"
    if fused:  # the moments' rows are laid out as the weight's rows are
        from safetensors.numpy import load_file

        hf = load_file(run / "checkpoint-4" / "model.safetensors")
        joined = np.concatenate([hf[f"model.layers.0.self_attn.{n}_proj.weight"]
                                 for n in "qkv"])
        fused_w = back[f"{p}.w_qkv.weight"].load()
        rows = [int(np.flatnonzero((joined == r).all(1))[0]) for r in fused_w]
        np.testing.assert_array_equal(state[f"adam_v.{p}.w_qkv.weight"].load(),
                                      np.concatenate([q, k, v])[rows])
    else:
        np.testing.assert_array_equal(state[f"adam_v.{p}.wk.weight"].load(), k)
    # the norms sit in the no-decay group, after the 16 decayed weights
    np.testing.assert_array_equal(state["adam_m.model.norm_out.weight"].load(),
                                  opt[20]["exp_avg"].numpy())


def test_without_the_flag_the_output_is_the_weights_alone_byte_for_byte(run, tmp_path):
    alone = tmp_path / "alone"
    alone.mkdir()
    for name in ("model.safetensors", "config.json"):
        shutil.copy(run / "checkpoint-4" / name, alone / name)
    a, b = tmp_path / "a.ckpt", tmp_path / "b.ckpt"
    ms_port.convert(run / "checkpoint-4", ms_model="mindformers:llama", output=a)
    ms_port.convert(alone, ms_model="mindformers:llama", output=b)
    assert a.read_bytes() == b.read_bytes()


# -- the proof: MindFormers' AdamW takes the next step ---------------------------------

def _gradient(folder: Path) -> dict[str, np.ndarray]:
    """The Trainer's step-5 gradient: the same batch at checkpoint-4, clipped to norm 1."""
    model = transformers.LlamaForCausalLM.from_pretrained(folder)
    model.train()
    batch = _batch()
    model(input_ids=batch, labels=batch).loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    return {n: p.grad.detach().numpy().copy() for n, p in model.named_parameters()}


def _mindformers_step(plan, ckpt: Path, grads: dict[str, np.ndarray], *,
                      step_off: int = 0, swap: tuple[str, str] | None = None
                      ) -> dict[str, np.ndarray]:
    """One step of MindFormers' AdamW from the converted checkpoint, with ``grads`` made
    MindSpore's by the plan (as the moments were)."""
    import mindspore as ms
    from mindformers.core.optim.adamw import AdamW

    weights = [m for m in plan.matches if m.how != "state"]
    infos = {n: TensorInfo(n, a.shape, "float32", lambda a=a: a) for n, a in grads.items()}
    graded = dataclasses.replace(plan, source=dataclasses.replace(
        plan.source, tensors={**plan.source.tensors, **infos}))
    ms_grads = {m.target: graded.expected(m) for m in weights}
    saved = ms.load_checkpoint(str(ckpt))
    params = {m.target: ms.Parameter(saved[m.target], name=m.target) for m in weights}
    state = plan.training_state
    decayed = {m.target for m in weights if m.source in state.groups[0].names}
    group = state.groups[0]
    opt = AdamW([{"params": [p for n, p in params.items() if n in decayed],
                  "weight_decay": group.weight_decay},
                 {"params": [p for n, p in params.items() if n not in decayed],
                  "weight_decay": 0.0},
                 {"order_params": list(params.values())}],
                learning_rate=state.schedule.last_lrs[0], betas=group.betas, eps=group.eps)
    names = {swap[0]: swap[1], swap[1]: swap[0]} if swap else {}
    for moment in (*opt.exp_avg, *opt.exp_avg_sq):
        moment.set_data(saved[names.get(moment.name, moment.name)])
    step = int(saved["global_step"].asnumpy()[0]) - step_off
    opt.global_step.set_data(ms.Tensor(np.array([step], np.int32)))
    opt(tuple(ms.Tensor(ms_grads[p.name]) for p in opt._parameters))
    return {n: p.asnumpy() for n, p in params.items()}


def _update_difference(plan, stepped: dict[str, np.ndarray], folder: Path,
                       options: dict) -> tuple[float, str, float]:
    """||ms step − Trainer step|| / ||Trainer step||, the tensor worst off and its own."""
    nxt = ms_port.plan(folder, ms_model="mindformers:llama", ms_options=options)
    want = {m.target: nxt.expected(m) for m in nxt.matches}
    before = {m.target: plan.expected(m) for m in plan.matches if m.how != "state"}
    num = {n: float(np.sum((stepped[n] - want[n]) ** 2)) for n in stepped}
    den = {n: float(np.sum((want[n] - before[n]) ** 2)) for n in stepped}
    worst = max(num, key=lambda n: num[n] / max(den[n], 1e-30))
    return (sum(num.values()) / sum(den.values())) ** 0.5, worst, \
        (num[worst] / den[worst]) ** 0.5


@pytest.mark.parametrize("fused", [False, True], ids=["separate", "qkv_concat"])
def test_mindformers_adamw_continues_to_the_next_checkpoint(run, tmp_path, fused):
    pytest.importorskip("mindformers")
    ckpt = tmp_path / "c4.ckpt"
    options = {"qkv_concat": fused}
    plan = ms_port.convert(run / "checkpoint-4", ms_model="mindformers:llama",
                           ms_options=options, output=ckpt, training_state=True).plan
    grads = _gradient(run / "checkpoint-4")
    right, _, _ = _update_difference(plan, _mindformers_step(plan, ckpt, grads),
                                     run / "checkpoint-5", options)
    assert right <= 1e-5, right  # float32 rounding of the weights (max |Δ| one ulp)
    off, _, _ = _update_difference(plan, _mindformers_step(plan, ckpt, grads, step_off=1),
                                   run / "checkpoint-5", options)
    assert off > 1e-2, off  # the bias correction of another step
    a, b = ("adam_v.model.layers.0.feed_forward.w2.weight",
            "adam_v.model.layers.1.feed_forward.w2.weight")
    swapped, worst, own = _update_difference(
        plan, _mindformers_step(plan, ckpt, grads, swap=(a, b)), run / "checkpoint-5", options)
    assert swapped > 1e-2 and worst in (a[len("adam_v."):], b[len("adam_v."):]), \
        (swapped, worst)
    assert own > 1e-1


# -- refusals: one line, nothing written -----------------------------------------------

def _altered(run: Path, tmp_path: Path, change) -> Path:
    folder = tmp_path / "checkpoint-4"
    shutil.copytree(run / "checkpoint-4", folder)
    sd = torch.load(folder / "optimizer.pt")
    change(sd)
    torch.save(sd, folder / "optimizer.pt")
    return folder


def _amsgrad(sd):
    for g in sd["param_groups"]:
        g["amsgrad"] = True
    for s in sd["state"].values():
        s["max_exp_avg_sq"] = s["exp_avg_sq"].clone()


def _factored(sd):
    s = sd["state"][0]
    s["exp_avg_sq_row"] = s.pop("exp_avg_sq").mean(1)


def _steps_differ(sd):
    sd["state"][3]["step"] = torch.tensor(3.0)


def _one_group(sd):
    g0, g1 = sd["param_groups"]
    g0["params"] = g0["params"] + g1["params"]
    sd["param_groups"] = [g0]


def _l2_adam(sd):
    for g in sd["param_groups"]:
        g["decoupled_weight_decay"] = False


@pytest.mark.parametrize("change, says", [
    (_amsgrad, "uses amsgrad"),
    (_factored, "a factored second moment (Adafactor)"),
    (_steps_differ, "took different numbers of steps (step 3: "
                    "'model.layers.0.self_attn.v_proj.weight'; step 4: "),
    (_one_group, "position 8's moments are [32, 32], the weight it falls on, "
                 "'model.layers.0.input_layernorm.weight', is [32]: the optimizer's "
                 "parameter order is not the model's"),
    (_l2_adam, "is Adam with L2 weight decay"),
], ids=["amsgrad", "factored", "steps", "custom-groups", "adam-l2"])
def test_refused_in_one_line_with_nothing_written(run, tmp_path, cli, change, says):
    folder = _altered(run, tmp_path, change)
    out = tmp_path / "out.ckpt"
    r = cli(["convert", folder, "--ms-model", "mindformers:llama", "--training-state",
             "-o", out])
    assert r.exit_code == 2, r.output
    assert says in " ".join(r.output.split()), r.output
    assert "Traceback" not in r.output and not out.exists()
    assert list(tmp_path.glob("out.ckpt*")) == []


def test_no_optimizer_state_is_refused(run, tmp_path, cli):
    folder = tmp_path / "weights-only"
    shutil.copytree(run / "checkpoint-4", folder)
    (folder / "optimizer.pt").unlink()
    r = cli(["convert", folder, "--ms-model", "mindformers:llama", "--training-state",
             "-o", tmp_path / "o.ckpt"])
    assert r.exit_code == 2 and "no optimizer.pt" in r.output, r.output
    assert not (tmp_path / "o.ckpt").exists()


def test_a_schedule_at_another_step_is_refused(run, tmp_path, cli):
    folder = tmp_path / "checkpoint-4"
    shutil.copytree(run / "checkpoint-4", folder)
    shutil.copy(run / "checkpoint-3" / "scheduler.pt", folder / "scheduler.pt")
    r = cli(["convert", folder, "--ms-model", "mindformers:llama", "--training-state",
             "-o", tmp_path / "o.ckpt"])
    assert r.exit_code == 2, r.output
    assert "the schedule stands at step 3, the optimizer at 4" in " ".join(r.output.split())


def test_export_of_one_ckpt_leaves_its_training_state_out(run, tmp_path, cli):
    """A single .ckpt holding adam_m.* had been refused ("not used") where a training
    output's was left out with a note: both are left out now, and inspect tells it."""
    ckpt = tmp_path / "c4.ckpt"
    ms_port.convert(run / "checkpoint-4", ms_model="mindformers:llama", output=ckpt,
                    training_state=True)
    r = cli(["inspect", ckpt, "--limit", "1"])
    assert "training state (apart, not weights): 45 tensors" in " ".join(r.output.split())
    assert "adam_m of 21 weights / adam_v of 21 weights; global_step 4" in \
        " ".join(r.output.split())
    back = tmp_path / "back"
    r = cli(["export", ckpt, "--config", run / "checkpoint-4" / "config.json",
             "--ms-model", "mindformers:llama", "-o", back])
    assert r.exit_code == 0, r.output
    assert "left out 45 training-state tensors" in " ".join(r.output.split())
