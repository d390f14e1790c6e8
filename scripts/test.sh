#!/usr/bin/env bash
# Sets everything up, then runs the linters, the type checker, builds the documentation site and
# runs the whole test suite (the cookbook notebooks included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test-servers
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/pyright
# The documentation site; --strict fails on a broken link, anchor or API reference.
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict
.venv/bin/pytest "$@"
