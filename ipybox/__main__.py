"""``python -m ipybox``: the same as the ``ipybox`` command."""

from __future__ import annotations

import sys

from ._cli import main

__all__ = ()

if __name__ == "__main__":
    sys.exit(main())
