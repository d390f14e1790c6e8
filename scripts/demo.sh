#!/usr/bin/env bash
# Sets everything up, then runs the demo: code actions in the sandboxed kernel.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python examples/demo.py "$@"
