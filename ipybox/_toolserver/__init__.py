"""The host end of the kernel's tool channel: every MCP call from the sandbox, approved before it runs.

- `._server`: `ToolServer`, which listens on the executor's tool socket, checks each request, asks
  the gate and answers with the call's result or error.
- `._lines`: the socket's line protocol (connections, framing, the shared byte budget, hang-ups).
- `._parse`: from one line to a `ToolRequest` (its JSON's shape, validation, the token).
- `._registry`: the host-owned registry of MCP servers and their long-lived sessions.
- `._boundary`: `tool_errors`, the one boundary where foreign errors become `ToolCallFailed`.
- `._channel`: the wire protocol the kernel's stub (``ipybox_kernel._client``) speaks.

This package imports nothing itself: importing `._channel` for the wire format does not load the
MCP SDK. Import the names from the modules.
"""
