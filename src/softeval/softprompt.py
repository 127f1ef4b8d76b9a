"""The soft prompt: L learnable vectors in a frozen model's input-embedding space.

It is placed after BOS (for models that use one) and before the rendered prompt. Initial vectors
always come through the model's own input-embedding module, so models that scale their
embeddings (Gemma multiplies by sqrt(hidden)) start from vectors of the right size.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from softeval.errors import SoftevalError
from softeval.models import LoadedModel

Init = Literal["vocab", "text", "random"]


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


def save_soft_prompt(path: Path, vectors: torch.Tensor, metadata: dict) -> None:
    """safetensors with string metadata (model identity, task, config, steps, metrics as JSON)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    save_file({"soft_prompt": vectors.detach().cpu().contiguous()}, str(tmp), metadata={"softeval": json.dumps(metadata)})
    tmp.replace(path)


def load_soft_prompt(path: str | Path, lm: LoadedModel | None = None) -> tuple[torch.Tensor, dict]:
    """The vectors and their metadata; with `lm`, checks the prompt was made for that model."""
    path = Path(path)
    if path.is_dir():
        path = path / "soft_prompt.safetensors"
    if not path.is_file():
        raise SoftevalError(f"soft prompt not found: {path}; give the file or folder `softeval tune` wrote")
    try:
        with safe_open(str(path), framework="pt") as f:
            vectors = f.get_tensor("soft_prompt")
            metadata = json.loads((f.metadata() or {}).get("softeval", "{}"))
    except Exception as exc:  # noqa: BLE001 - a corrupt file can fail in several ways
        raise SoftevalError(f"cannot read soft prompt {path}: {str(exc)[:200]}") from exc
    if lm is not None:
        made_for = metadata.get("model", {})
        if vectors.shape[1] != lm.hidden_size:
            raise SoftevalError(
                f"soft prompt {path} has hidden size {vectors.shape[1]} but model {lm.name} has {lm.hidden_size}; "
                "tune a prompt for this model"
            )
        keys = ("model_type", "n_parameters", "vocab_size")
        if made_for and any(made_for.get(k) != lm.identity.get(k) for k in keys):
            raise SoftevalError(
                f"soft prompt {path} was tuned for model '{made_for.get('spec')}', not '{lm.identity['spec']}'; "
                "tune a prompt for this model"
            )
    return vectors, metadata
