#!/usr/bin/env bash
# Installs what ipybox needs on a fresh Debian/Ubuntu machine (as root, or a user with sudo):
# bubblewrap and the locked Python environment in .venv. With --test-servers also Node.js and the
# npm packages the tests run as MCP servers (package-lock.json). Safe to run again: a step whose
# result is already there is skipped, so a second run takes a few seconds.
#
# It needs no uv, pip or node of its own: where the system's python3 may not install packages
# (PEP 668 on Debian 12 and Ubuntu 23.04+), uv comes from a private venv in ~/.cache/ipybox.
set -euo pipefail
cd "$(dirname "$0")/.."

test_servers=false
for arg in "$@"; do
  case "$arg" in
    --test-servers) test_servers=true ;;
    *) echo "setup: unknown option '$arg' (the one option is --test-servers)" >&2; exit 2 ;;
  esac
done

say() { echo "setup: $*"; }
as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"
  elif command -v sudo >/dev/null 2>&1; then sudo "$@"
  else echo "setup: '$*' needs root; run this script as root or install sudo" >&2; exit 1
  fi
}
apt_updated=false
apt_install() {
  say "installing $* with apt-get"
  if ! $apt_updated; then as_root apt-get update -qq; apt_updated=true; fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

command -v bwrap >/dev/null 2>&1 || apt_install bubblewrap

# uv: the one on PATH, else a module of python3, else our own copy in a venv of python3.
bootstrap="${XDG_CACHE_HOME:-$HOME/.cache}/ipybox/bootstrap"
if uv --version >/dev/null 2>&1; then
  uv=(uv)
elif python3 -m uv --version >/dev/null 2>&1; then
  uv=(python3 -m uv)
else
  if [ ! -x "$bootstrap/bin/uv" ]; then
    say "installing uv into $bootstrap (a venv of its own; the system's python3 is left alone)"
    rm -rf "$bootstrap"
    # Debian and Ubuntu ship venv's pip (ensurepip) in a package of their own, python3-venv.
    if ! python3 -m venv "$bootstrap" >/dev/null 2>&1; then
      rm -rf "$bootstrap"
      apt_install python3-venv
      python3 -m venv "$bootstrap"
    fi
    "$bootstrap/bin/pip" install --quiet --disable-pip-version-check uv
  fi
  uv=("$bootstrap/bin/uv")
fi

if [ -d .venv ]; then
  say "checking .venv against uv.lock"
  progress=--quiet
else
  say "creating .venv from uv.lock (the first time downloads ~190 packages: a minute or two, more on a busy machine)"
  progress=  # uv says what it did at each stage (resolve, download, install, compile), minutes apart
fi
# Bytecode is compiled now because the sandboxed kernel sees the venv read-only and would otherwise
# compile IPython & co. from source on every start (~0.3 s each time). ipybox's own packages too: the
# kernel sees ipybox_kernel read-only, and where PYTHONDONTWRITEBYTECODE is set every host process
# would compile ipybox from source (~0.25 s of CPU each; the tests start hundreds).
"${uv[@]}" sync --frozen $progress --compile-bytecode --all-extras
.venv/bin/python -m compileall -q ipybox_kernel ipybox >/dev/null

if $test_servers; then
  # Debian's own nodejs package is enough for the test servers.
  command -v npm >/dev/null 2>&1 || apt_install nodejs npm
  # npm ci deletes node_modules and installs again (~12 s): only when the lock file changed since.
  if ! cmp -s package-lock.json node_modules/.ipybox-package-lock.json; then
    say "installing the npm packages of package-lock.json into node_modules"
    npm ci --silent --no-audit --no-fund >/dev/null
    cp package-lock.json node_modules/.ipybox-package-lock.json
  fi
fi
