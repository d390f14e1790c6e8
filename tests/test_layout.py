"""The package's layout: the layers DESIGN.md §7 draws, the public modules and what each offers.

An unprefixed module or folder is a path users may import, and its ``__all__`` is what it offers
(pinned below, so a public name is added on purpose); anything prefixed with ``_`` is private.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections import Counter
from pathlib import Path
from typing import cast

import pytest

import ipybox
import ipybox_kernel

ROOT = Path(ipybox.__file__).parent

# The private modules at the top of `ipybox/`: each is shared by several layers (DESIGN.md §7).
# Anything else belongs to the layer it serves.
TOP_LEVEL_PRIVATE = {
    "_cli",
    "_exceptions",
    "_lazy",
    "_manifest",
    "_mounts",
    "_packages",
    "_privatefile",
    "_settings",
    "_tooldir",
    "_unixsocket",
    "_workspace",
}
LAYERS = {"_approval", "_engine", "_gateway", "_kernel", "_mcp", "_toolserver"}
PUBLIC_PACKAGES = {"codegen", "examples", "integrations", "mcp_server", "network", "sandbox", "skills"}

# Every public module and its whole public surface.
PUBLIC: dict[str, tuple[str, ...]] = {
    "ipybox": ipybox.__all__,  # pinned name by name in tests/test_public_api.py and the docs' API reference
    "ipybox.testing": ("InProcessKernel",),
    "ipybox.oauth": (
        "AuthorizationRequest",
        "Authorize",
        "FileTokenStore",
        "ImportedTokens",
        "LoopbackAuthorizer",
        "OAuth",
        "OAuthParams",
        "TokenStore",
        "default_token_dir",
        "import_tokens",
    ),
    "ipybox.codegen": (
        "CatalogueMode",
        "ToolMatch",
        "catalogue_mode",
        "generate_mcp_sources",
        "render_match_stubs",
        "render_tool_catalogue",
        "render_tool_stubs",
        "render_tool_summary",
        "search_tools",
    ),
    "ipybox.network": ("Network", "NetworkEvent", "NetworkRequest"),
    "ipybox.sandbox": ("SandboxConfig", "SandboxUnavailable"),
    "ipybox.skills": ("Skill", "list_skills", "render_skill_stubs", "save_skill"),
    "ipybox.mcp_server": ("ServerConfig", "build_server", "main", "run_parsed", "serve"),
    "ipybox.examples": (),
    "ipybox.examples.weather": ("get_forecast", "list_cities", "send_report", "server"),
    "ipybox.integrations": (),
    "ipybox.integrations.langchain": (
        "IpyboxSearchTool",
        "IpyboxTool",
        "McpApprovalRequest",
        "McpDecision",
        "OutputEvent",
        "ipybox_tools",
    ),
    "ipybox.integrations.pydantic_ai": (
        "ApprovalPayload",
        "Decision",
        "IpyboxToolset",
        "KernelOutputEvent",
        "mcp_approval_results",
        "pending_mcp_calls",
    ),
    "ipybox.integrations.openai_agents": (
        "ApprovalHandler",
        "NeedsApproval",
        "OutputHandler",
        "ipybox_search_tool",
        "ipybox_tool",
        "ipybox_tools",
        "tool_instructions",
    ),
    "ipybox_kernel": ipybox_kernel.__all__,
}


def _module_names() -> list[str]:
    names = ["ipybox", "ipybox_kernel"]
    for package in (ipybox, ipybox_kernel):
        names += [info.name for info in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]
    return names


def _is_public(name: str) -> bool:
    return not any(part.startswith("_") for part in name.split("."))


def test_no_two_modules_share_a_file_name() -> None:
    # `_executor.py` twice, `_config.py` four times: a name must say which module it is.
    files = [path for root in (ROOT, Path(ipybox_kernel.__file__).parent) for path in root.rglob("*.py")]
    counts = Counter(path.name for path in files if path.name not in {"__init__.py", "__main__.py"})
    assert [name for name, count in counts.items() if count > 1] == []


def test_the_top_level_shows_the_layers() -> None:
    entries = {path.stem for path in ROOT.iterdir() if path.suffix == ".py" or (path / "__init__.py").exists()}
    private = {name for name in entries if name.startswith("_") and not name.startswith("__")}
    assert private - LAYERS == TOP_LEVEL_PRIVATE
    assert private & LAYERS == LAYERS
    assert {name for name in entries if not name.startswith("_")} == PUBLIC_PACKAGES | {"oauth", "testing"}


def test_every_module_inside_a_layer_or_a_public_package_is_private() -> None:
    # A public package's modules are `_x.py`; its surface is its `__init__` (or a module the pin names).
    for name in _module_names():
        if _is_public(name):
            assert name in PUBLIC, f"{name} is importable without an underscore: add it to PUBLIC, or prefix it"


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_each_public_module_offers_exactly_its_pinned_names(name: str) -> None:
    module = importlib.import_module(name)
    offered: object = module.__all__
    assert isinstance(offered, tuple)
    offered = cast("tuple[str, ...]", offered)
    assert list(offered) == sorted(offered)
    assert offered == PUBLIC[name]
    for attribute in offered:
        assert getattr(module, attribute) is not None, f"{name}.{attribute}"


@pytest.mark.parametrize("name", ["ipybox.codegen", "ipybox.network", "ipybox.sandbox", "ipybox.mcp_server"])
def test_a_public_package_s_names_are_the_ones_ipybox_exports(name: str) -> None:
    module = importlib.import_module(name)
    offered: tuple[str, ...] = module.__all__
    for attribute in offered:
        if attribute in ipybox.__all__:
            assert getattr(module, attribute) is getattr(ipybox, attribute)
    with pytest.raises(AttributeError, match=f"module '{name}' has no attribute 'nothing_here'"):
        module.nothing_here  # noqa: B018
