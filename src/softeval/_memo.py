"""A value computed once per object, for objects that cannot be dict keys (examples)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

Key = TypeVar("Key")
Value = TypeVar("Value")


class PerObject(Generic[Key, Value]):
    """`compute(obj)`, computed once per object, by identity: for objects that do not change
    once computed on (examples, once read from their rows). Each object is kept beside its
    value, so its id cannot pass to another object while the memo lives."""

    def __init__(self, compute: Callable[[Key], Value]):
        self._compute = compute
        self._kept: dict[int, tuple[Key, Value]] = {}

    def __call__(self, obj: Key) -> Value:
        if id(obj) not in self._kept:
            self._kept[id(obj)] = (obj, self._compute(obj))
        return self._kept[id(obj)][1]
