"""Every task of lm-evaluation-harness's registry, built as a softeval task without its data: each
one builds or is refused in one line; nothing it imports or runs ends the process or escapes as
another error. The counts by outcome are in docs/tasks.md."""

from __future__ import annotations

import logging
import re
from collections import Counter

import pytest

from softeval.errors import SoftevalError

lm_eval = pytest.importorskip("lm_eval")


def _outcome(name: str, message: str) -> str:
    """A refusal's kind: its message without the task's name, up to its details."""
    general = message.replace(f"'{name}'", "TASK").replace(f" {name} ", " TASK ")
    return re.split(r"[;(]", general)[0].strip()


SHARDS = 4  # every fourth task of the sorted registry per test: the shards run side by side under pytest-xdist


@pytest.mark.parametrize("shard", range(SHARDS))
def test_every_registry_task_builds_or_is_refused_in_one_line(caplog, shard):
    from lm_eval.tasks._index import Kind

    from softeval.tasks import load_task
    from softeval.tasks.lm_eval import _task_manager

    caplog.set_level(logging.CRITICAL)  # lm-eval's own notes while it reads configurations
    names = sorted(name for name, entry in _task_manager().task_index.items() if entry.kind == Kind.TASK)
    assert len(names) > 10_000
    tried = names[shard::SHARDS]
    outcomes = Counter()
    for name in tried:
        try:
            load_task(f"lm-eval:{name}")
        except SoftevalError as exc:  # anything else fails the test: a crash, an exit
            message = str(exc)
            assert message and "\n" not in message, (name, message)
            outcomes[_outcome(name, message)] += 1
        else:
            outcomes["builds"] += 1
    # 11,610 of 13,093 build (docs/tasks.md); every fourth task by name is a sample of them all
    assert outcomes["builds"] / len(tried) > 0.85, outcomes.most_common()
