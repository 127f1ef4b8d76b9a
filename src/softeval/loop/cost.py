"""What an evaluation costs: its wall time, and its FLOPs estimated from the positions the model's
decoder processed.

A forward pass costs about 2 x N FLOPs per position, N the parameters outside the input
embeddings (the matrix products; attention's own products and the LM head's partial use are
left out). Tuning a soft prompt or an adapter adds a backward pass through the frozen model,
about 2 x N again per position (gradients of the activations; the frozen weights get none). The
positions are counted at the decoder's forward, where the fast path and the model's own forward
both pass, padding included, since padded positions are computed too.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch


@dataclass
class Positions:
    """Positions the decoder processed: all of them, and those of passes a backward pass follows."""

    forward: int = 0
    with_grad: int = 0

    def flops(self, n_parameters: int) -> float:
        return 2.0 * n_parameters * (self.forward + self.with_grad)


@contextmanager
def counted_positions(network: torch.nn.Module) -> Iterator[Positions]:
    """Count the positions each forward pass of the network's decoder processes in the block."""
    counted = Positions()
    decoder = network.get_decoder() if hasattr(network, "get_decoder") else network

    def count(_module, args, kwargs) -> None:
        inputs = kwargs.get("inputs_embeds")
        if inputs is None:
            inputs = kwargs.get("input_ids", args[0] if args else None)
        if inputs is None:
            return
        positions = int(inputs.shape[0]) * int(inputs.shape[1]) if inputs.dim() >= 2 else int(inputs.numel())
        counted.forward += positions
        if torch.is_grad_enabled():  # the tuning loss: its backward pass follows (validation runs without grad)
            counted.with_grad += positions

    handle = decoder.register_forward_pre_hook(count, with_kwargs=True)
    try:
        yield counted
    finally:
        handle.remove()


def compute_parameters(network: torch.nn.Module) -> int:
    """The parameters a position's matrix products use: all but the input embeddings."""
    embeddings = network.get_input_embeddings().weight if hasattr(network, "get_input_embeddings") else None
    return sum(p.numel() for p in network.parameters() if p is not embeddings)


def flops_text(flops: float | None) -> str:
    """FLOPs as a person reads them: 3.2 TFLOP."""
    if flops is None:
        return "FLOPs unknown"
    for unit, size in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if flops >= size:
            return f"{flops / size:.1f} {unit}"
    return f"{flops:.0f} FLOP"
