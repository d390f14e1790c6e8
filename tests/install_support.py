"""The wheel built from this checkout, shared by the tests that install it into fresh venvs
(tests/test_install.py, tests/test_kernel_image.py): it is built once per session."""

from __future__ import annotations

import os
import shutil
import subprocess
import zipfile
from collections.abc import Sequence
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement

__all__ = ("REPO", "build_wheel", "copy_of_the_repository", "uv_command", "wheel_requirements")

REPO = Path(__file__).resolve().parents[1]
# Building the wheel: uv fetches hatchling into its (temporary) cache first.
BUILD_TIMEOUT = 120.0


def uv_command() -> list[str]:
    # uv is a dev dependency, so scripts/setup.sh leaves one in .venv; a uv on PATH works as well.
    in_venv = REPO / ".venv" / "bin" / "uv"
    found = str(in_venv) if in_venv.exists() else shutil.which("uv")
    return [found] if found else ["python3", "-m", "uv"]


def build_wheel(work: Path) -> Path:
    """Build the wheel into ``work/dist`` with an empty uv cache in ``work``, so nothing from earlier
    runs is reused; return its path."""
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"} | {"UV_CACHE_DIR": str(work / "uv-cache")}
    dist = work / "dist"
    # uv's output goes to the test's captured output, shown if the build fails.
    subprocess.run(
        [*uv_command(), "build", "--wheel", "--out-dir", str(dist), str(REPO)],
        env=env,
        check=True,
        timeout=BUILD_TIMEOUT,
        stdin=subprocess.DEVNULL,
    )
    (wheel,) = dist.glob("ipybox-*.whl")
    return wheel


def wheel_requirements(wheel: Path, extras: Sequence[str] = ()) -> list[str]:
    """What the wheel's metadata (``Requires-Dist``) asks for on this interpreter, with ``extras``,
    markers evaluated: the requirements an installer of ``ipybox[extras]`` from this wheel installs."""
    with zipfile.ZipFile(wheel) as archive:
        [name] = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = Parser().parsestr(archive.read(name).decode())
    wanted: list[str] = []
    for line in metadata.get_all("Requires-Dist") or []:
        requirement = Requirement(line)
        if requirement.marker is None or any(requirement.marker.evaluate({"extra": e}) for e in ("", *extras)):
            requirement.marker = None
            wanted.append(str(requirement))
    return wanted


def copy_of_the_repository(dest: Path) -> Path:
    """The files a clone has (tracked, plus new files not ignored): no .venv, node_modules or caches."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source, target = REPO / name, dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
        elif source.is_file():  # a tracked file deleted in the checkout is left out
            shutil.copy2(source, target)
    return dest
