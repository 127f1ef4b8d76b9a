"""Grouped-query SDPA with stacked query heads against transformers' own SDPA."""

from __future__ import annotations

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from softeval.attention import stacked_gqa_sdpa


class _Attention(torch.nn.Module):
    def __init__(self, groups: int):
        super().__init__()
        self.num_key_value_groups, self.is_causal = groups, True


@pytest.mark.parametrize("heads, kv_heads, queries", [(8, 2, 5), (6, 3, 4), (4, 1, 3), (4, 4, 3), (8, 2, 1)])
def test_stacked_query_heads_attend_as_transformers_does(heads, kv_heads, queries):
    """Each query head reads its own key/value head, under a left-padded causal mask with
    cached keys before the queries; one query, or one query head per key/value head, goes to
    transformers' function itself."""
    torch.manual_seed(0)
    batch, cached, dim = 3, 7, 16
    keys = cached + queries
    query = torch.randn(batch, heads, queries, dim)
    key, value = torch.randn(batch, kv_heads, keys, dim), torch.randn(batch, kv_heads, keys, dim)
    causal = torch.ones(queries, keys, dtype=torch.bool).tril(cached)
    padding = torch.arange(keys)[None, :] >= torch.tensor([0, 2, 5])[:, None]  # rows padded on the left
    mask = (causal[None] & padding[:, None, :])[:, None]  # (batch, 1, queries, keys)
    module = _Attention(heads // kv_heads)
    got, _ = stacked_gqa_sdpa(module, query, key, value, mask, scaling=dim**-0.5)
    expected, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=dim**-0.5)
    assert got.shape == expected.shape == (batch, queries, heads, dim)
    assert torch.allclose(got, expected, atol=1e-5)
