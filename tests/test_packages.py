"""Package installs on the host: wheels only, plain names only, nothing built or read from the workspace.

Offline and real: pip and uv install from a local find-links directory (set through their own
environment variables) that holds a wheel and a source distribution whose build backend writes a
marker file on the host when it runs.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import io
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from ipybox import CodeExecutor, UsageError
from ipybox._packages import PackageInstallError, _pip, _uv, install_package

pytestmark = pytest.mark.anyio

EVIL = "ipybox-test-evil"
GOOD = "ipybox-test-good"
# The base interpreter a uv-made venv came from; it usually has pip when the venv does not.
BASE_PYTHON = str(Path(sys.base_prefix) / "bin" / "python3")


def sdist(marker: Path) -> bytes:
    """A source distribution whose in-tree build backend writes ``marker`` as soon as it is loaded.

    It needs nothing from an index to build, so an installer that builds it runs its code at once.
    """
    files = {
        "pyproject.toml": (
            '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n\n'
            '[project]\nname = "ipybox-test-evil"\nversion = "1.0"\n'
        ),
        "backend.py": (
            f"import pathlib\npathlib.Path({str(marker)!r}).write_text('built on the host')\n"
            "def get_requires_for_build_wheel(config_settings=None):\n    return []\n"
            "def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):\n"
            "    raise SystemExit('the marker is written; nothing more to do')\n"
        ),
        "PKG-INFO": "Metadata-Version: 2.1\nName: ipybox-test-evil\nVersion: 1.0\n",
    }
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"ipybox_test_evil-1.0/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def wheel() -> bytes:
    """A pure-Python wheel of ``ipybox_test_good`` (``VALUE = 42``)."""
    dist = "ipybox_test_good-1.0.dist-info"
    files = {
        "ipybox_test_good/__init__.py": "VALUE = 42\n",
        f"{dist}/METADATA": "Metadata-Version: 2.1\nName: ipybox-test-good\nVersion: 1.0\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: ipybox-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = ""
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record += f"{name},sha256={digest},{len(text.encode())}\n"
    files[f"{dist}/RECORD"] = record + f"{dist}/RECORD,,\n"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return buffer.getvalue()


@dataclass
class Index:
    links: Path
    marker: Path
    sdist: bytes


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Index:
    """A local find-links directory as the only package source of pip and uv, with empty caches."""
    links = tmp_path / "links"
    links.mkdir()
    marker = tmp_path / "built-on-the-host"
    source = sdist(marker)
    (links / "ipybox_test_evil-1.0.tar.gz").write_bytes(source)
    (links / "ipybox_test_good-1.0-py3-none-any.whl").write_bytes(wheel())
    for name, value in {
        "PIP_FIND_LINKS": str(links),
        "PIP_NO_INDEX": "1",
        "PIP_NO_CACHE_DIR": "1",
        "UV_FIND_LINKS": str(links),
        "UV_OFFLINE": "1",
        "UV_CACHE_DIR": str(tmp_path / "uv-cache"),
    }.items():
        monkeypatch.setenv(name, value)
    return Index(links, marker, source)


def _has_pip(python: str) -> bool:
    return subprocess.run([python, "-m", "pip", "--version"], capture_output=True, check=False).returncode == 0


def _pip_installer() -> list[str]:
    if importlib.util.find_spec("pip") is not None:
        return _pip(sys.executable)
    if _has_pip(BASE_PYTHON):
        return _pip(BASE_PYTHON)
    pytest.skip("no pip on this host")


def _uv_installer() -> list[str]:
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("no uv on this host")
    return _uv(uv)


INSTALLERS: dict[str, Callable[[], list[str]]] = {"pip": _pip_installer, "uv": _uv_installer}


@pytest.mark.parametrize("installer", sorted(INSTALLERS))
async def test_a_package_that_only_has_a_source_distribution_is_refused_and_nothing_is_built_on_the_host(
    index: Index, tmp_path: Path, installer: str
) -> None:
    with pytest.raises(PackageInstallError, match="binary wheels only") as info:
        await install_package(EVIL, tmp_path / "target", installer=INSTALLERS[installer]())
    assert info.value.package == EVIL
    assert not index.marker.exists()


@pytest.mark.parametrize("installer", sorted(INSTALLERS))
async def test_a_package_with_a_wheel_installs_and_is_importable(index: Index, tmp_path: Path, installer: str) -> None:
    target = tmp_path / "target"
    await install_package(GOOD, target, installer=INSTALLERS[installer]())
    assert (target / "ipybox_test_good" / "__init__.py").read_text() == "VALUE = 42\n"


@pytest.mark.parametrize(
    "spec", ["evil-1.0.tar.gz", "evil.zip", "x.whl", "./x", "x/y", "~/x", "..", "file:///x", "x @ file:///x", "-e ."]
)
async def test_paths_archives_urls_and_options_are_refused_with_an_error_naming_the_fix(
    tmp_path: Path, spec: str
) -> None:
    with pytest.raises(UsageError, match=r"give a package name from the index, like 'requests'"):
        await install_package(spec, tmp_path / "target")
    assert not (tmp_path / "target").exists()


async def test_the_installer_runs_in_an_empty_directory_so_a_pip_module_planted_in_the_workspace_is_not_run(
    index: Index, workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    installer = _pip_installer()  # before the plant: finding pip runs it
    marker = tmp_path / "planted-pip-ran"
    # What kernel code can leave behind; `python -m pip` run from the workspace would import it.
    (workspace / "pip.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n")
    monkeypatch.chdir(workspace)
    await install_package(GOOD, tmp_path / "target", installer=installer)
    assert not marker.exists()
    assert (tmp_path / "target" / "ipybox_test_good").is_dir()


async def test_pip_install_of_an_sdist_the_kernel_wrote_into_the_workspace_builds_nothing_on_the_host(
    index: Index, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As with CodeExecutor's defaults: the host process runs in the workspace.
    monkeypatch.chdir(workspace)
    code = (
        "import base64\n"
        f"open('evil-1.0.tar.gz', 'wb').write(base64.b64decode({base64.b64encode(index.sdist).decode()!r}))\n"
        "try:\n"
        "    get_ipython().run_line_magic('pip', 'install evil-1.0.tar.gz')\n"
        "except Exception as e:\n"
        "    print(type(e).__name__, e)"
    )
    async with CodeExecutor(workspace=workspace, approval="auto") as ex:
        result = await ex.execute(code)
        assert not index.marker.exists()
        assert "looks like a package file" in result.text
        # The refusal leaves installs working.
        await ex.execute(f"%pip install {GOOD}")
        assert (await ex.execute("import ipybox_test_good; ipybox_test_good.VALUE")).text == "42\n"


async def test_pip_magic_options_are_understood_or_refused_with_a_message_and_the_cell_stops(
    index: Index, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(workspace)
    async with CodeExecutor(workspace=workspace, approval="auto") as ex:
        for line, refusal in [
            (f"install --index-url http://127.0.0.1:9/simple {GOOD}", "'--index-url' not supported in ipybox"),
            (f"install -r requirements.txt {GOOD}", "'-r' not supported in ipybox"),
            ("list", "'%pip list' is not supported in ipybox: only '%pip install' is"),
            ("install --quiet", "no package named"),
        ]:
            # IPython's own way of refusing a magic's arguments: the message, and nothing after it runs.
            result = await ex.execute(f"%pip {line}\nprint('carried on')")
            assert result.text.startswith("UsageError: ") and refusal in result.text, result.text
            assert "usage: %pip install [-q|--quiet] PACKAGE" in result.text
            assert "carried on" not in result.text
        assert (await ex.execute("import importlib.util; importlib.util.find_spec('ipybox_test_good')")).text == ""
        # Quiet installs print nothing, and the package is importable in the same cell.
        result = await ex.execute(f"%pip install --quiet {GOOD}\nimport ipybox_test_good\nipybox_test_good.VALUE")
        assert result.text == "42\n"
