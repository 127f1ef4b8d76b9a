"""Shared fixtures: tiny random models with the real offline tokenizers, and the benchmark mirror."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    Gemma3TextConfig,
    LlamaConfig,
)

from softeval.models import load_model, prepare_alias

REPO = Path(__file__).resolve().parents[1]
MIRROR = Path(os.environ.get("SOFTEVAL_TEST_DATA", REPO.parent / "shared" / "benchmarks"))


def pytest_collection_modifyitems(items):
    if not MIRROR.is_dir():
        skip = pytest.mark.skip(reason=f"benchmark mirror not found at {MIRROR} (set SOFTEVAL_TEST_DATA)")
        for item in items:
            if "mirror" in item.fixturenames:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def mirror() -> Path:
    return MIRROR


@pytest.fixture(scope="session")
def tokenizer_dirs() -> dict[str, Path]:
    """Folders of the converted offline models (converted once into the cache)."""
    return {"llama": prepare_alias("smollm2-135m-instruct"), "gemma3": prepare_alias("gemma-3-270m")}


def _tiny_config(arch: str, vocab_size: int, tokenizer, window: int = 32):
    common = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        # wide initial weights make sharp, context-dependent next-token choices (no near-ties)
        initializer_range=0.3,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    if arch == "llama":
        return LlamaConfig(**common)
    # a short sliding window, so the mixed sliding/full attention layers are exercised
    return Gemma3TextConfig(
        **common, head_dim=16, sliding_window=window, query_pre_attn_scalar=16, layer_types=["sliding_attention", "full_attention"]
    )


@pytest.fixture(scope="session")
def tiny_model_dirs(tokenizer_dirs, tmp_path_factory) -> dict[str, Path]:
    """Randomly initialised llama and gemma3 models saved as local folders with real tokenizers.
    "gemma3" has a 32-token sliding window that test prompts outgrow; "gemma3-wide" one they do not."""
    dirs = {}
    for arch, source, window in [("llama", "llama", 0), ("gemma3", "gemma3", 32), ("gemma3-wide", "gemma3", 256)]:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dirs[source])
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(_tiny_config(source, len(tokenizer), tokenizer, window))
        folder = tmp_path_factory.mktemp(f"tiny-{arch}")
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        dirs[arch] = folder
    return dirs


@pytest.fixture(scope="session", params=["llama", "gemma3", "gemma3-wide"])
def tiny_lm(request, tiny_model_dirs):
    return load_model(str(tiny_model_dirs[request.param]), device="cpu")


@pytest.fixture(scope="session")
def tiny_llama(tiny_model_dirs):
    return load_model(str(tiny_model_dirs["llama"]), device="cpu")


@pytest.fixture(scope="session")
def tiny_gemma(tiny_model_dirs):
    return load_model(str(tiny_model_dirs["gemma3"]), device="cpu")
