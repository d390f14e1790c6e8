"""Every Python block of the README and the documentation pages runs as written, or says on its first
line that it is a fragment (``# fragment: why``), which is then only compiled.

A block that names a hosted model (a ``MODEL = ...`` line) runs with its framework's own test model in
that line's place (tests/snippet_models.py). Each block runs as a script in a directory of its own,
with this checkout's environment, answering ``y`` to whatever it asks on stdin.

The scripts run two at a time, started in the order of the tests, each test waiting for its own: a
script is mostly process start-ups (Python, its framework's imports, the example server, a sandboxed
kernel), so one at a time left a core idle for most of this file's minutes.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from install_support import REPO
from snippet_models import ANSWER

FRAGMENT = "# fragment:"
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# A script: generate the example server's tools, start a sandboxed kernel, run a code action or two.
RUN_TIMEOUT = 300.0
# pytest-timeout's default (120 s) is shorter than a script may take on a busy machine (a snippet took
# 121 s at load 19): the script's own timeout is the budget, with a minute to report it.
pytestmark = pytest.mark.timeout(RUN_TIMEOUT + 60)
# Scripts run at once: two keep both cores busy (each waits on its own processes part of the time).
CONCURRENT = 2
# Which test model stands in for a snippet's MODEL, by the framework the snippet imports.
TEST_MODELS = {
    "from langchain": "langchain_model",
    "from pydantic_ai": "pydantic_ai_model",
    "from agents": "openai_agents_model",
}


def _blocks() -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for number, match in enumerate(re.finditer(r"^```python\n(.*?)^```$", text, re.MULTILINE | re.DOTALL), 1):
            found.append((f"{page.relative_to(REPO)}#{number}", match.group(1)))
    return found


BLOCKS = _blocks()


def _with_test_model(code: str) -> str:
    if not re.search(r"^MODEL = ", code, re.MULTILINE):
        return code
    (model,) = [function for imported, function in TEST_MODELS.items() if imported in code]
    return re.sub(
        r"^MODEL = .*$", f"from snippet_models import {model}\nMODEL = {model}()", code, count=1, flags=re.MULTILINE
    )


def test_the_pages_have_python_blocks_to_check() -> None:
    runnable = [name for name, code in BLOCKS if not code.startswith(FRAGMENT)]
    assert "README.md#1" in runnable
    assert len(runnable) >= 5, runnable


def _run(name: str, code: str, directory: Path) -> subprocess.CompletedProcess[str]:
    """Run one block as a script in ``directory``."""
    script = directory / "snippet.py"
    script.write_text(_with_test_model(code), encoding="utf-8")
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=directory,
        input="y\n" * 20,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "PYTHONPATH": str(REPO / "tests")},
    )


@pytest.fixture(scope="module")
def runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Future[subprocess.CompletedProcess[str]]]]:
    """Every selected runnable block, started on a bounded pool in the order of the tests."""
    selected = [
        str(item.callspec.params["name"])
        for item in request.session.items
        if isinstance(item, pytest.Function) and item.module is sys.modules[__name__] and "name" in item.fixturenames
    ]
    code = dict(BLOCKS)
    with ThreadPoolExecutor(CONCURRENT) as pool:
        futures = {
            name: pool.submit(_run, name, code[name], tmp_path_factory.mktemp("snippet"))
            for name in dict.fromkeys(selected)
            if not code[name].startswith(FRAGMENT)
        }
        yield futures
        for future in futures.values():
            future.cancel()


@pytest.mark.parametrize(("name", "code"), BLOCKS, ids=[name for name, _ in BLOCKS])
def test_a_documented_python_block_runs_as_written_or_is_marked_as_a_fragment(
    name: str, code: str, runs: dict[str, Future[subprocess.CompletedProcess[str]]]
) -> None:
    if code.startswith(FRAGMENT):
        # Fragments still have to be Python (top-level await is allowed: they run in an async function).
        compile(code, name, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        return
    done = runs[name].result()
    assert done.returncode == 0, (
        f"{name} failed (add '{FRAGMENT} why' as its first line if it cannot run):\n{done.stderr}"
    )
    if "MODEL = " in code:
        assert ANSWER in done.stdout, done.stdout
