"""What a user gets from the package index and the manifests: this project, under one version."""

from __future__ import annotations

import json
import re
from importlib.metadata import metadata
from pathlib import Path
from typing import Any

from packaging.version import Version

import ipybox

REPO = Path(__file__).resolve().parents[1]
# The newest release of the unrelated earlier project published as "ipybox" on PyPI; a version at
# or below it would make `pip install ipybox` and `uvx ipybox` pick the old project.
NEWEST_EARLIER_IPYBOX = Version("0.9.2")
# The server.json fields of the MCP registry schema its "$schema" names (2025-09-29).
SERVER_FIELDS = frozenset(
    {
        "$schema",
        "name",
        "title",
        "description",
        "version",
        "websiteUrl",
        "repository",
        "icons",
        "packages",
        "remotes",
        "_meta",
    }
)
PACKAGE_FIELDS = frozenset(
    {
        "registryType",
        "registryBaseUrl",
        "identifier",
        "version",
        "fileSha256",
        "runtimeHint",
        "transport",
        "runtimeArguments",
        "packageArguments",
        "environmentVariables",
    }
)
ARGUMENT_FIELDS = frozenset(
    {
        "type",
        "name",
        "value",
        "valueHint",
        "description",
        "isRequired",
        "isRepeated",
        "isSecret",
        "format",
        "default",
        "choices",
        "variables",
    }
)


# Semantic Versioning 2.0.0 without build metadata: what Claude Code's plugin.json "version" must follow.
SEMVER = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-(0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*)(\.(0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*))*)?"
)

SEMVER_PRE_LABELS = {"a": "alpha", "b": "beta", "rc": "rc"}


def _json(relative: str) -> Any:
    return json.loads((REPO / relative).read_text())


def _as_semver(version: Version) -> str:
    """The semver spelling of a PEP 440 version: ``1.0.0.dev0`` -> ``1.0.0-dev.0``, ``1.2.0rc1`` -> ``1.2.0-rc.1``.

    Only the shapes this project releases: a development or a pre-release of X.Y.Z, not both, no post-release.
    """
    assert len(version.release) <= 3 and version.post is None and version.local is None, version
    assert version.pre is None or version.dev is None, version
    release = ".".join(map(str, (*version.release, 0, 0)[:3]))
    if version.dev is not None:
        return f"{release}-dev.{version.dev}"
    if version.pre is not None:
        label, number = version.pre
        return f"{release}-{SEMVER_PRE_LABELS[label]}.{number}"
    return release


def test_the_version_comes_from_the_package_metadata_and_sorts_after_every_earlier_ipybox() -> None:
    version = metadata("ipybox")["Version"]
    assert ipybox.__version__ == version
    assert Version(version) > NEWEST_EARLIER_IPYBOX


def test_the_registry_entry_the_plugin_and_the_install_steps_carry_the_package_version() -> None:
    entry = _json("server.json")
    assert entry["version"] == ipybox.__version__
    assert [p["version"] for p in entry["packages"]] == [ipybox.__version__]
    # Claude Code plugin manifests take semver, which spells a PEP 440 development release differently.
    plugin_version = _json("plugin/.claude-plugin/plugin.json")["version"]
    assert plugin_version == _as_semver(Version(ipybox.__version__))
    assert SEMVER.fullmatch(plugin_version), plugin_version
    install = (REPO / "docs" / "install.md").read_text()
    assert f"dist/ipybox-{ipybox.__version__}-py3-none-any.whl" in install
    assert f'"ipybox>={ipybox.__version__}"' in install


def test_the_plugin_runs_this_project_and_never_an_earlier_ipybox_from_the_index() -> None:
    # The server runs the package the plugin directory carries (symlinks Claude Code follows when it
    # copies the plugin), in an environment uv makes from this project's lock file.
    server = _json("plugin/.mcp.json")["mcpServers"]["ipybox"]
    assert (server["command"], server["args"][0]) == ("sh", "${CLAUDE_PLUGIN_ROOT}/run-server.sh")
    plugin = REPO / "plugin"
    for name in ("ipybox", "ipybox_kernel", "pyproject.toml", "uv.lock", "README.md", "LICENSE"):
        assert (plugin / name).resolve() == REPO / name, name
    assert "--frozen" in (plugin / "run-server.sh").read_text()


def test_the_registry_entry_uses_only_fields_of_its_schema_and_fits_its_limits() -> None:
    entry = _json("server.json")
    assert entry["$schema"] == "https://static.modelcontextprotocol.io/schemas/2025-09-29/server.schema.json"
    assert {"name", "description", "version"} <= set(entry) <= SERVER_FIELDS
    assert re.fullmatch(r"[a-zA-Z0-9.-]+/[a-zA-Z0-9._-]+", entry["name"])
    assert 1 <= len(entry["description"]) <= 100 and 1 <= len(entry["title"]) <= 100
    for package in entry["packages"]:
        assert {"registryType", "identifier", "version", "transport"} <= set(package) <= PACKAGE_FIELDS
        assert (package["registryType"], package["registryBaseUrl"]) == ("pypi", "https://pypi.org")
        for argument in package["packageArguments"]:
            assert set(argument) <= ARGUMENT_FIELDS
            assert "value" in argument if argument["type"] == "positional" else argument["name"].startswith("--")
    # The registry accepts a PyPI package only when its description names the server like this.
    assert f"mcp-name: {entry['name']}" in (REPO / "README.md").read_text()


def test_the_license_is_the_apache_license_the_metadata_names() -> None:
    assert metadata("ipybox")["License-Expression"] == "Apache-2.0"
    text = (REPO / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License\n                           Version 2.0, January 2004")
    assert "END OF TERMS AND CONDITIONS" in text
