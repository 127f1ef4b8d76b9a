"""Evaluation throughput: softeval against lm-evaluation-harness (HF backend) on the same work.

In one invocation, for each model and on the same rows of the benchmark mirror:

1. multiple-choice loglikelihood (cloze, acc_norm) on ARC-Easy;
2. greedy generation of the same prompt texts on GSM8K (256 new tokens at most) and ARC-Easy
   (letter answers), stopping at each task's stop strings;
3. (part `fewshot`, not run by default) the same on GSM8K prompts with 5 demonstrations, which
   every row shares (--fewshot-rows, 50).

softeval batches by its own token and KV-cache budgets (or at most --batch-size rows);
lm-evaluation-harness runs at --lm-eval-batch-size (16). It prints wall time for each side and the ratio, checks that the sides agree (identical generations
on >= 99% of rows, every difference at a near-tie: top-2 logit gap under 1e-3 at the first differing
token; acc_norm within 0.5 points) and, for each mode and for a soft-prompt tuning step, the achieved
GFLOP/s (from parameter counts and tokens processed) against this machine's measured fp32 matmul peak.
For generation it also times the run's matrix products alone, at the sizes the run computed them
(a decode step runs a few dozen rows, where products reach a fraction of the square-matrix peak),
and prints the share of the peak they allow and how much of that softeval reaches; and it times
the run's attention, which with the products alone bounds the share of the peak any engine built
on these kernels could reach.
With --rounds N, both sides of each comparison run N times in turns (softeval first, then lm-eval
first, ...); the times are medians, the speed-up the median of each round's ratio, and softeval's
results must be the same in every round.

The part `long` (not run by default) times one long prompt among short ones: ARC-Easy generation on
30 rows, one of which shows as many demonstrations as fit near the model's context length (or
--long-cap tokens), at the batch size against batch size 1. It checks the completions are identical
and prints the padded prefill positions of batches without a token budget (rows sorted by length,
the padding bounded) and with it, against batch size 1. The long prompt decodes in a pool of its
own: short rows do not join a pool many times as wide as they can grow (the engine's
POOL_WIDTH_RATIO), where every row would hold the pool's width.

The part `paths` (not run by default, and without lm-evaluation-harness) runs the fast path beside
the reference path (the model's own forward, where the self-check sends a model the fast path
does not serve), its rows batched as the self-check's batching verdict on the model allows and one
row at a time, on the same ARC-Easy option scoring and GSM8K generation rows; it checks that they
agree (option log-likelihoods within 1e-3 nats, identical greedy tokens) and prints each path's
time against the fast path's; and it times the self-check that chooses between them, from a fresh
verdict each time (--checks times, the first in the process included). The part `classes` does the
same per class of architecture (attention, ALiBi, multi-head latent attention, state-space,
hybrids) on the conformance suite's tiny random models, built for each named model's tokenizer.

The part `protocol` (not run by default) runs the method's protocol for each model through the
CLI: `softeval run` on the full ARC-Easy test split and 1,000 TriviaQA validation rows with
zero-shot, few-shot and a soft prompt tuned for 120 steps; it prints the wall time of each stage
and in total, and the peak resident memory.

    python benchmarks/throughput.py --data-dir ../shared/benchmarks [--models ...] [--threads 2]
    python benchmarks/throughput.py --data-dir ../shared/benchmarks --models smollm2-135m-instruct --parts protocol
    python benchmarks/throughput.py --data-dir ../shared/benchmarks --parts long --long-cap 4608
    python benchmarks/throughput.py --data-dir ../shared/benchmarks --parts paths --paths-mc-rows 100 --paths-gen-rows 20
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import AttentionInterface  # noqa: E402

from softeval import load_examples, load_model, load_task  # noqa: E402
from softeval.engine import Engine, ReferenceEngine
from softeval.engine.attention import NAME, stacked_gqa_sdpa
from softeval.engine.forward import TOKEN_BUDGET, _argmax_by_vocab_chunks
from softeval.engine.reference import GENERATION_ROWS
from softeval.engine.selfcheck import check_model, forget_verdicts, reference_batching
from softeval.models import prepare_alias  # noqa: E402
from softeval.scoring import score_sample  # noqa: E402
from softeval.tasks import PromptBuilder, choose_demos, tuning_target  # noqa: E402
from softeval.tuning import TuneConfig  # noqa: E402
from softeval.tuning.tuner import Tuner
from tuning_step import softeval_step_fn  # noqa: E402

MC_TASK = """\
task: bench_mc
dataset_path: json
dataset_kwargs: {{data_files: {{test: {data}}}}}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{choices.label.index(answerKey)}}}}"
doc_to_choice: "{{{{choices.text}}}}"
metric_list: [{{metric: acc_norm}}]
"""

GEN_TASK = """\
task: {name}
dataset_path: json
dataset_kwargs: {{data_files: {{test: {data}}}}}
test_split: test
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{target}}}}"
target_delimiter: ""
generation_kwargs: {{until: {until}, max_gen_toks: {max_new}, do_sample: false}}
metric_list: [{{metric: exact_match}}]
"""


def matmul_peak_gflops(n: int = 2048, repeats: int = 10) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = min(_timed(lambda: torch.mm(a, b)) for _ in range(repeats))
    return 2 * n**3 / best / 1e9


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


class FlopCounter:
    """FLOPs from parameter counts: 2 * body parameters per position run through the transformer,
    and 2 * vocab * hidden per position where vocabulary logits are computed. Positions are those
    the engine actually computed (padding included, shared prefixes once)."""

    def __init__(self, lm):
        vocab, hidden = lm.model.get_input_embeddings().weight.shape
        self.head = vocab * hidden
        self.body = lm.identity["n_parameters"] - self.head  # tied embeddings counted once

    def forward(self, tokens: int, logit_rows: int) -> float:
        return 2 * self.body * tokens + 2 * self.head * logit_rows


class MatmulCeiling:
    """What the model's matrix products alone would take for a generation run's forward passes:
    each pass's rows x columns through every linear layer of the transformer, and each LM head
    call's rows through the head (by vocabulary slices, as the engine runs it), timed at the
    nearest power of two of rows and scaled. Decoding runs a few dozen rows at a time, where
    fp32 matrix products reach a fraction of the square-matrix peak: this says how much of a
    run's distance from the peak is the products' own, and how much the rest of each step."""

    def __init__(self, lm):
        self.lm = lm
        self.linears = [m for m in lm.model.get_decoder().modules() if isinstance(m, torch.nn.Linear)]
        self._seconds: dict[tuple[str, int], float] = {}

    def record(self, engine: Engine) -> tuple[list[int], list[int]]:
        """Wrap an engine's transformer and LM head calls to note the positions each one runs."""
        body, head = [], []
        forward, greedy = engine.forward.run, engine.forward.greedy

        def counted_forward(embeds, *args, **kwargs):
            body.append(embeds.shape[0] * embeds.shape[1])
            return forward(embeds, *args, **kwargs)

        def counted_greedy(hidden):
            head.append(hidden.shape[0])
            return greedy(hidden)

        engine.forward.run, engine.forward.greedy = counted_forward, counted_greedy
        return body, head

    def seconds(self, engine: Engine, body: list[int], head: list[int]) -> float:
        return sum(self._scaled("body", n, engine) for n in body) + sum(self._scaled("head", n, engine) for n in head)

    def _scaled(self, part: str, rows: int, engine: Engine) -> float:
        bucket = 2 ** max(0, min(11, round(math.log2(rows))))
        if (part, bucket) not in self._seconds:
            self._seconds[part, bucket] = self._time(part, bucket, engine)
        return self._seconds[part, bucket] * rows / bucket

    @torch.inference_mode()
    def _time(self, part: str, rows: int, engine: Engine) -> float:
        hidden = torch.randn(rows, self.lm.model.get_input_embeddings().weight.shape[1])
        if part == "head":
            run = lambda: _argmax_by_vocab_chunks(hidden, self.lm.model.get_output_embeddings(), engine.forward.transform)  # noqa: E731
        else:
            inputs = {m.in_features: torch.randn(rows, m.in_features) for m in self.linears}
            run = lambda: [m(inputs[m.in_features]) for m in self.linears]  # noqa: E731
        run()
        return min(_timed(run) for _ in range(3))


class AttentionClock:
    """Wall time of the engine's attention in a run: every layer's call of its SDPA function, the
    attention to a shared prefix and the combining of the two included. The GFLOP/s leave
    attention out (a small share of the FLOPs), but reading the KV cache at every decode step takes
    time, which no matrix product's speed changes: the products alone plus attention bound the
    share of the peak a run can reach with the rest of each step (norms, rotary embeddings,
    activations, Python) taking no time at all."""

    def __init__(self):
        self.seconds = 0.0

    @contextmanager
    def running(self):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return stacked_gqa_sdpa(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        # transformers looks the function up by name at every layer call
        AttentionInterface.register(NAME, timed)
        try:
            yield self
        finally:
            AttentionInterface.register(NAME, stacked_gqa_sdpa)


@dataclass
class Alternated:
    """Both sides of a comparison timed in turns: each side's median seconds, the ratio of each
    round (lm-eval's time over softeval's, the two runs of a round being adjacent in time), each
    side's result from its last run, and whether softeval's results were the same every round."""

    ours_s: float
    theirs_s: float
    ratios: list[float]
    ours: object
    theirs: object
    consistent: bool

    def figures(self) -> dict:
        return {
            "softeval_s": self.ours_s,
            "lm_eval_s": self.theirs_s,
            "speedup": statistics.median(self.ratios),
            "round_speedups": self.ratios,
        }

    @property
    def consistency(self) -> str:
        if len(self.ratios) == 1:
            return ""
        return "; softeval's results the same in every round" if self.consistent else "; softeval's results CHANGED between rounds"


def alternate(rounds: int, ours, theirs, same=lambda a, b: a[1] == b[1]) -> Alternated:
    """Run `ours` (returning softeval's result, timed here) and `theirs` (returning lm-eval's
    output and seconds, as `run_lm_eval` does) `rounds` times each, in turns: softeval first in
    even rounds, lm-eval first in odd ones. This machine's speed drifts by
    tens of percent within minutes, so one pair of runs, always in the same order, would count
    the drift as a difference between the two."""
    ours_s, theirs_s, ours_results, theirs_out = [], [], [], None
    for r in range(rounds):
        for side in ("ours", "theirs") if r % 2 == 0 else ("theirs", "ours"):
            if side == "ours":
                start = time.perf_counter()
                ours_results.append(ours())
                ours_s.append(time.perf_counter() - start)
            else:
                theirs_out, seconds = theirs()  # run_lm_eval times lm-eval itself
                theirs_s.append(seconds)
    ratios = [t / o for o, t in zip(ours_s, theirs_s)]
    consistent = all(same(ours_results[0], other) for other in ours_results[1:])
    return Alternated(statistics.median(ours_s), statistics.median(theirs_s), ratios, ours_results[-1], theirs_out, consistent)


def lm_eval_model(folder: Path, batch_size: int):
    from lm_eval.models.huggingface import HFLM

    return HFLM(pretrained=str(folder), dtype="float32", batch_size=batch_size, device="cpu")


def run_lm_eval(model, task_yaml: str, name: str, log_samples: bool = False):
    import lm_eval
    from lm_eval.tasks import TaskManager

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / f"{name}.yaml").write_text(task_yaml)
        start = time.perf_counter()
        out = lm_eval.simple_evaluate(model=model, tasks=[name], task_manager=TaskManager(include_path=tmp), log_samples=log_samples)
        return out, time.perf_counter() - start


def bench_mc(lm, hflm, data_dir: Path, rows: int, batch_size: int, flops: FlopCounter, peak: float, rounds: int = 1) -> dict:
    spec = load_task("arc_easy")
    examples = load_examples(spec, "test", data_dir)[:rows]

    def ours():
        builder = PromptBuilder(spec, lm)
        clozes = [builder.cloze(e) for e in examples]
        engine = Engine(lm, batch_size=batch_size)
        return engine, engine.loglikelihood(clozes)

    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "rows.jsonl"
        lines = (data_dir / "allenai/ai2_arc/ARC-Easy/test.jsonl").read_text().splitlines()[:rows]
        data.write_text("\n".join(lines) + "\n")
        timing = alternate(rounds, ours, lambda: run_lm_eval(hflm, MC_TASK.format(data=data), "bench_mc"))
    (engine, scores), out = timing.ours, timing.theirs
    ours_acc = sum(score_sample(spec.format, e, "", s).knowledge_correct for e, s in zip(examples, scores)) / len(examples)
    theirs_acc = out["results"]["bench_mc"]["acc_norm,none"]

    gflops = flops.forward(engine.forward.positions_computed, engine.forward.logit_rows_computed) / timing.ours_s / 1e9
    return {
        "mode": "mc-loglikelihood arc_easy",
        "rows": rows,
        **timing.figures(),
        "agreement": f"acc_norm {100 * ours_acc:.2f} vs {100 * theirs_acc:.2f}" + timing.consistency,
        "agree_ok": abs(ours_acc - theirs_acc) * 100 <= 0.5 and timing.consistent,
        "gflops": gflops,
        "peak_share": gflops / peak,
    }


def bench_generation(
    lm, hflm, task: str, data_dir: Path, rows: int, batch_size: int, flops: FlopCounter, ceiling: MatmulCeiling, peak: float,
    shots: int = 0, rounds: int = 1,
) -> dict:
    spec = load_task(task)
    examples = load_examples(spec, spec.dataset.eval_split, data_dir)[:rows]
    # the same demonstrations for every row, as `softeval eval --method few-shot` picks them
    demos = choose_demos(spec, load_examples(spec, spec.dataset.fewshot_split, data_dir), shots, seed=0) if shots else []
    builder = PromptBuilder(spec, lm, demos=demos, k=shots, reserve=spec.max_new_tokens)
    prompts = [builder.generation(e) for e in examples]

    def ours():
        engine = Engine(lm, batch_size=batch_size)
        calls = ceiling.record(engine)
        start = time.perf_counter()
        with AttentionClock().running() as attention:
            completions = engine.generate([p.ids for p in prompts], spec.stop, spec.max_new_tokens)
        return engine, completions, calls, attention.seconds / (time.perf_counter() - start)

    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "rows.jsonl"
        data.write_text("".join(json.dumps({"prompt": p.text, "target": e.answer}) + "\n" for p, e in zip(prompts, examples)))
        name = f"bench_gen_{task}_{shots}shot"
        yaml = GEN_TASK.format(name=name, data=data, until=json.dumps(spec.stop), max_new=spec.max_new_tokens)
        timing = alternate(
            rounds, ours, lambda: run_lm_eval(hflm, yaml, name, log_samples=True), same=lambda a, b: [c.tokens for c in a[1]] == [c.tokens for c in b[1]]
        )
    (engine, completions, calls, attention_share), out = timing.ours, timing.theirs
    theirs = {s["doc_id"]: s["resps"][0][0] for s in out["samples"][name]}

    # lm-eval cuts at the first stop string anywhere; softeval only once the answer has begun, so a
    # completion that opens with a newline is compared by lm-eval's rule on the same tokens
    differ = [i for i, c in enumerate(completions) if _cut_anywhere(c.raw, spec.stop) != theirs[i]]
    gaps = [first_difference_gap(lm, prompts[i].ids, completions[i], theirs[i]) for i in differ]
    same = 1 - len(differ) / len(completions)
    # draft positions that kept no token, and the logits after rejected drafts, are not counted
    positions = engine.forward.positions_computed - engine.generation.drafts.positions_discarded
    logit_rows = engine.forward.logit_rows_computed - (engine.generation.drafts.proposed - engine.generation.drafts.accepted)
    gflops = flops.forward(positions, logit_rows) / timing.ours_s / 1e9
    # the products alone, at the sizes this run computed them, rejected drafts and all
    products_s = ceiling.seconds(engine, *calls)
    ceiling_gflops = flops.forward(positions, logit_rows) / products_s / 1e9
    # and with the run's attention (its share of the last round, of the median time) beside them
    attention_s = attention_share * timing.ours_s
    bound_gflops = flops.forward(positions, logit_rows) / (products_s + attention_s) / 1e9
    return {
        "mode": f"generation {task}" + (f" {shots}-shot" if shots else ""),
        "rows": rows,
        **timing.figures(),
        "agreement": f"identical {100 * same:.1f}%, differing rows' top-2 gaps {[round(g, 6) for g in gaps]}"
        f"; drafts kept {engine.generation.drafts.accepted} of {engine.generation.drafts.proposed}" + timing.consistency,
        "agree_ok": same >= 0.99 and all(g < 1e-3 for g in gaps) and timing.consistent,
        "gflops": gflops,
        "peak_share": gflops / peak,
        "ceiling_gflops": ceiling_gflops,
        "attention_share": attention_share,
        "bound_gflops": bound_gflops,
    }


def _cut_anywhere(text: str, stop: list[str]) -> str:
    cuts = [text.find(s) for s in stop if s and s in text]
    return text[: min(cuts)] if cuts else text


def first_difference_gap(lm, prompt_ids: list[int], ours, theirs_text: str) -> float:
    """Top-2 logit gap where the two generations part: a near-tie if it is tiny."""
    common = 0
    while common < min(len(ours.text), len(theirs_text)) and ours.text[common] == theirs_text[common]:
        common += 1
    # the first of our tokens whose text reaches past the common characters
    j = next((j for j in range(len(ours.tokens) + 1) if len(lm.tokenizer.decode(ours.tokens[:j])) > common), len(ours.tokens))
    j = max(j - 1, 0)
    with torch.no_grad():
        logits = lm.model(torch.tensor([prompt_ids + ours.tokens[:j]])).logits[0, -1]
    top = torch.topk(logits.float(), 2).values
    return float(top[0] - top[1])


def bench_long_prompt(lm, data_dir: Path, rows: int, cap: int | None, batch_size: int, flops: FlopCounter, peak: float) -> dict:
    """ARC-Easy generation where one row, in the middle, is a many-shot prompt of about `cap`
    tokens (default: as long as the context allows): at `batch_size`, then at batch size 1."""
    spec = load_task("arc_easy")
    examples = load_examples(spec, spec.dataset.eval_split, data_dir)[:rows]
    prompts = [p.ids for p in map(PromptBuilder(spec, lm, reserve=spec.max_new_tokens).generation, examples)]
    cap = min(cap or lm.context_length, lm.context_length - spec.max_new_tokens)
    # every demonstration takes more than 16 tokens, so these are more than fit under the cap
    demos = load_examples(spec, spec.dataset.fewshot_split, data_dir)[: cap // 16]
    many_shot = PromptBuilder(spec, lm, demos=demos, k=len(demos), reserve=lm.context_length - cap)
    long_row = rows // 2
    prompts[long_row] = many_shot.generation(examples[long_row]).ids

    # CPU time as well as wall time: on a shared machine the wall time also measures the neighbours
    seconds, cpu_seconds, completions, engines = {}, {}, {}, {}
    for size in (batch_size, 1):
        engines[size] = Engine(lm, batch_size=size)
        start, cpu_start = time.perf_counter(), time.process_time()
        completions[size] = engines[size].generate(prompts, spec.stop, spec.max_new_tokens)
        seconds[size], cpu_seconds[size] = time.perf_counter() - start, time.process_time() - cpu_start
    same = [(c.text, c.tokens) for c in completions[batch_size]] == [(c.text, c.tokens) for c in completions[1]]

    # the prefill's padded positions: fixed rows per batch (no budget) against the token budget
    lengths = [len(p) for p in prompts]
    fixed = Engine(lm, batch_size=batch_size, token_budget=sys.maxsize)
    padded = {
        "fixed_rows": _padded_positions(fixed, lengths),
        "token_budget": _padded_positions(engines[batch_size], lengths),
        "batch_size_1": sum(lengths),
    }
    engine = engines[batch_size]
    gflops = flops.forward(engine.forward.positions_computed, engine.forward.logit_rows_computed) / seconds[batch_size] / 1e9
    return {
        "mode": f"one long prompt ({lengths[long_row]} tok)",
        "rows": rows,
        "softeval_s": seconds[batch_size],
        "batch1_s": seconds[1],
        "ratio": seconds[batch_size] / seconds[1],
        "cpu_s": cpu_seconds,
        "agreement": f"completions {'identical' if same else 'DIFFER'} at batch size {batch_size} and 1",
        "agree_ok": same,
        "padded_positions": padded,
        "positions_computed": {size: e.forward.positions_computed for size, e in engines.items()},
        "gflops": gflops,
        "peak_share": gflops / peak,
    }


def _padded_positions(engine: Engine, lengths: list[int]) -> int:
    """Rows x padded width summed over the batches the engine makes of prompts of these lengths."""
    return sum(len(batch) * max(lengths[i] for i in batch) for batch in engine.forward.length_buckets(lengths))


def bench_tuning(lm, data_dir: str, batch_size: int, length: int, steps: int, flops: FlopCounter, peak: float) -> dict:
    spec = load_task("arc_easy")
    tuner = Tuner(lm, spec, TuneConfig(batch_size=batch_size, length=length, val_size=8), data_dir=data_dir)
    batch = load_examples(spec, spec.dataset.tune_split, data_dir, limit=batch_size, seed=1)
    step = softeval_step_fn(tuner, batch)
    step()  # warm-up
    seconds = sum(_timed(step) for _ in range(steps)) / steps
    lengths = [len(tuner.builder.generation(e).ids) + len(lm.encode(tuning_target(spec, e))) for e in batch]
    positions = len(batch) * (max(lengths) + length)  # the padded batch the step computes
    targets = sum(len(lm.encode(tuning_target(spec, e))) for e in batch)
    # forward, then the backward pass through activations only (the weights take no gradients)
    step_flops = 2 * flops.forward(positions, targets)
    gflops = step_flops / seconds / 1e9
    return {"mode": "tuning step", "rows": batch_size, "softeval_s": seconds, "gflops": gflops, "peak_share": gflops / peak}


PROTOCOL_METHODS = "zero-shot,few-shot,soft-prompt"


def bench_self_check(lm, runs: int) -> dict:
    """The self-check's wall time, from a fresh verdict each run (the first run of the process
    pays the first forward passes' warm-up, as a command's first engine does)."""
    seconds = []
    for _ in range(runs):
        forget_verdicts(lm.model)
        start = time.perf_counter()
        verdict = check_model(lm)
        seconds.append(time.perf_counter() - start)
    figures = ", ".join(f"{k} {v:.1e}" for k, v in verdict.figures.items() if k != "greedy_tokens")
    return {"mode": "self-check", "softeval_s": statistics.median(seconds), "runs_s": seconds, "path": verdict.path, "figures": figures}


def reference_engines(lm) -> dict[str, ReferenceEngine]:
    """The reference path with its rows batched as the self-check's batching verdict on the
    model allows, and one row at a time."""
    allowed = reference_batching(lm)
    batched = ReferenceEngine(lm, scoring_rows=TOKEN_BUDGET if allowed["scoring"] else 1,
                              generation_rows=GENERATION_ROWS if allowed["generation"] else 1, shares_contexts=allowed["shared_contexts"])
    return {"batched": batched, "one row": ReferenceEngine(lm)}


def bench_paths(lm, data_dir: Path, mc_rows: int, gen_rows: int) -> list[dict]:
    """The fast path and the reference path, batched and one row at a time, on the same rows:
    ARC-Easy option scoring and GSM8K generation (256 new tokens at most)."""
    spec = load_task("arc_easy")
    builder = PromptBuilder(spec, lm)
    clozes = [builder.cloze(e) for e in load_examples(spec, "test", data_dir)[:mc_rows]]
    engines = {"fast": Engine(lm), **reference_engines(lm)}
    runs = {path: _timed_result(lambda: engine.loglikelihood(clozes)) for path, engine in engines.items()}
    rows = [_paths_row("paths mc-loglikelihood arc_easy", mc_rows, runs, _largest_difference)]
    spec = load_task("gsm8k")
    builder = PromptBuilder(spec, lm, reserve=spec.max_new_tokens)
    prompts = [builder.generation(e).ids for e in load_examples(spec, spec.dataset.eval_split, data_dir)[:gen_rows]]
    runs = {path: _timed_result(lambda: engine.generate(prompts, spec.stop, spec.max_new_tokens)) for path, engine in engines.items()}
    rows.append(_paths_row("paths generation gsm8k", gen_rows, runs, _identical_share))
    return rows


def _paths_row(mode: str, n: int, runs: dict[str, tuple[float, object]], agreement) -> dict:
    """One row of the paths part: each path's time, and how each agrees with the first."""
    (first, (first_s, expected)), *others = runs.items()
    agreements = {path: agreement(expected, got) for path, (_, got) in others}
    return {"mode": mode, "rows": n, "paths_s": {path: seconds for path, (seconds, _) in runs.items()}, "baseline": first,
            "agreement": "; ".join(f"{path} {text}" for path, (text, _) in agreements.items()),
            "agree_ok": all(ok for _, ok in agreements.values())}


def _largest_difference(expected: list[list[float]], got: list[list[float]]) -> tuple[str, bool]:
    worst = max(abs(a - b) for x, y in zip(expected, got) for a, b in zip(x, y))
    return f"largest difference {worst:.1e} nats", worst < 1e-3


def _identical_share(expected, got) -> tuple[str, bool]:
    same = sum(a.tokens == b.tokens for a, b in zip(expected, got)) / len(expected)
    return f"identical {100 * same:.1f}%", same == 1.0


# A tiny model of each class of architecture the reference path serves (the conformance suite's
# configs, tests/architectures.py), and one the fast path serves, for the classes table.
CLASSES = {"attention": "llama", "ALiBi": "bloom", "multi-head latent attention": "deepseek_v3", "state-space": "mamba2",
           "state-space (Mamba)": "mamba", "hybrid (attention + Mamba-2)": "falcon_h1", "hybrid (Mamba + attention)": "jamba",
           "hybrid (convolution + attention)": "lfm2"}


def bench_classes(tokenizer, data_dir: Path, mc_rows: int, gen_rows: int, new_tokens: int = 32) -> list[dict]:
    """Per class of architecture, a tiny random model of it (for `tokenizer`'s vocabulary) on
    each path it can take (the fast one where its self-check passes, the reference path batched
    where the check allows and one row at a time): ARC-Easy option scoring and greedy generation
    from ARC-Easy prompts."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from architectures import loaded  # the conformance suite's tiny configs

    spec = load_task("arc_easy")
    examples = load_examples(spec, "test", data_dir)
    rows = []
    for kind, arch in CLASSES.items():
        lm = loaded(arch, tokenizer)
        verdict = check_model(lm)
        builder = PromptBuilder(spec, lm)
        clozes = [builder.cloze(e) for e in examples[:mc_rows]]
        prompts = [builder.generation(e).ids for e in examples[:gen_rows]]
        engines = {"fast": Engine(lm)} if verdict.path == "fast" else {}
        engines |= reference_engines(lm)
        batched = engines["batched"]
        on = (f"{kind} ({arch}, {verdict.path} path; reference rows: scoring {batched.scoring_rows > 1}, shared contexts "
              f"{batched.shares_contexts}, generation {batched.generation_rows > 1})")
        runs = {path: _timed_result(lambda: engine.loglikelihood(clozes)) for path, engine in engines.items()}
        rows.append(_paths_row(f"classes scoring {on}", mc_rows, runs, _largest_difference))
        if batched.generation_rows > 1:
            runs = {path: _timed_result(lambda: engine.generate(prompts, [], new_tokens)) for path, engine in engines.items()}
            rows.append(_paths_row(f"classes generation {on}", gen_rows, runs, _identical_share))
    return rows


def _timed_result(fn) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def bench_protocol(name: str, data_dir: Path, steps: int, trivia_rows: int, arc_rows: int | None = None) -> dict:
    """The method's protocol for one model, as a user runs it: `softeval run` on the full ARC-Easy
    test split and on `trivia_rows` TriviaQA validation rows, zero-shot, few-shot and a soft prompt
    tuned for `steps` steps per task; wall time per stage (summed over cells, from their records),
    in total, and the peak resident memory of the runs."""
    softeval = Path(sys.executable).with_name("softeval")
    arc_limit = [] if arc_rows is None else ["--limit", str(arc_rows)]  # a smaller run to try the script
    runs = [["--task", "arc_easy", *arc_limit], ["--task", "triviaqa", "--limit", str(trivia_rows)]]
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        for task in runs:
            command = [str(softeval), "run", "--model", name, *task, "--method", PROTOCOL_METHODS,
                       "--steps", str(steps), "--data-dir", str(data_dir), "--output", out]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode:
                raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
        wall = time.perf_counter() - start
        cells = [json.loads(p.read_text()) for p in sorted(Path(out).glob(f"{name}/*/*/results.json"))]
    stages: dict[str, float] = {}
    order = {method: n for n, method in enumerate(PROTOCOL_METHODS.split(","))}
    for cell in sorted(cells, key=lambda c: (c["config"]["task"], order[c["config"]["method"]])):
        task, method = cell["config"]["task"], cell["config"]["method"]
        if cell.get("tuning"):
            stages[f"{task} tune soft prompt"] = cell["tuning"]["tuning_seconds"]
        for stage in ("generate", "loglikelihood"):
            if stage in cell["timings_s"]:
                stages[f"{task} {method} {stage}"] = cell["timings_s"][stage]
    stages["loading, preflight, reports"] = wall - sum(stages.values())
    rows = {cell["config"]["task"]: cell["n_examples"] for cell in cells}
    return {
        "mode": "full protocol",
        "rows": rows,
        "softeval_s": wall,
        "stages_s": stages,
        # the largest resident set of any of the runs (Linux reports kilobytes)
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/benchmarks"))
    parser.add_argument("--models", default="smollm2-135m-instruct,gemma-3-270m")
    parser.add_argument("--mc-rows", type=int, default=500)
    parser.add_argument("--gen-rows", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=None, help="softeval's most rows per batch (default: its budgets decide)")
    parser.add_argument("--lm-eval-batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1, help="runs of each side of the mc, gen and fewshot parts, in turns; medians are reported")
    parser.add_argument("--parts", default="mc,gen,tune")
    parser.add_argument("--gen-tasks", default="gsm8k,arc_easy")
    parser.add_argument("--fewshot-rows", type=int, default=50, help="rows of the few-shot part (GSM8K, 5 demonstrations)")
    parser.add_argument("--long-rows", type=int, default=30)
    parser.add_argument("--long-cap", type=int, default=None, help="tokens of the long prompt (default: the context length)")
    parser.add_argument("--paths-mc-rows", type=int, default=100)
    parser.add_argument("--paths-gen-rows", type=int, default=20)
    parser.add_argument("--checks", type=int, default=3, help="self-check runs of the paths part")
    parser.add_argument("--protocol-steps", type=int, default=120)
    parser.add_argument("--protocol-trivia-rows", type=int, default=1000)
    parser.add_argument("--protocol-arc-rows", type=int, default=None, help="default: the full test split")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    parts = set(args.parts.split(","))
    peak = matmul_peak_gflops()
    print(f"measured fp32 matmul peak: {peak:.1f} GFLOP/s on {args.threads} threads")

    report = []
    for name in args.models.split(","):
        lm = load_model(name, device="cpu", dtype=torch.float32)
        flops = FlopCounter(lm)
        ceiling = MatmulCeiling(lm)
        hflm = lm_eval_model(prepare_alias(name), args.lm_eval_batch_size) if parts & {"mc", "gen", "fewshot"} else None
        rows = []
        if "mc" in parts:
            rows.append(bench_mc(lm, hflm, args.data_dir, args.mc_rows, args.batch_size, flops, peak, args.rounds))
        if "gen" in parts:
            for task in args.gen_tasks.split(","):
                rows.append(bench_generation(lm, hflm, task, args.data_dir, args.gen_rows, args.batch_size, flops, ceiling, peak, rounds=args.rounds))
        if "fewshot" in parts:
            rows.append(
                bench_generation(lm, hflm, "gsm8k", args.data_dir, args.fewshot_rows, args.batch_size, flops, ceiling, peak, shots=5, rounds=args.rounds)
            )
        if "tune" in parts:
            rows.append(bench_tuning(lm, str(args.data_dir), 8, 10, 5, flops, peak))
        if "long" in parts:
            rows.append(bench_long_prompt(lm, args.data_dir, args.long_rows, args.long_cap, args.batch_size or 16, flops, peak))
        if "paths" in parts:
            rows.append(bench_self_check(lm, args.checks))
            rows += bench_paths(lm, args.data_dir, args.paths_mc_rows, args.paths_gen_rows)
        if "classes" in parts:
            rows += bench_classes(lm.tokenizer, args.data_dir, args.paths_mc_rows, args.paths_gen_rows)
        if "protocol" in parts:
            del lm  # the runs load the model themselves
            rows.append(bench_protocol(name, args.data_dir, args.protocol_steps, args.protocol_trivia_rows, args.protocol_arc_rows))
        # the machine's speed drifts during a run: a peak measured again after the model's work,
        # the higher of the two counting, keeps shares from exceeding 100%
        peak = max(peak, matmul_peak_gflops())
        print(f"matmul peak, the best measured so far: {peak:.1f} GFLOP/s")
        for row in rows:
            row["model"] = name
            if "gflops" in row:
                row["peak_share"] = row["gflops"] / peak
            if "ceiling_gflops" in row:
                row["ceiling_share"] = row["ceiling_gflops"] / peak
                row["bound_share"] = row["bound_gflops"] / peak
            line = f"{name:24s} {row['mode']:28s} softeval {row['softeval_s']:8.2f} s" if "softeval_s" in row else ""
            if "runs_s" in row:
                line += f" (runs {', '.join(f'{s:.2f}' for s in row['runs_s'])} s) | {row['path']} path | {row['figures']}"
            if "paths_s" in row:
                base = row["paths_s"][row["baseline"]]
                line = f"{name:24s} {row['mode']:28s} " + " | ".join(
                    f"{path} {seconds:7.2f} s ({seconds / base:.2f}x)" for path, seconds in row["paths_s"].items())
                line += f" | {row['agreement']} [{'ok' if row['agree_ok'] else 'MISMATCH'}]"
            if "lm_eval_s" in row:
                rounds = row["round_speedups"]
                each = f" (rounds {', '.join(f'{r:.2f}x' for r in rounds)})" if len(rounds) > 1 else ""
                line += f" | lm-eval {row['lm_eval_s']:8.2f} s | {row['speedup']:.2f}x{each} | {row['agreement']} [{'ok' if row['agree_ok'] else 'MISMATCH'}]"
            if "batch1_s" in row:
                padded = row["padded_positions"]
                line += (
                    f" | batch size 1 {row['batch1_s']:8.2f} s | {row['ratio']:.2f}x the time"
                    f" (CPU {' vs '.join(f'{s:.1f}' for s in row['cpu_s'].values())} s)"
                    f" | {row['agreement']} [{'ok' if row['agree_ok'] else 'MISMATCH'}]"
                    f" | padded prefill positions: fixed rows {padded['fixed_rows']}, token budget {padded['token_budget']},"
                    f" batch size 1 {padded['batch_size_1']}"
                )
            if "stages_s" in row:
                line += f" | rows {row['rows']} | peak RSS {row['peak_rss_gb']:.2f} GB"
                line += "".join(f"\n    {stage:48s} {seconds:8.1f} s" for stage, seconds in row["stages_s"].items())
            elif "gflops" in row:
                line += f" | {row['gflops']:.1f} GFLOP/s = {100 * row['peak_share']:.0f}% of peak"
            if "ceiling_gflops" in row:
                line += (
                    f" | its matrix products alone: {row['ceiling_gflops']:.1f} GFLOP/s = {100 * row['ceiling_share']:.0f}% of peak"
                    f" (softeval at {100 * row['gflops'] / row['ceiling_gflops']:.0f}% of that)"
                    f" | attention {100 * row['attention_share']:.0f}% of softeval's time; products alone and attention:"
                    f" {row['bound_gflops']:.1f} GFLOP/s = {100 * row['bound_share']:.0f}% of peak"
                )
            print(line, flush=True)
        report += rows
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
