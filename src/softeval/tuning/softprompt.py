"""The soft prompt: L learnable vectors in a frozen model's input-embedding space.

It is placed after BOS (for models that use one) and before the rendered prompt. Initial vectors
always come through the model's own input-embedding module, so models that scale their
embeddings (Gemma multiplies by sqrt(hidden)) start from vectors of the right size.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save

from softeval._io import write_bytes_atomic
from softeval.errors import SoftevalError
from softeval.models import LoadedModel
from softeval.tasks import TaskSpec
from softeval.tuning.config import Init, soft_prompt_file


def initial_vectors(lm: LoadedModel, length: int, init: Init = "vocab", text: str | None = None, seed: int = 0) -> torch.Tensor:
    """(length, hidden) starting vectors: embeddings of sampled real tokens, of a text, or random."""
    embed = lm.model.get_input_embeddings()
    generator = torch.Generator().manual_seed(seed)
    device = embed.weight.device
    with torch.no_grad():
        if init == "vocab":
            # sample from the first part of the vocabulary, where ordinary, frequent tokens sit
            pool = min(5000, embed.weight.shape[0])
            ids = torch.randint(0, pool, (length,), generator=generator)
            vectors = embed(ids.to(device))
        elif init == "text":
            if not text:
                raise SoftevalError("--init text needs --init-text with the words to start from")
            ids = lm.encode(text)
            ids = (ids * (length // max(len(ids), 1) + 1))[:length]  # repeat or cut to L tokens
            vectors = embed(torch.tensor(ids, device=device))
        elif init == "random":
            scale = embed(torch.arange(min(1000, embed.weight.shape[0]), device=device)).std()
            vectors = torch.randn(length, lm.hidden_size, generator=generator).to(device) * scale
        else:
            raise SoftevalError(f"unknown init '{init}'; choose vocab, text or random")
    return vectors.detach().float().clone()


@dataclass
class SoftPrompt:
    """Tuned vectors with the record of their making: model, task, chat mode, data and settings."""

    vectors: torch.Tensor  # (L, hidden)
    metadata: dict
    path: Path | None = None

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.vectors.detach().float().cpu().contiguous().numpy().tobytes()).hexdigest()

    def identity(self) -> dict:
        """What results.json records about the prompt a cell used."""
        meta = self.metadata
        return {
            "path": str(self.path.resolve()) if self.path else None,
            "sha256": self.sha256,
            "length": self.vectors.shape[0],
            "task": meta.get("task"),
            "chat": meta.get("chat"),
            "produced": meta.get("produced"),
        }

    @property
    def name(self) -> str:
        return f"soft prompt {self.path}" if self.path else "the soft prompt"

    def check_shape(self, lm: LoadedModel) -> None:
        if self.vectors.ndim != 2 or self.vectors.shape[1] != lm.hidden_size:
            raise SoftevalError(
                f"{self.name} has shape {tuple(self.vectors.shape)} but model {lm.name} takes "
                f"(L, {lm.hidden_size}); tune a prompt for this model"
            )

    def check(self, lm: LoadedModel, spec: TaskSpec, chat: bool) -> None:
        """A clear error when the prompt was tuned for another model, task or chat mode. A prompt
        that records another model is named by it, before its width would be."""
        made_for = self.metadata.get("model")
        if made_for and model_difference(made_for, lm.identity):
            check_made_for(self.name, self.metadata, lm, spec, chat)
        self.check_shape(lm)
        check_made_for(self.name, self.metadata, lm, spec, chat)


def check_made_for(where: str, metadata: dict, lm: LoadedModel, spec: TaskSpec, chat: bool) -> None:
    """A clear error when a tuned prompt or adapter (`where` names it) was made for another model,
    task (or version of its spec) or chat mode than it is used with."""
    differs = model_difference(metadata.get("model", {}), lm.identity)
    if differs == WEIGHTS_KEY:
        before = "other weights" if metadata.get("model", {}).get(WEIGHTS_KEY) else "weights it did not record (tuned by an older softeval)"
        raise SoftevalError(f"{where} was tuned for {before} of model '{lm.identity['spec']}', whose weight files have changed since; "
                            "tune one for these weights")
    if differs:
        raise SoftevalError(
            f"{where} was tuned for model '{metadata.get('model', {}).get('spec')}', "
            f"not '{lm.identity['spec']}' ({differs} differs); tune one for this model"
        )
    check_task_made_for(where, metadata, spec, chat)


def check_task_made_for(where: str, metadata: dict, spec: TaskSpec, chat: bool) -> None:
    """The task and chat-mode part of `check_made_for`: it needs no model, so it runs before one loads."""
    task = metadata.get("task")
    if not isinstance(task, dict):
        raise SoftevalError(f"{where} does not record its task (written by an older softeval); tune it again")
    if task.get("name") != spec.name:
        raise SoftevalError(f"{where} was tuned for task '{task.get('name')}', not '{spec.name}'; tune one for this task")
    if task.get("spec_sha256") != spec.sha256():
        raise SoftevalError(f"{where} was tuned on another version of task '{spec.name}' (its spec changed); tune it again")
    if bool(metadata.get("chat")) != chat:
        tuned = "with" if metadata.get("chat") else "without"
        raise SoftevalError(f"{where} was tuned {tuned} the chat template; evaluate {tuned} --chat or tune one for this mode")


# Model identity keys that must agree for a prompt to be used (dtype and device may differ).
MODEL_KEYS = ("model_type", "n_parameters", "vocab_size", "hidden_size", "config_sha256", "gguf_sha256", "folder", "hub_id", "gguf")
# A hub model named with a revision is also that revision at the commit it resolved to (a branch
# that moves is another model); a model named without one keeps the identity it always had.
REVISION_KEYS = ("revision", "commit")
# A local folder or GGUF file is also its weights (a checkpoint rewritten in place is another
# model); an identity recorded before weights were hashed lacks the key, and so differs.
WEIGHTS_KEY = "weights_sha256"


def identity_keys(identity: dict) -> tuple[str, ...]:
    """The keys that say which model an identity is."""
    weights = (WEIGHTS_KEY,) if identity.get(WEIGHTS_KEY) else ()
    return MODEL_KEYS + weights + (REVISION_KEYS if identity.get("revision") else ())


def model_difference(made_for: dict, model: dict) -> str | None:
    """The first identity key on which two models differ, or None when they are the same model."""
    keys = dict.fromkeys(identity_keys(made_for) + identity_keys(model))
    return next((k for k in keys if made_for.get(k) != model.get(k)), None)


def save_soft_prompt(path: Path, vectors: torch.Tensor, metadata: dict) -> None:
    """safetensors with string metadata (model identity, task, config, steps, metrics as JSON)."""
    tensors = {"soft_prompt": vectors.detach().cpu().contiguous()}
    write_bytes_atomic(path, save(tensors, metadata={"softeval": json.dumps(metadata)}))


def load_soft_prompt(path: str | Path) -> SoftPrompt:
    """The vectors and the record of their making, from a file or the folder `softeval tune` wrote."""
    path = soft_prompt_file(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            vectors = f.get_tensor("soft_prompt")
            metadata = json.loads((f.metadata() or {}).get("softeval", "{}"))
    except Exception as exc:  # noqa: BLE001 - a corrupt file can fail in several ways
        raise SoftevalError(f"cannot read soft prompt {path}: {str(exc)[:200]}; give a soft_prompt.safetensors that `softeval tune` wrote") from exc
    return SoftPrompt(vectors, metadata, path)


