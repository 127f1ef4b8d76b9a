"""lm-evaluation-harness's own reading of an answer (`lm_eval`), for its generation tasks
(`--task lm-eval:NAME`) that name no softeval format: lm-eval's configuration says how an answer
is extracted (its `filter_list`) and how it is scored (its `metric_list`, or the task's own
`process_results`), and this format applies both through lm-eval itself.

* strict: what the task's strict filter pipeline extracts (the one named `strict...`, else the
  first; without filters, the completion itself); no answer where its regex finds none;
* lenient: what its flexible pipeline extracts (named `flex...`, else the second); without one,
  the strict pipeline's answer, else the completion's last line (its final period dropped);
* correct: lm-eval's `process_results` scores the answer 1 by the task's first metric (exact
  match with `ignore_case`, `ignore_punctuation` and `regexes_to_ignore` as configured, or
  DROP's own exact match).

The lm-eval task is named by each row (`lm_eval_task`, set where the row was read). Its reading
is lm-eval's code, which the tasks layer registers in READINGS when it reads the task's rows
(`softeval.tasks.lm_eval`): formats stay below tasks, and lm-eval is imported only there.
"""

from __future__ import annotations

from typing import ClassVar, Protocol

from softeval.errors import SoftevalError
from softeval.formats.base import AnswerFormat, Example, Reading


class LmEvalReading(Protocol):
    """How an lm-eval task reads and scores an answer, by lm-eval's own code."""

    def extract(self, completion: str, doc: dict, *, flexible: bool = False) -> str | None: ...

    def score(self, answer: str, doc: dict) -> float: ...


READINGS: dict[str, LmEvalReading] = {}  # by lm-eval task name, registered as its rows are read


def _reading(example: Example) -> LmEvalReading:
    task = example.row["lm_eval_task"]
    if task not in READINGS:
        raise SoftevalError(f"lm-eval task {task}: its answers are read only after its rows are (load the task's examples first)")
    return READINGS[task]


class LmEval(AnswerFormat):
    name: ClassVar[str] = "lm_eval"
    fields: ClassVar[tuple[str, ...]] = ("question", "answer")
    answer_last: ClassVar[bool] = True  # chain-of-thought tasks end with their answer

    def example(self, values: dict, *, index: int, source: str, row: dict) -> Example:
        example = super().example(values, index=index, source=source, row=row)
        answer = values["answer"]
        if not isinstance(answer, str | int | float) or not str(answer).strip():
            raise SoftevalError(f"{source}: field 'answer' is empty")
        if not row.get("lm_eval_task"):
            raise SoftevalError(f"{source}: the lm_eval answer format reads rows of lm-eval tasks only (--task lm-eval:NAME)")
        example.answer = str(answer).strip()
        return example

    def strict(self, completion: str, example: Example, *, cut: bool = False) -> Reading:
        answer = _reading(example).extract(completion, example.row)
        return Reading(answer) if answer is not None else Reading.none("no_answer", "lm-eval's strict filter finds no answer")

    def lenient(self, completion: str, example: Example, *, cut: bool = False) -> Reading:
        reading = _reading(example)
        answer = reading.extract(completion, example.row, flexible=True) or reading.extract(completion, example.row)
        if answer is None:
            lines = [line.strip() for line in completion.strip().splitlines() if line.strip()]
            answer = lines[-1].removesuffix(".").strip() if lines else None
        return Reading(answer) if answer else Reading.none("no_answer", "no answer in the completion")

    def is_correct(self, answer: str | None, example: Example) -> bool:
        return answer is not None and _reading(example).score(answer, example.row) == 1.0
