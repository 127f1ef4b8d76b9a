"""Decode steps over a pool: each row's next token, greedy, and once no queued prompt may join,
draft tokens taken from each row's own text (prompt lookup) that the model confirms or rejects.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from softeval.engine.forward import Advance, Forward, SharedPrefix
from softeval.engine.pool import Pool
from softeval.engine.text import Completion, TextStream, ended_by

# Speculation once no queued prompt may join the pool: a decode step also runs draft tokens
# taken from each row's own text, and greedily keeps those the model itself would have chosen.
# A step of a few rows is bound by reading the weights, so a few more positions cost little, and
# the rows still running then (often repeating themselves) take several tokens per step. Drafts
# are added while rows x (1 + drafts) stays within DRAFT_POSITIONS.
DRAFT_POSITIONS = 64

MAX_DRAFT = 15


@dataclass
class DraftCounts:
    """Draft tokens run through the model, those it confirmed, and the positions of draft
    columns that kept no token (rejected drafts, and the columns of rows with fewer)."""

    proposed: int = 0
    accepted: int = 0
    positions_discarded: int = 0


class Decoder:
    """Greedy decoding steps over a pool, recording each row's completion when it ends. With
    `prefix`, the pool's cache holds each row's tokens after the prefix, which every row attends
    to as well."""

    def __init__(
        self, forward: Forward, drafts: DraftCounts, prompts: Sequence[list[int]], stop: Sequence[str], max_new_tokens: int,
        prefix: SharedPrefix | None = None,
    ):
        self.forward, self.draft_counts, self.prompts, self.max_new_tokens, self.prefix = forward, drafts, prompts, max_new_tokens, prefix
        self.eos = set(forward.lm.eos_token_ids)
        self.texts = [TextStream(forward.lm.tokenizer, stop) for _ in prompts]
        self.lookups: dict[int, _PromptLookup] = {}  # rows that have drafted
        self.results: list[Completion | None] = [None] * len(prompts)

    def step(self, pool: Pool, advance: Advance, speculate: bool = False) -> Pool | None:
        """Advance the pool by one token, and by the drafts the model confirms when `speculate`
        (idle slots advance too, until a row is encoded into them or the pool drops them), and
        record what each live row chose; None once no row is live."""
        if not pool.live:
            return None
        pool = self._advance(pool, self._drafts(pool) if speculate else [[] for _ in pool.rows])
        self.record(pool, advance)
        return pool if pool.live else None

    def record(self, pool: Pool, advance: Advance, rows: set[int] | None = None) -> None:
        """Record the confirmed drafts and chosen token of each live slot (of those holding
        `rows`, if given), as soon as they are chosen: a row that ends frees its slot before the
        next rows are let in."""
        finished = 0
        for slot, (i, token) in enumerate(zip(pool.rows, pool.next_tokens.tolist())):
            if i is not None and (rows is None or i in rows) and self._record(i, pool.verified[slot] + [token]):
                pool.rows[slot] = None
                finished += 1
        advance(finished)

    def _record(self, i: int, tokens: list[int]) -> bool:
        """Add tokens to row i's completion until it ends; whether it has."""
        for token in tokens:
            self.results[i] = ended_by(self.texts[i], token, self.eos, self.max_new_tokens)
            if self.results[i] is not None:
                return True
        return False

    def _drafts(self, pool: Pool) -> list[list[int]]:
        """Each slot's draft tokens: as many as the step's position budget and the cache's room
        allow (and, for a sliding-window model, as keep every row's span within the window),
        never past the token limit."""
        forward = self.forward
        budget = min(MAX_DRAFT, DRAFT_POSITIONS // len(pool.rows) - 1, pool.room() - 1)
        if forward.slides:
            budget = min(budget, forward.window - pool.span() - 1)
        drafts = []
        for i in pool.rows:
            allowed = 0 if i is None else min(budget, self.max_new_tokens - len(self.texts[i].tokens) - 1)
            if allowed <= 0:
                drafts.append([])
                continue
            if i not in self.lookups:
                self.lookups[i] = _PromptLookup(self.prompts[i])
            drafts.append(self.lookups[i].draft(self.texts[i].tokens, allowed))
        return drafts

    def _advance(self, pool: Pool, drafts: list[list[int]]) -> Pool:
        """One forward pass over each row's chosen token followed by its drafts (a row with
        fewer drafts than others repeats its token in masked columns). A row keeps its drafts
        up to the first the model would not have chosen; its next token is the model's choice
        after the last one kept. Rejected drafts' columns stay in the cache, masked."""
        forward, counts = self.forward, self.draft_counts
        rows, width, new = len(pool.rows), pool.mask.shape[1], 1 + max(map(len, drafts))
        live = [slot for slot, row in enumerate(pool.rows) if row is not None]
        ids = pool.next_tokens[:, None].repeat(1, new)
        fed = torch.zeros(rows, new, dtype=pool.mask.dtype)
        fed[:, 0] = 1
        for slot, draft in enumerate(drafts):
            ids[slot, 1 : 1 + len(draft)] = torch.tensor(draft, dtype=ids.dtype)
            fed[slot, 1 : 1 + len(draft)] = 1
        mask = torch.cat([pool.mask, fed.to(pool.mask.device)], dim=1)
        # a row's unused draft columns repeat its last real position; idle slots keep theirs:
        # rotary scalings that look at the largest position in a batch must see only live rows'
        is_live = torch.zeros_like(pool.positions)
        is_live[live] = 1
        positions = pool.positions + is_live * fed.to(pool.positions.device).cumsum(1)
        hidden = forward.run(forward.embed(ids), mask, positions, pool.cache, self.prefix)
        # vocabulary logits only where a live row chooses a token: after its token and each draft
        picks = [(slot, column) for slot in live for column in range(1 + len(drafts[slot]))]
        slots, columns = (torch.tensor(index, device=forward.device) for index in zip(*picks))
        chosen = iter(forward.greedy(hidden[slots, columns]).tolist())
        next_tokens, verified, last = pool.next_tokens.clone(), [[] for _ in pool.rows], pool.positions.clone()
        holes = pool.holes
        counts.positions_discarded += rows * (new - 1)
        for slot in live:
            draft = drafts[slot]
            choices = [next(chosen) for _ in range(1 + len(draft))]
            kept = 0
            while kept < len(draft) and draft[kept] == choices[kept]:
                kept += 1
            verified[slot], next_tokens[slot] = draft[:kept], choices[kept]
            counts.proposed += len(draft)
            counts.accepted += kept
            counts.positions_discarded -= kept
            last[slot] += 1 + kept
            if 1 + kept < new:
                mask[slot, width + 1 + kept :] = 0
                holes = True
        return Pool(pool.rows, pool.cache, mask, last, next_tokens, verified, holes)


class _PromptLookup:
    """Draft tokens for one row from its own prompt and completion (prompt lookup decoding):
    the tokens that followed the latest earlier occurrence of its last three tokens (else two,
    else one), repeated as a pattern where they run into the present."""

    SIZES = (3, 2, 1)

    def __init__(self, prompt: list[int]):
        self.sequence, self.prompt_length = list(prompt), len(prompt)
        self.after: dict[tuple[int, ...], int] = {}  # n-gram -> index after its latest occurrence
        self.indexed = 0  # the n-grams ending before this index are in `after`

    def draft(self, completion: list[int], k: int) -> list[int]:
        sequence = self.sequence
        sequence.extend(completion[len(sequence) - self.prompt_length :])
        # every n-gram but the last: the last is what is looked up
        for end in range(self.indexed, len(sequence) - 1):
            for n in self.SIZES:
                if end + 1 >= n:
                    self.after[tuple(sequence[end + 1 - n : end + 1])] = end + 1
        self.indexed = max(self.indexed, len(sequence) - 1)
        for n in self.SIZES:
            start = self.after.get(tuple(sequence[-n:])) if len(sequence) > n else None
            if start is not None:
                draft: list[int] = []
                for j in range(start, start + k):
                    draft.append(sequence[j] if j < len(sequence) else draft[j - len(sequence)])
                return draft
        return []
