"""Recording which schemas ipybox._mcp._schemacheck prepares (measures, checks and builds a validator for)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from ipybox._mcp import _schemacheck


def record_preparations(monkeypatch: pytest.MonkeyPatch) -> list[Mapping[str, Any]]:
    """Every schema prepared from now on, in order; the real preparation still runs."""
    seen: list[Mapping[str, Any]] = []
    prepare = _schemacheck._prepare

    def counted(schema: Mapping[str, Any]) -> Any:
        seen.append(schema)
        return prepare(schema)

    monkeypatch.setattr(_schemacheck, "_prepare", counted)
    return seen
