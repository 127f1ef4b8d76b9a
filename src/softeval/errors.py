"""The one exception softeval raises for problems a user can fix, and how a settings file's
validation error is put to the user."""

from __future__ import annotations

import difflib

from pydantic import BaseModel, ValidationError


class SoftevalError(Exception):
    """A user-facing error: the message names the problem and the fix, on one line."""


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
    """The keys `model` takes at `loc`, a path of keys into its nested settings ([] past them)."""
    for key in loc:
        field = model.model_fields.get(str(key))
        annotation = field.annotation if field is not None else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return list(model.model_fields)
