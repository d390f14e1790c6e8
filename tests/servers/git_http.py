"""A git repository served over smart HTTP on 127.0.0.1 by git's own ``git http-backend``: what a
client cloning from a hosted git URL (GitHub's https://) talks to, with no network beyond this machine.

A dumb HTTP server (static files) would not do: clients clone shallow (``--depth 1``), which only the
smart protocol supports.
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Generator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

# One request of a clone: the refs, or a pack of a repository of a few MB.
BACKEND_TIMEOUT = 120.0


def _handler(root: Path) -> type[BaseHTTPRequestHandler]:
    class GitBackend(BaseHTTPRequestHandler):
        def _run_backend(self) -> None:
            url = urlsplit(self.path)
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            env = {
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "GIT_PROJECT_ROOT": str(root),
                "GIT_HTTP_EXPORT_ALL": "1",
                "REQUEST_METHOD": self.command,
                "PATH_INFO": url.path,
                "QUERY_STRING": url.query,
                "CONTENT_TYPE": self.headers.get("Content-Type", ""),
                "CONTENT_LENGTH": str(len(body)),
                "REMOTE_ADDR": self.client_address[0],
                # Protocol v2 and gzip request bodies are announced in these headers.
                **{f"HTTP_{k.upper().replace('-', '_')}": v for k, v in self.headers.items()},
            }
            done = subprocess.run(
                ["git", "http-backend"], input=body, env=env, capture_output=True, timeout=BACKEND_TIMEOUT
            )
            head, _, payload = done.stdout.partition(b"\r\n\r\n")
            status, headers = 200, list[tuple[str, str]]()
            for line in head.decode("latin-1").split("\r\n"):
                name, _, value = line.partition(":")
                if name.lower() == "status":
                    status = int(value.split()[0])
                elif name:
                    headers.append((name, value.strip()))
            if done.returncode != 0 and not head:
                status, payload = 500, done.stderr
            self.send_response(status)
            for name, value in headers:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = _run_backend  # the names http.server dispatches to

        def log_message(self, format: str, *args: object) -> None:
            pass

    return GitBackend


@contextmanager
def git_over_http(worktree: Path, name: str) -> Generator[str]:
    """``worktree``'s files committed into a bare repository ``name``.git, served; yields its URL."""
    git = [
        "git",
        "-c",
        "user.name=ipybox tests",
        "-c",
        "user.email=tests@ipybox.invalid",
        "-c",
        "init.defaultBranch=main",
    ]
    subprocess.run([*git, "init", "-q"], cwd=worktree, check=True)
    subprocess.run([*git, "add", "-A"], cwd=worktree, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "the files of this checkout"], cwd=worktree, check=True)
    root = worktree.parent / "served"
    subprocess.run([*git, "clone", "-q", "--bare", str(worktree), str(root / f"{name}.git")], check=True)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(root))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/{name}.git"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
