"""A tiny pre-training experiment, end to end: two recipes, their checkpoints, and which one
`softeval analyze` says is better, from how many tokens, by each method.

Two tiny llamas (the SmolLM2 tokenizer, hidden 64, 2 layers) are trained from the same seed for
--steps steps of --batch sequences of --length tokens on different data mixes built from the
benchmark mirror's training splits: `qa` on TriviaQA questions with their answers, `science` on
ARC-Easy questions with their correct answers, both over a shared base of CommonsenseQA questions
with lettered options. Each saves a checkpoint every --every steps. A
study evaluates every checkpoint on --task (ARC-Easy answered by letter: a format a soft prompt can
teach even a tiny model), zero-shot, few-shot and soft-prompted, and `softeval analyze` compares
the recipes; with --warm the soft prompts are warm-started too, and
the warm and cold runs' tuning curves and final metrics are compared.

    python benchmarks/tiny_pretraining.py --data-dir ../shared/benchmarks --output runs/tiny-pretraining
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
from pathlib import Path

import torch
import yaml
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from softeval.models import prepare_alias


def texts(data_dir: Path, recipe: str) -> list[str]:
    """A recipe's pre-training texts, in a seeded order: its own domain (TriviaQA or ARC-Easy
    questions with their answers) over a base both recipes share, CommonsenseQA questions with
    lettered options and the answer's letter (exam text, as web data holds), so that a model can
    learn what a lettered answer is."""
    def rows(path: Path) -> list[dict]:
        # split on newlines only: U+2028 and friends may sit inside a JSON string
        return [json.loads(line) for line in path.read_text().split("\n")[:20000] if line.strip()]

    base = [f"Question: {r['question']}\n" + "".join(f"{label}. {text}\n" for label, text in zip(r["choices"]["label"], r["choices"]["text"]))
            + f"Answer: {r['answerKey']}\n" for r in rows(data_dir / "tau/commonsense_qa/default/train.jsonl")]
    if recipe == "qa":
        path = data_dir / "mandarjoshi/trivia_qa/rc.nocontext/train.jsonl"
        if not path.is_file():
            path = data_dir / "mandarjoshi/trivia_qa/rc.nocontext/validation.jsonl"
        domain = [f"Question: {r['question']}\nAnswer: {r['answer']['value']}\n" for r in rows(path)]
    else:
        domain = [f"Question: {r['question']}\nAnswer: {r['choices']['text'][r['choices']['label'].index(r['answerKey'])]}\n"
                  for r in rows(data_dir / "allenai/ai2_arc/ARC-Easy/train.jsonl")]
    mixed = base + domain
    random.Random(0).shuffle(mixed)
    return mixed


def pretrain(recipe: str, data_dir: Path, out: Path, steps: int, every: int, batch: int, length: int, seed: int, *,
             hidden: int = 64, n_texts: int | None = None) -> None:
    """Train a tiny llama on the recipe's texts (the first `n_texts`), saving OUT/recipe/checkpoint-N every `every` steps."""
    tokenizer = AutoTokenizer.from_pretrained(prepare_alias("smollm2-135m-instruct"))
    tokenizer.chat_template = None  # a base model
    stream = tokenizer("".join(texts(data_dir, recipe)[:n_texts]))["input_ids"]
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model = LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(seed)
    for step in range(1, steps + 1):
        starts = torch.randint(0, len(stream) - length - 1, (batch,), generator=generator)
        ids = torch.stack([torch.tensor(stream[s : s + length]) for s in starts.tolist()])
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step % every == 0:
            folder = out / recipe / f"checkpoint-{step}"
            model.save_pretrained(folder)
            tokenizer.save_pretrained(folder)
            print(f"{recipe} step {step}: loss {loss.item():.3f}", flush=True)


def study_file(out: Path, runs: Path, task: str, tokens_per_step: int, warm: bool, steps: int) -> Path:
    series = [{"name": recipe, "checkpoints": str(runs / recipe), "tokens_per_step": tokens_per_step} for recipe in ("qa", "science")]
    study = {"series": series, "tasks": [task], "methods": ["zero-shot", "few-shot", "soft-prompt"], "limit": 200,
             "warm_start": warm, "tuning": {"steps": steps, "eval_every": max(1, steps // 4), "val_size": 32}}
    path = out / f"study-{'warm' if warm else 'cold'}.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


def softeval(*args) -> None:
    """The command line, as a user runs it (the script beside this Python)."""
    subprocess.run([str(Path(sys.executable).with_name("softeval")), *map(str, args)], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--output", type=Path, default=Path("runs/tiny-pretraining"))
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--every", type=int, default=150)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--task", default="arc_easy")
    parser.add_argument("--tune-steps", type=int, default=40)
    parser.add_argument("--warm", action="store_true", help="also run the study with warm-started prompts, and compare")
    args = parser.parse_args()
    runs = args.output / "checkpoints"
    for recipe in ("qa", "science"):
        if not (runs / recipe / f"checkpoint-{args.steps}").is_dir():
            pretrain(recipe, args.data_dir, runs, args.steps, args.every, args.batch, args.length, seed=0)
    tokens_per_step = args.batch * args.length
    for warm in ([False, True] if args.warm else [False]):
        folder = args.output / ("warm" if warm else "cold")
        softeval("study", study_file(args.output, runs, args.task, tokens_per_step, warm, args.tune_steps), "--data-dir", args.data_dir, "--output", folder)
        softeval("analyze", folder, "--target-metric", "knowledge")  # tiny models rarely keep an answer format
    if args.warm:
        compare_warm_and_cold(args.output, args.task)


def compare_warm_and_cold(out: Path, task: str) -> None:
    """Per checkpoint: the first validation step at which format-following reaches 95% of its
    final value, warm against cold, and the final metrics' paired differences (warm - cold)."""
    from softeval.analysis.comparisons import outcome_table
    from softeval.analysis.stats import paired_difference
    from softeval.scoring import EvalResult

    print("\ncheckpoint | saturation step cold / warm | task accuracy warm - cold | format warm - cold")
    for cold_cell in sorted((out / "cold").glob(f"*@checkpoint-*/{task}/soft-prompt"), key=lambda c: (c.parents[1].name.split("@")[0], int(c.parents[1].name.rsplit("-", 1)[1]))):
        warm_cell = out / "warm" / cold_cell.relative_to(out / "cold")
        saturated = []
        for cell in (cold_cell, warm_cell):
            curve = json.loads((cell.parent / "prompt" / "curve.json").read_text())
            final = curve[-1]["format_following"]
            saturated.append(next(p["step"] for p in curve if p["format_following"] >= 0.95 * final))
        cold, warm = EvalResult.load(cold_cell), EvalResult.load(warm_cell)
        rows = sorted({s.index for s in cold.samples} & {s.index for s in warm.samples})
        differences = []
        for field in ("task_correct", "format_ok"):
            a, b = outcome_table([warm, cold], rows, field)
            d = paired_difference(a, b)
            differences.append(f"{100 * d.value:+.1f} [{100 * d.ci_low:+.1f}, {100 * d.ci_high:+.1f}]")
        print(f"{cold_cell.parents[1].name} | {saturated[0]} / {saturated[1]} | {differences[0]} | {differences[1]}")


if __name__ == "__main__":
    main()
