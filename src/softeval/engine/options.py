"""Option log-likelihoods: a context and its options packed into one row behind a tree-shaped
attention mask, so the context is encoded once and each option sees only it and its own tokens.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from transformers import DynamicCache

from softeval.engine.forward import Advance, Forward, SharedPrefix
from softeval.tasks import Cloze


def _tail(cloze: Cloze) -> list[int]:
    """What follows a context in its packed sequence: each option but its last token (the states
    that predict an option's later tokens), options in order."""
    return [token for option in cloze.continuation_ids for token in option[:-1]]


def _repeated(cache: DynamicCache, rows: int) -> DynamicCache:
    """A one-row cache seen as `rows` rows, without a copy: a forward pass concatenates its new
    keys onto these views, which writes each row once; `cache` is unchanged."""
    repeated = copy.copy(cache)
    repeated.layers = []
    for layer in cache.layers:
        layer = copy.copy(layer)
        layer.keys, layer.values = layer.keys.expand(rows, -1, -1, -1), layer.values.expand(rows, -1, -1, -1)
        repeated.layers.append(layer)
    return repeated


class OptionScoring:
    """`loglikelihood`: each option's summed log-probability after its context."""

    def __init__(self, forward: Forward):
        self.forward = forward

    @torch.inference_mode()
    def loglikelihood(self, clozes: Sequence[Cloze], advance: Advance = lambda n: None) -> list[list[float]]:
        """Summed log-probability of each option's continuation given its context.

        A context and its options run as one sequence: the options follow the context, each at
        the positions it would take right after it, and a tree-shaped attention mask lets an
        option see the context and its own earlier tokens only. So the context is encoded once
        and no option needs a copy of its cache."""
        forward = self.forward
        results: list[list[float] | None] = [None] * len(clozes)
        tails = [_tail(c) for c in clozes]
        # the options add no tokens after the longest context: no horizon
        prefix = forward.encode_prefix([c.context_ids for c in clozes], within_window=0)
        for batch in forward.length_buckets([len(c.context_ids) + len(t) for c, t in zip(clozes, tails)]):
            for i, scores in zip(batch, self._loglikelihood_batch([clozes[i] for i in batch], [tails[i] for i in batch], prefix)):
                results[i] = scores
            advance(len(batch))
        return results  # type: ignore[return-value]

    def _loglikelihood_batch(self, clozes: list[Cloze], tails: list[list[int]], prefix: SharedPrefix | None) -> list[list[float]]:
        forward = self.forward
        embeds, mask, positions, key_positions, cache, columns = self._packed_inputs(clozes, tails, prefix)
        hidden = forward.run(embeds, mask, positions, cache, key_positions=key_positions)
        # Each option token is predicted by the state before it: the context's last state for its
        # first token, the option's own states after that.
        rows, cols, targets = [], [], []
        for r, (cloze, (context_end, starts)) in enumerate(zip(clozes, columns)):
            for option, start in zip(cloze.continuation_ids, starts):
                if option:
                    rows += [r] * len(option)
                    cols += [context_end, *range(start, start + len(option) - 1)]
                    targets += option
        scores = []
        if targets:
            picked = hidden[torch.tensor(rows, device=forward.device), torch.tensor(cols, device=forward.device)]
            scores = forward.token_logprobs(picked, torch.tensor(targets, device=forward.device)).tolist()
        grouped, start = [], 0
        for cloze in clozes:
            per_option = []
            for option in cloze.continuation_ids:
                # nothing to score can never be the likeliest option
                per_option.append(sum(scores[start : start + len(option)]) if option else float("-inf"))
                start += len(option)
            grouped.append(per_option)
        return grouped

    def _packed_inputs(self, clozes: list[Cloze], tails: list[list[int]], prefix: SharedPrefix | None):
        """Inputs of a batch of contexts, each followed by its options but their last tokens,
        left-padded (`tails`: what follows each context, see `_tail`): embeddings, the
        tree-shaped 4D attention mask, position ids of the queries and of the keys (the shared
        prefix's included) and the cache (the shared prefix's, or None),
        plus for each row the column of its context's last token and the column where each
        option's packed tokens begin (an option of fewer than two tokens has none there)."""
        forward = self.forward
        if prefix is None:
            embeds, plain_mask, _ = forward.inputs([c.context_ids + t for c, t in zip(clozes, tails)])
            first_position = 0
            cache = None
        else:
            ids, plain_mask = forward.left_pad([c.context_ids[prefix.length :] + t for c, t in zip(clozes, tails)])
            embeds = forward.embed(ids)
            first_position = int(prefix.positions[0, -1]) + 1
            cache = _repeated(prefix.cache, len(clozes))
        width = plain_mask.shape[1]
        own = plain_mask.sum(-1).tolist()  # each row's tokens after the prefix, soft prompt included
        segment = torch.full((len(clozes), width), -1, dtype=torch.long)  # -1 padding, 0 context, k option k
        positions = torch.zeros(len(clozes), width, dtype=torch.long)
        columns = []
        for r, (cloze, tail) in enumerate(zip(clozes, tails)):
            context = own[r] - len(tail)
            context_end = width - len(tail) - 1
            segment[r, width - own[r] : context_end + 1] = 0
            positions[r, width - own[r] : context_end + 1] = first_position + torch.arange(context)
            starts, column = [], context_end + 1
            for k, option in enumerate(cloze.continuation_ids, start=1):
                n = max(len(option) - 1, 0)
                segment[r, column : column + n] = k
                positions[r, column : column + n] = first_position + context + torch.arange(n)
                starts.append(column)
                column += n
            columns.append((context_end, starts))
        segment, positions = segment.to(forward.device), positions.to(forward.device)
        key_segment, key_positions = segment, positions
        if prefix is not None:
            prefix_segment = torch.where(prefix.mask[0] > 0, 0, -1).expand(len(clozes), -1)
            key_segment = torch.cat([prefix_segment, segment], dim=1)
            key_positions = torch.cat([prefix.positions.expand(len(clozes), -1), positions], dim=1)
        mask = self._tree_mask(segment, positions, key_segment, key_positions)
        return embeds, mask, positions, key_positions, cache, columns

    def _tree_mask(self, segment, positions, key_segment, key_positions):
        """Which keys each query attends to: earlier columns of the context (the shared prefix's
        included) and of the query's own option; a padding query only itself (and the prefix),
        so that no softmax row is empty. Window layers also need the key within the window,
        counted in positions as if the option directly followed the context."""
        forward = self.forward
        queries, keys = segment.shape[1], key_segment.shape[1]
        column = torch.arange(keys, device=forward.device)[None, :]
        own_column = torch.arange(queries, device=forward.device)[:, None] + keys - queries
        query_segment, key_segment = segment[:, :, None], key_segment[:, None, :]
        allowed = (column <= own_column) & (key_segment >= 0) & ((key_segment == 0) | (key_segment == query_segment))
        allowed |= (query_segment < 0) & (column == own_column)
        if not forward.slides:
            return self._as_mask(allowed)
        # a padding query's own key passes too: both sit at position 0
        in_window = allowed & (key_positions[:, None, :] > (positions - forward.window)[:, :, None])
        if forward.layer_types is None:  # every layer slides
            return self._as_mask(in_window)
        return {"full_attention": self._as_mask(allowed), "sliding_attention": self._as_mask(in_window)}

    def _as_mask(self, allowed: torch.Tensor) -> torch.Tensor:
        """(rows, 1, queries, keys): boolean for SDPA, additive for eager attention."""
        forward = self.forward
        allowed = allowed[:, None]
        if forward.attention == "sdpa":
            return allowed
        blocked = torch.finfo(forward.model.dtype).min
        return torch.zeros(allowed.shape, dtype=forward.model.dtype, device=forward.device).masked_fill(~allowed, blocked)
