"""Running the cookbook notebooks, and checking that what they print now is what they stored.

A notebook in ``cookbook/`` is committed with the outputs of a real run, so that it reads well where
it is browsed. A run that errs, or a cell that runs longer than `CELL_TIMEOUT`, fails. What a cell
printed is compared with what it stored, after `normalise` (which hides what changes from run to run
without the code doing anything different: ANSI colours, object addresses, long hex ids, durations,
messages libraries print only on a slow machine):

- by default the whole text output must be equal;
- a cell tagged ``loose`` (its output depends on the machine, e.g. an installer's messages) only
  needs to print again, in order, every stored line that starts with ``approval `` (the notebooks
  print each approval decision that way);
- in every cell the rich outputs must have the same MIME types in the same order (a plot that no
  longer comes back as an image fails).

Run as a script to refresh the stored outputs (``scripts/cookbook.sh [NOTEBOOK ...]``), or with
``--check`` to compare without writing.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import nbformat
from nbclient import NotebookClient
from nbformat import NotebookNode

REPO = Path(__file__).resolve().parents[1]
COOKBOOK = REPO / "cookbook"
# The longest a single cell may run. The slowest cells (the kernel imports pandas and matplotlib
# in the sandbox; approvals_as_policy restarts the kernel three times) take a few seconds on the
# 2-core development VM, and over 60 s when it is shared by a handful of test runs.
CELL_TIMEOUT = 180
KERNEL = "python3"
LOOSE_TAG = "loose"
APPROVAL_PREFIX = "approval "

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_ADDRESS = re.compile(r"\b0x[0-9a-fA-F]+\b")
_HEX_ID = re.compile(r"\b(?=[0-9]*[a-f])[0-9a-f]{8,}\b")
_DURATION = re.compile(r"\b\d+(?:\.\d+)?\s?(?:ms|s|seconds)\b")
# Lines a library prints only when the machine is slow: matplotlib says this when building its font
# cache (each sandboxed kernel starts with an empty one) takes longer than 5 s.
_SLOW_MACHINE_LINES = re.compile(r"^.*Matplotlib is building the font cache; this may take a moment\.\n", re.MULTILINE)


def notebooks() -> list[Path]:
    """The cookbook's notebooks, by name."""
    return sorted(COOKBOOK.glob("*.ipynb"))


def read(path: Path) -> NotebookNode:
    return cast("NotebookNode", nbformat.read(path, as_version=4))  # pyright: ignore[reportUnknownMemberType]


def execute(notebook: NotebookNode, directory: Path, *, cell_timeout: int = CELL_TIMEOUT) -> NotebookNode:
    """Run every cell of ``notebook`` (in place, and returned) with ``directory`` as its working directory.

    Raises:
        nbclient.exceptions.CellExecutionError: A cell raised.
        nbclient.exceptions.CellTimeoutError: A cell ran longer than ``cell_timeout`` seconds.
    """
    client = NotebookClient(
        notebook,
        timeout=cell_timeout,
        kernel_name=KERNEL,
        record_timing=False,
        resources={"metadata": {"path": str(directory)}},
    )
    # ipykernel gives sys.stderr no file descriptor when it sees PYTEST_CURRENT_TEST, and the MCP
    # SDK's stdio client needs one: the notebook kernel must not inherit it from the test run.
    env = {name: value for name, value in os.environ.items() if name != "PYTEST_CURRENT_TEST"}
    client.execute(env=env)
    return notebook


def normalise(text: str) -> str:
    """``text`` without what differs between runs of unchanged code."""
    text = _ANSI.sub("", text)
    text = _SLOW_MACHINE_LINES.sub("", text)
    text = _ADDRESS.sub("<address>", text)
    text = _HEX_ID.sub("<id>", text)
    return _DURATION.sub("<duration>", text)


@dataclass(frozen=True)
class CellOutput:
    """What one code cell showed: its text (streams and text forms of results) and its rich outputs' types."""

    index: int
    source: str
    loose: bool
    text: str
    kinds: tuple[str, ...]


def outputs(notebook: NotebookNode) -> list[CellOutput]:
    """The outputs of ``notebook``'s code cells, normalised."""
    found: list[CellOutput] = []
    for index, cell in enumerate(cast("list[NotebookNode]", notebook.cells)):
        if cell.cell_type != "code":
            continue
        text: list[str] = []
        kinds: list[str] = []
        for output in cast("list[NotebookNode]", cell.get("outputs", [])):
            if output.output_type == "stream":
                text.append(str(output.text))
            elif output.output_type in ("execute_result", "display_data"):
                data = cast("dict[str, Any]", output.data)
                kinds.append("+".join(sorted(data)))
                if "text/plain" in data:
                    text.append(str(data["text/plain"]) + "\n")
            elif output.output_type == "error":
                text.append(f"{output.ename}: {output.evalue}\n")
        tags = cast("list[str]", cell.get("metadata", {}).get("tags", []))
        found.append(
            CellOutput(
                index=index,
                source=str(cell.source),
                loose=LOOSE_TAG in tags,
                text=normalise("".join(text)),
                kinds=tuple(kinds),
            )
        )
    return found


def _approval_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(APPROVAL_PREFIX)]


def _missing_in_order(wanted: list[str], lines: list[str]) -> list[str]:
    """The ``wanted`` lines that do not appear in ``lines`` in the same order."""
    rest = iter(lines)
    return [line for line in wanted if not any(candidate == line for candidate in rest)]


def differences(stored: NotebookNode, fresh: NotebookNode) -> list[str]:
    """How ``fresh`` (a new run) differs in an important way from ``stored`` (the committed notebook)."""
    old, new = outputs(stored), outputs(fresh)
    if [cell.source for cell in old] != [cell.source for cell in new]:
        return ["the code cells differ between the stored notebook and the run"]
    found: list[str] = []
    for before, after in zip(old, new, strict=True):
        where = f"cell {before.index} ({before.source.strip().splitlines()[0] if before.source.strip() else 'empty'!r})"
        if before.kinds != after.kinds:
            found.append(f"{where}: rich outputs were {list(before.kinds)}, now {list(after.kinds)}")
        if before.loose:
            missing = _missing_in_order(_approval_lines(before.text), after.text.splitlines())
            if missing:
                found.append(f"{where}: approval lines no longer printed (in this order): {missing}")
        elif before.text != after.text:
            found.append(f"{where}: output changed\n--- stored\n{before.text}--- now\n{after.text}")
    return found


def machine_paths() -> list[str]:
    """Absolute paths of this machine that a committed notebook must not contain."""
    candidates = {str(REPO), str(Path.home()), tempfile.gettempdir(), sys.prefix, sys.base_prefix}
    return sorted(path + "/" for path in candidates if path not in ("", "/"))


def leaked_paths(path: Path) -> list[str]:
    """The machine paths (see `machine_paths`) that the notebook file at ``path`` contains."""
    content = path.read_text(encoding="utf-8")
    return [prefix for prefix in machine_paths() if prefix in content]


def refresh(path: Path) -> list[str]:
    """Run the notebook at ``path`` and store its new outputs; returns the machine paths it now leaks."""
    notebook = execute(read(path), path.parent)
    nbformat.write(notebook, path)  # pyright: ignore[reportUnknownMemberType]
    return leaked_paths(path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run cookbook notebooks and store (or check) their outputs.")
    parser.add_argument("notebooks", nargs="*", type=Path, help="notebooks to run (default: all in cookbook/)")
    parser.add_argument("--check", action="store_true", help="compare with the stored outputs; write nothing")
    args = parser.parse_args(argv)
    # A name alone means the notebook in cookbook/.
    paths = [(p if p.exists() else COOKBOOK / p).resolve() for p in args.notebooks] or notebooks()
    status = 0
    for path in paths:
        if args.check:
            problems = differences(read(path), execute(read(path), path.parent))
        else:
            leaked = refresh(path)
            problems = [f"contains the machine path {prefix!r}; print paths relative to it" for prefix in leaked]
        for problem in problems:
            print(f"{path.name}: {problem}", file=sys.stderr)
        status = status or int(bool(problems))
        print(f"{path.name}: {'FAILED' if problems else 'ok'}")
    return status


if __name__ == "__main__":
    sys.exit(main())
