"""The cookbook notebooks run, and still print what they were committed with (see cookbook_support)."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from cookbook_support import (
    APPROVAL_PREFIX,
    COOKBOOK,
    LOOSE_TAG,
    differences,
    execute,
    leaked_paths,
    normalise,
    notebooks,
    read,
)
from nbclient.exceptions import CellExecutionError, CellTimeoutError
from nbformat import NotebookNode
from nbformat.v4 import new_code_cell, new_notebook, new_output  # pyright: ignore[reportUnknownVariableType]

NOTEBOOKS = notebooks()


def _named(name: str) -> Path:
    return next(path for path in NOTEBOOKS if path.name == name)


def _notebook(*cells: tuple[str, str, list[str]]) -> NotebookNode:
    """A notebook of code cells, each given as (source, stored stdout, tags)."""
    notebook = new_notebook()
    for source, stdout, tags in cells:
        cell = new_code_cell(source, outputs=[new_output("stream", name="stdout", text=stdout)])
        cell.metadata["tags"] = tags
        notebook.cells.append(cell)
    return notebook


def test_the_cookbook_has_the_engine_notebooks() -> None:
    assert {path.name for path in NOTEBOOKS} >= {
        "quickstart.ipynb",
        "data_and_pictures.ipynb",
        "approvals_as_policy.ipynb",
        "mcp_server.ipynb",
    }


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[path.stem for path in NOTEBOOKS])
def test_the_notebook_runs_and_prints_what_it_stored(path: Path) -> None:
    stored = read(path)
    assert any(cell.get("outputs") for cell in stored.cells), (
        f"{path.name} has no stored outputs; run scripts/cookbook.sh {path.name}"
    )
    fresh = execute(read(path), COOKBOOK)
    problems = differences(stored, fresh)
    assert not problems, (
        f"{path.name} no longer prints what it stored; if the change is intended, run "
        f"scripts/cookbook.sh {path.name} and review the diff:\n" + "\n".join(problems)
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[path.stem for path in NOTEBOOKS])
def test_the_notebook_stores_no_absolute_path_of_the_machine_that_ran_it(path: Path) -> None:
    assert leaked_paths(path) == []


def test_a_notebook_whose_code_no_longer_does_what_its_stored_output_shows_fails_the_check(tmp_path: Path) -> None:
    notebook = read(_named("quickstart.ipynb"))
    # The policy now accepts e-mail, while the stored outputs still show the rejection.
    [policy] = [cell for cell in notebook.cells if 'return "this notebook sends no e-mail"' in cell.source]
    policy.source = policy.source.replace('return "this notebook sends no e-mail"', "return None")
    copy = tmp_path / "quickstart.ipynb"
    nbformat.write(notebook, copy)  # pyright: ignore[reportUnknownMemberType]

    problems = differences(read(copy), execute(read(copy), COOKBOOK))

    [problem] = problems
    assert "output changed" in problem
    assert 'weather.send_report(recipient="team@example.com"' in problem
    assert ": rejected\nnot sent: this notebook sends no e-mail" in problem.split("--- now")[0]
    assert ": accepted\n" in problem.split("--- now")[1]


def test_a_cell_that_raises_fails_the_run(tmp_path: Path) -> None:
    notebook = read(_named("quickstart.ipynb"))
    notebook.cells = [*notebook.cells[:2], new_code_cell("raise RuntimeError('broken on purpose')")]
    with pytest.raises(CellExecutionError, match="broken on purpose"):
        execute(notebook, tmp_path)


def test_a_cell_that_runs_longer_than_the_bound_fails_the_run(tmp_path: Path) -> None:
    notebook = _notebook(("import threading\nthreading.Event().wait()", "", []))
    with pytest.raises(CellTimeoutError):
        execute(notebook, tmp_path, cell_timeout=2)


def test_normalising_hides_ids_addresses_and_durations_but_not_values() -> None:
    assert normalise("\x1b[31mx3:1\x1b[0m took 0.42 s at 0x7f3a2c1d9e80, run 3f2a9c1be4d07a61") == (
        "x3:1 took <duration> at <address>, run <id>"
    )
    assert normalise("oslo 4.7 °C, 12345678 readings") == "oslo 4.7 °C, 12345678 readings"
    slow = "Matplotlib is building the font cache; this may take a moment.\n"
    assert normalise(f"{slow}mean 2.7\n") == "mean 2.7\n"


def test_outputs_that_differ_only_in_ids_and_durations_pass_and_changed_values_fail() -> None:
    stored = _notebook(("work()", "done in 1.2 s, 42 rows\n", []))
    same = _notebook(("work()", "done in 3.9 s, 42 rows\n", []))
    changed = _notebook(("work()", "done in 1.2 s, 41 rows\n", []))
    assert differences(stored, same) == []
    assert differences(stored, changed) != []


def test_a_loose_cell_needs_only_its_stored_approval_lines_in_their_order() -> None:
    lines = f"{APPROVAL_PREFIX}a: accepted\ninstaller chatter\n{APPROVAL_PREFIX}b: rejected\n"
    stored = _notebook(("act()", lines, [LOOSE_TAG]))
    chatty = _notebook(("act()", f"other chatter\n{APPROVAL_PREFIX}a: accepted\n{APPROVAL_PREFIX}b: rejected\n", []))
    swapped = _notebook(("act()", f"{APPROVAL_PREFIX}b: rejected\n{APPROVAL_PREFIX}a: accepted\n", []))
    no_longer_asked = _notebook(("act()", f"{APPROVAL_PREFIX}a: accepted\n", []))
    assert differences(stored, chatty) == []
    assert differences(stored, swapped) != []
    [problem] = differences(stored, no_longer_asked)
    assert f"{APPROVAL_PREFIX}b: rejected" in problem
