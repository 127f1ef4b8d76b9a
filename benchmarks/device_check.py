"""softeval on an accelerator, in one offline command: nothing is downloaded, no weights are needed.

For each model: random weights in the shapes of real ones (Llama-3-8B, Qwen2.5-7B, BLOOM-7B1 with
ALiBi, DeepSeek-V2-Lite's multi-head latent attention with dense MLPs; `--size tiny` builds
two-layer models of the same kinds, for a CPU run or the tests), plus the offline real
models where their packages are installed (`--real`). Token ids come from the offline SmolLM2
tokenizer, whose ids are valid in either vocabulary. On the same synthetic rows it measures:

1. the self-check: its verdict, the path it chose, its figures against its tolerance, its time;
2. option scoring: softeval's `loglikelihood` against transformers' own batched forward (right
   padding, one pass), the largest difference per token in nats, and the time of each;
3. greedy generation: softeval's `generate` against transformers' batched `generate` (left
   padding with an attention mask), the share of rows with identical tokens and, where they
   differ, the top-2 logit gap at the first differing token under the model's own forward (a
   gap near 0 is a near-tie that the precision decides), and the tokens per second of each;
4. a soft-prompt tuning step (batch 8, 10 vectors): forward and backward, its time;
5. peak memory (the device's allocator, or the process's resident set on a CPU).

It prints a table and writes every figure to --out (JSON).

    python benchmarks/device_check.py                       # full size, on cuda, in bfloat16
    python benchmarks/device_check.py --size tiny --device cpu --dtype float32 --rows 8 --new-tokens 8
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402

from softeval.engine import start_engine  # noqa: E402
from softeval.engine.selfcheck import check_model  # noqa: E402
from softeval.models import load_model, prepare_alias  # noqa: E402
from softeval.models.loading import _describe, model_identity  # noqa: E402
from softeval.tasks import Cloze  # noqa: E402

# name -> (config class, the real model's shape from its published config, what its tiny kind
# changes: two layers of the same kind, the real vocabulary)
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
SHAPES = {
    "llama-3-8b-shape": ("LlamaConfig", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                                             num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192,
                                             rope_parameters={"rope_type": "default", "rope_theta": 500000.0}), TINY),
    "qwen2.5-7b-shape": ("Qwen2Config", dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                                             num_key_value_heads=4, vocab_size=152064, max_position_embeddings=32768,
                                             rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}), TINY),
    # ALiBi: BLOOM-7B1's shape
    "bloom-7b1-shape": ("BloomConfig", dict(hidden_size=4096, n_layer=30, n_head=32, vocab_size=250880), dict(hidden_size=64, n_layer=2, n_head=4)),
    # multi-head latent attention: DeepSeek-V2-Lite's attention (a 512-wide latent, 64 rotary
    # dimensions), with dense MLPs in every layer instead of its 64 experts
    "deepseek-v2-lite-mla-shape": ("DeepseekV2Config", dict(hidden_size=2048, intermediate_size=10944, num_hidden_layers=27, num_attention_heads=16,
                                                            num_key_value_heads=16, kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64,
                                                            qk_nope_head_dim=128, v_head_dim=128, first_k_dense_replace=27, vocab_size=102400,
                                                            max_position_embeddings=4096),
                                   dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                        kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, first_k_dense_replace=2)),
}
REAL = ("smollm2-135m-instruct", "gemma-3-270m")
WORDS = ("the river carries cold water past seven old mills while a heron waits near the bank and the miller counts his sacks "
         "of grain before the winter market opens in the town across the hill").split()
OPTIONS = [" carbon dioxide", " oxygen", " the warm south wind", " nothing at all"]


def rows(n: int, seed: int = 0) -> list[str]:
    """`n` deterministic prompts of different lengths sharing an instruction."""
    import random

    rng = random.Random(seed)
    return ["Answer the question.\n\n" + " ".join(rng.choice(WORDS) for _ in range(20 + 7 * (i % 9))) + "\nQuestion: what comes next?\nAnswer:"
            for i in range(n)]


def built(name: str, size: str, device: str, dtype: torch.dtype, tokenizer):
    """A LoadedModel of random weights in a real model's shape (or its tiny kind), on the device."""
    config_class, fields, tiny = SHAPES[name]
    fields = fields | (tiny if size == "tiny" else {})
    special = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
    config = getattr(transformers, config_class)(**fields, **special, initializer_range=0.02)
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.eval().requires_grad_(False)
    return _describe(name, model, tokenizer, model_identity(name, model, {"built": name}), None, lambda: model)


def check_one(lm, prompts: list[list[int]], new_tokens: int) -> dict:
    device = next(lm.model.parameters()).device
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    found = {"model": lm.name, "parameters": sum(p.numel() for p in lm.model.parameters()), "dtype": str(next(lm.model.parameters()).dtype)}

    started = time.perf_counter()
    verdict = check_model(lm)
    found["self_check"] = {"path": verdict.path, "reason": verdict.reason, "figures": verdict.figures, "tolerance": verdict.tolerance,
                           "seconds": round(time.perf_counter() - started, 3)}
    engine = start_engine(lm)

    # option scoring
    clozes = [Cloze(p, [lm.encode(o) for o in OPTIONS]) for p in prompts]
    synchronize()
    tick = time.perf_counter()
    ours = engine.loglikelihood(clozes)
    synchronize()
    ours_seconds = time.perf_counter() - tick
    tick = time.perf_counter()
    theirs = _transformers_loglikelihood(lm, clozes)
    synchronize()
    theirs_seconds = time.perf_counter() - tick
    per_token = max(abs(a - b) / max(len(o), 1) for c, x, y in zip(clozes, ours, theirs) for a, b, o in zip(x, y, c.continuation_ids))
    found["option_scoring"] = {"rows": len(clozes), "max_difference_per_token": per_token, "softeval_seconds": round(ours_seconds, 3),
                               "transformers_seconds": round(theirs_seconds, 3)}

    # greedy generation
    tick = time.perf_counter()
    completions = engine.generate(prompts, stop=["\x00never"], max_new_tokens=new_tokens)
    synchronize()
    ours_seconds = time.perf_counter() - tick
    tick = time.perf_counter()
    reference = _transformers_generate(lm, prompts, new_tokens)
    synchronize()
    theirs_seconds = time.perf_counter() - tick
    same = [c.tokens == r for c, r in zip(completions, reference)]
    gaps = [_first_difference_gap(lm, p, c.tokens, r) for p, c, r, s in zip(prompts, completions, reference, same) if not s]
    found["generation"] = {
        "rows": len(prompts), "new_tokens": new_tokens, "identical_share": sum(same) / len(same), "gaps_at_first_difference": gaps,
        "softeval_tokens_per_second": round(sum(len(c.tokens) for c in completions) / ours_seconds, 1),
        "transformers_tokens_per_second": round(sum(len(r) for r in reference) / theirs_seconds, 1),
    }

    # a tuning step
    soft = (0.02 * torch.randn(10, lm.model.get_input_embeddings().weight.shape[1], device=device)).requires_grad_(True)
    pairs = [(p, lm.encode(" the heron")) for p in prompts[:8]]
    tuner = start_engine(lm, soft_prompt=soft)
    synchronize()
    tick = time.perf_counter()
    tuner.target_loss(pairs).backward()
    synchronize()
    found["tuning_step"] = {"batch": len(pairs), "seconds": round(time.perf_counter() - tick, 3), "gradient_finite": bool(torch.isfinite(soft.grad).all())}
    found["peak_memory_gib"] = round((torch.cuda.max_memory_allocated() if device.type == "cuda"
                                      else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024) / 2**30, 2)
    return found


@torch.inference_mode()
def _transformers_loglikelihood(lm, clozes: list[Cloze]) -> list[list[float]]:
    """Each option's summed log-probability by the model's own forward: every (context, option)
    sequence right-padded into one batch, read at its own positions."""
    sequences = [(c.context_ids, o) for c in clozes for o in c.continuation_ids]
    width = max(len(a) + len(b) for a, b in sequences)
    device = next(lm.model.parameters()).device
    ids = torch.zeros(len(sequences), width, dtype=torch.long, device=device)
    mask = torch.zeros_like(ids)
    for r, (a, b) in enumerate(sequences):
        ids[r, : len(a) + len(b)] = torch.tensor(a + b)
        mask[r, : len(a) + len(b)] = 1
    scores = []
    for start in range(0, len(sequences), 16):
        logprobs = torch.log_softmax(lm.model(input_ids=ids[start : start + 16], attention_mask=mask[start : start + 16]).logits.float(), -1)
        for r, (a, b) in enumerate(sequences[start : start + 16]):
            positions = torch.arange(len(a) - 1, len(a) + len(b) - 1, device=device)
            scores.append(float(logprobs[r, positions, torch.tensor(b, device=device)].sum()))
    grouped, k = [], 0
    for c in clozes:
        grouped.append(scores[k : k + len(c.continuation_ids)])
        k += len(c.continuation_ids)
    return grouped


@torch.inference_mode()
def _transformers_generate(lm, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """transformers' own batched greedy `generate`, left-padded, each row cut before EOS."""
    device = next(lm.model.parameters()).device
    width = max(map(len, prompts))
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else lm.eos_token_ids[0]
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    out = lm.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                            eos_token_id=lm.eos_token_ids, pad_token_id=pad)[:, width:].tolist()
    cut = []
    for row in out:
        ended = [i for i, t in enumerate(row) if t in lm.eos_token_ids]
        cut.append(row[: ended[0]] if ended else row)
    return cut


@torch.inference_mode()
def _first_difference_gap(lm, prompt: list[int], ours: list[int], theirs: list[int]) -> float:
    """The top-2 logit gap, under the model's own unpadded forward, where two greedy sequences
    first differ: near 0, the two tokens were a near-tie."""
    k = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
    device = next(lm.model.parameters()).device
    logits = lm.model(input_ids=torch.tensor([prompt + ours[:k]], device=device)).logits[0, -1].float()
    top = torch.topk(logits, 2).values
    return round(float(top[0] - top[1]), 5)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=("full", "tiny"), default="full")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    parser.add_argument("--models", nargs="*", default=list(SHAPES), help=f"of {', '.join(SHAPES)}")
    parser.add_argument("--real", action="store_true", help=f"also the offline real models ({', '.join(REAL)}) where installed")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=Path("device_check.json"))
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device here: run with --device cpu (and --size tiny --dtype float32 for a quick run)")
    dtype = getattr(torch, args.dtype)
    tokenizer = transformers.AutoTokenizer.from_pretrained(prepare_alias("smollm2-135m-instruct"))
    texts = rows(args.rows)
    results = {"device": torch.cuda.get_device_name() if args.device == "cuda" else args.device, "size": args.size, "dtype": args.dtype,
               "torch": torch.__version__, "transformers": transformers.__version__, "models": []}
    models = [lambda name=name: built(name, args.size, args.device, dtype, tokenizer) for name in args.models]
    if args.real:
        models += [lambda name=name: load_model(name, device=args.device, dtype=dtype) for name in REAL]
    for make in models:
        try:
            lm = make()
        except Exception as exc:  # noqa: BLE001 - a real model whose package is missing is left out, said so
            print(f"left out: {type(exc).__name__}: {exc}")
            continue
        bos = [] if lm.bos_token_id is None else [lm.bos_token_id]
        found = check_one(lm, [bos + lm.encode(t) for t in texts], args.new_tokens)
        results["models"].append(found)
        _print(found)
        del lm
        if args.device == "cuda":
            torch.cuda.empty_cache()
    args.out.write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out}")
    return results


def _print(found: dict) -> None:
    check, options, generation, step = found["self_check"], found["option_scoring"], found["generation"], found["tuning_step"]
    print(f"\n{found['model']} ({found['parameters'] / 1e9:.2f}B parameters, {found['dtype']})")
    print(f"  self-check: {check['path']} ({check['reason']}), {check['seconds']} s, tolerance {check['tolerance']}")
    print(f"  option scoring, {options['rows']} rows: max difference {options['max_difference_per_token']:.2e} nats/token; "
          f"softeval {options['softeval_seconds']} s, transformers {options['transformers_seconds']} s")
    print(f"  generation, {generation['rows']} rows x {generation['new_tokens']} tokens: identical {100 * generation['identical_share']:.0f}% "
          f"(gaps at first difference {generation['gaps_at_first_difference'][:5]}); softeval {generation['softeval_tokens_per_second']} tok/s, "
          f"transformers {generation['transformers_tokens_per_second']} tok/s")
    print(f"  tuning step, batch {step['batch']}: {step['seconds']} s; peak memory {found['peak_memory_gib']} GiB")


if __name__ == "__main__":
    main()
