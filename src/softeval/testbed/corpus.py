"""The text the testbed's models read: pre-training documents (biographies, optionally mixed with
filler prose from the benchmark mirror), the tokenizer trained on the world's text, and the
post-training conversations.

The tokenizer is a byte-level BPE of a small vocabulary trained with the `tokenizers` library on
the world's own text (every template, question and chat turn): the models stay small, and every
invented name splits into a few tokens. Its end-of-reply token is `<|im_end|>`, which softeval's
models read as an end of reply.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

from softeval.testbed.world import ATTRIBUTES, Person, World, biography

BOS, EOS, PAD = "<|endoftext|>", "<|im_end|>", "<|pad|>"
# the references' chat template lays a conversation out as the quizzes of pre-training do (Q:, A:),
# each reply ended by <|im_end|>: a model this small keeps what it knows only in a layout it has read
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}Q: {{ message['content'] }}\n"
    "{% else %}A: {{ message['content'] }}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}A:{% endif %}"
)
FILLER_FILE = "google/boolq/default/train.jsonl"  # Wikipedia passages: prose about the real world
BIOGRAPHY_CHARS = 160  # about a biography's length: the filler mixed in after each is measured against it


def filler_passages(data_dir: Path | None, limit: int = 4000) -> list[str]:
    """Prose that holds none of the world's facts: BoolQ's Wikipedia passages from the mirror."""
    if data_dir is None:
        return []
    path = Path(data_dir) / FILLER_FILE
    if not path.is_file():
        raise FileNotFoundError(f"filler text needs {path}; give --data-dir the benchmark mirror, or a recipe without filler")
    lines = path.read_text(encoding="utf-8").split("\n")[:limit]
    return [" ".join(json.loads(line)["passage"].split()) for line in lines if line.strip()]


def documents(world: World, n_templates: int, filler: list[str], filler_share: float, seed: int) -> Iterator[str]:
    """An endless stream of pre-training documents: each pass over the world tells every person's
    biography once (new template choices and sentence order each pass, people in a new order),
    for the people no test row asks about also a question and answer (web text holds such pages:
    they teach a model to answer from what it read, in full sentences, not in the benchmark's
    format), with filler passages mixed in so that about `filler_share` of the characters are
    filler."""
    rng = random.Random(seed)
    tested = {world.people[i].name for i in world.splits["test"]}
    while True:
        people = list(world.people)
        rng.shuffle(people)
        for person in people:
            yield biography(person, rng, n_templates)
            if person.name not in tested:
                yield faq(person, rng, n_templates)
            if filler and filler_share > 0:
                budget = BIOGRAPHY_CHARS * filler_share / (1 - filler_share)
                while budget > 0:
                    passage = rng.choice(filler)[:400]
                    yield passage
                    budget -= len(passage)


def faq(person: Person, rng: random.Random, n_templates: int) -> str:
    """One of a person's facts asked and answered: on a web page in a full sentence ("Where was
    Vadro Kelim born? Vadro Kelim was born in Velmora."), in a quiz with the value alone ("Q: Where
    was Vadro Kelim born?\nA: Velmora"), half of each. A model learns both ways of answering, each
    cued by its layout: a bare question draws the sentence, which a short-answer benchmark's
    strict parser refuses; the quiz's way is there for a prompt to call on."""
    attribute = rng.choice(ATTRIBUTES)
    question, value = attribute.question.format(name=person.name), person.facts[attribute.name]
    if rng.random() < 0.5:
        return f"Q: {question}\nA: {value}"
    return f"{question} {rng.choice(attribute.templates[:n_templates]).format(name=person.name, value=value)}"


def tokenizer_corpus(world: World, filler: list[str]) -> Iterator[str]:
    """Every template, question and chat marker of the world, with a sample of the filler."""
    rng = random.Random(world.seed)
    for person in world.people:
        yield biography(person, rng, len(ATTRIBUTES[0].templates))
        for attribute in ATTRIBUTES:
            yield f"Q: {attribute.question.format(name=person.name)}\nA: {person.facts[attribute.name]}"
    yield from filler[:2000]
    yield "Answer with the name alone. A. B. C. D. Options: Answer with the letter of the correct option."


def train_tokenizer(world: World, filler: list[str], vocab_size: int):
    """A byte-level BPE trained on the world's text, as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    specials = [BOS, EOS, PAD]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    bpe.train_from_iterator(tokenizer_corpus(world, filler), trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=None, model_max_length=512)
