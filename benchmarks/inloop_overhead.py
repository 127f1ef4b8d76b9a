"""What evaluating inside the training loop costs, on the known-truth testbed: the same recipes
trained twice, back to back on this machine, (a) with each checkpoint evaluated from inside the
loop (`softeval testbed --in-loop`), and (b) alone, with a study of the saved checkpoints run
afterwards (the same settings: the testbed study's series, without references).

    python benchmarks/inloop_overhead.py --size full --data-dir ../shared/benchmarks --work /tmp/overhead

Prints each phase's wall time and one JSON line: the training job's extra time with in-loop
evaluation against the post-hoc study's time, and the in-loop evaluations' own seconds (from
evaluations.jsonl). Both builds include post-training the references and the design check; (a)
also evaluates the references into the in-loop folder.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import yaml


def timed(label: str, work) -> float:
    started = time.perf_counter()
    work()
    seconds = time.perf_counter() - started
    print(f"{label}: {seconds:.1f} s", flush=True)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="full")
    parser.add_argument("--recipes", default=None, help="comma-separated; default: all of the size's recipes")
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True, help="scratch folder (emptied first)")
    args = parser.parse_args()

    from softeval.loop.filing import read_evaluations
    from softeval.study import Study, run_study
    from softeval.testbed import build_testbed

    shutil.rmtree(args.work, ignore_errors=True)
    recipes = args.recipes.split(",") if args.recipes else None
    build = lambda folder, **extra: build_testbed(folder, size=args.size, data_dir=args.data_dir, recipes=recipes, **extra)  # noqa: E731

    alone = timed("(b) training alone (build without in-loop evaluation)", lambda: build(args.work / "alone"))
    plan = yaml.safe_load((args.work / "alone" / "study.yaml").read_text())
    settings = {key: plan[key] for key in ("tasks", "methods", "k", "limit", "seed", "tuning")}
    series = [{key: s[key] for key in ("name", "checkpoints", "tokens_per_step")} for s in plan["series"]]
    study = Study(series=series, **settings)
    posthoc = timed("(b) the study of the saved checkpoints afterwards", lambda: run_study(study, output=args.work / "alone-study", progress=False))
    in_loop = timed("(a) training with in-loop evaluation (build --in-loop)", lambda: build(args.work / "loop", in_loop=args.work / "loop-live"))
    evaluations = read_evaluations(args.work / "loop-live")
    evaluation_s = sum(e["seconds"] for e in evaluations)
    result = {
        "size": args.size, "recipes": recipes or "all", "checkpoints": len(evaluations),
        "training_alone_s": round(alone, 1), "posthoc_study_s": round(posthoc, 1), "alone_plus_study_s": round(alone + posthoc, 1),
        "training_with_in_loop_s": round(in_loop, 1), "in_loop_evaluations_s": round(evaluation_s, 1),
        "in_loop_over_alone_plus_study": round(in_loop / (alone + posthoc), 3),
        "extra_training_time_s": round(in_loop - alone, 1),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
