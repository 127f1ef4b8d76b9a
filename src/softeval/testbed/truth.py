"""What a model truly knows of the world: for each test fact, whether the right value ranks first
among its attribute's values by log-likelihood after the fact's prose stem, in the model's own
pre-training format ("Vadro Kelim was born in" + " Velmora"). No prompt, format or parser is
involved, so this is the reference every method's scores are compared with.

The facts are the test rows of the world's tasks, in their order: row i of `world_qa` and of
`world_mc` asks fact i.
"""

from __future__ import annotations

from pathlib import Path

import torch

from softeval.testbed.world import ATTRIBUTES, World


def test_facts(world: World) -> list[tuple[str, str, str]]:
    """(person, attribute, value) of every test fact, in the tasks' row order."""
    return [(p.name, a.name, p.facts[a.name]) for p in world.people_of("test") for a in ATTRIBUTES]


@torch.no_grad()
def known_facts(folder: Path, world: World) -> list[int]:
    """1 for each test fact the model in `folder` knows, else 0."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    attributes = {a.name: a for a in ATTRIBUTES}
    known = []
    for person, attribute, value in test_facts(world):
        values = world.values[attribute]
        scores = _continuation_loglikelihoods(model, tokenizer, attributes[attribute].stem(person), [" " + v for v in values])
        known.append(int(values[int(torch.argmax(scores))] == value))
    return known


def _continuation_loglikelihoods(model, tokenizer, context: str, continuations: list[str]) -> torch.Tensor:
    """The summed log-likelihood of each continuation after the context, in one batch."""
    context_ids = tokenizer(context, add_special_tokens=False)["input_ids"]
    rows = [context_ids + tokenizer(c, add_special_tokens=False)["input_ids"] for c in continuations]
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    logprobs = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits.float(), dim=-1)
    scores = []
    for k, row in enumerate(rows):
        positions = range(len(context_ids), len(row))
        scores.append(sum(logprobs[k, p - 1, row[p]] for p in positions))
    return torch.stack(scores)
