"""Prompt rendering: zero-shot, few-shot and chat prompts, tuning targets and cloze contexts.

Every prompt is instruction, then any demonstrations, then the question ending in the answer
cue. Prompts longer than the model's context lose demonstrations first, then their oldest
tokens; each such prompt is counted as truncated.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace

from softeval.errors import SoftevalError
from softeval.formats import Example
from softeval.models import LoadedModel
from softeval.tasks.spec import TaskSpec

DEMO_SEPARATOR = "\n\n"


@dataclass
class Prompt:
    text: str  # what the model reads, chat template applied
    ids: list[int]  # its tokens, BOS included where the model uses one
    n_demos: int
    truncated: bool = False


@dataclass
class Cloze:
    """Loglikelihood request: one shared context, one continuation per option."""

    context_ids: list[int]
    continuation_ids: list[list[int]]
    truncated: bool = False
    n_demos: int = 0
    # the text each continuation's tokens encode, as scored: a context's trailing space moves
    # into its continuations (`_encode_pair`), and its bytes count for bits per byte
    continuation_texts: list[str] | None = None


def cloze_context_ends_in_space(spec: TaskSpec, example: Example) -> bool:
    """Whether a plain (not chat) cloze context of `example` ends in a space, which moves into
    its options when they are encoded (each option's context, with partial scoring)."""
    contexts = example.cloze_contexts if example.cloze_contexts is not None else [None]
    return any(_moved_space(spec.render("cloze_template", example, **({} if c is None else {"cloze_context": c}))) for c in contexts)


def _moved_space(context: str) -> str:
    """What of a context's end moves into its continuations when they are encoded: a trailing
    space, which tokenizers attach to the word after it."""
    return " " if context.endswith(" ") else ""


def _gold_context(example: Example) -> str | None:
    """Partial scoring: the context of the example's correct option (None otherwise)."""
    return example.cloze_contexts[example.answer_index] if example.cloze_contexts else None


def question_text(spec: TaskSpec, example: Example) -> str:
    return spec.render("template", example)


def target_text(spec: TaskSpec, example: Example) -> str:
    """The gold answer in the strict format, as the model should write it after the cue."""
    return spec.render("target", example)


def answer_texts(spec: TaskSpec, example: Example) -> list[str]:
    """The answers a generation prompt is scored on, as the strict format writes them: for
    multiple choice every option's target (gold at its own index), else the gold target alone;
    the gold target alone too where the options' targets are all alike (a target that does not
    name its option: no option is likelier than another there)."""
    gold = [target_text(spec, example)]
    if example.choices is None:
        return gold
    texts = [target_text(spec, replace(example, answer=letter, answer_index=i)) for i, letter in enumerate(example.letters)]
    return texts if len(set(texts)) > 1 else gold


def tuning_target(spec: TaskSpec, example: Example) -> str:
    """The target followed by the first stop string, so a tuned model also learns to stop."""
    return target_text(spec, example) + spec.stop[0]


def choose_demos(spec: TaskSpec, pool: list[Example], k: int, seed: int) -> list[Example]:
    """k + 1 fixed, seeded demonstrations: the extra one stands in for an evaluated example
    that happens to be among the first k (when demos and evaluation share a split)."""
    if k <= 0:
        return []
    return random.Random(seed).sample(pool, min(k + 1, len(pool)))


class PromptBuilder:
    """Renders one task's prompts for one model and method."""

    def __init__(
        self,
        spec: TaskSpec,
        lm: LoadedModel,
        *,
        demos: list[Example] | None = None,
        k: int = 0,
        chat: bool = False,
        reserve: int = 0,  # tokens kept free after the prompt (new tokens, soft prompt)
    ):
        self.spec, self.lm, self.chat, self.k = spec, lm, chat, k
        self.demo_pool = demos or []
        self.demo_split = spec.dataset.fewshot_split
        self.budget = lm.context_length - reserve
        if self.budget < 1:
            raise SoftevalError(f"model {lm.name} reads {lm.context_length} tokens, and task {spec.name} keeps {reserve} of them for new tokens "
                                "and a soft prompt: no room is left for a prompt; use a model with a longer context, or a smaller max_new_tokens")
        # tokens per demonstration by (id, cloze): examples are unhashable, and the pool outlives the cache
        self._costs: dict[tuple[int, bool], int] = {}

    # --- generation ---------------------------------------------------------------------------

    def generation(self, example: Example) -> Prompt:
        def attempt(shown: list[Example]) -> tuple[int, tuple[str, list[int]]]:
            text = self._assemble(example, shown, cloze=False)
            ids = self._tokens(text)
            return len(ids), (text, ids)

        n, _, (text, ids) = self._most_recent_that_fit(example, attempt, cloze=False)
        return self._fit(Prompt(text, ids, n), dropped=n < min(self.k, len(self.demo_pool)))

    # --- loglikelihood (knowledge) -------------------------------------------------------------

    def cloze_requests(self, example: Example) -> list[Cloze]:
        """What knowledge scores for an example: every option after one shared context or, with
        partial scoring, the one continuation after each option's own context (one request each)."""
        if example.cloze_contexts is None:
            return [self.cloze(example)]
        requests = [self.cloze(example, context) for context in example.cloze_contexts]
        fewest = min(r.n_demos for r in requests)
        if any(r.n_demos != fewest for r in requests):  # every option under the same demonstrations
            requests = [self.cloze(example, context, most_demos=fewest) for context in example.cloze_contexts]
        return requests

    def cloze(self, example: Example, option_context: str | None = None, most_demos: int | None = None) -> Cloze:
        """Context and option continuations for cloze scoring, under the same conditioning
        (demonstrations, chat template) as the generative prompt. With `option_context` (partial
        scoring), the context is that option's and the continuation the example's one continuation."""
        continuations = self._continuations(example, partial=option_context is not None)

        def attempt(shown: list[Example]) -> tuple[int, tuple[str, list[tuple[list[int], list[int]]]]]:
            context = self._assemble(example, shown, cloze=True, option_context=option_context)
            pairs = [self._encode_pair(context, text) for text in continuations]
            return max(len(c) + len(o) for c, o in pairs), (context, pairs)

        n, longest, (context, pairs) = self._most_recent_that_fit(example, attempt, cloze=True, most=most_demos)
        overflow = max(0, longest - self.budget)
        scored = [_moved_space(context) + text for text in continuations]
        return Cloze(self._drop_oldest(pairs[0][0], overflow), [o for _, o in pairs], truncated=overflow > 0, n_demos=n,
                     continuation_texts=scored)

    def _continuations(self, example: Example, partial: bool) -> list[str]:
        """The texts cloze scoring continues a context with: each option after the delimiter, or
        with `partial` (one context per option) the example's one continuation."""
        delimiter = "" if self.chat else " "
        if partial:
            return [delimiter + (example.cloze_continuation or "").strip()]
        return [delimiter + text for text in example.choices or []]

    # --- the answer after the generation prompt (gold likelihood) ------------------------------

    def answer_request(self, example: Example, prompt: Prompt, room: int) -> tuple[Cloze, list[str]] | None:
        """The generation prompt followed by each answer of `answer_texts`, encoded as the
        tuning loss encodes its targets; `room`: the tokens prompt and answer may take (the
        model's context less its soft prompt). None where an answer alone fills the room."""
        texts = answer_texts(self.spec, example)
        answers = [self.lm.encode(text) for text in texts]
        if max(len(a) for a in answers) + self._bos_kept + 1 > room:
            return None
        overflow = max(0, len(prompt.ids) + max(len(a) for a in answers) - room)
        context = self._drop_oldest(prompt.ids, overflow)
        return Cloze(context, answers, truncated=overflow > 0 or prompt.truncated, n_demos=prompt.n_demos), texts

    # --- pieces --------------------------------------------------------------------------------

    def _demos_for(self, example: Example) -> list[Example]:
        same_split = self.demo_split == self.spec.dataset.eval_split
        demos = [d for d in self.demo_pool if not (same_split and d.index == example.index)]
        return demos[: self.k]

    def _most_recent_that_fit(
        self, example: Example, attempt: Callable[[list[Example]], tuple], *, cloze: bool, most: int | None = None
    ) -> tuple:
        """(n, size, payload) for the prompt showing the n most recent demonstrations, n the
        largest whose size fits the budget (0 if none does), as dropping the oldest demonstration
        one at a time finds it (each one shown makes the prompt longer), but in a few
        tokenisations of the prompt rather than one per dropped demonstration.
        attempt(shown) builds and measures the prompt showing `shown`; `most` caps n."""
        demos = self._demos_for(example)
        if most is not None:
            demos = demos[len(demos) - most :]
        tried: dict[int, tuple] = {}

        def size(n: int) -> int:
            if n not in tried:
                tried[n] = attempt(demos[len(demos) - n :])
            return tried[n][0]

        # estimate: the bare prompt, then the newest demonstrations while their costs fit
        room, n = self.budget - size(0), 0
        for cost in reversed(self._demo_costs(example, demos, cloze=cloze)):
            if cost > room:
                break
            room, n = room - cost, n + 1
        # costs are measured on another prompt and tokens can merge across joins, so the real
        # size decides: one fewer while it does not fit, one more while that still fits
        while n > 0 and size(n) > self.budget:
            n -= 1
        while n < len(demos) and size(n + 1) <= self.budget:
            n += 1
        return n, size(n), tried[n][1]

    def _demo_costs(self, example: Example, demos: list[Example], *, cloze: bool) -> list[int]:
        """Tokens each demonstration adds to a prompt (separator or chat turn markup included),
        measured once: the demonstrations are fixed, so later prompts reuse the counts."""
        missing = [d for d in demos if (id(d), cloze) not in self._costs]
        if missing:

            def measure(shown: list[Example]) -> int:
                return len(self._tokens(self._assemble(example, shown, cloze=cloze)))

            bare = measure([])
            for demo in missing:
                self._costs[id(demo), cloze] = measure([demo]) - bare
        return [self._costs[id(d), cloze] for d in demos]

    def _assemble(self, example: Example, demos: list[Example], *, cloze: bool, option_context: str | None = None) -> str:
        question = self._shown(example, cloze=cloze, option_context=option_context)
        ask = lambda ex: self._shown(ex, cloze=cloze)  # noqa: E731
        answer = lambda ex: self._answer(ex, cloze=cloze)  # noqa: E731
        # cloze prompts carry their own (by default none: the instruction asks for a letter, which cloze scoring does not use)
        instruction = self.spec.cloze_instruction if cloze else self.spec.instruction
        if not self.chat:
            parts = [instruction] if instruction else []
            parts += [f"{ask(d)} {answer(d)}" for d in demos]
            return DEMO_SEPARATOR.join([*parts, question])
        messages = []
        for demo in demos:
            messages += [{"role": "user", "content": ask(demo)}, {"role": "assistant", "content": answer(demo)}]
        messages.append({"role": "user", "content": question})
        if instruction:
            messages[0]["content"] = instruction + DEMO_SEPARATOR + messages[0]["content"]
        return self.lm.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def _shown(self, example: Example, *, cloze: bool, option_context: str | None = None) -> str:
        """An example as a prompt shows it before its answer; in cloze prompts with partial
        scoring, the context of `option_context`, or of its gold option for a demonstration."""
        if not cloze:
            return self.spec.render("template", example)
        context = option_context or _gold_context(example)
        # only partial scoring defines cloze_context: elsewhere using it is an undefined-name error
        return self.spec.render("cloze_template", example, **({"cloze_context": context} if context else {}))

    def _answer(self, demo: Example, *, cloze: bool) -> str:
        """A demonstration's answer: its target, or in cloze prompts its gold option's text (with
        partial scoring, the continuation after the gold option's context)."""
        if not cloze:
            return target_text(self.spec, demo).strip()
        return (demo.cloze_continuation or "").strip() if demo.cloze_contexts else demo.choices[demo.answer_index]

    def _tokens(self, text: str) -> list[int]:
        ids = self.lm.encode(text)
        bos = self.lm.bos_token_id
        # chat templates may write the BOS themselves
        if bos is not None and (not ids or ids[0] != bos):
            ids = [bos, *ids]
        return ids

    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """Split tokens as lm-evaluation-harness does: encode the whole, cut at the context's length,
        so a continuation tokenises as it would inside the full text."""
        moved = _moved_space(context)
        context, continuation = context[: len(context) - len(moved)], moved + continuation
        whole = self._tokens(context + continuation)
        n_context = len(self._tokens(context))
        return whole[:n_context], whole[n_context:]

    @property
    def _bos_kept(self) -> int:
        """Tokens at the start of a sequence that shortening never drops: BOS, where the model has one."""
        return 1 if self.lm.bos_token_id is not None else 0

    def _drop_oldest(self, ids: list[int], overflow: int) -> list[int]:
        """`ids` without the `overflow` oldest tokens after BOS."""
        if overflow <= 0:
            return ids
        return ids[: self._bos_kept] + ids[self._bos_kept + overflow :]

    def _fit(self, prompt: Prompt, dropped: bool) -> Prompt:
        if len(prompt.ids) <= self.budget:
            prompt.truncated = dropped
            return prompt
        prompt.ids = self._drop_oldest(prompt.ids, len(prompt.ids) - self.budget)
        # the log shows what the model read: the kept tokens, not the text before shortening
        prompt.text = self.lm.tokenizer.decode(prompt.ids[self._bos_kept :], skip_special_tokens=False)
        prompt.truncated = True
        return prompt
