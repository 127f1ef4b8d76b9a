"""softeval inside transformers' Trainer: `SoftevalCallback` evaluates the model at each save (or
every N steps) through an `InLoop` evaluator, with the tokens the trainer counted. The Lightning
callback is in `lightning.py` (Lightning is an optional extra).
"""

from __future__ import annotations

from transformers import TrainerCallback

from softeval.errors import SoftevalError
from softeval.loop.evaluator import InLoop


class SoftevalCallback(TrainerCallback):
    """Evaluates while a `transformers.Trainer` trains: at every checkpoint it saves (the default)
    or every `every` optimizer steps. Give an `InLoop`, or its settings (`tasks`, `output`,
    `recipe`, ...) to make one. The tokenizer is the Trainer's `processing_class` unless given.
    Tokens are the trainer's `num_input_tokens_seen` where it counts them
    (`include_num_input_tokens_seen`), else `tokens_per_step` x step where set."""

    def __init__(self, evaluator: InLoop | None = None, *, every: int | None = None, tokenizer=None, **settings):
        if evaluator is None:
            evaluator = InLoop(**settings)
        elif settings:
            raise SoftevalError(f"SoftevalCallback: give an InLoop or its settings ({', '.join(sorted(settings))}), not both")
        if every is not None and (not isinstance(every, int) or every < 1):
            raise SoftevalError(f"SoftevalCallback: every={every!r}; give a number of steps of at least 1, or leave it out to evaluate at each save")
        self.evaluator, self.every, self.tokenizer = evaluator, every, tokenizer
        self.evaluations = []  # what each call did (softeval.loop.Evaluation), on this rank
        self._last_step: int | None = None

    def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs):
        self.tokenizer = self.tokenizer or processing_class
        if self.tokenizer is None:
            raise SoftevalError("SoftevalCallback needs the model's tokenizer: give Trainer(processing_class=tokenizer) or SoftevalCallback(tokenizer=...)")
        self.evaluator.check_model(model, self.tokenizer)  # before the first step, not at the first save

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if self.every is not None and state.global_step % self.every == 0:
            self._evaluate(model, state)

    def on_save(self, args, state, control, model=None, **kwargs):
        if self.every is None:
            self._evaluate(model, state)

    def on_train_end(self, args, state, control, **kwargs):
        self.evaluator.close()

    def _evaluate(self, model, state) -> None:
        if state.global_step == self._last_step:  # a save right after an evaluation of the same step
            return
        self._last_step = state.global_step
        tokens = getattr(state, "num_input_tokens_seen", 0) or None
        self.evaluations.append(self.evaluator.evaluate(model, self.tokenizer, step=state.global_step, tokens=tokens))
