"""Code generation: typed Python modules from MCP servers' tool schemas, and the stubs shown to models.

``_codegen`` connects to a server, lists its tools and writes the package that ``_sources`` builds;
``_schema`` cleans the untrusted schemas, ``_modelgen`` turns them into pydantic models through
datamodel-code-generator, whose output ``_modelcheck`` checks before use; ``_names`` and
``_pysource`` make identifiers and literals that cannot carry code, and ``_stubs`` renders the
generated packages for a prompt, ``_toolsearch`` searches them and renders the catalogue. The public
names below are imported on first use and are exported by ``ipybox`` too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ipybox._lazy import lazy_names

if TYPE_CHECKING:
    from ._codegen import generate_mcp_sources as generate_mcp_sources
    from ._stubs import render_tool_stubs as render_tool_stubs
    from ._toolsearch import CatalogueMode as CatalogueMode
    from ._toolsearch import ToolMatch as ToolMatch
    from ._toolsearch import catalogue_mode as catalogue_mode
    from ._toolsearch import render_match_stubs as render_match_stubs
    from ._toolsearch import render_tool_catalogue as render_tool_catalogue
    from ._toolsearch import render_tool_summary as render_tool_summary
    from ._toolsearch import search_tools as search_tools

_LAZY = {
    "CatalogueMode": "._toolsearch",
    "ToolMatch": "._toolsearch",
    "catalogue_mode": "._toolsearch",
    "generate_mcp_sources": "._codegen",
    "render_match_stubs": "._toolsearch",
    "render_tool_catalogue": "._toolsearch",
    "render_tool_stubs": "._stubs",
    "render_tool_summary": "._toolsearch",
    "search_tools": "._toolsearch",
}

__all__ = (
    "CatalogueMode",
    "ToolMatch",
    "catalogue_mode",
    "generate_mcp_sources",
    "render_match_stubs",
    "render_tool_catalogue",
    "render_tool_stubs",
    "render_tool_summary",
    "search_tools",
)

if not TYPE_CHECKING:
    __getattr__ = lazy_names(__name__, _LAZY)
