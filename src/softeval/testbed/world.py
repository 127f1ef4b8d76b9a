"""A world of invented people whose facts are known: who each was born where, worked for whom,
as what, and studied where. Names and values are made of invented syllables, so nothing a model
could have read elsewhere helps; the facts are drawn from a seed, so the same seed gives the same
world.

Each attribute has prose templates (several paraphrases: a recipe may use the first only), a
question, and the stem that measures what a model knows in its own pre-training format: the
first template up to its value ("Vadro Kelim was born in").
"""

from __future__ import annotations

import random
from dataclasses import dataclass

CONSONANTS = "bdfgklmnprstvz"
VOWELS = "aeiou"


@dataclass(frozen=True)
class Attribute:
    name: str
    templates: tuple[str, ...]  # prose: {name} and {value}, the value last
    question: str  # {name}
    n_values: int
    suffix: str = ""  # what makes a value read as its kind ("Works", "College")

    def stem(self, person: str) -> str:
        """The first template up to its value: what a fact's log-likelihood is measured after."""
        return self.templates[0].split("{value}")[0].format(name=person).rstrip()


ATTRIBUTES = (
    Attribute(
        "birth_city",
        ("{name} was born in {value}.", "{name} came into the world in {value}.", "The birthplace of {name} is {value}.",
         "{name} spent the first years of life in {value}."),
        "Where was {name} born?", 16,
    ),
    Attribute(
        "employer",
        ("{name} worked for {value}.", "{name} was employed by {value}.", "The employer of {name} was {value}.",
         "{name} earned a living at {value}."),
        "Who did {name} work for?", 16, " Works",
    ),
    Attribute(
        "profession",
        ("{name} worked as a {value}.", "By trade, {name} was a {value}.", "The profession of {name} was {value}.",
         "{name} made a career as a {value}."),
        "What was the profession of {name}?", 12, "smith",
    ),
    Attribute(
        "university",
        ("{name} studied at {value}.", "{name} was educated at {value}.", "The university of {name} was {value}.",
         "{name} graduated from {value}."),
        "Where did {name} study?", 12, " College",
    ),
)


@dataclass(frozen=True)
class Person:
    name: str
    facts: dict[str, str]  # attribute name -> value


@dataclass(frozen=True)
class World:
    """The people, each attribute's value set, and which people each split asks about."""

    seed: int
    people: tuple[Person, ...]
    values: dict[str, tuple[str, ...]]
    splits: dict[str, tuple[int, ...]]  # test, validation, tune, post (post-training): disjoint indices

    def people_of(self, split: str) -> list[Person]:
        return [self.people[i] for i in self.splits[split]]


def _word(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(CONSONANTS) + rng.choice(VOWELS) for _ in range(syllables)).capitalize()


def _distinct(rng: random.Random, count: int, make, taken: set[str]) -> list[str]:
    found = []
    while len(found) < count:
        word = make()
        if word not in taken:
            taken.add(word)
            found.append(word)
    return found


def make_world(seed: int, n_people: int, split_sizes: dict[str, int]) -> World:
    """`n_people` invented people with one value of each attribute, drawn from `seed`; the splits
    take disjoint people (the rest are in pre-training only)."""
    if sum(split_sizes.values()) > n_people:
        raise ValueError(f"the splits ask about {sum(split_sizes.values())} people, more than the world's {n_people}")
    rng = random.Random(seed)
    taken: set[str] = set()
    values = {}
    for attribute in ATTRIBUTES:
        words = _distinct(rng, attribute.n_values, lambda: _word(rng, rng.choice((2, 3))), taken)
        values[attribute.name] = tuple(w.lower() + attribute.suffix if attribute.suffix == "smith" else w + attribute.suffix for w in words)
    names = _distinct(rng, n_people, lambda: f"{_word(rng, rng.choice((2, 3)))} {_word(rng, rng.choice((2, 3)))}", taken)
    people = tuple(Person(name, {a.name: rng.choice(values[a.name]) for a in ATTRIBUTES}) for name in names)
    order = list(range(n_people))
    rng.shuffle(order)
    splits, start = {}, 0
    for split, size in split_sizes.items():
        splits[split] = tuple(sorted(order[start : start + size]))
        start += size
    return World(seed, people, values, splits)


def biography(person: Person, rng: random.Random, n_templates: int) -> str:
    """One paragraph stating every fact of a person, each in one of the first `n_templates`
    templates of its attribute, the sentences in a random order."""
    sentences = [rng.choice(a.templates[:n_templates]).format(name=person.name, value=person.facts[a.name]) for a in ATTRIBUTES]
    rng.shuffle(sentences)
    return " ".join(sentences)
