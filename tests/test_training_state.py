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
    _train(transformers.LlamaForCausalLM(_config()), out)
    assert (out / "checkpoint-5" / "optimizer.pt").is_file()
    return out


def _train(model, out: Path, resume: Path | None = None) -> None:
    """The run: six steps on identical batches, every step saved (resumed from
    ``resume``, with the run's own arguments, as the export's report says them)."""
    rows = _batch()[0]
    data = [{"input_ids": rows.clone(), "labels": rows.clone()} for _ in range(8 * BATCH)]
    args = transformers.TrainingArguments(
        output_dir=str(out), per_device_train_batch_size=BATCH, max_steps=6,
        learning_rate=5e-3, warmup_steps=2, lr_scheduler_type="cosine", weight_decay=0.1,
        max_grad_norm=1.0, save_strategy="steps", save_steps=1, report_to=[],
        use_cpu=True, logging_steps=1, dataloader_num_workers=0, seed=0,
        disable_tqdm=True)
    transformers.Trainer(model=model, args=args, train_dataset=data).train(
        resume_from_checkpoint=None if resume is None else str(resume))


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
    MindSpore's by the plan (as the moments were), its settings and learning-rate schedule
    those of the YAML ``--model-config`` wrote beside it (MindFormers' own schedule class)."""
    import mindspore as ms
    import yaml
    from mindformers.core import lr as mf_lr
    from mindformers.core.optim.adamw import AdamW

    run = yaml.safe_load(ckpt.with_suffix(".yaml").read_text())
    sched = dict(run["lr_schedule"])
    schedule = getattr(mf_lr, sched.pop("type"))(**sched)
    optimizer = run["optimizer"]

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
    assert optimizer["weight_decay"] == group.weight_decay
    opt = AdamW([{"params": [p for n, p in params.items() if n in decayed],
                  "weight_decay": optimizer["weight_decay"]},
                 {"params": [p for n, p in params.items() if n not in decayed],
                  "weight_decay": 0.0},
                 {"order_params": list(params.values())}],
                learning_rate=schedule, betas=tuple(optimizer["betas"]),
                eps=optimizer["eps"])
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
                           ms_options=options, output=ckpt, training_state=True,
                           model_config=ckpt.with_suffix(".yaml")).plan
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


def test_the_yaml_states_the_trainers_optimizer_and_schedule(run, tmp_path):
    import yaml

    ckpt, config = tmp_path / "c4.ckpt", tmp_path / "c4.yaml"
    ms_port.convert(run / "checkpoint-4", ms_model="mindformers:llama", output=ckpt,
                    training_state=True, model_config=config)
    doc = yaml.safe_load(config.read_text())
    assert doc["run_mode"] == "train" and doc["resume_training"] is True
    assert doc["optimizer"] == {"type": "AdamW", "betas": [0.9, 0.999], "eps": 1e-08,
                                "weight_decay": 0.1}
    assert doc["lr_schedule"] == {"type": "CosineWithWarmUpLR", "learning_rate": 0.005,
                                  "warmup_steps": 2, "total_steps": 6, "num_cycles": 0.5,
                                  "lr_end": 0.0, "warmup_lr_init": 0.0}
    assert doc["runner_wrapper"]["max_grad_norm"] == 1.0
    assert doc["callbacks"] == [{"type": "MFLossMonitor", "per_print_times": 1},
                                {"type": "CheckpointMonitor", "save_checkpoint_steps": 1}]
    assert doc["load_checkpoint"] == str(ckpt)


@pytest.mark.parametrize("kind", ["cosine", "linear", "constant_with_warmup"])
def test_each_schedule_twin_gives_the_same_rate_at_every_step(kind):
    """transformers' schedule, MindFormers' twin (its own class, as the YAML configures it)
    and ms-port's own formula (export's next rate) agree at every step."""
    pytest.importorskip("mindformers")
    import mindspore as ms
    from mindformers.core import lr as mf_lr

    from ms_port.read.train_config import RunConfig, schedule_lr
    from ms_port.read.training_state import SCHEDULES

    base, warmup, total = 3e-4, 7, 40
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=base)
    hf = transformers.get_scheduler(kind, opt, num_warmup_steps=warmup,
                                    num_training_steps=total)
    name, fixed = SCHEDULES[kind]
    mf = getattr(mf_lr, name)(learning_rate=base, warmup_steps=warmup, total_steps=total,
                              **fixed)
    run = RunConfig("run.yaml", (0.9, 0.999), 1e-8, 0.0, kind, base, warmup, total)
    for step in range(total):
        want = hf.get_last_lr()[0]
        got = float(mf(ms.Tensor(step, ms.int32)).asnumpy())
        assert abs(got - want) <= 1e-6 * base, (step, got, want)
        assert abs(schedule_lr(run, step) - want) <= 1e-12, (step, want)
        opt.step()
        hf.step()


def _resume(folder: Path, out: Path) -> None:
    """The Trainer resumed from ``folder`` to step 6, saving every step."""
    _train(transformers.LlamaForCausalLM.from_pretrained(folder), out, resume=folder)


def _relative(a: Path, b: Path, before: Path) -> float:
    from safetensors.numpy import load_file

    x, y, w = (load_file(p / "model.safetensors") for p in (a, b, before))
    return (sum(float(np.sum((x[n] - y[n]) ** 2)) for n in y)
            / sum(float(np.sum((y[n] - w[n]) ** 2)) for n in y)) ** 0.5


@pytest.mark.parametrize("fused", [False, True], ids=["separate", "qkv_concat"])
def test_the_exported_folder_resumes_in_the_trainer(run, tmp_path, cli, fused):
    """checkpoint-4 into MindFormers with its state, back with the YAML convert wrote as
    the run's: the Trainer resumed from the exported folder takes the original run's steps
    5 and 6 (the fused q/k/v moments split as the weights are)."""
    ckpt, config, back = tmp_path / "c4.ckpt", tmp_path / "run.yaml", tmp_path / "back"
    ms_port.convert(run / "checkpoint-4", ms_model="mindformers:llama", output=ckpt,
                    ms_options={"qkv_concat": fused}, training_state=True,
                    model_config=config)
    r = cli(["export", ckpt, "--config", run / "checkpoint-4" / "config.json",
             "--ms-model", "mindformers:llama", "--ms-option", f"qkv_concat={fused}",
             "--training-state", "--train-config", config, "-o", back])
    assert r.exit_code == 0, r.output
    said = " ".join(r.output.split())
    assert "resume with TrainingArguments(learning_rate=0.005, lr_scheduler_type='cosine', " \
           "warmup_steps=2, max_steps=6, weight_decay=0.1" in said
    assert "left out" not in said  # the state is taken, not dropped
    assert sorted(p.name for p in back.iterdir()) == [
        "config.json", "model.safetensors", "optimizer.pt", "scheduler.pt",
        "trainer_state.json"]
    resumed = tmp_path / "resumed"
    _resume(back, resumed)
    for step in (5, 6):
        d = _relative(resumed / f"checkpoint-{step}", run / f"checkpoint-{step}",
                      run / f"checkpoint-{step - 1}")
        assert d <= 1e-5, (step, d)  # the fused and the for-loop AdamW round apart


def test_an_exported_state_one_step_off_resumes_elsewhere(run, tmp_path):
    """The twin that must fail: the exported folder with its moments' step made 3."""
    ckpt, config, back = tmp_path / "c4.ckpt", tmp_path / "run.yaml", tmp_path / "back"
    ms_port.convert(run / "checkpoint-4", ms_model="mindformers:llama", output=ckpt,
                    training_state=True, model_config=config)
    ms_port.export(ckpt, config=run / "checkpoint-4" / "config.json",
                   ms_model="mindformers:llama", training_state=True, train_config=config,
                   output=back)
    sd = torch.load(back / "optimizer.pt")
    for entry in sd["state"].values():
        entry["step"] = torch.tensor(3.0)
    torch.save(sd, back / "optimizer.pt")
    _resume(back, tmp_path / "resumed")
    d = _relative(tmp_path / "resumed" / "checkpoint-5", run / "checkpoint-5",
                  run / "checkpoint-4")
    assert d > 1e-2, d


def _yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


_RUN = """optimizer: {type: %s, betas: [0.9, 0.999], eps: 1.0e-8, weight_decay: 0.1}
lr_schedule: {type: %s, learning_rate: 0.005, warmup_steps: 2, total_steps: 6%s}
"""


@pytest.mark.parametrize("optimizer, schedule, extra, says", [
    ("AdamWeightDecay", "CosineWithWarmUpLR", "",
     "optimizer 'AdamWeightDecay': MindSpore's AdamWeightDecay has no bias correction"),
    ("FusedAdamW", "CosineWithWarmUpLR", "", "FusedAdamW counts global_step from -1"),
    ("Came", "CosineWithWarmUpLR", "", "a factored second moment (CAME)"),
    ("AdamW", "PolynomialWithWarmUpLR", "",
     "lr_schedule 'PolynomialWithWarmUpLR' has no transformers twin"),
    ("AdamW", "CosineWithWarmUpLR", ", lr_end: 1.0e-6",
     "lr_schedule.lr_end is 1e-06; transformers' cosine schedule has 0.0"),
], ids=["adamweightdecay", "fusedadamw", "came", "polynomial", "lr_end"])
def test_export_refusals_in_one_line_with_nothing_written(run, tmp_path, cli, optimizer,
                                                          schedule, extra, says):
    ckpt = tmp_path / "c4.ckpt"
    ms_port.convert(run / "checkpoint-4", ms_model="mindformers:llama", output=ckpt,
                    training_state=True)
    config = _yaml(tmp_path, _RUN % (optimizer, schedule, extra))
    r = cli(["export", ckpt, "--config", run / "checkpoint-4" / "config.json",
             "--training-state", "--train-config", config, "-o", tmp_path / "back"])
    assert r.exit_code == 2, r.output
    assert says in " ".join(r.output.split()), r.output
    assert not (tmp_path / "back").exists() and "Traceback" not in r.output


def test_export_needs_the_runs_yaml_and_a_state(run, tmp_path, cli):
    weights_only = tmp_path / "w.ckpt"
    ms_port.convert(run / "checkpoint-4", ms_model="mindformers:llama", output=weights_only)
    cfg = run / "checkpoint-4" / "config.json"
    r = cli(["export", weights_only, "--config", cfg, "--training-state", "-o",
             tmp_path / "a"])
    assert r.exit_code == 2 and "needs --train-config RUN.yaml" in r.output, r.output
    config = _yaml(tmp_path, _RUN % ("AdamW", "CosineWithWarmUpLR", ""))
    r = cli(["export", weights_only, "--config", cfg, "--training-state", "--train-config",
             config, "-o", tmp_path / "b"])
    assert r.exit_code == 2, r.output
    assert "holds no optimizer moments (adam_m.*)" in " ".join(r.output.split())
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_the_pages_session_ends_as_shown(run, tmp_path, monkeypatch):
    """docs/training.md's commands, run as written on the Trainer's checkpoint-4: the same
    panels, exit codes and plan lines."""
    from click.testing import CliRunner

    from ms_port.cli import main
    from tests.test_readme_runs import KEPT, TITLES, _plain, _sessions, _title

    sessions = _sessions("docs/training.md")
    assert [c.split()[1] for _, c, _ in sessions] == ["inspect", "convert", "export",
                                                      "verify"]
    shutil.copytree(run / "checkpoint-4", tmp_path / "run" / "checkpoint-4")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")
    import shlex

    for where, command, shown in sessions:
        result = CliRunner().invoke(main, shlex.split(command)[1:], catch_exceptions=False)
        out = [_plain(x) for x in result.output.splitlines()]
        title = _title(shown)
        assert result.exit_code == (TITLES[title] if title else 0), (where, result.output)
        for expected in (_plain(x) for x in shown):
            if KEPT.match(expected) or expected.startswith("training state"):
                assert any(x.startswith(expected) for x in out), (where, expected,
                                                                  result.output)
    assert (tmp_path / "back-4" / "optimizer.pt").is_file()


def test_the_state_is_cut_per_rank_as_its_weights(run, tmp_path):
    """--strategy: each moment is laid out as its weight (a quarter of a column-parallel
    q's rows on each rank), the counters on every rank; read back whole, the state is the
    one-file conversion's."""
    from ms_port.read.sources import read_source
    from ms_port.testing import training_output
    from tests.test_cluster import _llama_layouts

    whole = tmp_path / "whole.ckpt"
    ms_port.convert(run / "checkpoint-4", ms_model="mindformers:llama", output=whole,
                    training_state=True)
    one = read_source(whole, strip_prefixes=False)
    arrays = {i.name: i.load() for i in one}
    layouts = _llama_layouts(list(arrays))
    strategy = training_output(tmp_path / "train", arrays, layouts) / "strategy"
    ranks = tmp_path / "ranks"
    report = ms_port.convert(run / "checkpoint-4", ms_model="mindformers:llama",
                             output=ranks, strategy=strategy, training_state=True)
    assert report.ok
    back = read_source(ranks)
    got = {t.name: t for t in back.training_state}
    assert set(got) == {t.name for t in one.training_state}
    for t in one.training_state:
        np.testing.assert_array_equal(got[t.name].load(), t.load(), err_msg=t.name)
    q = "adam_v.model.layers.0.attention.wq.weight"
    rank1 = read_source(next((ranks / "rank_1").glob("*.ckpt")), strip_prefixes=False)
    held = {t.name: t.shape for t in rank1.training_state}
    assert held[q][0] * 4 == dict((t.name, t.shape) for t in one.training_state)[q][0]
    assert held["global_step"] == (1,)


@pytest.mark.parametrize("fused", [False, True], ids=["separate", "qkv_concat"])
def test_verify_training_state_passes_the_conversion_and_fails_its_twins(run, tmp_path,
                                                                        cli, fused):
    """verify --training-state: PASS on the conversion; FAIL, naming the weight, with two
    layers' second moments swapped; FAIL with the step one off."""
    pytest.importorskip("mindformers")
    from ms_port.testing import rewrite_checkpoint

    ckpt = tmp_path / "c4.ckpt"
    ms_port.convert(run / "checkpoint-4", ms_model="mindformers:llama", output=ckpt,
                    ms_options={"qkv_concat": fused}, training_state=True)
    args = ["verify", run / "checkpoint-4", None, "--ms-model", "mindformers:llama",
            "--ms-option", f"qkv_concat={fused}", "--training-state"]
    r = cli([a if a is not None else ckpt for a in args])
    assert r.exit_code == 0, r.output
    said = " ".join(r.output.split())
    assert "PASS: one AdamW step from each side's state (step 4 → 5, lr 0.0025) gives the " \
           "same next weights" in said

    a, b = ("adam_v.model.layers.0.feed_forward.w2.weight",
            "adam_v.model.layers.1.feed_forward.w2.weight")

    def swap(arrays: dict) -> None:
        arrays[a], arrays[b] = arrays[b], arrays[a]

    def step_off(arrays: dict) -> None:
        arrays["global_step"] = np.array([3], dtype=np.int32)

    for change, worst in ((swap, ("model.layers.0.feed_forward.w2.weight",
                                  "model.layers.1.feed_forward.w2.weight")),
                          (step_off, None)):
        bad = tmp_path / f"{change.__name__}.ckpt"
        rewrite_checkpoint(ckpt, bad, change)
        r = cli([x if x is not None else bad for x in args] + ["--json"])
        assert r.exit_code == 1, r.output
        import json

        report = json.loads(r.output)
        assert report["verdict"] == "FAIL"
        rows = sorted(report["rows"], key=lambda x: -x["of_bound"])
        assert rows[0]["relative"] > 1e-2, rows[0]
        if worst:
            assert rows[0]["name"] in worst and rows[1]["name"] in worst, rows[:2]
        else:
            assert all(x["of_bound"] > 1 for x in rows)  # every weight's step is another


@pytest.mark.parametrize("family, extra", [
    ("llama", {}), ("llama", {"attention_bias": True, "mlp_bias": True}),
    ("llama", {"tie_word_embeddings": True}), ("mistral", {}), ("qwen2", {}),
    ("qwen3", {"head_dim": 16})], ids=["llama", "llama-biases", "llama-tied", "mistral",
                                        "qwen2", "qwen3"])
def test_the_computed_parameter_order_is_transformers_own(family, extra):
    """The optimizer's positions are named by the model's parameter order: computed for
    the plain decoders, it must be transformers' named_parameters() order and the
    Trainer's decay grouping, family by family (biases, q/k norms, a tied head)."""
    from ms_port.read.trainer import DECAY_RULES, _built_order, parameter_order

    config = transformers.AutoConfig.for_model(
        family, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=64, **extra).to_dict()
    config["architectures"] = [f"{family.title()}ForCausalLM"]
    order, decays = parameter_order(config, family)
    built, built_decays = _built_order(config, family)
    assert order == built
    # (transformers' set also names a tied head's twin, which the order holds once)
    assert dict(decays) == {k: v & set(order) for k, v in built_decays}
    decayed = dict(decays)[DECAY_RULES[0][0]]
    assert not any("norm" in n or n.endswith(".bias") for n in decayed)
    assert any(n.endswith("q_proj.weight") for n in decayed)


def test_inspect_lists_the_weights_and_says_why_a_state_is_not_taken(run, tmp_path, cli):
    folder = _altered(run, tmp_path, _amsgrad)
    r = cli(["inspect", folder, "--limit", "1"])
    assert r.exit_code == 0, r.output
    said = " ".join(r.output.split())
    assert "tensors: 21" in said and "training state not taken:" in said
    assert "uses amsgrad" in said


def test_a_models_own_momentum_tensors_stay_weights(tmp_path):
    """Only MindFormers' moments make a safetensors file's names training state: a model's
    own ``momentum.*`` or ``learning_rate`` tensors are weights."""
    from safetensors.numpy import save_file

    from ms_port.read.sources import read_source

    path = tmp_path / "m.safetensors"
    save_file({"momentum.weight": np.ones(2, np.float32),
               "learning_rate": np.ones(1, np.float32)}, str(path))
    source = read_source(path)
    assert set(source.tensors) == {"momentum.weight", "learning_rate"}
    assert source.training_state == []


def test_verify_training_state_on_weights_alone_is_bad_input(run, tmp_path, cli):
    """A checkpoint converted without --training-state holds no moments: one line naming
    the file and the first tensor it lacks, exit 2."""
    pytest.importorskip("mindformers")
    ckpt = tmp_path / "w.ckpt"
    ms_port.convert(run / "checkpoint-4", ms_model="mindformers:llama", output=ckpt)
    r = cli(["verify", run / "checkpoint-4", ckpt, "--ms-model", "mindformers:llama",
             "--training-state"])
    assert r.exit_code == 2, r.output
    said = " ".join(r.output.split())
    assert "w.ckpt: no 'adam_m." in said and "convert with --training-state" in said
    assert "Traceback" not in r.output


def test_a_float16_runs_loss_scale_goes_to_mindformers(run, tmp_path):
    """A Trainer run in float16 saves its GradScaler (scaler.pt): its scale is written as
    MindFormers' ``loss_scale`` (its resume sets ``scale_sense`` to it) and the YAML's
    dynamic loss scale grows as torch's did; the RNG states are named as not carried."""
    import yaml

    folder = tmp_path / "checkpoint-4"
    shutil.copytree(run / "checkpoint-4", folder)
    torch.save({"scale": 1024.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                "growth_interval": 500, "_growth_tracker": 37}, folder / "scaler.pt")
    torch.save({"python": None}, folder / "rng_state.pth")
    out = tmp_path / "c4.ckpt"
    report = ms_port.convert(folder, ms_model="mindformers:llama", output=out,
                             training_state=True, model_config=tmp_path / "run.yaml")
    assert report.ok
    from ms_port.read.sources import read_source

    state = {t.name: t for t in read_source(out).training_state}
    assert state["loss_scale"].dtype == "float32" and state["loss_scale"].load() == 1024.0
    wrapper = yaml.safe_load((tmp_path / "run.yaml").read_text())["runner_wrapper"]
    assert wrapper["scale_sense"] == {"type": "DynamicLossScaleUpdateCell",
                                      "loss_scale_value": 1024.0, "scale_factor": 2.0,
                                      "scale_window": 500}
    assert any("rng_state.pth" in n and "not carried" in n for n in report.plan.notes)
    # without a scaler (a float32 or bfloat16 run), nothing of the kind is written
    plain = ms_port.convert(run / "checkpoint-4", ms_model="mindformers:llama",
                            output=tmp_path / "p.ckpt", training_state=True)
    assert "loss_scale" not in {t.name for t in read_source(plain.output).training_state}


def test_a_scaler_that_is_not_one_is_refused(run, tmp_path, cli):
    folder = tmp_path / "checkpoint-4"
    shutil.copytree(run / "checkpoint-4", folder)
    torch.save({"scale": -1.0}, folder / "scaler.pt")
    result = cli(["convert", str(folder), "--ms-model", "mindformers:llama",
                  "--training-state", "-o", str(tmp_path / "o.ckpt")])
    assert result.exit_code == 2 and "not a torch GradScaler's state" in result.output
    assert not (tmp_path / "o.ckpt").exists()
