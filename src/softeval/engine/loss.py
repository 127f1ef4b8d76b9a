"""The tuning loss: the summed cross-entropy of each target after its prompt, with the LM head's
logits computed a chunk of positions at a time (recomputed in the backward pass, not kept).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.utils.checkpoint import checkpoint

from softeval.engine.forward import Forward

# Target positions of the tuning loss whose vocabulary logits are held at once.
LOSS_CHUNK = 256


class TuningLoss:
    """`target_loss`: the tuning loss, differentiable in the soft prompt and adapter weights."""

    def __init__(self, forward: Forward):
        self.forward = forward

    def target_loss(self, sequences: Sequence[tuple[list[int], list[int]]]) -> torch.Tensor:
        """Summed cross-entropy of each target after its prompt (soft prompt included), one
        left-padded batch; differentiable in the soft prompt and any adapter weights."""
        targets = [target for _, target in sequences]
        embeds, mask, positions = self.forward.inputs([prompt + target for prompt, target in sequences])
        hidden = self.forward.decoder(inputs_embeds=embeds, attention_mask=mask, position_ids=positions).last_hidden_state
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
        return torch.nn.functional.cross_entropy(self.forward.logits(states), gold, reduction="sum")
