"""Soft prompt: placement after padding and BOS, batch independence, files, tuning and resume."""

from __future__ import annotations

import importlib

import pytest
import torch
from safetensors import safe_open

from conftest import ROWS, SHARED, TEXTS, prompt_ids, write_user_task
from softeval import SoftevalError, evaluate, load_task
from softeval.engine import Engine
from softeval.engine import forward as engine_forward
from softeval.tasks import Cloze, tuning_target
from softeval.tuning import SoftPrompt, TuneConfig, initial_vectors, load_soft_prompt, save_soft_prompt, tune
from softeval.tuning.tuner import Tuner


def _soft(lm, length=4, seed=0):
    return initial_vectors(lm, length, "vocab", seed=seed)


@pytest.mark.parametrize("prefix", ["", SHARED])
def test_generation_with_soft_prompt_is_independent_of_batch(tiny_lm, prefix):
    prompts = [prompt_ids(tiny_lm, prefix + t) for t in TEXTS]
    soft = _soft(tiny_lm)
    together = Engine(tiny_lm, batch_size=4, soft_prompt=soft).generate(prompts, stop=["\n"], max_new_tokens=8)
    alone = Engine(tiny_lm, batch_size=1, soft_prompt=soft).generate(prompts, stop=["\n"], max_new_tokens=8)
    assert [c.text for c in together] == [c.text for c in alone]
    plain = Engine(tiny_lm, batch_size=4).generate(prompts, stop=["\n"], max_new_tokens=8)
    assert [c.text for c in plain] != [c.text for c in together]  # the prompt does change the output


def test_soft_prompt_sits_after_bos(tiny_lm, monkeypatch):
    """Loglikelihoods equal a single unpadded forward pass over [BOS] + soft + tokens."""
    soft = _soft(tiny_lm)
    context, option = prompt_ids(tiny_lm, TEXTS[0]), tiny_lm.encode(" carbon dioxide")
    short = prompt_ids(tiny_lm, TEXTS[2])  # a shorter row forces padding on the first
    monkeypatch.setattr(engine_forward, "PADDING_SLACK", 10.0)  # which the batch then takes
    got = Engine(tiny_lm, batch_size=2, soft_prompt=soft).loglikelihood([Cloze(context, [option]), Cloze(short, [option])])[0][0]
    embed = tiny_lm.model.get_input_embeddings()
    n_head = 1 if tiny_lm.bos_token_id is not None else 0
    ids = torch.tensor(context + option)
    with torch.no_grad():
        embeds = torch.cat([embed(ids[:n_head]), soft, embed(ids[n_head:])])[None]
        logprobs = torch.log_softmax(tiny_lm.model(inputs_embeds=embeds).logits[0], -1)
    start = len(context) + len(soft) - 1
    expected = sum(float(logprobs[start + j, t]) for j, t in enumerate(option))
    assert got == pytest.approx(expected, abs=1e-3)


def test_vocab_init_goes_through_the_embedding_module(tiny_gemma):
    vectors = initial_vectors(tiny_gemma, 6, "vocab", seed=3)
    raw_norm = tiny_gemma.model.get_input_embeddings().weight[:5000].norm(dim=-1).mean()
    # Gemma scales embeddings by sqrt(hidden) = 8 on the way in
    assert float(vectors.norm(dim=-1).mean()) == pytest.approx(8 * float(raw_norm), rel=0.3)
    text = initial_vectors(tiny_gemma, 6, "text", text="Answer with a letter")
    assert text.shape == (6, tiny_gemma.hidden_size)


def _tuned(tmp_path, lm, spec, chat=False, steps=2) -> SoftPrompt:
    tune(lm, spec, TuneConfig(steps=steps, length=3, eval_every=steps, val_size=4, chat=chat), output=tmp_path / "p", progress=False)
    return load_soft_prompt(tmp_path / "p")


def test_a_prompt_records_what_it_was_tuned_for(tmp_path, tiny_llama):
    spec = _task(tmp_path)
    prompt = _tuned(tmp_path, tiny_llama, spec)
    meta = prompt.metadata
    assert meta["task"] == {"name": "capitals", "spec_sha256": spec.sha256()}
    assert meta["chat"] is False and meta["produced"] == {"by": "tune"}
    assert meta["model"]["config_sha256"] == tiny_llama.identity["config_sha256"]
    assert meta["data"]["tune"]["sha256"] and meta["config"]["steps"] == 2
    prompt.check(tiny_llama, spec, chat=False)  # the task, mode and model it was tuned for


def test_a_prompt_refuses_another_model_task_or_mode(tmp_path, tiny_llama, tiny_gemma):
    spec = _task(tmp_path)
    prompt = _tuned(tmp_path, tiny_llama, spec)
    with pytest.raises(SoftevalError, match=r"takes \(L, 64\)|was tuned for model"):
        prompt.check(tiny_gemma, spec, chat=False)
    with pytest.raises(SoftevalError, match="tuned for task 'capitals', not 'arc_easy'"):
        prompt.check(tiny_llama, load_task("arc_easy"), chat=False)
    changed = spec.model_copy(update={"template": "Q: {{ question }}\n{{ options }}\nA:"})
    with pytest.raises(SoftevalError, match="another version of task 'capitals'"):
        prompt.check(tiny_llama, changed, chat=False)
    with pytest.raises(SoftevalError, match="tuned without the chat template"):
        prompt.check(tiny_llama, spec, chat=True)
    with pytest.raises(SoftevalError, match="tuned without the chat template"):
        evaluate(tiny_llama, spec, "soft-prompt", chat=True, soft_prompt=prompt, progress=False)
    other = SoftPrompt(prompt.vectors, prompt.metadata | {"model": tiny_llama.identity | {"config_sha256": "0" * 64}})
    with pytest.raises(SoftevalError, match=r"\(config_sha256 differs\)"):
        other.check(tiny_llama, spec, chat=False)
    save_soft_prompt(tmp_path / "bad.safetensors", torch.zeros(4, 32), {})
    with pytest.raises(SoftevalError, match=r"has shape \(4, 32\) but model .* takes \(L, 64\)"):
        load_soft_prompt(tmp_path / "bad.safetensors").check(tiny_llama, spec, chat=False)


def _task(tmp_path):
    return load_task(write_user_task(tmp_path, ROWS * 20))


def test_tuning_learns_the_format_and_touches_only_the_prompt(tmp_path, tiny_llama):
    spec = _task(tmp_path)
    config = TuneConfig(steps=30, lr=0.1, length=4, eval_every=10, val_size=8)
    before = {n: p.clone() for n, p in tiny_llama.model.named_parameters()}
    tuner = Tuner(tiny_llama, spec, config)
    first = tuner.loss(tuner.batch(0)).item()
    for step in range(config.steps):
        tuner.step(step)
    assert tuner.loss(tuner.batch(0)).item() < first / 2
    assert all(torch.equal(p, before[n]) for n, p in tiny_llama.model.named_parameters())
    assert all(p.grad is None for p in tiny_llama.model.parameters())


def test_the_tuner_tokenises_each_row_once_however_often_it_is_drawn(tmp_path, tiny_llama, monkeypatch):
    from softeval.tasks import tuning_target

    spec = _task(tmp_path)
    steps, batch = 12, 4
    tuner = Tuner(tiny_llama, spec, TuneConfig(steps=steps, length=4, batch_size=batch, val_size=4))
    built, generation = [], tuner.builder.generation
    monkeypatch.setattr(tuner.builder, "generation", lambda example: built.append(example) or generation(example))
    for step in range(steps):
        tuner.step(step)
    drawn = {id(e) for step in range(steps) for e in tuner.batch(step)}
    assert len(tuner.train) < steps * batch  # so rows are drawn again
    assert sorted(map(id, built)) == sorted(drawn)  # each drawn row's prompt built once
    for example in tuner.batch(0):  # and what is kept is what would be built now
        assert tuner._tokens(example) == (generation(example).ids, tiny_llama.encode(tuning_target(spec, example)))


def _tune_interrupted_at_step(crash_step, lm, spec, config, output, monkeypatch):
    """Run `tune` until it is interrupted at `crash_step`, as a Ctrl-C there would."""
    original = Tuner.step

    def crashing(self, step):
        if step == crash_step:
            raise KeyboardInterrupt
        return original(self, step)

    monkeypatch.setattr(Tuner, "step", crashing)
    with pytest.raises(KeyboardInterrupt):
        tune(lm, spec, config, output=output, progress=False)
    monkeypatch.setattr(Tuner, "step", original)


def test_resume_ends_with_the_same_prompt(tmp_path, tiny_llama, monkeypatch):
    spec = _task(tmp_path)
    config = TuneConfig(steps=6, lr=0.05, length=4, eval_every=2, val_size=8)
    whole = tune(tiny_llama, spec, config, output=tmp_path / "whole", progress=False)

    _tune_interrupted_at_step(3, tiny_llama, spec, config, tmp_path / "split", monkeypatch)
    assert not (tmp_path / "split" / "soft_prompt.safetensors").exists()
    resumed = tune(tiny_llama, spec, config, output=tmp_path / "split", resume=True, progress=False)

    a, b = load_soft_prompt(tmp_path / "whole").vectors, load_soft_prompt(tmp_path / "split").vectors
    assert torch.allclose(a, b, atol=1e-6)
    assert resumed.metadata["final"]["step"] == whole.metadata["final"]["step"] == 6
    assert torch.equal(resumed.vectors, b) and resumed.path == tmp_path / "split" / "soft_prompt.safetensors"
    with safe_open(str(tmp_path / "split" / "checkpoint.safetensors"), "pt") as f:
        assert f.metadata()["step"] == "6"
    chart = (tmp_path / "whole" / "curve.svg").read_text()  # drawn once, when the tuning ends
    assert chart.startswith("<svg") and "validation (%)" in chart and "format following" in chart


def test_nan_loss_stops_with_a_clear_error(tmp_path, tiny_llama, monkeypatch):
    spec = _task(tmp_path)
    monkeypatch.setattr(Tuner, "loss", lambda self, batch, backward=False: torch.tensor(float("nan")))
    with pytest.raises(SoftevalError, match="loss became nan at step 0; lower --lr"):
        tune(tiny_llama, spec, TuneConfig(steps=2, length=4), output=tmp_path / "nan", progress=False)


def test_a_non_finite_gradient_stops_before_anything_is_written(tmp_path, tiny_llama, monkeypatch):
    """The loss is finite but its gradient is not: no checkpoint or prompt may take in NaN."""
    spec = _task(tmp_path)
    original = Tuner.__init__

    def poisoned_gradient(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.prompt.register_hook(lambda grad: grad * float("nan"))

    monkeypatch.setattr(Tuner, "__init__", poisoned_gradient)
    out = tmp_path / "nan-grad"
    with pytest.raises(SoftevalError, match="gradient became non-finite at step 0"):
        tune(tiny_llama, spec, TuneConfig(steps=2, length=4, eval_every=1, val_size=4), output=out, progress=False)
    assert not (out / "checkpoint.safetensors").exists() and not (out / "soft_prompt.safetensors").exists()


def test_a_non_finite_validation_loss_stops_before_anything_is_written(tmp_path, tiny_llama, monkeypatch):
    """The last step's loss and gradient were finite, but the prompt it left overflows the model
    (as a learning rate near float32's limit does): it would otherwise be saved and scored as if
    it were a tuned prompt."""
    spec = _task(tmp_path)
    original = Tuner.validate
    calls = []

    def overflowing_after_tuning(self, bars=None):
        metrics = original(self, bars)
        calls.append(1)
        return metrics if len(calls) == 1 else {**metrics, "val_loss": float("nan")}  # the untuned start is fine

    monkeypatch.setattr(Tuner, "validate", overflowing_after_tuning)
    out = tmp_path / "overflow"
    with pytest.raises(SoftevalError, match="the validation loss became nan after step 1; lower --lr"):
        tune(tiny_llama, spec, TuneConfig(steps=1, length=4, val_size=4), output=out, progress=False)
    assert not (out / "checkpoint.safetensors").exists() and not (out / "soft_prompt.safetensors").exists()


def test_settings_above_the_rows_there_are_say_what_is_used(tmp_path, tiny_llama, caplog, monkeypatch):
    import softeval.tuning.tuner as tuner_module

    monkeypatch.setattr(tuner_module, "_said", set())  # what earlier tests had logged
    caplog.set_level("INFO", logger="softeval")
    spec = load_task(write_user_task(tmp_path, ROWS * 5))  # 10 rows: 2 held out, 8 to train on
    tuner = Tuner(tiny_llama, spec, TuneConfig(length=2, batch_size=12, val_size=5))
    assert (len(tuner.train), len(tuner.val)) == (8, 2)
    said = {r.getMessage(): r.levelname for r in caplog.records}
    which = f"soft-prompt of {tiny_llama.name} on capitals (without the chat template)"
    assert said[f"{which}: batch size 12, but capitals has 8 training rows, and each step takes all of them"] == "WARNING"
    assert said[f"{which}: validation size 5, but only 2 rows (a fifth of capitals's tuning split) are held out; validating on those"] == "WARNING"
    caplog.clear()
    Tuner(tiny_llama, spec, TuneConfig(length=2, batch_size=12, val_size=5, lr=0.1))  # a sweep's next trial: said once
    assert "validation size" not in caplog.text and "batch size" not in caplog.text
    with Tuner(tiny_llama, spec, TuneConfig(length=2, batch_size=12, val_size=5, method="lora")):  # another tuning: said for it
        pass
    assert f"lora of {tiny_llama.name} on capitals (without the chat template): validation size 5" in caplog.text
    caplog.clear()
    Tuner(tiny_llama, spec, TuneConfig(length=2))  # the default 64 shrinks as documented: not a warning
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
    assert "validation size 64, but only 2 rows" in caplog.text
    caplog.clear()
    Tuner(tiny_llama, spec, TuneConfig(length=2, batch_size=8, val_size=2))
    assert "validation size" not in caplog.text and "batch size" not in caplog.text


def test_tuning_loss_equals_a_reference_cross_entropy(tmp_path, tiny_lm, monkeypatch):
    """Batch of mixed lengths with a soft prompt, in micro-batches of one row and chunks of 3 target
    tokens: the same loss and gradient as each example's target cross-entropy from one unpadded
    forward pass, averaged over all target tokens."""
    rows = [{"q": "Capital of " + country + "?", "a": "Paris", "b": "Rome", "gold": i % 2} for i, country in
            enumerate(["France", "the Italian Republic of the south", "a very long-named country far away", "Spain", "Portugal"])]
    spec = load_task(write_user_task(tmp_path, rows, target=" {{ letter }}. {{ choices[gold] }}"))
    module = importlib.import_module("softeval.tuning.tuner")  # the module, not the function softeval exports
    monkeypatch.setattr(importlib.import_module("softeval.engine.loss"), "LOSS_CHUNK", 3)
    monkeypatch.setattr(module, "TOKEN_BUDGET", 1)
    tuner = Tuner(tiny_lm, spec, TuneConfig(length=4, val_size=1))
    batch = tuner.train[:3]
    assert len({len(tuner.builder.generation(e).ids) for e in batch}) > 1  # mixed lengths
    got = float(tuner.loss(batch, backward=True))
    gradient, tuner.prompt.grad = tuner.prompt.grad.clone(), None

    embed = tiny_lm.model.get_input_embeddings()
    total, count = 0.0, 0
    for example in batch:
        prompt = tuner.builder.generation(example).ids
        target = tiny_lm.encode(tuning_target(spec, example))
        ids = torch.tensor(prompt + target)
        n_head = 1 if tiny_lm.bos_token_id is not None else 0
        embeds = torch.cat([embed(ids[:n_head]), tuner.prompt, embed(ids[n_head:])])[None]
        logits = tiny_lm.model(inputs_embeds=embeds).logits[0].float()
        first = len(prompt) + len(tuner.prompt) - 1
        predicted = logits[first : first + len(target)]
        total = total + torch.nn.functional.cross_entropy(predicted, torch.tensor(target), reduction="sum")
        count += len(target)
    reference = total / count
    reference.backward()
    assert got == pytest.approx(reference.item(), rel=1e-4)
    assert (gradient - tuner.prompt.grad).abs().max() < 1e-4 * tuner.prompt.grad.abs().max()


@pytest.mark.cuda
def test_tuning_resume_and_evaluation_on_cuda(tmp_path, tiny_model_dirs, monkeypatch):
    """The prompt, the optimizer state loaded on resume and the engine's tensors live on the GPU."""
    from softeval import load_model

    lm = load_model(str(tiny_model_dirs["llama"]), device="cuda")
    spec = _task(tmp_path)
    config = TuneConfig(steps=4, lr=0.05, length=4, eval_every=2, val_size=4)
    tune(lm, spec, config, output=tmp_path / "whole", progress=False)
    _tune_interrupted_at_step(3, lm, spec, config, tmp_path / "split", monkeypatch)
    tune(lm, spec, config, output=tmp_path / "split", resume=True, progress=False)
    whole, split = load_soft_prompt(tmp_path / "whole"), load_soft_prompt(tmp_path / "split")
    assert torch.allclose(whole.vectors, split.vectors, atol=1e-5)
    result = evaluate(lm, spec, "soft-prompt", soft_prompt=split, progress=False)
    assert result.config["soft_prompt"]["sha256"] == split.sha256


def test_peft_export_gives_the_same_logits(tmp_path, tiny_model_dirs, tiny_lm):
    from peft import PeftModel

    from softeval import load_model
    from softeval.tuning import export_peft

    soft = _soft(tiny_lm, length=5, seed=2)
    export_peft(soft, tiny_lm, tmp_path / "adapter")
    arch = next(a for a, folder in tiny_model_dirs.items() if tiny_lm.identity["folder"] == str(folder.resolve()))
    fresh = load_model(str(tiny_model_dirs[arch]), device="cpu")
    peft_model = PeftModel.from_pretrained(fresh.model, tmp_path / "adapter")
    ids = tiny_lm.encode(TEXTS[0])  # PEFT input: the text without BOS
    with torch.no_grad():
        theirs = peft_model(input_ids=torch.tensor([ids])).logits[0, -len(ids) :]
        engine = Engine(tiny_lm, soft_prompt=soft)
        embeds, mask, positions = engine.forward.inputs([prompt_ids(tiny_lm, TEXTS[0])])
        hidden = engine.forward.decoder(inputs_embeds=embeds, attention_mask=mask, position_ids=positions).last_hidden_state
        ours = engine.forward.logits(hidden)[0, -len(ids) :]
    assert torch.allclose(theirs, ours, atol=1e-4)


def test_tuning_and_evaluation_show_their_progress(tmp_path, tiny_llama, monkeypatch):
    """Long phases draw a bar each: tuning steps, and validation's generation and option scoring."""
    import io

    from rich.console import Console

    shown = io.StringIO()
    monkeypatch.setattr("softeval.progress.console", Console(file=shown, width=200))
    spec = _task(tmp_path)
    tune(tiny_llama, spec, TuneConfig(steps=2, length=2, eval_every=1, val_size=4), output=tmp_path / "t")
    evaluate(tiny_llama, spec, "zero-shot", limit=6)
    lines = shown.getvalue().splitlines()
    name = tiny_llama.name
    assert any(line.startswith(f"{name} capitals: tune") and "2/2" in line for line in lines)
    assert any(line.startswith("validate: generate") and "4/4" in line for line in lines)
    assert any(line.startswith("validate: score options") and "4/4" in line for line in lines)
    assert any(line.startswith(f"{name} capitals zero-shot: score options") and "6/6" in line for line in lines)
