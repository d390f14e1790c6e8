"""A package index in a local directory, so that the cookbook installs packages without a network.

ipybox installs packages for the kernel on the host, with pip or uv (whichever it finds), binary
wheels only. Both read their package source from environment variables; `serve` points them at a
directory of wheels instead of the package index. Without it, installs come from PyPI (or the index
your pip or uv configuration names).
"""

from __future__ import annotations

import base64
import hashlib
import os
import zipfile
from pathlib import Path


def write_wheel(directory: Path, name: str, version: str, files: dict[str, str]) -> Path:
    """Write a pure-Python wheel of ``files`` (path in the wheel -> source) into ``directory``."""
    dist = f"{name.replace('-', '_')}-{version}"
    info = f"{dist}.dist-info"
    files = {
        **files,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: ipybox-cookbook\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record: list[str] = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{info}/RECORD,,")
    directory.mkdir(parents=True, exist_ok=True)
    wheel = directory / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
        archive.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return wheel


def serve(directory: Path) -> None:
    """Make pip and uv, in this process and the installers it starts, install only from ``directory``."""
    os.environ.update(
        PIP_FIND_LINKS=str(directory),
        PIP_NO_INDEX="1",
        UV_FIND_LINKS=str(directory),
        UV_NO_INDEX="1",
        UV_OFFLINE="1",
    )
