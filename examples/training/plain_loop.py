"""Evaluate inside a plain training loop, the shape of torchtitan's or OLMo-core's: one call every
N steps. A tiny llama (SmolLM2's tokenizer, random weights) is pre-trained on the capitals task's
tuning rows as prose and evaluated on the task zero-shot and soft-prompted as it trains.

    python examples/training/plain_loop.py --output runs/plain-loop
    softeval analyze runs/plain-loop --target last     # with two recipes or more in the folder

About a minute on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

import softeval

TASK = Path(__file__).resolve().parents[1] / "capitals.yaml"


def corpus(tokenizer, length: int = 32) -> torch.Tensor:
    """The task's tuning rows as sentences, in blocks of `length` tokens."""
    rows = [json.loads(line) for line in (TASK.parent / "capitals" / "train.jsonl").read_text().splitlines()]
    text = " ".join(f"{row['question']} {row['answer']}." for row in rows)
    ids = tokenizer(text)["input_ids"]
    return torch.tensor(ids[: len(ids) // length * length]).view(-1, length)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output", default="runs/plain-loop")
    parser.add_argument("--recipe", default="tiny")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=20)
    args = parser.parse_args()

    tokenizer = AutoTokenizer.from_pretrained(softeval.prepare_alias("smollm2-135m-instruct"))
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    model = AutoModelForCausalLM.from_config(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    blocks = corpus(tokenizer)

    # everything that can be checked is checked here, before the first step
    evaluator = softeval.InLoop(tasks=[str(TASK)], output=args.output, recipe=args.recipe, methods=["zero-shot", "soft-prompt"],
                                limit=20, tuning={"steps": 20, "eval_every": 10, "val_size": 3}, tokenizer=tokenizer)
    model.train()
    for step in range(1, args.steps + 1):
        batch = blocks[torch.randint(0, len(blocks), (8,))]
        model(input_ids=batch, labels=batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step % args.every == 0:  # the model as it is now: no save, no reload; training is left as it was
            evaluation = evaluator.evaluate(model, tokenizer, step=step, tokens=step * batch.numel())
            print(f"step {step}: soft-prompt task accuracy {evaluation.scores.get('capitals/soft-prompt/task_accuracy')}")
    evaluator.close()


if __name__ == "__main__":
    main()
