"""Installing Python packages for the kernel, on the host.

The kernel has no network, so packages are installed by the host into a directory the sandbox
mounts read-only and puts on the kernel's ``sys.path``. The kernel cannot write there, so it cannot
plant links that would make the host's installer write elsewhere.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import anyio
from packaging.requirements import InvalidRequirement, Requirement

from ._exceptions import IpyboxError, UsageError

__all__ = ("PackageInstallError", "install_package", "parse_requirement")

# pip resolving and downloading a package with a few dependencies takes seconds; a large one
# (numpy, pandas) on a slow mirror can take minutes.
INSTALL_TIMEOUT = 600.0


class PackageInstallError(IpyboxError):
    """A package could not be installed.

    Attributes:
        package: The requirement that was asked for.
        output: The installer's output (last part).
    """

    def __init__(self, package: str, output: str) -> None:
        super().__init__(f"installing {package!r} failed:\n{output}".rstrip())
        self.package = package
        self.output = output


def parse_requirement(spec: str) -> Requirement:
    """Validate a requirement such as ``"requests"`` or ``"numpy>=2,<3"``.

    URLs, paths and installer options are refused: the spec may come from untrusted kernel code.

    Raises:
        UsageError: The spec is not a plain requirement from the package index.
    """
    if not isinstance(spec, str) or not spec.strip():  # pyright: ignore[reportUnnecessaryIsInstance]
        raise UsageError(f"a package requirement must be a non-empty string, got {spec!r}")
    spec = spec.strip()
    if spec.startswith("-"):
        raise UsageError(f"{spec!r} looks like an installer option; give a requirement like 'requests>=2'")
    try:
        requirement = Requirement(spec)
    except InvalidRequirement as exc:
        raise UsageError(f"{spec!r} is not a valid requirement ({exc}); give one like 'requests>=2'") from None
    if requirement.url:
        raise UsageError(f"{spec!r} installs from a URL; only packages from the package index can be installed")
    return requirement


def _installer(target: Path) -> list[str]:
    if importlib.util.find_spec("pip") is not None:
        return [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--upgrade",
            "--no-input",
            "--disable-pip-version-check",
            "--target",
        ]
    uv = shutil.which("uv")
    if uv is not None:
        return [uv, "pip", "install", "--upgrade", "--python", sys.executable, "--target"]
    # A venv made by uv has no pip; the interpreter it was made from usually does.
    base = Path(sys.base_prefix) / "bin" / "python3"
    return [str(base), "-m", "pip", "install", "--upgrade", "--no-input", "--disable-pip-version-check", "--target"]


async def install_package(spec: str, target: Path) -> str:
    """Install a requirement into ``target``; returns the installer's output.

    Raises:
        UsageError: ``spec`` is not a plain requirement.
        PackageInstallError: The installer failed.
    """
    requirement = parse_requirement(spec)
    argv = [*_installer(target), str(target), str(requirement)]
    with anyio.fail_after(INSTALL_TIMEOUT):
        done = await anyio.run_process(argv, check=False, stderr=subprocess.STDOUT)
    output = done.stdout.decode("utf-8", "replace")
    if done.returncode != 0:
        raise PackageInstallError(str(requirement), output[-4000:])
    return output
