"""The cells that prepare a remote kernel: ``ipybox_kernel`` (unless the kernel's image provides it)
and the generated tool modules pushed as source (the gateways have no files API), then the tool
transport and output guards installed.

An image's ``ipybox_kernel`` must be the host's: the two ends share a wire protocol that changes
between versions, and a mismatch showed up as a first tool call that waited for ever. The last cell
compares a digest of the kernel's ``ipybox_kernel`` sources with the host's and fails the start,
naming both ipybox versions, when they differ.

The files go through cells in chunks of compressed base64, appended to a file in a fresh directory
under the kernel's temporary directory, unpacked by the last cell, which also puts that directory
first on ``sys.path``. Each cell runs in its own namespace (``exec`` with a fresh dict) and silently,
so the user's namespace, history and execution count are untouched.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import secrets
import zlib
from pathlib import Path

import ipybox_kernel
from ipybox._manifest import MANIFEST_DIR
from ipybox_kernel._protocol import TOKEN_ENV, TOOLS_DIR_ENV

__all__ = ("setup_cells",)

# Base64 characters per cell: a few hundred KiB keeps each message far below the gateways' limits.
_CHUNK_CHARS = 512 * 1024
# Only sources are pushed: bytecode is made by the kernel, anything else is not imported.
_SOURCE_SUFFIXES = (".py", ".pyi")

_CHUNK = """\
import base64, os, tempfile
root = os.path.join(tempfile.gettempdir(), {root!r})
os.makedirs(root, mode=0o700, exist_ok=True)
with open(os.path.join(root, ".push"), "ab") as f:
    f.write(base64.b64decode({data!r}))
"""

_FINISH = """\
import json, os, sys, tempfile, zlib
root = os.path.join(tempfile.gettempdir(), {root!r})
if {pushed!r}:
    with open(os.path.join(root, ".push"), "rb") as f:
        files = json.loads(zlib.decompress(f.read()))
    os.remove(os.path.join(root, ".push"))
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    sys.path.insert(0, root)
    if {tools!r}:
        os.environ[{tools_env!r}] = os.path.join(root, {tools!r})
os.environ[{token_env!r}] = {token!r}
import ipybox_kernel._remote
{check}ipybox_kernel._remote.install({output!r}, {message_bytes!r})
"""

# Run when the image provides ipybox_kernel; the digest is computed as `_kernel_digest` computes it.
_CHECK = """\
import hashlib
kernel_root = os.path.dirname(ipybox_kernel.__file__)
digest = hashlib.sha256()
for name in sorted(os.listdir(kernel_root)):
    if name.endswith(".py"):
        with open(os.path.join(kernel_root, name), "rb") as f:
            digest.update(name.encode() + b"\\0" + f.read() + b"\\0")
if digest.hexdigest() != {digest!r}:
    try:
        from importlib.metadata import version
        theirs = "ipybox " + version("ipybox")
    except Exception:
        theirs = "no ipybox distribution"
    raise ImportError(
        "the kernel's ipybox_kernel (" + theirs + ", " + kernel_root + ") is not the host's "
        + {host!r} + ": install ipybox==" + {version!r} + " in the kernel's image, or use push_sources=True"
    )
"""


def setup_cells(*, tools_dir: Path | None, token: str, output_chars: int, message_bytes: int, push: bool) -> list[str]:
    """The cells to run, in order, in a freshly started remote kernel.

    Args:
        tools_dir: The generated tool packages to push (their manifest, which holds server
            parameters, is not), or None.
        token: The executor's tool-server token, which the kernel's requests carry.
        output_chars: The executor's output limit, enforced in the kernel as locally.
        message_bytes: The largest message the host takes from the kernel.
        push: Whether to push ``ipybox_kernel``; False when the kernel image provides it (then it
            is checked to be the host's). The tool modules are the host's and always pushed.
    """
    root = f"ipybox-{secrets.token_hex(8)}"
    cells: list[str] = []
    files = _sources(Path(ipybox_kernel.__file__).parent, "ipybox_kernel") if push else {}
    tools = None
    if tools_dir is not None and tools_dir.is_dir():
        tools = tools_dir.name
        files.update(_sources(tools_dir, tools))
    if files:
        data = base64.b64encode(zlib.compress(json.dumps(files).encode(), 6)).decode()
        cells.extend(
            _CHUNK.format(root=root, data=data[start : start + _CHUNK_CHARS])
            for start in range(0, len(data), _CHUNK_CHARS)
        )
    check = ""
    if not push:
        version = _host_version()
        check = _CHECK.format(digest=_kernel_digest(), host=f"(ipybox {version})", version=version)
    finish = _FINISH.format(
        root=root,
        pushed=bool(files),
        tools=tools,
        tools_env=TOOLS_DIR_ENV,
        token=token,
        token_env=TOKEN_ENV,
        output=output_chars,
        message_bytes=message_bytes,
        check=check,
    )
    cells.append(finish)
    return [f"exec({cell!r}, {{}})" for cell in cells]


@functools.cache
def _kernel_digest() -> str:
    """A digest of the host's ``ipybox_kernel`` sources (a flat package), as `_CHECK` computes it."""
    root = Path(ipybox_kernel.__file__).parent
    digest = hashlib.sha256()
    for path in sorted(root.glob("*.py"), key=lambda p: p.name):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _host_version() -> str:
    from ipybox import __version__

    return __version__


def _sources(directory: Path, prefix: str) -> dict[str, str]:
    """Source files under ``directory`` by their path under ``prefix``; symlinks and the manifest are skipped."""
    found: dict[str, str] = {}
    for path in sorted(directory.rglob("*")):
        rel = path.relative_to(directory)
        if MANIFEST_DIR in rel.parts or "__pycache__" in rel.parts or path.is_symlink():
            continue
        if path.suffix in _SOURCE_SUFFIXES and path.is_file():
            found[f"{prefix}/{rel.as_posix()}"] = path.read_text(encoding="utf-8")
    return found
