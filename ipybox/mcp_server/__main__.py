"""``python -m ipybox.mcp_server``: the same as ``ipybox mcp``."""

from __future__ import annotations

import sys

from ._command import main

__all__ = ()

if __name__ == "__main__":
    sys.exit(main())
