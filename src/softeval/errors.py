"""The one exception softeval raises for problems a user can fix, and how a settings file's
validation error is put to the user."""

from __future__ import annotations

import difflib
import typing

from pydantic import BaseModel, ValidationError


class SoftevalError(Exception):
    """A user-facing error: the message names the problem and the fix, on one line."""


class CellsFailed(SoftevalError):
    """Cells of a command failed while the others went on, each told as it failed: the message
    sums them up; `failures` holds each one's (folder, reason), for a tracker's record."""

    def __init__(self, message: str, failures: list[tuple[str, str]]):
        super().__init__(message)
        self.failures = failures

    def reasons(self) -> str:
        return "; ".join(f"{folder}: {reason}" for folder, reason in self.failures)


def validation_problem(exc: ValidationError, model: type[BaseModel]) -> str:
    """The first problem of a file validated as `model`, an unknown key before all else (a
    misspelt key also shows as the missing key it was meant to be), with the known key it is
    closest to."""
    errors = exc.errors()
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    where = ".".join(str(part) for part in first["loc"])
    if first["type"] == "extra_forbidden":
        close = difflib.get_close_matches(str(first["loc"][-1]), keys_at(model, first["loc"][:-1]), n=1)
        return f"unknown key '{where}'" + (f" (did you mean '{close[0]}'?)" if close else "; remove it")
    if first["type"] == "missing":
        return f"{where}: required, but not given; add it"
    message = first["msg"].removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


def keys_at(model: type[BaseModel], loc: tuple) -> list[str]:
    """The keys `model` takes at `loc`, a path of keys (and list positions) into its nested
    settings: `("series", 0)` is a series' keys; [] past them."""
    for key in loc:
        if isinstance(key, int):  # a position in a list of settings: the list's item type is already `model`
            continue
        field = model.model_fields.get(str(key))
        nested = _settings_type(field.annotation) if field is not None else None
        if nested is None:
            return []
        model = nested
    return list(model.model_fields)


def _settings_type(annotation) -> type[BaseModel] | None:
    """The settings model a field holds: itself, or the item of a list or optional of one."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for argument in typing.get_args(annotation):
        found = _settings_type(argument)
        if found is not None:
            return found
    return None
