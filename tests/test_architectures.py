"""The conformance suite: on tiny random models of every architecture softeval is checked on,
whichever path the self-check chooses computes what transformers computes: greedy tokens equal
to `generate` one prompt at a time (here pooled, after a shared prefix, behind a soft prompt),
option log-likelihoods within 1e-4 of a full forward, the tuning loss and its gradient equal to a
plain cross-entropy, and LoRA on the architecture's own projections, exported as PEFT loads it."""

from __future__ import annotations

import warnings

import pytest
import torch
from transformers import AutoTokenizer

from architectures import ARCHITECTURES, ONE_ROW_GENERATION, REFERENCE_PATH, WHOLE_ROW_SCORING, build_model, loaded
from conftest import SHARED, TEXTS
from softeval.engine import Engine, ReferenceEngine, start_engine
from softeval.engine.generation import kv_bytes_per_token
from softeval.engine.selfcheck import check_model
from softeval.tasks import Cloze
from softeval.tuning import lora_applied
from softeval.tuning.lora import default_targets, lora_config, save_adapter

NEW_TOKENS = 6
OPTIONS = [" carbon dioxide", " oxygen", " no, not at all really", " x"]


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dirs):
    return AutoTokenizer.from_pretrained(tokenizer_dirs["llama"])


@pytest.fixture(scope="module", params=list(ARCHITECTURES))
def arch(request, tokenizer):
    """(architecture name, its LoadedModel, a soft prompt of 3 vectors for it)."""
    lm = loaded(request.param, tokenizer)
    embed = lm.model.get_input_embeddings()
    with torch.no_grad():
        soft = embed(torch.tensor([11, 222, 3333])).detach()
    return request.param, lm, soft


def _embedded(lm, ids: list[int], soft: torch.Tensor) -> torch.Tensor:
    """(1, tokens + soft prompt, hidden) as softeval places a soft prompt: after BOS, if any."""
    embed = lm.model.get_input_embeddings()
    at = 1 if lm.bos_token_id is not None and ids[:1] == [lm.bos_token_id] else 0
    tokens = embed(torch.tensor(ids))
    return torch.cat([tokens[:at], soft, tokens[at:]])[None]


def _generate(lm, ids: list[int], soft: torch.Tensor) -> list[int]:
    """transformers' greedy `generate` from the prompt's embeddings, cut before EOS. A model
    whose `generate` takes no embeddings (Gemma 3's multimodal class) decodes by full forward
    passes without a cache."""
    embeds = _embedded(lm, ids, soft)
    eos = lm.eos_token_ids
    with torch.no_grad():
        try:
            out = lm.model.generate(inputs_embeds=embeds, attention_mask=torch.ones(embeds.shape[:2], dtype=torch.long),
                                    max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=eos, pad_token_id=eos[0])[0].tolist()
        except ValueError as exc:
            assert "inputs_embeds" in str(exc)
            out, seq = [], list(ids)
            for _ in range(NEW_TOKENS):
                out.append(int(lm.model(inputs_embeds=_embedded(lm, seq, soft)).logits[0, -1].argmax()))
                seq.append(out[-1])
    ended = [i for i, token in enumerate(out) if token in eos]
    return out[: ended[0]] if ended else out


def _full_forward_logprob(lm, context: list[int], option: list[int], soft: torch.Tensor) -> float:
    with torch.no_grad():
        logprobs = torch.log_softmax(lm.model(inputs_embeds=_embedded(lm, context + option, soft)).logits[0].float(), -1)
    start = len(context) + len(soft) - 1
    return sum(float(logprobs[start + j, token]) for j, token in enumerate(option))


def test_the_self_check_chooses_the_expected_path(arch):
    name, lm, _ = arch
    verdict = check_model(lm)
    assert verdict.path == ("reference" if name in REFERENCE_PATH else "fast"), verdict.reason
    assert REFERENCE_PATH.get(name, "") in verdict.reason
    engine = start_engine(lm)
    assert isinstance(engine, ReferenceEngine if name in REFERENCE_PATH else Engine)
    assert engine.check == verdict.record()
    if verdict.path == "fast":  # every figure was measured, and within the tolerance
        assert set(verdict.figures) >= {"next_token_logprob", "greedy_margin", "option_logprob_per_token", "loss_per_token"}
        assert max(v for k, v in verdict.figures.items() if k != "greedy_tokens") <= verdict.tolerance
    else:  # rows batched where the check measured them as alone, else one at a time, saying why
        assert verdict.batched == {"scoring": True, "generation": name not in ONE_ROW_GENERATION, "shared_contexts": name not in WHOLE_ROW_SCORING}
        assert (engine.scoring_rows > 1, engine.generation_rows > 1) == (True, name not in ONE_ROW_GENERATION)
        assert engine.shares_contexts == (name not in WHOLE_ROW_SCORING)
        assert ONE_ROW_GENERATION.get(name, "") in verdict.batch_reason and WHOLE_ROW_SCORING.get(name, "") in verdict.batch_reason


def test_greedy_tokens_equal_generate_while_pooled(arch):
    """Four prompts sharing a prefix, of different lengths, two rows at a time: a row decodes
    beside others and rows join the pool as others end."""
    name, lm, soft = arch
    prompts = [lm.encode(SHARED + text) for text in TEXTS]
    completions = start_engine(lm, soft_prompt=soft, batch_size=2).generate(prompts, stop=["\x00never"], max_new_tokens=NEW_TOKENS)
    assert [c.tokens for c in completions] == [_generate(lm, p, soft) for p in prompts]


def test_option_loglikelihoods_equal_a_full_forward(arch):
    name, lm, soft = arch
    clozes = [Cloze(lm.encode(SHARED + text), [lm.encode(o) for o in OPTIONS]) for text in TEXTS]
    got = start_engine(lm, soft_prompt=soft, batch_size=2).loglikelihood(clozes)
    for cloze, scores in zip(clozes, got):
        expected = [_full_forward_logprob(lm, cloze.context_ids, option, soft) for option in cloze.continuation_ids]
        assert scores == pytest.approx(expected, abs=1e-4)


def test_multi_head_latent_attention_decodes_from_its_compressed_cache(tokenizer):
    """DeepSeek-V3's cache holds a compressed latent and one rotary key per token and layer, which
    its attention expands to every head: the fast path's pools hold those, the KV budget counts
    them, and no shared prefix is kept apart (attention reads the expanded keys, not the cache)."""
    lm = loaded("deepseek_v3", tokenizer)
    config = lm.model.config
    engine = start_engine(lm)
    assert isinstance(engine, Engine)
    latent = config.kv_lora_rank + config.qk_rope_head_dim
    assert kv_bytes_per_token(engine.generation.shapes, torch.float32) == config.num_hidden_layers * latent * 4
    assert not engine.generation.prefix_apart


def test_alibi_biases_come_from_the_models_own_slopes_and_each_keys_position(tokenizer):
    """BLOOM runs on the fast path with its ALiBi slopes read from its own builder (for a
    power-of-two head count, the ALiBi paper's 2^(-8i/n)) and applied at the positions the
    engine gives each key: an option packed after another sits at the positions it would
    take right after its context (the conformance tests above check the scores themselves)."""
    lm = loaded("bloom", tokenizer)
    heads = lm.model.config.n_head
    engine = start_engine(lm)
    assert isinstance(engine, Engine)
    assert engine.forward.alibi_slopes.tolist() == pytest.approx([2 ** (-8 * (i + 1) / heads) for i in range(heads)])
    keys = torch.tensor([[0, 1, 2, 3, 3, 4]])  # a context of three tokens, then two options starting at position 3
    with engine.forward._alibi_at(keys):
        biases = engine.forward.decoder.build_alibi_tensor(None, heads, torch.float32)
    assert biases.shape == (heads, 1, 6)
    torch.testing.assert_close(biases[:, 0], engine.forward.alibi_slopes[:, None] * keys.float())
    assert "build_alibi_tensor" not in vars(engine.forward.decoder)  # the model's own builder again


@pytest.mark.parametrize("name", sorted(REFERENCE_PATH))
def test_the_reference_path_batches_rows_as_if_each_ran_alone(name, tokenizer):
    """Rows of different lengths, batched where the self-check allows it, give each row's
    results alone: greedy completions that end at different steps (a row leaves its batch as it
    ends) and option log-likelihoods. The engine records the largest batch it ran."""
    lm = loaded(name, tokenizer)
    soft = lm.model.get_input_embeddings()(torch.tensor([11, 222, 3333])).detach()
    prompts = [lm.encode(SHARED + text) for text in TEXTS]
    alone = ReferenceEngine(lm, soft_prompt=soft)
    # stop strings taken from the rows' own completions, so that rows end at different steps
    first = alone.generate(prompts, [], NEW_TOKENS)
    stops = [text for r, c in enumerate(first[:3]) if (text := lm.tokenizer.decode(c.tokens[r + 2 :][:1])).strip()]
    expected = alone.generate(prompts, stops, NEW_TOKENS)
    assert len({len(c.tokens) for c in expected}) > 1, "the probe's rows should end at different steps"
    engine = start_engine(lm, soft_prompt=soft)
    got = engine.generate(prompts, stops, NEW_TOKENS)
    assert [(c.tokens, c.text, c.stop_reason) for c in got] == [(c.tokens, c.text, c.stop_reason) for c in expected]
    assert engine.largest_batch == (1 if name in ONE_ROW_GENERATION else len(prompts))
    clozes = [Cloze(prompt, [lm.encode(o) for o in OPTIONS]) for prompt in prompts]
    scores = engine.loglikelihood(clozes)
    assert [s for row in scores for s in row] == pytest.approx([s for row in alone.loglikelihood(clozes) for s in row], abs=1e-4)
    assert engine.largest_batch > 1


def test_tuning_loss_and_gradient_equal_a_plain_cross_entropy(arch):
    name, lm, soft = arch
    pairs = [(lm.encode(SHARED + text), lm.encode(option)) for text, option in zip(TEXTS, OPTIONS)]
    ours_soft = soft.clone().requires_grad_(True)
    engine = start_engine(lm, soft_prompt=ours_soft)
    loss = engine.target_loss(pairs)
    loss.backward()
    reference_soft = soft.clone().requires_grad_(True)
    total = 0
    for prompt, target in pairs:
        logits = lm.model(inputs_embeds=_embedded(lm, prompt + target, reference_soft)).logits[0].float()
        start = len(prompt) + len(soft) - 1
        total = total + torch.nn.functional.cross_entropy(logits[start : start + len(target)], torch.tensor(target), reduction="sum")
    total.backward()
    assert float(loss.detach()) == pytest.approx(float(total.detach()), rel=1e-5, abs=1e-4)
    torch.testing.assert_close(ours_soft.grad, reference_soft.grad, rtol=1e-3, atol=1e-5 * float(reference_soft.grad.abs().max()))


def test_lora_on_the_default_targets_exports_as_peft_loads_it(arch, tokenizer, tmp_path):
    """The default targets reach the architecture's own projections, the adapted model runs on
    the path its own self-check chooses, and PEFT's loader rebuilds the same model."""
    from peft import PeftModel

    name, lm, soft = arch
    targets = default_targets(lm)
    prompt = lm.encode(SHARED + TEXTS[0])
    with lora_applied(lm, lora_config(4, 8, targets), seed=1) as peft_model:
        adapted = [module for module_name, module in peft_model.named_modules() if module_name.endswith("lora_B")]
        assert adapted, targets
        with torch.no_grad():
            for module in adapted:  # a trained adapter: B off zero
                module["default"].weight.normal_(0, 0.5)
        engine = start_engine(lm, soft_prompt=soft)
        assert engine.check["path"] == ("reference" if name in REFERENCE_PATH else "fast")
        ours = engine.loglikelihood([Cloze(prompt, [lm.encode(OPTIONS[0])])])[0][0]
        save_adapter(tmp_path, peft_model, {})
    plain = start_engine(lm, soft_prompt=soft).loglikelihood([Cloze(prompt, [lm.encode(OPTIONS[0])])])[0][0]
    assert abs(ours - plain) > 1e-3  # the adapter changed the model, and unloading restored it
    with warnings.catch_warnings():  # PEFT asks transformers 5 a deprecated question
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing", category=FutureWarning)
        fresh = PeftModel.from_pretrained(build_model(name, tokenizer), tmp_path)
    with torch.no_grad():
        logprobs = torch.log_softmax(fresh(inputs_embeds=_embedded(lm, prompt + lm.encode(OPTIONS[0]), soft)).logits[0].float(), -1)
    option = lm.encode(OPTIONS[0])
    start = len(prompt) + len(soft) - 1
    assert ours == pytest.approx(sum(float(logprobs[start + j, t]) for j, t in enumerate(option)), abs=1e-4)


def test_a_state_space_model_runs_every_method_end_to_end(tmp_path, tokenizer):
    """A tiny Mamba through `softeval run`: zero-shot, few-shot, a tuned soft prompt and LoRA on
    its mixer's projections, every cell on the reference path and saying so."""
    import json

    from typer.testing import CliRunner

    from conftest import ROWS, write_user_task
    from softeval.cli import app

    folder = tmp_path / "tiny-mamba"
    build_model("mamba", tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    task = write_user_task(tmp_path, ROWS * 10)
    out = tmp_path / "report"
    args = ["run", "--model", folder, "--task", task, "--method", "zero-shot,few-shot,soft-prompt,lora", "--k", 2, "--limit", 6,
            "--steps", 2, "--eval-every", 2, "--val-size", 4, "--tune-batch-size", 2, "--length", 2, "--output", out]
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    cells = {path.parent.name: json.loads(path.read_text()) for path in (out / "tiny-mamba" / "capitals").glob("*/results.json")}
    assert set(cells) == {"zero-shot", "few-shot", "soft-prompt", "lora"}
    for cell in cells.values():
        assert cell["engine"]["path"] == "reference" and "state-space" in cell["engine"]["reason"]
        assert cell["n_examples"] == 6
    adapter = json.loads((out / "tiny-mamba" / "capitals" / "adapter" / "adapter_config.json").read_text())
    assert sorted(adapter["target_modules"]) == ["in_proj", "x_proj"]  # dt_proj's weight is read past any adapter


def test_lora_on_a_layer_the_forward_does_not_call_says_so(tmp_path, tokenizer):
    """Mamba's forward reads dt_proj's weight itself: an adapter there would never train."""
    from conftest import ROWS, write_user_task
    from softeval.errors import SoftevalError
    from softeval.tasks import load_task
    from softeval.tuning import TuneConfig, tune

    spec = load_task(write_user_task(tmp_path, ROWS * 10))
    config = TuneConfig(method="lora", lora_targets=["dt_proj"], steps=1, val_size=4, batch_size=2)
    with pytest.raises(SoftevalError, match=r"^no tuned parameter reaches the loss: the model's forward does not use them; set lora targets"):
        tune(loaded("mamba", tokenizer), spec, config, output=tmp_path / "adapter", progress=False)
    assert not (tmp_path / "adapter" / "adapter_model.safetensors").exists()


@pytest.mark.parametrize("name", ["cohere", "granite", "gemma2"])
def test_the_fast_path_itself_applies_the_models_logit_transform(name, tokenizer):
    """Not through the self-check: the fast engine's own option scores and tuning loss take
    Cohere's logit_scale, Granite's logits_scaling and Gemma 2's final softcap as the models'
    forwards do (without them Cohere's and Granite's scores are off by several nats)."""
    lm = loaded(name, tokenizer)
    soft = lm.model.get_input_embeddings()(torch.tensor([11, 222])).detach()
    engine = Engine(lm, soft_prompt=soft)
    context, options = lm.encode(SHARED + TEXTS[0]), [lm.encode(o) for o in OPTIONS]
    scores = engine.loglikelihood([Cloze(context, options)])[0]
    assert scores == pytest.approx([_full_forward_logprob(lm, context, option, soft) for option in options], abs=1e-4)
    loss = float(engine.target_loss([(context, options[2])]).detach())
    assert loss == pytest.approx(-_full_forward_logprob(lm, context, options[2], soft), abs=1e-4)
