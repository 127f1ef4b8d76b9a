"""Greedy generation by continuous batching: prompts (longest first) are encoded into a pool's
idle slots while others decode, within a KV-cache budget taken from the memory free when the
engine starts.
"""

from __future__ import annotations

import functools
import itertools
from collections import deque
from collections.abc import Callable, Sequence

import psutil
import torch
from transformers import DynamicCache

from softeval.engine.decoding import MAX_DRAFT, Decoder, DraftCounts
from softeval.engine.forward import Advance, Forward, SharedPrefix, cut_batches
from softeval.engine.pool import GrowingLayer, Pool, RepackPart, pad_left, slot_cache
from softeval.engine.text import Completion
from softeval.models import kept_free_bytes

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


def _fits(pool_width: int, own_width: int, max_new_tokens: int) -> bool:
    """Whether a prompt of `own_width` columns may decode in a pool `pool_width` columns wide."""
    return pool_width <= POOL_WIDTH_RATIO * (own_width + max_new_tokens)


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


# (heads, size) of a cache layer's keys and of its values
Shapes = tuple[tuple[int, int], tuple[int, int]]


@torch.inference_mode()
def cache_shapes(forward: Forward) -> list[Shapes]:
    """Each layer's key and value shapes, (heads, size) each, as the model's own cache holds them,
    read from a one-token pass: most models cache keys and values of their key/value heads, but
    multi-head latent attention (DeepSeek-V3) caches a compressed latent and a rotary key, each
    of their own size, and expands them after the cache."""
    cache = DynamicCache(config=forward.text_config)
    one = torch.zeros(1, 1, dtype=torch.long, device=forward.device)
    forward.decoder(inputs_embeds=forward.embed(one), attention_mask=torch.ones_like(one), position_ids=one, cache=cache, use_cache=True)
    return [((layer.keys.shape[1], layer.keys.shape[3]), (layer.values.shape[1], layer.values.shape[3])) for layer in cache.layers]


def attention_shape(config) -> tuple[int, int]:
    """Key/value heads and the size of each, as attention reads them."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return heads, head_dim


def kv_bytes_per_token(shapes: list[Shapes], dtype: torch.dtype) -> int:
    """Bytes one token takes in the KV cache: keys and values of every layer."""
    return sum(heads * size for layer in shapes for heads, size in layer) * dtype.itemsize


class Generation:
    """`generate`: greedy completions by continuous batching over decoding pools."""

    def __init__(self, forward: Forward, decode_rows: int = DECODE_ROWS, kv_cache_bytes: int | None = None):
        self.forward = forward
        self.decode_rows = decode_rows
        self.kv_cache_bytes = kv_cache_bytes or kv_cache_budget(forward.device)
        # Rotary scalings that change with the largest position in a batch would see a draft's
        # positions before plain decoding reaches them: no drafts for those models.
        self.speculates = not _rope_depends_on_length(forward.text_config)
        # called, where set, with the prompts joining a decoding pool and the logits their first
        # tokens are chosen from: the self-check compares their log-probabilities
        self.observe_admission: Callable[[list[int], torch.Tensor], None] | None = None
        self.drafts = DraftCounts()  # drafts proposed and kept, over the engine's life

    # What the cache holds is read from a forward pass the first time an engine generates: an
    # engine that only scores options or computes the tuning loss never needs it.

    @functools.cached_property
    def shapes(self) -> list[Shapes]:
        return cache_shapes(self.forward)

    @functools.cached_property
    def kv_positions(self) -> int:
        """Token positions the KV budget holds."""
        return max(1, self.kv_cache_bytes // kv_bytes_per_token(self.shapes, self.forward.model.dtype))

    @functools.cached_property
    def prefix_apart(self) -> bool:
        """Whether a shared prefix is kept apart from the rows' caches: where the engine's SDPA
        function can attend to it, its cache must hold the keys and values attention reads (not a
        latent they are expanded from), and not with eager attention, capped attention scores
        (Gemma 2) or sliding layers other than one window counted in positions (chunked
        attention)."""
        forward = self.forward
        return (
            forward.attention == "sdpa"
            and all(layer == (attention_shape(forward.text_config),) * 2 for layer in self.shapes)
            and not getattr(forward.text_config, "attn_logit_softcapping", None)
            and (forward.slides or not any(forward.sliding_layers))
        )

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
        dropped. Steps then also verify draft tokens (see `Decoder`), which take the last rows
        several tokens a step. A prompt much narrower than the pool (POOL_WIDTH_RATIO) waits for
        a pool of its own: until then the pool decodes as if the queue were drained."""
        prefix = self.forward.encode_prefix(prompts, within_window=None) if self.prefix_apart else None
        decoder = Decoder(self.forward, self.drafts, prompts, stop, max_new_tokens, prefix)
        room = min(DECODE_ROOM, max_new_tokens)
        queue = deque(sorted(range(len(prompts)), key=lambda i: -len(prompts[i])))
        pool: Pool | None = None
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

    def _wasteful(self, pool: Pool) -> bool:
        """Whether rejected drafts' columns (holes) should be dropped from a pool's cache now:
        when they are a quarter of what the pool attends to, or before its span passes a
        sliding window (which the decoding cache counts in columns, holes included)."""
        if not pool.holes:
            return False
        span = pool.span()
        if self.forward.slides and span + 1 + MAX_DRAFT > self.forward.window:
            return True
        return 4 * (span - pool.longest()) > span

    def _arrivals(
        self, pool: Pool | None, queue: deque[int], prompts: Sequence[list[int]], prefix: SharedPrefix | None, max_new_tokens: int, room: int
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
        return cut_batches(arrivals, widths, free, self.forward.token_budget)

    @staticmethod
    def _joinable(pool: Pool) -> bool:
        """Whether enough of a pool's slots are idle for rows to join it."""
        return pool.idle >= max(1, int(JOIN_SHARE * len(pool.rows)))

    def _admit(
        self, pool: Pool | None, batches: list[list[int]], prompts: Sequence[list[int]], prefix: SharedPrefix | None, room: int, needed: int
    ) -> Pool:
        """The pool with the prompts of `batches` encoded into its idle slots. A pool with too few
        idle slots, narrower than a joining prompt, with less room than the next step needs or
        with the holes of rejected drafts is first repacked into a new buffer with slots for them
        (and the first batches make one). Joining rows are written where they will decode: the
        rows already decoding stay put."""
        forward = self.forward
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
            chosen = forward.greedy(hidden)
        else:  # the full logits, which the observer takes, choose the tokens too
            logits = forward.logits(hidden)
            self.observe_admission([i for batch in batches for i in batch], logits)
            chosen = logits.argmax(-1)
        next_tokens = chosen.split([len(batch) for batch in batches])
        for into, batch, (mask, positions, _), tokens in zip(slots, batches, encoded, next_tokens):
            pool.take(into, batch, pad_left(mask, pool.width), positions, tokens)
        return pool

    def _own_width(self, sequence: list[int], prefix: SharedPrefix | None) -> int:
        """Columns a prompt takes in a pool's cache: all its tokens and the soft prompt, or with
        a shared prefix (kept apart, soft prompt included) the tokens after it."""
        return len(sequence) + self.forward.n_soft if prefix is None else len(sequence) - prefix.length

    def _encode_into(
        self, pool: Pool, slots: list[int], batch: list[int], prompts: Sequence[list[int]], prefix: SharedPrefix | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Encode a batch of prompts into the cache of `slots` of a pool, right-aligned at the
        pool's width (zeros to their left). Returns what the slots take once each row's first
        token is chosen: the rows' mask, their last positions and their last hidden states.

        With a shared prefix, only each row's own tokens are encoded and cached, left-padded,
        with positions continuing from the prefix, which every row attends to as well."""
        forward = self.forward
        sequences = [prompts[i] for i in batch]
        if prefix is None:
            embeds, mask, positions = forward.inputs(sequences)
        else:
            ids, mask = forward.left_pad([s[prefix.length :] for s in sequences])
            embeds = forward.embed(ids)
            positions = prefix.positions[:, -1:] + mask.cumsum(-1)
        cache, write_back = slot_cache(pool, slots, pool.width - mask.shape[1])
        # a copy: a view would keep the batch's whole output alive until the admission's LM head
        hidden = forward.run(embeds, mask, positions, cache, prefix)[:, -1].clone()
        write_back()
        return mask, positions[:, -1:], hidden

    def _repack(self, pool: Pool | None, room: int, free: int = 0, width: int = 0) -> Pool:
        """A new buffer holding the live rows of `pool` (if any), then `free` idle slots for rows
        about to be encoded into it: as wide as `width` or the columns the live rows span, with
        room for `room` more tokens, so decode steps write into place instead of copying the
        cache. Each live row keeps only the columns it attends to, right-aligned, zeros to
        their left (a pool with holes from rejected drafts is compacted)."""
        forward = self.forward
        part = None if pool is None else RepackPart.of(pool, forward.device)
        live = 0 if part is None else len(part.keep)
        width = max(width, 0 if part is None else part.mask.shape[1])
        layers = []
        for index, (sliding, shapes) in enumerate(zip(forward.sliding_layers, self.shapes)):
            key_room, value_room = (
                torch.empty(live + free, heads, width + room, size, dtype=forward.model.dtype, device=forward.device) for heads, size in shapes
            )
            if part is not None:
                layer = pool.cache.layers[index]
                for buffer, states in ((key_room, layer.keys), (value_room, layer.values)):
                    states = part.states(states)
                    buffer[:live, :, : width - states.shape[2]] = 0
                    buffer[:live, :, width - states.shape[2] : width] = states
            layers.append(GrowingLayer(key_room, value_room, width, sliding))
        cache = DynamicCache(config=forward.text_config)
        cache.layers = layers
        mask = torch.zeros(live + free, width, dtype=torch.long, device=forward.device)
        positions = torch.zeros(live + free, 1, dtype=torch.long, device=forward.device)
        next_tokens = torch.zeros(live + free, dtype=torch.long, device=forward.device)
        rows: list[int | None] = [None] * (live + free)
        verified: list[list[int]] = [[] for _ in rows]
        if part is not None:
            mask[:live] = pad_left(part.mask, width)
            positions[:live], next_tokens[:live] = pool.positions[part.keep], pool.next_tokens[part.keep]
            for slot, old in enumerate(part.keep.tolist()):
                rows[slot], verified[slot] = pool.rows[old], pool.verified[old]
        return Pool(rows, cache, mask, positions, next_tokens, verified)


def _rope_depends_on_length(config) -> bool:
    """Whether the rotary embedding is rescaled by the largest position in a batch (dynamic
    NTK scaling, LongRoPE)."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    kinds = [params] if "rope_type" in params else [p for p in params.values() if isinstance(p, dict)]
    return any(kind.get("rope_type") in ("dynamic", "longrope") for kind in kinds)
