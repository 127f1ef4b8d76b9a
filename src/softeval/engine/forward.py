"""The fast path's shared part, `Forward`: the model and its settings, batches cut by positions,
left-padded inputs with the soft prompt after BOS and each row's own position ids, a shared prefix
encoded once, the decoder run apart from its LM head, and the LM head only where a token is chosen
or scored. Generation, option scoring and the tuning loss each hold the one `Forward` of their
engine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from softeval.engine.attention import PrefixKeys, stacked_gqa
from softeval.engine.logits import LogitTransform
from softeval.errors import SoftevalError
from softeval.models import LoadedModel

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


def cut_batches(order: list[int], widths: Sequence[int], batch_size: int, token_budget: int, slack: float | None = None) -> list[list[int]]:
    """`order` cut into consecutive batches of at most `batch_size` rows whose rows x widest row
    stays within `token_budget`, and whose padding costs at most `slack` (default PADDING_SLACK)
    of their tokens; a row wider than the budget goes alone."""
    slack = PADDING_SLACK if slack is None else slack
    batches: list[list[int]] = []
    batch: list[int] = []
    widest = tokens = 0
    for i in order:
        grown = max(widest, widths[i])
        padded = (len(batch) + 1) * grown
        too_wide = padded > token_budget or padded > (1 + slack) * (tokens + widths[i])
        if batch and (len(batch) == batch_size or too_wide):
            batches.append(batch)
            batch, grown, tokens = [], widths[i], 0
        batch.append(i)
        widest, tokens = grown, tokens + widths[i]
    if batch:
        batches.append(batch)
    return batches


def longest_first(widths: Sequence[int], batch_size: int, token_budget: int, slack: float | None = None) -> list[list[int]]:
    """The indices of `widths`, longest first (so memory peaks early and predictably), cut into
    batches as `cut_batches` cuts them."""
    order = sorted(range(len(widths)), key=lambda i: -widths[i])
    return cut_batches(order, widths, batch_size, token_budget, slack)


def soft_prompt_at(sequence: list[int], bos: int | None) -> int:
    """Where a soft prompt goes in a sequence: after its BOS token, if it starts with one."""
    return 1 if bos is not None and sequence and sequence[0] == bos else 0


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


def alibi_slopes(decoder) -> torch.Tensor | None:
    """Each head's ALiBi slope, read from the decoder's own `build_alibi_tensor` (a key one
    position on has the slope as its bias), or None where the decoder has none."""
    build = getattr(decoder, "build_alibi_tensor", None)
    heads = getattr(decoder, "num_heads", None)
    if build is None or heads is None:
        return None
    return build(torch.ones(1, 2, dtype=torch.long), heads, torch.float32)[:, 0, 1].clone()


def _common_prefix_length(sequences: Sequence[list[int]]) -> int:
    first, n = sequences[0], min(len(s) for s in sequences)
    for i in range(n):
        token = first[i]
        if any(s[i] != token for s in sequences):
            return i
    return n


class Forward:
    """A model behind a soft prompt, run the fast path's way: its inputs, its decoder and its LM
    head apart, and what they computed (positions and LM head rows, for throughput figures)."""

    def __init__(
        self,
        lm: LoadedModel,
        soft_prompt: torch.Tensor | None = None,  # (L, hidden), placed after BOS in every sequence
        batch_size: int | None = None,  # the most rows of a batch; None: as many as the token budget allows
        token_budget: int = TOKEN_BUDGET,  # rows x padded width (soft prompt included) of a batch
        logits_chunk: int = 256,
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
        self.logits_chunk = logits_chunk
        self.device = next(lm.model.parameters()).device
        # In a decoding cache, sliding-window attention counts slots, not positions (a row's own
        # slots, without holes, are as far apart as their positions); a shared prefix is attended
        # to by positions. (Option scoring builds its own window mask from positions.)
        self.window = getattr(self.text_config, "sliding_window", None)
        self.layer_types = getattr(self.text_config, "layer_types", None)  # None: every layer alike
        self.sliding_layers = tuple(layer.is_sliding for layer in DynamicCache(config=self.text_config).layers)
        # Qwen configs set a window that no layer uses
        self.slides = self.window is not None and (self.layer_types is None or "sliding_attention" in self.layer_types)
        # Option scoring hands the model a 4D mask of its own; other kernels (flash attention)
        # would read it as a padding mask and score wrongly.
        self.attention = self.decoder.config._attn_implementation
        if self.attention not in ("sdpa", "eager"):
            raise SoftevalError(
                f"{lm.name}: attention implementation {self.attention!r} is not supported; load the model with 'sdpa' or 'eager'"
            )
        self.transform = LogitTransform.of(lm.model)
        # ALiBi slopes, one per head, where the decoder builds its ALiBi biases from the 2D
        # attention mask through `build_alibi_tensor` (BLOOM): with a 4D mask of the engine's own
        # the engine hands it biases from each key's position instead
        self.alibi_slopes = alibi_slopes(self.decoder)
        # positions run through the transformer and through the LM head, padding included:
        # the work actually done, for throughput figures
        self.positions_computed = 0
        self.logit_rows_computed = 0

    @property
    def n_soft(self) -> int:
        return 0 if self.soft_prompt is None else self.soft_prompt.shape[0]

    @torch.inference_mode()
    def next_token_logprobs(self, prompts: Sequence[list[int]]) -> torch.Tensor:
        """(prompts, vocabulary) log-probabilities of the token after each prompt, the prompts
        encoded together, left-padded, as generation encodes prompts that share no prefix."""
        embeds, mask, positions = self.inputs(list(prompts))
        hidden = self.run(embeds, mask, positions, DynamicCache(config=self.text_config))[:, -1]
        return torch.log_softmax(self.logits(hidden), dim=-1)

    def length_buckets(self, lengths: list[int]) -> list[list[int]]:
        """Batches of similar length, longest first."""
        return longest_first([n + self.n_soft for n in lengths], self.batch_size, self.token_budget)

    def encode_prefix(self, sequences: Sequence[list[int]], within_window: int | None) -> SharedPrefix | None:
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
        self.run(embeds, mask, positions, cache)
        return SharedPrefix(shared, cache, mask, positions)

    def left_pad(self, sequences: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
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
        embeds = self.embed(ids.to(self.device))
        if soft is not None:
            # row by row the soft positions are consecutive, so they take soft[0..L-1] in order
            slots = is_soft.to(self.device)
            # cast where used, not once: during tuning the prompt changes in place between calls
            soft = soft.to(device=embeds.device, dtype=embeds.dtype)
            embeds = embeds.masked_scatter(slots[..., None], soft.repeat(len(sequences), 1))
        return embeds, mask.to(self.device), positions.to(self.device)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        # through the model's own embedding module: Gemma scales embeddings by sqrt(hidden)
        return self.model.get_input_embeddings()(ids)

    def run(
        self, embeds, mask, positions, cache, prefix: SharedPrefix | None = None, key_positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The decoder's last hidden states; with `prefix`, `cache` holds only the rows' own
        tokens and every row attends to the prefix's cache too. `key_positions` (rows, keys:
        the cache's and the new ones) go with a 4D mask: where the model adds ALiBi biases,
        they are taken from these positions rather than counted along the mask."""
        self.positions_computed += embeds.shape[0] * embeds.shape[1]
        with stacked_gqa(self.decoder.config, None if prefix is None else self._prefix_keys(prefix, positions)), self._alibi_at(key_positions):
            out = self.decoder(
                inputs_embeds=embeds, attention_mask=mask, position_ids=positions, cache=cache, use_cache=cache is not None
            )
        return out.last_hidden_state

    @contextmanager
    def _alibi_at(self, key_positions: torch.Tensor | None) -> Iterator[None]:
        """Within the block, the decoder's ALiBi biases (if it has them) are each head's slope
        times each key's position in `key_positions`, as the model builds them from a 2D mask's
        running count."""
        if self.alibi_slopes is None or key_positions is None:
            yield
            return
        slopes = self.alibi_slopes.to(key_positions.device)

        def biases(attention_mask, num_heads, dtype):
            alibi = slopes[None, :, None] * key_positions[:, None, :].float()  # (rows, heads, keys)
            return alibi.reshape(-1, 1, key_positions.shape[1]).to(dtype)

        self.decoder.build_alibi_tensor = biases
        try:
            yield
        finally:
            del self.decoder.build_alibi_tensor  # the class's own again

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

    def greedy(self, hidden: torch.Tensor) -> torch.Tensor:
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

    def token_logprobs(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """log p(target) for each row, computing the vocabulary in chunks to bound memory."""
        out = []
        for s in range(0, len(targets), self.logits_chunk):
            logits = self.logits(hidden[s : s + self.logits_chunk])
            picked = logits.gather(1, targets[s : s + self.logits_chunk, None])[:, 0]
            out.append(picked - torch.logsumexp(logits, dim=-1))
        return torch.cat(out)
