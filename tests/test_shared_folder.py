"""Commands that share an output folder: each cell and each tuning is computed once (a second
command waits for the first and reuses its result), and a killed command's claim is taken over."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from filelock import FileLock, Timeout

from conftest import ROWS, write_user_task
from softeval._io import KILL_BEFORE_RENAME_ENV
from softeval.study.locks import claimed, lock_path


def command(*args) -> list[str]:
    return [sys.executable, "-c", "from softeval.cli import main; main()", *map(str, args)]


def environment(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != KILL_BEFORE_RENAME_ENV}
    return env | {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "COLUMNS": "500"} | extra


def run_args(model, task, out) -> list:
    return ["run", "--model", model, "--task", task, "--method", "zero-shot,soft-prompt", "--steps", 24, "--eval-every", 8,
            "--val-size", 4, "--length", 2, "--output", out]


def test_two_commands_started_together_tune_each_prompt_once(tmp_path, tiny_model_dirs):
    task = write_user_task(tmp_path, ROWS * 10)
    out = tmp_path / "shared"
    both = [subprocess.Popen(command(*run_args(tiny_model_dirs["llama"], task, out)), env=environment(), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    logs = [p.communicate(timeout=600)[0] for p in both]
    assert [p.returncode for p in both] == [0, 0], logs
    prompt = out / tiny_model_dirs["llama"].name / "capitals" / "prompt"
    # one command tuned the prompt and the other reused it (after waiting where they overlapped);
    # each of the two cells was computed by one command and found finished by the other
    assert sum(log.count(f"reusing {prompt}") for log in logs) == 1, logs
    assert sum(log.count("finished already: ") for log in logs) == 2, logs
    cells = json.loads((out / "comparison.json").read_text())["cells"]
    assert {c["method"] for c in cells} == {"zero-shot", "soft-prompt"}


def test_a_killed_commands_claim_is_taken_over(tmp_path, tiny_model_dirs):
    task = write_user_task(tmp_path, ROWS * 10)
    out = tmp_path / "shared"
    args = run_args(tiny_model_dirs["llama"], task, out)
    # killed while it tunes the prompt, holding the claims on its cell and its tuning
    killed = subprocess.run(command(*args), env=environment(**{KILL_BEFORE_RENAME_ENV: "soft_prompt.safetensors"}), capture_output=True,
                            text=True, timeout=600)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    prompt = out / tiny_model_dirs["llama"].name / "capitals" / "prompt"
    assert lock_path(out, prompt).is_file()  # its lock file stays; the claim died with the process
    again = subprocess.run(command(*args), env=environment(), capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "waiting for another softeval command" not in again.stdout + again.stderr
    assert (prompt / "soft_prompt.safetensors").is_file() and (out / "comparison.json").is_file()


def test_a_claim_held_elsewhere_is_waited_for(tmp_path):
    """While another process holds a folder's claim, this one waits; once it lets go, this one has it."""
    out, folder = tmp_path / "out", tmp_path / "out" / "model" / "task" / "zero-shot"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom pathlib import Path\nfrom softeval.study.locks import claimed\n"
                               f"with claimed(Path({str(out)!r}), Path({str(folder)!r})):\n    print('held', flush=True)\n    time.sleep(600)"],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(Timeout):  # the claim of a living process is not taken
        FileLock(lock_path(out, folder)).acquire(timeout=0.2)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    with claimed(out, folder):  # the dead holder's claim is free at once
        assert lock_path(out, folder).is_file()
