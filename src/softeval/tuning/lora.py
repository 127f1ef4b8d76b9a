"""The LoRA baseline: low-rank adapters on the attention projections of a frozen model.

The projections are found in the model itself (`default_targets`): the linear layers of each
decoder layer's token mixer (its attention, or a state-space model's mixer), whatever the
architecture names them (`q_proj`, GPT-2's `c_attn`, GPT-NeoX's `query_key_value`, Phi-3's
`qkv_proj`, Mamba's `in_proj`), so one study can tune LoRA on models of several families.
Targets given in the settings replace them.

An adapter is tuned exactly like a soft prompt (same tuning split, steps, batches, answer-only loss
and validation curve; see `tuner.py`) and evaluated by the same pipeline. PEFT injects its layers
into the loaded model in place, so the engine runs the adapted model unchanged; `unload` puts the
original layers back, and the model serves plain cells again.

An adapter folder is a PEFT adapter (`peft.PeftModel.from_pretrained(model, folder)` loads it):
adapter_config.json, then adapter_model.safetensors, whose metadata records the provenance. The
weights file is written last and atomically: where it exists, the adapter is complete.
"""

from __future__ import annotations

import hashlib
import json
import re
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
# class names of the modules that mix tokens in a decoder layer: attention, or an SSM's mixer
TOKEN_MIXER = re.compile(r"attention|attn|mixer", re.IGNORECASE)
# PEFT refuses LoRA on a state-space mixer's output projection: Mamba's fused kernels read its
# weight directly, past any adapter
SSM_UNADAPTABLE = {"out_proj"}


def default_targets(lm: LoadedModel) -> list[str]:
    """The LoRA targets of a model: the linear layers directly inside each token mixer of its
    text decoder that its forward calls (Mamba's reads `dt_proj`'s weight itself, past any
    adapter), by their shortest names that reach no other layer (as PEFT matches names: the whole
    name, or its end after a dot), in the order the model holds them."""
    from transformers.pytorch_utils import Conv1D

    model = lm.model
    decoder = model.get_decoder()
    prefix = next(name for name, module in model.named_modules() if module is decoder)
    linear = (torch.nn.Linear, Conv1D)
    mixers: list[str] = []
    for name, module in decoder.named_modules():
        outermost = not any(name.startswith(f"{outer}.") for outer in mixers)
        # a module named like a mixer that holds no projection itself (Jamba's
        # AttentionDecoderLayer) is a layer around one: its mixer lies further in
        holds_projections = any(isinstance(child, linear) for child in module.children())
        if name and outermost and holds_projections and TOKEN_MIXER.search(type(module).__name__):
            mixers.append(name)
    candidates = {}
    for mixer in mixers:
        state_space = "mixer" in type(decoder.get_submodule(mixer)).__name__.lower()
        for child, layer in decoder.get_submodule(mixer).named_children():
            if isinstance(layer, linear) and not (state_space and child in SSM_UNADAPTABLE):
                candidates[f"{prefix}.{mixer}.{child}".lstrip(".")] = layer
    projections = [name for name in candidates if name in _called(model, candidates)]
    if not projections:
        raise SoftevalError(f"{lm.name}: no attention or mixer projections found for LoRA; set lora targets to its layer names")
    names = [name for name, _ in model.named_modules()]
    return list(dict.fromkeys(_shortest_unique(projection, set(projections), names) for projection in projections))


def _called(model, layers: dict[str, torch.nn.Module]) -> set[str]:
    """Which of `layers` a forward pass of the model over one token calls."""
    called: set[str] = set()
    hooks = [layer.register_forward_hook(lambda *_, name=name: called.add(name)) for name, layer in layers.items()]
    try:
        with torch.no_grad():
            model(input_ids=torch.zeros(1, 1, dtype=torch.long, device=next(model.parameters()).device), use_cache=False)
    finally:
        for hook in hooks:
            hook.remove()
    return called


def _shortest_unique(projection: str, projections: set[str], names: list[str]) -> str:
    """The layer's own name, or its mixer's and its own (`attn.c_proj`), where that names only
    layers in `projections`; else its full name (a vision tower's attention shares the names)."""
    parts = projection.split(".")
    for size in (1, 2):
        ending = ".".join(parts[-size:])
        reached = [name for name in names if name == ending or name.endswith(f".{ending}")]
        if all(name in projections for name in reached):
            return ending
    return projection


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
        # GPT-2's projections are Conv1D layers, for which PEFT transposes the adapter itself
        warnings.filterwarnings("ignore", message="fan_in_fan_out is set to False", category=UserWarning)
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
        # the targets resolved for the model, where the settings left them to it
        targets = self.metadata.get("lora_targets") or tuned.get("lora_targets")
        return {"rank": tuned.get("lora_rank"), "alpha": tuned.get("lora_alpha"), "targets": targets}

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
