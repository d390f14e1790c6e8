"""`BoundedClientSession`: the MCP client session ipybox uses, with tool results checked within bounds.

The SDK's session checks each tool result's structured content against the output schema the
server listed, with Python's backtracking ``re`` in the host's event loop: a remote server that
lists a catastrophic ``pattern`` and returns a text built for it would hang the host, every
executor in the process with it. This session checks results with ipybox._mcp._schemacheck instead
(RE2, a step and time budget, size and depth limits).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import mcp_types as types
from mcp import ClientSession

from ._schemacheck import forget_schemas, schema_problem

__all__ = ("BoundedClientSession",)


class BoundedClientSession(ClientSession):
    """A `ClientSession` whose check of tool results cannot hang or crash the host.

    ``offers_sampling`` False keeps sampling out of the capabilities it advertises even with a
    ``sampling_callback``, which then only gives the server a clear refusal (ipybox._mcp._serverasks).
    """

    def __init__(self, *args: Any, offers_sampling: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._output_schemas: dict[str, Mapping[str, Any] | None] = {}
        self._offers_sampling = offers_sampling

    def _build_capabilities(self, version: str) -> types.ClientCapabilities:
        capabilities = super()._build_capabilities(version)
        if self._offers_sampling or capabilities.sampling is None:
            return capabilities
        return capabilities.model_copy(update={"sampling": None})

    async def list_tools(self, *, params: types.PaginatedRequestParams | None = None) -> types.ListToolsResult:
        listed = await super().list_tools(params=params)
        replaced = [self._output_schemas.get(tool.name) for tool in listed.tools]
        self._output_schemas.update((tool.name, tool.output_schema) for tool in listed.tools)
        # Checks are kept by the schema object; a listing's are new objects.
        forget_schemas(old for old, tool in zip(replaced, listed.tools, strict=True) if old is not tool.output_schema)
        return listed

    async def validate_tool_result(self, name: str, result: types.CallToolResult) -> None:
        """Check a result's structured content against the tool's output schema, as the SDK does, bounded.

        Raises:
            RuntimeError: The content is missing or does not fit the schema, or the schema is too
                large or costly to check against (the SDK's error for a result that does not fit).
        """
        if name not in self._output_schemas:
            await self.list_tools()
        schema = self._output_schemas.get(name)
        if schema is None:
            return
        if result.structured_content is None and "structured_content" not in result.model_fields_set:
            raise RuntimeError(f"Tool {name} has an output schema but did not return structured content")
        problem = schema_problem(schema, result.structured_content, "output", "the structured result")
        if problem is not None:
            raise RuntimeError(f"Invalid structured content returned by tool {name}: {problem}")
