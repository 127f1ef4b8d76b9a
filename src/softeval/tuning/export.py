"""Export a soft prompt as a PEFT prompt-tuning adapter, so it runs wherever PEFT does.

PEFT places its virtual tokens before the whole input, while softeval places the soft prompt after
BOS. For a model that uses BOS the adapter therefore carries L + 1 virtual tokens, the first being
BOS's own embedding, and the text is given to the PEFT model without BOS
(`add_special_tokens=False`): the model then sees exactly what softeval feeds it.
"""

from __future__ import annotations

from pathlib import Path

import torch

from softeval._io import write_json_atomic
from softeval.models import LoadedModel
from softeval.tuning.lora import peft_wrapped


def export_peft(vectors: torch.Tensor, lm: LoadedModel, folder: str | Path) -> Path:
    """Write a folder that `peft.PeftModel.from_pretrained(model, folder)` loads."""
    from peft import PromptTuningConfig, TaskType

    folder = Path(folder)
    embed = lm.model.get_input_embeddings()
    virtual = vectors.detach().to(embed.weight.device, embed.weight.dtype)
    if lm.bos_token_id is not None:
        with torch.no_grad():
            bos = embed(torch.tensor([lm.bos_token_id], device=embed.weight.device))
        virtual = torch.cat([bos, virtual])
    config = PromptTuningConfig(
        task_type=TaskType.CAUSAL_LM,
        num_virtual_tokens=virtual.shape[0],
        token_dim=virtual.shape[1],
        base_model_name_or_path=lm.identity.get("spec"),
    )
    # prompt tuning wraps the model without changing its layers; the frozen model stays usable
    peft_model = peft_wrapped(lm.model, config)
    with torch.no_grad():
        peft_model.prompt_encoder["default"].embedding.weight.copy_(virtual)
    peft_model.save_pretrained(folder)
    record = {"bos_included": lm.bos_token_id is not None, "add_special_tokens": False, "model": lm.identity}
    write_json_atomic(folder / "softeval.json", record)
    return folder
