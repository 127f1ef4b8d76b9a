"""Model loading: aliases from the cache, local folders, and the errors for what cannot load."""

from __future__ import annotations

from pathlib import Path

import pytest

from softeval import SoftevalError, load_model
from softeval.models import cached_models, checkpoint_step, model_name


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


def write_tiny_gguf(path: Path) -> Path:
    """A tiny llama as a GGUF file: a byte-level BPE tokenizer of 320 tokens trained here, random
    float32 weights, written with the gguf package's own writer."""
    import json

    import gguf
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    bpe.train_from_iterator(["The capital of France is Paris.", "Question: which gas do plants take in? Answer: carbon dioxide"], trainer)
    vocab = bpe.get_vocab()
    merges = [m if isinstance(m, str) else " ".join(m) for m in json.loads(bpe.to_str())["model"]["merges"]]
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True))
    writer = gguf.GGUFWriter(str(path), "llama")
    metadata = {"context_length": 256, "embedding_length": 64, "feed_forward_length": 128, "block_count": 2, "head_count": 4,
                "head_count_kv": 2, "layer_norm_rms_eps": 1e-6, "rope_freq_base": 10000.0, "tokenizer_model": "gpt2",
                "token_list": sorted(vocab, key=vocab.get), "token_merges": merges, "token_types": [1] * len(vocab), "bos_token_id": 0,
                "eos_token_id": 0}
    for key, value in metadata.items():
        getattr(writer, f"add_{key}")(value)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    parts = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
             "post_attention_layernorm": "ffn_norm"}
    names |= {f"model.layers.{i}.{hf}.weight": f"blk.{i}.{name}.weight" for i in range(2) for hf, name in parts.items()}
    for name, tensor in model.state_dict().items():
        if name in names:  # lm_head is tied to the embeddings
            writer.add_tensor(names[name], tensor.numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_gguf_file_loads_from_one_parse_as_from_transformers_three(tmp_path, monkeypatch):
    """transformers parses a GGUF file for its tokenizer, again for its config and again for its
    weights; softeval's load parses it once, and gets the same tokens and weights."""
    import gguf
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    parses, parse = [], gguf.GGUFReader
    monkeypatch.setattr(gguf, "GGUFReader", lambda *args, **kwargs: parses.append(args) or parse(*args, **kwargs))
    lm = load_model(str(path), device="cpu")
    assert len(parses) == 1
    tokenizer = AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, dtype=torch.float32)
    assert len(parses) == 4
    text = "Question: which gas do plants take in? Answer:"
    assert lm.tokenizer(text)["input_ids"] == tokenizer(text)["input_ids"]
    ours, theirs = lm.model.state_dict(), model.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


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
    source = {"folder": lm.identity["folder"], "weights_sha256": lm.identity["weights_sha256"]}
    assert model_identity(lm.identity["spec"], lm.model, source) == described
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


@pytest.fixture
def hub_cache(tmp_path, tiny_model_dirs, monkeypatch):
    """A Hugging Face cache holding two commits of a tiny model `org/tiny`, the default branch at
    the first and the branch `step100` at the second (its config differs), with the hub unreachable."""
    import json
    import shutil

    from huggingface_hub import constants

    cache, commits = tmp_path / "hub", {"main": "a" * 40, "step100": "b" * 40}
    repo = cache / "models--org--tiny"
    (repo / "refs").mkdir(parents=True)
    for ref, commit in commits.items():
        snapshot = repo / "snapshots" / commit
        shutil.copytree(tiny_model_dirs["llama"], snapshot)
        (repo / "refs" / ref).write_text(commit)
    config = repo / "snapshots" / commits["step100"] / "config.json"
    config.write_text(json.dumps(json.loads(config.read_text()) | {"rms_norm_eps": 1e-3}))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr("softeval.models.loading.hub_unreachable", lambda: "huggingface.co:443 is not reachable: no route")
    return commits


def test_a_hub_revision_loads_offline_from_the_cache_under_a_name_of_its_own(hub_cache):
    main, step = load_model("org/tiny", device="cpu"), load_model("org/tiny@step100", device="cpu")
    assert (main.name, step.name) == ("tiny", "tiny@step100")
    assert main.identity["commit"] == hub_cache["main"] and "revision" not in main.identity
    assert (step.identity["revision"], step.identity["commit"]) == ("step100", hub_cache["step100"])
    assert step.model.config.rms_norm_eps == 1e-3 != main.model.config.rms_norm_eps  # that commit's files
    assert step.identity["config_sha256"] != main.identity["config_sha256"]
    by_commit = load_model(f"org/tiny@{hub_cache['step100']}", device="cpu", lazy=True)
    assert by_commit.identity["commit"] == hub_cache["step100"] and by_commit.name == f"tiny@{hub_cache['step100']}"
    with pytest.raises(SoftevalError, match=r"cannot load model 'org/tiny@step999' from the hub \(huggingface.co:443 is not reachable"):
        load_model("org/tiny@step999", device="cpu")


def test_a_revision_in_a_study_file_is_the_models_revision(tmp_path):
    from softeval.study.settings import ModelEntry

    assert ModelEntry(model="EleutherAI/pythia-70m", revision="step3000").model == "EleutherAI/pythia-70m@step3000"
    with pytest.raises(ValueError, match="give it once"):
        ModelEntry(model="EleutherAI/pythia-70m@step1", revision="step3000")


def test_a_training_run_folder_stands_for_its_checkpoints_in_step_order(tmp_path, tiny_model_dirs):
    import shutil

    from softeval.study.settings import Study

    run = tmp_path / "run-a"
    for name in ("checkpoint-100", "checkpoint-20", "step_300"):
        shutil.copytree(tiny_model_dirs["llama"], run / name)
    (run / "logs").mkdir()
    study = Study(models=[{"model": str(run)}], tasks=["arc_easy"], methods=["zero-shot"])
    assert [Path(e.model).name for e in study.models] == ["checkpoint-20", "checkpoint-100", "step_300"]
    names = [model_name(e.model) for e in study.models]
    assert names == ["run-a@checkpoint-20", "run-a@checkpoint-100", "run-a@step_300"]  # never shared with another run's
    globbed = Study(models=[{"model": str(run / "checkpoint-*")}], tasks=["arc_easy"], methods=["zero-shot"])
    assert [model_name(e.model) for e in globbed.models] == ["run-a@checkpoint-20", "run-a@checkpoint-100"]
    assert [checkpoint_step(n) for n in ("stage1-step10000-tokens21B", "iter_0000500", "global_step7", "main")] == [10000, 500, 7, None]
    with pytest.raises(ValueError, match="holds 3 checkpoints, and a family pairs one base"):
        Study(models=[{"model": str(run), "family": "a", "role": "base"}, {"model": "x/y", "family": "a", "role": "post-trained"}],
              tasks=["arc_easy"], methods=["zero-shot"])


@pytest.mark.parametrize("ray", [False, True])
def test_a_finished_revisions_weights_are_freed_and_a_rerun_skips_its_cells(hub_cache, tmp_path, monkeypatch, ray):
    if ray:  # Ray's workers read the same cache, offline, as their own processes
        pytest.importorskip("ray")
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import yaml
    from typer.testing import CliRunner

    from conftest import ROWS, write_user_task
    from huggingface_hub import constants
    from softeval.cli import app

    snapshots = Path(constants.HF_HUB_CACHE) / "models--org--tiny" / "snapshots"
    task = write_user_task(tmp_path, ROWS * 3)
    study = {"models": [{"model": "org/tiny", "revision": "step100"}], "tasks": [str(task)], "methods": ["zero-shot"], "free_weights": True}
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    out = tmp_path / "out"
    on_ray = ["--ray", "local"] if ray else []
    first = CliRunner().invoke(app, ["study", str(tmp_path / "study.yaml"), "--output", str(out), *on_ray])
    assert first.exit_code == 0, first.output
    assert (out / "tiny@step100" / "capitals" / "zero-shot" / "results.json").is_file()
    assert not list((snapshots / hub_cache["step100"]).glob("*.safetensors"))  # freed
    assert (snapshots / hub_cache["step100"] / "config.json").is_file() and list((snapshots / hub_cache["main"]).glob("*.safetensors"))
    again = CliRunner().invoke(app, ["study", str(tmp_path / "study.yaml"), "--output", str(out), *on_ray])
    assert again.exit_code == 0, again.output  # its cells are finished: no weights needed


def test_a_models_weights_are_hashed_once_and_again_when_rewritten(tmp_path, monkeypatch):
    """A folder's weights sha256 covers its weight files (not a trainer's optimizer state); it is
    cached by path, size, mtime and inode, so an unchanged file is not read again, and a file
    rewritten in place with the same size is."""
    import hashlib
    import os

    from softeval.models import fingerprint

    monkeypatch.setenv("SOFTEVAL_HASH_CACHE", str(tmp_path / "hashes.json"))
    model = tmp_path / "checkpoint-10"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"a" * 1000)
    (model / "optimizer.pt").write_bytes(b"state")
    old = 1_000_000_000_000_000_000  # an mtime long past: not a file still being written
    os.utime(model / "model.safetensors", ns=(old, old))
    reads = []
    monkeypatch.setattr(fingerprint, "file_sha256", lambda path: reads.append(path.name) or hashlib.sha256(path.read_bytes()).hexdigest())

    first = fingerprint.weights_sha256(model)
    file_sha = hashlib.sha256(b"a" * 1000).hexdigest()
    assert first == hashlib.sha256(f"model.safetensors\0{file_sha}\n".encode()).hexdigest()
    assert fingerprint.weights_sha256(model) == first and reads == ["model.safetensors"]  # the second time from the cache

    (model / "model.safetensors").write_bytes(b"b" * 1000)  # retrained: same name and size
    os.utime(model / "model.safetensors", ns=(old + 10**9, old + 10**9))
    second = fingerprint.weights_sha256(model)
    assert second != first and reads == ["model.safetensors"] * 2
    (model / "optimizer.pt").write_bytes(b"other state")
    assert fingerprint.weights_sha256(model) == second and len(reads) == 2

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"gguf weights")
    assert fingerprint.weights_sha256(gguf) == hashlib.sha256(b"gguf weights").hexdigest()  # a file: its own sha256
    (tmp_path / "empty").mkdir()
    assert fingerprint.weights_sha256(tmp_path / "empty") is None  # no weight files: transformers says what is missing


def test_a_file_written_just_now_is_hashed_every_time(tmp_path, monkeypatch):
    """A file whose mtime is seconds old may still be written, or rewritten within the file
    system's clock tick: its hash is not cached."""
    from softeval.models import fingerprint

    monkeypatch.setenv("SOFTEVAL_HASH_CACHE", str(tmp_path / "hashes.json"))
    (tmp_path / "model.safetensors").write_bytes(b"fresh")
    reads = []
    real = fingerprint.file_sha256
    monkeypatch.setattr(fingerprint, "file_sha256", lambda path: reads.append(path) or real(path))
    fingerprint.weights_sha256(tmp_path)
    fingerprint.weights_sha256(tmp_path)
    assert len(reads) == 2 and not (tmp_path / "hashes.json").exists()


def test_processes_that_prepare_an_alias_together_convert_it_once(tmp_path, monkeypatch):
    """Two preparations of one alias started together (a study's workers, the suite's workers on a
    fresh machine): the second waits for the first's conversion and reads it, converting nothing."""
    import threading
    import time

    from softeval.models import loading

    converted = []

    def convert(alias, name, target):  # as the conversion does: a while, then the folder whole
        converted.append(name)
        time.sleep(0.5)
        target.mkdir(parents=True)
        (target / loading.MARKER).write_text("{}")

    monkeypatch.setattr(loading, "_convert_alias", convert)
    found = []
    workers = [threading.Thread(target=lambda: found.append(loading.prepare_alias("gemma-3-270m", cache_dir=tmp_path))) for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert converted == ["gemma-3-270m"] and found == [tmp_path / "gemma-3-270m"] * 2
