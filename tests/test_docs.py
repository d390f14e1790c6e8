"""The documentation site covers the public API and the whole cookbook (scripts/test.sh builds it strictly)."""

from __future__ import annotations

import re

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
