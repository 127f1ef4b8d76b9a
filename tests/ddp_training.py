"""A training script for two CPU processes under torch.distributed (gloo), as `torchrun` starts it:
a tiny llama trained with DistributedDataParallel, evaluated by `softeval.InLoop` every few steps.

    python -m torch.distributed.run --nproc_per_node 2 tests/ddp_training.py TOKENIZER TASK OUTPUT SCENARIO

SCENARIO "spread": the model is trained twice, without and with evaluations; each rank writes
whether its final weights are bitwise the same, and what its evaluations did.
SCENARIO "faults": rank 1's share fails at step 2 and outlasts rank 0's timeout at step 4; then a
model sharded with FSDP2 is given to the evaluator.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).parent))
from conftest import tiny_config  # noqa: E402

from softeval import InLoop  # noqa: E402
from softeval.loop.checkpoints import CheckpointEvaluator  # noqa: E402

STEPS, EVERY = 4, 2


def train(tokenizer, evaluate=None) -> dict:
    config = tiny_config("llama", len(tokenizer), tokenizer)
    config.attention_dropout = 0.1
    torch.manual_seed(0)
    model = DistributedDataParallel(AutoModelForCausalLM.from_config(config))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    torch.manual_seed(1 + dist.get_rank())  # each rank its own data and dropout
    model.train()
    for step in range(1, STEPS + 1):
        ids = torch.randint(0, 500, (2, 12))
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if evaluate is not None and step % EVERY == 0:
            evaluate(model, step)
    return {k: v.clone() for k, v in model.module.state_dict().items()}


def refusal(evaluator, tokenizer) -> str | None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from softeval.errors import SoftevalError

    model = AutoModelForCausalLM.from_config(tiny_config("llama", len(tokenizer), tokenizer))
    fully_shard(model, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
    try:
        evaluator.check_model(model, tokenizer)
    except SoftevalError as exc:
        return str(exc)
    return None


def main(tokenizer_dir: str, task: str, output: str, scenario: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    settings = {"k": 2, "limit": 6, "tuning": {"steps": 2, "eval_every": 2, "val_size": 4, "batch_size": 2, "length": 2}}
    evaluator = InLoop([task], output=output, recipe="ddp", methods=["zero-shot", "few-shot", "soft-prompt"], quiet=True,
                       rank_timeout=3 if scenario == "faults" else 120, **settings)
    done = []
    if scenario == "faults" and rank == 1:
        run = CheckpointEvaluator.run

        def faulty(self, lm, units, recipe, step):
            if step == 2:
                raise RuntimeError("out of memory on rank 1")
            time.sleep(8)  # beyond rank 0's timeout of 3 s
            return run(self, lm, units, recipe, step)

        CheckpointEvaluator.run = faulty
    evaluate = lambda model, step: done.append(evaluator.evaluate(model, tokenizer, step=step))  # noqa: E731
    if scenario == "spread":
        alone = train(tokenizer)
        evaluated = train(tokenizer, evaluate)
        same = alone.keys() == evaluated.keys() and all(torch.equal(alone[k], evaluated[k]) for k in alone)
    else:
        train(tokenizer, evaluate)
        same = None
    record = {"same_weights": same, "evaluations": [{"cells": [[str(c.folder), c.status] for c in e.cells], "failures": e.failures} for e in done]}
    if scenario == "faults":  # a model sharded with FSDP2 is refused in one line
        record["sharded"] = refusal(evaluator, tokenizer)
    Path(output, f"rank-{rank}.json").write_text(json.dumps(record))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
