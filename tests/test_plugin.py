"""The Claude Code plugin as a user installs it, with the real Claude Code CLI, offline: from a clone's
directory, and from the repository's git URL.

The marketplace is a copy of this repository, as a directory or served over git's smart HTTP on
127.0.0.1 (what `claude plugin marketplace add https://github.com/....git` talks to; the CLI refuses
file:// URLs there). Claude Code runs the plugin from the directory, or from its copy of the plugin
directory (with the package its symlinks point to), with uv from uv.lock, so ipybox comes from this
source and nothing from the package index (uv runs offline, on the cache setup.sh filled).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from install_support import REPO, copy_of_the_repository
from servers.git_http import git_over_http

import ipybox

pytestmark = pytest.mark.timeout(600)

CLAUDE = REPO / "node_modules" / ".bin" / "claude"
# Each CLI command starts Node and reads its settings; health checks start the server.
COMMAND_TIMEOUT = 120.0
# The first start of the server makes the plugin's .venv from uv.lock (~50 packages from the cache,
# compiled to bytecode): a minute on a busy 2-core machine.
FIRST_START_TIMEOUT = 480.0


def _claude(args: list[str], cwd: Path, env: dict[str, str], timeout: float = COMMAND_TIMEOUT) -> str:
    done = subprocess.run(
        [str(CLAUDE), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, f"claude {' '.join(args)}: {done.stdout}{done.stderr}"
    return done.stdout


@pytest.mark.skipif(not CLAUDE.exists(), reason="node_modules is absent; run `bash scripts/setup.sh --test-servers`")
@pytest.mark.parametrize("source", ["directory", "git URL"])
def test_the_plugin_installed_from_a_clone_connects_and_runs_the_clones_ipybox_without_the_package_index(
    source: str, tmp_path: Path
) -> None:
    clone = copy_of_the_repository(tmp_path / "ipybox")
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    project.mkdir()
    uv_cache = subprocess.run(
        [str(REPO / ".venv" / "bin" / "uv"), "cache", "dir"], capture_output=True, text=True, check=True
    ).stdout.strip()
    env = {
        # uv on PATH, as the plugin needs; no ipybox on it.
        "PATH": f"{REPO / '.venv' / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "UV_CACHE_DIR": uv_cache,
        "UV_OFFLINE": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        # Claude Code's wait for a server to start, in ms: the first start builds the environment.
        "MCP_TIMEOUT": str(int(FIRST_START_TIMEOUT * 1000)),
    }

    assert "Validation passed" in _claude(["plugin", "validate", str(clone / "plugin")], project, env)
    assert "Validation passed" in _claude(["plugin", "validate", str(clone)], project, env)
    if source == "directory":
        _claude(["plugin", "marketplace", "add", str(clone)], project, env)
    else:
        with git_over_http(clone, "ipybox") as url:
            _claude(["plugin", "marketplace", "add", url], project, env)
    _claude(["plugin", "install", "ipybox@ipybox"], project, env)
    listed = _claude(["mcp", "list"], project, env, timeout=FIRST_START_TIMEOUT)
    (line,) = [line for line in listed.splitlines() if line.startswith("plugin:ipybox:ipybox:")]
    assert line.endswith("✔ Connected"), listed

    # The server ran the clone's source: the environment uv made for it holds the package built from
    # the plugin's directory, version 1.0.0.dev0, which the package index has never had.
    # (Claude Code runs a plugin from a directory marketplace in place, and one from a git URL from its copy.)
    made = [*clone.glob("plugin/.venv"), *home.glob(".claude/plugins/cache/ipybox/ipybox/*/.venv")]
    assert made[0].is_relative_to(clone if source == "directory" else home), made
    (venv,) = made
    shown = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import ipybox; print(ipybox.__version__, ipybox.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": os.environ["PATH"]},
        cwd=project,
    ).stdout.split()
    assert shown[0] == ipybox.__version__
    assert shown[1].startswith(str(venv / "lib"))
