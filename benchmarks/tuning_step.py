"""Tuning-step speed: softeval's soft-prompt step against PEFT prompt tuning, side by side.

Both sides take the same model, the same batch of ARC-Easy training examples (prompt + target
tokens), the same soft-prompt length, batch size and sequence lengths, and run forward, backward
and an AdamW step on the prompt only. Steps alternate between the two sides so both see the same
machine state. Prints seconds per step for each and the ratio.

    python benchmarks/tuning_step.py --data-dir ../shared/benchmarks [--steps 10] [--threads 2]
"""

from __future__ import annotations

import argparse
import time

import torch

from softeval import load_examples, load_model, load_task
from softeval.prompts import tuning_target
from softeval.tune import TuneConfig, Tuner


def softeval_step_fn(tuner: Tuner, batch):
    """softeval's tuning step on a fixed batch (the same work as `Tuner.step`)."""

    def step() -> float:
        tuner.optimizer.zero_grad(set_to_none=True)
        loss = tuner.loss(batch, backward=True)
        torch.nn.utils.clip_grad_norm_([tuner.prompt], 1.0)
        tuner.optimizer.step()
        return loss.item()

    return step


def peft_step_fn(lm, sequences: list[list[int]], target_lengths: list[int], length: int, lr: float):
    """A PEFT PromptTuning step on the same token sequences (left-padded, loss on targets only)."""
    from peft import PromptTuningConfig, TaskType, get_peft_model

    model = get_peft_model(lm.model, PromptTuningConfig(task_type=TaskType.CAUSAL_LM, num_virtual_tokens=length))
    width = max(len(s) for s in sequences)
    ids = torch.zeros(len(sequences), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for r, (seq, n_target) in enumerate(zip(sequences, target_lengths)):
        ids[r, width - len(seq) :] = torch.tensor(seq)
        mask[r, width - len(seq) :] = 1
        labels[r, width - n_target :] = torch.tensor(seq[-n_target:])
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr)

    def step() -> float:
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        return loss.item()

    return step, model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default="../shared/benchmarks")
    parser.add_argument("--models", default="gemma-3-270m,smollm2-135m-instruct")
    parser.add_argument("--task", default="arc_easy")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--length", type=int, default=10)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    spec = load_task(args.task)

    for name in args.models.split(","):
        lm = load_model(name, device="cpu", dtype=torch.float32)
        config = TuneConfig(batch_size=args.batch_size, length=args.length, val_size=8)
        tuner = Tuner(lm, spec, config, data_dir=args.data_dir)
        batch = load_examples(spec, spec.dataset.tune_split, args.data_dir, limit=args.batch_size, seed=1)
        prompts = [tuner.builder.generation(e).ids for e in batch]
        targets = [lm.encode(tuning_target(spec, e)) for e in batch]

        ours = softeval_step_fn(tuner, batch)
        theirs, _ = peft_step_fn(lm, [p + t for p, t in zip(prompts, targets)], [len(t) for t in targets], args.length, config.lr)
        times = {"softeval": [], "peft": []}
        for i in range(args.steps + 2):  # two warm-up rounds, then alternate
            for side, fn in (("softeval", ours), ("peft", theirs)):
                start = time.perf_counter()
                fn()
                if i >= 2:
                    times[side].append(time.perf_counter() - start)
        mean = {k: sum(v) / len(v) for k, v in times.items()}
        tokens = sum(len(p) + len(t) + args.length for p, t in zip(prompts, targets))
        print(
            f"{name}: batch {args.batch_size}, {tokens} tokens/step, {args.threads} threads | "
            f"softeval {mean['softeval']:.3f} s/step | PEFT {mean['peft']:.3f} s/step | "
            f"ratio {mean['peft'] / mean['softeval']:.2f}x"
        )


if __name__ == "__main__":
    main()
