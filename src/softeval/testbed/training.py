"""Training the testbed's models: pre-training a recipe's tiny llama on its documents, saving
checkpoints into a training-run folder (`runs/<recipe>/checkpoint-N`, as `series:` reads them),
and post-training a recipe's last checkpoint into its reference model: a chat model fine-tuned on
conversations that ask each task's questions about people no test row asks about.

Everything is seeded and runs on the CPU in a fixed order, on one thread (`one_thread`), so the
same seed gives the same weights, byte for byte, whichever process trains a recipe and whatever
runs beside it: the tiny models gain nothing from more threads, and a machine is better shared
as one training process per core.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import torch

from softeval.testbed.corpus import CHAT_TEMPLATE, documents
from softeval.testbed.world import World, biography

BATCH, LENGTH = 16, 64  # sequences of tokens per step: a step reads BATCH * LENGTH tokens
LEARNING_RATE = 3e-3
WARMUP = 20


@dataclass(frozen=True)
class Recipe:
    """What a pre-training team varies: model size, training tokens, paraphrase diversity and filler share."""

    name: str
    hidden: int  # model width (2 layers, 4 heads)
    steps: int  # training steps of BATCH x LENGTH tokens
    templates: int  # paraphrase templates per fact (1: the first only)
    filler: float = 0.0  # share of the text that is filler prose
    checkpoints: int = 5

    @property
    def checkpoint_steps(self) -> list[int]:
        return [round(self.steps * (k + 1) / self.checkpoints) for k in range(self.checkpoints)]


@contextmanager
def one_thread() -> Iterator[int]:
    """Torch on one thread inside, as many as before after; yields how many there were."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield before
    finally:
        torch.set_num_threads(before)


def _model(tokenizer, hidden: int, seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    return LlamaForCausalLM(config)


def _optimizer(model):
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / WARMUP))
    return optimizer, schedule


def _save(model, tokenizer, folder: Path, *, chat: bool) -> None:
    tokenizer.chat_template = CHAT_TEMPLATE if chat else None
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def token_stream(tokenizer, texts: Iterator[str], n_tokens: int) -> torch.Tensor:
    """The first `n_tokens` tokens of the endless texts, one per line (tokenised a few hundred at
    a time: each text's tokens are its own, whatever is tokenised beside it)."""
    ids: list[int] = []
    while len(ids) < n_tokens:
        chunk = [text + "\n" for text in islice(texts, 256)]
        if not chunk:
            raise ValueError(f"the texts ran out after {len(ids)} of {n_tokens} tokens")
        for row in tokenizer(chunk)["input_ids"]:
            ids += row
    return torch.tensor(ids[:n_tokens])


def pretrain(recipe: Recipe, world: World, tokenizer, filler: list[str], runs: Path, seed: int, evaluate=None) -> list[Path]:
    """Train the recipe's model from scratch, saving a checkpoint at each of its checkpoint steps;
    returns the checkpoint folders. A folder saved earlier (same seed and recipe) is kept, unless
    `evaluate(model, step)` is to be called at each checkpoint (evaluation in the loop)."""
    folders = [runs / recipe.name / f"checkpoint-{step}" for step in recipe.checkpoint_steps]
    if evaluate is None and all((f / "model.safetensors").is_file() for f in folders):
        return folders
    stream = token_stream(tokenizer, documents(world, recipe.templates, filler, recipe.filler, seed), recipe.steps * BATCH * LENGTH)
    batches = stream.view(recipe.steps, BATCH, LENGTH)
    with one_thread() as threads:
        model = _model(tokenizer, recipe.hidden, seed)
        optimizer, schedule = _optimizer(model)
        model.train()
        for step in range(1, recipe.steps + 1):
            loss = model(input_ids=batches[step - 1], labels=batches[step - 1]).loss
            loss.backward()
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
            if step in recipe.checkpoint_steps:
                _save(model, tokenizer, runs / recipe.name / f"checkpoint-{step}", chat=False)
                if evaluate is not None:  # with the threads the process had: evaluation is not training
                    torch.set_num_threads(threads)
                    evaluate(model, step)
                    torch.set_num_threads(1)
    return folders


def conversations(tasks: list[Path]) -> list[tuple[str, str]]:
    """Post-training pairs (user turn, assistant answer): each task's `post` rows as its zero-shot
    chat prompt asks them (instruction, then the question), answered in its strict format."""
    from softeval.tasks import load_task
    from softeval.tasks.data import load_examples
    from softeval.tasks.prompts import DEMO_SEPARATOR, target_text

    pairs = []
    for path in tasks:
        spec = load_task(path)
        instruction = spec.instruction + DEMO_SEPARATOR if spec.instruction else ""
        pairs += [(instruction + spec.render("template", example), target_text(spec, example).strip()) for example in load_examples(spec, "post")]
    return pairs


def posttrain(checkpoint: Path, world: World, tokenizer, tasks: list[Path], out: Path, steps: int, seed: int) -> Path:
    """Fine-tune a recipe's last checkpoint into a chat model: the loss on the assistant's answers
    of the tasks' post-training conversations, beside biographies (so pre-training is not forgotten)."""
    from transformers import AutoModelForCausalLM

    if (out / "model.safetensors").is_file():
        return out
    tokenizer.chat_template = CHAT_TEMPLATE
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    pairs = conversations(tasks)
    chat_rows = {}  # each conversation's tokens, once: the steps draw the same pairs again and again
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE / 3, weight_decay=0.0)
    model.train()
    with one_thread():
        for _ in range(steps):
            drawn = [rng.choice(pairs) for _ in range(BATCH)]
            for pair in drawn:
                if pair not in chat_rows:
                    chat_rows[pair] = _chat_row(tokenizer, *pair)
            rows = [chat_rows[pair] for pair in drawn]
            rows += [_prose_row(tokenizer, biography(rng.choice(world.people), rng, 1)) for _ in range(BATCH // 4)]
            width = max(len(ids) for ids, _ in rows)
            ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r, _ in rows])
            labels = torch.tensor([l + [-100] * (width - len(l)) for _, l in rows])
            loss = model(input_ids=ids, attention_mask=(labels != -100) | (ids != tokenizer.pad_token_id), labels=labels).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    _save(model, tokenizer, out, chat=True)
    return out


def _chat_row(tokenizer, user: str, answer: str) -> tuple[list[int], list[int]]:
    """A conversation's tokens, and its labels: the answer and its end-of-turn token only."""
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True)
    context = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    reply = tokenizer(" " + answer + "<|im_end|>\n", add_special_tokens=False)["input_ids"]  # the prompt ends "A:"
    return context + reply, [-100] * len(context) + reply


def _prose_row(tokenizer, text: str) -> tuple[list[int], list[int]]:
    ids = tokenizer(text + "\n", add_special_tokens=False)["input_ids"]
    return ids, list(ids)
