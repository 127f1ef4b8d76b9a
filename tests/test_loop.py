"""Evaluation while training: `softeval.InLoop` inside a plain loop and transformers' Trainer, the
guard that leaves training as it was (final weights compared bitwise, with and without
evaluations), failures that stay in their cell, the checks made before training starts, fast
and full sets, adaptive tuning, and the trackers at the training step."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from conftest import STUDY_ROWS, TUNING, tiny_config, write_user_task
from softeval import InLoop, SoftevalCallback
from softeval.analysis import finished_cells, read_series
from softeval.errors import SoftevalError
from softeval.loop import training_untouched
from softeval.loop.filing import read_evaluations
from softeval.models import load_model

SETTINGS = {"k": 2, "limit": 12, "tuning": TUNING}


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dirs):
    return AutoTokenizer.from_pretrained(tokenizer_dirs["llama"])


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> Path:
    return write_user_task(tmp_path_factory.mktemp("task"), STUDY_ROWS)


def fresh_model(tokenizer, seed: int = 0):
    """A tiny llama with dropout, so that training draws from torch's generator at every step."""
    config = tiny_config("llama", len(tokenizer), tokenizer)
    config.attention_dropout = 0.1
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config)


def train(model, steps: int, between=None) -> dict:
    """A plain loop of `steps` optimizer steps, two micro-batches each; every RNG a loop may use
    (torch's, Python's, NumPy's) picks its data. `between(step)` is called after a step's first
    backward pass, while gradients are accumulated; returns the final weights and optimizer state."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()
    vocab = model.config.vocab_size
    for step in range(1, steps + 1):
        for micro in range(2):
            ids = torch.randint(0, 500, (2, 12))
            ids[random.randrange(2), 0] = int(np.random.randint(vocab))
            model(input_ids=ids, labels=ids).loss.backward()
            if micro == 0 and between is not None:
                between(step)
        optimizer.step()
        optimizer.zero_grad()
    state = {f"weight/{k}": v.clone() for k, v in model.state_dict().items()}
    for i, moments in optimizer.state_dict()["state"].items():
        state |= {f"adam/{i}/{k}": v.clone() for k, v in moments.items()}
    return state | {"rng/torch": torch.get_rng_state(), "rng/python": torch.tensor(random.random()), "rng/numpy": torch.tensor(np.random.rand())}


def seeded():
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


def bitwise_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# --- the plain loop ----------------------------------------------------------------------------------


def test_a_plain_loop_trains_to_bitwise_the_same_weights_with_evaluations_inside(tokenizer, task, tmp_path):
    seeded()
    alone = train(fresh_model(tokenizer), 6)
    evaluator = InLoop([str(task)], output=tmp_path / "out", recipe="base", methods=["zero-shot", "few-shot", "soft-prompt", "lora"],
                       tokenizer=tokenizer, **SETTINGS)
    seeded()
    model = fresh_model(tokenizer)
    done = []
    evaluated = train(model, 6, between=lambda step: done.append(evaluator.evaluate(model, tokenizer, step=step, tokens=step * 48))
                      if step % 3 == 0 else None)
    assert bitwise_equal(alone, evaluated)
    assert model.training and all(p.requires_grad for p in model.parameters())
    # every method's cell at both steps, filed as the recipe's series
    assert [len([c for c in e.cells if c.status == "done"]) for e in done] == [4, 4]
    points = read_series(tmp_path / "out")["base"]["checkpoints"]
    assert [(p["model"], p["step"], p["tokens"]) for p in points] == [("base@step-3", 3, 144), ("base@step-6", 6, 288)]
    # the second step's prompt starts from the first's
    prompt = json.loads((tmp_path / "out" / "base@step-6" / "capitals" / "soft-prompt" / "results.json").read_text())["config"]["soft_prompt"]
    assert prompt["produced"]["warm_start"]["from"] == "base@step-3"
    # what each call cost is recorded beside its scores
    (first, second) = read_evaluations(tmp_path / "out")
    assert first["step"] == 3 and first["seconds"] > 0 and first["flops"] > 0 and "capitals/soft-prompt/task_accuracy" in first["scores"]


def test_the_bitwise_check_tells_an_evaluation_that_draws_from_the_random_generator(tokenizer):
    """The check above can fail: an evaluation that draws one number from torch's generator (as
    sampling, dropout or a fresh LoRA would) changes the weights training ends with."""
    seeded()
    alone = train(fresh_model(tokenizer), 4)
    seeded()
    careless = train(fresh_model(tokenizer), 4, between=lambda step: torch.rand(1) if step == 2 else None)
    assert not bitwise_equal(alone, careless)
    seeded()
    guarded = train(model := fresh_model(tokenizer), 4, between=lambda step: _draw_inside_guard(model) if step == 2 else None)
    assert bitwise_equal(alone, guarded)


def _draw_inside_guard(model):
    with training_untouched(model):
        torch.rand(1), random.random(), np.random.rand()


def test_the_guard_restores_modes_gradients_buffers_and_generators_even_when_the_block_fails(tokenizer):
    model = fresh_model(tokenizer)
    model.train()
    model.model.layers[0].eval()  # a module in its own mode stays in it
    model.lm_head.requires_grad_(False)
    ids = torch.randint(0, 500, (2, 8))
    model(input_ids=ids, labels=ids).loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    held = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    buffers = {name: b.clone() for name, b in model.named_buffers()}
    modes = {name: m.training for name, m in model.named_modules()}
    flags = {name: p.requires_grad for name, p in model.named_parameters()}
    before = (torch.get_rng_state(), random.getstate(), np.random.get_state(legacy=False)["state"]["key"].copy())
    rotary = model.model.rotary_emb
    inv_freq = rotary.inv_freq
    with pytest.raises(RuntimeError, match="inside"), torch.autocast("cpu", dtype=torch.bfloat16), torch.inference_mode():
        with training_untouched(model):
            assert not model.training and not any(p.requires_grad for p in model.parameters())
            assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled() and not torch.is_autocast_enabled("cpu")
            torch.rand(3), random.random(), np.random.rand()
            next(model.buffers()).add_(1.0)
            rotary.register_buffer("inv_freq", inv_freq * 2, persistent=False)  # as a rotary cache grown for a long prompt is
            raise RuntimeError("inside")
    assert rotary.inv_freq is inv_freq
    assert {name: m.training for name, m in model.named_modules()} == modes
    assert {name: p.requires_grad for name, p in model.named_parameters()} == flags
    assert all(p.grad is grads[name] for name, p in model.named_parameters())
    assert all(torch.equal(model.get_parameter(name).grad, g) for name, g in held.items())
    assert all(torch.equal(b, buffers[name]) for name, b in model.named_buffers())
    after = (torch.get_rng_state(), random.getstate(), np.random.get_state(legacy=False)["state"]["key"])
    assert torch.equal(before[0], after[0]) and before[1] == after[1] and np.array_equal(before[2], after[2])


# --- transformers' Trainer ------------------------------------------------------------------------


class Rows(torch.utils.data.Dataset):
    def __init__(self, n: int):
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 500, (n, 12), generator=generator)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def trainer_run(tokenizer, folder: Path, callback=None) -> dict:
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(output_dir=str(folder), max_steps=6, save_steps=3, per_device_train_batch_size=2, learning_rate=1e-3,
                             use_cpu=True, report_to=[], seed=0, disable_tqdm=True, logging_steps=1000,
                             include_num_input_tokens_seen=True, save_only_model=True)
    model = fresh_model(tokenizer)
    trainer = Trainer(model=model, args=args, train_dataset=Rows(24), processing_class=tokenizer, callbacks=[callback] if callback else [])
    trainer.train()
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_the_trainer_callback_evaluates_at_each_save_and_leaves_training_bitwise_the_same(tokenizer, task, tmp_path):
    alone = trainer_run(tokenizer, tmp_path / "alone")
    callback = SoftevalCallback(tasks=[str(task)], output=tmp_path / "out", recipe="trained", methods=["zero-shot", "soft-prompt"], **SETTINGS)
    evaluated = trainer_run(tokenizer, tmp_path / "run", callback)
    assert bitwise_equal(alone, evaluated)
    points = read_series(tmp_path / "out")["trained"]["checkpoints"]
    # at each save, with the tokens the trainer counted (2 rows of 12 tokens a step)
    assert [(p["step"], p["tokens"]) for p in points] == [(3, 72), (6, 144)]
    assert {(c.config["model"], c.config["method"]) for c in finished_cells(tmp_path / "out")} == {
        (f"trained@step-{s}", m) for s in (3, 6) for m in ("zero-shot", "soft-prompt")}


def test_the_trainer_callback_can_evaluate_every_n_steps(tokenizer, task, tmp_path):
    callback = SoftevalCallback(tasks=[str(task)], output=tmp_path / "out", recipe="trained", methods=["zero-shot"], every=2, **SETTINGS)
    trainer_run(tokenizer, tmp_path / "run", callback)
    assert [p["step"] for p in read_series(tmp_path / "out")["trained"]["checkpoints"]] == [2, 4, 6]  # not at the saves (3, 6) alone


def test_in_loop_cells_equal_a_study_of_the_saved_checkpoints(tokenizer, task, tmp_path):
    """The same weights score the same: the Trainer's saved checkpoints, evaluated afterwards by a
    study, give the cells the callback computed from the live model."""
    callback = SoftevalCallback(tasks=[str(task)], output=tmp_path / "live", recipe="trained", methods=["zero-shot", "few-shot"], **SETTINGS)
    trainer_run(tokenizer, tmp_path / "run", callback)
    from softeval import Study, run_study

    study = Study(models=[{"model": str(tmp_path / "run")}], tasks=[str(task)], methods=["zero-shot", "few-shot"], **SETTINGS)
    run_study(study, output=tmp_path / "after", progress=False)
    live = {(c.config["model"].split("@step-")[1], c.config["method"]): c for c in finished_cells(tmp_path / "live")}
    after = {(c.config["model"].rsplit("checkpoint-", 1)[1], c.config["method"]): c for c in finished_cells(tmp_path / "after")}
    assert live.keys() == after.keys() and len(live) == 4
    for key, cell in live.items():
        assert [s.completion for s in cell.samples] == [s.completion for s in after[key].samples]
        assert cell.metrics == after[key].metrics


# --- failures and the checks before training ---------------------------------------------------------


def test_a_failed_cell_is_recorded_in_it_and_training_goes_on(tokenizer, task, tmp_path):
    evaluator = InLoop([str(task)], output=tmp_path / "out", recipe="base", methods=["zero-shot", "lora"], tokenizer=tokenizer,
                       lora={"targets": ["no_such_layer"]}, **SETTINGS)
    model = fresh_model(tokenizer)
    evaluation = evaluator.evaluate(model, tokenizer, step=5)
    (failed,) = evaluation.failed
    assert failed.folder.name == "lora" and "cannot add LoRA layers" in failed.message
    assert "cannot add LoRA layers" in json.loads((failed.folder / "failure.json").read_text())["error"]
    assert [c.config["method"] for c in finished_cells(tmp_path / "out")] == ["zero-shot"]  # the other cell is kept
    assert read_evaluations(tmp_path / "out")[0]["failures"]
    strict = InLoop([str(task)], output=tmp_path / "strict", recipe="base", methods=["lora"], lora={"targets": ["no_such_layer"]},
                    raise_errors=True, **SETTINGS)
    with pytest.raises(SoftevalError, match="cannot add LoRA layers"):
        strict.evaluate(model, tokenizer, step=5)
    assert all(p.requires_grad for p in model.parameters())  # left as it came, raised or not


def test_an_evaluation_called_in_inference_mode_still_tunes_its_soft_prompt(tokenizer, task, tmp_path):
    """Lightning saves checkpoints (and calls a callback's on_save_checkpoint) in its validation
    loop, under torch.inference_mode: a soft prompt is tuned there all the same."""
    evaluator = InLoop([str(task)], output=tmp_path / "out", recipe="base", methods=["soft-prompt"], raise_errors=True, **SETTINGS)
    model = fresh_model(tokenizer)
    with torch.inference_mode():
        evaluation = evaluator.evaluate(model, tokenizer, step=1)
    assert [cell.status for cell in evaluation.cells] == ["done"] and not evaluation.failures


def test_a_folder_that_cannot_take_the_checkpoint_is_recorded_and_training_goes_on(tokenizer, task, tmp_path):
    evaluator = InLoop([str(task)], output=tmp_path / "out", recipe="base", methods=["zero-shot"], **SETTINGS)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "series.json").write_text("{cut short")  # damaged after the checks at construction
    model = fresh_model(tokenizer)
    evaluation = evaluator.evaluate(model, tokenizer, step=1)
    assert evaluation.failures and "series.json cannot be read" in evaluation.failures[0] and model.training
    strict = InLoop([str(task)], output=tmp_path / "strict", recipe="base", methods=["zero-shot"], raise_errors=True, **SETTINGS)
    (tmp_path / "strict").mkdir()
    (tmp_path / "strict" / "series.json").write_text("{cut short")
    with pytest.raises(SoftevalError, match="series.json cannot be read"):
        strict.evaluate(model, tokenizer, step=1)


def test_the_reports_are_written_at_most_every_refresh_interval_and_at_close(tokenizer, task, tmp_path):
    from softeval.analysis import finished_cells as cells_in

    evaluator = InLoop([str(task)], output=tmp_path / "out", recipe="base", methods=["zero-shot"], refresh_every=3600, **SETTINGS)
    model = fresh_model(tokenizer)
    evaluator.evaluate(model, tokenizer, step=1)
    evaluator.evaluate(model, tokenizer, step=2)
    compared = lambda: len(json.loads((tmp_path / "out" / "comparison.json").read_text())["cells"])  # noqa: E731
    assert len(cells_in(tmp_path / "out")) == 2 and compared() == 1  # the second call's cell is on disk, its report behind
    evaluator.close()
    assert compared() == 2


@pytest.mark.parametrize("settings, message", [
    ({"tasks": ["no_such_task"]}, "unknown task 'no_such_task'"),
    ({"methods": ["zero-shot", "two-shot"]}, "InLoop: methods: unknown method 'two-shot'"),
    ({"data_dir": "/no/such/mirror"}, "InLoop: data folder not found: /no/such/mirror"),
    ({"recipe": "a/b"}, "InLoop: recipe 'a/b' cannot name a folder"),
    ({"limit": 0}, "InLoop: limit: Input should be greater than or equal to 1"),
    ({"fast": {"tasks": ["other"]}}, "fast.tasks names 'other', which is not among tasks"),
])
def test_mistakes_are_one_line_errors_before_training_starts(task, tmp_path, settings, message):
    arguments = {"tasks": [str(task)], "output": tmp_path / "out", "recipe": "base"} | settings
    with pytest.raises(SoftevalError) as raised:
        InLoop(**arguments)
    assert message in str(raised.value) and "\n" not in str(raised.value)
    assert not (tmp_path / "out").exists()


def test_an_output_folder_of_other_series_or_settings_is_refused_before_training(tokenizer, task, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "series.json").write_text(json.dumps({"base": {"checkpoints": [], "reference": None}}))  # a study's series
    with pytest.raises(SoftevalError, match="holds a series 'base' of a study's checkpoints"):
        InLoop([str(task)], output=out, recipe="base", **SETTINGS)
    evaluator = InLoop([str(task)], output=out, recipe="wide", methods=["zero-shot"], **SETTINGS)
    evaluator.evaluate(fresh_model(tokenizer), tokenizer, step=1)
    with pytest.raises(SoftevalError, match=r"holds series 'wide', evaluated with another limit \(12 there, 6 here\)"):
        InLoop([str(task)], output=out, recipe="narrow", methods=["zero-shot"], **(SETTINGS | {"limit": 6}))
    InLoop([str(task)], output=out, recipe="wide", methods=["zero-shot"], **SETTINGS)  # the same run, restarted: goes on


def test_a_tokenizer_the_tasks_cannot_use_is_refused_before_training(tokenizer, task, tmp_path):
    from tokenizers import Tokenizer

    with pytest.raises(SoftevalError, match="not a transformers tokenizer"):
        InLoop([str(task)], output=tmp_path / "out", recipe="base", tokenizer=Tokenizer.from_file(str(Path(tokenizer.name_or_path) / "tokenizer.json")))
    with pytest.raises(SoftevalError, match="the tokenizer has no chat template"):
        base = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
        base.chat_template = None
        InLoop([str(task)], output=tmp_path / "out", recipe="base", tokenizer=base, chat=True)


# --- distributed training ----------------------------------------------------------------------------


def torchrun(tokenizer_dirs, task, out: Path, scenario: str) -> list[dict]:
    """tests/ddp_training.py on two CPU processes (gloo); each rank's record."""
    import os
    import subprocess
    import sys

    script = Path(__file__).with_name("ddp_training.py")
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(script.parent)}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(29500 + os.getpid() % 1000),
                           str(script), str(tokenizer_dirs["llama"]), str(task), str(out), scenario],
                          capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(2)]


def test_ddp_ranks_share_the_cells_rank_0_files_them_and_training_is_unchanged(tokenizer_dirs, task, tmp_path):
    ranks = torchrun(tokenizer_dirs, task, tmp_path / "out", "spread")
    assert all(rank["same_weights"] for rank in ranks)
    # rank 1 evaluated its share (one method of three), rank 0 the rest, and gathered all of them
    shares = [{Path(folder).name for e in rank["evaluations"] for folder, _ in e["cells"]} for rank in ranks]
    assert shares[1] == {"few-shot"} and shares[0] == {"zero-shot", "few-shot", "soft-prompt"}
    # rank 0 gathered every cell and filed both steps
    assert {(c.config["model"], c.config["method"]) for c in finished_cells(tmp_path / "out")} == {
        (f"ddp@step-{s}", m) for s in (2, 4) for m in ("zero-shot", "few-shot", "soft-prompt")}
    assert [p["step"] for p in read_series(tmp_path / "out")["ddp"]["checkpoints"]] == [2, 4]
    assert all(len(line["cells"]) == 3 and not line["failures"] for line in read_evaluations(tmp_path / "out"))


def test_a_rank_that_fails_or_lags_is_reported_and_no_rank_hangs(tokenizer_dirs, task, tmp_path):
    ranks = torchrun(tokenizer_dirs, task, tmp_path / "out", "faults")
    first, second = read_evaluations(tmp_path / "out")
    assert first["failures"] == ["rank 1: ddp@step-2: RuntimeError: out of memory on rank 1"]
    assert second["failures"] == ["rank 1 did not report its cells of ddp@step-4 within 3 s; they are read once they land (or raise rank_timeout)"]
    assert len(first["cells"]) == 2 and len(second["cells"]) == 2  # rank 0's own share, filed without waiting further
    assert ranks[1]["evaluations"][0]["failures"] == ["ddp@step-2: RuntimeError: out of memory on rank 1"]
    # the lagging rank's cells land after all, and the folder's next refresh reads them
    assert (tmp_path / "out" / "ddp@step-4" / "capitals" / "few-shot" / "results.json").is_file()
    # a model sharded over the ranks (FSDP2) is refused before training, in one line
    assert all(rank["sharded"].startswith("InLoop: FSDPLlamaForCausalLM is sharded (FSDP)") and "\n" not in rank["sharded"] for rank in ranks)


# --- softeval watch --------------------------------------------------------------------------------


def stage_checkpoints(tokenizer, folder: Path, steps: list[int]) -> Path:
    """Checkpoint folders of different weights, as a trainer would save them."""
    for seed, step in enumerate(steps):
        model = fresh_model(tokenizer, seed)
        model.save_pretrained(folder / f"checkpoint-{step}")
        tokenizer.save_pretrained(folder / f"checkpoint-{step}")
    return folder


def cli(*args, timeout: int = 600):
    import os
    import subprocess
    import sys

    env = os.environ | {"OMP_NUM_THREADS": "1", "COLUMNS": "500"}
    return subprocess.run([sys.executable, "-c", "from softeval.cli import main; main()", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_watch_evaluates_each_checkpoint_once_and_a_half_written_one_only_once_complete(tokenizer, task, tmp_path):
    import subprocess
    import sys

    staged = stage_checkpoints(tokenizer, tmp_path / "staged", [10, 20, 30])
    run = tmp_path / "run"
    run.mkdir()
    writer = subprocess.Popen([sys.executable, str(Path(__file__).with_name("checkpoint_writer.py")), str(staged), str(run), "checkpoint-20", "5"])
    try:
        done = cli("watch", run, "--output", tmp_path / "out", "--task", task, "--method", "zero-shot,soft-prompt", "--k", 2, "--limit", 6,
                   "--steps", 2, "--eval-every", 2, "--val-size", 4, "--poll", 0.2, "--settle", 1, "--until-step", 30)
    finally:
        writer.wait(timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "waiting for" in done.stderr and "holds" in done.stderr  # it said what it waited for, the half-written weights among it
    lines = read_evaluations(tmp_path / "out")
    assert [line["model"] for line in lines] == ["run@checkpoint-10", "run@checkpoint-20", "run@checkpoint-30"]  # each once, in order
    assert all(not line["failures"] and len(line["cells"]) == 2 for line in lines)
    for step in (10, 20, 30):  # the weights evaluated are those the writer finished
        cell = json.loads((tmp_path / "out" / f"run@checkpoint-{step}" / "capitals" / "zero-shot" / "results.json").read_text())
        assert cell["identity"]["model"]["weights_sha256"] == load_model(str(staged / f"checkpoint-{step}"), lazy=True).identity["weights_sha256"]
    prompt = json.loads((tmp_path / "out" / "run@checkpoint-30" / "capitals" / "soft-prompt" / "results.json").read_text())["config"]["soft_prompt"]
    assert prompt["produced"]["warm_start"]["from"] == "run@checkpoint-20"
    assert [p["step"] for p in read_series(tmp_path / "out")["run"]["checkpoints"]] == [10, 20, 30]


def test_watch_waits_for_the_index_of_a_sharded_save_and_skips_a_trainers_staging_folder(tokenizer, tmp_path):
    from softeval.loop.watch import checkpoint_folders, incomplete_reason

    run = stage_checkpoints(tokenizer, tmp_path / "run", [1])
    (run / "checkpoint-1" / "model.safetensors").rename(run / "checkpoint-1" / "model-00001-of-00002.safetensors")
    assert incomplete_reason(run / "checkpoint-1") == "model.safetensors.index.json is not there yet"
    (run / "tmp-checkpoint-2").mkdir()
    assert [step for _, step in checkpoint_folders(run)] == [1]


def test_watch_records_a_checkpoint_that_fails_to_load_goes_on_and_resumes_after_a_restart(tokenizer, task, tmp_path):
    run = stage_checkpoints(tokenizer, tmp_path / "run", [1, 2, 3])
    (run / "checkpoint-2" / "config.json").write_text("{not json")  # complete on disk, and unreadable
    args = ["watch", run, "--output", tmp_path / "out", "--task", task, "--method", "zero-shot", "--k", 2, "--limit", 6, "--settle", 0, "--once"]
    first = cli(*args)
    assert first.returncode == 0, first.stderr[-3000:]
    lines = read_evaluations(tmp_path / "out")
    assert [(line["model"], bool(line["failures"])) for line in lines] == [("run@checkpoint-1", False), ("run@checkpoint-2", True),
                                                                            ("run@checkpoint-3", False)]
    assert "cannot load model" in lines[1]["failures"][0] and "\n" not in lines[1]["failures"][0]
    again = cli(*args)  # a restart: nothing is evaluated twice
    assert again.returncode == 0 and len(read_evaluations(tmp_path / "out")) == 3 and "evaluated 0 checkpoints" in again.stdout
    missing = cli("watch", tmp_path / "no-run", "--output", tmp_path / "out", "--task", task)
    assert missing.returncode == 2 and missing.stderr.strip().splitlines()[-1].startswith("error: run folder not found:")


# --- Lightning -----------------------------------------------------------------------------------


def lightning_run(tokenizer, callback=None) -> dict:
    lightning = pytest.importorskip("lightning")

    class Module(lightning.LightningModule):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def training_step(self, batch, _index):
            return self.model(input_ids=batch["input_ids"], labels=batch["labels"]).loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    lightning.seed_everything(0, verbose=False)
    module = Module(fresh_model(tokenizer))
    trainer = lightning.Trainer(max_steps=4, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                                enable_model_summary=False, callbacks=[callback] if callback else [])
    trainer.fit(module, torch.utils.data.DataLoader(Rows(16), batch_size=2, shuffle=True))
    return {k: v.clone() for k, v in module.model.state_dict().items()}


def test_the_lightning_callback_evaluates_every_n_steps_and_leaves_training_the_same(tokenizer, task, tmp_path):
    from softeval import SoftevalLightningCallback

    alone = lightning_run(tokenizer)
    evaluator = InLoop([str(task)], output=tmp_path / "out", recipe="lit", methods=["zero-shot"], **SETTINGS)
    callback = SoftevalLightningCallback(evaluator, tokenizer, every=2, tokens_per_step=24)
    assert bitwise_equal(alone, lightning_run(tokenizer, callback))
    assert [(p["step"], p["tokens"]) for p in read_series(tmp_path / "out")["lit"]["checkpoints"]] == [(2, 48), (4, 96)]


# --- fast and full sets, adaptive tuning ------------------------------------------------------------


def test_a_fast_set_runs_at_every_call_and_the_full_set_every_nth_into_folders_of_their_own(tokenizer, task, tmp_path):
    evaluator = InLoop([str(task)], output=tmp_path / "out", recipe="base", methods=["zero-shot", "soft-prompt"], fast={"limit": 4, "steps": 1},
                       full_every=2, **SETTINGS)
    model = fresh_model(tokenizer)
    for step in (1, 2, 3):
        evaluator.evaluate(model, tokenizer, step=step)
    evaluator.evaluate(model, tokenizer, step=4, full=True)  # e.g. at the last step
    full = read_series(tmp_path / "out")["base"]["checkpoints"]
    fast = read_series(tmp_path / "out" / "fast")["base"]["checkpoints"]
    assert [p["step"] for p in full] == [1, 3, 4] and [p["step"] for p in fast] == [1, 2, 3, 4]
    assert {len(c.samples) for c in finished_cells(tmp_path / "out")} == {12} and {len(c.samples) for c in finished_cells(tmp_path / "out" / "fast")} == {4}
    # the fast set's first prompt tunes the full steps; later ones one step from the step before's
    tuned = {c.config["model"]: c.tuning["steps"] for c in finished_cells(tmp_path / "out" / "fast") if c.tuning}
    assert tuned == {"base@step-1": TUNING["steps"], "base@step-2": 1, "base@step-3": 1, "base@step-4": 1}


def test_adaptive_tuning_stops_once_format_following_stalls_and_says_so_beside_the_score(tokenizer, task, tmp_path):
    from softeval.reports.comparison import cost
    from softeval.tuning.tuner import stalled

    assert not stalled([{"format_following": 0.1}, {"format_following": 0.3}], 1)
    assert stalled([{"format_following": 0.3}, {"format_following": 0.3}], 1)  # not above its best
    assert not stalled([{"format_following": 0.3}, {"format_following": 0.2}, {"format_following": 0.4}], 2)
    assert stalled([{"format_following": 0.3}, {"format_following": 0.2}, {"format_following": 0.3}], 2)
    assert not stalled([{"format_following": 0.0}] * 9, None)  # the fixed-steps protocol unless asked
    evaluator = InLoop([str(task)], output=tmp_path / "out", recipe="base", methods=["soft-prompt"], k=2, limit=12,
                       tuning=TUNING | {"steps": 8, "eval_every": 2, "patience": 1})
    evaluator.evaluate(fresh_model(tokenizer), tokenizer, step=1)
    (cell,) = finished_cells(tmp_path / "out")
    curve = json.loads((tmp_path / "out" / "base@step-1" / "capitals" / "prompt" / "curve.json").read_text())
    # a random tiny model never keeps the format: no validation rises above the untuned start
    assert [p["format_following"] for p in curve] == [0.0, 0.0]
    assert cell.tuning["steps"] == 2 and cell.tuning["stopped_early"] == {"step": 2, "patience": 1, "best_step": 0, "of_steps": 8}
    assert "stopped at step 2 of 8 (patience 1)" in cost(cell)


# --- trackers at the training step -------------------------------------------------------------------


def test_trackers_log_each_checkpoint_at_its_training_step_into_the_trainings_own_run(tokenizer, task, tmp_path, monkeypatch):
    import mlflow
    import wandb
    from mlflow.tracking import MlflowClient

    from test_trackers import tracker_env, wandb_run

    uri = tracker_env(monkeypatch, tmp_path)
    model = fresh_model(tokenizer)
    # softeval's own runs, where training has none
    evaluator = InLoop([str(task)], output=tmp_path / "own", recipe="own", methods=["zero-shot"], wandb="project", mlflow=uri, **SETTINGS)
    for step in (10, 20):
        evaluator.evaluate(model, tokenizer, step=step, tokens=step * 100)
    evaluator.close()
    logged = [row for row in wandb_run(tmp_path / "wandb_dir")["history"] if "softeval/step" in row]
    assert [(row["softeval/step"], row["softeval/tokens"]) for row in logged] == [(10, 1000.0), (20, 2000.0)]
    accuracy = [c.metrics["task_accuracy"].value for c in finished_cells(tmp_path / "own")]
    assert [row["softeval/capitals/zero-shot/task_accuracy"] for row in logged] == accuracy
    assert all(row["softeval/cost/seconds"] > 0 and row["softeval/cost/flops"] > 0 for row in logged)
    client = MlflowClient(tracking_uri=uri)
    (own,) = client.search_runs([client.get_experiment_by_name("softeval").experiment_id])
    history = client.get_metric_history(own.info.run_id, "softeval/capitals/zero-shot/task_accuracy")
    assert sorted((m.step, m.value) for m in history) == list(zip((10, 20), accuracy)) and own.info.status == "FINISHED"
    # the training's own runs, where it has them (transformers' Trainer opens them so)
    mlflow.set_tracking_uri(uri)
    with mlflow.start_run(run_name="training") as training_run:
        run = wandb.init(project="training", name="training")
        run.log({"train/loss": 1.0})
        evaluator = InLoop([str(task)], output=tmp_path / "theirs", recipe="theirs", methods=["zero-shot"], wandb="project", mlflow=uri, **SETTINGS)
        evaluator.evaluate(model, tokenizer, step=30)
        evaluator.close()
        assert wandb.run is run  # left to the training to finish
        run.finish()
    assert len(list((tmp_path / "wandb_dir").glob("wandb/offline-run-*"))) == 2  # softeval's own, then the training's: none more
    theirs = client.get_metric_history(training_run.info.run_id, "softeval/capitals/zero-shot/task_accuracy")
    assert [m.step for m in theirs] == [30]
    assert len(client.search_runs([client.get_experiment_by_name("softeval").experiment_id])) == 1
