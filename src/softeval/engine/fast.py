"""The fast path: batched greedy generation, option loglikelihoods and the tuning loss over a
frozen HF causal LM, computed outside the model's own forward.

Every path left-pads a batch and gives every row explicit position ids (counted from its own first
token), so a row's result does not depend on what else is in its batch. Vocabulary logits are
computed only where a token is chosen or scored: the LM head over a large vocabulary at every
position would otherwise dominate small models. Because all this runs the model's decoder and head
apart, an engine serves a model only once `softeval.engine.selfcheck` has measured that it
computes what the model's own forward does (`start_engine`); other models run on the reference
path (`softeval.engine.reference`).

An `Engine` holds one part per job, each in a module of its own, and all of them hold the one
`Forward` (forward.py: the model, its inputs, decoder and LM head): `generation` (generation.py,
over pools and decode steps: pool.py, decoding.py, text.py), `options` (options.py) and `loss`
(loss.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from softeval.engine.forward import TOKEN_BUDGET, Advance, Forward
from softeval.engine.generation import DECODE_ROWS, Generation
from softeval.engine.loss import TuningLoss
from softeval.engine.options import OptionScoring
from softeval.engine.text import Completion
from softeval.models import LoadedModel
from softeval.tasks import Cloze


class Engine:
    """The fast path over one model (and soft prompt): `generate`, `loglikelihood`, `target_loss`."""

    path = "fast"

    def __init__(
        self,
        lm: LoadedModel,
        batch_size: int | None = None,  # the most rows of a batch; None: as many as the budgets allow
        logits_chunk: int = 256,
        soft_prompt: torch.Tensor | None = None,  # (L, hidden), placed after BOS in every sequence
        token_budget: int = TOKEN_BUDGET,  # rows x padded width (soft prompt included) of a batch
        kv_cache_bytes: int | None = None,  # the KV cache of the rows decoding together; None: from free memory
    ):
        self.forward = Forward(lm, soft_prompt, batch_size, token_budget, logits_chunk)
        self.generation = Generation(self.forward, batch_size or DECODE_ROWS, kv_cache_bytes)
        self.options = OptionScoring(self.forward)
        self.loss = TuningLoss(self.forward)
        self.check: dict | None = None  # what the self-check measured, once `start_engine` made this engine

    @property
    def lm(self) -> LoadedModel:
        return self.forward.lm

    @property
    def device(self) -> torch.device:
        return self.forward.device

    @property
    def n_soft(self) -> int:
        """Soft-prompt vectors in every sequence."""
        return self.forward.n_soft

    def generate(self, prompts: Sequence[list[int]], stop: Sequence[str], max_new_tokens: int, advance: Advance = lambda n: None) -> list[Completion]:
        """Greedy completions, one per prompt, in the prompts' order (see `Generation.generate`)."""
        return self.generation.generate(prompts, stop, max_new_tokens, advance)

    def loglikelihood(self, clozes: Sequence[Cloze], advance: Advance = lambda n: None) -> list[list[float]]:
        """Summed log-probability of each option after its context (see `OptionScoring`)."""
        return self.options.loglikelihood(clozes, advance)

    def target_loss(self, sequences: Sequence[tuple[list[int], list[int]]]) -> torch.Tensor:
        """Summed cross-entropy of each target after its prompt, differentiable (see `TuningLoss`)."""
        return self.loss.target_loss(sequences)

    def next_token_logprobs(self, prompts: Sequence[list[int]]) -> torch.Tensor:
        """(prompts, vocabulary) log-probabilities of the token after each prompt."""
        return self.forward.next_token_logprobs(prompts)
