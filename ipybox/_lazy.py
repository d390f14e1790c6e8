"""Public names imported on first use, so importing a package does not load what they need."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any

__all__ = ("lazy_names",)


def lazy_names(package: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` for `package`: each name in `where` from its (relative) module.

    The value is cached in the package's globals, so later lookups never reach the function.
    """

    def __getattr__(name: str) -> Any:
        try:
            module = where[name]
        except KeyError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        value = getattr(import_module(module, package), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
