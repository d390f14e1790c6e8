#!/usr/bin/env bash
# Runs the cookbook notebooks and stores their new outputs (all of cookbook/*.ipynb, or the ones
# named). With --check, compares them with the stored outputs instead, as the tests do.
# Review the diff before committing: the stored outputs are what readers see and what the tests
# compare against.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python tests/cookbook_support.py "$@"
