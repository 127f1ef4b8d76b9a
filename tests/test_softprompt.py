"""Soft prompt: placement after padding and BOS, batch independence, files, tuning and resume."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from test_engine import SHARED, TEXTS, _prompt_ids
from test_tasks import ROWS, write_user_task

from softeval import SoftevalError, load_task
from softeval.engine import Engine
from softeval.prompts import Cloze
from softeval.softprompt import initial_vectors, load_soft_prompt, save_soft_prompt
from softeval.tune import TuneConfig, Tuner, tune


def _soft(lm, length=4, seed=0):
    return initial_vectors(lm, length, "vocab", seed=seed)


@pytest.mark.parametrize("prefix", ["", SHARED])
def test_generation_with_soft_prompt_is_independent_of_batch(tiny_lm, prefix):
    prompts = [_prompt_ids(tiny_lm, prefix + t) for t in TEXTS]
    soft = _soft(tiny_lm)
    together = Engine(tiny_lm, batch_size=4, soft_prompt=soft).generate(prompts, stop=["\n"], max_new_tokens=8)
    alone = Engine(tiny_lm, batch_size=1, soft_prompt=soft).generate(prompts, stop=["\n"], max_new_tokens=8)
    assert [c.text for c in together] == [c.text for c in alone]
    plain = Engine(tiny_lm, batch_size=4).generate(prompts, stop=["\n"], max_new_tokens=8)
    assert [c.text for c in plain] != [c.text for c in together]  # the prompt does change the output


def test_soft_prompt_sits_after_bos(tiny_lm):
    """Loglikelihoods equal a single unpadded forward pass over [BOS] + soft + tokens."""
    soft = _soft(tiny_lm)
    context, option = _prompt_ids(tiny_lm, TEXTS[0]), tiny_lm.encode(" carbon dioxide")
    short = _prompt_ids(tiny_lm, TEXTS[2])  # a shorter row forces padding on the first
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


def test_save_load_and_model_mismatch(tmp_path, tiny_llama, tiny_gemma):
    soft = _soft(tiny_llama)
    path = tmp_path / "p.safetensors"
    save_soft_prompt(path, soft, {"model": tiny_llama.identity, "task": "x"})
    loaded, meta = load_soft_prompt(path, tiny_llama)
    assert torch.equal(loaded, soft) and meta["task"] == "x"
    with pytest.raises(SoftevalError, match="was tuned for model"):
        load_soft_prompt(path, tiny_gemma)
    save_soft_prompt(path, torch.zeros(4, 32), {})
    with pytest.raises(SoftevalError, match="hidden size 32"):
        load_soft_prompt(path, tiny_llama)


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


def test_resume_ends_with_the_same_prompt(tmp_path, tiny_llama, monkeypatch):
    spec = _task(tmp_path)
    config = TuneConfig(steps=6, lr=0.05, length=4, eval_every=2, val_size=8)
    whole = tune(tiny_llama, spec, config, output=tmp_path / "whole", progress=False)

    original = Tuner.step

    def crash_at_step_3(self, step):
        if step == 3:
            raise KeyboardInterrupt
        return original(self, step)

    monkeypatch.setattr(Tuner, "step", crash_at_step_3)
    with pytest.raises(KeyboardInterrupt):
        tune(tiny_llama, spec, config, output=tmp_path / "split", progress=False)
    assert not (tmp_path / "split" / "soft_prompt.safetensors").exists()
    monkeypatch.setattr(Tuner, "step", original)
    resumed = tune(tiny_llama, spec, config, output=tmp_path / "split", resume=True, progress=False)

    a, _ = load_soft_prompt(tmp_path / "whole")
    b, _ = load_soft_prompt(tmp_path / "split")
    assert torch.allclose(a, b, atol=1e-6)
    assert resumed["final"]["step"] == whole["final"]["step"] == 6
    with safe_open(str(tmp_path / "split" / "checkpoint.safetensors"), "pt") as f:
        assert f.metadata()["step"] == "6"
    assert (tmp_path / "whole" / "curve.png").stat().st_size > 1000


def test_nan_loss_stops_with_a_clear_error(tmp_path, tiny_llama, monkeypatch):
    spec = _task(tmp_path)
    monkeypatch.setattr(Tuner, "loss", lambda self, batch: torch.tensor(float("nan"), requires_grad=True))
    with pytest.raises(SoftevalError, match="loss became nan at step 0; lower --lr"):
        tune(tiny_llama, spec, TuneConfig(steps=2, length=4), output=tmp_path / "nan", progress=False)


def test_peft_export_gives_the_same_logits(tmp_path, tiny_model_dirs, tiny_lm):
    from peft import PeftModel

    from softeval import load_model
    from softeval.export import export_peft

    soft = _soft(tiny_lm, length=5, seed=2)
    export_peft(soft, tiny_lm, tmp_path / "adapter")
    arch = next(a for a, folder in tiny_model_dirs.items() if tiny_lm.identity["folder"] == str(folder.resolve()))
    fresh = load_model(str(tiny_model_dirs[arch]), device="cpu")
    peft_model = PeftModel.from_pretrained(fresh.model, tmp_path / "adapter")
    ids = tiny_lm.encode(TEXTS[0])  # PEFT input: the text without BOS
    with torch.no_grad():
        theirs = peft_model(input_ids=torch.tensor([ids])).logits[0, -len(ids) :]
        engine = Engine(tiny_lm, soft_prompt=soft)
        embeds, mask, positions = engine.inputs([_prompt_ids(tiny_lm, TEXTS[0])])
        hidden = engine.decoder(inputs_embeds=embeds, attention_mask=mask, position_ids=positions).last_hidden_state
        ours = engine.logits(hidden)[0, -len(ids) :]
    assert torch.allclose(theirs, ours, atol=1e-4)
