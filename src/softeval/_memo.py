"""A value computed once per object, for objects that cannot be dict keys (examples)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

Key = TypeVar("Key")
Value = TypeVar("Value")


class PerObject(Generic[Key, Value]):
    """`compute(obj)`, computed once per object by identity. Each object is kept beside its value,
    so its id cannot pass to another object while the value is kept."""

    def __init__(self, compute: Callable[[Key], Value]):
        self._compute = compute
        self._kept: dict[int, tuple[Key, Value]] = {}

    def __call__(self, obj: Key) -> Value:
        kept = self._kept.get(id(obj))
        if kept is None or kept[0] is not obj:
            kept = self._kept[id(obj)] = (obj, self._compute(obj))
        return kept[1]
