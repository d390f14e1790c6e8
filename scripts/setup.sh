#!/usr/bin/env bash
# Installs what ipybox needs on a fresh Debian/Ubuntu machine: bubblewrap, uv, the locked Python
# environment (.venv) and the npm packages the examples and tests use. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

if ! command -v bwrap >/dev/null 2>&1; then
  echo "setup: installing bubblewrap (the kernel sandbox)"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null
fi

if ! python3 -m uv --version >/dev/null 2>&1; then
  echo "setup: installing uv"
  python3 -m pip install --quiet --disable-pip-version-check uv 2>/dev/null \
    || python3 -m pip install --quiet --user uv
fi

# Bytecode is compiled now because the sandboxed kernel sees the venv read-only and would otherwise
# compile IPython & co. from source on every start (~0.3 s each time).
python3 -m uv sync --frozen --quiet --compile-bytecode --all-extras
.venv/bin/python -m compileall -q ipybox_kernel >/dev/null

if [ -f package-lock.json ]; then
  npm ci --silent --no-audit --no-fund >/dev/null
fi
