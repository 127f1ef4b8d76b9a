"""Grouped-query SDPA with stacked query heads against transformers' own SDPA."""

from __future__ import annotations

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from softeval.engine import attention
from softeval.engine.attention import shared_prefix_attention, stacked_gqa_sdpa


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


@pytest.mark.parametrize("heads, kv_heads, queries", [(8, 2, 5), (6, 3, 1), (4, 4, 3), (9, 3, 1)])
@pytest.mark.parametrize("masked", [True, False], ids=["padded", "no-mask"])
@pytest.mark.parametrize("kernel", ["flash", "matmul"])
def test_a_shared_prefix_attends_as_if_each_row_held_a_copy(heads, kv_heads, queries, masked, kernel, monkeypatch):
    """Attention over a prefix kept once and each row's own keys equals SDPA over every row's
    copy of the prefix followed by its own keys, with the rows' own padding and the prefix
    keys outside a window masked, through SDPA's CPU kernel and through plain matrix products
    (other devices)."""
    if kernel == "matmul":
        monkeypatch.setattr(attention, "_flash_cpu", None)
    torch.manual_seed(0)
    batch, prefix, cached, dim = 3, 6, 5, 16
    own = cached + queries
    query = torch.randn(batch, heads, queries, dim)
    prefix_keys, prefix_values = torch.randn(1, kv_heads, prefix, dim), torch.randn(1, kv_heads, prefix, dim)
    key, value = torch.randn(batch, kv_heads, own, dim), torch.randn(batch, kv_heads, own, dim)
    causal = torch.ones(queries, own, dtype=torch.bool).tril(cached)
    # the last row is all padding up to its last query: its earlier queries see only the prefix
    padding = torch.arange(own)[None, :] >= torch.tensor([0, 2, own - 1] if masked else [0, 0, 0])[:, None]
    mask = (causal[None] & padding[:, None, :])[:, None]  # (batch, 1, queries, own keys)
    # a sliding window: the later a row's query, the fewer early prefix keys it sees
    window = torch.arange(prefix)[None, None, :] >= torch.arange(queries)[None, :, None] + torch.tensor([0, 1, 2])[:, None, None]
    window = window[:, None]  # (batch, 1, queries, prefix)
    got = shared_prefix_attention(query, key, value, mask if masked else None, prefix_keys, prefix_values, dim**-0.5, window)
    whole = torch.cat([window, mask], dim=-1)
    module = _Attention(heads // kv_heads)
    expected, _ = sdpa_attention_forward(
        module,
        query,
        torch.cat([prefix_keys.expand(batch, -1, -1, -1), key], dim=2),
        torch.cat([prefix_values.expand(batch, -1, -1, -1), value], dim=2),
        whole,
        scaling=dim**-0.5,
    )
    assert got.shape == expected.shape == (batch, queries, heads, dim)
    assert torch.allclose(got, expected, atol=1e-5)
