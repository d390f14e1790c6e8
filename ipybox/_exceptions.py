"""The exceptions ipybox raises on the host.

Every exception ipybox raises derives from `IpyboxError`. Mistakes in how ipybox is called are kept
apart from failures at run time, so an application can let the first kind crash and handle the
second::

    IpyboxError
    ├── UsageError                a wrong argument or option; the message names the fix
    │   └── InvalidSkill          a skill was refused (skill, field, problem)
    ├── SandboxUnavailable        the requested sandbox cannot be used on this machine
    ├── KernelError               the kernel process failed
    │   ├── KernelStartError      it did not become ready
    │   └── KernelDied            it exited while running code (os._exit, a signal, OOM)
    │       └── KernelConnectionLost   the connection to a kernel on a gateway ended (url, kernel_id)
    ├── ExecutionError            a code action did not complete normally
    │   ├── CodeExecutionError    the code raised (ename, evalue, traceback)
    │   ├── ExecutionTimeout      it ran past its timeout and was interrupted
    │   └── ExecutionCancelled    it was cancelled
    │       └── ExecutionSuspended    it was handed over to a locator, to go on where it is resumed
    ├── ExecutionLost             an execution key or approval id is not known (any more)
    ├── InvalidLocator            a suspended execution's locator was refused (not made with this secret)
    ├── FileTransferError         a file was not copied to or from a kernel on a gateway (path, reason)
    ├── MCPServerError            an MCP server could not be reached or failed (server_name)
    └── GenerationError           typed sources could not be generated for a server (server_name)

Exceptions raised *inside the kernel* (for example when an application rejects a tool call) live in
`ipybox_kernel`, which the sandboxed kernel imports without importing ipybox.
"""

from __future__ import annotations

__all__ = (
    "CodeExecutionError",
    "ExecutionCancelled",
    "ExecutionError",
    "ExecutionLost",
    "ExecutionSuspended",
    "ExecutionTimeout",
    "FileTransferError",
    "GenerationError",
    "InvalidLocator",
    "InvalidSkill",
    "IpyboxError",
    "KernelDied",
    "KernelError",
    "KernelStartError",
    "MCPServerError",
    "SandboxUnavailable",
    "UsageError",
)


class IpyboxError(Exception):
    """Base class of every exception ipybox raises on the host."""


class UsageError(IpyboxError, ValueError):
    """ipybox was called with an argument or option that cannot work; the message names the fix."""


class InvalidSkill(UsageError):
    """A skill was refused before anything was written: its name, code or description cannot be used.

    Attributes:
        skill: The name the skill was to be saved under.
        field: What to change: ``"name"``, ``"code"``, ``"description"`` (or ``"overwrite"``).
        problem: What is wrong with it and how to fix it.
    """

    def __init__(self, skill: str, field: str, problem: str) -> None:
        super().__init__(f"skill {skill!r} was not saved: its {field} {problem}")
        self.skill = skill
        self.field = field
        self.problem = problem


class SandboxUnavailable(IpyboxError):
    """The requested sandbox backend cannot run on this machine.

    Attributes:
        backend: The backend that was asked for (for example ``"bwrap"``).
        reason: Why it cannot run, and how to make it run or opt out.
    """

    def __init__(self, backend: str, reason: str) -> None:
        super().__init__(f"sandbox {backend!r} is not available: {reason}")
        self.backend = backend
        self.reason = reason


class KernelError(IpyboxError):
    """The kernel process failed."""


class KernelStartError(KernelError):
    """The kernel did not become ready.

    Attributes:
        output: What the kernel process wrote to stderr before it failed (last few KiB).
    """

    def __init__(self, message: str, *, output: str = "") -> None:
        super().__init__(f"{message}\n{output}".rstrip())
        self.output = output


class KernelDied(KernelError):
    """The kernel process exited while it was running code.

    The executor starts a fresh kernel for the next execution; the state of the old one is lost.

    Attributes:
        exit_code: The process's exit status (negative for a signal), when known.
        reason: Why the host stopped the kernel, when it did (None: the kernel ended by itself).
    """

    def __init__(self, exit_code: int | None, *, reason: str | None = None) -> None:
        how = "" if exit_code is None else (f" (exit code {exit_code})" if exit_code >= 0 else "")
        if exit_code is not None and exit_code < 0:
            how = f" (killed by signal {-exit_code})"
        if reason is not None:
            how = f" (stopped by the host: {reason})"
        super().__init__(f"the kernel died{how}; its state is lost and the next execution starts a fresh kernel")
        self.exit_code = exit_code
        self.reason = reason


class ExecutionError(IpyboxError):
    """A code action did not complete normally."""


class CodeExecutionError(ExecutionError):
    """The code raised an exception in the kernel.

    Attributes:
        ename: The exception's class name, e.g. ``"ZeroDivisionError"``.
        evalue: The exception's message.
        traceback: The traceback as plain text (no ANSI codes, no ipybox frames).
        output: Text the code printed before it raised.
    """

    def __init__(self, ename: str, evalue: str, traceback: str, *, output: str = "") -> None:
        super().__init__(f"{ename}: {evalue}\n{traceback}".rstrip())
        self.ename = ename
        self.evalue = evalue
        self.traceback = traceback
        self.output = output


class ExecutionTimeout(ExecutionError, TimeoutError):
    """The code ran longer than its timeout and was interrupted.

    Time spent waiting for tool-call approval does not count against the timeout.

    Attributes:
        timeout: The timeout that was exceeded, in seconds.
        restarted: True when the kernel ignored the interrupt and was restarted (its state is lost).
        output: Text the code printed before it was stopped.
    """

    def __init__(self, timeout: float, *, restarted: bool, output: str = "") -> None:
        tail = (
            "; it did not stop on interrupt, so the kernel was restarted and its state is lost"
            if restarted
            else "; the kernel was interrupted and keeps its state"
        )
        super().__init__(f"code execution exceeded its timeout of {timeout:g} s{tail}")
        self.timeout = timeout
        self.restarted = restarted
        self.output = output


class ExecutionCancelled(ExecutionError):
    """The execution was cancelled before it completed."""


class ExecutionSuspended(ExecutionCancelled):
    """The execution was suspended (`CodeExecutor.suspend`): it goes on in the executor that resumes
    it from its locator, which gets its result; this executor no longer runs it."""


class InvalidLocator(IpyboxError, ValueError):
    """A suspended execution's locator was refused: it was not made with this secret, was changed,
    or is not a locator of a format this ipybox reads. Nothing was run."""


class ExecutionLost(IpyboxError, LookupError):
    """An execution or approval request is not known to this executor (any more).

    This happens when an application resumes after a restart, or after a paused execution expired.
    The code is never run a second time to recover.
    """


class MCPServerError(IpyboxError):
    """An MCP server could not be started, reached, or used.

    Attributes:
        server_name: The name the server is registered under.
    """

    def __init__(self, server_name: str, message: str) -> None:
        super().__init__(f"MCP server {server_name!r}: {message}")
        self.server_name = server_name


class GenerationError(IpyboxError):
    """Typed Python sources could not be generated for an MCP server.

    The previously generated package, if any, is left as it was.

    Attributes:
        server_name: The server the sources were generated for.
        exit_status: How a stdio server's process exited, when it ended before its tools were
            listed (None: it did not exit, its status is unknown, or it is an HTTP server).
        stderr: The last lines of a stdio server's stderr, when it failed to list its tools
            (empty when it wrote nothing or is an HTTP server).
    """

    def __init__(self, server_name: str, message: str, *, exit_status: int | None = None, stderr: str = "") -> None:
        super().__init__(f"cannot generate sources for MCP server {server_name!r}: {message}")
        self.server_name = server_name
        self.exit_status = exit_status
        self.stderr = stderr


class KernelConnectionLost(KernelDied):
    """The connection to a remote kernel (on a gateway) ended while it was running code.

    The executor deletes that kernel and starts a fresh one for the next execution; the state of
    the old one is lost.

    Attributes:
        url: The gateway's URL.
        kernel_id: The gateway's id of the lost kernel.
    """

    def __init__(self, url: str, kernel_id: str, reason: str) -> None:
        super().__init__(None, reason=reason)
        self.args = (
            f"the connection to kernel {kernel_id} on the gateway {url} was lost ({reason}); its state is lost "
            "and the next execution starts a fresh kernel",
        )
        self.url = url
        self.kernel_id = kernel_id


class FileTransferError(IpyboxError):
    """`CodeExecutor.upload` or ``download`` failed on a kernel that runs on a gateway.

    The kernel failed the copy (a full disk, say), broke the transfer's protocol (kernel code can
    replace ipybox's side of it), or did not answer in time. The destination is left as it was;
    the executor keeps working.

    Attributes:
        path: The file in the kernel's working directory, as given.
        reason: What went wrong.
        restarted: True when the kernel did not answer, ignored the interrupt that followed and was
            restarted (its state is lost).
    """

    def __init__(self, path: str, reason: str, *, restarted: bool = False) -> None:
        tail = "; the kernel did not stop on interrupt, so it was restarted and its state is lost" if restarted else ""
        super().__init__(f"copying {path!r} to or from the kernel on the gateway failed: {reason}{tail}")
        self.path = path
        self.reason = reason
        self.restarted = restarted
