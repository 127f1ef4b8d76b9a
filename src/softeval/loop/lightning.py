"""softeval inside a Lightning training loop (`pip install 'softeval[lightning]'`)."""

from __future__ import annotations

from collections.abc import Callable

try:
    from lightning.pytorch import Callback
except ImportError as exc:  # said once, when the callback is asked for
    from softeval.errors import SoftevalError

    raise SoftevalError("SoftevalLightningCallback needs Lightning; install it with: pip install 'softeval[lightning]'") from exc

from softeval.errors import SoftevalError
from softeval.loop.evaluator import InLoop


class SoftevalLightningCallback(Callback):
    """Evaluates while a `lightning.Trainer` trains: every `every` optimizer steps, and at each
    checkpoint Lightning saves with `at_save`. `model` picks the transformers model out of the
    LightningModule (default: the module itself where it is one, else its one child that is)."""

    def __init__(self, evaluator: InLoop, tokenizer, *, every: int | None = None, at_save: bool = False,
                 model: Callable | None = None, tokens_per_step: float | None = None):
        if every is None and not at_save:
            raise SoftevalError("SoftevalLightningCallback: give every=N (steps) or at_save=True, or both")
        self.evaluator, self.tokenizer, self.every, self.at_save = evaluator, tokenizer, every, at_save
        self.pick, self.tokens_per_step = model or transformers_model, tokens_per_step
        self.evaluations = []
        self._last_step: int | None = None

    def on_fit_start(self, trainer, pl_module) -> None:
        self.evaluator.check_model(self.pick(pl_module), self.tokenizer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if self.every is not None and step > 0 and step % self.every == 0:
            self._evaluate(pl_module, step)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        if self.at_save:
            self._evaluate(pl_module, trainer.global_step)

    def on_fit_end(self, trainer, pl_module) -> None:
        self.evaluator.close()

    def _evaluate(self, pl_module, step: int) -> None:
        if step == self._last_step:  # gradient accumulation calls a batch's end at the same step
            return
        self._last_step = step
        tokens = step * self.tokens_per_step if self.tokens_per_step else None
        self.evaluations.append(self.evaluator.evaluate(self.pick(pl_module), self.tokenizer, step=step, tokens=tokens))


def transformers_model(pl_module):
    """The transformers model a LightningModule trains: itself, or its one child that is one."""
    if hasattr(pl_module, "get_input_embeddings") and hasattr(pl_module, "config"):
        return pl_module
    found = [child for child in pl_module.children() if hasattr(child, "get_input_embeddings") and hasattr(child, "config")]
    if len(found) != 1:
        raise SoftevalError(f"SoftevalLightningCallback: {type(pl_module).__name__} holds {len(found)} transformers models; "
                                             "give model=lambda module: module.<the model> to pick one")
    return found[0]
