"""Crash safety as a tested property: a real `softeval tune` and `softeval run` are killed
(SIGKILL) at chosen and at random points, including between writing a temporary file and renaming
it, then rerun with the same command; the results equal an uninterrupted run's, and no temporary
file survives."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from conftest import ROWS, write_user_task
from softeval._io import KILL_BEFORE_RENAME_ENV
from softeval.tuning import load_soft_prompt

UMASK = 0o002  # not the common 022, so the file modes show the umask is what decides them


def softeval(*args, kill_before_rename: str | None = None) -> subprocess.CompletedProcess:
    # wide enough that no message is wrapped across lines
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "COLUMNS": "500"}
    env.pop(KILL_BEFORE_RENAME_ENV, None)
    if kill_before_rename:
        env[KILL_BEFORE_RENAME_ENV] = kill_before_rename
    command = [sys.executable, "-c", "from softeval.cli import main; main()", *map(str, args)]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, preexec_fn=lambda: os.umask(UMASK))


def killed_after(seconds: float, *args) -> None:
    """Start the command and SIGKILL it after `seconds` (it may have finished by then)."""
    command = [sys.executable, "-c", "from softeval.cli import main; main()", *map(str, args)]
    env = {k: v for k, v in os.environ.items() if k != KILL_BEFORE_RENAME_ENV} | {"HF_HUB_OFFLINE": "1"}
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=lambda: os.umask(UMASK))
    time.sleep(seconds)
    process.send_signal(signal.SIGKILL)
    process.wait()


def assert_killed(result: subprocess.CompletedProcess, folder: Path) -> None:
    assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
    assert list(folder.rglob(".*.tmp")), "the kill came between a temporary write and its rename"


def assert_clean(folder: Path) -> None:
    leftovers = [p for p in folder.rglob(".*") if p.is_file()]
    assert not leftovers, leftovers


def timed(*args) -> float:
    start = time.perf_counter()
    result = softeval(*args)
    assert result.returncode == 0, result.stderr[-2000:]
    return time.perf_counter() - start


def test_killed_tuning_resumes_to_the_same_prompt(tmp_path, tiny_model_dirs):
    task = write_user_task(tmp_path, ROWS * 10)

    def command(out):
        return ["tune", "--model", tiny_model_dirs["llama"], "--task", task, "--steps", 6, "--eval-every", 2,
                "--val-size", 4, "--tune-batch-size", 2, "--length", 2, "--resume", "--output", out]

    whole_seconds = timed(*command(tmp_path / "whole"))
    out, rng = tmp_path / "killed", random.Random(8)
    # before the second checkpoint is renamed (step 4): the rerun resumes from step 2
    assert_killed(softeval(*command(out), kill_before_rename="checkpoint.safetensors:2"), out)
    # at a random write of the resumed run (checkpoints 4 and 6, curve.json, curve.svg, prompt)
    assert_killed(softeval(*command(out), kill_before_rename=f"*:{rng.randint(1, 5)}"), out)
    # just before the finished prompt is renamed into place
    assert_killed(softeval(*command(out), kill_before_rename="soft_prompt.safetensors"), out)
    final = softeval(*command(out))
    assert final.returncode == 0, final.stderr[-2000:]
    # and at a random moment of a fresh run (past interpreter start-up, most likely)
    timed_out = tmp_path / "timed"
    killed_after(rng.uniform(0.3, 0.9) * whole_seconds, *command(timed_out))
    assert softeval(*command(timed_out)).returncode == 0

    whole = load_soft_prompt(tmp_path / "whole")
    for folder in (out, timed_out):
        assert torch.equal(whole.vectors, load_soft_prompt(folder).vectors)
        assert json.loads((folder / "curve.json").read_text()) == json.loads((tmp_path / "whole" / "curve.json").read_text())
        assert_clean(folder)
    for name in ("soft_prompt.safetensors", "curve.json", "curve.svg", "checkpoint.safetensors"):
        assert (out / name).stat().st_mode & 0o777 == 0o666 & ~UMASK


def test_resumed_tuning_reports_the_whole_runs_time(tmp_path, tiny_model_dirs):
    task = write_user_task(tmp_path, ROWS * 10)
    out = tmp_path / "tuned"
    command = ["tune", "--model", tiny_model_dirs["llama"], "--task", task, "--steps", 4, "--eval-every", 2,
               "--val-size", 4, "--length", 2, "--resume", "--output", out]
    first = softeval(*command)  # --resume without a checkpoint starts from step 0 and says so
    assert first.returncode == 0 and f"no checkpoint in {out} yet: tuning from step 0" in first.stderr
    seconds = load_soft_prompt(out).metadata["tuning_seconds"]
    assert seconds > 0.05
    again = softeval(*command)  # everything is done: nothing more is tuned, the time stays the run's
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"tuned 4 steps in {seconds} s" in again.stdout
    assert load_soft_prompt(out).metadata["tuning_seconds"] == seconds


def test_killed_run_ends_with_the_same_results(tmp_path, tiny_model_dirs):
    task = write_user_task(tmp_path, ROWS * 10)

    def command(out):
        return ["run", "--model", tiny_model_dirs["llama"], "--task", task, "--method", "zero-shot,few-shot,soft-prompt",
                "--k", 2, "--steps", 4, "--eval-every", 2, "--val-size", 4, "--tune-batch-size", 2, "--length", 2,
                "--limit", 8, "--output", out]

    whole_seconds = timed(*command(tmp_path / "whole"))
    out, rng = tmp_path / "killed", random.Random(9)
    assert_killed(softeval(*command(out), kill_before_rename="results.json:2"), out)  # between two cells
    assert_killed(softeval(*command(out), kill_before_rename="checkpoint.safetensors:2"), out)  # mid-tuning
    # a random write of a rerun: the last checkpoint, curves, prompt, the cell, models and comparison files
    assert_killed(softeval(*command(out), kill_before_rename=f"*:{rng.randint(1, 8)}"), out)
    final = softeval(*command(out))
    assert final.returncode == 0, final.stderr[-2000:]
    timed_out = tmp_path / "timed"  # and at a random moment of a fresh run
    killed_after(rng.uniform(0.3, 0.9) * whole_seconds, *command(timed_out))
    assert softeval(*command(timed_out)).returncode == 0

    name = tiny_model_dirs["llama"].name
    for folder in (out, timed_out):
        for method in ("zero-shot", "few-shot", "soft-prompt"):
            cell, reference = folder / name / "capitals" / method, tmp_path / "whole" / name / "capitals" / method
            assert (cell / "samples.jsonl").read_text() == (reference / "samples.jsonl").read_text()
            got, want = (json.loads((f / "results.json").read_text()) for f in (cell, reference))
            assert got["metrics"] == want["metrics"] and got["diagnostics"] == want["diagnostics"]
            if method == "soft-prompt":
                assert got["config"]["soft_prompt"]["sha256"] == want["config"]["soft_prompt"]["sha256"]
            assert (cell / "results.json").stat().st_mode & 0o777 == 0o666 & ~UMASK
        assert_clean(folder)


def test_killed_study_ends_with_the_same_results(tmp_path, tiny_model_dirs):
    """A study with both tuned methods, killed at a random write and at a random moment; each rerun
    of the same command ends where an uninterrupted run does."""
    import yaml

    task = write_user_task(tmp_path, ROWS * 10)
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump({
        "models": [str(tiny_model_dirs["llama"])], "tasks": [str(task)], "methods": ["zero-shot", "soft-prompt", "lora"],
        "limit": 8, "tuning": {"steps": 4, "eval_every": 2, "val_size": 4, "batch_size": 2, "length": 2},
    }))
    whole_seconds = timed("study", study, "--output", tmp_path / "whole")
    rng = random.Random(11)
    out = tmp_path / "killed"
    assert_killed(softeval("study", study, "--output", out, kill_before_rename=f"*:{rng.randint(2, 12)}"), out)
    assert_killed(softeval("study", study, "--output", out, kill_before_rename="adapter_model.safetensors"), out)
    assert softeval("study", study, "--output", out).returncode == 0
    timed_out = tmp_path / "timed"
    killed_after(rng.uniform(0.3, 0.9) * whole_seconds, "study", study, "--output", timed_out)
    assert softeval("study", study, "--output", timed_out).returncode == 0

    name = tiny_model_dirs["llama"].name
    for folder in (out, timed_out):
        for method in ("zero-shot", "soft-prompt", "lora"):
            cell, reference = folder / name / "capitals" / method, tmp_path / "whole" / name / "capitals" / method
            assert (cell / "samples.jsonl").read_text() == (reference / "samples.jsonl").read_text()
            got, want = (json.loads((f / "results.json").read_text()) for f in (cell, reference))
            assert got["metrics"] == want["metrics"] and got["identity"] == want["identity"]
        want = json.loads((tmp_path / "whole" / "comparison.json").read_text())
        got = json.loads((folder / "comparison.json").read_text())
        assert [c["metrics"] for c in got["cells"]] == [c["metrics"] for c in want["cells"]] and got["paired"] == want["paired"]
        assert_clean(folder)
