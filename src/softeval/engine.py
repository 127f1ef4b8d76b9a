"""The fast path: batched greedy generation, option loglikelihoods and the tuning loss over a
frozen HF causal LM, computed outside the model's own forward.

Every path left-pads a batch and gives every row explicit position ids (counted from its own first
token), so a row's result does not depend on what else is in its batch. Vocabulary logits are
computed only where a token is chosen or scored: the LM head over a large vocabulary at every
position would otherwise dominate small models. Because all this runs the model's decoder and head
apart, an engine serves a model only once `softeval.selfcheck` has measured that it computes what
the model's own forward does (`start_engine`); other models run on `softeval.reference`.
"""

from __future__ import annotations

import copy
import itertools
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psutil
import torch
from torch.utils.checkpoint import checkpoint
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from softeval.attention import PrefixKeys, stacked_gqa
from softeval.errors import SoftevalError
from softeval.logits import LogitTransform
from softeval.memory import kept_free_bytes
from softeval.models import LoadedModel
from softeval.prompts import Cloze

Advance = Callable[[int], None]
# below this many shared tokens, encoding the prefix separately saves less than it costs
MIN_SHARED_PREFIX = 8
# Positions (rows x padded width) in one batch: sixteen rows of 512 tokens, while a prompt filling
# an 8192-token context sits alone rather than padding short rows to its width.
TOKEN_BUDGET = 8192
# A batch's padding may cost this share of its real tokens. Matrix products of a few hundred
# positions already run near full speed, so bigger batches rarely pay for more padding: on
# ARC-Easy prompts 1/32 computes 11% fewer positions than 1/8, in 10% less time.
PADDING_SLACK = 1 / 32
# Rows decoding together: a decode step reads every weight once, whatever the rows, so more rows
# share that cost, up to where their KV cache costs more to read than the weights.
DECODE_ROWS = 128
# A prompt joins a pool, or makes one with the widest prompt queued, only while the pool is at
# most this many times as wide as the most columns the prompt's row can take (its own tokens and
# every new token). A pool is as wide as its widest row, and every row holds that width: zeros
# written into memory when it joins, read by attention at every decode step. One 4,568-token
# prompt among short ARC-Easy prompts had 15 short rows each write 4,500 columns of zeros (30%
# more time than one row at a time); a long generation would read them at every step.
POOL_WIDTH_RATIO = 4
# Rows join a pool once this share of its slots are idle (and once no queued prompt may join it,
# the idle slots are dropped): each joining batch is one more forward pass (a read of the
# weights), each idle slot a wasted row at every decode step.
JOIN_SHARE = 1 / 16
# Bytes of KV cache a decoding pool may hold (its rows x (prompt + new tokens) x bytes per token,
# as if every row ran to the token limit): this share of the memory free when the engine starts
# (the device's, or the machine's for the CPU), within the bounds below. More rows per decode step
# share each read of the weights; the rest of the memory is left to activations, logits and
# other processes. A fixed 2 GiB would hold about 20 rows of 800 tokens for an 8B model's bf16
# cache (128 KiB a token), whatever the GPU. (On a 2-core CPU, smollm2-135m-instruct's GSM8K rows
# took the same time in pools of 89 rows, 2 GiB, as of 128.)
KV_MEMORY_SHARE = 1 / 4
KV_CACHE_BYTES_MIN = 256 << 20
KV_CACHE_BYTES_MAX = 64 << 30
# Slots a repacked pool's cache reserves for the tokens to come; a pool whose room is full is
# repacked again with new room. Most rows stop long before the token limit, and reserving the
# whole limit for every row would write (and page in) memory that is never used.
DECODE_ROOM = 64
# Speculation once no queued prompt may join the pool: a decode step also runs draft tokens
# taken from each row's own text, and greedily keeps those the model itself would have chosen.
# A step of a few rows is bound by reading the weights, so a few more positions cost little, and
# the rows still running then (often repeating themselves) take several tokens per step. Drafts
# are added while rows x (1 + drafts) stays within DRAFT_POSITIONS.
DRAFT_POSITIONS = 64
MAX_DRAFT = 15
# tokens decoded again as context after the decoding of earlier tokens changed
RESYNC_CONTEXT = 8
# Target positions of the tuning loss whose vocabulary logits are held at once.
LOSS_CHUNK = 256
# Vocabulary entries per product when choosing greedy tokens: a slice of the LM head and its
# logits stay in cache, where the whole (rows x 262k for Gemma) would go through memory; on this
# project's CPU that took 25-40% off the head's time at 8 to 256 rows. Slices of 8,192 rather
# than 2,048 entries make 4x fewer, larger products: Gemma's head on 51 rows took 98 ms instead
# of 123, and its 200 GSM8K generations 39.0 and 40.1 s instead of 41.4 and 42.6.
VOCAB_CHUNK = 8192


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
        self.lm = lm
        self.soft_prompt = soft_prompt
        self.model = lm.model
        # Multimodal wrappers (Gemma 3 of 4B and up loads as Gemma3ForConditionalGeneration) keep
        # the text decoder's settings under a text config and the decoder itself inside the
        # wrapper; for plain causal LMs both are the model's own config and base model.
        self.text_config = lm.model.config.get_text_config()
        self.decoder = lm.model.get_decoder()  # the text transformer without its LM head
        # Padding costs as much as real tokens, and attention grows with the square of the width:
        # batches are cut by positions, so one long row does not make its batch quadratic.
        self.token_budget = token_budget
        self.batch_size = batch_size or token_budget  # every row takes at least one position
        self.decode_rows = batch_size or DECODE_ROWS
        self.logits_chunk = logits_chunk
        self.device = next(lm.model.parameters()).device
        self.kv_cache_bytes = kv_cache_bytes or kv_cache_budget(self.device)
        self.kv_positions = max(1, self.kv_cache_bytes // _kv_bytes_per_token(self.text_config, lm.model.dtype))
        # In a decoding cache, sliding-window attention counts slots, not positions (a row's own
        # slots, without holes, are as far apart as their positions); a shared prefix is attended
        # to by positions. (Option scoring builds its own window mask from positions.)
        self.window = getattr(self.text_config, "sliding_window", None)
        self.layer_types = getattr(self.text_config, "layer_types", None)  # None: every layer alike
        self.sliding_layers = tuple(layer.is_sliding for layer in DynamicCache(config=self.text_config).layers)
        # Qwen configs set a window that no layer uses
        self.slides = self.window is not None and (self.layer_types is None or "sliding_attention" in self.layer_types)
        # Rotary scalings that change with the largest position in a batch would see a draft's
        # positions before plain decoding reaches them: no drafts for those models.
        self.speculates = not _rope_depends_on_length(self.text_config)
        # Option scoring hands the model a 4D mask of its own; other kernels (flash attention)
        # would read it as a padding mask and score wrongly.
        self.attention = self.decoder.config._attn_implementation
        if self.attention not in ("sdpa", "eager"):
            raise SoftevalError(
                f"{lm.name}: attention implementation {self.attention!r} is not supported; load the model with 'sdpa' or 'eager'"
            )
        self.transform = LogitTransform.of(lm.model)
        self.check: dict | None = None  # what the self-check measured, once `start_engine` made this engine
        # called, where set, with the prompts joining a decoding pool and the logits their first
        # tokens are chosen from: the self-check compares their log-probabilities
        self.observe_admission: Callable[[list[int], torch.Tensor], None] | None = None
        # Generation keeps a shared prefix apart from the rows' caches when the engine's SDPA
        # function can attend to it: not with eager attention, capped attention scores (Gemma 2)
        # or sliding layers other than one window counted in positions (chunked attention).
        self.prefix_apart = (
            self.attention == "sdpa"
            and not getattr(self.text_config, "attn_logit_softcapping", None)
            and (self.slides or not any(self.sliding_layers))
        )
        # positions run through the transformer and through the LM head, padding included:
        # the work actually done, for throughput figures
        self.positions_computed = 0
        self.logit_rows_computed = 0
        # draft tokens run through the model, those the model confirmed, and the positions of
        # draft columns that kept no token (rejected drafts, and the columns of rows with fewer)
        self.drafts_proposed = 0
        self.drafts_accepted = 0
        self.draft_positions_discarded = 0

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

        Continuous batching: decoding runs on one pool of rows. Whenever rows that stopped have
        freed a sixteenth of its slots, the next prompts (longest first) are encoded together
        straight into the freed slots, so each decode step, bound by reading the weights whatever
        the rows, serves a nearly full pool until the queue drains; from then on, freed slots are
        dropped. Steps then also verify draft tokens (see `_Decoder`), which take the last rows
        several tokens a step. A prompt much narrower than the pool (POOL_WIDTH_RATIO) waits for
        a pool of its own: until then the pool decodes as if the queue were drained."""
        prefix = self._encode_prefix(prompts, within_window=None) if self.prefix_apart else None
        decoder = _Decoder(self, prompts, stop, max_new_tokens, prefix)
        room = min(DECODE_ROOM, max_new_tokens)
        queue = deque(sorted(range(len(prompts)), key=lambda i: -len(prompts[i])))
        pool: _Pool | None = None
        while queue or pool is not None:
            if pool is not None:
                # columns no row attends to any more, left of every row, are not read again (nor
                # written for rows that join); queued prompts still fit in what is kept
                pool.trim(keep=self._own_width(prompts[queue[0]], prefix) if queue else 0)
            arrivals = self._arrivals(pool, queue, prompts, prefix, max_new_tokens, room)
            # whether the next queued prompt may join the pool (the one the arrivals make, if none)
            width = pool.width if pool is not None else max(self._own_width(prompts[i], prefix) for batch in arrivals for i in batch)
            joins = bool(queue) and _fits(width, self._own_width(prompts[queue[0]], prefix), max_new_tokens)
            # drafts run once no queued prompt may join the pool: the queue is drained, or the next
            # prompt is too narrow for it
            speculate = self.speculates and not joins
            # a step takes one column, or with drafts up to 1 + MAX_DRAFT (a smaller room caps them)
            needed = 1 + MAX_DRAFT if speculate and room > 1 + MAX_DRAFT else 1
            if arrivals:
                pool = self._admit(pool, arrivals, prompts, prefix, room, needed)
                decoder.record(pool, advance, rows={i for batch in arrivals for i in batch})
                if not pool.live or (queue and self._joinable(pool)):
                    # rows that ended at their first token freed their slots again: more join
                    # first, or a pool the next prompt may not join is done
                    if not pool.live and not joins:
                        pool = None
                    continue
            elif self._wasteful(pool) or pool.room() < needed:
                # drop rejected drafts' columns and make room; idle slots stay while rows may join
                pool = self._repack(pool, room, free=pool.idle if joins else 0)
            elif self._joinable(pool) and not joins:
                pool.compact()  # no row will join: drop the idle slots
            pool = decoder.step(pool, advance, speculate=speculate)
        return decoder.results  # type: ignore[return-value]

    @property
    def n_soft(self) -> int:
        return 0 if self.soft_prompt is None else self.soft_prompt.shape[0]

    def _wasteful(self, pool: _Pool) -> bool:
        """Whether rejected drafts' columns (holes) should be dropped from a pool's cache now:
        when they are a quarter of what the pool attends to, or before its span passes a
        sliding window (which the decoding cache counts in columns, holes included)."""
        if not pool.holes:
            return False
        span = pool.span()
        if self.slides and span + 1 + MAX_DRAFT > self.window:
            return True
        return 4 * (span - pool.longest()) > span

    def _arrivals(
        self, pool: _Pool | None, queue: deque[int], prompts: Sequence[list[int]], prefix: SharedPrefix | None, max_new_tokens: int, room: int
    ) -> list[list[int]]:
        """Prefill batches of the prompts that join the pool now, taken from the queue. The first
        batches make the pool: as many rows as the KV budget holds (rows x (widest prompt's own
        columns + the new tokens + the room reserved after them); the queue runs longest first,
        so no later prompt is wider). Later ones fill its idle slots, once a JOIN_SHARE of them
        are idle: joining is cheap, an idle slot costs a full row at every step. Either way, the
        prompts that join are the queue's first ones that fit the pool's width (POOL_WIDTH_RATIO);
        the others wait for a pool of their own."""
        if not queue:
            return []
        if pool is None:
            width = self._own_width(prompts[queue[0]], prefix)
            free = max(1, min(self.decode_rows, self.kv_positions // (width + max_new_tokens + room)))
        elif self._joinable(pool):
            width, free = pool.width, pool.idle
        else:
            return []
        widths = {}
        for i in itertools.islice(queue, free):
            own = self._own_width(prompts[i], prefix)
            if not _fits(width, own, max_new_tokens):
                break
            widths[i] = own
        arrivals = list(widths)
        for _ in arrivals:
            queue.popleft()
        return _batches(arrivals, widths, free, self.token_budget)

    @staticmethod
    def _joinable(pool: _Pool) -> bool:
        """Whether enough of a pool's slots are idle for rows to join it."""
        return pool.idle >= max(1, int(JOIN_SHARE * len(pool.rows)))

    def _admit(
        self, pool: _Pool | None, batches: list[list[int]], prompts: Sequence[list[int]], prefix: SharedPrefix | None, room: int, needed: int
    ) -> _Pool:
        """The pool with the prompts of `batches` encoded into its idle slots. A pool with too few
        idle slots, narrower than a joining prompt, with less room than the next step needs or
        with the holes of rejected drafts is first repacked into a new buffer with slots for them
        (and the first batches make one). Joining rows are written where they will decode: the
        rows already decoding stay put."""
        widths = [max(self._own_width(prompts[i], prefix) for i in batch) for batch in batches]
        joining = sum(map(len, batches))
        if pool is None or pool.holes or pool.idle < joining or max(widths) > pool.width or pool.room() < needed:
            pool = self._repack(pool, room, free=joining, width=max(widths))
        idle = iter([slot for slot, row in enumerate(pool.rows) if row is None])
        slots = [[next(idle) for _ in batch] for batch in batches]
        encoded = [self._encode_into(pool, into, batch, prompts, prefix) for into, batch in zip(slots, batches)]
        # One LM head pass for every joining row: the vocabulary projection reads a large matrix
        # (Gemma's 262k x 640, 0.7 GB in fp32) whatever the rows, so batches of a few rows each
        # would pay that read again and again.
        hidden = torch.cat([hidden for *_, hidden in encoded])
        if self.observe_admission is None:
            chosen = self._greedy(hidden)
        else:  # the full logits, which the observer takes, choose the tokens too
            logits = self.logits(hidden)
            self.observe_admission([i for batch in batches for i in batch], logits)
            chosen = logits.argmax(-1)
        next_tokens = chosen.split([len(batch) for batch in batches])
        for into, batch, (mask, positions, _), tokens in zip(slots, batches, encoded, next_tokens):
            pool.take(into, batch, _pad_left(mask, pool.width), positions, tokens)
        return pool

    def _own_width(self, sequence: list[int], prefix: SharedPrefix | None) -> int:
        """Columns a prompt takes in a pool's cache: all its tokens and the soft prompt, or with
        a shared prefix (kept apart, soft prompt included) the tokens after it."""
        return len(sequence) + self.n_soft if prefix is None else len(sequence) - prefix.length

    def _encode_into(
        self, pool: _Pool, slots: list[int], batch: list[int], prompts: Sequence[list[int]], prefix: SharedPrefix | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Encode a batch of prompts into the cache of `slots` of a pool, right-aligned at the
        pool's width (zeros to their left). Returns what the slots take once each row's first
        token is chosen: the rows' mask, their last positions and their last hidden states.

        With a shared prefix, only each row's own tokens are encoded and cached, left-padded,
        with positions continuing from the prefix, which every row attends to as well."""
        sequences = [prompts[i] for i in batch]
        if prefix is None:
            embeds, mask, positions = self.inputs(sequences)
        else:
            ids, mask = self._left_pad([s[prefix.length :] for s in sequences])
            embeds = self._embed(ids)
            positions = prefix.positions[:, -1:] + mask.cumsum(-1)
        cache, write_back = _slot_cache(pool, slots, pool.width - mask.shape[1])
        # a copy: a view would keep the batch's whole output alive until the admission's LM head
        hidden = self._forward(embeds, mask, positions, cache, prefix)[:, -1].clone()
        write_back()
        return mask, positions[:, -1:], hidden

    @torch.inference_mode()
    def next_token_logprobs(self, prompts: Sequence[list[int]]) -> torch.Tensor:
        """(prompts, vocabulary) log-probabilities of the token after each prompt, the prompts
        encoded together, left-padded, as generation encodes prompts that share no prefix."""
        embeds, mask, positions = self.inputs(list(prompts))
        hidden = self._forward(embeds, mask, positions, DynamicCache(config=self.text_config))[:, -1]
        return torch.log_softmax(self.logits(hidden), dim=-1)

    def _repack(self, pool: _Pool | None, room: int, free: int = 0, width: int = 0) -> _Pool:
        """A new buffer holding the live rows of `pool` (if any), then `free` idle slots for rows
        about to be encoded into it: as wide as `width` or the columns the live rows span, with
        room for `room` more tokens, so decode steps write into place instead of copying the
        cache. Each live row keeps only the columns it attends to, right-aligned, zeros to
        their left (a pool with holes from rejected drafts is compacted)."""
        part = None if pool is None else _RepackPart.of(pool, self.device)
        live = 0 if part is None else len(part.keep)
        width = max(width, 0 if part is None else part.mask.shape[1])
        heads, head_dim = _kv_shape(self.text_config)
        layers = []
        for index, sliding in enumerate(self.sliding_layers):
            key_room = torch.empty(live + free, heads, width + room, head_dim, dtype=self.model.dtype, device=self.device)
            value_room = torch.empty_like(key_room)
            if part is not None:
                layer = pool.cache.layers[index]
                for buffer, states in ((key_room, layer.keys), (value_room, layer.values)):
                    states = part.states(states)
                    buffer[:live, :, : width - states.shape[2]] = 0
                    buffer[:live, :, width - states.shape[2] : width] = states
            layers.append(_GrowingLayer(key_room, value_room, width, sliding))
        cache = DynamicCache(config=self.text_config)
        cache.layers = layers
        mask = torch.zeros(live + free, width, dtype=torch.long, device=self.device)
        positions = torch.zeros(live + free, 1, dtype=torch.long, device=self.device)
        next_tokens = torch.zeros(live + free, dtype=torch.long, device=self.device)
        rows: list[int | None] = [None] * (live + free)
        verified: list[list[int]] = [[] for _ in rows]
        if part is not None:
            mask[:live] = _pad_left(part.mask, width)
            positions[:live], next_tokens[:live] = pool.positions[part.keep], pool.next_tokens[part.keep]
            for slot, old in enumerate(part.keep.tolist()):
                rows[slot], verified[slot] = pool.rows[old], pool.verified[old]
        return _Pool(rows, cache, mask, positions, next_tokens, verified)

    # --- loglikelihood ----------------------------------------------------------------------------

    @torch.inference_mode()
    def loglikelihood(self, clozes: Sequence[Cloze], advance: Advance = lambda n: None) -> list[list[float]]:
        """Summed log-probability of each option's continuation given its context.

        A context and its options run as one sequence: the options follow the context, each at
        the positions it would take right after it, and a tree-shaped attention mask lets an
        option see the context and its own earlier tokens only. So the context is encoded once
        and no option needs a copy of its cache."""
        results: list[list[float] | None] = [None] * len(clozes)
        tails = [_tail(c) for c in clozes]
        # the options add no tokens after the longest context: no horizon
        prefix = self._encode_prefix([c.context_ids for c in clozes], within_window=0)
        for batch in self._length_buckets([len(c.context_ids) + len(t) for c, t in zip(clozes, tails)]):
            for i, scores in zip(batch, self._loglikelihood_batch([clozes[i] for i in batch], [tails[i] for i in batch], prefix)):
                results[i] = scores
            advance(len(batch))
        return results  # type: ignore[return-value]

    def _loglikelihood_batch(self, clozes: list[Cloze], tails: list[list[int]], prefix: SharedPrefix | None) -> list[list[float]]:
        embeds, mask, positions, cache, columns = self._packed_inputs(clozes, tails, prefix)
        hidden = self._forward(embeds, mask, positions, cache)
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
            picked = hidden[torch.tensor(rows, device=self.device), torch.tensor(cols, device=self.device)]
            scores = self._token_logprobs(picked, torch.tensor(targets, device=self.device)).tolist()
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
        tree-shaped 4D attention mask, position ids and the cache (the shared prefix's, or None),
        plus for each row the column of its context's last token and the column where each
        option's packed tokens begin (an option of fewer than two tokens has none there)."""
        if prefix is None:
            embeds, plain_mask, _ = self.inputs([c.context_ids + t for c, t in zip(clozes, tails)])
            first_position = 0
            cache = None
        else:
            ids, plain_mask = self._left_pad([c.context_ids[prefix.length :] + t for c, t in zip(clozes, tails)])
            embeds = self._embed(ids)
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
        segment, positions = segment.to(self.device), positions.to(self.device)
        key_segment, key_positions = segment, positions
        if prefix is not None:
            prefix_segment = torch.where(prefix.mask[0] > 0, 0, -1).expand(len(clozes), -1)
            key_segment = torch.cat([prefix_segment, segment], dim=1)
            key_positions = torch.cat([prefix.positions.expand(len(clozes), -1), positions], dim=1)
        mask = self._tree_mask(segment, positions, key_segment, key_positions)
        return embeds, mask, positions, cache, columns

    def _tree_mask(self, segment, positions, key_segment, key_positions):
        """Which keys each query attends to: earlier columns of the context (the shared prefix's
        included) and of the query's own option; a padding query only itself (and the prefix),
        so that no softmax row is empty. Window layers also need the key within the window,
        counted in positions as if the option directly followed the context."""
        queries, keys = segment.shape[1], key_segment.shape[1]
        column = torch.arange(keys, device=self.device)[None, :]
        own_column = torch.arange(queries, device=self.device)[:, None] + keys - queries
        query_segment, key_segment = segment[:, :, None], key_segment[:, None, :]
        allowed = (column <= own_column) & (key_segment >= 0) & ((key_segment == 0) | (key_segment == query_segment))
        allowed |= (query_segment < 0) & (column == own_column)
        if not self.slides:
            return self._as_mask(allowed)
        # a padding query's own key passes too: both sit at position 0
        in_window = allowed & (key_positions[:, None, :] > (positions - self.window)[:, :, None])
        if self.layer_types is None:  # every layer slides
            return self._as_mask(in_window)
        return {"full_attention": self._as_mask(allowed), "sliding_attention": self._as_mask(in_window)}

    def _as_mask(self, allowed: torch.Tensor) -> torch.Tensor:
        """(rows, 1, queries, keys): boolean for SDPA, additive for eager attention."""
        allowed = allowed[:, None]
        if self.attention == "sdpa":
            return allowed
        blocked = torch.finfo(self.model.dtype).min
        return torch.zeros(allowed.shape, dtype=self.model.dtype, device=self.device).masked_fill(~allowed, blocked)

    # --- tuning loss ------------------------------------------------------------------------------

    def target_loss(self, sequences: Sequence[tuple[list[int], list[int]]]) -> torch.Tensor:
        """Summed cross-entropy of each target after its prompt (soft prompt included), one
        left-padded batch; differentiable in the soft prompt and any adapter weights."""
        targets = [target for _, target in sequences]
        embeds, mask, positions = self.inputs([prompt + target for prompt, target in sequences])
        hidden = self.decoder(inputs_embeds=embeds, attention_mask=mask, position_ids=positions).last_hidden_state
        width, device = hidden.shape[1], hidden.device
        # the state at position i predicts token i + 1: for a target of n tokens at the right
        # edge, the predictors are the n positions just before the last one
        rows = torch.cat([torch.full((len(t),), r, device=device) for r, t in enumerate(targets)])
        cols = torch.cat([torch.arange(width - len(t) - 1, width - 1, device=device) for t in targets])
        gold = torch.tensor([tok for t in targets for tok in t], device=device)
        return self._cross_entropy(hidden[rows, cols], gold)

    def _cross_entropy(self, states: torch.Tensor, gold: torch.Tensor) -> torch.Tensor:
        """Summed cross-entropy of `gold` under the LM head, a chunk of positions at a time.

        A long target times a 262k vocabulary would otherwise hold gigabytes of logits; under
        autograd each chunk's logits are recomputed in the backward pass instead of kept, so memory
        holds one chunk whatever the target length."""
        total = states.new_zeros((), dtype=torch.float32)
        for start in range(0, len(gold), LOSS_CHUNK):
            chunk = (states[start : start + LOSS_CHUNK], gold[start : start + LOSS_CHUNK])
            if torch.is_grad_enabled():
                total = total + checkpoint(self._summed_cross_entropy, *chunk, use_reentrant=False)
            else:
                total = total + self._summed_cross_entropy(*chunk)
        return total

    def _summed_cross_entropy(self, states: torch.Tensor, gold: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(self.logits(states), gold, reduction="sum")

    # --- shared pieces ------------------------------------------------------------------------------

    def _length_buckets(self, lengths: list[int]) -> list[list[int]]:
        """Batches of similar length (longest first, so memory peaks early and predictably)."""
        order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
        return _batches(order, [n + self.n_soft for n in lengths], self.batch_size, self.token_budget)

    def _encode_prefix(self, sequences: Sequence[list[int]], within_window: int | None) -> SharedPrefix | None:
        """Encode once the tokens every sequence starts with (BOS, soft prompt, instruction,
        few-shot demonstrations); None when too little is shared to pay off. With
        `within_window` (how many tokens the rows will grow by), also None when a row could
        outgrow a sliding window; generation attends to a prefix by positions and takes any."""
        if len(sequences) < 2:
            return None
        # every row keeps at least one token of its own
        shared = min(_common_prefix_length(sequences), min(len(s) for s in sequences) - 1)
        outgrows_window = (
            within_window is not None and self.window is not None and max(map(len, sequences)) + self.n_soft + within_window > self.window
        )
        if shared < MIN_SHARED_PREFIX or outgrows_window:
            return None
        embeds, mask, positions = self.inputs([sequences[0][:shared]])
        cache = DynamicCache(config=self.text_config)
        self._forward(embeds, mask, positions, cache)
        return SharedPrefix(shared, cache, mask, positions)

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
            n_head = soft_prompt_at(seq, bos)
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

    def _forward(self, embeds, mask, positions, cache, prefix: SharedPrefix | None = None) -> torch.Tensor:
        """The decoder's last hidden states; with `prefix`, `cache` holds only the rows' own
        tokens and every row attends to the prefix's cache too."""
        self.positions_computed += embeds.shape[0] * embeds.shape[1]
        with stacked_gqa(self.decoder.config, None if prefix is None else self._prefix_keys(prefix, positions)):
            out = self.decoder(
                inputs_embeds=embeds, attention_mask=mask, position_ids=positions, cache=cache, use_cache=cache is not None
            )
        return out.last_hidden_state

    def _prefix_keys(self, prefix: SharedPrefix, positions: torch.Tensor) -> PrefixKeys:
        """A shared prefix as queries at `positions` (rows, queries) attend to it. A sliding
        layer's cache holds the prefix's last slots only; a query sees those within its window."""
        window_mask = None
        if self.slides:
            slots = next(layer.keys.shape[2] for layer, sliding in zip(prefix.cache.layers, self.sliding_layers) if sliding)
            key_positions = prefix.positions[0, prefix.positions.shape[1] - slots :]
            window_mask = (key_positions[None, None, :] > positions[:, :, None] - self.window)[:, None]
        return PrefixKeys(prefix.cache, self.sliding_layers, window_mask)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        self.logit_rows_computed += hidden.numel() // hidden.shape[-1]
        return self.transform(self.model.get_output_embeddings()(hidden).float())

    def _greedy(self, hidden: torch.Tensor) -> torch.Tensor:
        """The likeliest token after each hidden state (rows, hidden): the LM head's argmax."""
        head = self.model.get_output_embeddings()
        # Slices pay off where memory traffic is the cost (measured on CPU); on an accelerator
        # they would be many small kernels. A head that is not a plain linear layer (quantized,
        # hooked) computes its own logits.
        plain = type(head) is torch.nn.Linear and not head._forward_hooks and not head._forward_pre_hooks
        if not plain or self.device.type != "cpu":
            return torch.cat([self.logits(chunk).argmax(-1) for chunk in hidden.split(self.logits_chunk)])
        self.logit_rows_computed += hidden.shape[0]
        return _argmax_by_vocab_chunks(hidden, head, self.transform)

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
    """Rows being decoded together: the prompt index of each slot (None once its row finished:
    the slot idles until a row is encoded into it or the pool is repacked), their cache, mask,
    last positions, the token each has just chosen (recorded, not yet in the cache) and the
    drafts before it that the model confirmed (in the cache)."""

    rows: list[int | None]
    cache: DynamicCache
    mask: torch.Tensor
    positions: torch.Tensor  # (rows, 1)
    next_tokens: torch.Tensor  # (rows,)
    verified: list[list[int]] | None = None
    holes: bool = False  # whether a row attends to fewer columns than it spans (rejected drafts)

    def __post_init__(self):
        if self.verified is None:
            self.verified = [[] for _ in self.rows]

    @property
    def live(self) -> int:
        return sum(row is not None for row in self.rows)

    @property
    def idle(self) -> int:
        return len(self.rows) - self.live

    def _live_mask(self) -> torch.Tensor:
        live = torch.tensor([row is not None for row in self.rows], dtype=torch.bool, device=self.mask.device)
        return self.mask[live]

    def span(self) -> int:
        """Columns from the first one a live row attends to: those before it can be dropped."""
        attended = self._live_mask().any(0).nonzero()
        return self.mask.shape[1] - int(attended[0]) if len(attended) else 0

    def longest(self) -> int:
        """The most columns a live row attends to."""
        return int(self._live_mask().sum(1).max())

    @property
    def width(self) -> int:
        """Columns of the cache in use, the same for every row."""
        return self.mask.shape[1]

    def room(self) -> int:
        """Columns the cache can still take without growing."""
        return self.cache.layers[0].key_room.shape[2] - self.width

    def trim(self, keep: int) -> None:
        """Drop the columns that no live row attends to from the left of the cache, keeping at
        least `keep` columns. The cache's layers become views of the same buffers: nothing is
        copied, and the room after the last column stays."""
        drop = min(self.width - self.span(), self.width - keep)
        if drop > 0:
            for layer in self.cache.layers:
                layer.drop_left(drop)
            self.mask = self.mask[:, drop:]

    def compact(self) -> None:
        """Drop the idle slots: the live rows after the first `live` slots move into the idle
        slots among them (a copy of those rows only), and the pool keeps its first `live` slots,
        views of the same buffers."""
        live = self.live
        idle = [slot for slot in range(live) if self.rows[slot] is None]
        moving = [slot for slot in range(live, len(self.rows)) if self.rows[slot] is not None]
        if moving:  # as many as there are idle slots before `live`
            source, target = (torch.tensor(slots, device=self.mask.device) for slots in (moving, idle))
            for layer in self.cache.layers:
                layer.move_rows(source, target)
            for states in (self.mask, self.positions, self.next_tokens):
                states[target] = states[source]
            for to, origin in zip(idle, moving):
                self.rows[to], self.verified[to] = self.rows[origin], self.verified[origin]
        for layer in self.cache.layers:
            layer.keep_rows(live)
        self.mask, self.positions, self.next_tokens = self.mask[:live], self.positions[:live], self.next_tokens[:live]
        self.rows, self.verified = self.rows[:live], self.verified[:live]

    def take(self, slots: list[int], rows: list[int], mask: torch.Tensor, positions: torch.Tensor, next_tokens: torch.Tensor) -> None:
        """Give idle `slots` to freshly encoded rows (their cache already written)."""
        index = torch.tensor(slots, device=self.mask.device)
        self.mask[index], self.positions[index], self.next_tokens[index] = mask, positions, next_tokens
        for slot, row in zip(slots, rows):
            self.rows[slot], self.verified[slot] = row, []


@dataclass
class _RepackPart:
    """What a pool keeps when it is repacked: its live slots and, right-aligned, the columns
    each keeps and their mask. A pool without holes keeps the same columns for every row, from
    `start`."""

    keep: torch.Tensor  # slots of the live rows
    mask: torch.Tensor  # (live rows, columns kept)
    start: int
    order: torch.Tensor | None  # with holes: for each row, the columns it keeps, in order

    @classmethod
    def of(cls, pool: _Pool, device: torch.device) -> _RepackPart:
        keep = torch.tensor([slot for slot, row in enumerate(pool.rows) if row is not None], device=device)
        if not pool.holes:
            start = pool.width - pool.span()
            return cls(keep, pool.mask[keep, start:], start, None)
        # a stable sort puts each row's unattended columns first, then the attended ones in order
        mask, order = torch.sort(pool.mask[keep], dim=1, stable=True)
        kept = pool.longest()
        return cls(keep, mask[:, mask.shape[1] - kept :], 0, order[:, order.shape[1] - kept :])

    def states(self, states: torch.Tensor) -> torch.Tensor:
        """The kept rows' kept slots of a pool layer's keys or values (batch, heads, slots, dim)."""
        if self.order is not None:
            index = self.order[:, None, :, None].expand(-1, states.shape[1], -1, states.shape[3])
            return states[self.keep].gather(2, index)
        return states[self.keep, :, self.start :]


class _GrowingLayer(DynamicLayer):
    """A KV cache layer with room for the tokens still to come: a decode step writes its keys
    into place, where DynamicLayer concatenates and so copies the whole cache at every step.

    A sliding-window layer keeps every slot too (the mask hides those outside the window), so
    all layers of a pool share one width and can be repacked and trimmed alike."""

    is_croppable = False

    def __init__(self, key_room: torch.Tensor, value_room: torch.Tensor, length: int, is_sliding: bool):
        super().__init__()
        self.is_initialized, self.device, self.is_sliding = True, key_room.device, is_sliding
        self.key_room, self.value_room, self.length = key_room, value_room, length
        self._view_filled()

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        end = self.length + key_states.shape[-2]
        if end > self.key_room.shape[-2]:
            # growing would move the cache out of the pool's buffer (or a slot view of it)
            raise RuntimeError(f"a decoding cache of {self.key_room.shape[-2]} slots cannot take {end}: the engine planned too little room")
        self.key_room[:, :, self.length : end] = key_states
        self.value_room[:, :, self.length : end] = value_states
        self.length = end
        self._view_filled()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def move_rows(self, source: torch.Tensor, target: torch.Tensor) -> None:
        """Copy the rows at `source` over those at `target`."""
        for room in (self.key_room, self.value_room):
            room[target, :, : self.length] = room[source, :, : self.length]

    def keep_rows(self, rows: int) -> None:
        """Keep the first `rows` rows (a view, no copy)."""
        self.key_room, self.value_room = self.key_room[:rows], self.value_room[:rows]
        self._view_filled()

    def drop_left(self, columns: int) -> None:
        """Forget the first `columns` slots (a view of the rest, no copy)."""
        self.key_room, self.value_room = self.key_room[:, :, columns:], self.value_room[:, :, columns:]
        self.length -= columns
        self._view_filled()

    def _view_filled(self) -> None:
        """`keys` and `values`: views of the slots filled so far."""
        self.keys, self.values = self.key_room[:, :, : self.length], self.value_room[:, :, : self.length]

    def _unsupported(self, *args, **kwargs):
        raise NotImplementedError("a decoding pool's cache changes its rows only through the engine (repack, compact, trim)")

    crop = reorder_cache = batch_select_indices = batch_repeat_interleave = _unsupported


def _slot_cache(pool: _Pool, slots: list[int], start: int) -> tuple[DynamicCache, Callable[[], None]]:
    """The cache a batch is encoded into: for each layer of a pool's cache, `slots` from column
    `start` on; zeros go to the left of `start`. Slots in one run are written in place;
    scattered slots through a buffer, which the returned function copies into them once the
    forward pass is done."""
    if slots == list(range(slots[0], slots[0] + len(slots))):
        index: slice | torch.Tensor = slice(slots[0], slots[0] + len(slots))
    else:
        index = torch.tensor(slots, device=pool.mask.device)
    width = pool.width
    layers, buffers = [], []
    for layer in pool.cache.layers:
        views = []
        for room in (layer.key_room, layer.value_room):
            room[index, :, :start] = 0
            views.append(room[index, :, start:] if isinstance(index, slice) else room.new_empty(len(slots), room.shape[1], width - start, room.shape[3]))
        layers.append(_GrowingLayer(views[0], views[1], 0, layer.is_sliding))
        if not isinstance(index, slice):
            buffers.append((layer, views))

    def write_back() -> None:
        for layer, (keys, values) in buffers:
            layer.key_room[index, :, start:width] = keys
            layer.value_room[index, :, start:width] = values

    encoding = copy.copy(pool.cache)
    encoding.layers = layers
    return encoding, write_back


class _Decoder:
    """Greedy decoding steps over a pool, recording each row's completion when it ends. With
    `prefix`, the pool's cache holds each row's tokens after the prefix, which every row attends
    to as well."""

    def __init__(
        self, engine: Engine, prompts: Sequence[list[int]], stop: Sequence[str], max_new_tokens: int, prefix: SharedPrefix | None = None
    ):
        self.engine, self.prompts, self.max_new_tokens, self.prefix = engine, prompts, max_new_tokens, prefix
        self.eos = set(engine.lm.eos_token_ids)
        self.texts = [TextStream(engine.lm.tokenizer, stop) for _ in prompts]
        self.lookups: dict[int, _PromptLookup] = {}  # rows that have drafted
        self.results: list[Completion | None] = [None] * len(prompts)

    def step(self, pool: _Pool, advance: Advance, speculate: bool = False) -> _Pool | None:
        """Advance the pool by one token, and by the drafts the model confirms when `speculate`
        (idle slots advance too, until a row is encoded into them or the pool drops them), and
        record what each live row chose; None once no row is live."""
        if not pool.live:
            return None
        pool = self._advance(pool, self._drafts(pool) if speculate else [[] for _ in pool.rows])
        self.record(pool, advance)
        return pool if pool.live else None

    def record(self, pool: _Pool, advance: Advance, rows: set[int] | None = None) -> None:
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

    def _drafts(self, pool: _Pool) -> list[list[int]]:
        """Each slot's draft tokens: as many as the step's position budget and the cache's room
        allow (and, for a sliding-window model, as keep every row's span within the window),
        never past the token limit."""
        engine = self.engine
        budget = min(MAX_DRAFT, DRAFT_POSITIONS // len(pool.rows) - 1, pool.room() - 1)
        if engine.slides:
            budget = min(budget, engine.window - pool.span() - 1)
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

    def _advance(self, pool: _Pool, drafts: list[list[int]]) -> _Pool:
        """One forward pass over each row's chosen token followed by its drafts (a row with
        fewer drafts than others repeats its token in masked columns). A row keeps its drafts
        up to the first the model would not have chosen; its next token is the model's choice
        after the last one kept. Rejected drafts' columns stay in the cache, masked."""
        engine = self.engine
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
        hidden = engine._forward(engine._embed(ids), mask, positions, pool.cache, self.prefix)
        # vocabulary logits only where a live row chooses a token: after its token and each draft
        picks = [(slot, column) for slot in live for column in range(1 + len(drafts[slot]))]
        slots, columns = (torch.tensor(index, device=engine.device) for index in zip(*picks))
        chosen = iter(engine._greedy(hidden[slots, columns]).tolist())
        next_tokens, verified, last = pool.next_tokens.clone(), [[] for _ in pool.rows], pool.positions.clone()
        holes = pool.holes
        engine.draft_positions_discarded += rows * (new - 1)
        for slot in live:
            draft = drafts[slot]
            choices = [next(chosen) for _ in range(1 + len(draft))]
            kept = 0
            while kept < len(draft) and draft[kept] == choices[kept]:
                kept += 1
            verified[slot], next_tokens[slot] = draft[:kept], choices[kept]
            engine.drafts_proposed += len(draft)
            engine.drafts_accepted += kept
            engine.draft_positions_discarded -= kept
            last[slot] += 1 + kept
            if 1 + kept < new:
                mask[slot, width + 1 + kept :] = 0
                holes = True
        return _Pool(pool.rows, pool.cache, mask, last, next_tokens, verified, holes)


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


class TextStream:
    """One row's generated tokens and their text, decoded incrementally: each token decodes a
    few tokens of context, not the whole completion, and stop strings are looked for only where
    the new text could complete one.

    The text is the tokenizer's decoding of all tokens so far (checked in the tests); a stop
    string found in it is confirmed on a full decode, the completion's text always is one."""

    def __init__(self, tokenizer, stop: Sequence[str]):
        self.tokenizer, self.stop = tokenizer, [s for s in stop if s]
        self.longest_stop = max(map(len, self.stop), default=0)
        self.tokens: list[int] = []
        self.text = ""
        # tokens[start:read] decode to the last stable piece of text: context for the next token
        self.start = self.read = 0
        self.latest = ""  # the text with the newest tokens, an incomplete character included

    def append(self, token: int) -> bool:
        """Add a token; whether a stop string now ends the completion."""
        self.tokens.append(token)
        decode = self.tokenizer.decode
        before = decode(self.tokens[self.start : self.read], skip_special_tokens=True)
        after = decode(self.tokens[self.start :], skip_special_tokens=True)
        if after.startswith(before):
            self.latest = self.text + after[len(before) :]
            look_from = len(self.text) - self.longest_stop + 1
            # an incomplete UTF-8 sequence decodes to U+FFFD: keep its tokens as context until
            # the tokens that complete it arrive
            if len(after) > len(before) and not after.endswith("\ufffd"):
                self.text = self.latest
                self.start, self.read = self.read, len(self.tokens)
        else:  # the decoding of earlier tokens changed: decode them all once and go on from there
            self.latest = self.text = self._full_text()
            self.start, self.read = max(0, len(self.tokens) - RESYNC_CONTEXT), len(self.tokens)
            look_from = 0
        begins = len(self.latest) - len(self.latest.lstrip())  # stop strings count after it
        if begins == len(self.latest) or not any(s in self.latest[max(begins, look_from) :] for s in self.stop):
            return False
        return _first_stop(self._full_text(), self.stop) is not None

    def _full_text(self) -> str:
        return self.tokenizer.decode(self.tokens, skip_special_tokens=True)

    def completion(self, reason: str) -> Completion:
        text = self._full_text()
        cut = _first_stop(text, self.stop)  # after eos or at the length limit too, as a safeguard
        return Completion(text if cut is None else text[:cut], self.tokens, reason, raw=text)


def ended_by(text: TextStream, token: int, eos: set[int], max_new_tokens: int) -> Completion | None:
    """Add a generated token to a completion; the completion if the token ends it (EOS, a stop
    string, the token limit), else None."""
    if token in eos:
        return text.completion("eos")
    if text.append(token):
        return text.completion("stop")
    if len(text.tokens) >= max_new_tokens:
        return text.completion("length")
    return None


def _batches(order: list[int], widths: Sequence[int], batch_size: int, token_budget: int) -> list[list[int]]:
    """`order` cut into consecutive batches of at most `batch_size` rows whose rows x widest row
    stays within `token_budget`, and whose padding costs at most PADDING_SLACK of their tokens;
    a row wider than the budget goes alone."""
    batches: list[list[int]] = []
    batch: list[int] = []
    widest = tokens = 0
    for i in order:
        grown = max(widest, widths[i])
        padded = (len(batch) + 1) * grown
        too_wide = padded > token_budget or padded > (1 + PADDING_SLACK) * (tokens + widths[i])
        if batch and (len(batch) == batch_size or too_wide):
            batches.append(batch)
            batch, grown, tokens = [], widths[i], 0
        batch.append(i)
        widest, tokens = grown, tokens + widths[i]
    if batch:
        batches.append(batch)
    return batches


def soft_prompt_at(sequence: list[int], bos: int | None) -> int:
    """Where a soft prompt goes in a sequence: after its BOS token, if it starts with one."""
    return 1 if bos is not None and sequence and sequence[0] == bos else 0


def _fits(pool_width: int, own_width: int, max_new_tokens: int) -> bool:
    """Whether a prompt of `own_width` columns may decode in a pool `pool_width` columns wide."""
    return pool_width <= POOL_WIDTH_RATIO * (own_width + max_new_tokens)


def _argmax_by_vocab_chunks(hidden: torch.Tensor, head: torch.nn.Linear, transform: LogitTransform) -> torch.Tensor:
    """`transform(head(hidden)).argmax(-1)` (the first index among equal ones), one slice of the
    vocabulary at a time: each slice's best, then the first slice whose best is the highest."""
    values, indices = [], []
    for start in range(0, head.out_features, VOCAB_CHUNK):
        end = start + VOCAB_CHUNK
        bias = None if head.bias is None else head.bias[start:end]
        logits = transform(torch.nn.functional.linear(hidden, head.weight[start:end], bias).float())
        value, index = logits.max(-1)
        values.append(value)
        indices.append(index + start)
    best = torch.stack(values, -1).argmax(-1, keepdim=True)
    return torch.stack(indices, -1).gather(-1, best)[:, 0]


def _tail(cloze: Cloze) -> list[int]:
    """What follows a context in its packed sequence: each option but its last token (the states
    that predict an option's later tokens), options in order."""
    return [token for option in cloze.continuation_ids for token in option[:-1]]


def _pad_left(states: torch.Tensor, width: int, dim: int = 1) -> torch.Tensor:
    """`states` left-padded with zeros to `width` along `dim` (a mask's columns, a cache's slots)."""
    pad = [0, 0] * (states.dim() - 1 - dim) + [width - states.shape[dim], 0]
    return torch.nn.functional.pad(states, pad)


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


def _rope_depends_on_length(config) -> bool:
    """Whether the rotary embedding is rescaled by the largest position in a batch (dynamic
    NTK scaling, LongRoPE)."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    kinds = [params] if "rope_type" in params else [p for p in params.values() if isinstance(p, dict)]
    return any(kind.get("rope_type") in ("dynamic", "longrope") for kind in kinds)


def kv_cache_budget(device: torch.device) -> int:
    """Bytes a decoding pool's KV cache may take on `device`: KV_MEMORY_SHARE of its free memory.

    Free memory counts what this process freed and keeps for reuse (PyTorch's cached device
    blocks, glibc's kept heap), so an engine built after an earlier one gets the same budget, not
    one shrunk by the memory the last one used. For the CPU, and devices that share its memory,
    it is what the system has available without swapping."""
    backend = getattr(torch, device.type, None)  # torch.cuda, torch.xpu
    if device.type != "cpu" and hasattr(backend, "mem_get_info"):
        free, _ = backend.mem_get_info(device)
        free += backend.memory_reserved(device) - backend.memory_allocated(device)
    else:
        free = psutil.virtual_memory().available + kept_free_bytes()
    return int(min(KV_CACHE_BYTES_MAX, max(KV_CACHE_BYTES_MIN, KV_MEMORY_SHARE * free)))


def _kv_shape(config) -> tuple[int, int]:
    """Key/value heads and the size of each, as a layer's cache holds them."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return heads, head_dim


def _kv_bytes_per_token(config, dtype: torch.dtype) -> int:
    """Bytes one token takes in the KV cache: keys and values of every layer."""
    heads, head_dim = _kv_shape(config)
    return 2 * config.num_hidden_layers * heads * head_dim * dtype.itemsize


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
