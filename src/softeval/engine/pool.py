"""Decoding pools: the rows decoding together, their KV cache in buffers with room to grow in
place, and the views of it that a prefill or a decode step writes into.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


@dataclass
class Pool:
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
class RepackPart:
    """What a pool keeps when it is repacked: its live slots and, right-aligned, the columns
    each keeps and their mask. A pool without holes keeps the same columns for every row, from
    `start`."""

    keep: torch.Tensor  # slots of the live rows
    mask: torch.Tensor  # (live rows, columns kept)
    start: int
    order: torch.Tensor | None  # with holes: for each row, the columns it keeps, in order

    @classmethod
    def of(cls, pool: Pool, device: torch.device) -> RepackPart:
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


class GrowingLayer(DynamicLayer):
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


def slot_cache(pool: Pool, slots: list[int], start: int) -> tuple[DynamicCache, Callable[[], None]]:
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
        layers.append(GrowingLayer(views[0], views[1], 0, layer.is_sliding))
        if not isinstance(index, slice):
            buffers.append((layer, views))

    def write_back() -> None:
        for layer, (keys, values) in buffers:
            layer.key_room[index, :, start:width] = keys
            layer.value_room[index, :, start:width] = values

    encoding = copy.copy(pool.cache)
    encoding.layers = layers
    return encoding, write_back


def pad_left(states: torch.Tensor, width: int, dim: int = 1) -> torch.Tensor:
    """`states` left-padded with zeros to `width` along `dim` (a mask's columns, a cache's slots)."""
    pad = [0, 0] * (states.dim() - 1 - dim) + [width - states.shape[dim], 0]
    return torch.nn.functional.pad(states, pad)
