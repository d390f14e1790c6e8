from __future__ import annotations

# test_server.py is an MCP server the tests run, not a test module.
collect_ignore = ["test_server.py"]
