"""What a model's own forward does to its LM head's output before the logits leave it.

The engine computes logits from hidden states itself, only where a token is chosen or scored, so
it must apply these transforms as the model would: Cohere multiplies its logits by
`logit_scale`, Granite divides them by `logits_scaling`, Gemma 2 and 3 squash them with a final
softcap. Generation, option scoring, validation and the tuning loss all take their logits
through one `LogitTransform`. A transform not listed here makes the engine's logits differ from
the model's, which the self-check at engine start measures (see `softeval.engine.selfcheck`): that
model then runs on the reference path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LogitTransform:
    scale: float = 1.0  # the logits are multiplied by it
    softcap: float | None = None  # then squashed into (-softcap, softcap)

    @classmethod
    def of(cls, model) -> LogitTransform:
        """The transform `model`'s forward applies, read off its (text) config."""
        config = model.config.get_text_config()
        scale = 1.0
        # MPT's config has a `logit_scale` too, which its forward does not use
        if config.model_type.startswith("cohere") and getattr(config, "logit_scale", None):
            scale *= float(config.logit_scale)
        if getattr(config, "logits_scaling", None):  # the Granite family
            scale /= float(config.logits_scaling)
        softcap = getattr(config, "final_logit_softcapping", None)
        return cls(scale, float(softcap) if softcap else None)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        if self.scale != 1.0:
            logits = logits * self.scale
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def record(self) -> dict:
        return {"scale": self.scale, "softcap": self.softcap}
