"""Parity check: softeval's zero-shot `knowledge` against lm-evaluation-harness's `acc_norm`.

Both sides score the same cloze prompt ("Question: ...\\nAnswer:" + " <option text>") on the same rows
(the mirror's ARC-Easy test split, first N rows) with the same model; lm-eval reads the rows through a
task YAML with a local json dataset. With `--task lm-eval:arc_easy`, softeval builds the task from
lm-eval's registry and lm-eval runs its own registered arc_easy on those rows. Prints both
numbers, their difference and the wall times.

    python benchmarks/lm_eval_parity.py --data-dir ../shared/benchmarks [--rows 500] [--task lm-eval:arc_easy]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from softeval import load_examples, load_model, load_task  # noqa: E402
from softeval.engine import Engine  # noqa: E402
from softeval.models import prepare_alias  # noqa: E402
from softeval.scoring import score_sample  # noqa: E402
from softeval.tasks import PromptBuilder  # noqa: E402

LM_EVAL_TASK = """\
task: arc_easy_mirror
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{choices.label.index(answerKey)}}}}"
doc_to_choice: "{{{{choices.text}}}}"
metric_list:
  - metric: acc
  - metric: acc_norm
"""


def softeval_knowledge(model: str, task: str, data_dir: Path, rows: int, batch_size: int) -> tuple[float, float]:
    lm = load_model(model, device="cpu")
    spec = load_task(task)
    examples = load_examples(spec, "test", data_dir)[:rows]
    start = time.perf_counter()
    builder = PromptBuilder(spec, lm)
    clozes = [builder.cloze(e) for e in examples]
    scores = Engine(lm, batch_size=batch_size).loglikelihood(clozes)
    correct = [score_sample(spec.format, e, "", s).knowledge_correct for e, s in zip(examples, scores)]
    return sum(correct) / len(correct), time.perf_counter() - start


def lm_eval_yaml(task: str, data: Path) -> str:
    """lm-eval's side: its own registered task where softeval reads it (lm-eval:arc_easy), with the
    mirror's rows as its data; else a task YAML of the built-in arc_easy's cloze prompt."""
    from lm_eval.tasks import TaskManager

    if not task.startswith("lm-eval:"):
        return LM_EVAL_TASK.format(data=data)
    registered = TaskManager().task_index[task.removeprefix("lm-eval:")].yaml_path
    return (f"include: {registered}\ntask: arc_easy_mirror\ndataset_path: json\ndataset_name: null\n"
            f"dataset_kwargs:\n  data_files:\n    test: {data}\ntraining_split: null\nvalidation_split: null\ntest_split: test\n")


def lm_eval_acc_norm(model: str, task: str, data_dir: Path, rows: int, batch_size: int) -> tuple[float, float]:
    import lm_eval
    from lm_eval.tasks import TaskManager

    folder = prepare_alias(model)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "arc_easy_test.jsonl"
        lines = (data_dir / "allenai/ai2_arc/ARC-Easy/test.jsonl").read_text().splitlines()[:rows]
        data.write_text("\n".join(lines) + "\n")
        (Path(tmp) / "arc_easy_mirror.yaml").write_text(lm_eval_yaml(task, data))
        start = time.perf_counter()
        out = lm_eval.simple_evaluate(
            model="hf",
            model_args=f"pretrained={folder},dtype=float32",
            tasks=["arc_easy_mirror"],
            task_manager=TaskManager(include_path=tmp),
            batch_size=batch_size,
            device="cpu",
        )
        elapsed = time.perf_counter() - start
    return out["results"]["arc_easy_mirror"]["acc_norm,none"], elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/benchmarks"))
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--task", default="arc_easy", choices=["arc_easy", "lm-eval:arc_easy"],
                        help="softeval's built-in ARC-Easy, or lm-eval's own, read through its registry")
    parser.add_argument("--rows", type=int, default=500)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    ours, ours_s = softeval_knowledge(args.model, args.task, args.data_dir, args.rows, args.batch_size)
    theirs, theirs_s = lm_eval_acc_norm(args.model, args.task, args.data_dir, args.rows, args.batch_size)
    diff = 100 * abs(ours - theirs)
    print(json.dumps({"model": args.model, "task": args.task, "rows": args.rows, "softeval_knowledge": ours, "lm_eval_acc_norm": theirs}))
    print(f"softeval knowledge   {100 * ours:6.2f}   ({ours_s:.1f} s)")
    print(f"lm-eval acc_norm     {100 * theirs:6.2f}   ({theirs_s:.1f} s)")
    print(f"difference           {diff:6.2f} points  ->  {'PASS' if diff <= 0.5 else 'FAIL'} (tolerance 0.5)")
    raise SystemExit(0 if diff <= 0.5 else 1)


if __name__ == "__main__":
    main()
