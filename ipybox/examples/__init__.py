"""Small MCP servers that ship with ipybox, so the README's example runs without a clone."""

__all__ = ()
