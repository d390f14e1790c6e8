"""The documentation site covers the public API and the whole cookbook (scripts/test.sh builds it strictly)."""

from __future__ import annotations

import html
import os
import re
import subprocess
from pathlib import Path

import pytest
from cookbook_support import REPO, notebooks

import ipybox


def test_the_api_reference_documents_every_public_name_and_nothing_else() -> None:
    reference = (REPO / "docs" / "reference.md").read_text(encoding="utf-8")
    documented = re.findall(r"^::: ipybox\.(\w+)$", reference, flags=re.MULTILINE)
    assert sorted(documented) == sorted(ipybox.__all__)


def test_every_cookbook_notebook_is_in_the_site_navigation() -> None:
    config = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    listed = set(re.findall(r"cookbook/(\w+\.ipynb)", config))
    assert {path.name for path in notebooks()} <= listed


def _rendered_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site scripts/test.sh built just before the tests (site/), or a fresh build when that is
    missing or older than a page."""
    site = REPO / "site"
    sources = [REPO / "README.md", REPO / "mkdocs.yml", *(REPO / "docs").glob("*.md")]
    if (site / "index.html").exists() and all(
        p.stat().st_mtime <= (site / "index.html").stat().st_mtime for p in sources
    ):
        return site
    out = tmp_path_factory.mktemp("site")
    subprocess.run(
        [str(REPO / ".venv" / "bin" / "mkdocs"), "build", "--strict", "--quiet", "--site-dir", str(out)],
        cwd=REPO,
        env=os.environ | {"NO_MKDOCS_2_WARNING": "1"},
        check=True,
        timeout=600,
    )
    return out


def _headings_outside_code(markdown: str) -> list[str]:
    headings: list[str] = []
    in_code = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("## "):
            headings.append(line[3:].strip())
    return headings


def test_every_page_renders_its_headings_and_no_code_fence_swallows_text(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # mkdocs build --strict passes when a fence with text after it swallows the rest of a page:
    # only the rendered page shows it.
    site = _rendered_site(tmp_path_factory)
    for page in sorted((REPO / "docs").glob("*.md")):
        html_path = site / "index.html" if page.stem == "index" else site / page.stem / "index.html"
        rendered = html.unescape(re.sub(r"<[^>]+>", "", html_path.read_text(encoding="utf-8")))
        assert "```" not in rendered, f"{page.name}: a code fence shows as text"
        for heading in _headings_outside_code(page.read_text(encoding="utf-8")):
            assert f"\n{heading}" in rendered, f"{page.name}: the heading {heading!r} is not rendered"
    assert (site / "images" / "architecture.svg").is_file()
