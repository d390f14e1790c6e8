"""The README's demo command on a stock Debian/Ubuntu system: the distribution's python3 (which refuses
pip installs, PEP 668) first on PATH, no uv, no node or npm, a fresh home directory.

The copy of the repository has no .venv, so setup.sh makes everything itself. Only the download caches
of uv and pip are shared with this machine's (they hold files from the package index, nothing
installed), so the test does not download ~190 packages again.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from install_support import REPO, copy_of_the_repository

pytestmark = [pytest.mark.install, pytest.mark.timeout(900)]

STOCK_PYTHON = Path("/usr/bin/python3")
# A first setup resolves nothing but copies ~190 packages from the cache and compiles their bytecode.
SETUP_TIMEOUT = 600.0


def _stock_python_is_externally_managed() -> bool:
    if not STOCK_PYTHON.exists():
        return False
    stdlib = subprocess.run(
        [str(STOCK_PYTHON), "-c", "import sysconfig; print(sysconfig.get_path('stdlib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return (Path(stdlib) / "EXTERNALLY-MANAGED").exists()


def _failing_tools(bin_dir: Path) -> Path:
    """node, npm and npx that fail loudly when run: the demo must need none of them."""
    bin_dir.mkdir()
    for tool in ("node", "npm", "npx"):
        script = bin_dir / tool
        script.write_text(f"#!/bin/sh\necho '{tool} is not installed on a stock system' >&2\nexit 127\n")
        script.chmod(0o755)
    return bin_dir


def _download_caches() -> dict[str, str]:
    uv = subprocess.run(
        [str(REPO / ".venv" / "bin" / "uv"), "cache", "dir"], capture_output=True, text=True, check=True
    )
    pip = os.environ.get("PIP_CACHE_DIR") or str(Path.home() / ".cache" / "pip")
    return {"UV_CACHE_DIR": uv.stdout.strip(), "PIP_CACHE_DIR": pip}


@pytest.mark.skipif(
    not _stock_python_is_externally_managed(), reason="needs a distribution python3 marked EXTERNALLY-MANAGED"
)
def test_the_demo_command_sets_up_and_runs_with_the_distributions_python_and_no_uv_or_npm(tmp_path: Path) -> None:
    repo = copy_of_the_repository(tmp_path / "repo")
    home = tmp_path / "home"
    home.mkdir()
    bin_dir = _failing_tools(tmp_path / "bin")
    env = {
        "PATH": f"{bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(home),
        "LANG": "C.UTF-8",
        # How this machine reaches the package index (a proxy, its certificates) is the network's
        # setting, not a tool: passed on as it is.
        **{k: v for k, v in os.environ.items() if re.search(r"proxy|ssl_cert|ca_bundle|pip_cert", k, re.IGNORECASE)},
        **_download_caches(),
    }
    # The system's python3 refuses to install uv (or has no pip at all), as on a stock Debian 12.
    refused = subprocess.run(["python3", "-m", "pip", "install", "--dry-run", "uv"], env=env, capture_output=True)
    assert refused.returncode != 0

    demo = subprocess.run(
        ["bash", "scripts/demo.sh"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=SETUP_TIMEOUT,
        stdin=subprocess.DEVNULL,
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    # Each long step said what it was doing before it started.
    assert f"setup: installing uv into {home}/.cache/ipybox/bootstrap" in demo.stdout, demo.stdout
    assert "setup: creating .venv from uv.lock" in demo.stdout
    assert "not sent: this demo never sends e-mail" in demo.stdout, demo.stdout
    assert not (repo / "node_modules").exists()
    base = subprocess.run(
        [str(repo / ".venv" / "bin" / "python"), "-c", "import sys; print(sys.base_prefix)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert base.stdout == "/usr\n", "the environment is built on the distribution's python3"

    # Nothing changed: a second setup repeats no install step.
    started = time.monotonic()
    again = subprocess.run(
        ["bash", "scripts/setup.sh"], cwd=repo, env=env, capture_output=True, text=True, timeout=SETUP_TIMEOUT
    )
    elapsed = time.monotonic() - started
    assert again.returncode == 0, again.stderr
    assert again.stdout == "setup: checking .venv against uv.lock\n", again.stdout
    print(f"second setup: {elapsed:.1f} s")
