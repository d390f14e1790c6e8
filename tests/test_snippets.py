"""Every Python block of the README and the documentation pages runs as written, or says on its first
line that it is a fragment (``# fragment: why``), which is then only compiled.

A block that names a hosted model (a ``MODEL = ...`` line) runs with its framework's own test model in
that line's place (tests/snippet_models.py). Each block runs as a script in a directory of its own,
with this checkout's environment, answering ``y`` to whatever it asks on stdin.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
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


@pytest.mark.parametrize(("name", "code"), BLOCKS, ids=[name for name, _ in BLOCKS])
def test_a_documented_python_block_runs_as_written_or_is_marked_as_a_fragment(
    name: str, code: str, tmp_path: Path
) -> None:
    if code.startswith(FRAGMENT):
        # Fragments still have to be Python (top-level await is allowed: they run in an async function).
        compile(code, name, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        return
    script = tmp_path / "snippet.py"
    script.write_text(_with_test_model(code), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        input="y\n" * 20,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "PYTHONPATH": str(REPO / "tests")},
    )
    assert done.returncode == 0, (
        f"{name} failed (add '{FRAGMENT} why' as its first line if it cannot run):\n{done.stderr}"
    )
    if "MODEL = " in code:
        assert ANSWER in done.stdout, done.stdout
