"""Grouped-query attention that reads each key/value head once, for any number of queries.

With an attention mask and more than one query, transformers' SDPA path copies every key/value
head once for each query head that shares it. (For a single query it stacks those query heads
instead.) The engine passes a mask with many queries: verifying drafts, encoding prompts,
scoring options. On CPU the copy can cost more than the attention itself. Here the query heads
that share a key/value head are always stacked along the query axis, with the mask repeated to
match, so SDPA reads the keys and values where they are.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "softeval_sdpa"


def stacked_gqa_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """SDPA as transformers runs it, with a query head group's queries stacked when a mask is
    given; every other case (one query, no mask, a mask per head, a position bias, a softcap)
    goes to transformers' own function."""
    groups = getattr(module, "num_key_value_groups", 1)
    stackable = groups > 1 and query.shape[2] > 1 and attention_mask is not None and attention_mask.shape[1] == 1
    if not stackable or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs)
    batch, heads, queries, dim = query.shape
    # query head h uses key/value head h // groups: heads of a group are adjacent
    stacked = query.reshape(batch, heads // groups, groups * queries, dim)
    mask = attention_mask.expand(-1, -1, queries, -1)[:, :, None].expand(-1, -1, groups, -1, -1)
    mask = mask.reshape(attention_mask.shape[0], 1, groups * queries, attention_mask.shape[-1])
    out = torch.nn.functional.scaled_dot_product_attention(stacked, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling)
    return out.reshape(batch, heads, queries, value.shape[-1]).transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, stacked_gqa_sdpa)
AttentionMaskInterface.register(NAME, sdpa_mask)


@contextmanager
def stacked_gqa(config) -> Iterator[None]:
    """Within the block, a model whose attention is transformers' SDPA (its layers read `config`
    at every call) runs `stacked_gqa_sdpa` instead; other implementations are left alone."""
    if config._attn_implementation != "sdpa":
        yield
        return
    config._attn_implementation_internal = NAME
    try:
        yield
    finally:
        config._attn_implementation_internal = "sdpa"
