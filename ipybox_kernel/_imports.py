"""Import errors for the tool packages that say why a module is missing and what makes it appear.

Without this, code that imports a tool package the kernel does not have gets only ``No module
named 'mcptools'``: nothing about the tools directory the executor mounted (or did not), the server
that was never generated, or registrations that ended with the process that made them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

from ._protocol import TOOLS_DIR_ENV

__all__ = ("install_missing_tools_hint",)

_DEFAULT_PACKAGE = "mcptools"


class _MissingTools:
    """Last on ``sys.meta_path``: asked only about modules no other finder has."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        top, _, rest = fullname.partition(".")
        tools_dir = os.environ.get(TOOLS_DIR_ENV)
        package = os.path.basename(tools_dir.rstrip("/")) if tools_dir else None
        mounted = tools_dir is not None and os.path.isdir(tools_dir)
        if tools_dir is not None and package is not None and top in (package, _DEFAULT_PACKAGE) and not mounted:
            raise ModuleNotFoundError(
                f"No module named {fullname!r}: the executor's tools_dir ({tools_dir}) did not exist when this "
                "kernel started, so no tools are mounted; generate the tools into it (generate_mcp_sources, "
                "ipybox generate --root), or pass the tools_dir they were generated into, then reset() the executor",
                name=fullname,
            )
        if package is not None and top == package:
            if rest:
                raise ModuleNotFoundError(_no_tool_package(fullname, package, rest, tools_dir), name=fullname)
            return None
        if top == _DEFAULT_PACKAGE and package is None:
            raise ModuleNotFoundError(
                f"No module named {fullname!r}: this kernel has no tools directory (the executor's tools_dir "
                "is None); pass the tools_dir the tools were generated into (generate_mcp_sources, "
                "ipybox generate), then start the executor again",
                name=fullname,
            )
        if top == _DEFAULT_PACKAGE:
            raise ModuleNotFoundError(
                f"No module named {fullname!r}: this kernel's tools directory is imported as {package!r} "
                f"(the name of the executor's tools_dir); import {package}.<server>, or name the directory "
                f"{_DEFAULT_PACKAGE!r}",
                name=fullname,
            )
        return None


def _no_tool_package(fullname: str, package: str, rest: str, tools_dir: str | None) -> str:
    server = rest.partition(".")[0]
    try:
        generated = sorted(
            name for name in os.listdir(tools_dir or "") if name.isidentifier() and not name.startswith("_")
        )
    except OSError:
        generated = []
    if server in generated:  # the server is there, the tool is not
        return (
            f"No module named {fullname!r}: the server {server!r} has no such tool module; see help({package}.{server})"
        )
    return (
        f"No module named {fullname!r}: no server {server!r} was generated into the tools directory "
        f"(servers there: {', '.join(generated) or 'none'}). Register it first (register_mcp_server, or "
        "generate_mcp_sources on the host); servers registered through `ipybox mcp` over stdio last as long "
        "as that server process, so list them in `--config FILE` to have them in every session"
    )


def install_missing_tools_hint() -> None:
    """Put the finder last on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, _MissingTools) for finder in sys.meta_path):
        sys.meta_path.append(_MissingTools())
