"""Inference engine over a frozen HF causal LM: batched greedy generation and option loglikelihoods.

Both paths left-pad a batch and give every row explicit position ids from its attention mask, so
a row's result does not depend on what else is in its batch. Vocabulary logits are computed only
where a token is chosen or scored: the LM head over a large vocabulary at every position would
otherwise dominate small models.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from softeval.models import LoadedModel
from softeval.prompts import Cloze

Advance = Callable[[int], None]
# below this many shared tokens, encoding the prefix separately saves less than it costs
MIN_SHARED_PREFIX = 8
# Positions (rows x padded width) in one batch: sixteen rows of 512 tokens, while a prompt filling
# an 8192-token context sits alone rather than padding short rows to its width.
TOKEN_BUDGET = 8192


@dataclass
class SharedPrefix:
    """The KV cache of the tokens all sequences of a call start with, encoded once."""

    length: int  # tokens of the sequences it covers (the soft prompt comes on top)
    cache: DynamicCache
    mask: torch.Tensor  # (1, positions)
    positions: torch.Tensor  # (1, positions)


@dataclass
class Completion:
    text: str  # cut before the first stop string that follows the answer's first character
    tokens: list[int]  # every generated token, the stop string's included (EOS excluded)
    stop_reason: str  # "stop", "eos" or "length"
    raw: str = ""  # every generated token decoded, nothing cut


class Engine:
    def __init__(
        self,
        lm: LoadedModel,
        batch_size: int = 16,
        logits_chunk: int = 256,
        soft_prompt: torch.Tensor | None = None,  # (L, hidden), placed after BOS in every sequence
        token_budget: int = TOKEN_BUDGET,  # rows x padded width (soft prompt included) of a batch
    ):
        self.lm = lm
        self.soft_prompt = soft_prompt
        self.model = lm.model
        # Multimodal wrappers (Gemma 3 of 4B and up loads as Gemma3ForConditionalGeneration) keep
        # the text decoder's settings under a text config and the decoder itself inside the
        # wrapper; for plain causal LMs both are the model's own config and base model.
        self.text_config = lm.model.config.get_text_config()
        self.decoder = lm.model.get_decoder()  # the text transformer without its LM head
        self.batch_size = batch_size
        # Padding costs as much as real tokens, and attention grows with the square of the width:
        # a batch is cut by positions too, so one long row does not make its batch quadratic.
        self.token_budget = token_budget
        self.logits_chunk = logits_chunk
        self.device = next(lm.model.parameters()).device
        # Sliding-window attention counts cache slots, not positions: padding in the middle of a
        # row (the shared-prefix layout) would take window slots once a row outgrows the window.
        self.window = getattr(self.text_config, "sliding_window", None)
        softcap = getattr(self.text_config, "final_logit_softcapping", None)
        self.softcap = float(softcap) if softcap else None
        # positions run through the transformer and through the LM head, padding included:
        # the work actually done, for throughput figures
        self.positions_computed = 0
        self.logit_rows_computed = 0

    # --- generation ---------------------------------------------------------------------------

    @torch.inference_mode()
    def generate(
        self,
        prompts: Sequence[list[int]],
        stop: Sequence[str],
        max_new_tokens: int,
        advance: Advance = lambda n: None,
    ) -> list[Completion]:
        """Greedy completions, one per prompt, in the prompts' order.

        Prompts are encoded batch by batch, but decoding runs on a pool: rows still generating
        when a batch is mostly done join the next batch, so a decode step (bound by reading the
        weights, whatever the rows) is not spent on a handful of stragglers."""
        decoder = _Decoder(self, stop, max_new_tokens, len(prompts))
        prefix = self._encode_prefix(prompts, horizon=max_new_tokens)
        pool: _Pool | None = None
        for batch in self._length_buckets([len(p) for p in prompts]):
            hidden, mask, positions, cache = self._prefill([prompts[i] for i in batch], prefix)
            arrivals = _Pool(list(batch), cache, mask, positions[:, -1:], self.logits(hidden).argmax(-1))
            pool = arrivals if pool is None else self._merge(pool, arrivals, max_new_tokens, decoder, advance)
            while pool is not None and self._more_than_half_full(pool):
                pool = decoder.step(pool, advance)
        while pool is not None:
            pool = decoder.step(pool, advance)
        return decoder.results  # type: ignore[return-value]

    def _more_than_half_full(self, pool: _Pool) -> bool:
        """Whether the pool still holds more than half a batch, by rows or by positions: only
        then is a decode step worth spending on it alone."""
        rows = len(pool.rows)
        return rows > self.batch_size // 2 or rows * pool.mask.shape[1] > self.token_budget // 2

    def _merge(self, pool: _Pool, arrivals: _Pool, horizon: int, decoder: _Decoder, advance: Advance) -> _Pool | None:
        """One pool of both, their caches left-padded to the same width. The old pool is finished
        first instead where a sliding window forbids padding in the cache, or where the padded
        pool would outgrow a batch plus half a batch of stragglers: one long row would otherwise
        pad every short row's cache to its width."""
        width = max(pool.mask.shape[1], arrivals.mask.shape[1])
        outgrows_window = self.window is not None and width + horizon > self.window
        over_budget = (len(pool.rows) + len(arrivals.rows)) * width > self.token_budget * 3 // 2
        if outgrows_window or over_budget:
            while pool is not None:
                pool = decoder.step(pool, advance)
            return arrivals
        return _Pool(
            pool.rows + arrivals.rows,
            _concat_caches([pool.cache, arrivals.cache], [pool.mask.shape[1], arrivals.mask.shape[1]], width),
            torch.cat([_pad_left(pool.mask, width), _pad_left(arrivals.mask, width)]),
            torch.cat([pool.positions, arrivals.positions]),
            torch.cat([pool.next_tokens, arrivals.next_tokens]),
        )

    # --- loglikelihood ----------------------------------------------------------------------------

    @torch.inference_mode()
    def loglikelihood(self, clozes: Sequence[Cloze], advance: Advance = lambda n: None) -> list[list[float]]:
        """Summed log-probability of each option's continuation given its context.

        Each context is encoded once; its KV cache is then shared by all of its options."""
        results: list[list[float] | None] = [None] * len(clozes)
        longest_option = max(len(o) for c in clozes for o in c.continuation_ids)
        prefix = self._encode_prefix([c.context_ids for c in clozes], horizon=longest_option)
        for batch in self._length_buckets([len(c.context_ids) for c in clozes]):
            for i, scores in zip(batch, self._loglikelihood_batch([clozes[i] for i in batch], prefix)):
                results[i] = scores
            advance(len(batch))
        return results  # type: ignore[return-value]

    def _loglikelihood_batch(self, clozes: list[Cloze], prefix: SharedPrefix | None) -> list[list[float]]:
        context_last, mask, positions, cache = self._prefill([c.context_ids for c in clozes], prefix)

        owner = [b for b, c in enumerate(clozes) for _ in c.continuation_ids]  # option row -> context row
        continuations = [o for c in clozes for o in c.continuation_ids]
        # Every option token is predicted by the hidden state before it: the context's last state
        # for the first token, the option's own states (inputs: all but its last token) after that.
        first = context_last[owner]
        # Options run in groups of similar length, so short options are not padded to the longest;
        # each group gets its own copy of the rows of the context cache it needs, so a group's
        # positions are its rows x (context width + option width).
        own_states: dict[int, torch.Tensor] = {}
        by_length = sorted((r for r, o in enumerate(continuations) if len(o) > 1), key=lambda r: len(continuations[r]))
        widths = [mask.shape[1] + len(o) - 1 for o in continuations]
        for group in _batches(by_length, widths, self.batch_size, self.token_budget):
            width = max(len(continuations[r]) for r in group) - 1
            index = torch.tensor([owner[r] for r in group], device=self.device)
            inputs = torch.zeros(len(group), width, dtype=torch.long)
            option_mask = torch.zeros_like(inputs)
            for k, r in enumerate(group):
                option = continuations[r]
                inputs[k, : len(option) - 1] = torch.tensor(option[:-1])
                option_mask[k, : len(option) - 1] = 1
            inputs, option_mask = inputs.to(self.device), option_mask.to(self.device)
            full_mask = torch.cat([mask[index], option_mask], dim=1)
            option_positions = positions[index, -1:] + 1 + torch.arange(width, device=self.device)
            hidden = self._forward(self._embed(inputs), full_mask, option_positions, _select_rows(cache, index))
            for k, r in enumerate(group):
                own_states[r] = hidden[k, : len(continuations[r]) - 1]
        rows, targets = [], []
        for r, option in enumerate(continuations):
            if option:  # an option that tokenises to nothing has no token to score
                rows.append(first[r : r + 1])
            if r in own_states:
                rows.append(own_states[r])
            targets.extend(option)
        scores = self._token_logprobs(torch.cat(rows), torch.tensor(targets, device=self.device)) if targets else None
        per_option, start = [], 0
        for option in continuations:
            # nothing to score can never be the likeliest option
            per_option.append(float(scores[start : start + len(option)].sum()) if option else float("-inf"))
            start += len(option)
        grouped, start = [], 0
        for c in clozes:
            grouped.append(per_option[start : start + len(c.continuation_ids)])
            start += len(c.continuation_ids)
        return grouped

    # --- shared pieces ------------------------------------------------------------------------------

    def _length_buckets(self, lengths: list[int]) -> list[list[int]]:
        """Batches of similar length (longest first, so memory peaks early and predictably)."""
        n_soft = 0 if self.soft_prompt is None else self.soft_prompt.shape[0]
        order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
        return _batches(order, [n + n_soft for n in lengths], self.batch_size, self.token_budget)

    def _encode_prefix(self, sequences: Sequence[list[int]], horizon: int) -> SharedPrefix | None:
        """Encode once the tokens every sequence starts with (BOS, soft prompt, instruction,
        few-shot demonstrations); None when too little is shared to pay off. `horizon` is how
        many tokens the rows will grow by."""
        if len(sequences) < 2:
            return None
        # every row keeps at least one token of its own
        shared = min(_common_prefix_length(sequences), min(len(s) for s in sequences) - 1)
        n_soft = 0 if self.soft_prompt is None else self.soft_prompt.shape[0]
        outgrows_window = self.window is not None and max(map(len, sequences)) + n_soft + horizon > self.window
        if shared < MIN_SHARED_PREFIX or outgrows_window:
            return None
        embeds, mask, positions = self.inputs([sequences[0][:shared]])
        cache = DynamicCache(config=self.text_config)
        self._forward(embeds, mask, positions, cache)
        return SharedPrefix(shared, cache, mask, positions)

    def _prefill(self, sequences: list[list[int]], prefix: SharedPrefix | None):
        """Encode a batch into a KV cache; returns the last hidden state of each row, the attention
        mask, position ids and the cache.

        With a shared prefix, each row starts from a copy of its cache and only the row's own
        tokens are encoded, left-padded in between, with positions continuing from the prefix."""
        if prefix is None:
            cache = DynamicCache(config=self.text_config)
            embeds, mask, positions = self.inputs(sequences)
            return self._forward(embeds, mask, positions, cache)[:, -1], mask, positions, cache
        cache = _select_rows(prefix.cache, torch.zeros(len(sequences), dtype=torch.long, device=self.device))
        suffix_ids, suffix_mask = self._left_pad([s[prefix.length :] for s in sequences])
        mask = torch.cat([prefix.mask.expand(len(sequences), -1), suffix_mask], dim=1)
        positions = prefix.positions[:, -1:] + suffix_mask.cumsum(-1)
        hidden = self._forward(self._embed(suffix_ids), mask, positions, cache)[:, -1]
        return hidden, mask, positions, cache

    def _left_pad(self, sequences: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids and attention mask of a batch, left-padded to its longest row."""
        width = max(len(s) for s in sequences)
        ids = torch.zeros(len(sequences), width, dtype=torch.long)
        mask = torch.zeros(len(sequences), width, dtype=torch.long)
        for r, seq in enumerate(sequences):
            ids[r, width - len(seq) :] = torch.tensor(seq, dtype=torch.long)
            mask[r, width - len(seq) :] = 1
        return ids.to(self.device), mask.to(self.device)

    def inputs(self, sequences: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Left-padded input embeddings, attention mask and position ids for a batch.

        The soft prompt goes after the padding and after BOS, so position ids count from each
        row's own first token and no row sees another row's padding."""
        soft = self.soft_prompt
        n_soft = 0 if soft is None else soft.shape[0]
        bos = self.lm.bos_token_id
        width = max(len(s) for s in sequences) + n_soft
        ids = torch.zeros(len(sequences), width, dtype=torch.long)
        mask = torch.zeros(len(sequences), width, dtype=torch.long)
        is_soft = torch.zeros(len(sequences), width, dtype=torch.bool)
        for r, seq in enumerate(sequences):
            start = width - len(seq) - n_soft
            n_head = 1 if bos is not None and seq and seq[0] == bos else 0
            ids[r, start : start + n_head] = torch.tensor(seq[:n_head], dtype=torch.long)
            ids[r, start + n_head + n_soft :] = torch.tensor(seq[n_head:], dtype=torch.long)
            is_soft[r, start + n_head : start + n_head + n_soft] = True
            mask[r, start:] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        embeds = self._embed(ids.to(self.device))
        if soft is not None:
            # row by row the soft positions are consecutive, so they take soft[0..L-1] in order
            slots = is_soft.to(self.device)
            # cast where used, not once: during tuning the prompt changes in place between calls
            soft = soft.to(device=embeds.device, dtype=embeds.dtype)
            embeds = embeds.masked_scatter(slots[..., None], soft.repeat(len(sequences), 1))
        return embeds, mask.to(self.device), positions.to(self.device)

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        # through the model's own embedding module: Gemma scales embeddings by sqrt(hidden)
        return self.model.get_input_embeddings()(ids)

    def _forward(self, embeds, mask, positions, cache) -> torch.Tensor:
        self.positions_computed += embeds.shape[0] * embeds.shape[1]
        out = self.decoder(
            inputs_embeds=embeds, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True
        )
        return out.last_hidden_state

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        self.logit_rows_computed += hidden.numel() // hidden.shape[-1]
        logits = self.model.get_output_embeddings()(hidden).float()
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def _token_logprobs(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """log p(target) for each row, computing the vocabulary in chunks to bound memory."""
        out = []
        for s in range(0, len(targets), self.logits_chunk):
            logits = self.logits(hidden[s : s + self.logits_chunk])
            picked = logits.gather(1, targets[s : s + self.logits_chunk, None])[:, 0]
            out.append(picked - torch.logsumexp(logits, dim=-1))
        return torch.cat(out)


@dataclass
class _Pool:
    """Rows being decoded together: prompt indices, their cache, mask, last positions and the
    token each has just chosen."""

    rows: list[int]
    cache: DynamicCache
    mask: torch.Tensor
    positions: torch.Tensor  # (rows, 1)
    next_tokens: torch.Tensor  # (rows,)


class _Decoder:
    """Greedy decoding steps over a pool, recording each row's completion when it ends."""

    def __init__(self, engine: Engine, stop: Sequence[str], max_new_tokens: int, n: int):
        self.engine, self.stop, self.max_new_tokens = engine, stop, max_new_tokens
        self.eos = set(engine.lm.eos_token_ids)
        self.generated: list[list[int]] = [[] for _ in range(n)]
        self.results: list[Completion | None] = [None] * n

    def step(self, pool: _Pool, advance: Advance) -> _Pool | None:
        """Take each row's chosen token; finished rows leave; the rest advance one token."""
        decode = self.engine.lm.tokenizer.decode
        keep = []
        for slot, i in enumerate(pool.rows):
            token, generated = int(pool.next_tokens[slot]), self.generated[i]
            if token in self.eos:
                text = decode(generated, skip_special_tokens=True)
                self.results[i] = Completion(text, generated, "eos", raw=text)
                continue
            generated.append(token)
            text = decode(generated, skip_special_tokens=True)
            cut = _first_stop(text, self.stop)
            if cut is not None:
                self.results[i] = Completion(text[:cut], generated, "stop", raw=text)
            elif len(generated) == self.max_new_tokens:
                self.results[i] = Completion(text, generated, "length", raw=text)
            else:
                keep.append(slot)
        advance(len(pool.rows) - len(keep))
        if not keep:
            return None
        if len(keep) < len(pool.rows):  # finished rows leave the pool and its cache
            index = torch.tensor(keep, device=self.engine.device)
            pool.cache.reorder_cache(index)
            pool = _Pool([pool.rows[s] for s in keep], pool.cache, pool.mask[index], pool.positions[index], pool.next_tokens[index])
        mask = torch.cat([pool.mask, pool.mask.new_ones(len(pool.rows), 1)], dim=1)
        positions = pool.positions + 1
        engine = self.engine
        hidden = engine._forward(engine._embed(pool.next_tokens[:, None]), mask, positions, pool.cache)[:, -1]
        return _Pool(pool.rows, pool.cache, mask, positions, engine.logits(hidden).argmax(-1))


def _batches(order: list[int], widths: Sequence[int], batch_size: int, token_budget: int) -> list[list[int]]:
    """`order` cut into consecutive batches of at most `batch_size` rows whose rows x widest row
    stays within `token_budget`; a row wider than the budget goes alone."""
    batches: list[list[int]] = []
    batch: list[int] = []
    widest = 0
    for i in order:
        grown = max(widest, widths[i])
        if batch and (len(batch) == batch_size or (len(batch) + 1) * grown > token_budget):
            batches.append(batch)
            batch, grown = [], widths[i]
        batch.append(i)
        widest = grown
    if batch:
        batches.append(batch)
    return batches


def _pad_left(mask: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(mask, (width - mask.shape[1], 0))


def _concat_caches(caches: list[DynamicCache], widths: list[int], width: int) -> DynamicCache:
    """Caches stacked along the batch, each first left-padded (masked slots) to `width`."""
    merged = copy.copy(caches[0])
    merged.layers = []
    for layers in zip(*(c.layers for c in caches)):
        layer = copy.copy(layers[0])
        pad = [(0, 0, width - w, 0) for w in widths]  # pad the sequence dimension on the left
        layer.keys = torch.cat([torch.nn.functional.pad(l.keys, p) for l, p in zip(layers, pad)])
        layer.values = torch.cat([torch.nn.functional.pad(l.values, p) for l, p in zip(layers, pad)])
        if hasattr(layer, "cumulative_length"):
            layer.cumulative_length = width
        merged.layers.append(layer)
    return merged


def _select_rows(cache: DynamicCache, index: torch.Tensor) -> DynamicCache:
    """A new cache holding the given batch rows of `cache` (repeats allowed); `cache` is unchanged."""
    selected = copy.copy(cache)
    selected.layers = []
    for layer in cache.layers:
        layer = copy.copy(layer)
        layer.keys, layer.values = layer.keys[index], layer.values[index]
        selected.layers.append(layer)
    return selected


def _common_prefix_length(sequences: Sequence[list[int]]) -> int:
    first, n = sequences[0], min(len(s) for s in sequences)
    for i in range(n):
        token = first[i]
        if any(s[i] != token for s in sequences):
            return i
    return n


def _first_stop(text: str, stop: Sequence[str]) -> int | None:
    """Where the first stop string begins, counting only stop strings after the first
    non-whitespace character: a base model that answers "\nParis" is not cut to nothing."""
    begin = len(text) - len(text.lstrip())
    cuts = [at for s in stop if s and (at := text.find(s, begin)) >= 0]
    return min(cuts) if cuts else None
