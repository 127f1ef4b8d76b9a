"""Model loading: aliases from the cache, local folders, and the errors for what cannot load."""

from __future__ import annotations

import pytest

from softeval import SoftevalError, load_model
from softeval.models import cached_models


def test_aliases_reload_from_the_cache(tokenizer_dirs):
    lm = load_model("smollm2-135m-instruct", device="cpu")
    assert lm.post_trained and lm.bos_token_id is None and lm.context_length == 8192
    assert lm.identity["gguf_sha256"] and {m["alias"] for m in cached_models()} >= {"smollm2-135m-instruct", "gemma-3-270m"}
    assert not any(p.requires_grad for p in lm.model.parameters())


def test_base_model_facts(tiny_gemma):
    assert tiny_gemma.bos_token_id == tiny_gemma.tokenizer.bos_token_id
    assert not tiny_gemma.post_trained  # gemma-3-270m (base) has no chat template
    assert tiny_gemma.identity["model_type"] == "gemma3_text"


@pytest.mark.parametrize(
    "spec, message",
    [
        ("no-such-model", "unknown model 'no-such-model'.*smollm2-135m-instruct"),
        ("missing.gguf", "GGUF file not found"),
    ],
)
def test_unloadable_specs(spec, message):
    with pytest.raises(SoftevalError, match=message):
        load_model(spec)


def test_folder_without_config(tmp_path):
    with pytest.raises(SoftevalError, match="has no config.json"):
        load_model(str(tmp_path))


def test_unreadable_gguf(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(SoftevalError, match="cannot load model"):
        load_model(str(bad))


def test_config_identity_ignores_where_and_in_which_dtype_a_model_loads(tiny_model_dirs):
    import torch

    fp32 = load_model(str(tiny_model_dirs["llama"]), device="cpu")
    bf16 = load_model(str(tiny_model_dirs["llama"]), device="cpu", dtype=torch.bfloat16)
    other = load_model(str(tiny_model_dirs["gemma3"]), device="cpu")
    assert fp32.identity["config_sha256"] == bf16.identity["config_sha256"] != other.identity["config_sha256"]
