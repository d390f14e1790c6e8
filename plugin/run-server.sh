#!/bin/sh
# Starts the plugin's MCP server on the ipybox source that came with the plugin: Claude Code copies
# this directory, with the package its symlinks point to, when it installs the plugin from a clone
# or the repository's git URL. The first start makes .venv here from uv.lock (a minute at most);
# later starts take a second. It needs uv, and nothing from the package index that uv.lock does not pin.
set -eu
root="$(cd "$(dirname "$0")" && pwd)"
bootstrap="${XDG_CACHE_HOME:-$HOME/.cache}/ipybox/bootstrap/bin/uv"
if command -v uv >/dev/null 2>&1; then
  uv=uv
elif [ -x "$bootstrap" ]; then
  # scripts/setup.sh of an ipybox clone leaves its uv there when none is on PATH.
  uv="$bootstrap"
else
  echo "ipybox plugin: the server needs uv (https://docs.astral.sh/uv/); install it, or run" \
    "'bash scripts/setup.sh' in a clone of ipybox, then restart Claude Code" >&2
  exit 1
fi
UV_COMPILE_BYTECODE=1 exec "$uv" run --project "$root" --frozen --no-dev --no-editable --quiet ipybox mcp "$@"
