"""The world's benchmarks, as ordinary softeval tasks: a task YAML beside its data files.

* `world_qa`: the question as the world's own text asks it ("Where was Vadro Kelim born?"),
  answered with the value alone on the first line (short answer); a model that learnt from the
  world's pages answers in a full sentence ("Vadro Kelim was born in Velmora."), which the strict
  parser refuses and the lenient one reads: the format gap a soft prompt closes;
* `world_mc`: the same question with four lettered options from the attribute's values, its
  knowledge the options' log-likelihoods after the bare question.

The splits ask about disjoint people: `train` (tuning rows and demonstrations), `validation` (the
tuning curves) and `test` (scored; row i is test fact i of `truth.py`); `post` asks about every
person no test or validation row asks about, for the references' post-training conversations.
Every person of the world is in pre-training.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import yaml

from softeval._io import write_text_atomic
from softeval.testbed.world import ATTRIBUTES, World

# file split -> world splits; the references' post-training never asks about a validation person,
# so a tuning curve on a reference reads questions it was not fine-tuned on
SPLITS = {"train": ("tune",), "validation": ("validation",), "test": ("test",), "post": ("post", "tune")}
QA_INSTRUCTION = "Answer the question with the name alone."
N_OPTIONS = 4


def rows(world: World, split: str) -> list[dict]:
    """One row per fact of each person the split asks about: the QA task's and the MC task's fields."""
    rng = random.Random(f"{world.seed}-{split}")
    found = []
    for person in [p for part in SPLITS[split] for p in world.people_of(part)]:
        for attribute in ATTRIBUTES:
            value = person.facts[attribute.name]
            others = rng.sample([v for v in world.values[attribute.name] if v != value], N_OPTIONS - 1)
            choices = others[:]
            position = rng.randrange(N_OPTIONS)
            choices.insert(position, value)
            found.append({"person": person.name, "attribute": attribute.name, "question": attribute.question.format(name=person.name),
                          "answer": value, "aliases": [], "choices": choices, "gold": position})
    return found


def _spec(name: str, description: str, data: dict, **fields) -> dict:
    return {
        "name": name,
        "description": description,
        "dataset": {"path": f"local/{name}", "eval_split": "test", "tune_split": "train", "validation_split": "validation",
                    "fewshot_split": "train", "data_files": data},
        "stop": ["\n", "Question:"],
        **fields,
    }


def write_tasks(world: World, folder: Path) -> dict[str, Path]:
    """DIR/tasks/<split>.jsonl and the two task specs reading them; returns {task name: spec path}."""
    folder.mkdir(parents=True, exist_ok=True)
    for split in SPLITS:
        write_text_atomic(folder / f"{split}.jsonl", "".join(json.dumps(row) + "\n" for row in rows(world, split)))
    data = {split: f"{split}.jsonl" for split in SPLITS}
    qa = _spec("world_qa", "Facts of the testbed's invented people, answered with the value alone", data,
               answer_format="short_answer", fields={"question": "question", "answer": "answer", "aliases": "aliases"},
               instruction=QA_INSTRUCTION, template="{{ question }}", target=" {{ answer }}", max_new_tokens=24,
               max_answer_words=2, normalization="squad")
    mc = _spec("world_mc", "Facts of the testbed's invented people, four lettered options", data,
               answer_format="multiple_choice", fields={"question": "question", "choices": "choices", "answer": "gold"},
               instruction="Answer with the letter of the correct option.", template="Question: {{ question }}\n{{ options }}\nAnswer:",
               cloze_template="{{ question }}", target=" {{ letter }}", max_new_tokens=6)
    paths = {}
    for spec in (qa, mc):
        paths[spec["name"]] = folder / f"{spec['name']}.yaml"
        write_text_atomic(paths[spec["name"]], yaml.safe_dump(spec, sort_keys=False, allow_unicode=True))
    return paths
