"""Math (`math`, competition mathematics): strict takes the last `\\boxed{...}` or `\\fbox{...}`
(nested braces) or `\\boxed 9`; lenient also takes a final-answer line ("Final Answer: The final
answer is $7$", "Answer: 7"; at most six words unless in `$...$`). Correct
means mathematically equivalent to the gold answer by math-verify (`0.5` = `\\frac{1}{2}`,
`-8` is not `8`; intervals and tuples compare as such), never by string normalisation.
"""

from __future__ import annotations

import re
import threading
from functools import lru_cache

from softeval.errors import SoftevalError
from softeval.formats.base import AnswerFormat, Example, Reading

# --- math: a \\boxed{} answer, compared by mathematical equivalence ---------------------------------

# "Final Answer: The final answer is $7$. I hope it is correct.", "The final answer is 7", "Answer: 7"
# "final answer is" anywhere in a line; "Answer:" only at its start
_FINAL_ANSWER = re.compile(
    r"(?:final answer is\s*:?|^\s*(?:final\s+)?answer\s*:)\s*(?P<answer>.+?)\s*$",
    re.IGNORECASE | re.MULTILINE,
)
_HOPE = re.compile(r"\.?\s*I hope it is correct\.?$", re.IGNORECASE)
_MAX_ANSWER_WORDS = 6  # longer captures are prose ("the answer: first we compute ..."), not answers


def _ends_braced(text: str) -> bool:
    """Whether the last `\\boxed` of a text opens a brace (so `last_boxed` can tell it is closed)."""
    found = list(re.finditer(r"\\(?:boxed|fbox)\s*(\{)?", text))
    return bool(found) and found[-1].group(1) is not None


def _superseded(answer: str, completion: str) -> bool:
    """Whether the line the token limit cut begins a `\\boxed` answer that does not begin as
    `answer` (read before that line) does: the completion was writing another answer ("\\boxed{7}
    then \\boxed{1"), not repeating this one ("\\boxed{7} so \\boxed{7")."""
    cut_line = completion[len(_complete_lines(completion)) :]
    begun = list(re.finditer(r"\\(?:boxed|fbox)\s*\{?", cut_line))
    return bool(begun) and not answer.startswith(cut_line[begun[-1].end() :].strip())


def _complete_lines(text: str) -> str:
    """The lines a newline ended: not the one the token limit cut."""
    return text[: text.rfind("\n") + 1]


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` or `\\fbox{...}` (braces nested to any depth),
    or of `\\boxed 9` (up to the closing `$`)."""
    found = list(re.finditer(r"\\(?:boxed|fbox)", text))
    if not found:
        return None
    rest = text[found[-1].end() :]
    opening = re.match(r"\s*\{", rest)
    if opening is None:
        bare = re.match(r"\s+([^$\n]+)", rest)  # "\boxed 9": up to the closing $
        return bare.group(1).strip().rstrip(".,;").strip() if bare else None
    depth = 0
    for i in range(opening.end() - 1, len(rest)):
        depth += {"{": 1, "}": -1}.get(rest[i], 0)
        if depth == 0:
            return rest[opening.end() : i].strip()
    return None  # unbalanced: the completion was cut


def final_answer_line(text: str) -> str | None:
    """The answer of the last final-answer line, its math if it is written in `$...$`."""
    for match in reversed(list(_FINAL_ANSWER.finditer(text))):
        answer = _HOPE.sub("", match.group("answer")).strip()
        math = re.findall(r"\$([^$]+)\$", answer)
        if math:
            return math[-1].strip()
        answer = answer.rstrip(".").strip()
        if answer and len(answer.split()) <= _MAX_ANSWER_WORDS:
            return answer
    return None


_CUT_IN_BOXED = "cut at the token limit inside its last \\boxed answer"


class Math(AnswerFormat):
    name = "math"
    fields = ("question", "answer", "solution")
    answer_last = True

    def example(self, values: dict, *, index: int, source: str, row: dict) -> Example:
        example = super().example(values, index=index, source=source, row=row)
        answer = values["answer"]
        if not isinstance(answer, str | int | float) or isinstance(answer, bool) or not str(answer).strip():
            raise SoftevalError(
                f"{source}: no gold answer ({answer!r}); the math format needs one (a solution without \\boxed{{}}?)"
            )
        if not _parsed(str(answer)):
            raise SoftevalError(f"{source}: gold answer {answer!r} is not mathematics math-verify can read")
        example.answer = str(answer).strip()
        example.solution = values.get("solution")
        return example

    def strict(self, completion: str, example: Example, *, cut: bool = False) -> Reading:
        boxed = last_boxed(completion) if not cut or _ends_braced(completion) else None
        if cut and boxed is None:  # the limit fell in a bare or unclosed \boxed, or after the last one
            boxed = last_boxed(_complete_lines(completion))
            if boxed is not None and _superseded(boxed, completion):
                return Reading.none("no_answer", _CUT_IN_BOXED)
        if boxed is None:
            return Reading.none("no_answer", "no \\boxed{} answer")
        return Reading(boxed) if boxed else Reading.none("no_answer", "an empty \\boxed{}")

    def lenient(self, completion: str, example: Example, *, cut: bool = False) -> Reading:
        boxed = self.strict(completion, example, cut=cut)
        if boxed.answer is not None or boxed.note == _CUT_IN_BOXED:  # no final-answer line stands in for it
            return boxed
        line = final_answer_line(_complete_lines(completion) if cut else completion)
        if line and cut and _superseded(line, completion):
            return Reading.none("no_answer", _CUT_IN_BOXED)
        return Reading(line) if line else Reading.none("no_answer", "no boxed answer or final-answer line")

    def is_correct(self, answer: str | None, example: Example) -> bool:
        return answer is not None and equivalent(answer, example.answer)


def equivalent(answer: str, gold: str) -> bool:
    """Mathematical equivalence by math-verify: 0.5 = \\frac{1}{2}, intervals and tuples as such.
    An answer math-verify cannot read is not equivalent to anything."""
    from math_verify import verify

    return bool(verify(_parsed(gold), _parsed(answer), timeout_seconds=_timeout()))


@lru_cache(maxsize=65536)
def _parsed(latex: str) -> list:
    from math_verify import parse

    return parse(f"${latex}$", parsing_timeout=_timeout())


def _timeout() -> int | None:
    # math-verify times out with signals, which only the main thread may use
    return 5 if threading.current_thread() is threading.main_thread() else None
