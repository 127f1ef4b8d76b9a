"""The LoRA baseline: low-rank adapters on the attention projections of a frozen model.

An adapter is tuned exactly like a soft prompt (same tuning split, steps, batches, answer-only loss
and validation curve; see `tune.py`) and evaluated by the same pipeline. PEFT injects its layers
into the loaded model in place, so the engine runs the adapted model unchanged; `unload` puts the
original layers back, and the model serves plain cells again.

An adapter folder is a PEFT adapter (`peft.PeftModel.from_pretrained(model, folder)` loads it):
adapter_config.json, then adapter_model.safetensors, whose metadata records the provenance. The
weights file is written last and atomically: where it exists, the adapter is complete.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save

from softeval._io import write_bytes_atomic, write_json_atomic
from softeval.errors import SoftevalError
from softeval.models import LoadedModel

WEIGHTS = "adapter_model.safetensors"


def lora_config(rank: int, alpha: int, targets: list[str]):
    from peft import LoraConfig

    # no dropout: a tuning run is then a function of (seed, step), and resumes to the same result
    return LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets), lora_dropout=0.0, bias="none")


def peft_wrapped(model, config):
    """`peft.get_peft_model`, without the FutureWarning it raises on transformers 5: PEFT asks a
    deprecated question (is_gradient_checkpointing) that is not the user's to fix."""
    from peft import get_peft_model

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing", category=FutureWarning)
        return get_peft_model(model, config)


@contextmanager
def lora_applied(lm: LoadedModel, config, weights: dict[str, torch.Tensor] | None = None, *, seed: int = 0) -> Iterator:
    """The model with LoRA layers injected (fresh ones seeded by `seed`, or `weights`), as a PEFT
    model; the original layers are back when the block ends, whatever happens in it."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)  # LoRA's A matrices start random: the seed makes a run repeatable
        try:
            peft_model = peft_wrapped(lm.model, config)
        except ValueError as exc:  # no module matches the targets
            raise SoftevalError(f"cannot add LoRA layers to {lm.name}: {_first_line(exc)}; set lora targets to its projection names") from exc
    try:
        if weights is not None:
            _load_weights(peft_model, weights)
        yield peft_model
    finally:
        peft_model.unload()
        lm.model.requires_grad_(False)


def _load_weights(peft_model, weights: dict[str, torch.Tensor]) -> None:
    """Load tuned weights, refusing any mismatch: PEFT loads leniently, and an adapter missing
    its weights would silently score as the untouched base model."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict

    expected = set(get_peft_model_state_dict(peft_model))
    if set(weights) != expected:
        missing, extra = sorted(expected - set(weights)), sorted(set(weights) - expected)
        raise SoftevalError(
            f"LoRA adapter weights do not fit the model ({len(missing)} missing, e.g. {missing[:1]}; "
            f"{len(extra)} unexpected, e.g. {extra[:1]}); delete the adapter folder to tune it again"
        )
    set_peft_model_state_dict(peft_model, weights)


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


def trainable_parameters(peft_model) -> dict[str, torch.nn.Parameter]:
    return {name: p for name, p in peft_model.named_parameters() if p.requires_grad}


@dataclass
class Adapter:
    """Tuned LoRA weights (PEFT's key names) with the record of their making."""

    weights: dict[str, torch.Tensor]
    config: dict  # adapter_config.json
    metadata: dict
    path: Path

    @property
    def sha256(self) -> str:
        """The weights and the LoRA settings that give them their meaning (rank, scale, targets)."""
        digest = hashlib.sha256(json.dumps(self.settings, sort_keys=True).encode())
        for name in sorted(self.weights):
            digest.update(name.encode())
            digest.update(self.weights[name].detach().float().cpu().contiguous().numpy().tobytes())
        return digest.hexdigest()

    @property
    def n_parameters(self) -> int:
        return sum(t.numel() for t in self.weights.values())

    @property
    def settings(self) -> dict:
        """Rank, alpha and targets as the weights file's own metadata records them (the file is
        written last, so these always belong to its weights)."""
        tuned = self.metadata.get("config", {})
        return {"rank": tuned.get("lora_rank"), "alpha": tuned.get("lora_alpha"), "targets": tuned.get("lora_targets")}

    def peft_config(self):
        settings = self.settings
        if None in settings.values():
            raise SoftevalError(f"LoRA adapter {self.path} does not record its settings; delete it to tune it again")
        return lora_config(settings["rank"], settings["alpha"], settings["targets"])

    def identity(self) -> dict:
        meta = self.metadata
        return {"path": str(self.path.resolve()), "sha256": self.sha256, "task": meta.get("task"), "chat": meta.get("chat")}


def save_adapter(folder: Path, peft_model, metadata: dict) -> None:
    """A PEFT adapter folder; the weights (with `metadata`) last."""
    from peft import get_peft_model_state_dict

    config = peft_model.peft_config["default"].to_dict()
    config = {k: sorted(v) if isinstance(v, set) else v for k, v in config.items()}
    write_json_atomic(folder / "adapter_config.json", config)
    weights = {k: v.detach().cpu().contiguous() for k, v in get_peft_model_state_dict(peft_model).items()}
    write_bytes_atomic(folder / WEIGHTS, save(weights, metadata={"format": "pt", "softeval": json.dumps(metadata)}))


def load_adapter(folder: str | Path) -> Adapter:
    folder = Path(folder)
    path = folder / WEIGHTS
    if not path.is_file():
        raise SoftevalError(f"LoRA adapter not found: {path}; tune one with `softeval run --method lora`")
    try:
        config = json.loads((folder / "adapter_config.json").read_text(encoding="utf-8"))
        with safe_open(str(path), framework="pt") as f:
            weights = {k: f.get_tensor(k) for k in f.keys()}
            metadata = json.loads((f.metadata() or {}).get("softeval", "{}"))
    except Exception as exc:  # noqa: BLE001 - a corrupt folder can fail in several ways
        raise SoftevalError(f"cannot read LoRA adapter {folder}: {_first_line(exc)}; delete it to tune it again") from exc
    return Adapter(weights, config, metadata, folder)
