"""The reference path: every computation by the model's own forward, one sequence at a time.

Any causal LM of transformers that takes `inputs_embeds` runs here, with its own attention,
cache, positions and logit transforms: greedy completions come a token at a time from its
forward over its own cache, option log-likelihoods and the tuning loss from a full forward
pass. Each sequence runs alone and unpadded, so no result depends on what else was asked in the
same call. It is slower than the fast path (`softeval.engine.fast`) and never differs from what
transformers computes; `softeval.engine.selfcheck` sends a model here when the fast path does not
compute what this does.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import torch

from softeval.engine.forward import Advance, soft_prompt_at
from softeval.engine.text import Completion, TextStream, ended_by
from softeval.models import LoadedModel
from softeval.tasks import Cloze


class ReferenceEngine:
    """The engine's interface (`generate`, `loglikelihood`, `target_loss`) over the model's own forward."""

    path = "reference"

    def __init__(self, lm: LoadedModel, soft_prompt: torch.Tensor | None = None):
        self.lm, self.model, self.soft_prompt = lm, lm.model, soft_prompt
        self.device = next(lm.model.parameters()).device
        self.check: dict | None = None  # what the self-check measured, once `start_engine` made this engine
        # the work done, as the fast engine counts it for throughput figures
        self.positions_computed = 0
        self.logit_rows_computed = 0
        # most causal LMs compute the LM head only where asked; older ones over every position
        self._keeps_logits = "logits_to_keep" in inspect.signature(self.model.forward).parameters

    @property
    def n_soft(self) -> int:
        return 0 if self.soft_prompt is None else self.soft_prompt.shape[0]

    def embed(self, sequence: list[int]) -> torch.Tensor:
        """(1, tokens + soft prompt, hidden): the sequence's embeddings, the soft prompt after BOS."""
        embeds = self.model.get_input_embeddings()(torch.tensor(sequence, device=self.device))
        if self.soft_prompt is not None:
            at = soft_prompt_at(sequence, self.lm.bos_token_id)
            soft = self.soft_prompt.to(device=embeds.device, dtype=embeds.dtype)
            embeds = torch.cat([embeds[:at], soft, embeds[at:]])
        return embeds[None]

    def last_logits(self, sequence: list[int], last: int) -> torch.Tensor:
        """(last, vocabulary) logits of the model's own forward at the sequence's last positions."""
        embeds = self.embed(sequence)
        self.positions_computed += embeds.shape[1]
        self.logit_rows_computed += last if self._keeps_logits else embeds.shape[1]
        kwargs = {"logits_to_keep": last} if self._keeps_logits else {}
        return self.model(inputs_embeds=embeds, use_cache=False, **kwargs).logits[0, -last:].float()

    # --- generation -------------------------------------------------------------------------------

    @torch.inference_mode()
    def generate(self, prompts: Sequence[list[int]], stop: Sequence[str], max_new_tokens: int, advance: Advance = lambda n: None) -> list[Completion]:
        """Greedy completions, one prompt at a time, in the prompts' order."""
        completions = []
        for prompt in prompts:
            completions.append(self.complete(prompt, stop, max_new_tokens))
            advance(1)
        return completions

    @torch.inference_mode()
    def complete(self, prompt: list[int], stop: Sequence[str], max_new_tokens: int) -> Completion:
        """One greedy completion by the model's own forward and cache, a token at a time."""
        text, eos = TextStream(self.lm.tokenizer, stop), set(self.lm.eos_token_ids)
        embed = self.model.get_input_embeddings()
        kwargs = {"logits_to_keep": 1} if self._keeps_logits else {}
        embeds, cache, whole = self.embed(prompt), None, None
        while True:
            out = self.model(inputs_embeds=embeds, cache=cache, use_cache=whole is None, **kwargs)
            self.positions_computed += embeds.shape[1]
            self.logit_rows_computed += 1 if self._keeps_logits else embeds.shape[1]
            token = int(out.logits[0, -1].argmax())
            completion = ended_by(text, token, eos, max_new_tokens)
            if completion is not None:
                return completion
            new = embed(torch.tensor([[token]], device=self.device))
            if whole is None and getattr(out, "cache", None) is None:
                # a model that hands back no cache (RecurrentGemma keeps its recurrent state inside
                # itself): each step runs the whole sequence again, without a cache
                whole = embeds
            if whole is not None:
                whole = embeds = torch.cat([whole, new], dim=1)
            else:
                cache, embeds = out.cache, new

    # --- loglikelihood ----------------------------------------------------------------------------

    @torch.inference_mode()
    def loglikelihood(self, clozes: Sequence[Cloze], advance: Advance = lambda n: None) -> list[list[float]]:
        """Summed log-probability of each option's continuation given its context, one full
        forward pass per option."""
        results = []
        for cloze in clozes:
            results.append([self._option_logprob(cloze.context_ids, option) for option in cloze.continuation_ids])
            advance(1)
        return results

    def _option_logprob(self, context: list[int], option: list[int]) -> float:
        # nothing to score can never be the likeliest option
        return float(self.target_logprobs(context, option).sum()) if option else float("-inf")

    def target_logprobs(self, prompt: list[int], target: list[int]) -> torch.Tensor:
        """log p of each target token after the prompt and the target's earlier tokens (soft
        prompt included), by one forward pass; differentiable outside inference mode."""
        logprobs = torch.log_softmax(self.last_logits(prompt + target, len(target) + 1)[:-1], dim=-1)
        return logprobs.gather(1, torch.tensor(target, device=logprobs.device)[:, None])[:, 0]

    def logprobs_together(self, sequences: Sequence[list[int]], last: Sequence[int]) -> list[torch.Tensor]:
        """(last[i], vocabulary) log-probabilities at the last positions of each sequence (soft
        prompt included), all in one forward pass: the rows are padded on the right, without a
        mask. In a causal model no token sees the tokens after it, so each row's log-probabilities
        are those it has alone (up to rounding), for the weight reads of one pass instead of one
        per row. Differentiable outside inference mode."""
        rows = [self.embed(sequence)[0] for sequence in sequences]
        width = max(len(row) for row in rows)
        embeds = torch.stack([torch.nn.functional.pad(row, (0, 0, 0, width - len(row))) for row in rows])
        # the LM head only over the columns some row needs, counted from the right edge
        keep = max(width - len(row) + n for row, n in zip(rows, last)) if self._keeps_logits else width
        self.positions_computed += embeds.shape[0] * width
        self.logit_rows_computed += embeds.shape[0] * keep
        kwargs = {"logits_to_keep": keep} if self._keeps_logits else {}
        logits = self.model(inputs_embeds=embeds, use_cache=False, **kwargs).logits[:, -keep:]
        return [torch.log_softmax(logits[r, keep - (width - len(row)) - n : keep - (width - len(row))].float(), dim=-1)
                for r, (row, n) in enumerate(zip(rows, last))]

    # --- tuning loss ------------------------------------------------------------------------------

    def target_loss(self, sequences: Sequence[tuple[list[int], list[int]]]) -> torch.Tensor:
        """Summed cross-entropy of each target after its prompt (soft prompt included), one
        sequence at a time; differentiable in the soft prompt and any adapter weights."""
        return -sum((self.target_logprobs(prompt, target).sum() for prompt, target in sequences), torch.zeros((), device=self.device))
