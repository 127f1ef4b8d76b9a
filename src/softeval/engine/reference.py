"""The reference path: every computation by the model's own forward and cache.

Any causal LM of transformers that takes `inputs_embeds` runs here, with its own attention,
cache, positions and logit transforms: greedy completions come a token at a time from its
forward over its own cache, option log-likelihoods and the tuning loss from full forward passes.
It is slower than the fast path (`softeval.engine.fast`) and never differs from what transformers
computes; `softeval.engine.selfcheck` sends a model here when the fast path does not compute
what this does.

Rows run in batches where the self-check has measured, on this model, that a row's results do
not depend on its batch; elsewhere each row runs alone and unpadded, one sequence at a time:

- scoring (option log-likelihoods, the tuning loss): rows padded on the right, without a mask.
  In a causal model no position sees the ones after it, so a row's log-probabilities are those
  it has alone, for one read of the weights per batch instead of one per row.
- generation: rows padded on the left, with an attention mask and each row's own position ids
  (where the forward takes them), as transformers' own batched `generate` runs them. A row that
  ends leaves the batch through the cache's own `reorder_cache`.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import torch

from softeval.engine.forward import TOKEN_BUDGET, Advance, longest_first, soft_prompt_at
from softeval.engine.text import Completion, TextStream, ended_by
from softeval.models import LoadedModel
from softeval.tasks import Cloze

# Rows decoding together, and the positions (rows x (prompt + new tokens)) their cache may hold:
# each decode step reads every weight once, whatever the rows, so more rows share that read, and
# a row's left padding costs only its prompt's pass and attention reads, so rows of any length
# (longest first) decode together.
GENERATION_ROWS = 64
GENERATION_POSITIONS = 2 * TOKEN_BUDGET

# The padding a scoring batch may add, as a share of its tokens: one row at a time costs a read
# of the weights per row, which padding of a quarter of the tokens still undercuts.
SCORING_SLACK = 1 / 4

# Contexts whose options are scored in one call when rows run in batches: enough options to
# fill batches of similar length, few enough that progress shows.
CLOZES_AT_ONCE = 64


class ReferenceEngine:
    """The engine's interface (`generate`, `loglikelihood`, `target_loss`) over the model's own
    forward. `scoring_rows` and `generation_rows` are the most rows a forward pass of each may
    hold: 1 runs every row alone."""

    path = "reference"

    def __init__(
        self, lm: LoadedModel, soft_prompt: torch.Tensor | None = None, scoring_rows: int = 1, generation_rows: int = 1,
        shares_contexts: bool = False,
    ):
        self.lm, self.model, self.soft_prompt = lm, lm.model, soft_prompt
        self.scoring_rows, self.generation_rows = scoring_rows, generation_rows
        # option scoring encodes each context once, its options continuing from copies of its cache
        self.shares_contexts = shares_contexts and scoring_rows > 1
        self.device = next(lm.model.parameters()).device
        self.check: dict | None = None  # what the self-check measured, once `start_engine` made this engine
        # the work done, as the fast engine counts it for throughput figures
        self.positions_computed = 0
        self.logit_rows_computed = 0
        self.largest_batch = 0  # the most rows any forward pass held
        parameters = inspect.signature(self.model.forward).parameters
        # most causal LMs compute the LM head only where asked; older ones over every position
        self._keeps_logits = "logits_to_keep" in parameters
        # models without position ids count positions from the cache, or from the mask (ALiBi)
        self._takes_positions = "position_ids" in parameters

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
        return self._forward(self.embed(sequence), None, None, None, last).logits[0, -last:].float()

    def _forward(self, embeds, mask, positions, cache, keep: int, use_cache: bool = False):
        """The model's own forward over a batch; the LM head over the last `keep` columns where
        the model allows it."""
        rows, width = embeds.shape[:2]
        self.positions_computed += rows * width
        self.logit_rows_computed += rows * (keep if self._keeps_logits else width)
        self.largest_batch = max(self.largest_batch, rows)
        kwargs = {"logits_to_keep": keep} if self._keeps_logits else {}
        if mask is not None:
            kwargs["attention_mask"] = mask
        if positions is not None and self._takes_positions:
            kwargs["position_ids"] = positions
        return self.model(inputs_embeds=embeds, cache=cache, use_cache=use_cache, **kwargs)

    # --- generation -------------------------------------------------------------------------------

    @torch.inference_mode()
    def generate(self, prompts: Sequence[list[int]], stop: Sequence[str], max_new_tokens: int, advance: Advance = lambda n: None) -> list[Completion]:
        """Greedy completions in the prompts' order: batches of prompts of similar length
        (longest first), or one prompt at a time."""
        completions: list[Completion | None] = [None] * len(prompts)
        for batch in self._generation_batches([len(p) for p in prompts], max_new_tokens):
            for i, completion in zip(batch, self._complete([prompts[i] for i in batch], stop, max_new_tokens, advance)):
                completions[i] = completion
        return completions  # type: ignore[return-value]

    def _generation_batches(self, lengths: list[int], max_new_tokens: int) -> list[list[int]]:
        widths = [n + self.n_soft + max_new_tokens for n in lengths]
        return longest_first(widths, self.generation_rows, GENERATION_POSITIONS, slack=float("inf"))

    @torch.inference_mode()
    def next_token_logprobs(self, prompts: Sequence[list[int]]) -> torch.Tensor:
        """(prompts, vocabulary) log-probabilities of the token after each prompt, the prompts
        encoded together as generation encodes them."""
        embeds, mask, positions = self._left_padded(list(prompts))
        logits = self._forward(embeds, mask, positions, None, 1).logits[:, -1].float()
        return torch.log_softmax(logits, dim=-1)

    def _left_padded(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Embeddings (zeros on the left of shorter rows), attention mask and each row's
        positions, counted from its own first token."""
        rows = [self.embed(prompt)[0] for prompt in prompts]
        width = max(len(row) for row in rows)
        embeds = torch.stack([torch.nn.functional.pad(row, (0, 0, width - len(row), 0)) for row in rows])
        mask = torch.zeros(len(rows), width, dtype=torch.long, device=self.device)
        for r, row in enumerate(rows):
            mask[r, width - len(row) :] = 1
        return embeds, mask, (mask.cumsum(-1) - 1).clamp(min=0)

    def _complete(self, prompts: list[list[int]], stop: Sequence[str], max_new_tokens: int, advance: Advance) -> list[Completion]:
        """Greedy completions of a batch by the model's own forward and cache, a token at a
        time; each row leaves the batch when it ends. A model that hands back no cache
        (RecurrentGemma keeps its recurrent state inside itself) runs its whole sequences again
        at each step."""
        eos, embed = set(self.lm.eos_token_ids), self.model.get_input_embeddings()
        texts = [TextStream(self.lm.tokenizer, stop) for _ in prompts]
        results: list[Completion | None] = [None] * len(prompts)
        live = list(range(len(prompts)))  # the prompt of each row in the batch
        embeds, mask, positions = self._left_padded(prompts)
        # a row alone goes through the forward as one plain sequence, without mask or positions
        padded = len(prompts) > 1
        cache, whole = None, None
        while True:
            out = self._forward(embeds, mask if padded else None, positions if padded else None, cache, 1, use_cache=whole is None)
            tokens = out.logits[:, -1].argmax(-1)
            for i, token in zip(live, tokens.tolist()):
                if results[i] is None:
                    results[i] = ended_by(texts[i], token, eos, max_new_tokens)
                    if results[i] is not None:
                        advance(1)
            kept = [row for row, i in enumerate(live) if results[i] is None]
            if not kept:
                return results  # type: ignore[return-value]
            if whole is None and getattr(out, "cache", None) is None:
                whole = embeds
            # a cache without `reorder_cache` keeps its ended rows, which decode on unread
            if len(kept) < len(live) and (whole is not None or hasattr(out.cache, "reorder_cache")):
                index = torch.tensor(kept, device=self.device)
                live, tokens, mask, positions = [live[r] for r in kept], tokens[index], mask[index], positions[index]
                if whole is not None:
                    whole = whole[index]
                else:
                    out.cache.reorder_cache(index)
            new = embed(tokens[:, None])
            mask = torch.cat([mask, mask.new_ones(len(live), 1)], dim=1)
            if whole is not None:
                whole = embeds = torch.cat([whole, new], dim=1)
                positions = (mask.cumsum(-1) - 1).clamp(min=0)
            else:
                cache, embeds, positions = out.cache, new, positions[:, -1:] + 1

    # --- scoring: option log-likelihoods and the tuning loss ---------------------------------------

    @torch.inference_mode()
    def loglikelihood(self, clozes: Sequence[Cloze], advance: Advance = lambda n: None) -> list[list[float]]:
        """Summed log-probability of each option's continuation given its context (an empty
        option, which can never be the likeliest, -inf): each context and option as one
        sequence, or with `shares_contexts` each context encoded once."""
        results = []
        step = 1 if self.scoring_rows == 1 else CLOZES_AT_ONCE
        for start in range(0, len(clozes), step):
            chunk = clozes[start : start + step]
            if self.shares_contexts:
                results += self._options_after_contexts(chunk)
            else:
                pairs = [(cloze.context_ids, option) for cloze in chunk for option in cloze.continuation_ids if option]
                sums = iter([float(scores.sum()) for scores in self.target_logprobs(pairs)])
                results += [[next(sums) if option else float("-inf") for option in cloze.continuation_ids] for cloze in chunk]
            advance(len(chunk))
        return results

    def _options_after_contexts(self, clozes: Sequence[Cloze]) -> list[list[float]]:
        """Option log-likelihoods of batches of contexts (left-padded, as generation encodes
        prompts), each option's later tokens run from a copy of its context's cache rows, as a
        multi-token decoding step would (the cache's own `reorder_cache` makes the copies)."""
        options = max(len(cloze.continuation_ids) for cloze in clozes)
        widths = [self.n_soft + len(c.context_ids) + max(map(len, c.continuation_ids)) for c in clozes]
        results: list[list[float] | None] = [None] * len(clozes)
        for batch in longest_first(widths, self.scoring_rows, TOKEN_BUDGET // options, slack=SCORING_SLACK):
            for i, scores in zip(batch, self._options_after_batch([clozes[i] for i in batch])):
                results[i] = scores
        return results  # type: ignore[return-value]

    def _options_after_batch(self, clozes: list[Cloze]) -> list[list[float]]:
        embeds, mask, positions = self._left_padded([cloze.context_ids for cloze in clozes])
        out = self._forward(embeds, mask, positions, None, 1, use_cache=True)
        first = torch.log_softmax(out.logits[:, -1].float(), dim=-1)  # each option's first token
        scores = [[float(first[r, option[0]]) if option else float("-inf") for option in cloze.continuation_ids]
                  for r, cloze in enumerate(clozes)]
        later = [(r, k, option) for r, cloze in enumerate(clozes) for k, option in enumerate(cloze.continuation_ids) if len(option) > 1]
        if not later:
            return scores
        index = torch.tensor([r for r, _, _ in later], device=self.device)
        out.cache.reorder_cache(index)
        width = max(len(option) - 1 for _, _, option in later)
        # each option's tokens but its last, padded on the right (no earlier position sees them)
        ids = torch.tensor([option[:-1] + [0] * (width - len(option) + 1) for _, _, option in later], device=self.device)
        tail_mask = torch.cat([mask[index], mask.new_ones(len(later), width)], dim=1)
        tail_positions = positions[index, -1:] + 1 + torch.arange(width, device=self.device)
        logits = self._forward(self.model.get_input_embeddings()(ids), tail_mask, tail_positions, out.cache, width).logits[:, -width:]
        for row, (r, k, option) in enumerate(later):
            logprobs = torch.log_softmax(logits[row, : len(option) - 1].float(), dim=-1)
            scores[r][k] += float(logprobs.gather(1, torch.tensor(option[1:], device=self.device)[:, None]).sum())
        return scores

    def target_logprobs(self, pairs: Sequence[tuple[list[int], list[int]]]) -> list[torch.Tensor]:
        """log p of each target token after its prompt and the target's earlier tokens (soft
        prompt included), for each (prompt, target); differentiable outside inference mode."""
        sequences = [prompt + target[:-1] for prompt, target in pairs]
        last = [len(target) for _, target in pairs]
        scored: list[torch.Tensor | None] = [None] * len(pairs)
        for batch in self._scoring_batches([len(s) for s in sequences]):
            rows = self.logprobs_together([sequences[i] for i in batch], [last[i] for i in batch])
            for i, logprobs in zip(batch, rows):
                scored[i] = logprobs.gather(1, torch.tensor(pairs[i][1], device=logprobs.device)[:, None])[:, 0]
        return scored  # type: ignore[return-value]

    def _scoring_batches(self, lengths: list[int]) -> list[list[int]]:
        return longest_first([n + self.n_soft for n in lengths], self.scoring_rows, TOKEN_BUDGET, slack=SCORING_SLACK)

    def logprobs_together(self, sequences: Sequence[list[int]], last: Sequence[int]) -> list[torch.Tensor]:
        """(last[i], vocabulary) log-probabilities at the last positions of each sequence (soft
        prompt included), `scoring_rows` rows per forward pass, padded on the right without a
        mask (each row alone where that is 1). Differentiable outside inference mode."""
        out = []
        for start in range(0, len(sequences), self.scoring_rows):
            out += self._right_padded_logprobs(sequences[start : start + self.scoring_rows], last[start : start + self.scoring_rows])
        return out

    def _right_padded_logprobs(self, sequences: Sequence[list[int]], last: Sequence[int]) -> list[torch.Tensor]:
        rows = [self.embed(sequence)[0] for sequence in sequences]
        width = max(len(row) for row in rows)
        embeds = torch.stack([torch.nn.functional.pad(row, (0, 0, 0, width - len(row))) for row in rows])
        # the LM head only over the columns some row needs, counted from the right edge
        keep = max(width - len(row) + n for row, n in zip(rows, last)) if self._keeps_logits else width
        logits = self._forward(embeds, None, None, None, keep).logits[:, -keep:]
        return [torch.log_softmax(logits[r, keep - (width - len(row)) - n : keep - (width - len(row))].float(), dim=-1)
                for r, (row, n) in enumerate(zip(rows, last))]

    def target_loss(self, sequences: Sequence[tuple[list[int], list[int]]]) -> torch.Tensor:
        """Summed cross-entropy of each target after its prompt (soft prompt included);
        differentiable in the soft prompt and any adapter weights."""
        return -sum((scores.sum() for scores in self.target_logprobs(sequences)), torch.zeros((), device=self.device))
