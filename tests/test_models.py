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
    from softeval.models.loading import model_identity

    source = {k: lm.identity[k] for k in ("alias", "gguf", "gguf_sha256")}
    assert model_identity("smollm2-135m-instruct", lm.model, source) == lm.identity  # read from the config, as from the weights


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


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_the_identity_read_from_a_config_is_that_of_the_loaded_weights(tiny_model_dirs, arch):
    from softeval.models.loading import model_identity

    lm = load_model(str(tiny_model_dirs[arch]), device="cpu", lazy=True)
    assert not lm.loaded
    described = dict(lm.identity)
    assert model_identity(lm.identity["spec"], lm.model, {"folder": lm.identity["folder"]}) == described
    assert lm.loaded and lm.identity == described and lm.hidden_size == lm.model.config.hidden_size


def test_a_model_whose_files_change_before_its_weights_load_is_refused(tmp_path, tiny_model_dirs):
    import json
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dirs["llama"], folder)
    lm = load_model(str(folder), device="cpu", lazy=True)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"rms_norm_eps": 0.5}))
    with pytest.raises(SoftevalError) as caught:
        lm.model  # noqa: B018
    assert str(caught.value) == (f"model '{folder}': its loaded weights differ from its config in config_sha256; "
                                 "were its files changed during the command? Run it again")
    assert not lm.loaded
