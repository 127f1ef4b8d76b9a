"""The device check (`benchmarks/device_check.py`) at its tiny size on the CPU: the command that a
GPU slot runs at full size, so that it is known to run before one is at hand."""

from __future__ import annotations

import json

import pytest

from conftest import REPO

# each kind the check builds: grouped-query attention (Llama, Qwen), ALiBi (BLOOM), multi-head
# latent attention (DeepSeek-V2-Lite), and the real vocabulary of each
KINDS = {"llama-3-8b-shape": 128256, "qwen2.5-7b-shape": 152064, "bloom-7b1-shape": 250880, "deepseek-v2-lite-mla-shape": 102400}


@pytest.mark.parametrize("name", list(KINDS))
def test_the_device_check_runs_on_the_cpu_and_agrees_with_transformers(tmp_path, monkeypatch, name):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    from device_check import SHAPES, main

    assert set(SHAPES) == set(KINDS)
    out = tmp_path / "check.json"
    results = main(["--size", "tiny", "--device", "cpu", "--dtype", "float32", "--rows", "6", "--new-tokens", "6",
                    "--models", name, "--out", str(out)])
    assert json.loads(out.read_text()) == results
    (found,) = results["models"]
    assert found["self_check"]["path"] == "fast" and found["self_check"]["figures"]
    assert found["option_scoring"]["max_difference_per_token"] < 1e-4  # float32: the fast path is transformers' forward
    assert found["generation"]["identical_share"] == 1.0 and found["generation"]["softeval_tokens_per_second"] > 0
    assert found["tuning_step"]["gradient_finite"] and found["peak_memory_gib"] > 0
    assert found["parameters"] > KINDS[name] * 64  # the real vocabulary, in a tiny body
