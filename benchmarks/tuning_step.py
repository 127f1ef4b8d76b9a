"""Tuning-step speed: softeval's tuning steps against plain PEFT, side by side.

Two methods, each against its PEFT baseline, on the same model and the same batch of ARC-Easy
training examples (prompt + target tokens), run as forward, backward, gradient clipping and an
AdamW step on the trained parameters only:

- soft prompt: softeval's soft-prompt step against PEFT prompt tuning (same prompt length). Steps
  alternate between the two sides so both see the same machine state.
- LoRA: softeval's LoRA step (`TuneConfig(method="lora")`: answer-only loss, logits only at the
  target positions) against `peft.get_peft_model(model, LoraConfig(...))` trained the way a user
  gluing transformers and PEFT would: one full-logits HF forward with the labels masked to the
  answer tokens. Both use the same rank, alpha, target modules, learning rate and LoRA init seed
  (so both start from the same adapters). Two sets of LoRA layers cannot sit in one model at once,
  so the two sides run one after the other, each with the same warm-up; each side's layers are
  taken out of the model when it is done, so later rows (and models) see the plain model.

The sequence lengths match within a method; a soft-prompt row adds `--length` positions per row.
Prints, per model, seconds per step (mean over the timed steps after the warm-up), the PEFT
baseline's time over the row's ("vs PEFT": above 1 means faster than the PEFT baseline of its
method), the trainable parameter count and the loss of the first and last step.

    python benchmarks/tuning_step.py --data-dir ../shared/benchmarks [--steps 10] [--threads 2]
        [--methods soft-prompt,lora] [--lora-rank 8] [--lora-lr 1e-3]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from softeval import load_examples, load_model, load_task
from softeval.study import LoraSettings
from softeval.tasks import tuning_target
from softeval.tuning import TuneConfig
from softeval.tuning.tuner import Tuner

LORA_DEFAULTS = TuneConfig(method="lora")


def softeval_step_fn(tuner: Tuner, batch) -> Callable[[], float]:
    """softeval's tuning step on a fixed batch (the same work as `Tuner.step`, for either method)."""
    params = list(tuner.params.values())

    def step() -> float:
        tuner.optimizer.zero_grad(set_to_none=True)
        loss = tuner.loss(batch, backward=True)
        torch.nn.utils.clip_grad_norm_(params, tuner.config.max_grad_norm)
        tuner.optimizer.step()
        return loss.item()

    return step


def padded_batch(sequences: list[list[int]], target_lengths: list[int]) -> dict[str, torch.Tensor]:
    """Left-padded ids and attention mask, labels on the target tokens only (-100 elsewhere)."""
    width = max(len(s) for s in sequences)
    ids = torch.zeros(len(sequences), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for r, (seq, n_target) in enumerate(zip(sequences, target_lengths)):
        ids[r, width - len(seq) :] = torch.tensor(seq)
        mask[r, width - len(seq) :] = 1
        labels[r, width - n_target :] = torch.tensor(seq[-n_target:])
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def hf_step_fn(model, inputs: dict[str, torch.Tensor], lr: float) -> tuple[Callable[[], float], int]:
    """A plain HF training step of `model`'s trainable parameters (full logits, loss from labels)."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr)

    def step() -> float:
        loss = model(**inputs).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        return loss.item()

    return step, sum(p.numel() for p in params)


def peft_prompt_step_fn(lm, sequences: list[list[int]], target_lengths: list[int], length: int, lr: float, seed: int):
    """A PEFT PromptTuning step on the same token sequences (left-padded, loss on targets only).
    Prompt tuning wraps the model without changing its layers: nothing to take out afterwards."""
    from peft import PromptTuningConfig, TaskType, get_peft_model

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)  # the virtual tokens start random
        model = get_peft_model(lm.model, PromptTuningConfig(task_type=TaskType.CAUSAL_LM, num_virtual_tokens=length))
    return hf_step_fn(model, padded_batch(sequences, target_lengths), lr)


@contextmanager
def peft_lora_step_fn(
    lm, sequences: list[list[int]], target_lengths: list[int], config: TuneConfig
) -> Iterator[tuple[Callable[[], float], int]]:
    """A plain PEFT LoRA step on the same token sequences (left-padded, loss on targets only).
    The LoRA layers are in the model inside the block and taken out again when it ends."""
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=config.lora_rank, lora_alpha=config.lora_alpha, target_modules=list(config.lora_targets), lora_dropout=0.0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)  # LoRA's A matrices start random; the same seed as softeval's
        model = get_peft_model(lm.model, lora)
    try:
        yield hf_step_fn(model, padded_batch(sequences, target_lengths), config.lr)
    finally:
        model.unload()
        lm.model.requires_grad_(False)


def timed(fns: dict[str, Callable[[], float]], steps: int, warmup: int) -> dict[str, dict[str, list[float]]]:
    """Run `warmup` untimed, then `steps` timed rounds; each round runs every side once in turn."""
    out = {side: {"seconds": [], "losses": []} for side in fns}
    for i in range(warmup + steps):
        for side, fn in fns.items():
            start = time.perf_counter()
            loss = fn()
            seconds = time.perf_counter() - start
            out[side]["losses"].append(loss)
            if i >= warmup:
                out[side]["seconds"].append(seconds)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default="../shared/benchmarks")
    parser.add_argument("--models", default="gemma-3-270m,smollm2-135m-instruct")
    parser.add_argument("--task", default="arc_easy")
    parser.add_argument("--methods", default="soft-prompt,lora", help="comma-separated: soft-prompt, lora")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--length", type=int, default=10, help="soft-prompt length")
    parser.add_argument("--lora-rank", type=int, default=LORA_DEFAULTS.lora_rank)
    parser.add_argument("--lora-alpha", type=int, default=LORA_DEFAULTS.lora_alpha)
    parser.add_argument("--lora-targets", default=",".join(LORA_DEFAULTS.lora_targets))
    parser.add_argument("--lora-lr", type=float, default=LoraSettings().lr, help="LoRA learning rate (softeval's default)")
    parser.add_argument("--seed", type=int, default=0, help="soft-prompt and LoRA init seed")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per row")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per row before them")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if unknown := set(methods) - {"soft-prompt", "lora"}:
        parser.error(f"unknown method(s): {', '.join(sorted(unknown))}")
    if args.steps < 1 or args.warmup < 0:
        parser.error("--steps must be at least 1 and --warmup at least 0")
    torch.set_num_threads(args.threads)
    spec = load_task(args.task)
    batch = load_examples(spec, spec.dataset.tune_split, args.data_dir, limit=args.batch_size, seed=1)

    for name in args.models.split(","):
        lm = load_model(name, device="cpu", dtype=torch.float32)
        targets = [lm.encode(tuning_target(spec, e)) for e in batch]
        rows: list[tuple[str, dict, int, float]] = []  # (row, timings, trainable, baseline s/step)
        tokens = {}

        if "soft-prompt" in methods:
            config = TuneConfig(batch_size=args.batch_size, length=args.length, val_size=8, seed=args.seed)
            tuner = Tuner(lm, spec, config, data_dir=args.data_dir)
            prompts = [tuner.builder.generation(e).ids for e in batch]
            ours = softeval_step_fn(tuner, batch)
            theirs, n_theirs = peft_prompt_step_fn(
                lm, [p + t for p, t in zip(prompts, targets)], [len(t) for t in targets], args.length, config.lr, args.seed
            )
            times = timed({"ours": ours, "peft": theirs}, args.steps, args.warmup)
            baseline = _mean(times["peft"]["seconds"])
            rows += [("softeval soft-prompt", times["ours"], tuner.n_trainable, baseline), ("PEFT prompt tuning", times["peft"], n_theirs, baseline)]
            tokens["soft-prompt"] = sum(len(p) + len(t) + args.length for p, t in zip(prompts, targets))

        if "lora" in methods:
            config = TuneConfig(
                method="lora", batch_size=args.batch_size, lr=args.lora_lr, val_size=8, seed=args.seed,
                lora_rank=args.lora_rank, lora_alpha=args.lora_alpha, lora_targets=args.lora_targets.split(","),
            )  # fmt: skip
            with Tuner(lm, spec, config, data_dir=args.data_dir) as tuner:
                prompts = [tuner.builder.generation(e).ids for e in batch]
                ours = timed({"ours": softeval_step_fn(tuner, batch)}, args.steps, args.warmup)["ours"]
                n_ours = tuner.n_trainable
            with peft_lora_step_fn(lm, [p + t for p, t in zip(prompts, targets)], [len(t) for t in targets], config) as (step, n_theirs):
                theirs = timed({"peft": step}, args.steps, args.warmup)["peft"]
            baseline = _mean(theirs["seconds"])
            rows += [("softeval LoRA", ours, n_ours, baseline), ("PEFT LoRA", theirs, n_theirs, baseline)]
            tokens["LoRA"] = sum(len(p) + len(t) for p, t in zip(prompts, targets))

        per_step = ", ".join(f"{n} {k}" for k, n in tokens.items())
        print(
            f"\n{name}: batch {args.batch_size}, tokens/step: {per_step}; {args.threads} threads, "
            f"{args.steps} timed steps after {args.warmup} warm-up; LoRA r={args.lora_rank} alpha={args.lora_alpha} on {args.lora_targets}"
        )
        print(f"  {'row':<22} {'s/step':>8} {'vs PEFT':>8} {'trainable':>11}   loss first -> last")
        for row, timing, n_trainable, baseline in rows:
            seconds = _mean(timing["seconds"])
            losses = timing["losses"]
            print(f"  {row:<22} {seconds:>8.3f} {baseline / seconds:>7.2f}x {n_trainable:>11,}   {losses[0]:.3f} -> {losses[-1]:.3f}")


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


if __name__ == "__main__":
    main()
