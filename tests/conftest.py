"""Shared fixtures and helpers: tiny random models with the real offline tokenizers, the benchmark
mirror, user task files and reference computations the tests compare against."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    Gemma3TextConfig,
    LlamaConfig,
)

from softeval.formats import Example
from softeval.models import load_model, prepare_alias

REPO = Path(__file__).resolve().parents[1]
MIRROR = Path(os.environ.get("SOFTEVAL_TEST_DATA", REPO.parent / "shared" / "benchmarks"))


# Tests of a minute or more (on 2 cores), run first and in this order: `make test` hands each of
# its two workers two tests to start with, then one more whenever one ends, so the 1st and 2nd go
# to one worker and the next ones to the other as it finishes tests. The testbed's study (its
# shared build, then the study: about 4 minutes) and another seed's build run one after the other
# on one worker: two builds side by side each train one process per core, and both took twice as
# long (a suite of 17.7 minutes against 14.9). The other worker reads the registry's shards and
# runs the crash tests (the first of which converts the offline models), then the in-loop test,
# which needs the study: on 2 cores it is done by then (the in-loop test waited a minute for it
# when dealt before the crash tests).
FIRST = [
    "test_testbed.py::test_a_study_of_the_testbed_states_every_claim",
    "test_testbed.py::test_another_seed_makes_another_world",
    "test_lm_eval_registry.py::test_every_registry_task_builds",
    "test_crash_safety.py::test_killed_",
    "test_testbed.py::test_recipes_evaluated_in_their_loop",
    "test_series.py::test_a_tiny_pretraining_run_is_analysed_end_to_end",
    "test_lm_eval_tasks.py::test_knowledge_equals_lm_evals_own_metric",
]


def _first(item) -> int:
    where = f"{item.path.name}::{item.name}"
    return next((k for k, prefix in enumerate(FIRST) if where.startswith(prefix)), len(FIRST))


def pytest_collection_modifyitems(items):
    items.sort(key=_first)  # stable: every other test keeps its place
    if not MIRROR.is_dir():
        skip = pytest.mark.skip(reason=f"benchmark mirror not found at {MIRROR} (set SOFTEVAL_TEST_DATA)")
        for item in items:
            if "mirror" in item.fixturenames:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def mirror() -> Path:
    return MIRROR


@pytest.fixture(scope="session")
def tokenizer_dirs() -> dict[str, Path]:
    """Folders of the converted offline models (converted once into the cache)."""
    return {"llama": prepare_alias("smollm2-135m-instruct"), "gemma3": prepare_alias("gemma-3-270m")}


def tiny_config(arch: str, vocab_size: int, tokenizer, window: int = 32):
    common = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        # wide initial weights make sharp, context-dependent next-token choices (no near-ties)
        initializer_range=0.3,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    if arch == "llama":
        return LlamaConfig(**common)
    # a short sliding window, so the mixed sliding/full attention layers are exercised
    return Gemma3TextConfig(
        **common, head_dim=16, sliding_window=window, query_pre_attn_scalar=16, layer_types=["sliding_attention", "full_attention"]
    )


@pytest.fixture(scope="session")
def tiny_model_dirs(tokenizer_dirs, tmp_path_factory) -> dict[str, Path]:
    """Randomly initialised llama and gemma3 models saved as local folders with real tokenizers.
    "gemma3" has a 32-token sliding window that test prompts outgrow; "gemma3-wide" one they do not."""
    dirs = {}
    for arch, source, window in [("llama", "llama", 0), ("gemma3", "gemma3", 32), ("gemma3-wide", "gemma3", 256)]:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dirs[source])
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(tiny_config(source, len(tokenizer), tokenizer, window))
        folder = tmp_path_factory.mktemp(f"tiny-{arch}")
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        dirs[arch] = folder
    return dirs


@pytest.fixture(scope="session", params=["llama", "gemma3", "gemma3-wide"])
def tiny_lm(request, tiny_model_dirs):
    return load_model(str(tiny_model_dirs[request.param]), device="cpu")


@pytest.fixture(scope="session")
def tiny_llama(tiny_model_dirs):
    return load_model(str(tiny_model_dirs["llama"]), device="cpu")


@pytest.fixture(scope="session")
def tiny_gemma(tiny_model_dirs):
    return load_model(str(tiny_model_dirs["gemma3"]), device="cpu")


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA device (skipped without one)")
    # `make test` runs one pytest-xdist worker per core: each runs torch, and the processes it
    # starts, on its share of the cores (more torch threads than cores slow every worker down
    # many times). numpy's BLAS keeps its threads (one run each: the suite took 14.9 minutes so,
    # 20 with OpenBLAS held to one thread per worker too).
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1  # the cores this process may use
        threads = max(1, cores // workers)
        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)


def built_once(tmp_path_factory, name: str, build: Callable[[Path], object]) -> tuple[Path, object]:
    """A folder that `build(folder)` fills, built once per test session and shared by all of
    pytest-xdist's workers: the first to ask builds it under a lock, the others wait and read it.
    Returns the folder and what `build` returned (JSON-able). A build that failed is not tried
    again by the next worker: it fails at once, naming the first failure."""
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent / f"shared-{os.environ.get('PYTEST_XDIST_TESTRUNUID', 'run')}"  # this session's, above each worker's own
        root.mkdir(exist_ok=True)
    folder, built, failed = root / name, root / f"{name}.built.json", root / f"{name}.failed"
    with FileLock(root / f"{name}.lock"):
        if failed.exists():
            pytest.fail(f"{name} was built by another test worker and failed there: {failed.read_text()}")
        if not built.exists():
            try:
                made = build(folder)
            except BaseException as exc:
                failed.write_text(f"{type(exc).__name__}: {str(exc)[:2000]}")
                raise
            partial = built.with_suffix(".partial")
            partial.write_text(json.dumps(made))
            os.replace(partial, built)
    return folder, json.loads(built.read_text())


def pytest_runtest_setup(item):
    if "cuda" in item.keywords and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")


# --- prompts the engine tests share ----------------------------------------------------------------

TEXTS = [
    "Question: Which gas do plants take in?\nAnswer:",
    "The capital of France is",
    "Q: 2 + 2 =",
    "A much longer prompt that goes on for a while, so that the batch needs left padding to line up. Answer:",
]
# prompts that start alike exercise the engine's shared-prefix path
SHARED = "Answer each of the following questions as briefly and as accurately as you can.\n\n"


def prompt_ids(lm, text: str) -> list[int]:
    """Token ids of a prompt as the engine takes them: BOS first where the model uses one."""
    ids = lm.encode(text)
    return [lm.bos_token_id, *ids] if lm.bos_token_id is not None else ids


def reference_greedy(lm, ids: list[int], n: int, soft: torch.Tensor | None = None) -> list[int]:
    """Greedy decoding by full forward passes without cache, one prompt at a time (the soft
    prompt, if any, after BOS)."""
    seq = list(ids)
    embed = lm.model.get_input_embeddings()
    n_head = 1 if soft is not None and lm.bos_token_id is not None else 0
    with torch.no_grad():
        for _ in range(n):
            tokens = torch.tensor(seq)
            pieces = [embed(tokens[:n_head]), *([soft] if soft is not None else []), embed(tokens[n_head:])]
            logits = lm.model(inputs_embeds=torch.cat(pieces)[None]).logits[0, -1]
            seq.append(int(logits.argmax()))
    return seq[len(ids) :]


def reference_loglikelihood(lm, context: list[int], continuation: list[int], soft: torch.Tensor | None = None) -> float:
    """Summed log-probability of `continuation` after `context` by one unpadded forward pass
    (the soft prompt, if any, after BOS)."""
    embed = lm.model.get_input_embeddings()
    ids = torch.tensor(context + continuation)
    n_head = 1 if soft is not None and lm.bos_token_id is not None else 0
    pieces = [embed(ids[:n_head]), *([soft] if soft is not None else []), embed(ids[n_head:])]
    n_soft = 0 if soft is None else len(soft)
    with torch.no_grad():
        logprobs = torch.log_softmax(lm.model(inputs_embeds=torch.cat(pieces)[None]).logits[0].float(), -1)
    start = len(context) + n_soft - 1
    return sum(float(logprobs[start + j, t]) for j, t in enumerate(continuation))


# --- user tasks ------------------------------------------------------------------------------------

ROWS = [{"q": "Capital of France?", "a": "Paris", "b": "Rome", "gold": 0}, {"q": "Capital of Italy?", "a": "Paris", "b": "Rome", "gold": 1}]


def practice(row):
    """A tuning row: the evaluation row's question asked as practice (tuning never sees the rows it
    is scored on; see data.apart_from_evaluation)."""
    return {**row, "q": "Practice: " + row["q"]} if isinstance(row, dict) and isinstance(row.get("q"), str) else row


def write_user_task(tmp_path: Path, rows: list, fmt: str = "jsonl", **overrides) -> Path:
    """A two-option multiple-choice task spec reading `rows` from a local file (its evaluation
    and few-shot split) and tuning on the same rows asked as practice; returns the spec path."""
    files = {"test": tmp_path / f"test.{fmt}", "train": tmp_path / f"train.{fmt}"}
    for split, data in files.items():
        split_rows = rows if split == "test" else [practice(r) for r in rows]
        if fmt == "jsonl":
            data.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in split_rows))
        else:
            import pandas as pd

            frame = pd.DataFrame(split_rows)
            frame.to_csv(data, index=False) if fmt == "csv" else frame.to_parquet(data)
    spec = {
        "name": "capitals",
        "dataset": {
            "path": "local/capitals",
            "eval_split": "test",
            "tune_split": "train",
            "fewshot_split": "test",
            "data_files": {split: data.name for split, data in files.items()},
        },
        "answer_format": "multiple_choice",
        "fields": {"question": "q", "choices": "[a, b]", "answer": "gold"},
        "template": "Question: {{ question }}\n{{ options }}\nAnswer:",
        "cloze_template": "Question: {{ question }}\nAnswer:",
        "target": " {{ letter }}",
        "stop": ["\n"],
        "max_new_tokens": 4,
    } | overrides
    path = tmp_path / "capitals.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def mc_example(choices: list[str], answer_index: int) -> Example:
    return Example(index=0, source="t", row={}, question="q", answer="ABCDEFGH"[answer_index], choices=choices, answer_index=answer_index)


def qa_example(answer: str, *aliases: str) -> Example:
    return Example(index=0, source="t", row={}, question="q", answer=answer, aliases=[answer, *aliases])


# --- studies ---------------------------------------------------------------------------------------

TUNING = {"steps": 2, "eval_every": 2, "val_size": 4, "batch_size": 2, "length": 2}
CAPITALS = [("France", "Paris"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Japan", "Tokyo"), ("Egypt", "Cairo"), ("Peru", "Lima"),
            ("Kenya", "Nairobi"), ("Norway", "Oslo"), ("Chile", "Santiago"), ("Greece", "Athens"), ("Cuba", "Havana"), ("Iran", "Tehran")]
# twelve different questions, the gold option first or second in turn: random models score apart
STUDY_ROWS = [
    {"q": f"Capital of {country}?", "a": capital if i % 2 == 0 else CAPITALS[i - 1][1], "b": CAPITALS[(i + 1) % 12][1] if i % 2 == 0 else capital, "gold": i % 2}
    for i, (country, capital) in enumerate(CAPITALS)
] * 2


@pytest.fixture(scope="session")
def family_dirs(tokenizer_dirs, tmp_path_factory) -> dict[str, dict[str, Path]]:
    """Three families of tiny llamas: a base model (no chat template) and a post-trained one
    (the SmolLM2 tokenizer's chat template) each, with different random weights."""
    families = {}
    for i, family in enumerate(["alpha", "beta", "gamma"]):
        families[family] = {}
        for role, seed in (("base", 10 + i), ("post-trained", 20 + i)):
            tokenizer = AutoTokenizer.from_pretrained(tokenizer_dirs["llama"])
            if role == "base":
                tokenizer.chat_template = None
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(tiny_config("llama", len(tokenizer), tokenizer))
            folder = tmp_path_factory.mktemp(f"{family}-{role}")
            model.save_pretrained(folder)
            tokenizer.save_pretrained(folder)
            families[family][role] = folder
    return families


def write_study(tmp_path, family_dirs, methods, rows=None, **extra) -> Path:
    """A study file over the tiny families on the capitals task (12 rows evaluated, 2 tuning steps)."""
    task = write_user_task(tmp_path, rows or STUDY_ROWS)
    models = [{"model": str(folder), "family": family, "role": role} for family, roles in family_dirs.items() for role, folder in roles.items()]
    study = {"models": models, "tasks": [str(task)], "methods": methods, "chat": True, "k": 2, "limit": 12, "tuning": TUNING} | extra
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


def cells_of(out: Path) -> dict[tuple, dict]:
    found = {}
    for path in out.glob("*/*/*/results.json"):
        saved = json.loads(path.read_text())
        found[path.parent.relative_to(out).parts] = saved
    return found


