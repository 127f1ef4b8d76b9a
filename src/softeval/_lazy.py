"""Packages that name what they offer without importing it.

Each package's `__init__` maps its public names to the modules that define them; a name is
imported on first use. So importing a package, or the command line's `--help`, does not wait
for torch and transformers, and the import order of the layers stays that of their use.
"""

from __future__ import annotations

import importlib
import sys


def lazy_exports(package: str, exports: dict[str, str]):
    """`__getattr__` and `__dir__` for `package`, whose name `x` is `package.<exports[x]>.x`."""

    def __getattr__(name: str):
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{exports[name]}"), name)
        setattr(sys.modules[package], name, value)  # found directly from now on
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return __getattr__, __dir__
