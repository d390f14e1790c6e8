"""Installing Python packages for the kernel, on the host.

The kernel has no network, so packages are installed by the host into a directory the sandbox
mounts read-only and puts on the kernel's ``sys.path``. The kernel cannot write there, so it cannot
plant links that would make the host's installer write elsewhere.

Installs run unsandboxed on the host, so they must run nothing a package provides: only binary
wheels are installed (a source distribution's build runs its ``setup.py`` or build backend, and any
sdist on the index, or one kernel code wrote into the workspace, would run with the host's powers),
requirements are plain names from the index (no paths, archives, URLs or options), and the
installer works in a fresh empty directory, never the workspace (``python -m pip`` run there would
even import a ``pip.py`` that kernel code planted).
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import anyio
from packaging.requirements import InvalidRequirement, Requirement

from ._exceptions import IpyboxError, UsageError

__all__ = ("PackageInstallError", "install_package", "parse_requirement")

# pip resolving and downloading a package with a few dependencies takes seconds; a large one
# (numpy, pandas) on a slow mirror can take minutes.
INSTALL_TIMEOUT = 600.0
# What pip and uv take for a local file rather than a project name (pip's ARCHIVE_EXTENSIONS, and eggs).
_ARCHIVE = re.compile(r"\.(whl|zip|tar|tar\.gz|tgz|tar\.bz2|tbz|tar\.xz|txz|tlz|tar\.lz|tar\.lzma|egg)$", re.IGNORECASE)
# Wheels only: building a source distribution runs its code on the host.
_WHEELS_ONLY = ("--only-binary", ":all:")
_EXAMPLE = "give a package name from the index, like 'requests' or 'numpy>=2,<3'"


class PackageInstallError(IpyboxError):
    """A package could not be installed.

    Attributes:
        package: The requirement that was asked for.
        output: The installer's output (last part).
    """

    def __init__(self, package: str, output: str) -> None:
        super().__init__(
            f"installing {package!r} failed (ipybox installs binary wheels only and builds nothing from source "
            "on the host: a package without a wheel for this Python and platform cannot be installed; pick a "
            f"version that has one, or add it to the environment the kernel runs from):\n{output}".rstrip()
        )
        self.package = package
        self.output = output


def parse_requirement(spec: str) -> Requirement:
    """Validate a requirement such as ``"requests"`` or ``"numpy>=2,<3"``.

    Paths, archives (``x.tar.gz``, ``x.whl``), URLs and installer options are refused: the spec may
    come from untrusted kernel code, and the installer would take a local file instead of a name.

    Raises:
        UsageError: The spec is not a plain requirement from the package index.
    """
    if not isinstance(spec, str) or not spec.strip():  # pyright: ignore[reportUnnecessaryIsInstance]
        raise UsageError(f"a package requirement must be a non-empty string, got {spec!r}; {_EXAMPLE}")
    spec = spec.strip()
    if spec.startswith("-"):
        raise UsageError(f"{spec!r} looks like an installer option; options are not supported; {_EXAMPLE}")
    if "://" in spec or spec.lower().startswith("file:"):
        raise UsageError(
            f"{spec!r} installs from a URL; only packages from the package index can be installed; {_EXAMPLE}"
        )
    if any(c in spec for c in "/\\") or spec.startswith((".", "~")):
        raise UsageError(
            f"{spec!r} looks like a file path; local files and directories are never installed (they could "
            f"build code on the host); {_EXAMPLE}"
        )
    try:
        requirement = Requirement(spec)
    except InvalidRequirement as exc:
        raise UsageError(f"{spec!r} is not a valid requirement ({exc}); {_EXAMPLE}") from None
    if requirement.url:
        raise UsageError(
            f"{spec!r} installs from a URL; only packages from the package index can be installed; {_EXAMPLE}"
        )
    if _ARCHIVE.search(requirement.name):
        raise UsageError(
            f"{spec!r} looks like a package file, which the installer would read from disk; local archives are "
            f"never installed (a source archive builds code on the host); {_EXAMPLE}"
        )
    return requirement


def _pip(python: str) -> list[str]:
    return [python, "-m", "pip", "install", "--upgrade", "--no-input", "--disable-pip-version-check", *_WHEELS_ONLY]


def _uv(uv: str) -> list[str]:
    # --no-config: uv would read uv.toml/pyproject.toml from the directory it runs in and its parents.
    return [uv, "pip", "install", "--no-config", "--upgrade", *_WHEELS_ONLY, "--python", sys.executable]


def _installer() -> list[str]:
    """The install command line, up to its ``--target`` argument."""
    if importlib.util.find_spec("pip") is not None:
        return _pip(sys.executable)
    uv = shutil.which("uv")
    if uv is not None:
        return _uv(uv)
    # A venv made by uv has no pip; the interpreter it was made from usually does.
    return _pip(str(Path(sys.base_prefix) / "bin" / "python3"))


async def install_package(spec: str, target: Path, *, installer: list[str] | None = None) -> str:
    """Install a requirement into ``target``; returns the installer's output.

    ``installer`` is the install command without its target and requirement (default: pip when
    the host has it, else uv).

    Raises:
        UsageError: ``spec`` is not a plain requirement.
        PackageInstallError: The installer failed.
    """
    requirement = parse_requirement(spec)
    argv = [*(installer or _installer()), "--target", str(target), str(requirement)]
    # A fresh, empty working directory: nothing the kernel wrote is read as a file or a module.
    with tempfile.TemporaryDirectory(prefix="ipybox-install-") as cwd, anyio.fail_after(INSTALL_TIMEOUT):
        done = await anyio.run_process(argv, check=False, stderr=subprocess.STDOUT, cwd=cwd)
    output = done.stdout.decode("utf-8", "replace")
    if done.returncode != 0:
        raise PackageInstallError(str(requirement), output[-4000:])
    return output
