"""The host-side manifest of MCP servers whose packages were generated under a tools directory.

``<root_dir>/.ipybox/servers.json`` maps each server name to its parameters, exactly as given
(``${VAR}`` placeholders stay unresolved). It is the only place parameters are written: generated
code names a server, and the host looks its parameters up here, so code in the sandbox can neither
read nor change what the host runs. The directory is private to the owner (0700, file 0600), the
sandbox hides it, and every write replaces the file atomically under a lock.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path

from ._exceptions import UsageError
from ._mcp import HttpServer, StdioServer, parse_server_params

__all__ = ("MANIFEST_DIR", "MANIFEST_FILE", "load_manifest", "manifest_lock", "save_manifest_entry")

MANIFEST_DIR = ".ipybox"
MANIFEST_FILE = "servers.json"
_LOCK_FILE = "servers.lock"


def _manifest_dir(root_dir: Path) -> Path:
    path = root_dir / MANIFEST_DIR
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    # mkdir's mode is filtered by the umask, and the directory may predate us.
    path.chmod(0o700)
    return path


@contextmanager
def manifest_lock(root_dir: Path) -> Generator[None]:
    """Hold an exclusive lock on the manifest of `root_dir` (blocking; call from a worker thread)."""
    lock_path = _manifest_dir(root_dir) / _LOCK_FILE
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _read(root_dir: Path) -> dict[str, object]:
    path = root_dir / MANIFEST_DIR / MANIFEST_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"the MCP server manifest {str(path)!r} is not valid JSON ({exc}); delete it and generate the "
            "server packages again"
        ) from None
    if not isinstance(data, dict):
        raise UsageError(
            f"the MCP server manifest {str(path)!r} is not a JSON object; delete it and generate the "
            "server packages again"
        )
    return data  # pyright: ignore[reportUnknownVariableType]


def load_manifest(root_dir: Path | str) -> dict[str, StdioServer | HttpServer]:
    """Read the parameters of every server generated under `root_dir`, by server name.

    Returns:
        An empty dict when nothing was generated there yet.

    Raises:
        UsageError: The manifest exists but is damaged; the message names the file.
    """
    root = Path(root_dir)
    servers: dict[str, StdioServer | HttpServer] = {}
    for name, params in sorted(_read(root).items()):
        if not isinstance(params, dict):
            raise UsageError(f"the MCP server manifest under {str(root)!r} has no parameters for {name!r}")
        try:
            servers[name] = parse_server_params(params)  # pyright: ignore[reportUnknownArgumentType]
        except UsageError as exc:
            raise UsageError(f"the MCP server manifest under {str(root)!r}, server {name!r}: {exc}") from None
    return servers


def save_manifest_entry(root_dir: Path, server_name: str, params: StdioServer | HttpServer) -> None:
    """Record (or replace) the parameters of one server; call with `manifest_lock` held."""
    directory = _manifest_dir(root_dir)
    data = _read(root_dir)
    data[server_name] = params.model_dump(mode="json")
    text = json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".servers-", suffix=".json")
    try:
        # mkstemp creates the file 0600, so the secrets in it are never readable by others.
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, directory / MANIFEST_FILE)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
