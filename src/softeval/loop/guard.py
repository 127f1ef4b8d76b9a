"""What an evaluation inside a training loop must leave as it found it.

`training_untouched(model)` is a block in which the model is frozen and in eval mode, gradients
are on (a soft prompt is tuned, even where a trainer calls it in inference mode) and autocast is
off (scores are those of the model's own dtype). When the block ends, however it ends,
everything training depends on is as it was: every module's train/eval mode, every parameter's
`requires_grad` and `.grad`, the buffers (the same tensors, with their values), grad and
inference mode, autocast, and every random generator (Python's, NumPy's, torch's on the CPU and
on each CUDA device). The parameters themselves are never written: evaluation only reads them,
and the tests check the final weights of a training run bitwise, with and without evaluations
inside it.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class TrainingState:
    """A snapshot of what an evaluation could change, taken before it."""

    modes: list[tuple[torch.nn.Module, bool]]
    requires_grad: list[tuple[torch.nn.Parameter, bool]]
    grads: list[tuple[torch.nn.Parameter, torch.Tensor | None]]
    buffers: list[tuple[torch.nn.Module, str, torch.Tensor, torch.Tensor]]  # module, name, the tensor, a copy of its values
    python_rng: object
    numpy_rng: dict
    torch_rng: torch.Tensor
    cuda_rng: list[torch.Tensor] | None

    @classmethod
    def of(cls, model: torch.nn.Module) -> TrainingState:
        parameters = list(model.parameters())
        return cls(
            modes=[(module, module.training) for module in model.modules()],
            requires_grad=[(p, p.requires_grad) for p in parameters],
            grads=[(p, p.grad) for p in parameters],
            # buffers are small in a language model (rotary frequencies, masks): a copy costs little;
            # kept by name, since a buffer may be registered anew (a rotary cache grown for a long prompt)
            buffers=[(module, name, b, b.detach().clone()) for module in model.modules() for name, b in module.named_buffers(recurse=False)],
            python_rng=random.getstate(),
            numpy_rng=np.random.get_state(legacy=False),
            torch_rng=torch.get_rng_state(),
            # only where CUDA is in use already: asking would start it in a CPU-only run
            cuda_rng=torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None,
        )

    def restore(self) -> None:
        for module, training in self.modes:
            module.training = training
        for parameter, wanted in self.requires_grad:
            parameter.requires_grad_(wanted)
        for parameter, grad in self.grads:
            parameter.grad = grad
        with torch.no_grad():
            for module, name, buffer, saved in self.buffers:
                if module._buffers.get(name) is not buffer:
                    module._buffers[name] = buffer
                if not torch.equal(buffer, saved):
                    buffer.copy_(saved)
        random.setstate(self.python_rng)
        np.random.set_state(self.numpy_rng)
        torch.set_rng_state(self.torch_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)


@contextmanager
def training_untouched(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """The model frozen, in eval mode, with gradients on and autocast off, for the block; on
    its end every part of the training state is as it was before (see the module's docstring)."""
    state = TrainingState.of(model)
    try:
        with ExitStack() as stack:
            # a trainer may call it inside inference mode (Lightning saves checkpoints in its
            # validation loop), where enable_grad alone leaves no gradient for a soft prompt
            stack.enter_context(torch.inference_mode(False))
            stack.enter_context(torch.enable_grad())
            for device in _autocast_devices():
                stack.enter_context(torch.autocast(device, enabled=False))
            model.eval()
            model.requires_grad_(False)
            yield model
    finally:
        state.restore()


def _autocast_devices() -> list[str]:
    """The device types whose autocast a training loop may have turned on around the call."""
    devices = ["cpu"]
    if torch.cuda.is_available():
        devices.append("cuda")
    return devices
