"""The engine's attention: grouped-query SDPA that reads each key/value head once, and attention
over a prefix that every row of a batch shares, stored once.

With an attention mask and more than one query, transformers' SDPA path copies every key/value
head once for each query head that shares it. (For a single query it stacks those query heads
instead.) The engine passes a mask with many queries: verifying drafts, encoding prompts,
scoring options. On CPU the copy can cost more than the attention itself. Here the query heads
that share a key/value head are always stacked along the query axis, with the mask repeated to
match, so SDPA reads the keys and values where they are.

Prompts of one call often begin alike (instruction, few-shot demonstrations): in generation, the
keys and values of that shared prefix are kept once instead of once per row, and every row's
queries attend to it in one matrix product per key/value head, beside the row's own keys. The
two parts are softmaxed together, so the result is attention over the prefix and the row's own
tokens as one sequence.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch
from transformers import AttentionInterface, DynamicCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "softeval_sdpa"


@dataclass(frozen=True)
class PrefixKeys:
    """The keys and values of a prefix every row of a forward pass starts with, kept once, and
    which of them a query of a sliding-window layer still sees."""

    cache: DynamicCache  # one row; a sliding layer holds only the prefix's last slots
    sliding: tuple[bool, ...]  # for each layer, whether it attends within a window
    window_mask: torch.Tensor | None = None  # (batch, 1, queries, slots of a sliding layer), None: all


# the prefix of the running forward pass, if any
_shared_prefix: ContextVar[PrefixKeys | None] = ContextVar("shared_prefix", default=None)


def stacked_gqa_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """SDPA as transformers runs it, with a query head group's queries stacked when a mask is
    given, and a shared prefix's keys and values attended to beside each row's own; every other
    case (one query, no mask, a mask per head, a position bias, a softcap) goes to transformers'
    own function."""
    special = kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None
    prefix = _shared_prefix.get()
    if prefix is not None:
        if special or dropout:
            raise NotImplementedError("attention with a position bias, a softcap or dropout cannot share a prefix")
        layer = prefix.cache.layers[module.layer_idx]
        window = prefix.window_mask if prefix.sliding[module.layer_idx] else None
        return shared_prefix_attention(query, key, value, attention_mask, layer.keys, layer.values, scaling, window), None
    groups = getattr(module, "num_key_value_groups", 1)
    stackable = groups > 1 and query.shape[2] > 1 and attention_mask is not None and attention_mask.shape[1] == 1
    if not stackable or special:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs)
    batch, heads, queries, dim = query.shape
    # query head h uses key/value head h // groups: heads of a group are adjacent
    stacked = query.reshape(batch, heads // groups, groups * queries, dim)
    mask = _stacked_mask(attention_mask, groups, queries)
    out = torch.nn.functional.scaled_dot_product_attention(stacked, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling)
    return out.reshape(batch, heads, queries, value.shape[-1]).transpose(1, 2).contiguous(), None


def shared_prefix_attention(query, key, value, mask, prefix_keys, prefix_values, scaling=None, prefix_mask=None) -> torch.Tensor:
    """Attention of `query` (batch, heads, queries, dim) over a prefix shared by every row
    (`prefix_keys`, `prefix_values`: (1, kv heads, prefix, dim), attended to by every query, or
    where `prefix_mask` (batch, 1, queries, prefix) is True) followed by each row's own `key`
    and `value` (batch, kv heads, keys, dim) under `mask` (batch, 1, queries, keys; True where a
    query attends, None for causal attention with the queries last). Every query attends to
    some key of one part or the other (a left-padding query sits at the prefix's last position,
    so it sees the prefix). Returns (batch, queries, heads, dim), as transformers'
    attention functions do.

    Each part is attended to on its own, then the two are weighed by the log-sum-exp of their
    scores, which is a softmax over both at once."""
    batch, heads, queries, dim = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    scale = dim**-0.5 if scaling is None else scaling
    stacked = query.reshape(batch, kv_heads, groups * queries, dim)  # query heads of a group adjacent
    if mask is None and queries > 1:
        mask = torch.ones(queries, key.shape[2], dtype=torch.bool, device=key.device).tril(key.shape[2] - queries)[None, None]
    own_mask = None if mask is None else _stacked_mask(mask.expand(batch, 1, -1, -1), groups, queries)
    attend = _attend_flash if _flash_cpu is not None and query.device.type == "cpu" else _attend
    # every row's queries against the one copy of the prefix: one batch of queries per key/value head
    flat = stacked.transpose(0, 1).reshape(1, kv_heads, batch * groups * queries, dim)
    flat_mask = None
    if prefix_mask is not None:  # rows, then query heads, then queries: the order of `flat`
        flat_mask = _stacked_mask(prefix_mask, groups, queries).reshape(1, 1, batch * groups * queries, -1)
    prefix_out, prefix_lse = attend(flat, prefix_keys, prefix_values, flat_mask, scale)
    if flat_mask is not None:  # a query past the window of every prefix key
        prefix_lse = prefix_lse.masked_fill(~flat_mask.any(-1), float("-inf"))
    prefix_out = prefix_out[0].reshape(kv_heads, batch, groups * queries, dim).transpose(0, 1)
    prefix_lse = prefix_lse[0].reshape(kv_heads, batch, groups * queries).transpose(0, 1)
    own_out, own_lse = attend(stacked, key, value, own_mask, scale)
    if own_mask is not None:  # a padding query attends to none of its row's keys, only the prefix
        own_lse = own_lse.masked_fill(~own_mask.any(-1), float("-inf"))
    top = torch.maximum(prefix_lse, own_lse)  # finite: every query attends to some key of either part
    prefix_weight, own_weight = (prefix_lse - top).exp()[..., None], (own_lse - top).exp()[..., None]
    out = (prefix_out.float() * prefix_weight + own_out.float() * own_weight) / (prefix_weight + own_weight)
    return out.to(query.dtype).reshape(batch, heads, queries, dim).transpose(1, 2).contiguous()


# The CPU kernel behind SDPA, which also returns each query's log-sum-exp (public SDPA does not).
_flash_cpu = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _attend_flash(query, key, value, mask, scale) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of (batch, heads, queries, dim) queries over keys and values under a boolean
    mask, and the log-sum-exp of each query's scores, from SDPA's CPU kernel (a query with no
    key gets zeros)."""
    additive = None if mask is None else torch.zeros(mask.shape, dtype=query.dtype, device=query.device).masked_fill(~mask, float("-inf"))
    out, lse = _flash_cpu(query, key, value, 0.0, False, attn_mask=additive, scale=scale)
    return out, lse


def _attend(query, key, value, mask, scale) -> tuple[torch.Tensor, torch.Tensor]:
    """What `_attend_flash` computes, in plain matrix products and a softmax (any device), in
    float32 as SDPA's kernels accumulate: half-precision scores would round before the softmax
    (and can overflow in float16)."""
    scores = torch.matmul(query.float() * scale, key.float().transpose(-1, -2))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    weights = (scores - lse[..., None]).exp().nan_to_num(0.0)  # a query with no key: zeros
    return torch.matmul(weights, value.float()), lse


def _stacked_mask(mask: torch.Tensor, groups: int, queries: int) -> torch.Tensor:
    """A (batch, 1, queries or 1, keys) mask repeated for each query head of a group, as the
    queries are stacked: (batch, 1, groups x queries, keys)."""
    mask = mask.expand(-1, -1, queries, -1)[:, :, None].expand(-1, -1, groups, -1, -1)
    return mask.reshape(mask.shape[0], 1, groups * queries, mask.shape[-1])


AttentionInterface.register(NAME, stacked_gqa_sdpa)
AttentionMaskInterface.register(NAME, sdpa_mask)


@contextmanager
def stacked_gqa(config, shared_prefix: PrefixKeys | None = None) -> Iterator[None]:
    """Within the block, a model whose attention is transformers' SDPA (its layers read `config`
    at every call) runs `stacked_gqa_sdpa` instead; other implementations are left alone. With
    `shared_prefix` (a prefix every row starts with), each row's cache holds only its own
    tokens, and every query attends to the prefix too."""
    if config._attn_implementation != "sdpa":
        if shared_prefix is not None:
            raise NotImplementedError(f"a shared prefix needs SDPA attention, not {config._attn_implementation!r}")
        yield
        return
    config._attn_implementation_internal = NAME
    token = _shared_prefix.set(shared_prefix)
    try:
        yield
    finally:
        _shared_prefix.reset(token)
        config._attn_implementation_internal = "sdpa"
