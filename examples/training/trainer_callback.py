"""Evaluate inside transformers' Trainer: `softeval.SoftevalCallback` runs at every checkpoint the
Trainer saves, with the tokens it counted. The same tiny llama and corpus as plain_loop.py.

    python examples/training/trainer_callback.py --output runs/trainer --run runs/trainer-run

The run folder's checkpoints can also be evaluated without the callback, by `softeval watch`:

    softeval watch runs/trainer-run --task examples/capitals.yaml --method zero-shot,soft-prompt \\
        --limit 20 --steps 20 --eval-every 10 --val-size 3 --output runs/watched --once

About a minute on 2 CPU cores.
"""

from __future__ import annotations

import argparse

import torch
from plain_loop import TASK, corpus
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, Trainer, TrainingArguments

import softeval


class Blocks(torch.utils.data.Dataset):
    def __init__(self, blocks: torch.Tensor):
        self.blocks = blocks

    def __len__(self):
        return len(self.blocks)

    def __getitem__(self, i):
        return {"input_ids": self.blocks[i], "labels": self.blocks[i]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output", default="runs/trainer")
    parser.add_argument("--run", default="runs/trainer-run")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=20)
    args = parser.parse_args()

    tokenizer = AutoTokenizer.from_pretrained(softeval.prepare_alias("smollm2-135m-instruct"))
    tokenizer.chat_template = None  # a model in pre-training is a base model
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    model = AutoModelForCausalLM.from_config(config)
    callback = softeval.SoftevalCallback(tasks=[str(TASK)], output=args.output, recipe="tiny", methods=["zero-shot", "soft-prompt"],
                                         limit=20, tuning={"steps": 20, "eval_every": 10, "val_size": 3})
    training = TrainingArguments(output_dir=args.run, max_steps=args.steps, save_steps=args.every, per_device_train_batch_size=8,
                                 learning_rate=3e-3, use_cpu=True, report_to=[], include_num_input_tokens_seen=True, save_only_model=True, disable_tqdm=True)
    Trainer(model=model, args=training, train_dataset=Blocks(corpus(tokenizer)), processing_class=tokenizer, callbacks=[callback]).train()


if __name__ == "__main__":
    main()
