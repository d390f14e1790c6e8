"""Starts the IPython kernel inside the sandbox: resource limits first, then ipykernel.

Run as ``python -m ipybox_kernel._launch [--memory N] [--cpu N] [--files N] [--output N] -f CONN``.
The limits are set before any user code can run, hard limit equal to soft limit; without
capabilities the kernel cannot raise them again.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import traceback
from typing import Any, cast

# Marks the display message that reports how much output the kernel dropped for one execution.
TRUNCATED_MIME = "application/vnd.ipybox.truncated+json"


def _set_limit(which: int, value: int | None) -> None:
    if value is not None:
        resource.setrlimit(which, (value, value))


class _OutputGuard:
    """Caps the output one execution sends to the host, at the source.

    Everything the kernel publishes goes through ``Session.send``; output beyond the budget is cut
    here so that a ``print('x' * 10**8)`` never crosses the wire. The host enforces its own cap as
    well and does not rely on this one.
    """

    def __init__(self, session: Any, budget: int) -> None:
        self._send = session.send
        self._budget = budget
        self._used = 0
        self._dropped = 0
        session.send = self.send

    def reset(self, *_: object) -> None:
        self._used = 0
        self._dropped = 0

    def report(self, *_: object) -> None:
        # ipykernel flushes the cell's buffered stream output only after post_execute; flush now so
        # that what this cell printed is counted in this cell's report.
        sys.stdout.flush()
        sys.stderr.flush()
        if self._dropped:
            from IPython.display import publish_display_data  # pyright: ignore[reportUnknownVariableType]

            dropped, self._dropped = self._dropped, 0
            publish_display_data({TRUNCATED_MIME: {"dropped": dropped}})

    def send(self, stream: Any, msg_or_type: Any, content: Any = None, *args: Any, **kwargs: Any) -> Any:
        msg = cast("dict[str, Any]", msg_or_type) if isinstance(msg_or_type, dict) else {}
        msg_type: Any = msg_or_type if isinstance(msg_or_type, str) else msg.get("header", {}).get("msg_type")
        body: Any = content if content is not None else msg.get("content")
        if not isinstance(body, dict):
            return self._send(stream, msg_or_type, content, *args, **kwargs)
        fields = cast("dict[str, Any]", body)
        if msg_type == "stream" and isinstance(fields.get("text"), str):
            text: str = fields["text"]
            room = max(self._budget - self._used, 0)
            if len(text) > room:
                self._dropped += len(text) - room
                if room == 0:
                    return None
                fields["text"] = text = text[:room]
            self._used += len(text)
        elif msg_type in ("display_data", "execute_result", "update_display_data"):
            data: Any = fields.get("data")
            if isinstance(data, dict) and TRUNCATED_MIME not in data:
                bundle = cast("dict[str, Any]", data)
                size = sum(len(v) if isinstance(v, str) else len(json.dumps(v)) for v in bundle.values())
                if self._used + size > self._budget:
                    self._dropped += size
                    return None
                self._used += size
        return self._send(stream, msg_or_type, content, *args, **kwargs)


def _pip_magic(line: str) -> None:
    """``%pip install PKG ...``: the host installs (the kernel has no network), after approval."""
    import importlib
    import shlex

    from ipybox_kernel import call_tool

    words = shlex.split(line)
    if not words or words[0] != "install" or len(words) < 2 or any(w.startswith("-") for w in words[1:]):
        print("usage: %pip install PACKAGE [PACKAGE ...]  (options are not supported in ipybox)")
        return
    for spec in words[1:]:
        output = call_tool("ipybox", "install_package", {"package": spec})
        print(output.text.strip().splitlines()[-1] if output.text.strip() else f"installed {spec}")
    importlib.invalidate_caches()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="ipybox_kernel._launch")
    parser.add_argument("--memory", type=int)
    parser.add_argument("--cpu", type=int)
    parser.add_argument("--files", type=int)
    parser.add_argument("--output", type=int)
    ours, rest = parser.parse_known_args(argv)
    _set_limit(resource.RLIMIT_AS, ours.memory)
    _set_limit(resource.RLIMIT_CPU, ours.cpu)
    _set_limit(resource.RLIMIT_NOFILE, ours.files)

    # ipykernel's debugger needs debugpy, whose import is a third of the kernel's start-up time, and
    # it could only listen on a network the sandbox does not have. Without it the kernel reports
    # ``debugger: false`` and starts faster. User code can still import debugpy later.
    sys.modules["debugpy"] = None  # pyright: ignore[reportArgumentType]
    from ipykernel.kernelapp import IPKernelApp

    app: Any = IPKernelApp.instance()
    try:
        _initialize(app, rest, ours.output)
    except BaseException:
        # ipykernel may have started threads already; they would keep a half-initialized kernel
        # alive forever. Report and leave now (the host shows this output in KernelStartError).
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    del sys.modules["debugpy"]
    app.start()


def _initialize(app: Any, rest: list[str], output: int | None) -> None:
    app.initialize(
        [
            *rest,
            # No history database on disk and no colour codes in tracebacks.
            "--HistoryManager.enabled=False",
            "--InteractiveShell.colors=nocolor",
            # A flush that returns at once when there is nothing to send (see _stream).
            "--IPKernelApp.outstream_class=ipybox_kernel._stream.QuickFlushStream",
            # ipykernel sleeps 0.5 ms before every execute_reply, for front ends that stop
            # listening at the reply. The host reads until the execution's idle status instead,
            # which the IOPub thread sends after all of the execution's output.
            "--IPythonKernel._execute_sleep=0",
        ]
    )
    from ._context import announce_execution, carry_execution_context
    from ._stream import FdDrain  # imports ipykernel: only once main() has kept debugpy out

    app.shell.register_magic_function(_pip_magic, "line", "pip")
    # Threads keep the cell that started them, so their output and tool calls are not taken for
    # those of the cell that runs when they print or call.
    carry_execution_context(app.kernel)
    app.shell.events.register("pre_execute", lambda: announce_execution(app.kernel))
    # Before the output guard's report, which counts what the execution printed.
    app.shell.events.register("post_execute", FdDrain(sys.stdout, sys.stderr))
    if output is not None:
        guard = _OutputGuard(app.session, output)
        app.shell.events.register("pre_execute", guard.reset)
        app.shell.events.register("post_execute", guard.report)


if __name__ == "__main__":
    main(sys.argv[1:])
